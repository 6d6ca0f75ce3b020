"""The shape of one optimizer step: micro-batch, gradient accumulation, and whether it fits in memory.

Stdlib only, so the arithmetic is unit-tested without torch. ``--tokens-per-step`` fixes the tokens
one optimizer step consumes across all ranks; with every FSDP/HSDP rank data-parallel,

    tokens_per_step = micro_batch × seq_len × world × grad_accum

and the memory estimate decides the largest micro-batch that fits (``--batch-size auto``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

GIB = 2**30
# Fraction of the budget the estimate may use: allocator fragmentation, NCCL buffers and the
# estimate's own error live in the rest.
MEMORY_HEADROOM = 0.85


class StepPlanError(ValueError):
    """The requested step shape is impossible; the message says why and what would work."""


@dataclass(frozen=True)
class ModelShape:
    n_params: int
    n_layers: int
    hidden: int
    intermediate: int
    vocab: int
    # One decoder layer's parameters, counted from its config (0: unknown, approximated below).
    per_layer: int = 0

    @property
    def layer_params(self) -> int:
        if self.per_layer:
            return self.per_layer
        # q,k,v,o counted full + SwiGLU MLP. Under GQA this overcounts k/v, and the root unit (the rest)
        # is then undercounted by as much: for Qwen2.5-7B 0.6·10⁹ parameters of the embeddings, about
        # 1 GiB of gathered bf16 the estimate would miss. Hence per_layer when the config is known.
        return 4 * self.hidden * self.hidden + 3 * self.hidden * self.intermediate

    @property
    def root_params(self) -> int:
        """Parameters outside the decoder layers (embeddings, lm_head, final norm): the FSDP root unit."""
        return max(0, self.n_params - self.n_layers * self.layer_params)


@dataclass(frozen=True)
class MemoryEstimate:
    sharded_state: int  # fp32 params + grads + AdamW's two moments, this rank's shard
    gathered_params: int  # unsharded compute-dtype copies alive at the peak
    activations: int  # saved for backward, one micro-batch
    logits: int  # logits and their gradient, one micro-batch (large vocabularies dominate here)
    accumulated_grads: int = 0  # unsharded gradients kept between micro-steps that skip gradient sync

    @property
    def total(self) -> int:
        return self.sharded_state + self.gathered_params + self.activations + self.logits + self.accumulated_grads

    def describe(self) -> str:
        return (f"{self.total / GIB:.2f} GiB = state {self.sharded_state / GIB:.2f} + gathered params "
                f"{self.gathered_params / GIB:.2f} + activations {self.activations / GIB:.2f} + logits "
                f"{self.logits / GIB:.2f} + accumulated grads {self.accumulated_grads / GIB:.2f}")


def estimate_memory(shape: ModelShape, *, micro_batch: int, seq_len: int, shard_size: int, compute_bytes: int,
                    reshard_after_forward: bool, activation_checkpointing: bool, grad_accum: int = 1,
                    grad_accum_bytes: int = 4) -> MemoryEstimate:
    """Per-rank peak bytes of one training step (a planning estimate, not a measurement).

    * State: FSDP keeps fp32 params, fp32 grads and AdamW's exp_avg/exp_avg_sq sharded over the
      ``shard_size`` ranks of a shard group: 16 bytes per parameter / shard_size.
    * Gathered params: with reshard after forward about two decoder layers are unsharded at once
      (the current one and the prefetched next) plus the root unit (embeddings, lm_head), which
      stays gathered for the whole step; without it every parameter stays gathered.
    * Activations, per layer (16-bit, Korthikanti et al. 2022 adapted to a SwiGLU MLP and a fused
      SDPA kernel that stores no s² attention matrix): ~ tokens × (15·hidden + 6·intermediate) bytes,
      scaled by compute_bytes / 2. Checkpointing keeps only each layer's input plus one layer's full set.
    * Logits: tokens × vocab × (compute_bytes + 8): the logits, their fp32 upcast in the loss, its grad.
    * Accumulated grads: with accumulation, the micro-steps that skip gradient sync keep unsharded
      gradients (``grad_accum_bytes`` each: fp32, as FSDP2 upcasts them to the fp32 reduce dtype; 0 when
      every micro-step reduces) until the step's last backward.
    """
    tokens = micro_batch * seq_len
    sharded = 16 * shape.n_params // max(1, shard_size)
    if reshard_after_forward:
        gathered = (2 * shape.layer_params + shape.root_params) * compute_bytes
    else:
        gathered = shape.n_params * compute_bytes
    per_layer = tokens * (15 * shape.hidden + 6 * shape.intermediate) * compute_bytes // 2
    if activation_checkpointing:
        activations = shape.n_layers * tokens * shape.hidden * compute_bytes + per_layer
    else:
        activations = shape.n_layers * per_layer
    logits = tokens * shape.vocab * (compute_bytes + 8)
    accumulated = shape.n_params * grad_accum_bytes if grad_accum > 1 else 0
    return MemoryEstimate(sharded, gathered, activations, logits, accumulated)


# micro_batch -> (estimate, fits); FitCheck is the real one, tests pass plain functions.
Fits = Callable[[int], "tuple[MemoryEstimate, bool]"]


@dataclass(frozen=True)
class StepPlan:
    micro_batch: int
    seq_len: int
    world: int
    grad_accum: int
    memory: MemoryEstimate | None = None

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch * self.seq_len * self.world * self.grad_accum

    @property
    def tokens_per_micro_step(self) -> int:
        """Tokens one rank processes per forward/backward."""
        return self.micro_batch * self.seq_len


def sequences_per_rank(tokens_per_step: int, seq_len: int, world: int) -> int:
    """Sequences each rank must process per optimizer step, or a clear error when it is not whole."""
    unit = seq_len * world
    if tokens_per_step <= 0:
        raise StepPlanError(f"--tokens-per-step must be positive, got {tokens_per_step}")
    if tokens_per_step % unit:
        lower = max(unit, tokens_per_step - tokens_per_step % unit)
        raise StepPlanError(
            f"--tokens-per-step {tokens_per_step} is not a multiple of seq_len × workers = {seq_len} × {world} = "
            f"{unit}; try {lower} or {lower + unit}")
    return tokens_per_step // unit


def plan_step(*, tokens_per_step: int, seq_len: int, world: int, micro_batch: int | None,
              fits: Fits | None = None) -> StepPlan:
    """Choose micro-batch and gradient accumulation.

    ``tokens_per_step`` 0 means one micro-batch per step (no accumulation; ``micro_batch`` required).
    ``micro_batch`` None means auto: the largest divisor of the per-rank sequences whose memory
    estimate fits. ``fits`` returns the estimate and whether it fits; None skips the memory check.
    """
    if tokens_per_step == 0:
        if micro_batch is None:
            raise StepPlanError("--batch-size auto needs --tokens-per-step")
        plan = StepPlan(micro_batch, seq_len, world, 1)
        return _checked(plan, fits)
    per_rank = sequences_per_rank(tokens_per_step, seq_len, world)
    if micro_batch is not None:
        if per_rank % micro_batch:
            raise StepPlanError(
                f"--tokens-per-step {tokens_per_step} gives {per_rank} sequences per rank per step "
                f"({tokens_per_step} / ({seq_len} × {world})), not a multiple of --batch-size {micro_batch}; "
                f"use a --batch-size that divides {per_rank}, or --batch-size auto")
        return _checked(StepPlan(micro_batch, seq_len, world, per_rank // micro_batch), fits)
    smallest: StepPlan | None = None
    for mb in sorted((d for d in range(1, per_rank + 1) if per_rank % d == 0), reverse=True):
        plan = StepPlan(mb, seq_len, world, per_rank // mb)
        if fits is None:
            return plan
        estimate, ok = fits(mb)
        plan = StepPlan(mb, seq_len, world, per_rank // mb, estimate)
        if ok:
            return plan
        smallest = plan
    assert smallest is not None  # per_rank >= 1, so there is at least the divisor 1
    raise StepPlanError(_too_big(smallest, fits))


class FitCheck:
    """Callable ``micro_batch -> (estimate, fits)`` against a per-rank byte budget."""

    def __init__(self, shape: ModelShape, *, seq_len: int, shard_size: int, compute_bytes: int,
                 reshard_after_forward: bool, activation_checkpointing: bool, budget_bytes: int | None,
                 budget_source: str, grad_accum_bytes: int = 4, sequences_per_rank: int | None = None) -> None:
        self.shape = shape
        self.sequences_per_rank = sequences_per_rank
        self.seq_len, self.shard_size, self.compute_bytes = seq_len, shard_size, compute_bytes
        self.reshard_after_forward, self.activation_checkpointing = reshard_after_forward, activation_checkpointing
        self.grad_accum_bytes = grad_accum_bytes
        self.budget_bytes = budget_bytes
        self.budget_source = budget_source

    def __call__(self, micro_batch: int) -> tuple[MemoryEstimate, bool]:
        accum = (self.sequences_per_rank // micro_batch) if self.sequences_per_rank else 1
        estimate = estimate_memory(self.shape, micro_batch=micro_batch, grad_accum=accum, seq_len=self.seq_len,
                                   shard_size=self.shard_size, compute_bytes=self.compute_bytes,
                                   reshard_after_forward=self.reshard_after_forward,
                                   activation_checkpointing=self.activation_checkpointing,
                                   grad_accum_bytes=self.grad_accum_bytes)
        if self.budget_bytes is None:
            return estimate, True  # nothing to compare with: do not block the run on an unknown
        return estimate, estimate.total <= self.budget_bytes * MEMORY_HEADROOM

    def describe_budget(self) -> str:
        if self.budget_bytes is None:
            return f"budget {self.budget_source}"
        return (f"budget {self.budget_bytes / GIB:.2f} GiB ({self.budget_source}) × headroom {MEMORY_HEADROOM} = "
                f"{self.budget_bytes * MEMORY_HEADROOM / GIB:.2f} GiB")


def _checked(plan: StepPlan, fits: Fits | None) -> StepPlan:
    if fits is None:
        return plan
    estimate, ok = fits(plan.micro_batch)
    plan = StepPlan(plan.micro_batch, plan.seq_len, plan.world, plan.grad_accum, estimate)
    if not ok:
        raise StepPlanError(_too_big(plan, fits))
    return plan


def _too_big(plan: StepPlan, fits: Fits | None = None) -> str:
    assert plan.memory is not None
    describe = getattr(fits, "describe_budget", None)
    budget = f" > {describe()}" if describe is not None else " does not fit the memory budget"
    return (f"micro-batch {plan.micro_batch} × seq {plan.seq_len} needs an estimated {plan.memory.describe()} per "
            f"rank{budget}. Lower --batch-size (or use auto with --tokens-per-step), shorten --seq-len, add "
            "--activation-checkpointing, use --shard full or a larger --shard-size, or skip the estimate with "
            "--no-memory-check")
