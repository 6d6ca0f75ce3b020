"""The training program's configuration: one frozen value, validated when it is built.

``training.train.parse_args`` builds it once from the command line, so a bad value stops the
program with one line before Ray starts. Ray Train hands ``train_loop_config`` to every worker as a
plain dict (and shows it on the dashboard), so the config crosses to the workers as ``as_dict()``
and each worker turns it back into a TrainConfig before anything reads it: a misspelt field is an
error on the driver or at the worker's first line, never a KeyError deep in a step.

Stdlib only: the backend may import it without paying for torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Literal, get_args

from training.data import is_synthetic
from training.raytrain import RENDEZVOUS_DIR_ENV
from training.stepplan import StepPlanError, plan_step

LrSchedule = Literal["constant", "cosine", "linear"]
OptimizerImpl = Literal["auto", "fused", "foreach", "plain"]
Precision = Literal["bf16", "fp32"]
ReduceDtype = Literal["fp32", "bf16"]
Device = Literal["cpu", "cuda"]
ShardMode = Literal["full", "hybrid"]
Reshard = Literal["auto", "yes", "no"]
RequiredTransport = Literal["any", "efa", "efa_gdr", "socket", "ib", "intra_node"]


class TrainConfigError(ValueError):
    """A value the program cannot run with; the message is one line naming the flag."""


def flag(field: str) -> str:
    """The command-line flag that sets ``field`` (the one exception is --no-memory-check)."""
    return "--no-memory-check" if field == "memory_check" else "--" + field.replace("_", "-")


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of one training run. The defaults are the command line's defaults."""

    steps: int = 20
    seq_len: int = 128
    batch_size: int | None = 1  # None: auto, the largest micro-batch that fits
    tokens_per_step: int = 0  # 0: one micro-batch per step
    memory_check: bool = True
    lr: float = 1e-5
    lr_schedule: LrSchedule = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # 0: no clipping
    optimizer: OptimizerImpl = "auto"
    num_workers: int = 2
    precision: Precision = "bf16"
    reduce_dtype: ReduceDtype = "fp32"
    device: Device = "cpu"
    model_id: str | None = None  # None: a tiny Qwen2 built from the tiny_* fields
    model_revision: str | None = None  # the hub commit rtui resolved at plan time (None: a local dir)
    tiny_hidden_size: int = 64
    tiny_layers: int = 2
    tiny_heads: int = 4
    tiny_vocab_size: int = 1024
    seed: int = 0
    shard: ShardMode = "full"
    shard_size: int = 0  # 0: the workers on one node
    reshard_after_forward: Reshard = "auto"
    activation_checkpointing: bool = False
    compile: bool = False
    data: str = "random"
    text_field: str = "text"
    tokenizer: str | None = None
    data_cpus: float = 0.5
    tokenize_actors: int = 1
    storage_path: str | None = None
    # A private dir every worker shares (the local target's), where they meet through torch's FileStore
    # instead of a TCPStore that listens on every interface (training.rendezvous). None: TCP, across nodes.
    rendezvous_dir: str | None = None
    run_name: str | None = None
    checkpoint_every: int | Literal["auto"] = 0  # auto: from --interruptions-per-hour (training.checkpoint_interval)
    interruptions_per_hour: float | None = None  # the job's expected interruptions, for --checkpoint-every auto
    keep_checkpoints: int = 2
    resume_from: str | None = None
    max_failures: int = 0
    require_transport: RequiredTransport = "any"
    eval_tokens: int = 2048  # held-out tokens evaluated before the first step and after the last; 0: none
    export_every: int = 0  # also export the model every N steps (the final export always happens)
    # Filled in by the driver before the workers start.
    nccl_dir: str | None = None  # where each rank's NCCL writes the log the transport guard reads
    resume_path: str | None = None  # the checkpoint --resume-from resolved to (None: a fresh start)
    export_root: str | None = None  # the local directory the model directories are written under

    def __post_init__(self) -> None:
        for name, kind in (("lr_schedule", LrSchedule), ("optimizer", OptimizerImpl), ("precision", Precision),
                           ("reduce_dtype", ReduceDtype), ("device", Device), ("shard", ShardMode),
                           ("reshard_after_forward", Reshard), ("require_transport", RequiredTransport)):
            allowed = get_args(kind)
            if getattr(self, name) not in allowed:
                raise TrainConfigError(f"{flag(name)} must be one of {', '.join(allowed)}, "
                                       f"not {getattr(self, name)!r}")
        for name in ("steps", "seq_len", "num_workers", "tiny_hidden_size", "tiny_layers", "tiny_heads",
                     "tiny_vocab_size", "tokenize_actors", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise TrainConfigError(f"{flag(name)} must be at least 1")
        for name in ("tokens_per_step", "shard_size", "warmup_steps", "max_failures", "eval_tokens",
                     "export_every",
                     "weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise TrainConfigError(f"{flag(name)} must not be negative")
        self._check_checkpoint_every()
        if self.batch_size is not None and self.batch_size < 1:
            raise TrainConfigError("--batch-size must be at least 1, or auto")
        if not self.lr > 0:
            raise TrainConfigError(f"--lr must be positive, not {self.lr}")
        if not self.data_cpus > 0:
            raise TrainConfigError(f"--data-cpus must be positive, not {self.data_cpus}")
        if self.require_transport != "any" and self.device != "cuda":
            raise TrainConfigError("--require-transport needs --device cuda: on CPU the collectives run on gloo, "
                                   "not NCCL")
        if self.tiny_hidden_size % self.tiny_heads:
            raise TrainConfigError("--tiny-hidden-size must be a multiple of --tiny-heads")
        try:  # the arithmetic needs no model: refuse an impossible step shape before Ray starts
            plan_step(tokens_per_step=self.tokens_per_step, seq_len=self.seq_len, world=self.num_workers,
                      micro_batch=self.batch_size)
        except StepPlanError as exc:
            raise TrainConfigError(str(exc)) from None
        if self.shard == "full" and self.shard_size:
            raise TrainConfigError("--shard-size applies to --shard hybrid only")
        if self.shard_size and self.num_workers % self.shard_size:
            raise TrainConfigError(f"--shard-size {self.shard_size} must divide --num-workers {self.num_workers}")
        if not self.synthetic_data and not self.tokenizer_source:
            raise TrainConfigError("--data with files needs --tokenizer (a hub id or local dir) or --model-id")

    def _check_checkpoint_every(self) -> None:
        every, rate = self.checkpoint_every, self.interruptions_per_hour
        if every != "auto" and (isinstance(every, bool) or not isinstance(every, int) or every < 0):
            raise TrainConfigError(f"--checkpoint-every must be a number of steps (0: never) or auto, not {every!r}")
        if rate is not None and not (0 <= rate < math.inf):
            raise TrainConfigError(f"--interruptions-per-hour must be a finite number, at least 0, not {rate}")
        if every == "auto" and rate is None:
            raise TrainConfigError("--checkpoint-every auto needs --interruptions-per-hour (the job's expected "
                                   "interruptions per hour; rtui passes its target's)")
        if every != "auto" and rate is not None:
            raise TrainConfigError("--interruptions-per-hour applies to --checkpoint-every auto only")

    @property
    def synthetic_data(self) -> bool:
        """Tokens generated on each rank (random or cycle) rather than read from files."""
        return is_synthetic(self.data)

    @property
    def tokenizer_source(self) -> str | None:
        return self.tokenizer or self.model_id

    @property
    def tokenizer_revision(self) -> str | None:
        """The model's pinned commit when the tokenizer is the model's own (a separate --tokenizer is
        loaded as named: a local dir, or a hub id at its main branch)."""
        return self.model_revision if self.tokenizer_source == self.model_id else None

    @property
    def use_gpu(self) -> bool:
        return self.device == "cuda"

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` applied, validated like the original."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The plain form Ray Train's ``train_loop_config`` carries to the workers."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """The inverse of ``as_dict``; an unknown key is a TypeError naming it."""
        return cls(**values)


# --- the command line -------------------------------------------------------------------------
DEFAULT = TrainConfig()


def _batch_size(text: str) -> int | None:
    if text == "auto":
        return None
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1, or auto")
    return value


def _checkpoint_every(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a number of steps (0: never) or auto") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be a number of steps (0: never) or auto, not negative")
    return value


def _parser(description: str | None = None) -> argparse.ArgumentParser:
    d = DEFAULT
    p = argparse.ArgumentParser(prog="training.train", description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps in total (a resumed run stops here too)")
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--batch-size", type=_batch_size, default=d.batch_size,
                   help="micro-batch per worker (sequences per forward/backward); auto: the largest that "
                        "divides the per-rank share of --tokens-per-step and passes the memory check")
    p.add_argument("--tokens-per-step", type=int, default=d.tokens_per_step,
                   help="tokens per optimizer step over all workers; sets gradient accumulation = N / "
                        "(batch × seq-len × workers). 0: one micro-batch per step")
    p.add_argument("--no-memory-check", dest="memory_check", action="store_false",
                   help="skip the per-rank memory estimate (params+grads+optimizer+activations vs free memory)")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--lr-schedule", choices=get_args(LrSchedule), default=d.lr_schedule,
                   help="after warmup: constant, or cosine or linear decay to 10%% of --lr at --steps")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay,
                   help="AdamW weight decay on weight matrices (never norms, biases or embeddings)")
    p.add_argument("--max-grad-norm", type=float, default=d.max_grad_norm,
                   help="clip the global gradient norm; 0: off")
    p.add_argument("--optimizer", choices=get_args(OptimizerImpl), default=d.optimizer,
                   help="AdamW implementation (auto: fused on CUDA, foreach on CPU)")
    p.add_argument("--num-workers", type=int, default=d.num_workers)
    p.add_argument("--precision", choices=get_args(Precision), default=d.precision)
    p.add_argument("--reduce-dtype", choices=get_args(ReduceDtype), default=d.reduce_dtype,
                   help="gradient reduce-scatter/all-reduce dtype under --precision bf16 (bf16 halves the bytes)")
    p.add_argument("--device", choices=get_args(Device), default=d.device)
    p.add_argument("--model-id", default=d.model_id,
                   help="Hugging Face model id or local model directory, loaded with fp32 master weights in "
                        "training mode (default: a tiny random Qwen2 from the --tiny-* fields)")
    p.add_argument("--model-revision", default=d.model_revision,
                   help="the hub revision (a commit sha) of --model-id to load (default: the hub's main)")
    p.add_argument("--tiny-hidden-size", type=int, default=d.tiny_hidden_size)
    p.add_argument("--tiny-layers", type=int, default=d.tiny_layers)
    p.add_argument("--tiny-heads", type=int, default=d.tiny_heads)
    p.add_argument("--tiny-vocab-size", type=int, default=d.tiny_vocab_size)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--shard", choices=get_args(ShardMode), default=d.shard,
                   help="full: FSDP over all workers; hybrid: shard within a group of --shard-size workers "
                        "(one node), replicate across groups, so only gradients cross nodes")
    p.add_argument("--shard-size", type=int, default=d.shard_size,
                   help="workers per shard group for --shard hybrid (0: the workers on one node)")
    p.add_argument("--reshard-after-forward", choices=get_args(Reshard), default=d.reshard_after_forward,
                   help="free gathered layers after forward (auto: yes on GPUs to save memory, no on CPU)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each decoder layer in backward instead of storing its activations")
    p.add_argument("--compile", action="store_true", help="torch.compile each decoder layer (one graph for all: "
                                                             "training runs without the KV cache)")
    p.add_argument("--data", default=d.data,
                   help="random (uniform ids, the reference), cycle (a learnable synthetic pattern), or a "
                        "path / s3:// URI of JSONL or Parquet text files")
    p.add_argument("--text-field", default=d.text_field, help="the text column of --data files")
    p.add_argument("--tokenizer", default=d.tokenizer,
                   help="tokenizer for --data files: hub id or local dir (default: --model-id)")
    p.add_argument("--data-cpus", type=float, default=d.data_cpus,
                   help="CPUs each Ray Data read/tokenise task asks for")
    p.add_argument("--tokenize-actors", type=int, default=d.tokenize_actors,
                   help="Ray Data actors tokenising and packing text")
    p.add_argument("--storage-path", default=os.environ.get("RTUI_STORAGE_PATH"),
                   help="where Ray Train keeps results and checkpoints: a local dir or s3:// URI")
    p.add_argument("--rendezvous-dir", default=os.environ.get(RENDEZVOUS_DIR_ENV),
                   help="a private dir all workers share, where they form torch's process group through a file "
                        "(no socket); unset: over TCP, as a multi-node cluster needs")
    p.add_argument("--run-name", default=d.run_name, help="Ray Train run name (default rtui-<unix time>)")
    p.add_argument("--checkpoint-every", type=_checkpoint_every, default=d.checkpoint_every,
                   help="save a checkpoint every N steps and at the end; 0: no checkpoints; auto: at the interval "
                        "that loses the least time to checkpoints and redone steps at --interruptions-per-hour "
                        "(Daly's optimum, from the measured step and checkpoint times)")
    p.add_argument("--interruptions-per-hour", type=float, default=d.interruptions_per_hour,
                   help="the job's expected interruptions per hour (all its nodes), for --checkpoint-every auto")
    p.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints,
                   help="checkpoints kept per run (oldest deleted)")
    p.add_argument("--resume-from", default=d.resume_from,
                   help="latest (the complete checkpoint written last under --storage-path: --run-name's newest "
                        "when it has one; a fresh start when there is none), or a checkpoint dir / run dir, "
                        "local or s3://")
    p.add_argument("--eval-tokens", type=int, default=d.eval_tokens,
                   help="held-out tokens (never trained on) evaluated before the first step and after the last; "
                        "0: none")
    p.add_argument("--export-every", type=int, default=d.export_every,
                   help="also write the Hugging Face model directory every N steps (it is always written at the end)")
    p.add_argument("--max-failures", type=int, default=d.max_failures,
                   help="worker-group restarts Ray Train may do when a worker dies; each resumes from the "
                        "run's newest complete checkpoint (or --resume-from's, or the start)")
    p.add_argument("--require-transport", default=d.require_transport, choices=get_args(RequiredTransport),
                   help="stop after the first collective unless NCCL uses this network")
    return p


def parse_args(argv: list[str] | None = None, *, description: str | None = None) -> TrainConfig:
    """The validated config from ``python -m training.train``'s arguments; a bad value exits with status 2 and
    one line saying what to fix. Here, not in training.train, so reading a job's arguments loads no torch."""
    p = _parser(description)
    args = p.parse_args(argv)
    try:
        return TrainConfig(**vars(args))
    except TrainConfigError as exc:
        p.error(str(exc))
