"""What the GPUs hold for a step (issue 36, item 4), checked on CPU with gloo and without Ray.

* No whole-model copy per device before sharding: FSDP2's ``fully_shard`` moves the states of the
  module it manages to the mesh's device itself (torch/distributed/fsdp/_fully_shard/_fsdp_init.py
  ``_move_states_to_device``), one decoder layer at a time, so the program must not ``.to(device)``
  the whole model first. On CPU the device copy cannot be measured, so the code path is: no
  ``Module.to``/``cuda``/``_apply`` of the whole model, and the shards hold the built model's weights.
* The loss never holds a float32 copy of the whole [tokens, vocab] logits: transformers'
  ``ForCausalLMLoss`` (loss/loss_utils.py) starts with ``logits.float()``; the program's loss does
  cross-entropy over row chunks, each upcast and recomputed in backward.
* The export casts each shard to the saved dtype before the all-gather, so the gather moves and
  holds bf16, not the fp32 master weights.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from training.config import TrainConfig

TINY = TrainConfig(tiny_vocab_size=256, tiny_hidden_size=32, tiny_layers=3, tiny_heads=4, seq_len=32,
                   precision="fp32")


@contextmanager
def one_rank_group() -> Iterator[None]:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_whole_model_is_never_moved_before_sharding_and_the_shards_hold_its_weights(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.fsdp import FSDPModule

    from training.loop import build_model
    from training.sharding import build_mesh, decoder_layers
    from training.step import prepare_model

    torch.manual_seed(0)
    model = build_model(TINY)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    whole_moves: list[str] = []
    for method in ("to", "cuda", "_apply"):
        original = getattr(torch.nn.Module, method)

        def spy(self: Any, *args: Any, _name: str = method, _orig: Any = original, **kwargs: Any) -> Any:
            if self is model and not whole_moves:
                whole_moves.append(_name)
            return _orig(self, *args, **kwargs)

        monkeypatch.setattr(torch.nn.Module, method, spy)
    with one_rank_group():
        sharded = prepare_model(model, device=torch.device("cpu"), mesh=build_mesh("cpu", "full", 1, 1),
                                precision="fp32", reduce_dtype="fp32", reshard_after_forward=False,
                                activation_checkpointing=False, compile_layers=False)
        monkeypatch.undo()
        assert whole_moves == [], f"the whole model went through Module.{whole_moves[0]} before sharding"
        assert isinstance(sharded, FSDPModule) and all(isinstance(m, FSDPModule) for m in decoder_layers(sharded))
        after = {name: cast(Any, p).full_tensor() for name, p in cast(torch.nn.Module, sharded).named_parameters()}
    assert after.keys() == before.keys()
    assert all(torch.equal(after[n], before[n]) for n in before)


@contextmanager
def fp32_allocations(min_numel: int) -> Iterator[list[tuple[int, ...]]]:
    """Shapes of every float32 tensor of at least ``min_numel`` elements an op produces in the block
    (forward and backward)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    seen: list[tuple[int, ...]] = []

    class Record(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel() >= min_numel:
                    seen.append(tuple(t.shape))
            return out

    with Record():  # type: ignore[no-untyped-call]
        yield seen


def _bf16_model() -> Any:
    from training.loop import build_model

    torch.manual_seed(0)
    model = build_model(TINY)
    torch.nn.Module.to(model, torch.bfloat16)  # what FSDP's bf16 compute gives the lm_head
    return model


def test_the_loss_never_holds_fp32_logits_of_every_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from training import step

    monkeypatch.setattr(step, "LOSS_CHUNK_ELEMENTS", 16 * 256)  # 16 rows of the 256-word vocabulary
    model = _bf16_model()
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    tokens, vocab = ids.numel(), model.config.vocab_size
    with fp32_allocations(tokens * vocab // 2) as seen:
        loss = model(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(62.0)).loss
        loss.backward()
    assert seen == [], f"fp32 tensors of {seen} exist (the whole logits are {tokens}x{vocab})"


@pytest.mark.parametrize("labels_kind", ["all", "masked"])
def test_the_chunked_loss_equals_transformers_loss_and_gradients(monkeypatch: pytest.MonkeyPatch,
                                                                  labels_kind: str) -> None:
    from transformers.loss.loss_utils import ForCausalLMLoss

    from training import step
    from training.loop import build_model

    monkeypatch.setattr(step, "LOSS_CHUNK_ELEMENTS", 7 * 256)  # chunks that do not divide the rows
    ids = torch.randint(0, 256, (3, 32), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    if labels_kind == "masked":
        labels[:, :20] = step.IGNORE_INDEX
    results = []
    for loss_function in (ForCausalLMLoss, None):
        torch.manual_seed(0)
        model = build_model(TINY)
        if loss_function is not None:
            model.loss_function = loss_function
        for denominator in (None, torch.tensor(41.0)):
            model.zero_grad()
            loss = model(input_ids=ids, labels=labels, num_items_in_batch=denominator).loss
            loss.backward()
            results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    for reference, chunked in ((results[0], results[2]), (results[1], results[3])):
        assert torch.allclose(reference[0], chunked[0], atol=1e-6, rtol=1e-5)
        for name, grad in reference[1].items():
            assert torch.allclose(grad, chunked[1][name], atol=1e-7, rtol=1e-4), name


def test_the_export_gathers_shards_already_cast_to_the_saved_dtype(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor

    from training.export import export_model
    from training.loop import build_model
    from training.sharding import build_mesh, shard_model

    gathered: list[torch.dtype] = []
    original = DTensor.full_tensor

    def spy(self: DTensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        gathered.append(self.dtype)
        return original(self, *args, **kwargs)

    with one_rank_group():
        torch.manual_seed(0)
        model = shard_model(build_model(TINY), "bf16", reshard_after_forward=False,
                            mesh=build_mesh("cpu", "full", 1, 1))
        master = {n: p.full_tensor().to(torch.bfloat16) for n, p in model.named_parameters()}
        monkeypatch.setattr(DTensor, "full_tensor", spy)
        info = export_model(model, str(tmp_path), rank=0, step=1, final=True, dtype=torch.bfloat16)
    assert info is not None and gathered and set(gathered) == {torch.bfloat16}, set(gathered)
    with safe_open(os.path.join(info.uri, "model.safetensors"), "pt") as f:
        names = list(f.keys())  # noqa: SIM118 (a safe_open handle is not iterable)
        assert all(torch.equal(f.get_tensor(n), master[n]) for n in names)
