"""How often to checkpoint under ``--checkpoint-every auto``: the interval that loses the least of the
job's time to writing checkpoints and to redoing the steps after an interruption.

Stdlib only: rtui's plan runs the same arithmetic on estimates before anything is paid for, and the
training program on what it measures.

The model: interruptions come at random at a rate λ per second (a Poisson process), so M = 1/λ is the
mean time between them; writing a checkpoint stops training for δ seconds; after an interruption the
work since the last complete checkpoint is done again. Young (1974, "A first order approximation to
the optimum checkpoint interval", Communications of the ACM 17(9)) minimised the expected time lost to
first order and found the best compute time between checkpoints to be τ = sqrt(2δ/λ) = sqrt(2δM).
Daly (2006, "A higher order estimate of the optimum checkpoint interval for restart dumps", Future
Generation Computer Systems 22(3)) kept more of the cost function and solved it by perturbation:

    τ = sqrt(2δM) · (1 + (1/3)·sqrt(δ/(2M)) + (1/9)·δ/(2M)) − δ     while δ < 2M,
    τ = M                                                          once δ ≥ 2M.

This module uses Daly's form (Young's is its leading term). The examples Daly gives in that paper
(δ = 5 min: τ ≈ 117 min at M = 24 h, 57 min at M = 6 h, 9.1 min at M = 15 min) are its tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

SECONDS_PER_HOUR = 3600.0
# What a checkpoint holds per parameter (training.checkpoint.save_local): the fp32 master weights and
# AdamW's two fp32 moments; gradients are not saved. The program's weights are fp32 whatever --precision.
STATE_BYTES_PER_PARAM = 12
# The first estimate of a checkpoint's time, before one is measured: each node writes its ranks' shards to
# its own disk at the baseline throughput of an EBS gp3 volume (125 MiB/s, the root volume of rtui's AWS
# GPU nodes and the slowest disk a cloud GPU node is likely to write to). An assumption: the measured
# time of the first checkpoint replaces it.
ASSUMED_WRITE_BYTES_PER_S = 125 * 2**20
# The interval is said again when it moves by more than this factor (step times and checkpoint times
# are noisy: a few percent is no news).
MATERIAL_CHANGE = 1.25


def young_interval_s(checkpoint_s: float, interruptions_per_s: float) -> float:
    """Young's first-order optimum compute time between checkpoints, sqrt(2δ/λ) (inf when λ is 0)."""
    if interruptions_per_s <= 0:
        return math.inf
    return math.sqrt(2 * max(0.0, checkpoint_s) / interruptions_per_s)


def optimum_interval_s(checkpoint_s: float, interruptions_per_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints (module docstring); inf when no
    interruption is expected, 0 when a checkpoint costs nothing."""
    if interruptions_per_s <= 0:
        return math.inf
    delta, mtbf = max(0.0, checkpoint_s), 1.0 / interruptions_per_s
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return max(0.0, math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta)


def estimated_checkpoint_s(n_params: float, nodes: int) -> float:
    """The first estimate of one checkpoint's time: the training state's bytes, written by ``nodes``
    nodes in parallel at ``ASSUMED_WRITE_BYTES_PER_S`` each."""
    return n_params * STATE_BYTES_PER_PARAM / (max(1, nodes) * ASSUMED_WRITE_BYTES_PER_S)


def seconds_text(s: float) -> str:
    if s >= 2 * SECONDS_PER_HOUR:
        return f"{s / SECONDS_PER_HOUR:.1f} h"
    if s >= 120:
        return f"{s / 60:.0f} min"
    return f"{s:.2g} s" if s < 10 else f"{s:.0f} s"


def rate_text(per_hour: float) -> str:
    """An interruption rate as the plan and the program's line write it: 3 significant digits."""
    return f"{per_hour:.3g}"


@dataclass(frozen=True)
class CheckpointInterval:
    """Where the optimum lands for a job of ``job_steps`` steps of ``step_s`` seconds."""

    steps: int | None  # checkpoint every this many steps (≥ 1); None: only at the end
    interval_s: float  # the optimum compute time between checkpoints (inf: no interruption expected)
    job_steps: int
    checkpoint_s: float
    step_s: float
    per_hour: float  # the job's expected interruptions per hour

    @property
    def job_s(self) -> float:
        return self.job_steps * self.step_s

    def why(self) -> str:
        return (f"auto: {rate_text(self.per_hour)} interruptions/h, {seconds_text(self.checkpoint_s)} per checkpoint, "
                f"{seconds_text(self.step_s)} per step")

    def describe(self) -> str:
        """"checkpoint every 120 steps (auto: 0.0009 interruptions/h, 41 s per checkpoint, 3.1 s per step)"."""
        if self.steps is not None:
            every = "every step" if self.steps == 1 else f"every {self.steps} steps"
            return f"checkpoint {every} ({self.why()})"
        optimum = "no interruption is expected" if math.isinf(self.interval_s) else \
            (f"the optimum interval, {seconds_text(self.interval_s)}, is longer than the job's "
             f"{seconds_text(self.job_s)}")
        return f"checkpoint only at the end ({self.why()}: {optimum})"

    def differs_from(self, other: CheckpointInterval | None) -> bool:
        """Whether saying it again is news: end-only came or went, or the steps moved by MATERIAL_CHANGE."""
        if other is None or (self.steps is None) != (other.steps is None):
            return True
        if self.steps is None or other.steps is None:
            return False
        return max(self.steps, other.steps) / min(self.steps, other.steps) > MATERIAL_CHANGE


def choose_interval(*, checkpoint_s: float, step_s: float, interruptions_per_hour: float,
                    job_steps: int) -> CheckpointInterval:
    """The optimum (Daly) in whole steps of ``step_s`` seconds, at least 1; None (only at the end) when it
    is longer than the job's ``job_steps`` steps, or when no interruption is expected."""
    tau = optimum_interval_s(checkpoint_s, interruptions_per_hour / SECONDS_PER_HOUR)
    steps: int | None = None
    if math.isfinite(tau) and tau < job_steps * step_s:
        steps = max(1, round(tau / step_s)) if step_s > 0 else 1
        if steps >= job_steps:
            steps = None
    return CheckpointInterval(steps, tau, job_steps, checkpoint_s, step_s, interruptions_per_hour)


class AutoCheckpoints:
    """Rank 0's running decision under ``--checkpoint-every auto``: the interval from the step times and
    checkpoint times measured so far (the first checkpoint's time estimated from the state's size), said
    through ``say`` when it first is known and whenever it changes materially. Only rank 0 decides; the
    loop hands its vote to every rank (``training.loop``), so all ranks checkpoint at the same step."""

    def __init__(self, *, interruptions_per_hour: float, start_step: int, last_step: int, first_checkpoint_s: float,
                 say: Callable[[str], object] = print) -> None:
        self.per_hour = interruptions_per_hour
        self.start_step, self.last_step = start_step, last_step
        self.checkpoint_s = first_checkpoint_s
        self.last_checkpoint_step = start_step  # a resumed run starts from a complete checkpoint
        self.first_step_s: float | None = None  # the warm-up step, counted only while it is the only one
        self.later_steps_s, self.later_steps = 0.0, 0
        self.said: CheckpointInterval | None = None
        self.say = say

    def step_s(self) -> float | None:
        """The mean measured step time, without the first step (warm-up) once a later one is known."""
        if self.later_steps:
            return self.later_steps_s / self.later_steps
        return self.first_step_s

    def interval(self) -> CheckpointInterval | None:
        """Where the optimum is now (None until a step has been timed)."""
        step_s = self.step_s()
        if step_s is None:
            return None
        return choose_interval(checkpoint_s=self.checkpoint_s, step_s=step_s, interruptions_per_hour=self.per_hour,
                               job_steps=self.last_step - self.start_step)

    def due(self, step: int) -> bool:
        """Whether ``step`` should end with a checkpoint (the last step always does: the loop's rule)."""
        current = self.interval()
        if current is None:
            return False
        if current.differs_from(self.said):
            self.said = current
            self.say(f"rtui-train: {current.describe()}")
        return current.steps is not None and step - self.last_checkpoint_step >= current.steps

    def stepped(self, seconds: float) -> None:
        """A training step took ``seconds`` (checkpoint time not included)."""
        if self.first_step_s is None:
            self.first_step_s = seconds
        else:
            self.later_steps_s += seconds
            self.later_steps += 1

    def checkpointed(self, step: int, seconds: float) -> None:
        """A checkpoint of ``step`` took ``seconds`` of training time: the next estimate of δ."""
        self.last_checkpoint_step = step
        self.checkpoint_s = seconds
