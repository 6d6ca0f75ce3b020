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
from training.sharding import decoder_layers, enable_activation_checkpointing, shard_model


def for_training(model: Any) -> Any:
    """Train mode, no KV cache, and the chunked loss: what every training forward needs."""
    model.config.use_cache = False
    model.loss_function = chunked_causal_lm_loss  # transformers' PreTrainedModel.loss_function setter
    model.train()
    return model


# Elements of one fp32 logits chunk: 64 Mi (256 MiB), 441 rows of Qwen2.5's 151,936-word vocabulary.
LOSS_CHUNK_ELEMENTS = 1 << 26


def _chunk_loss_sum(logits: Any, targets: Any, ignore_index: int) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(logits.float(), targets, ignore_index=ignore_index, reduction="sum")


def chunked_causal_lm_loss(logits: Any, labels: Any, vocab_size: int, num_items_in_batch: Any = None,
                           ignore_index: int = -100, shift_labels: Any = None, **_kwargs: Any) -> Any:
    """transformers' ``ForCausalLMLoss`` (loss/loss_utils.py: shift, sum over the loss tokens divided by
    ``num_items_in_batch``, else their mean) without its ``logits.float()`` of every token: for Qwen2.5
    that is 151,936 × 4 bytes per token (4.9 GB for 8k tokens) beside the bf16 logits. Here the rows
    go through cross-entropy in chunks of ``LOSS_CHUNK_ELEMENTS``, each upcast inside an activation
    checkpoint, so backward recomputes one chunk's fp32 softmax at a time instead of keeping them all.
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    if shift_labels is None:  # position t predicts token t + 1; the last position predicts nothing
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    flat = logits.reshape(-1, vocab_size)
    targets = shift_labels.reshape(-1).to(flat.device)
    rows = max(1, LOSS_CHUNK_ELEMENTS // vocab_size)
    total = torch.zeros((), dtype=torch.float32, device=flat.device)
    for piece, target in zip(flat.split(rows), targets.split(rows), strict=True):
        total = total + checkpoint(_chunk_loss_sum, piece, target, ignore_index, use_reentrant=False)
    if num_items_in_batch is None:
        return total / (targets != ignore_index).sum().clamp(min=1)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def load_pretrained(model_id: str, revision: str | None = None) -> Any:
    """A causal LM from a hub id (at ``revision``, the commit the plan showed) or a local Hugging Face
    directory, of the class its ``config.json`` names (``AutoModelForCausalLM``), with fp32 master
    weights whatever dtype it was saved in, in training mode. A model without a decoder layer list
    is refused here (``UnsupportedModel``), before any weight is sharded."""
    import torch
    from transformers import AutoModelForCausalLM

    # transformers' own default is "main"; a local directory has no revision and ignores it.
    model = AutoModelForCausalLM.from_pretrained(model_id, revision=revision or "main", dtype=torch.float32)
    decoder_layers(model)
    return for_training(model)


def prepare_model(model: Any, *, device: Any, mesh: Any, precision: str, reduce_dtype: str,
                  reshard_after_forward: bool, activation_checkpointing: bool, compile_layers: bool) -> Any:
    """Checkpointing, FSDP2 sharding and compile, in the order they compose.

    The model comes in on the host and is never moved to ``device`` whole: ``fully_shard`` moves the
    parameters and buffers of the module it manages to its mesh's device and shards them there
    (torch/distributed/fsdp/_fully_shard/_fsdp_init.py ``_move_states_to_device``), so each decoder
    layer reaches the GPU alone and leaves only its shard; the root's own tensors (embeddings, final
    norm, lm_head) follow last. Moving the whole fp32 model first held 4 bytes per parameter on
    every GPU at once (~30 GB for a 7B model) before any of it was sharded.
    """
    del device  # the mesh carries it
    for_training(model)
    if activation_checkpointing:
        enable_activation_checkpointing(model)
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


IGNORE_INDEX = -100  # transformers' and torch's cross-entropy skip this label


def ids_and_labels(batch: Any, device: Any) -> tuple[Any, Any]:
    """(input_ids, labels) on the device: a bare tensor of ids trains on every token (labels = ids);
    a ``{"input_ids", "labels"}`` batch (``training.data``) carries -100 where nothing is learnt."""
    if isinstance(batch, dict):
        ids = batch["input_ids"].to(device, non_blocking=True)
        labels = batch.get("labels")
        return ids, ids if labels is None else labels.to(device, non_blocking=True)
    ids = batch.to(device, non_blocking=True)
    return ids, ids


def loss_denominator(labels: list[Any], device: Any) -> Any:
    """What each rank divides its summed token losses by so that the step's loss is the mean over
    every loss token of every micro-batch of every rank (not a mean of per-batch means, which weighs a
    batch of three answer tokens like one of three hundred).

    FSDP2 averages the gradients over the ranks (its reduce-scatter divides by the world size), so a
    rank divides by the global count over the world size. The count crosses ranks in one small
    all-reduce per step, on every kind of data: deciding from the data whether it is needed could
    decide differently on two ranks and hang the group.
    """
    import torch
    import torch.distributed as dist

    local = torch.zeros((), dtype=torch.float32, device=device)
    for lab in labels:
        local += (lab[:, 1:] != IGNORE_INDEX).sum()  # the labels are shifted: position 0 is never predicted
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local.clamp(min=1)
    total = local.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return (total / dist.get_world_size()).clamp(min=1)


@dataclass
class StepOutput:
    loss_sum: Any  # 0-d tensor: this rank's token losses over the step's denominator (the sum over ranks / world
    # is the step's mean loss per loss token; not synchronised)
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
    t0 = time.perf_counter()
    # The step's micro-batches first: the loss divides by the loss tokens of the whole step.
    micro_batches = [ids_and_labels(next_batch(), device) for _ in range(grad_accum)]
    t.data_wait_s += time.perf_counter() - t0
    denominator = loss_denominator([labels for _, labels in micro_batches], device)
    for micro, (ids, labels) in enumerate(micro_batches):
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
        # transformers' causal-LM loss with num_items_in_batch is the *sum* of the token losses
        # divided by it (loss/loss_utils.py fixed_cross_entropy), not a mean per micro-batch.
        loss = model(input_ids=ids, labels=labels, num_items_in_batch=denominator).loss
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
