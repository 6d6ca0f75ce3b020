"""``--checkpoint-every auto`` (issue 41): the interval from the expected interruption rate.

The arithmetic (``training.checkpoint_interval``: Daly's optimum, whole steps, the end-only case, the
re-estimate after a measured checkpoint), the config (a number or auto, one line and exit 2 otherwise),
the target's rate (Llama 3's failure rate per GPU-hour times the GPUs of a node), the job's arguments
(auto carries the job's rate; a number passes as before, with the spec hash it had) and the plan's line.
The program itself under Ray Train: tests/training/test_checkpoint_auto_program.py.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from backend import targets
from backend.config import RunConfig
from backend.errors import UserError
from backend.jobspec import build_job_spec, describe_auto_checkpoint, job_interruptions_per_hour
from backend.record import RunFacts
from backend.resolve import resolve_config
from backend.targets import INTERRUPTIONS_PER_GPU_HOUR, InterruptionRate
from targets.kube.config import KubeConfig
from targets.local.config import LocalConfig
from tests.conftest import REPO
from training import checkpoint_interval as ci
from training.config import TrainConfig, TrainConfigError, parse_args

MINUTE, HOUR = 60.0, 3600.0
S3 = "s3://bucket/runs"


# --- the arithmetic ------------------------------------------------------------------------------------
def test_young_is_the_square_root_of_twice_the_checkpoint_time_over_the_rate() -> None:
    # δ = 50 s, one interruption per 10,000 s: sqrt(2 · 50 · 10,000) = 1,000 s.
    assert ci.young_interval_s(50.0, 1e-4) == pytest.approx(1000.0)
    assert ci.young_interval_s(50.0, 0.0) == math.inf


@pytest.mark.parametrize(("mtbf_s", "expected_min"), [(24 * HOUR, 117), (6 * HOUR, 57), (15 * MINUTE, 9.1)])
def test_daly_reproduces_the_examples_of_his_paper(mtbf_s: float, expected_min: float) -> None:
    """Daly 2006, figures 3-5: δ = 5 min, M = 24 h / 6 h / 15 min predict τ_opt = 117 / 57 / 9.1 min."""
    tau = ci.optimum_interval_s(5 * MINUTE, 1 / mtbf_s)
    assert tau / MINUTE == pytest.approx(expected_min, abs=0.5 if expected_min > 10 else 0.05)


def test_daly_tends_to_young_when_checkpoints_are_cheap_and_is_the_mtbf_when_they_are_not() -> None:
    young, daly = ci.young_interval_s(1.0, 1e-6), ci.optimum_interval_s(1.0, 1e-6)
    assert daly == pytest.approx(young, rel=1e-3) and daly != young
    assert ci.optimum_interval_s(300.0, 1 / 100.0) == pytest.approx(100.0)  # δ ≥ 2M: τ = M
    assert ci.optimum_interval_s(0.0, 1.0) == 0.0 and ci.optimum_interval_s(5.0, 0.0) == math.inf


def test_the_interval_is_whole_steps_and_at_least_one() -> None:
    # δ = 41 s at 1.8 interruptions/h (M = 2000 s): Daly's τ = sqrt(164,000)·1.0349 − 41 ≈ 378.1 s
    # → 122 steps of 3.1 s (Young's 405 s would be 131).
    every = ci.choose_interval(checkpoint_s=41.0, step_s=3.1, interruptions_per_hour=1.8, job_steps=10_000)
    assert every.interval_s == pytest.approx(378.1, abs=0.1)
    assert every.steps == 122
    # Interruptions far more often than a step: every step, never 0.
    often = ci.choose_interval(checkpoint_s=0.01, step_s=0.5, interruptions_per_hour=1e6, job_steps=100)
    assert often.steps == 1
    assert often.describe().startswith("checkpoint every step (auto: 1e+06 interruptions/h, 0.01 s per "
                                       "checkpoint, 0.5 s per step")


def test_an_optimum_longer_than_the_job_means_only_at_the_end() -> None:
    # Llama 3's rate on one 8-GPU node (M ≈ 6,330 h): τ ≈ 12 h for a 41 s checkpoint; 100 steps of 3.1 s, 5 min.
    per_hour = INTERRUPTIONS_PER_GPU_HOUR * 8
    short = ci.choose_interval(checkpoint_s=41.0, step_s=3.1, interruptions_per_hour=per_hour, job_steps=100)
    assert short.steps is None and short.interval_s > short.job_s
    assert short.describe() == ("checkpoint only at the end (auto: 0.000158 interruptions/h, 41 s per checkpoint, "
                                "3.1 s per step: the optimum interval, 12.0 h, is longer than the job's 5 min)")
    long = ci.choose_interval(checkpoint_s=41.0, step_s=3.1, interruptions_per_hour=per_hour, job_steps=100_000)
    assert long.steps is not None and 1 < long.steps < 100_000
    none = ci.choose_interval(checkpoint_s=41.0, step_s=3.1, interruptions_per_hour=0.0, job_steps=100_000)
    assert none.steps is None and "no interruption is expected" in none.describe()


def test_rank_zero_re_estimates_after_a_measured_checkpoint_and_says_material_changes() -> None:
    said: list[str] = []
    pacer = ci.AutoCheckpoints(interruptions_per_hour=36.0, start_step=0, last_step=10_000, first_checkpoint_s=0.5,
                               say=said.append)
    assert not pacer.due(1) and said == []  # no step timed yet: nothing to decide from
    pacer.stepped(5.0)  # the warm-up step: used only until a later one is known
    pacer.due(2)
    assert said and "5 s per step" in said[-1]
    pacer.stepped(1.0)
    first = pacer.interval()
    assert first is not None and first.step_s == 1.0  # the warm-up step left out
    # δ = 0.5 s, λ = 0.01/s (M = 100 s): Daly's τ = 10 · (1 + 0.05/3 + 0.0025/9) − 0.5 ≈ 9.67 s → 10 steps of 1 s.
    assert first.interval_s == pytest.approx(9.669, abs=1e-3) and first.steps == 10
    assert [pacer.due(s) for s in range(8, 12)] == [False, False, True, True]
    assert "checkpoint every 10 steps" in said[-1]
    pacer.checkpointed(10, 8.0)  # the measured checkpoint took 16 times the estimate
    after = pacer.interval()
    # Daly: τ = 40 · (1 + 0.2/3 + 0.04/9) − 8 ≈ 34.8 s → 35 steps.
    assert after is not None and after.checkpoint_s == 8.0 and after.steps == 35
    assert not pacer.due(11) and "35 steps" in said[-1] and "8 s per checkpoint" in said[-1]
    assert [pacer.due(s) for s in (44, 45)] == [False, True]  # 35 steps after the checkpoint at 10
    lines = len(said)
    pacer.stepped(1.1)  # 5 % slower steps: 33 steps, no news
    assert pacer.interval().steps == 33  # type: ignore[union-attr]
    pacer.due(46)
    assert len(said) == lines


def test_a_resumed_attempt_counts_from_its_checkpoint_and_only_its_own_steps() -> None:
    pacer = ci.AutoCheckpoints(interruptions_per_hour=36.0, start_step=90, last_step=200, first_checkpoint_s=0.5,
                               say=lambda line: None)
    pacer.stepped(1.0)
    interval = pacer.interval()
    assert interval is not None and interval.job_steps == 110 and interval.steps == 10
    assert not pacer.due(99) and pacer.due(100)
    # The same interval in an attempt of 10 steps is the whole attempt: only at the end.
    tail = ci.AutoCheckpoints(interruptions_per_hour=36.0, start_step=190, last_step=200, first_checkpoint_s=0.5,
                              say=lambda line: None)
    tail.stepped(1.0)
    assert tail.interval().steps is None and not any(tail.due(s) for s in range(191, 201))  # type: ignore[union-attr]


def test_the_first_checkpoint_estimate_is_the_state_at_the_assumed_write_rate() -> None:
    # Qwen2.5-1.5B: 1.544e9 parameters × 12 bytes over 2 nodes at 125 MiB/s each ≈ 71 s.
    assert ci.estimated_checkpoint_s(1.544e9, 2) == pytest.approx(1.544e9 * 12 / (2 * 125 * 2**20))
    assert ci.estimated_checkpoint_s(1.544e9, 2) == pytest.approx(70.7, abs=0.1)


# --- the config ----------------------------------------------------------------------------------------
def test_checkpoint_every_takes_a_number_or_auto_from_every_source(tmp_path: Path) -> None:
    assert resolve_config({"checkpoint_every": "auto"}, environ={}).config.checkpoint_every == "auto"
    assert resolve_config({"checkpoint_every": "7"}, environ={}).config.checkpoint_every == 7
    assert resolve_config({}, environ={"RTUI_CHECKPOINT_EVERY": "auto"}).config.checkpoint_every == "auto"
    # rtui.toml: a string or a number (a free field: a checkout's file may set it without confirmation).
    (tmp_path / "rtui.toml").write_text('checkpoint_every = "auto"\n')
    assert resolve_config({}, environ={}, cwd=tmp_path).config.checkpoint_every == "auto"
    (tmp_path / "rtui.toml").write_text("checkpoint_every = 12\n")
    assert resolve_config({}, environ={}, cwd=tmp_path).config.checkpoint_every == 12
    (tmp_path / "rtui.toml").write_text("checkpoint_every = 1.5\n")
    with pytest.raises(UserError, match="invalid checkpoint_every=1.5 .*or auto"):
        resolve_config({}, environ={}, cwd=tmp_path)
    # A record written before auto existed (an int) still loads; a config dumps and loads back.
    for value in (0, 5, "auto"):
        config = LocalConfig(checkpoint_every=value)
        assert LocalConfig.model_validate(config.model_dump(mode="json")).checkpoint_every == value


@pytest.mark.parametrize("bad", ["often", "-1", "5.5", "", "AUTO"])
def test_a_bad_checkpoint_interval_is_one_line_naming_what_is_accepted(bad: str) -> None:
    with pytest.raises(UserError, match=r"--checkpoint-every=.* a number of steps \(0 = never\), or auto") as info:
        resolve_config({"checkpoint_every": bad}, environ={})
    assert "\n" not in info.value.message


def test_auto_needs_shared_storage_on_a_cluster_like_any_interval() -> None:
    with pytest.raises(UserError, match="--checkpoint-every on aws: .* no node holds a whole checkpoint"):
        resolve_config({"target": "aws", "checkpoint_every": "auto"}, environ={})
    assert resolve_config({"target": "aws", "checkpoint_every": "auto", "storage_path": S3}, environ={})


def test_the_cli_refuses_a_bad_interval_in_one_line_with_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for bad in ("often", "-1"):
        proc = subprocess.run([sys.executable, "-m", "tui.cli", "plan", "--checkpoint-every", bad],
                              capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "--checkpoint-every" in lines[0] and "or auto" in lines[0], proc.stderr


# --- the target's rate ---------------------------------------------------------------------------------
def test_the_default_rate_is_llama_3s_per_gpu_hour_times_the_gpus_of_a_node() -> None:
    per_gpu_hour = INTERRUPTIONS_PER_GPU_HOUR
    assert per_gpu_hour == pytest.approx(419 / (54 * 24 * 16_384))
    assert per_gpu_hour == pytest.approx(1.973e-5, rel=1e-3)
    kube = KubeConfig(target="kube", gpus_per_node=8)
    rate = targets.get("kube").interruption_rate(kube, RunFacts())
    assert rate.per_node_hour == pytest.approx(8 * INTERRUPTIONS_PER_GPU_HOUR)
    assert "Llama 3" in rate.source and "419" in rate.source and "8 GPUs per node" in rate.source
    # On CPUs (local): one GPU's share for the machine.
    local = targets.get("local").interruption_rate(LocalConfig(), RunFacts())
    assert local.per_node_hour == pytest.approx(INTERRUPTIONS_PER_GPU_HOUR) and "CPU machine" in local.source


def test_the_job_rate_is_the_node_rate_times_the_jobs_nodes() -> None:
    rate = InterruptionRate(0.01, "test")
    two = KubeConfig(target="kube", gpu_node_count=2, gpus_per_node=4)  # 8 workers on 2 nodes
    one = KubeConfig(target="kube", gpu_node_count=2, gpus_per_node=4, num_workers=4)  # PACK: one node
    assert job_interruptions_per_hour(two, rate) == pytest.approx(0.02)
    assert job_interruptions_per_hour(one, rate) == pytest.approx(0.01)


# --- the job's arguments -------------------------------------------------------------------------------
def _args(config: RunConfig, **kw: object) -> list[str]:
    return shlex.split(build_job_spec(config, "0" * 40, **kw).entrypoint)  # type: ignore[arg-type]


def _after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_auto_passes_the_jobs_rate_from_the_target_and_its_facts() -> None:
    config = resolve_config({"target": "kube", "checkpoint_every": "auto", "storage_path": S3,
                             "gpu_node_count": "3", "gpus_per_node": "8"}, environ={}).config
    args = _args(config)
    assert _after(args, "--checkpoint-every") == "auto"
    assert float(_after(args, "--interruptions-per-hour")) == pytest.approx(3 * 8 * INTERRUPTIONS_PER_GPU_HOUR,
                                                                           rel=1e-3)
    # The rate a caller got from the target with the run's facts (a Spot target's override) is the one passed.
    spot = _args(config, interruption_rate=InterruptionRate(0.5, "Spot"))
    assert float(_after(spot, "--interruptions-per-hour")) == pytest.approx(1.5)
    # The program reads them back as the job runs them.
    parsed = parse_args(spot[3:])
    assert parsed.checkpoint_every == "auto" and parsed.interruptions_per_hour == pytest.approx(1.5)


def test_a_numeric_interval_passes_as_before_with_the_same_spec_hash() -> None:
    """Hashes taken before auto existed: a second `up` of an existing run must not see a changed job."""
    def spec_hash(flags: dict[str, str]) -> str:
        config = resolve_config(flags, environ={}).config
        return build_job_spec(config, "0" * 40 if config.target != "local" else None, run_id="r1").spec_hash

    assert spec_hash({}) == "db72e571ade427a3"
    assert spec_hash({"checkpoint_every": "5"}) == "2c29a5ad6467ea9b"
    assert spec_hash({"target": "aws", "checkpoint_every": "10", "storage_path": S3}) == "c6be5ecc85a04676"
    assert spec_hash({"target": "kube", "checkpoint_every": "7", "storage_path": S3,
                      "max_failures": "2"}) == "3996e421f67c2a00"
    numeric = _args(resolve_config({"checkpoint_every": "5"}, environ={}).config)
    assert _after(numeric, "--checkpoint-every") == "5" and "--interruptions-per-hour" not in numeric


def test_a_new_rate_estimate_does_not_change_the_job() -> None:
    config = resolve_config({"target": "kube", "checkpoint_every": "auto", "storage_path": S3}, environ={}).config
    a = build_job_spec(config, "0" * 40, interruption_rate=InterruptionRate(0.1, "a"))
    b = build_job_spec(config, "0" * 40, interruption_rate=InterruptionRate(0.2, "b"))
    assert a.entrypoint != b.entrypoint and a.spec_hash == b.spec_hash
    numeric = build_job_spec(config.model_copy(update={"checkpoint_every": 10}), "0" * 40)
    assert numeric.spec_hash != a.spec_hash


# --- the plan ------------------------------------------------------------------------------------------
def test_the_plan_says_what_auto_means_in_steps_on_a_gpu_it_knows() -> None:
    config = resolve_config({"target": "aws", "checkpoint_every": "auto", "storage_path": S3, "steps": "200000"},
                            environ={}).config
    rate = InterruptionRate(0.01, "a test rate")
    text = describe_auto_checkpoint(config, rate)
    # 2 g6.12xlarge nodes (L4s): 0.02 interruptions/h for the job; the state at 125 MiB/s per node ≈ 71 s.
    assert text.startswith("every auto (≈") and "steps at 0.02 interruptions/h: a test rate, × 2 nodes" in text
    assert "est. 71 s per checkpoint" in text and " per step)" in text
    steps = int(text.split("≈", 1)[1].split(" ", 1)[0])
    assert steps > 1
    assert build_job_spec(config, "0" * 40, interruption_rate=rate).summary()["checkpoint"] == text
    # A job shorter than the optimum: only at the end, and why.
    short = describe_auto_checkpoint(config.model_copy(update={"steps": 10}), rate)
    assert short.startswith("every auto (only at the end: the optimum interval") and "is longer than the job's" in short
    # A numeric interval adds nothing to the plan.
    assert "checkpoint" not in build_job_spec(config.model_copy(update={"checkpoint_every": 10}), "0" * 40).summary()


def test_rtui_plan_shows_auto_on_the_local_target(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "plan", "--json", "--checkpoint-every", "auto"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout.splitlines()[-1])
    job = next(c for c in plan["changes"] if c["address"] == "ray.job.train")["after"]
    assert "--checkpoint-every auto --interruptions-per-hour 1.973e-05" in job["entrypoint"]
    # CPUs: no step time is known before the run, so the interval is said in training time.
    assert job["checkpoint"].startswith("every auto (≈ every ") and "of training at 1.97e-05 interruptions/h" in \
        job["checkpoint"] and "steps from the measured step time" in job["checkpoint"]


# --- the program's arguments ---------------------------------------------------------------------------
def test_the_program_takes_auto_only_with_a_rate() -> None:
    assert TrainConfig(checkpoint_every="auto", interruptions_per_hour=0.0).checkpoint_every == "auto"
    with pytest.raises(TrainConfigError, match="--checkpoint-every auto needs --interruptions-per-hour"):
        TrainConfig(checkpoint_every="auto")
    with pytest.raises(TrainConfigError, match="applies to --checkpoint-every auto only"):
        TrainConfig(checkpoint_every=5, interruptions_per_hour=1.0)
    for rate in (-1.0, math.inf, math.nan):
        with pytest.raises(TrainConfigError, match="--interruptions-per-hour must be a finite number"):
            TrainConfig(checkpoint_every="auto", interruptions_per_hour=rate)
    with pytest.raises(TrainConfigError, match="--checkpoint-every must be a number of steps"):
        TrainConfig(checkpoint_every=-1)
    assert TrainConfig.from_dict(TrainConfig(checkpoint_every="auto", interruptions_per_hour=2.0).as_dict()) == \
        TrainConfig(checkpoint_every="auto", interruptions_per_hour=2.0)


@pytest.mark.parametrize("bad", ["often", "-1"])
def test_the_program_refuses_a_bad_interval_with_exit_2(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--checkpoint-every", bad])
    assert exit_.value.code == 2 and "--checkpoint-every: must be a number of steps (0: never) or auto" in \
        capsys.readouterr().err
