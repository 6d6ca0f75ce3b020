"""`make sandbox-aws` / `make sandbox-kube` (issue 21 item 10): the real rtui binary in a real terminal
(tmux, 80x24) against the project's doubles, through the whole flow by keys.

aws: the region/AZ matrix, the priced plan and its confirmation, the provisioning panes, where `q`
asks the detach question (item 2: the exact `--resume` command whole at 80 columns, the modal's own
footer) and `n` stays; the dashboard with the EFA badge from the job's real NCCL lines and its
metrics, then `D`, the cluster's name, teardown, `q`. kube: the same from the sandbox context.
The subtitle says "sandbox" throughout; what the run left in the sandbox's state is all down.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_tmux import Terminal, terminal  # noqa: F401 - the fixture

pytestmark = [pytest.mark.tmux, pytest.mark.timeout(240),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


def start(terminal: Terminal, target: str, tmp_path: Path, *, shared: Path | None = None) -> Path:  # noqa: F811
    """``shared``: where the sandbox looks for the project's shared data (default: beside the checkout)."""
    report = tmp_path / "report.json"
    # TMPDIR: the sandbox's own dir (rtui-sandbox-*) under tmp_path, as it is not removed when the test
    # ends before the sandbox does (its tmux server is killed).
    env = f"SANDBOX_MINUTE=0.2 SANDBOX_REPORT={report} TERM=xterm-256color TMPDIR={tmp_path}"
    if shared is not None:
        env += f" SANDBOX_SHARED={shared}"
    terminal.run("new-session", "-d", "-s", "sb", "-x", "80", "-y", "24",
                 f"cd {REPO} && env {env} {sys.executable} -m sandbox {target}; echo SANDBOX-EXIT=$?; sleep 120")
    return report


def keys(terminal: Terminal, *keys: str) -> None:  # noqa: F811
    terminal.run("send-keys", "-t", "sb", *keys)


def finish(terminal: Terminal, report: Path) -> None:  # noqa: F811
    keys(terminal, "D")
    terminal.wait_for("sb", "Type the cluster name")
    keys(terminal, "sandbox", "Enter")
    terminal.wait_for("sb", "is down: everything it created is gone", timeout=120)
    keys(terminal, "q")
    terminal.wait_for("sb", "SANDBOX-EXIT=0", timeout=30)
    runs = json.loads(report.read_text())
    assert [r["status"] for r in runs] == ["down"], [r["status"] for r in runs]


def test_sandbox_aws_by_keys(terminal: Terminal, tmp_path: Path) -> None:  # noqa: F811
    started = time.monotonic()
    report = start(terminal, "aws", tmp_path)
    screen = terminal.wait_for("sb", "us-east-1a", timeout=60)  # the matrix, filled from the AWS double
    first = time.monotonic() - started
    assert "aws @ us-east-1 · sandbox · run r" in screen, screen  # the subtitle: the cluster's name
    terminal.wait_for("sb", "Recommended placement", timeout=60)
    keys(terminal, "Enter")
    screen = terminal.wait_for("sb", "Cost: $", timeout=60)  # the plan, priced
    assert "aws — AWS infrastructure" in screen and "/hour" in screen, screen
    keys(terminal, "a")
    screen = terminal.wait_for("sb", "Apply now?", timeout=30)
    assert re.search(r"\$\d+\.\d\d/hour while up", screen), screen
    keys(terminal, "y")
    terminal.wait_for("sb", "Provisioning", timeout=30)
    keys(terminal, "q")  # item 2: while steps run
    terminal.wait_for("sb", "Steps are still running.", timeout=30)
    screen = terminal.wait_for("sb", "y Detach", timeout=10)  # the modal's own footer
    resume = re.search(r"rtui --resume r\d{8}-\d{6}-[0-9a-f]{4}", screen)
    assert resume is not None, screen  # the exact command, whole on one line at 80 columns
    assert "n Stay" in screen and "Tear down" not in screen.splitlines()[-1], screen
    keys(terminal, "n")
    screen = terminal.wait_for("sb", " EFA ", timeout=150)  # the dashboard's badge, from real NCCL lines
    assert "step" in terminal.wait_for("sb", "loss", timeout=60)
    finish(terminal, report)
    print(f"sandbox-aws: first frame with the matrix after {first:.1f}s")


def test_sandbox_kube_by_keys(terminal: Terminal, tmp_path: Path) -> None:  # noqa: F811
    # As from a checkout that does not sit beside shared/, with no network (a fresh clone fetched
    # KubeRay's CRDs from GitHub and its operator step failed): stand-in CRDs, the built-in NCCL lines.
    report = start(terminal, "kube", tmp_path, shared=tmp_path / "no-shared")
    # A fresh cluster: its GPU nodes advertise no GPUs until the device plugin the plan installs runs,
    # and preflight says so (a warning, checked again once the plugins run), so the flow goes on.
    screen = terminal.wait_for("sb", "GPU nodes —", timeout=60)
    assert "sandbox" in screen and "kube" in screen
    keys(terminal, "Enter")
    # The plan's summary, not the screen's title: the title shows while it is still planning.
    terminal.wait_for("sb", " to create, ", timeout=60)
    keys(terminal, "a")
    # The operator and the device plugins change the cluster for everyone on it: asked twice, named.
    screen = terminal.wait_for("sb", "Apply now?", timeout=30)
    assert "everyone on the cluster" in screen, screen
    keys(terminal, "y")
    terminal.wait_for("sb", " EFA ", timeout=120)
    terminal.wait_for("sb", "SUCCEEDED", timeout=120)
    # Issue 40 item 1: quitting said "Resume: rtui --resume …" and the sandbox then deleted the run with
    # everything else, so the command answered "no run". The sandbox now says so, and resumes it itself.
    keys(terminal, "q")
    screen = terminal.wait_for("sb", "Enter resumes it here", timeout=30)
    assert "only while this sandbox runs" in screen, screen
    keys(terminal, "Enter")
    terminal.wait_for("sb", "SUCCEEDED", timeout=60)  # the run's dashboard again, by rtui --resume
    finish(terminal, report)


@pytest.mark.parametrize("beside_shared", [True, False])
def test_each_job_line_has_one_worker_prefix(beside_shared: bool, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Away from shared/, the built-in NCCL lines showed "(RayTrainWorker …) (RayTrainWorker …) gpu-0…"."""
    import sandbox.__main__ as sandbox

    if not beside_shared:
        monkeypatch.setattr(sandbox, "SHARED_NCCL", tmp_path / "none.log")
    elif not sandbox.SHARED_NCCL.is_file():
        pytest.skip(f"no {sandbox.SHARED_NCCL}")
    lines = sandbox.job_script("python -m training.train --steps 3", step_s=0.1)
    assert lines and all(line.count("(RayTrainWorker") == 1 for line in lines), lines[:3]


def test_the_product_does_not_know_the_sandbox() -> None:
    """Endpoints and a kubeconfig only: no product package mentions the sandbox."""
    for package in ("backend", "tui", "screens", "training"):
        for path in (REPO / package).rglob("*.py"):
            # (Kubernetes's own FailedCreatePodSandBox is a pod event reason, not ours.)
            assert not re.search(r"\bsandbox\b", path.read_text(), re.IGNORECASE), path
    assert os.path.isfile(REPO / "sandbox" / "__main__.py")


@pytest.mark.parametrize("answer", ["q\n", ""])
def test_ending_the_sandbox_with_a_run_up_says_the_run_goes_with_it(answer: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40 item 1: after rtui detached ("Resume: rtui --resume …"), the sandbox said nothing and
    deleted the run. Now it names the run, says the command works only inside it, and ends on `q` (or
    end of input) saying what is deleted; a run torn down is not asked about."""
    import io

    import sandbox.__main__ as sandbox

    runs = tmp_path / "state" / "runs"
    runs.mkdir(parents=True)
    (runs / "r1.json").write_text(json.dumps({"run_id": "r1", "status": "down"}))
    assert sandbox.left_up(tmp_path / "state") is None
    (runs / "r2.json").write_text(json.dumps({"run_id": "r2", "status": "up"}))
    assert sandbox.left_up(tmp_path / "state") == "r2"
    monkeypatch.setattr(sys, "stdin", io.StringIO(answer))
    assert sandbox.ask_resume("r2") is False
    out = capsys.readouterr().out
    assert "only while this sandbox runs" in out and "Sandbox ended: run r2 and everything it made" in out, out
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    assert sandbox.ask_resume("r2") is True


def test_the_sandbox_jobs_metrics_follow_its_plan() -> None:
    """Issue 40 item 5: the sandbox showed "16,000 tok/s 1,930 ms/step" for a plan of 1,024 tokens a step
    (≈530 tok/s at that pace) and finished 11 s after an "ETA 1m11s". Its metric lines now come from the
    submitted job's own step plan (training.train's arguments) at the pace the sandbox prints them."""
    import sandbox.__main__ as sandbox
    from training.protocol import METRIC_TAG, parse_record

    entrypoint = ("python -m training.train --steps 5 --seq-len 128 --batch-size 4 --num-workers 8 --device cuda "
                  "--precision bf16")
    lines = sandbox.job_script(entrypoint, step_s=0.5)
    metrics = [r[1] for line in lines if (r := parse_record(line, (METRIC_TAG,))) is not None]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    assert {m["tokens_per_s"] for m in metrics} == {128 * 4 * 8 / 0.5}
    assert {m["step_time_s"] for m in metrics} == {0.5} and {m["world_size"] for m in metrics} == {8}
    assert {m["tokens_per_step"] for m in metrics} == {128 * 4 * 8}
