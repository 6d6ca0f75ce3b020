"""The real program under Ray Train: 2 workers on gloo, FSDP2 full and hybrid, Ray Data, checkpoint → resume.

One Ray cluster for the module (each Ray start costs ~10 s); each run is ``python -m training.train``
attached to it, so its stdout is exactly what a job log holds.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backend.telemetry import Telemetry
from tests.conftest import REPO
from tests.training.fixtures_data import build_tokenizer, write_jsonl, write_parquet
from tests.training.ray_cluster import WORKER_ENV
from training import checkpoint as ckpt
from training.protocol import METRIC_TAG, SUMMARY_TAG, parse_record

pytestmark = pytest.mark.ray

TINY = ["--num-workers", "2", "--device", "cpu", "--precision", "fp32", "--tiny-hidden-size", "64",
        "--tiny-layers", "2", "--tiny-heads", "4", "--tiny-vocab-size", "1024"]


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str

    @property
    def metrics(self) -> dict[int, dict[str, Any]]:
        by_step: dict[int, dict[str, Any]] = {}
        for line in self.stdout.splitlines():
            parsed = parse_record(line)
            if parsed and parsed[0] == METRIC_TAG:
                by_step[parsed[1]["step"]] = parsed[1]  # Ray may print a line twice
        return by_step

    @property
    def summary(self) -> dict[str, Any] | None:
        found = [parse_record(line) for line in self.stdout.splitlines() if SUMMARY_TAG in line]
        return next((p[1] for p in found if p), None)

    def losses(self) -> list[float]:
        return [self.metrics[s]["loss"] for s in sorted(self.metrics)]


def run_program(address: str, argv: list[str], timeout: float = 240) -> Run:
    env = {**os.environ, **WORKER_ENV, "RAY_ADDRESS": address}
    proc = subprocess.run([sys.executable, "-m", "training.train", *argv], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=timeout)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def train(address: str, *args: str, timeout: float = 240) -> Run:
    return run_program(address, [*TINY, *args], timeout)


def _ok(run: Run) -> Run:
    assert run.rc == 0, f"exit {run.rc}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run


CYCLE = ["--data", "cycle", "--seq-len", "64", "--batch-size", "4", "--lr", "3e-3", "--warmup-steps", "2"]


@pytest.fixture(scope="module")
def full_run(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    """FSDP over both workers on the learnable cycle, checkpointing every 6 of 16 steps (and at the end),
    exporting the model at step 8 and at the end."""
    store = tmp_path_factory.mktemp("store")
    run = train(ray_address, *CYCLE, "--steps", "16", "--shard", "full", "--checkpoint-every", "6",
                "--keep-checkpoints", "3", "--export-every", "8", "--storage-path", str(store), "--run-name", "full")
    return _ok(run), store


def test_full_shard_trains_on_a_learnable_pattern(full_run: tuple[Run, Path]) -> None:
    run, _ = full_run
    losses = run.losses()
    assert sorted(run.metrics) == list(range(1, 17))
    assert losses[-1] < losses[0] - 1.5, losses  # ln(1024) ≈ 6.9 at the start
    assert "mesh 2 ('shard',)" in run.stdout
    assert run.summary is not None and run.summary["steps_run"] == 16 and run.summary["world_size"] == 2
    # Ray Train's own line for every ray.train.report of every rank (a repr of the report) is noise in
    # the job's log the user reads: rtui's metric lines already say each step.
    assert "Reporting training result" not in run.stdout + run.stderr


def test_export_every_writes_a_model_at_that_step_and_the_final_one_is_offered(full_run: tuple[Run, Path]) -> None:
    from backend.delivery import LocalDirStore

    _, store = full_run
    models = LocalDirStore(store).models()
    assert [(m.step, m.final, os.path.basename(m.uri)) for m in models] == \
        [(16, True, "model"), (8, False, "model-step-00000008")]
    assert LocalDirStore(store).newest_model() == models[0]


def test_metric_lines_parse_with_the_telemetry_parser(full_run: tuple[Run, Path]) -> None:
    run, _ = full_run
    telemetry = Telemetry()
    telemetry.feed_lines(run.stdout.splitlines())
    series = telemetry.series
    assert [p.step for p in series.points] == list(range(1, 17))
    assert series.column("loss") == [run.metrics[s]["loss"] for s in range(1, 17)]
    assert all(tps and tps > 0 for tps in series.column("tokens_per_s"))
    assert series.summary is not None and series.summary["final_loss"] == series.points[-1].loss
    record = run.metrics[5]
    assert record["tokens_per_step"] == 4 * 64 * 2 and record["device"] == "cpu" and record["mfu"] is None
    assert record["peak_mem_gib"] > 0 and record["compute_s"] <= record["step_time_s"]


def test_checkpoint_then_resume_continues_at_the_right_step(ray_address: str, full_run: tuple[Run, Path],
                                                            tmp_path: Path) -> None:
    first, store = full_run
    assert [s for s, _ in ckpt.find_checkpoints(str(store))] == [6, 12, 16]
    assert str(ckpt.resolve_resume("latest", str(store))).endswith("checkpoint_step_00000016")
    resumed = _ok(train(ray_address, *CYCLE, "--steps", "12", "--shard", "full", "--storage-path", str(tmp_path),
                        "--resume-from", str(store / "full" / ckpt.checkpoint_dir_name(6))))
    assert "at step 6" in resumed.stdout
    assert sorted(resumed.metrics) == list(range(7, 13))
    for step in range(7, 13):  # same weights, optimizer moments, data stream and lr: the same losses
        assert resumed.metrics[step]["loss"] == pytest.approx(first.metrics[step]["loss"], abs=2e-4), step


def test_hybrid_2x1_on_ray_data_with_accumulation(ray_address: str, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "corpus.jsonl", n=300)  # one epoch outlasts the run: no pipeline restart
    tok = build_tokenizer(tmp_path / "tok")
    run = _ok(train(ray_address, "--data", str(data), "--tokenizer", str(tok), "--seq-len", "32", "--batch-size",
                    "4", "--tokens-per-step", "512", "--lr", "3e-3", "--steps", "12", "--shard", "hybrid",
                    "--shard-size", "1", "--storage-path", str(tmp_path / "store")))
    assert "mesh 2x1 ('replicate', 'shard')" in run.stdout and "accum 2" in run.stdout
    losses = run.losses()
    assert len(losses) == 12 and losses[-1] < losses[0] - 2.0, losses
    # The non-final micro-step skipped gradient sync, so the final one's extra time is measurable.
    assert all(r["grad_sync_s"] is not None and r["grad_accum"] == 2 for r in run.metrics.values())


def test_hybrid_1x2_on_random_tokens(ray_address: str, tmp_path: Path) -> None:
    run = _ok(train(ray_address, "--data", "random", "--seq-len", "64", "--batch-size", "4", "--lr", "1e-3",
                    "--steps", "6", "--shard", "hybrid", "--storage-path", str(tmp_path)))
    assert "mesh 1x2 ('replicate', 'shard')" in run.stdout
    # Uniform random ids cannot be learned: the loss stays at ln(vocab), which proves it is finite
    # and the model predicts a near-uniform distribution over the 1024 ids.
    assert all(abs(loss - math.log(1024)) < 0.3 for loss in run.losses()), run.losses()


def test_parquet_pipeline_packs_fixed_length_rows(ray_address: str, tmp_path: Path) -> None:
    from training.data import build_text_dataset

    data = write_parquet(tmp_path / "corpus.parquet", n=40)
    tok = build_tokenizer(tmp_path / "tok")
    ds = build_text_dataset(str(data), tokenizer=str(tok), text_field="body", seq_len=16, data_cpus=0.5,
                            tokenize_actors=1)
    rows = ds.take_all()
    # 40 documents × 6 sentences × 10 words + 40 EOS = 2440 ids → 152 full rows of 16 (8 ids left in the tail).
    assert len(rows) == 2440 // 16 and all(len(r["input_ids"]) == 16 for r in rows)


def test_activation_checkpointing_recomputes_the_same_losses(ray_address: str, full_run: tuple[Run, Path],
                                                             tmp_path: Path) -> None:
    """Recomputing activations in backward must not change the math: same first losses as the plain run."""
    run, _ = full_run
    ac = _ok(train(ray_address, *CYCLE, "--steps", "4", "--shard", "full", "--activation-checkpointing",
                   "--storage-path", str(tmp_path), "--run-name", "ac"))
    assert sorted(ac.metrics) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        assert math.isclose(ac.metrics[step]["loss"], run.metrics[step]["loss"], abs_tol=2e-4), step


# --checkpoint-every auto: rank 0 turns the expected interruption rate, the measured step time and the
# measured checkpoint time into an interval, and every rank checkpoints at the steps it votes for
# (tests/test_checkpoint_auto.py tests the arithmetic). Here, on this module's Ray, to start no other.
AUTO_STEPS = 4


def _auto(address: str, store: Path, per_hour: str) -> str:
    run = _ok(train(address, *CYCLE, "--steps", str(AUTO_STEPS), "--shard", "full", "--checkpoint-every", "auto",
                    "--interruptions-per-hour", per_hour, "--keep-checkpoints", "100", "--eval-tokens", "0",
                    "--storage-path", str(store), "--run-name", "auto"))
    return run.stdout


def test_auto_checkpoints_at_the_steps_rank_0_votes_for_and_at_the_end(ray_address: str, tmp_path: Path) -> None:
    # A million an hour (one every 3.6 ms): the optimum is shorter than any step, so every step once the
    # first has been timed (step 1 has no step time to decide from), and the last. The end-only case is
    # the same vote never cast (tests/test_checkpoint_auto.py).
    often = _auto(ray_address, tmp_path / "often", "1e6")
    steps = [s for s, _ in ckpt.find_checkpoints(str(tmp_path / "often"))]
    assert steps == list(range(2, AUTO_STEPS + 1)), (steps, often[-3000:])
    said = re.findall(r"rtui-train: checkpoint every step \(auto: 1e\+06 interruptions/h, .* per checkpoint, "
                      r".* per step\)", often)
    assert len(said) == 1, often[-3000:]  # said once: the interval stays at one step
