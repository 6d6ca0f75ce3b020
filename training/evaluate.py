"""Evaluation on a held-out split, before the first step and after the last.

The held-out data is never trained on:

* data files: split by document, from a stable hash of each raw record before it is tokenised or
  packed (``training.sft.in_split``): one document in ``HELD_OUT_EVERY`` goes to evaluation, the
  rest to training, the same way in every epoch, on every rank and whatever order Ray Data reads the
  blocks in (a hash of the packed sequences was not: packing boundaries move with the block order).
* synthetic data: a separate generator stream (``eval_stream``) that no rank trains on. For
  ``cycle`` this is fresh samples of the same pattern (the point of that data is that it can be
  learnt), for ``random`` fresh noise (the loss cannot fall below ln(vocab)).

The loss is the mean next-token cross-entropy over the tokens training learns from, of every rank
(summed, then all-reduced): every predicted token for raw text and synthetic data, the assistant's
(completion's) tokens for chat data, as the labels say; perplexity is its exponential.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

EVAL_STREAM = 7_777_777  # the synthetic held-out generator's rank offset: no training rank uses it


def eval_stream(rank: int) -> int:
    return EVAL_STREAM + rank


def sequences_per_rank(eval_tokens: int, seq_len: int, world: int, micro_batch: int) -> int:
    """Whole micro-batches per rank so that all ranks together predict at least ``eval_tokens`` tokens
    (a sequence of ``seq_len`` ids predicts ``seq_len - 1`` of them)."""
    per_rank = math.ceil(eval_tokens / (max(1, seq_len - 1) * world))
    return math.ceil(per_rank / micro_batch) * micro_batch


def take_batches(source: Callable[[], Any] | Iterable[Any], n: int) -> list[Any]:
    """Up to ``n`` batches from a generator function or an iterable (fewer when it runs out)."""
    out: list[Any] = []
    if callable(source):
        return [source() for _ in range(n)]
    for batch in source:
        if len(out) >= n:
            break
        out.append(batch)
    return out


def evaluate(model: Any, batches: list[Any], device: Any) -> dict[str, float | int]:
    """Loss and perplexity over every rank's ``batches`` (every rank must call it, with as many batches):
    id tensors (every token predicted) or ``{"input_ids", "labels"}`` batches."""
    import torch
    import torch.distributed as dist

    from training.step import IGNORE_INDEX, ids_and_labels

    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # (loss sum, predicted tokens)
    try:
        with torch.no_grad():
            for batch in batches:
                ids, labels = ids_and_labels(batch, device)
                predicted = (labels[:, 1:] != IGNORE_INDEX).sum()
                # The sum of the token losses (transformers divides by num_items_in_batch).
                loss = model(input_ids=ids, labels=labels, num_items_in_batch=1).loss
                total[0] += loss.double()
                total[1] += predicted
    finally:
        model.train(was_training)
    if dist.is_initialized():
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    tokens = int(total[1])
    loss_value = float(total[0]) / tokens if tokens else float("nan")
    return {"loss": round(loss_value, 5), "perplexity": _perplexity(loss_value), "tokens": tokens}


def _perplexity(loss: float) -> float:
    try:
        return round(math.exp(loss), 4)
    except OverflowError:
        return float("inf")


def equal_batch_count(batches: list[Any], device: Any) -> list[Any]:
    """Every rank keeps as many batches as the rank with the fewest (FSDP's forward is collective)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return batches
    n = torch.tensor([len(batches)], device=device)
    dist.all_reduce(n, op=dist.ReduceOp.MIN)
    return batches[: int(n)]
