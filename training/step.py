"""The model as training needs it and one optimizer step on it: no Ray here.

The Ray Train loop (``training.loop``) and ``bench/gpu_step.py`` share this code, so the GPU
bench measures the step the cluster runs. Needs only torch and transformers.

What a pretrained checkpoint does not give by itself (transformers 5.x ``from_pretrained``,
torch FSDP2, read in their sources):

* ``from_pretrained`` defaults to ``dtype="auto"``: a checkpoint saved in bfloat16 (Qwen2.5's are)
  loads as bf16 parameters, so FSDP's sharded parameters, their gradients and AdamW's states would
  be bf16 and a 1e-5 update rounds away on most weights. We load in fp32 (the master weights) and
  let FSDP2's mixed-precision policy cast to bf16 for compute.
* ``from_pretrained`` returns the model in eval mode; transformers checkpoints a layer only in
  training mode, and dropout (if any) would be off. ``for_training`` sets train mode.
* ``use_cache`` comes from the model's config: in a training forward it makes every decoder layer
  receive a ``DynamicCache`` whose layer index differs per layer, and torch.compile recompiles once
  per layer until its recompile limit. Training never needs the cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from training.metrics import StepTimings
from training.sharding import enable_activation_checkpointing, shard_model


def for_training(model: Any) -> Any:
    """Train mode and no KV cache: what every training forward needs."""
    model.config.use_cache = False
    model.train()
    return model


def load_pretrained(model_id: str, revision: str | None = None) -> Any:
    """A Qwen2 causal LM from a hub id (at ``revision``, the commit the plan showed) or a local Hugging
    Face directory, with fp32 master weights whatever dtype it was saved in, in training mode."""
    import torch
    from transformers import Qwen2ForCausalLM

    # transformers' own default is "main"; a local directory has no revision and ignores it.
    model = Qwen2ForCausalLM.from_pretrained(model_id, revision=revision or "main", dtype=torch.float32)
    return for_training(model)


def prepare_model(model: Any, *, device: Any, mesh: Any, precision: str, reduce_dtype: str,
                  reshard_after_forward: bool, activation_checkpointing: bool, compile_layers: bool) -> Any:
    """Checkpointing, the device, FSDP2 sharding and compile, in the order they compose."""
    for_training(model)
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    model.to(device)
    return shard_model(model, precision, reshard_after_forward, mesh=mesh, compile_layers=compile_layers,
                       reduce_dtype=reduce_dtype)


class _Clock:
    """Marks on the device's timeline: CUDA events on a GPU (read once the step is over, so the CPU
    keeps queueing work ahead of the GPU), the host clock on CPU (where host time is device time)."""

    def __init__(self, device: Any) -> None:
        self.cuda = getattr(device, "type", "cpu") == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> int:
        if self.cuda:
            import torch

            event_type: Any = torch.cuda.Event  # unannotated in torch
            event = event_type(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())
        return len(self.marks) - 1

    def seconds(self, start: int, end: int) -> float:
        """Elapsed between two marks; on CUDA only after the work behind ``end`` has finished."""
        if self.cuda:
            return float(self.marks[start].elapsed_time(self.marks[end])) / 1000.0
        return float(self.marks[end] - self.marks[start])


@dataclass
class StepOutput:
    loss_sum: Any  # 0-d tensor on the device: the step's mean loss on this rank (not synchronised)
    grad_norm: Any  # 0-d tensor (or DTensor) of the clipped global norm, None without clipping
    timings: StepTimings
    finish: Callable[[], None]  # fills timings.micro_s / optimizer_s; call after the step's last sync


def train_step(model: Any, optimizer: Any, next_batch: Callable[[], Any], *, device: Any, grad_accum: int,
               max_grad_norm: float, reshard_after_forward: bool, sync_every_micro_step: bool) -> StepOutput:
    """Forward/backward over ``grad_accum`` micro-batches, clip, AdamW step. Never synchronises the
    device: the caller's loss all-reduce (or ``float``) is the step's one sync, then ``finish()``.

    ``sync_every_micro_step``: reduce-scatter every micro-step. FSDP2 accumulates unsharded gradients
    of non-syncing micro-steps in its reduce dtype, so with a bf16 reduce dtype skipping the sync
    would accumulate in bf16; syncing each micro-step accumulates the sharded fp32 gradients instead.
    """
    import torch

    t = StepTimings()
    clock = _Clock(device)
    micro_marks: list[tuple[int, int]] = []
    loss_sum = torch.zeros((), device=device)
    for micro in range(grad_accum):
        t0 = time.perf_counter()
        ids = next_batch().to(device, non_blocking=True)
        t.data_wait_s += time.perf_counter() - t0
        if grad_accum > 1:
            last = micro == grad_accum - 1
            # Reduce-scatter (and HSDP's all-reduce) only on the last micro-step: the others
            # accumulate unsharded local gradients without touching the network.
            model.set_requires_gradient_sync(last or sync_every_micro_step)
            if not reshard_after_forward:
                # Parameters gathered once stay gathered until the step's last backward, so an
                # optimizer step costs one all-gather however many micro-steps it has.
                model.set_reshard_after_backward(last)
        start = clock.mark()
        loss = model(input_ids=ids, labels=ids).loss / grad_accum
        loss.backward()
        loss_sum += loss.detach().float()
        micro_marks.append((start, clock.mark()))
    opt_start = clock.mark()
    grad_norm = None
    if max_grad_norm > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    opt_end = clock.mark()

    def finish() -> None:
        t.micro_s = [clock.seconds(a, b) for a, b in micro_marks]
        t.optimizer_s = clock.seconds(opt_start, opt_end)

    return StepOutput(loss_sum, grad_norm, t, finish)


def norm_value(norm: Any) -> float | None:
    """The clipped gradient norm as a float (a DTensor under FSDP2)."""
    if norm is None:
        return None
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
