"""Every script in bench/ runs, at tiny sizes, so none rots unseen (issue 21, item 12).

Two benches had broken without a test noticing: one imported a function that was removed, one
passed a dict where the training program now takes a ``TrainConfig``. Here each script is
imported, then run as a user runs it (its own process, from the repository) with arguments that
make it take seconds; the ones that start a real local Ray cluster are marked ``ray``, the one
that drives tmux ``tmux``. A script added to bench/ without an entry here fails the first test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BENCH = REPO / "bench"

# Over ~3 s each on 2 busy cores (`--durations`): out of `make test-fast`, still in `make test`.
SLOW = pytest.mark.slow

# script -> (tiny arguments, text its output must hold, marks)
SMOKE: dict[str, tuple[list[str], str, tuple[pytest.MarkDecorator, ...]]] = {
    "plain_loop.py": (["--steps", "3", "--seq-len", "16", "--batch-size", "2", "--precision", "fp32"],
                      '"tokens_per_s_mean"', (SLOW,)),
    "jobs_follow.py": (["--lines", "2000"], '"lines": 2000', ()),
    "kube_logs.py": (["--lines", "2000"], '"lines": 2000', (SLOW,)),
    "kube_up.py": (["--minute", "0.002", "--reps", "1"], "rtui plan median", (SLOW,)),
    "aws_up.py": (["--minute", "0.002", "--reps", "1"], "rtui plan median", (SLOW,)),
    "spot_cost.py": (["--job-hours", "1"], "Spot costs as much as On-Demand at", (SLOW,)),
    "tui_flood.py": (["--rate", "2000", "--seconds", "0.5", "--idle", "0.2"], '"lost_in_spool"', (SLOW,)),
    "tui_first_frame.py": (["--reps", "1", "--floor"], "before the first frame costs)", (SLOW,)),
    "first_frame.py": (["--runs", "1"], "ratio rtui / hello", (pytest.mark.tmux,)),
    "local_throughput.py": (["--steps", "3"], "ratio FSDP2 / plain", (pytest.mark.ray,)),
    "train_vs_plain.py": (["--steps", "3", "--per-worker-batch", "2"], '"plain_tokens_per_s"', (pytest.mark.ray,)),
    "first_metric.py": (["--reps", "1", "--floor", str(REPO)], "rtui / Ray Train floor", (pytest.mark.ray,)),
    "auth_cost.py": (["--reps", "1"], "median dashboard", (pytest.mark.ray,)),
    "export_measure.py": (["--world", "1"], '"peak_rss_growth_mib"', (SLOW,)),
    "sft_step.py": (["--steps", "2", "--records", "40"], '"loss_tokens_per_s_cut_over_padded"', (SLOW,)),
    "resume_bytes.py": (["--world", "2", "--s3"], '"per_rank_read_bytes"', (SLOW,)),
    "checkpoint_stall.py": (["--rounds", "2", "--hidden", "32", "--layers", "1", "--vocab", "256"],
                            '"complete": true', (SLOW,)),
}


# Scripts whose smoke run is a test of their own, with more to check than the output's last line.
# Under pytest-timeout's 600 s, so a stuck bench is stopped here, with time to stop its cluster.
BENCH_TIMEOUT_S = 420

SMOKED_ELSEWHERE = {"gpu_step.py": REPO / "tests" / "training" / "test_gpu_step.py"}


def bench_env(tmp_path: Path, ray_tmp: Path | None = None) -> dict[str, str]:
    """The repository on the path (as the scripts' docstrings run them), nothing of the user's state, and
    nothing left in /tmp: the scripts' temporary dirs go under tmp_path (tempfile reads TMPDIR), and a
    Ray a script starts itself under ``ray_tmp`` (Ray reads RAY_TMPDIR first: its sockets need a short path)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RTUI_STATE_DIR": str(tmp_path / "state"),
           "RTUI_CONFIG_DIR": str(tmp_path / "config"), "TMPDIR": str(tmp)}
    return env if ray_tmp is None else {**env, "RAY_TMPDIR": str(ray_tmp)}


def test_every_bench_script_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCH.glob("*.py") if p.name != "__init__.py"}
    covered = set(SMOKE) | set(SMOKED_ELSEWHERE)
    assert scripts == covered, f"give each bench script a tiny smoke run here: {sorted(scripts ^ covered)}"
    for script, test in SMOKED_ELSEWHERE.items():
        assert f'"{script}"' in test.read_text(), f"{test} does not run bench/{script}"


@SLOW  # imports torch, transformers and Ray for each script: ~13 s
def test_every_bench_script_imports(tmp_path: Path) -> None:
    """Module level only (main() is not called): an import of something removed fails here in seconds."""
    code = ("import runpy, sys\n"
            "for path in sys.argv[1:]:\n"
            "    runpy.run_path(path, run_name='bench_import_check')\n")
    scripts = sorted({*SMOKE, *SMOKED_ELSEWHERE})
    proc = subprocess.run([sys.executable, "-c", code, *(str(BENCH / name) for name in scripts)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=bench_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("script", [pytest.param(name, marks=marks) for name, (_, _, marks) in SMOKE.items()])
def test_bench_script_runs_at_tiny_sizes(script: str, tmp_path: Path, short_tmp: Path) -> None:
    args, expected, _ = SMOKE[script]
    proc = subprocess.Popen([sys.executable, str(BENCH / script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=bench_env(tmp_path, short_tmp),
                            stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=BENCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # SIGTERM, not subprocess.run's SIGKILL: a bench that started a Ray head stops it on the way
        # out, and no cluster outlives the test to be seen by the next ones as an orphan.
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"{script} ran past {BENCH_TIMEOUT_S}s:\n{out[-2000:]}\n{err[-3000:]}")
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{out[-2000:]}\n{err[-3000:]}"
    assert expected in out, out[-2000:]
