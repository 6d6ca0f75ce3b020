"""Per-step timings and the tagged metric/summary records rank 0 prints.

Step time is split into what the host can measure honestly without profiler hooks:

* ``data_wait_s``: waiting for the next micro-batch (generation or the Ray Data iterator).
* ``fwd_bwd_s``: forward + backward of every micro-step. It *includes* FSDP's parameter
  all-gathers that compute did not hide, and the final micro-step's gradient reduce-scatter.
* ``grad_sync_s``: the final (gradient-synchronising) micro-step's extra time over the mean of
  the non-final ones, which run with ``set_requires_gradient_sync(False)`` and so do the same
  compute without the reduce-scatter/all-reduce. An estimate of exposed gradient communication;
  null when there is no accumulation (nothing to compare with).
* ``optimizer_s``: gradient clipping (one small all-reduce of the norm) + AdamW step.
* ``loss_sync_wait_s``: the loss all-reduce at the end of the step. It is tiny, so this is mostly
  time waiting for the slowest rank (stragglers, uneven data).
* ``comm_wait_s`` = grad_sync_s + loss_sync_wait_s: communication the step demonstrably waited
  for, a lower bound (exposed all-gathers inside fwd_bwd_s are not separable from the host).
* ``compute_s`` = step_time_s − data_wait_s − comm_wait_s: an upper bound on compute.

On CUDA the micro-step and optimizer times come from CUDA events read after the step's one
synchronisation (the loss all-reduce), so the CPU keeps queueing work ahead of the GPU; the step
time is host time up to that synchronisation, which on a GPU is when the device finished the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from training.devices import mfu
from training.protocol import EVAL_TAG, METRIC_TAG, SUMMARY_TAG, format_record

GIB = 2**30


@dataclass
class StepTimings:
    data_wait_s: float = 0.0
    micro_s: list[float] = field(default_factory=list)
    optimizer_s: float = 0.0
    loss_sync_wait_s: float = 0.0

    @property
    def fwd_bwd_s(self) -> float:
        return sum(self.micro_s)

    @property
    def grad_sync_s(self) -> float | None:
        if len(self.micro_s) < 2:
            return None
        others = self.micro_s[:-1]
        return max(0.0, self.micro_s[-1] - sum(others) / len(others))

    @property
    def comm_wait_s(self) -> float:
        return (self.grad_sync_s or 0.0) + self.loss_sync_wait_s


def _r(value: float | None, digits: int = 5) -> float | None:
    return None if value is None else round(value, digits)


def _sig(value: float | None, digits: int = 4) -> float | None:
    """Significant digits, for ratios like MFU that can be tiny (a CPU-sized model on a big GPU)."""
    return None if value is None else float(f"{value:.{digits}g}")


@dataclass(frozen=True)
class RunFacts:
    """What every record repeats: the model and step shape, the device and its peak."""

    n_params: int
    world: int
    micro_batch: int
    seq_len: int
    grad_accum: int
    device_name: str
    peak_flops: float | None
    peak_reason: str | None
    backend: str = "?"  # torch.distributed's: telemetry tells a gloo run (no NCCL) from an NCCL one by it
    flops_per_token: float = 0.0  # training_flops_per_token (6·N + attention); 0: 6·N

    @property
    def model_flops_per_token(self) -> float:
        return self.flops_per_token or 6.0 * self.n_params

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch * self.seq_len * self.world * self.grad_accum


def metric_record(facts: RunFacts, *, step: int, loss: float, step_time_s: float, timings: StepTimings,
                  peak_mem_bytes: int, mem_kind: str, lr: float, grad_norm: float | None) -> dict[str, Any]:
    tokens_per_s = facts.tokens_per_step / step_time_s
    util = mfu(facts.model_flops_per_token, tokens_per_s, facts.peak_flops, facts.world)
    record: dict[str, Any] = {
        # The keys the backend's telemetry has always read (training.protocol.METRIC_KEYS + params).
        "step": step, "loss": round(loss, 5), "tokens_per_s": round(tokens_per_s, 2),
        "tokens_per_s_per_worker": round(tokens_per_s / facts.world, 2),
        "step_time_s": round(step_time_s, 5), "world_size": facts.world, "ts": round(time.time(), 3),
        "params": facts.n_params, "flops_per_token": round(facts.model_flops_per_token),
        # Step shape.
        "tokens_per_step": facts.tokens_per_step, "micro_batch": facts.micro_batch, "seq_len": facts.seq_len,
        "grad_accum": facts.grad_accum,
        # Where the step time went (see the module docstring for what each one includes).
        "data_wait_s": _r(timings.data_wait_s), "fwd_bwd_s": _r(timings.fwd_bwd_s),
        "grad_sync_s": _r(timings.grad_sync_s), "optimizer_s": _r(timings.optimizer_s),
        "loss_sync_wait_s": _r(timings.loss_sync_wait_s), "comm_wait_s": _r(timings.comm_wait_s),
        "compute_s": _r(max(0.0, step_time_s - timings.data_wait_s - timings.comm_wait_s)),
        "peak_mem_gib": round(peak_mem_bytes / GIB, 4), "peak_mem_kind": mem_kind,
        "mfu": _sig(util), "device": facts.device_name, "backend": facts.backend, "lr": lr,
        "grad_norm": _r(grad_norm),
    }
    if util is None:
        record["mfu_reason"] = facts.peak_reason or "unknown device peak"
    return record


def print_metric(record: dict[str, Any]) -> None:
    print(format_record(METRIC_TAG, record), flush=True)


@dataclass
class RunSummary:
    start_step: int
    step_times: list[float] = field(default_factory=list)
    mfus: list[float] = field(default_factory=list)
    final_loss: float = float("nan")
    first_loss: float | None = None
    peak_mem_bytes: int = 0

    def add(self, record: dict[str, Any], step_time_s: float, peak_mem_bytes: int) -> None:
        self.step_times.append(step_time_s)
        if record.get("mfu") is not None:
            self.mfus.append(record["mfu"])
        self.final_loss = record["loss"]
        if self.first_loss is None:
            self.first_loss = record["loss"]
        self.peak_mem_bytes = max(self.peak_mem_bytes, peak_mem_bytes)

    def record(self, facts: RunFacts, steps: int) -> dict[str, Any]:
        # The first step of a run pays for lazy init (communicators, allocator, compile): skip it.
        steady = self.step_times[1:] or self.step_times
        mean = sum(steady) / len(steady) if steady else None
        return {
            "steps": steps, "start_step": self.start_step, "steps_run": len(self.step_times),
            "final_loss": None if self.final_loss != self.final_loss else round(self.final_loss, 5),
            "first_loss": self.first_loss, "world_size": facts.world, "params": facts.n_params,
            "step_time_s_mean": _r(mean),
            "tokens_per_s_mean": round(facts.tokens_per_step / mean, 2) if mean else None,
            "tokens_per_step": facts.tokens_per_step, "grad_accum": facts.grad_accum,
            "micro_batch": facts.micro_batch, "seq_len": facts.seq_len,
            "mfu_mean": _sig(sum(self.mfus[1:] or self.mfus) / len(self.mfus[1:] or self.mfus))
            if self.mfus else None,
            "peak_mem_gib": round(self.peak_mem_bytes / GIB, 4), "device": facts.device_name,
        }


def print_summary(record: dict[str, Any]) -> None:
    print(format_record(SUMMARY_TAG, record), flush=True)


def print_eval(result: dict[str, Any]) -> None:
    """One held-out evaluation: ``{"phase": "before"|"after", "step", "loss", "perplexity", "tokens"}``."""
    print(format_record(EVAL_TAG, result), flush=True)


def eval_record(evaluation: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The summary's evaluation keys: loss and perplexity before and after, and the tokens they cover."""
    before, after = evaluation.get("before") or {}, evaluation.get("after") or {}
    return {"eval_loss_before": before.get("loss"), "eval_loss_after": after.get("loss"),
            "eval_perplexity_before": before.get("perplexity"), "eval_perplexity_after": after.get("perplexity"),
            "eval_tokens": after.get("tokens", before.get("tokens"))}


def model_record(info: Any) -> dict[str, Any]:
    """The summary's ``model``: where the exported directory is and what it holds."""
    return {"uri": info.uri, "format": info.format, "step": info.step, "files": list(info.files),
            "bytes": info.bytes, "dtype": info.dtype, "export_s": info.export_s, "state_bytes": info.state_bytes}
