"""Fine-tuning a pretrained checkpoint: a tiny Qwen2 saved in bf16 (like Qwen2.5 on the hub), loaded
by the training program's real ``--model-id DIR`` path and trained with the production step code
(``training.loop`` / ``training.step``) under FSDP2 on a gloo world of one, in this process."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import gloo
from tests.training.fixtures_model import LAYERS, save_tiny_qwen2
from training import checkpoint as ckpt
from training import loop, train
from training.config import TrainConfig
from training.data import SyntheticTokens
from training.sharding import build_mesh
from training.step import train_step

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2-bf16"), torch.bfloat16)


@pytest.fixture(scope="module", autouse=True)
def world_of_one() -> Iterator[None]:
    with gloo.world_of_one():
        yield


def config(model_dir: Path, *extra: str) -> TrainConfig:
    """The job's own command line, parsed by the program's own parser."""
    return train.parse_args(["--model-id", str(model_dir), "--device", "cpu", "--num-workers", "1",
                             "--precision", "bf16", "--seq-len", "32", "--batch-size", "2", "--data", "cycle",
                             *extra])


def build(cfg: TrainConfig, reshard: bool = True) -> tuple[Any, Any]:
    torch.manual_seed(cfg.seed)
    model = loop.build_model(cfg)
    return loop.prepare_for_training(model, cfg, CPU, build_mesh("cpu", "full", 1, 1), reshard)


def run_steps(model: Any, optimizer: Any, cfg: TrainConfig, data: SyntheticTokens, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        out = train_step(model, optimizer, data.next_batch, device=CPU, grad_accum=1, max_grad_norm=cfg.max_grad_norm,
                         reshard_after_forward=True, sync_every_micro_step=loop.syncs_every_micro_step(cfg))
        losses.append(float(out.loss_sum))
        out.finish()
    return losses


def local(param: Any) -> torch.Tensor:
    full: torch.Tensor = param.to_local() if hasattr(param, "to_local") else param
    return full


def test_bf16_checkpoint_trains_fp32_master_weights_in_train_mode(bf16_dir: Path) -> None:
    cfg = config(bf16_dir, "--lr", "1e-5")
    model, optimizer = build(cfg)
    assert model.training, "from_pretrained returns eval mode; the program must train in train mode"
    assert model.config.use_cache is False
    assert {local(p).dtype for p in model.parameters()} == {torch.float32}
    grad_dtypes: set[torch.dtype] = set()
    optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grad_dtypes.update(local(p.grad).dtype for p in model.parameters()))
    before = [local(p).detach().clone() for p in model.parameters()]
    run_steps(model, optimizer, cfg, SyntheticTokens("cycle", 256, 2, 32, 0, 0), 2)
    assert grad_dtypes == {torch.float32}
    states = {v.dtype for s in optimizer.state.values() for v in s.values() if v.dim() > 0}
    assert states == {torch.float32}
    moved = sum(int((local(p).detach() != b).sum()) for p, b in zip(model.parameters(), before, strict=True))
    total = sum(b.numel() for b in before)
    # lr 1e-5 on std-0.02 weights: every weight moves in fp32; in bf16 most updates round away.
    assert moved / total > 0.99, f"only {moved / total:.1%} of the weights moved"


def test_activation_checkpointing_recomputes_every_layer(bf16_dir: Path) -> None:
    cfg = config(bf16_dir, "--activation-checkpointing")
    model, optimizer = build(cfg)
    calls = []
    for layer in model.model.layers:
        inner = layer._gradient_checkpointing_func

        @functools.wraps(inner)
        def counted(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            calls.append(1)
            return _inner(*args, **kwargs)

        layer._gradient_checkpointing_func = counted
    run_steps(model, optimizer, cfg, SyntheticTokens("cycle", 256, 2, 32, 0, 0), 2)
    assert len(calls) == 2 * LAYERS


def test_root_stays_gathered_between_forward_and_backward(bf16_dir: Path) -> None:
    model, _ = build(config(bf16_dir), reshard=True)
    root = model._get_fsdp_state()._fsdp_param_group
    layer = model.model.layers[0]._get_fsdp_state()._fsdp_param_group
    assert layer.post_forward_mesh_info is not None  # the layers free their gathered weights after forward
    assert root.post_forward_mesh_info is None  # the root (tied embedding / lm_head) does not


@pytest.mark.slow
def test_compiled_layers_do_not_hit_the_recompile_limit(bf16_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    # Dynamo's guards and recompiles do not depend on the backend; aot_eager skips the C++ build.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)  # fewer than the layers
    monkeypatch.setattr(torch._dynamo.config, "fail_on_recompile_limit_hit", True)
    torch._dynamo.reset()
    counters.clear()
    cfg = config(bf16_dir, "--compile", "--lr", "1e-3")
    model, optimizer = build(cfg)
    try:
        losses = run_steps(model, optimizer, cfg, SyntheticTokens("cycle", 256, 2, 32, 0, 0), 3)
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert 1 <= graphs <= 2, f"{graphs} graphs for {LAYERS} identical layers"
    assert losses[-1] < losses[0]


def test_loss_falls_and_resume_continues_the_same_curve(bf16_dir: Path, tmp_path: Path) -> None:
    cfg = config(bf16_dir, "--lr", "1e-3")
    model, optimizer = build(cfg)
    data = SyntheticTokens("cycle", 256, 2, 32, cfg.seed, 0)
    straight = run_steps(model, optimizer, cfg, data, 8)
    assert straight[-1] < straight[0] - 0.5, straight

    model, optimizer = build(cfg)
    data = SyntheticTokens("cycle", 256, 2, 32, cfg.seed, 0)
    first = run_steps(model, optimizer, cfg, data, 4)
    meta = ckpt.CheckpointMeta(step=4, world_size=1, tokens_seen=4 * 64, data="cycle")
    saved = ckpt.save_local(model, optimizer, 0, {"data": data.state(), "torch_rng": torch.get_rng_state()}, meta)
    ckpt.mark_complete(saved, meta)  # as rank 0 does once every rank's part is in (the marker comes last)
    try:
        model, optimizer = build(cfg)  # a new process would load the checkpoint into a fresh model
        data = SyntheticTokens("cycle", 256, 2, 32, cfg.seed, 0)
        restored = ckpt.load(saved, model, optimizer, 0)
        assert restored.rank_state is not None
        data.load_state(restored.rank_state["data"])
        second = run_steps(model, optimizer, cfg, data, 4)
    finally:
        ckpt.discard_local(saved)
    assert first + second == pytest.approx(straight, rel=1e-4)


def test_reduce_in_bf16_accumulates_gradients_in_fp32(bf16_dir: Path) -> None:
    """Two micro-steps with --reduce-dtype bf16 give the fp32 sum of the two micro-steps' reduced
    gradients, not a bf16 sum (FSDP2 accumulates skipped reductions in the reduce dtype)."""
    cfg = config(bf16_dir, "--reduce-dtype", "bf16", "--max-grad-norm", "0", "--tokens-per-step", "128",
                 "--batch-size", "2")
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 256, (2, 32), generator=gen) for _ in range(2)]

    def grads(accum: int, chosen: list[torch.Tensor]) -> list[torch.Tensor]:
        model, optimizer = build(cfg)
        seen: list[torch.Tensor] = []
        optimizer.register_step_pre_hook(
            lambda opt, args, kwargs: seen.extend(local(p.grad).detach().clone() for p in model.parameters()))
        feed = iter(chosen)
        out = train_step(model, optimizer, lambda: next(feed), device=CPU, grad_accum=accum, max_grad_norm=0,
                         reshard_after_forward=True, sync_every_micro_step=loop.syncs_every_micro_step(cfg))
        out.finish()
        return seen

    first, second = grads(1, batches[:1]), grads(1, batches[1:])
    both = grads(2, batches)
    assert {g.dtype for g in both} == {torch.float32}
    for g, a, b in zip(both, first, second, strict=True):
        # Each micro-step's loss is halved, and halving is exact in bf16 and fp32 alike.
        torch.testing.assert_close(g, (a + b) / 2, rtol=1e-6, atol=1e-9)
