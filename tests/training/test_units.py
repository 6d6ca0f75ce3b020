"""The training program's arithmetic and pieces, without Ray: step shape, memory, MFU, devices, data, resume."""

from __future__ import annotations

import functools
import json
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import Metadata

from tests.training.fixtures_data import build_tokenizer
from training import checkpoint as ckpt
from training.config import TrainConfig
from training.data import SyntheticTokens, TokenizeAndPack, data_format
from training.devices import (
    GPU_PEAK_BF16_FLOPS,
    meminfo_available_bytes,
    mfu,
    peak_for_name,
    training_flops_per_token,
)
from training.loop import lr_at
from training.metrics import RunFacts, StepTimings, metric_record
from training.protocol import METRIC_KEYS
from training.sharding import mesh_shape, shard_groups_span_nodes
from training.stepplan import (
    GIB,
    FitCheck,
    MemoryEstimate,
    ModelShape,
    StepPlanError,
    estimate_memory,
    plan_step,
)
from training.train import parse_args

# Qwen2.5-1.5B's shape (config.json): 28 layers, hidden 1536, intermediate 8960, vocab 151936, 1.54e9 params.
QWEN_1_5B = ModelShape(n_params=1_543_714_304, n_layers=28, hidden=1536, intermediate=8960, vocab=151936)


# -- tokens per step ------------------------------------------------------------------------------

def test_tokens_per_step_sets_gradient_accumulation() -> None:
    plan = plan_step(tokens_per_step=65536, seq_len=512, world=8, micro_batch=4)
    assert (plan.micro_batch, plan.grad_accum) == (4, 4)  # 65536 / (512 × 8) = 16 sequences per rank
    assert plan.tokens_per_step == 65536


def test_zero_tokens_per_step_is_one_micro_batch() -> None:
    plan = plan_step(tokens_per_step=0, seq_len=128, world=8, micro_batch=1)
    assert plan.grad_accum == 1 and plan.tokens_per_step == 1024


def test_tokens_per_step_not_a_multiple_of_seq_times_world_is_refused() -> None:
    with pytest.raises(StepPlanError, match=r"not a multiple of seq_len × workers = 128 × 8 = 1024; try 4096 or 5120"):
        plan_step(tokens_per_step=5000, seq_len=128, world=8, micro_batch=1)


def test_micro_batch_must_divide_the_per_rank_sequences() -> None:
    with pytest.raises(StepPlanError, match="gives 6 sequences per rank.*--batch-size 4"):
        plan_step(tokens_per_step=6 * 128 * 2, seq_len=128, world=2, micro_batch=4)


def _fits_below(limit_mb: int) -> Callable[[int], tuple[MemoryEstimate, bool]]:
    def fits(mb: int) -> tuple[MemoryEstimate, bool]:
        estimate = estimate_memory(QWEN_1_5B, micro_batch=mb, seq_len=512, shard_size=4, compute_bytes=2,
                                   reshard_after_forward=True, activation_checkpointing=False)
        return estimate, mb <= limit_mb
    return fits


def test_auto_micro_batch_is_the_largest_divisor_that_fits() -> None:
    plan = plan_step(tokens_per_step=12 * 512 * 8, seq_len=512, world=8, micro_batch=None, fits=_fits_below(5))
    assert (plan.micro_batch, plan.grad_accum) == (4, 3)  # divisors of 12: 12, 6, 4 ... 6 > 5
    assert plan.memory is not None


def test_auto_micro_batch_fails_when_even_one_sequence_does_not_fit() -> None:
    with pytest.raises(StepPlanError, match="micro-batch 1 × seq 512 needs an estimated"):
        plan_step(tokens_per_step=4 * 512 * 8, seq_len=512, world=8, micro_batch=None, fits=_fits_below(0))


def test_parse_args_refuses_impossible_shapes_before_ray_starts() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--tokens-per-step", "1000", "--seq-len", "128", "--num-workers", "2"])
    with pytest.raises(SystemExit):
        parse_args(["--batch-size", "auto"])
    with pytest.raises(SystemExit):
        parse_args(["--shard", "full", "--shard-size", "2"])
    with pytest.raises(SystemExit):
        parse_args(["--data", "corpus.jsonl"])  # no tokenizer and no model id
    args = parse_args(["--tokens-per-step", "4096", "--seq-len", "128", "--num-workers", "2", "--batch-size", "auto"])
    assert args.batch_size is None and args.tokens_per_step == 4096


# -- memory -----------------------------------------------------------------------------------------

def test_memory_estimate_of_qwen_1_5b_on_l4s_by_hand() -> None:
    est = estimate_memory(QWEN_1_5B, micro_batch=1, seq_len=128, shard_size=8, compute_bytes=2,
                          reshard_after_forward=True, activation_checkpointing=False)
    assert est.sharded_state == 16 * QWEN_1_5B.n_params // 8  # ≈ 2.9 GiB: fp32 param+grad+2 Adam moments
    layer = 4 * 1536**2 + 3 * 1536 * 8960
    assert est.gathered_params == (2 * layer + QWEN_1_5B.n_params - 28 * layer) * 2
    assert est.activations == 28 * 128 * (15 * 1536 + 6 * 8960) * 2 // 2
    assert est.logits == 128 * 151936 * 10
    assert 3 * GIB < est.total < 4 * GIB


def test_memory_estimate_moves_the_right_way() -> None:
    base = {"seq_len": 512, "compute_bytes": 2}
    small = estimate_memory(QWEN_1_5B, micro_batch=1, shard_size=8, reshard_after_forward=True,
                            activation_checkpointing=False, **base)
    assert estimate_memory(QWEN_1_5B, micro_batch=4, shard_size=8, reshard_after_forward=True,
                           activation_checkpointing=False, **base).total > small.total
    assert estimate_memory(QWEN_1_5B, micro_batch=1, shard_size=4, reshard_after_forward=True,
                           activation_checkpointing=False, **base).sharded_state == 2 * small.sharded_state
    assert estimate_memory(QWEN_1_5B, micro_batch=1, shard_size=8, reshard_after_forward=False,
                           activation_checkpointing=False, **base).gathered_params > small.gathered_params
    assert estimate_memory(QWEN_1_5B, micro_batch=1, shard_size=8, reshard_after_forward=True,
                           activation_checkpointing=True, **base).activations < small.activations / 5


def test_fit_check_against_a_budget() -> None:
    check = functools.partial(FitCheck, QWEN_1_5B, seq_len=512, shard_size=4, compute_bytes=2,
                              reshard_after_forward=True, activation_checkpointing=False, budget_source="test")
    _est, fits = check(budget_bytes=22 * GIB)(1)
    assert fits
    est, fits = check(budget_bytes=6 * GIB)(8)
    assert not fits and est.total > 6 * GIB * 0.85
    assert check(budget_bytes=None)(64)[1]  # unknown budget


def test_meminfo_parsing() -> None:
    text = "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n"
    assert meminfo_available_bytes(text) == 20000000 * 1024
    assert meminfo_available_bytes("MemTotal: 5 kB\n") is None
    assert (meminfo_available_bytes() or 0) > 0  # this Linux machine has a /proc/meminfo


# -- devices and MFU -------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "tflops"), [
    ("NVIDIA L4", 121), ("NVIDIA A10G", 70), ("NVIDIA L40S", 362), ("NVIDIA A100-SXM4-80GB", 312),
    ("NVIDIA A100 80GB PCIe", 312), ("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756),
    ("NVIDIA H200", 989),
])
def test_device_table(name: str, tflops: int) -> None:
    peak = peak_for_name(name)
    assert peak.flops == tflops * 1e12 and peak.reason is None


def test_unknown_and_cpu_devices_have_no_peak_but_a_reason() -> None:
    assert peak_for_name("cpu").flops is None and "CPU" in (peak_for_name("cpu").reason or "")
    assert peak_for_name("NVIDIA T4").flops is None and "T4" in (peak_for_name("NVIDIA T4").reason or "")
    assert set(GPU_PEAK_BF16_FLOPS) == {"L4", "A10G", "L40S", "A100", "H100", "H200"}


def test_mfu_arithmetic() -> None:
    # 6 × 1.5e9 × 10 000 tokens/s = 9e13 FLOP/s over 8 × 121e12 → 9.3 %.
    assert mfu(6 * 1.5e9, 10_000, 121e12, 8) == pytest.approx(9e13 / 968e12)
    assert mfu(6 * 1.5e9, 10_000, None, 8) is None
    assert mfu(6 * 1.5e9, 0, 121e12, 8) is None
    # Qwen2.5-1.5B at seq 2048: attention adds 12 · 28 · 1536 · 2048 FLOPs per token, ~11 % of 6·N.
    n = 1_543_714_304
    with_attention = training_flops_per_token(n, 28, 1536, 2048)
    assert with_attention - 6 * n == 12 * 28 * 1536 * 2048
    assert 0.10 < with_attention / (6 * n) - 1 < 0.12


def test_metric_record_keeps_the_old_keys_and_splits_the_step() -> None:
    facts = RunFacts(n_params=1_000_000, world=2, micro_batch=4, seq_len=32, grad_accum=3, device_name="NVIDIA L4",
                     peak_flops=121e12, peak_reason=None)
    timings = StepTimings(data_wait_s=0.01, micro_s=[0.1, 0.1, 0.25], optimizer_s=0.05, loss_sync_wait_s=0.02)
    rec = metric_record(facts, step=3, loss=2.5, step_time_s=0.55, timings=timings, peak_mem_bytes=GIB,
                        mem_kind="cuda_max_allocated", lr=1e-3, grad_norm=0.7)
    assert set(METRIC_KEYS) | {"params", "tokens_per_s_per_worker"} <= set(rec)
    assert rec["tokens_per_step"] == 4 * 32 * 2 * 3 and rec["tokens_per_s"] == pytest.approx(768 / 0.55, abs=0.01)
    assert rec["grad_sync_s"] == pytest.approx(0.15) and rec["comm_wait_s"] == pytest.approx(0.17)
    assert rec["compute_s"] == pytest.approx(0.55 - 0.01 - 0.17)
    assert rec["mfu"] == pytest.approx(6e6 * (768 / 0.55) / (2 * 121e12), rel=1e-3)
    assert rec["peak_mem_gib"] == 1.0
    no_accum = StepTimings(micro_s=[0.2])
    assert no_accum.grad_sync_s is None


def test_lr_schedule_is_a_function_of_the_step() -> None:
    cfg = TrainConfig(lr=1e-3, warmup_steps=4, steps=24, lr_schedule="cosine")
    assert lr_at(2, cfg) == pytest.approx(5e-4)
    assert lr_at(4, cfg) == pytest.approx(1e-3)
    assert lr_at(24, cfg) == pytest.approx(1e-4)
    assert lr_at(10, cfg.replace(lr_schedule="constant")) == 1e-3


# -- sharding, data ---------------------------------------------------------------------------------

def test_mesh_shapes() -> None:
    assert mesh_shape("full", 8, 0) == (1, 8)
    assert mesh_shape("hybrid", 8, 4) == (2, 4)
    assert mesh_shape("hybrid", 2, 1) == (2, 1)
    with pytest.raises(ValueError):
        mesh_shape("hybrid", 8, 3)
    assert shard_groups_span_nodes(["a", "a", "b", "b"], 2) == []
    assert shard_groups_span_nodes(["a", "b", "a", "b"], 2) == [0, 2]


def test_cycle_tokens_are_learnable_and_resumable() -> None:
    src = SyntheticTokens("cycle", 1024, 2, 20, seed=0, rank=0)
    batch = src.next_batch()
    assert batch.shape == (2, 20) and len(set(batch.flatten().tolist())) <= 8
    # The successor of every token is fixed: that is what makes the pattern learnable.
    succ: dict[int, int] = {}
    for row in batch.tolist():
        for a, b in zip(row, row[1:], strict=False):
            assert succ.setdefault(a, b) == b
    state = src.state()
    expected = src.next_batch()
    other = SyntheticTokens("cycle", 1024, 2, 20, seed=0, rank=0)
    other.load_state(state)
    assert other.next_batch().equal(expected)
    assert not SyntheticTokens("cycle", 1024, 2, 20, seed=0, rank=1).next_batch().equal(batch)


def test_tokenize_and_pack_carries_the_tail(tmp_path: Path) -> None:
    tok = build_tokenizer(tmp_path / "tok")
    pack = TokenizeAndPack(str(tok), "text", seq_len=4)
    first = pack({"text": ["the quick brown fox jumps"]})  # 5 words + eos = 6 ids: one row, 2 carried
    assert first["input_ids"].shape == (1, 4) and len(pack.tail) == 2
    second = pack({"text": ["over the"]})  # 2 carried + 2 + eos = 5: one row, 1 carried
    assert second["input_ids"].shape == (1, 4) and len(pack.tail) == 1
    eos = pack.tokenizer.eos_token_id
    assert first["input_ids"][0].tolist()[:3] == pack.tokenizer("the quick brown")["input_ids"]
    assert second["input_ids"][0].tolist()[0:2] == [pack.tokenizer("jumps")["input_ids"][0], eos]


def test_data_format_from_names(tmp_path: Path) -> None:
    assert data_format("s3://bucket/x.parquet") == "parquet"
    assert data_format("/data/a.jsonl") == "json"
    (tmp_path / "part-0.parquet").write_bytes(b"")
    assert data_format(str(tmp_path)) == "parquet"
    with pytest.raises(ValueError):
        data_format(str(tmp_path / "missing-dir"))


# -- finding checkpoints ----------------------------------------------------------------------------

def _fake_checkpoint(run: Path, step: int, world: int = 2, complete: bool = True) -> Path:
    """Files shaped like a real checkpoint's (resolving one reads its metadata and rank states the safe way)."""
    d = run / ckpt.checkpoint_dir_name(step)
    d.mkdir(parents=True)
    (d / ckpt.MARKER).write_text(json.dumps({"step": step, "world_size": world}))
    (d / ckpt.DCP_METADATA).write_bytes(pickle.dumps(Metadata(state_dict_metadata={}, storage_data={})))
    for r in range(world if complete else world - 1):
        torch.save({"data": {"epoch": 0, "taken": 0}, "torch_rng": torch.get_rng_state()}, d / ckpt.rank_state_file(r))
    return d


def test_resume_finds_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _fake_checkpoint(store / "run-a", 10)
    newest = _fake_checkpoint(store / "run-b", 20)
    _fake_checkpoint(store / "run-b", 30, complete=False)  # a crash mid-upload: not a checkpoint
    assert [s for s, _ in ckpt.find_checkpoints(str(store))] == [10, 20]
    assert ckpt.resolve_resume("latest", str(store)) == str(newest)
    assert str(ckpt.resolve_resume(str(store / "run-a"), str(store))).endswith("checkpoint_step_00000010")
    assert ckpt.resolve_resume(str(newest), "unused") == str(newest)
    assert ckpt.resolve_resume("latest", str(tmp_path / "empty")) is None  # a fresh start
    with pytest.raises(FileNotFoundError, match="no complete rtui checkpoint"):
        ckpt.resolve_resume(str(tmp_path / "nowhere"), str(store))


def test_accumulation_keeps_unsharded_grads_in_the_estimate() -> None:
    estimate = functools.partial(estimate_memory, QWEN_1_5B, micro_batch=2, seq_len=512, shard_size=4,
                                 compute_bytes=2, reshard_after_forward=False, activation_checkpointing=False)
    assert estimate(grad_accum=1).accumulated_grads == 0
    with_accum = estimate(grad_accum=16, grad_accum_bytes=2)
    assert with_accum.accumulated_grads == 2 * QWEN_1_5B.n_params
    # docs/perf-model.md's recommended L4 step: 15.0 GiB; micro-batch 4 (18.5 GiB) does not fit 85 % of 21 GiB.
    assert round(with_accum.total / GIB, 1) == 15.0
    check = FitCheck(QWEN_1_5B, seq_len=512, shard_size=4, compute_bytes=2, reshard_after_forward=False,
                     activation_checkpointing=False, budget_bytes=21 * GIB, budget_source="L4", grad_accum_bytes=2,
                     sequences_per_rank=32)
    plan = plan_step(tokens_per_step=131072, seq_len=512, world=8, micro_batch=None, fits=check)
    assert (plan.micro_batch, plan.grad_accum) == (2, 16)


def test_one_peak_table_and_mfu_with_attention_for_job_and_dashboard() -> None:
    from backend.telemetry import estimate_mfu, peak_flops_for

    for name in ("NVIDIA A10G", "NVIDIA L4", "NVIDIA L40S", "NVIDIA H100 80GB HBM3", "NVIDIA H200", "Quadro K600"):
        assert peak_flops_for(name) == peak_for_name(name).flops, name
    facts = RunFacts(n_params=1_543_714_304, world=8, micro_batch=1, seq_len=2048, grad_accum=1,
                     device_name="NVIDIA L4", peak_flops=121e12, peak_reason=None,
                     flops_per_token=training_flops_per_token(1_543_714_304, 28, 1536, 2048))
    rec = metric_record(facts, step=1, loss=2.0, step_time_s=1.0, timings=StepTimings(micro_s=[0.9]),
                        peak_mem_bytes=GIB, mem_kind="cuda_max_allocated", lr=1e-5, grad_norm=None)
    assert rec["flops_per_token"] == round(facts.flops_per_token)
    job_mfu = rec["mfu"]
    assert job_mfu == pytest.approx(facts.flops_per_token * 2048 * 8 / (8 * 121e12), rel=1e-3)
    # The dashboard's figure from the same record agrees with the job's (attention term included).
    dash = estimate_mfu(rec["tokens_per_s"], rec["params"], peak_flops_for("NVIDIA L4"), 8, rec["flops_per_token"])
    assert dash == pytest.approx(job_mfu, rel=1e-3)
