"""The training program's configuration: one frozen value, validated when it is built.

``training.train.parse_args`` builds it once from the command line, so a bad value stops the
program with one line before Ray starts. Ray Train hands ``train_loop_config`` to every worker as a
plain dict (and shows it on the dashboard), so the config crosses to the workers as ``as_dict()``
and each worker turns it back into a TrainConfig before anything reads it: a misspelt field is an
error on the driver or at the worker's first line, never a KeyError deep in a step.

Stdlib only: the backend may import it without paying for torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, get_args

from training.data import is_synthetic
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
    checkpoint_every: int = 0
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
        for name in ("tokens_per_step", "shard_size", "checkpoint_every", "warmup_steps", "max_failures", "eval_tokens",
                     "export_every",
                     "weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise TrainConfigError(f"{flag(name)} must not be negative")
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
