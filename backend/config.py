"""The settings of a run: ``RunConfig`` (what every target reads) and the lookups over each target's own
model (``Target.config_model``): which fields there are, who reads them, and how a checkout's rtui.toml may
set them. Resolving a config from flags, variables and files is ``backend.resolve``."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Protocol, TypeVar, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationInfo,
    field_validator,
)
from pydantic.fields import FieldInfo

from backend import registry
from backend.hub import DEFAULT_DATASET, HF_DATASETS, default_dataset_uri
from backend.trust import (
    JOB_SECRETS,
    credential_names,
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
    # Fields a model inherits from the one it builds on and its target does not take: field -> (what
    # is said, what to do), one line each. They are no flag, variable or rtui.toml key of that target
    # (``field_owners``): a flag is refused with these words, a file's value is left out and noted.
    refused_fields: ClassVar[Mapping[str, tuple[str, str]]] = MappingProxyType({})

    # allow_inf_nan=False: "nan" passes every gt/lt bound (each comparison is False), so a
    # non-finite number would otherwise be reported as out of range, or not at all.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False,
                              defer_build=True)

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
    return dict(_owners(tuple((name, config_model(name)) for name in registry.names())))


@cache
def _owners(models: tuple[tuple[str, type[RunConfig]], ...]) -> dict[str, tuple[str, ...]]:
    """``field_owners`` for these targets' models, made once per set of models (the CLI asks it for each flag)."""
    owners: dict[str, tuple[str, ...]] = {field: tuple(name for name, _ in models) for field in COMMON_FIELDS}
    for name, model in models:
        for field in model.model_fields:
            if field not in COMMON_FIELDS and field not in model.refused_fields:
                owners[field] = (*owners.get(field, ()), name)
    return owners


def field_info(field: str) -> FieldInfo:
    """The declaration of ``field`` in the first known target's config that has it (KeyError: none has)."""
    return config_model(field_owners()[field][0]).model_fields[field]


def reconfigured(config: RunConfig, update: Mapping[str, Any]) -> RunConfig:
    """``config`` with ``update`` applied, as its (perhaps new) target's model: the fields that target has
    not are left out, and the values are checked as a file's would be."""
    model = config_model(str(update.get("target", config.target)))
    merged = {**config.model_dump(mode="json"), **update}
    return model.model_validate({k: v for k, v in merged.items()
                                 if k in model.model_fields and k not in model.refused_fields}, strict=False)


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
