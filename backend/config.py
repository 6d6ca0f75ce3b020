"""RunConfig: every knob of the reference workflow, and where each value came from.

Sources, highest precedence first: CLI flag > ``RTUI_*`` environment variable >
``rtui.toml`` (``--config FILE``, else the current directory, else the XDG config
dir) > built-in default. ``resolve_config`` records the source of every field so
``rtui config show`` can explain the effective configuration.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import stat
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Protocol, TypeVar, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.fields import FieldInfo

from backend import registry
from backend.errors import UserError
from backend.hub import DEFAULT_DATASET, HF_DATASETS, default_dataset_uri, parse_dataset_uri
from backend.paths import config_dir
from backend.trust import (
    JOB_SECRETS,
    credential_names,
    digest,
    is_trusted,
    is_users_own,
)

ENV_PREFIX = "RTUI_"
CONFIG_FILENAME = "rtui.toml"

Precision = Literal["auto", "bf16", "fp32"]
Transport = Literal["auto", "any", "efa", "efa_gdr", "socket", "ib"]
DEFAULT_MODEL_ID = "Qwen/Qwen2.5-1.5B"
# Schemes of the shared storage Ray Train can write checkpoints to from every node (pyarrow file systems).
# A Kubernetes object name (RFC 1123 subdomain), as a ServiceAccount's must be.
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# A Kubernetes quantity as a volume size: a whole number with a binary or decimal suffix.
STORAGE_SIZE = re.compile(r"[1-9][0-9]{0,9}(Mi|Gi|Ti|Pi|M|G|T|P)")
_STORAGE_UNITS = {"Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "M": 10**6, "G": 10**9, "T": 10**12,
                  "P": 10**15}


def storage_bytes(size: str) -> int:
    """Bytes of a ``--storage-size`` (``STORAGE_SIZE``) such as 50Gi."""
    unit = size.lstrip("0123456789")
    return int(size[: len(size) - len(unit)]) * _STORAGE_UNITS[unit]


SHARED_STORAGE_SCHEMES = ("s3://", "gs://", "abfs://", "abfss://", "hdfs://")
# S3's bucket naming rules (S3 User Guide, "General purpose bucket naming rules"), in short.
S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


# field -> (full-match pattern, what is accepted: the second half of the error line). A target's config
# model keeps its own fields' patterns the same way (``matches``).
PATTERNS: dict[str, tuple[str, str]] = {
    "cluster_name": (r"[a-z]([a-z0-9-]{0,38}[a-z0-9])?",
                     "lowercase letters, digits and '-', starting with a letter, at most 40 characters"),
    "job_env": (r"([A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*)?",
                "names of environment variables, comma-separated, such as HF_TOKEN,WANDB_API_KEY"),
}


S = TypeVar("S", str, str | None)


def matches(patterns: Mapping[str, tuple[str, str]], value: S, info: ValidationInfo) -> S:
    """A field validator's body: ``value`` (None passes) full-matches its field's pattern, else what is accepted."""
    if value is None:
        return value
    pattern, accepted = patterns[info.field_name or ""]
    if not re.fullmatch(pattern, value):
        raise ValueError(accepted)
    return value


class TargetTraits(Protocol):
    """What the config asks of a run's target: ``backend.targets.Target`` has all of it. Found by name
    through ``backend.registry``, so the config imports no target and not the contract either."""

    @property
    def on_gpus(self) -> bool: ...

    @property
    def shared_disk(self) -> bool: ...

    @property
    def config_model(self) -> type[RunConfig]: ...

    def gpu_nodes(self, config: RunConfig) -> registry.GpuNodes | None: ...

    def gives_storage(self, config: RunConfig) -> bool: ...

    def defaults(self, config: RunConfig) -> registry.Defaults: ...

    def check(self, config: RunConfig, cwd: Path) -> RunConfig: ...


def target_traits(name: str) -> TargetTraits:
    """The target called ``name``, as the config asks it (KeyError: no target has that name)."""
    return cast(TargetTraits, registry.load(name))


C = TypeVar("C", bound="RunConfig")


class RunConfig(BaseModel):
    """The settings every target reads: the run, its training, its data and where results go. Immutable
    once resolved. A target's own settings are a subclass of it, the target's ``config_model`` (the aws
    target's region, the local target's CPUs): a run's config is an instance of its target's model.
    """

    # backend.trust: what a checkout's rtui.toml may set without a confirmation (free), and why each other
    # field waits for one (held), one line each: `rtui config show` and the wizard's modal print it.
    free_fields: ClassVar[frozenset[str]] = frozenset({
        "idle_minutes", "steps", "seq_len", "batch_size", "learning_rate", "num_workers", "precision", "text_field",
        "shard", "shard_size", "reduce_dtype", "reshard_after_forward", "optimizer", "tokens_per_step",
        "activation_checkpointing", "compile", "checkpoint_every", "export_every", "require_transport",
        "max_failures", "lr_schedule", "warmup_steps", "weight_decay", "max_grad_norm", "seed", "eval_tokens",
        "keep_checkpoints",
    })
    held_fields: ClassVar[Mapping[str, str]] = MappingProxyType({
        "target": "chooses where the run goes: this machine, an AWS account or a kubeconfig cluster",
        "cluster_name": "names the existing cluster and resources that up, status and down act on",
        "profile": "chooses which AWS credentials (and so which account) rtui uses",
        "hf_token": "chooses the file or variable read and shipped to the cluster as a Secret",
        "model_id": "chooses the model downloaded or read from disk, and run",
        "model_revision": "chooses the commit of the model that is downloaded and run",
        "data": "chooses the file or bucket the job reads",
        "tokenizer": "chooses the tokenizer downloaded or read from disk",
        "storage_path": "chooses where checkpoints and the model are written (a bucket may be anyone's)",
        "resume_from": "chooses the checkpoint every worker loads (a checkpoint can carry a pickle)",
        "job_env": "chooses which of your environment variables reach the job",
    })

    # allow_inf_nan=False: "nan" passes every gt/lt bound (each comparison is False), so a
    # non-finite number would otherwise be reported as out of range, or not at all.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    # A registered target's name (registry.BUILTIN, or an installed package's): checked by _known_target.
    target: str = Field(default=registry.DEFAULT,
        description="Where to run: this machine, a new EKS cluster, or a kubeconfig one")
    cluster_name: str = Field(default="rtui-ray",
        description="Name of the cluster (and of the RayCluster); identifies the run")
    # --- AWS credentials: the aws target's, and any target's s3:// storage ---
    profile: str | None = Field(default=None, description="AWS profile (else the usual credential chain): the aws "
                                "target's and any s3:// storage's")
    hf_token: str = Field(default="", description="Hugging Face token for the cluster's pods, as a Secret: env:NAME (a "
                                          "variable of rtui's environment) or a file path; the value is never stored")
    # --- idle: what goes when no job needs it (issue 26) ---
    idle_minutes: float = Field(default=10.0, ge=0, le=7 * 24 * 60,
        description="Minutes without a job after which the GPU "
                                "workers go (Ray's autoscaler; a node autoscaler then removes their nodes), or "
                                "the local cluster stops; fractions allowed; 0 = never (the cluster stays at full "
                                "size)")
    # --- training ---
    model_id: str = Field(default="", description="Hugging Face model id, or a model directory on disk (default: "
                                          f"{DEFAULT_MODEL_ID} on GPU clusters, a tiny random Qwen2 locally; "
                                          "locally only a directory)")
    model_revision: str = Field(default="", description="Hugging Face revision of --model-id: a branch, tag or commit "
                                                "(default: main), resolved to its commit when planning; the job "
                                                "loads that commit")
    steps: int = Field(default=100, ge=1, le=10_000_000, description="Training steps")
    seq_len: int = Field(default=0, ge=0, le=131_072,
        description="Sequence length in tokens (0 = 1024 on GPU clusters, 128 locally)")
    batch_size: int = Field(default=0, ge=0, le=4096,
        description="Per-worker micro-batch (0 = on GPU clusters the largest of 16, 8, 4, 2, 1 the GPU's memory "
                    "fits by the plan's estimate, 32 locally)")
    learning_rate: float = Field(
        default=0, ge=0, lt=1,
            description="AdamW learning rate (0 = 1e-5 on GPU clusters, 1e-3 for the local tiny model)")
    num_workers: int = Field(default=0, ge=0, le=4096, description="Ray Train workers (0 = every GPU; locally 0 = 2)")
    precision: Precision = Field(default="auto",
        description="FSDP parameter precision (auto = bf16 on GPUs, fp32 on CPU)")
    data: str = Field(default="auto",
        description="Training data: auto (on GPU clusters the Hub chat dataset "
                      f"{DEFAULT_DATASET.repo}, {DEFAULT_DATASET.licence}, pinned to its commit when planning; "
                      "locally cycle), cycle (a token pattern a model learns in a few dozen steps), random (uniform "
                      "ids: the loss stays at ln(vocab)), a JSONL/Parquet path or s3:// URI, or "
                      "hf://datasets/OWNER/NAME[@REVISION][/PATH]")
    text_field: str = Field(default="text", description="Text column of the data files")
    tokenizer: str | None = Field(default=None,
        description="Tokenizer dir or hub id for data files (default: the model id)")
    shard: Literal["full", "hybrid"] = Field(default="full",
        description="FSDP2 sharding: full, or hybrid (shard in a node)")
    shard_size: int = Field(default=0, ge=0, le=4096,
        description="GPUs per shard group with --shard hybrid (0 = the GPUs of "
                                                          "one node)")
    reduce_dtype: Literal["fp32", "bf16"] = Field(
        default="fp32",
            description="Gradient reduce dtype under bf16 (bf16 halves the bytes; sums still accumulate in fp32)")
    reshard_after_forward: Literal["auto", "yes", "no"] = Field(
        default="auto", description="Free each layer's gathered weights after forward (auto = yes on GPUs, no on CPU)")
    optimizer: Literal["auto", "fused", "foreach", "plain"] = Field(
        default="auto", description="AdamW implementation (auto = fused on GPUs, foreach on CPU)")
    tokens_per_step: int = Field(default=0, ge=0,
        description="Tokens per optimizer step (0 = no gradient accumulation)")
    activation_checkpointing: bool = Field(default=False,
        description="Recompute activations in backward to save memory")
    compile: bool = Field(default=False, description="torch.compile each decoder layer")
    # int | str, not int | Literal["auto"]: the CLI reads a Literal as the flag's only choices.
    checkpoint_every: int | str = Field(default=0,
        description="Checkpoint every N steps and at the end (0 = never), or auto: at the interval that loses "
                    "the least time to checkpoints and redone steps at the target's expected interruption rate")
    export_every: int = Field(default=0, ge=0,
        description="Also write the Hugging Face model every N steps (the one at the end is always written)")
    storage_path: str | None = Field(default=None,
        description="Checkpoints and results: a dir or s3:// (local default: temp)")
    resume_from: str | None = Field(default=None, description="Resume from a checkpoint dir, run dir or 'latest'")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        default="constant", description="Learning rate after warmup: constant, or cosine/linear decay to 10% of "
                                        "it at the last step")
    warmup_steps: int = Field(default=0, ge=0, description="Steps of linear warmup from 0 to the learning rate")
    # 0.0: a short fine-tune from pretrained weights is not regularised toward zero by default (decay
    # pulls toward 0, not toward the pretrained weights); transformers' TrainingArguments default too.
    weight_decay: float = Field(default=0.0, ge=0, lt=1,
        description="AdamW weight decay, on weight matrices only (never norms, biases or embeddings)")
    max_grad_norm: float = Field(default=1.0, ge=0, description="Clip the global gradient norm to this (0 = off)")
    seed: int = Field(default=0, ge=0, description="Seed of the model's initialisation and the data order")
    eval_tokens: int = Field(default=2048, ge=0,
        description="Held-out tokens evaluated before the first step and after the last (0 = no evaluation)")
    keep_checkpoints: int = Field(default=2, ge=1, description="Checkpoints kept per run (the oldest are deleted)")
    max_failures: int = Field(default=0, ge=0,
        description="Restart the workers up to N times when one dies, from the run's newest complete checkpoint")
    require_transport: Transport = Field(
        default="auto", description="Fail the job early unless NCCL uses this network (auto = efa on aws and kube, any "
                           "locally; any also lets the pods run without EFA)")
    job_env: str = Field(default="",
        description="Variables of rtui's environment the job gets, by name (e.g. HF_TOKEN); "
                                         "no other credential reaches the cluster")

    @field_validator("cluster_name", "job_env")
    @classmethod
    def _matches_pattern(cls, v: str, info: ValidationInfo) -> str:
        return matches(PATTERNS, v, info)

    @field_validator("target")
    @classmethod
    def _known_target(cls, v: str) -> str:
        if not registry.known(v):
            raise ValueError(f"expected one of {', '.join(registry.names())}")
        return v

    @field_validator("job_env")
    @classmethod
    def _no_credentials(cls, v: str) -> str:
        refused = credential_names(v.split(","))
        if refused:
            raise ValueError(f"{refused[0]} is a credential of your clouds, clusters or accounts and never goes to a "
                             f"job; pass only what the job needs (such as {', '.join(sorted(JOB_SECRETS))})")
        return v

    @field_validator("storage_path")
    @classmethod
    def _storage_uri(cls, v: str | None) -> str | None:
        """A directory, or a URI of a filesystem the job writes to (``SHARED_STORAGE_SCHEMES``)."""
        if not v:
            return v
        scheme, sep, rest = v.partition("://")
        if sep:
            if f"{scheme}://" not in SHARED_STORAGE_SCHEMES:
                raise ValueError(f"a directory or a URI of {', '.join(SHARED_STORAGE_SCHEMES)}; "
                                 f"{scheme}:// is none of them")
            bucket = rest.split("/", 1)[0]
            if not bucket:
                raise ValueError(f"no bucket named (expected {scheme}://BUCKET/PREFIX)")
            if scheme == "s3" and not S3_BUCKET.fullmatch(bucket):
                raise ValueError(f"{bucket!r} is not an S3 bucket name (3-63 characters: lowercase letters, digits, "
                                 "'.' and '-', starting and ending with a letter or digit)")
        elif re.match(r"[A-Za-z0-9]+:/", v) and v.split(":", 1)[0].lower() + "://" in SHARED_STORAGE_SCHEMES:
            raise ValueError(f"a URI has two slashes after its scheme: {v.split(':', 1)[0].lower()}://…")
        return v

    @field_validator("checkpoint_every", mode="before")
    @classmethod
    def _steps_or_auto(cls, v: object) -> int | str:
        """A whole number of steps (a flag's or variable's text too), or auto."""
        accepted = "a number of steps (0 = never), or auto (from the target's expected interruption rate)"
        if isinstance(v, str):
            if v.strip() == "auto":
                return "auto"
            try:
                v = int(v.strip())
            except ValueError:
                raise ValueError(accepted) from None
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(accepted)
        if v < 0:
            raise ValueError(f"{accepted}; not negative")
        return v

    @field_validator("seq_len")
    @classmethod
    def _seq_len(cls, v: int) -> int:
        if 0 < v < 8:
            raise ValueError("at least 8 tokens, or 0 for the target's default")
        return v

    @field_validator("hf_token")
    @classmethod
    def _token_source(cls, v: str) -> str:
        if v.startswith("env:") and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v[4:]):
            raise ValueError("env:NAME with NAME a variable name such as HF_TOKEN, or a file path")
        return v

    def wants_efa(self) -> bool:
        """Whether the GPU pods hold an EFA interface (they then need one on every GPU node)."""
        return self.effective_require_transport() in ("efa", "efa_gdr")

    def job_env_names(self) -> tuple[str, ...]:
        return tuple(n for n in self.job_env.split(",") if n)

    def effective_data(self) -> str:
        """What the job reads: --data, or by default a real instruction dataset on GPU clusters (a
        default run delivers a model tuned on conversations, not on a token pattern) and the
        synthetic cycle locally (no network)."""
        if self.data != "auto":
            return self.data
        return default_dataset_uri() if self.target_traits().on_gpus else "cycle"

    def data_is_file(self) -> bool:
        return self.effective_data() not in ("random", "cycle")

    def data_is_hub(self) -> bool:
        return self.effective_data().startswith(HF_DATASETS)

    @classmethod
    def trust(cls, field: str) -> str | None:
        """Why a checkout's file may not set ``field`` on its own (held), or None when it may (free); a field
        no model along the way classifies is held."""
        for model in cls.__mro__:
            if field in vars(model).get("free_fields", ()):
                return None
            held = vars(model).get("held_fields", {})
            if field in held:
                return str(held[field])
        return UNCLASSIFIED

    @classmethod
    def of(cls: type[C], config: RunConfig) -> C:
        """``config`` as this model: a target's code takes its own settings from a run's config this way."""
        if not isinstance(config, cls):
            raise TypeError(f"a {cls.__name__} was expected, not a {type(config).__name__} "
                            f"(a config of the {config.target} target)")
        return config

    def target_traits(self) -> TargetTraits:
        """This run's target, as the config asks it (``backend.targets.Target`` is all of it)."""
        return target_traits(self.target)

    def target_defaults(self) -> registry.Defaults:
        """What the fields left on auto resolve to on this run's target (each target says why)."""
        return self.target_traits().defaults(self)

    def effective_batch_size(self) -> int:
        if self.batch_size:
            return self.batch_size
        defaults = self.target_defaults()
        if not defaults.batch_size and defaults.fit_batch is not None:
            return defaults.fit_batch(self)
        return defaults.batch_size or 1  # 0 with nothing to fit it: one sequence per step

    def effective_seq_len(self) -> int:
        return self.seq_len or self.target_defaults().seq_len

    def effective_precision(self) -> str:
        return self.precision if self.precision != "auto" else self.target_defaults().precision

    def effective_learning_rate(self) -> float:
        return self.learning_rate or self.target_defaults().learning_rate

    def effective_model_id(self) -> str | None:
        """The model the job loads: the hub default on GPU clusters; locally only what was asked
        for (None: the tiny random Qwen2)."""
        return self.model_id or self.target_defaults().model_id

    def effective_shard_size(self) -> int:
        """Ranks per FSDP shard group: every rank (full), or one node's GPUs (hybrid)."""
        workers = self.effective_workers()
        if self.shard == "full":
            return workers
        return self.shard_size or self.target_defaults().shard_size

    def effective_require_transport(self) -> str:
        return self.require_transport if self.require_transport != "auto" else self.target_defaults().require_transport

    def idle_timeout_s(self) -> int | None:
        """Whole seconds of idleness before the GPU workers (or the local cluster) go; None: never.
        KubeRay's ``idleTimeoutSeconds`` is an int32, so a fraction of a second rounds up."""
        if not self.idle_minutes:
            return None
        return max(1, math.ceil(self.idle_minutes * 60))

    def effective_workers(self) -> int:
        return self.num_workers or self.target_defaults().workers

    def auto_values(self) -> dict[str, Any]:
        """{field: what it resolves to on this target} for each field left on auto (0 or "auto")."""
        effective: dict[str, Any] = {
            "seq_len": self.effective_seq_len(),
            "batch_size": self.effective_batch_size(),
            "num_workers": self.effective_workers(),
            "precision": self.effective_precision(),
            "learning_rate": self.effective_learning_rate(),
            "require_transport": self.effective_require_transport(),
        }
        return {field: value for field, value in effective.items() if getattr(self, field) != value}

    def fields_of_target(self) -> tuple[str, ...]:
        """The fields this run's target reads, in declaration order (the others are never used by it)."""
        return tuple(type(self).model_fields)

    def effective_rows(self, sources: Mapping[str, str]) -> list[tuple[str, Any, str]]:
        """(field, the value the run uses, where it came from) for each field of the target.

        A field left on auto shows what it resolves to here, and says so: ``auto on local (default)``.
        ``sources`` is ResolvedConfig.sources; a field missing there came from the run's record.
        """
        auto = self.auto_values()
        rows = []
        for field in self.fields_of_target():
            source = sources.get(field, "run record")
            if field in auto:
                rows.append((field, auto[field], f"auto on {self.target} ({source})"))
            else:
                rows.append((field, getattr(self, field), source))
        return rows


COMMON_FIELDS: tuple[str, ...] = tuple(RunConfig.model_fields)


def config_model(target: str) -> type[RunConfig]:
    """The config model of the target called ``target`` (KeyError: no target has that name)."""
    return target_traits(target).config_model


def field_owners() -> dict[str, tuple[str, ...]]:
    """{field: the targets whose config has it} for every field of every known target's config, the common
    fields first, then each target's own in its model's order: what the CLI makes flags of, and what
    rtui.toml and ``RTUI_*`` may name."""
    models = {name: config_model(name) for name in registry.names()}
    owners: dict[str, tuple[str, ...]] = {field: tuple(models) for field in COMMON_FIELDS}
    for name, model in models.items():
        for field in model.model_fields:
            if field not in COMMON_FIELDS:
                owners[field] = (*owners.get(field, ()), name)
    return owners


def field_info(field: str) -> FieldInfo:
    """The declaration of ``field`` in the first known target's config that has it (KeyError: none has)."""
    for name in field_owners()[field]:
        model = config_model(name)
        if field in model.model_fields:
            return model.model_fields[field]
    raise KeyError(field)


def reconfigured(config: RunConfig, update: Mapping[str, Any]) -> RunConfig:
    """``config`` with ``update`` applied, as its (perhaps new) target's model: the fields that target has
    not are left out, and the values are checked as a file's would be."""
    model = config_model(str(update.get("target", config.target)))
    merged = {**config.model_dump(mode="json"), **update}
    return model.model_validate({k: v for k, v in merged.items() if k in model.model_fields}, strict=False)


# A field no config model classifies (backend.trust): held.
UNCLASSIFIED = "not on the allowlist of fields a checkout's file may set"


def field_trust(field: str) -> str | None:
    """Why a checkout's file may not set ``field`` on its own, or None when it may: as the model that
    declares it says (a field no known target has is held)."""
    owners = field_owners().get(field)
    return config_model(owners[0]).trust(field) if owners else UNCLASSIFIED


def free_fields() -> frozenset[str]:
    """Every known target's fields a checkout's file may set on its own."""
    return frozenset(f for f in field_owners() if is_free(f))


def held_fields() -> dict[str, str]:
    """{field: why it is held} for every known target's held fields (an unclassified one says so)."""
    return {f: reason for f in field_owners() if (reason := field_trust(f)) is not None}


def is_free(field: str) -> bool:
    return field_trust(field) is None


def held_reason(field: str) -> str:
    """Why a checkout's file may not set ``field`` on its own (a free one waits only beside held ones)."""
    return field_trust(field) or "waits with the file's held fields: it does not fit their defaults"


def config_for(target: str, **fields: Any) -> RunConfig:
    """A config of ``target`` with these fields set (validated, as a run's config is)."""
    return config_model(target).model_validate({"target": target, **fields})


# What an error line echoes of a user's value: enough to recognise it, never a screenful.
ECHO_LIMIT = 60


def shown(value: object, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)`` for an error line: one line (repr escapes newlines), at most ~``limit`` chars."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str | bytes) else ""
    return text[: limit - 1] + "…" + size


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` unquoted for an error line, escaped when it holds control characters, cut like ``shown``."""
    line = text if text.isprintable() else repr(text)[1:-1]
    return line if len(line) <= limit else line[: limit - 1] + f"… ({len(text)} characters)"


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


# How this machine reaches a run's cluster rather than what the run is: taken from the environment
# (RTUI_*) over a run's recorded config whenever a run is opened again (status, logs, down).
# A target marks such a field ``Field(json_schema_extra=SESSION)``.
SESSION: dict[str, JsonValue] = {"session": True}


def session_fields(model: type[RunConfig]) -> tuple[str, ...]:
    return tuple(f for f, info in model.model_fields.items() if info.json_schema_extra == SESSION)


def with_session_settings(config: RunConfig, environ: Mapping[str, str] | None = None) -> RunConfig:
    """``config`` with the session fields (``SESSION``) that the environment sets now."""
    environ = os.environ if environ is None else environ
    raw = {field: environ[env_name(field)] for field in session_fields(type(config)) if environ.get(env_name(field))}
    if not raw:
        return config
    try:
        return type(config).model_validate({**config.model_dump(mode="json"), **raw}, strict=False)
    except ValidationError as exc:
        raise _describe_error(exc, {field: "env" for field in raw}, raw) from None


class ResolvedConfig(BaseModel):
    config: SerializeAsAny[RunConfig]  # its target's model, whole
    sources: dict[str, str]
    config_file: str | None = None
    # The held fields a checkout's file (./rtui.toml, or --config outside the user's config dir) sets
    # and the user has not confirmed in this content (see backend.trust), with the file's values, and
    # the hash a confirmation records.
    unconfirmed: dict[str, Any] = Field(default_factory=dict)
    config_sha256: str | None = None


Untrusted = Literal["refuse", "withhold", "show"]


def _find_config_file(explicit: str | None, cwd: Path) -> Path | None:
    if explicit is not None:
        if not explicit:  # Path("") is the current directory: "is a directory" would puzzle
            raise UserError("--config is empty", remedy="pass --config FILE, or leave it out to use ./rtui.toml")
        path = Path(explicit).expanduser()
        problem = _not_a_config_file(path)
        if problem is not None:
            raise UserError(f"config file {shown(explicit)} {problem}", remedy="pass an existing --config FILE")
        return path
    for candidate in (cwd / CONFIG_FILENAME, config_dir() / CONFIG_FILENAME):
        problem = _not_a_config_file(candidate)
        if problem is None:
            return candidate
        if not problem.startswith(_MISSING):
            # There but unreadable: skipping it would run on defaults the user did not choose.
            raise UserError(f"{candidate} {problem}", remedy="remove or rename it, or pass --config FILE")
    return None


_MISSING = "does not exist"


def _not_a_config_file(path: Path) -> str | None:
    """Why ``path`` cannot be read as rtui.toml, or None when it is a regular file.

    Checked before opening: opening a FIFO for reading blocks until a writer appears."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return _MISSING
    except NotADirectoryError:
        return f"{_MISSING} (a parent is not a directory)"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    if stat.S_ISFIFO(mode):
        return "is a FIFO (named pipe), not a regular file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a regular file"
    return "is a device, not a regular file"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None


def _load_toml(path: Path, content: bytes) -> dict[str, Any]:
    # lazy: tomllib only when there is a rtui.toml to read
    import tomllib

    try:
        # utf-8-sig: Windows editors save "UTF-8" with a byte-order mark, which tomllib rejects
        # as an "invalid statement" at line 1.
        data = tomllib.loads(content.decode("utf-8-sig"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({exc})", remedy="fix the file") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})",
                        remedy="save the file as UTF-8 (TOML requires it)") from None
    unknown = sorted(set(data) - set(field_owners()))
    if unknown:
        raise UserError(
            f"{path}: unknown config key {shown(unknown[0])}",
            remedy="see `rtui config show` for the accepted keys",
        )
    return data


def _describe_error(exc: ValidationError, sources: Mapping[str, str], raw: Mapping[str, Any]) -> UserError:
    err = exc.errors()[0]
    field = str(err["loc"][0]) if err["loc"] else "config"
    where = sources.get(field, "default")
    name = flag_name(field) if where == "flag" else env_name(field) if where == "env" else field
    value = raw.get(field, err.get("input"))
    msg = err["msg"].removeprefix("Value error, ")
    if field in field_owners():
        annotation = field_info(field).annotation
        if "Literal" in str(annotation):
            msg = f"expected one of {', '.join(getattr(annotation, '__args__', ()))}"
    return UserError(f"invalid {name}={shown(value)} (from {where}): {msg}")


def resolve_config(
    flags: Mapping[str, Any] | None = None,
    *,
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    untrusted: Untrusted = "refuse",
) -> ResolvedConfig:
    """Merge every source into one validated RunConfig with per-field provenance.

    ``untrusted`` says what becomes of the held fields of a checkout's file (./rtui.toml, or
    ``--config FILE`` outside the user's config dir) the user has not confirmed (backend.trust):
    ``refuse`` (a UserError naming them and how to confirm), ``withhold`` (left out, listed in
    ``unconfirmed`` for the wizard to ask) or ``show`` (kept and marked, for ``config show`` and
    ``config trust``).
    """
    try:
        return _resolve(flags, config_file, environ, cwd, untrusted, hold_whole_file=False)
    except UserError:
        if untrusted != "withhold":
            raise
        # The file's free knobs may fit only its held fields (require_transport = "efa" needs its
        # target = "kube"): until the user confirms, the whole file waits, and the yes takes it all.
        return _resolve(flags, config_file, environ, cwd, untrusted, hold_whole_file=True)


def _resolve(flags: Mapping[str, Any] | None, config_file: str | None, environ: Mapping[str, str] | None,
             cwd: Path | None, untrusted: Untrusted, *, hold_whole_file: bool) -> ResolvedConfig:
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    raw: dict[str, Any] = {}
    sources: dict[str, str] = {}

    path = _find_config_file(config_file, cwd)
    sha256 = None
    if path is not None:
        content = _read(path)
        sha256 = digest(content)
        for key, value in _load_toml(path, content).items():
            raw[key] = value
            sources[key] = f"file:{path}"
    known = field_owners()
    for field in known:
        value = environ.get(env_name(field))
        if value is not None:
            raw[field] = value
            sources[field] = "env"
    unknown_env = sorted(
        k for k in environ if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX) :].lower() not in known
    )
    unknown_env = [k for k in unknown_env if k not in _NON_CONFIG_ENV]
    if unknown_env:
        raise UserError(f"unknown environment variable {shown(unknown_env[0])}", remedy="unset it or fix its name")
    for field, value in (flags or {}).items():
        if value is not None:
            raw[field] = value
            sources[field] = "flag"
    unconfirmed = _unconfirmed(path, sha256, raw, sources, hold_whole_file)
    if unconfirmed and untrusted == "refuse":
        raise UserError(f"{path} sets {', '.join(unconfirmed)}, which you have not confirmed",
                        remedy=f"review them with `{trust_command(config_file, 'show')}`, then run "
                               f"`{trust_command(config_file)}` (or pass them as flags)")
    for field in unconfirmed:
        if untrusted == "withhold":
            del raw[field]
            sources[field] = "default"
        else:
            sources[field] += (f" (held, not confirmed: {held_reason(field)}; review, then "
                               f"`{trust_command(config_file)}`)")
    model = _model_of(raw, sources)
    for field in [f for f in raw if f not in model.model_fields]:
        _not_this_targets(field, raw, sources, known)
    for field in model.model_fields:
        sources.setdefault(field, "default")
        # Empty strings from env/flags mean "unset" for optional fields.
        if raw.get(field) == "" and model.model_fields[field].default is None:
            raw[field] = None
    try:
        config = model.model_validate(raw, strict=False)
    except ValidationError as exc:
        raise _describe_error(exc, sources, raw) from None
    if config.data_is_hub():
        parse_dataset_uri(config.effective_data())  # its form, said now (an offline target refuses it at plan)
    elif config.data_is_file() and not config.data.startswith("s3://"):
        data_path = (cwd / config.data).resolve()
        try:
            found = data_path.exists()
        except OSError:  # a name too long for the file system, say: it cannot name data either
            found = False
        if not found:
            raise UserError(f"--data {shown(config.data)}: no such file or directory",
                            remedy="give a JSONL/Parquet file or folder, an s3:// URI, `random` or `cycle`")
        config = config.model_copy(update={"data": str(data_path)})
    config = config.target_traits().check(config, cwd)
    if config.tokens_per_step:
        # lazy: the step planner only for --tokens-per-step; not on the first frame
        from training.stepplan import StepPlanError, plan_step

        try:
            plan_step(tokens_per_step=config.tokens_per_step, seq_len=config.effective_seq_len(),
                      world=config.effective_workers(), micro_batch=config.batch_size or None)
        except StepPlanError as exc:
            raise UserError(str(exc)) from None
    config = _check_training(config, cwd)
    return ResolvedConfig(config=config, sources=sources, config_file=str(path) if path else None,
                          unconfirmed=unconfirmed, config_sha256=sha256)


def _model_of(raw: Mapping[str, Any], sources: Mapping[str, str]) -> type[RunConfig]:
    """The config model of the target ``raw`` names (an unknown name is refused as the field's error)."""
    target = raw.get("target", registry.DEFAULT)
    if not isinstance(target, str) or not registry.known(target):
        try:
            RunConfig.model_validate({"target": target}, strict=False)
        except ValidationError as exc:
            raise _describe_error(exc, sources, raw) from None
    return config_model(str(target))


def _not_this_targets(field: str, raw: dict[str, Any], sources: dict[str, str],
                      owners: Mapping[str, tuple[str, ...]]) -> None:
    """A setting of other targets than the run's: a flag is refused (the user asked for it now, on a
    target that would ignore it); a file's or a variable's is left out (one rtui.toml or shell may serve
    several targets)."""
    target, source = raw.get("target", registry.DEFAULT), sources[field]
    whose = " and ".join(owners[field]) + (" targets" if len(owners[field]) > 1 else " target")
    if source == "flag":
        flag = flag_name(field)
        raise UserError(f"{flag} is a setting of the {whose}; the {target} target has none",
                        remedy=f"leave {flag} out here, or use --target {owners[field][0]}")
    del raw[field]
    sources[field] += f" (not used by the {target} target)"


def trust_command(config_file: str | None, action: Literal["trust", "show"] = "trust") -> str:
    """The command that confirms (or shows) the file read: ./rtui.toml in this directory, or the one named."""
    command = f"rtui config {action}"
    return f"{command} --config {shlex.quote(config_file)}" if config_file else command


def _unconfirmed(path: Path | None, sha256: str | None, raw: Mapping[str, Any], sources: dict[str, str],
                 hold_whole_file: bool = False) -> dict[str, Any]:
    """{held field: value} a checkout's file decides and the user has not confirmed in this content.

    Every file is held (./rtui.toml and ``--config FILE`` alike) except one inside the user's own
    config dir; a held field a flag or variable sets is not read from the file. A confirmed file's
    held fields say so. ``hold_whole_file``: its free fields wait too, when held fields are in it."""
    if path is None or sha256 is None or is_users_own(path, config_dir()):
        return {}
    from_file = [f for f in field_owners() if sources.get(f, "").startswith("file:")]
    held = [f for f in from_file if not is_free(f)]
    if held and hold_whole_file and not is_trusted(path, sha256):
        held = from_file
    if not held:
        return {}
    if is_trusted(path, sha256):
        for field in held:
            sources[field] += " (confirmed)"
        return {}
    return {f: raw[f] for f in held}


def _check_training(config: RunConfig, cwd: Path) -> RunConfig:
    """What the job would refuse (or silently get wrong) on the cluster, said before anything starts;
    a local model directory comes back absolute (the job does not run in this directory)."""
    if config.shard_size and config.shard == "full":
        raise UserError(f"--shard-size={config.shard_size} applies to --shard hybrid only",
                        remedy="add --shard hybrid, or drop --shard-size")
    workers = config.effective_workers()
    if config.shard == "hybrid" and workers % config.effective_shard_size():
        raise UserError(f"--shard hybrid: shard groups of {config.effective_shard_size()} GPUs do not divide the "
                        f"{workers} workers", remedy="set --shard-size to a divisor of the workers (the GPUs per node)")
    if not config.target_traits().shared_disk and (config.checkpoint_every or config.resume_from):
        storage = config.storage_path or ""
        if not storage.startswith(SHARED_STORAGE_SCHEMES) and not config.target_traits().gives_storage(config):
            what = "--checkpoint-every" if config.checkpoint_every else "--resume-from"
            where = f"--storage-path {shown(storage)} is" if storage else "without --storage-path, checkpoints go to"
            raise UserError(f"{what} on {config.target}: {where} each node's own disk, so no node holds a whole "
                            "checkpoint and a resume finds none",
                            remedy="pass --storage-path s3://BUCKET/PREFIX (shared storage every node can write)")
    _check_model_family(config, cwd)
    if config.data_is_file() and not config.data_is_hub():  # a Hub dataset is pinned and named by the plan
        from backend.datacheck import check_data  # lazy: pyarrow/transformers only for data files

        check_data(config.data, text_field=config.text_field, tokenizer=config.tokenizer or config.model_id,
                   seq_len=config.effective_seq_len(), cwd=cwd)
    return config


def _check_model_family(config: RunConfig, cwd: Path) -> None:
    """A local model directory the job would refuse (no decoder layer list to shard), said at plan time.
    A hub id is checked by the job, which reads its config.json first (``training.step.load_pretrained``)."""
    from training.families import refusal  # lazy: stdlib only, but training/ stays out of the config's import

    path = cwd / config.model_id / "config.json" if config.model_id else None
    try:
        raw = json.loads(path.read_text()) if path is not None and path.is_file() else None
    except (OSError, ValueError):
        return  # unreadable here: the job says what is wrong with it
    why = refusal(raw) if isinstance(raw, dict) else None
    if why:
        raise UserError(f"--model-id {shown(config.model_id)}: {why}",
                        remedy="pick a decoder-only causal LM such as Qwen2/3, Llama, Mistral or Gemma")


# RTUI_* variables that are not config fields (so they are not reported as typos).
_NON_CONFIG_ENV = frozenset({"RTUI_STATE_DIR", "RTUI_CONFIG_DIR", "RTUI_CACHE_DIR", "RTUI_LOG_LEVEL",
                             "RTUI_CHECKIP_URL"})
