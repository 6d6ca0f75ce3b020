"""The real `rtui` binary in a real terminal (tmux): first screen renders, `q` exits 0."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RTUI
from tests.eventually import eventually
from tests.tmp_watch import run_token

pytestmark = [pytest.mark.tmux,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


class Terminal:
    def __init__(self, socket: str) -> None:
        self.socket = socket

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              check=False).stdout

    def wait_for(self, session: str, needle: str, timeout: float = 30) -> str:
        screens = [""]

        def shown() -> str | None:
            screens[0] = self.run("capture-pane", "-p", "-J", "-t", session)  # -J: wrapped lines joined
            return screens[0] if needle in screens[0] else None

        try:
            return eventually(f"{needle!r} on the screen", shown, timeout=timeout, interval=0.1)
        except AssertionError:
            raise AssertionError(f"{needle!r} never appeared; screen was:\n{screens[0]}") from None


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    # A server of each test's own: a server the last test killed may still be going away when the next
    # one connects to the same socket. Named with the run's token, which tells the /tmp check it is ours.
    term = Terminal(f"rtui-test-{run_token()}-{secrets.token_hex(3)}")
    term.run("new-session", "-d", "-s", "parked", "sleep 600")  # keeps the private server up
    socket = term.run("display-message", "-p", "#{socket_path}").strip()
    yield term
    term.run("kill-server")
    # tmux 3.3 leaves its socket file (/tmp/tmux-<uid>/<name>) behind when its server is killed.
    if socket:
        Path(socket).unlink(missing_ok=True)


def test_first_screen_renders_and_q_exits_zero(terminal: Terminal, tmp_path: Path) -> None:
    exit_file = tmp_path / "exit"
    env = f"RTUI_STATE_DIR={tmp_path}/state RTUI_CONFIG_DIR={tmp_path}/cfg TERM=xterm-256color"
    terminal.run("new-session", "-d", "-s", "app", "-x", "110", "-y", "35",
                 f"cd {tmp_path} && env {env} {RTUI}; echo $? > {exit_file}; sleep 30")
    screen = terminal.wait_for("app", "Where should this run go?")
    assert "Local — a real Ray cluster on this machine" in screen
    terminal.wait_for("app", "Ray and PyTorch installed")  # the live preflight arrived
    terminal.run("send-keys", "-t", "app", "q")
    eventually("rtui to exit on q", lambda: exit_file.exists() and exit_file.read_text().strip(), timeout=30)
    assert exit_file.read_text().strip() == "0"
    assert not (tmp_path / "state").exists(), "quitting from the first screen leaves nothing behind"


def test_bad_flag_in_a_terminal_is_one_line(terminal: Terminal, tmp_path: Path) -> None:
    out = tmp_path / "out"
    terminal.run("new-session", "-d", "-s", "bad", "-x", "110", "-y", "10",
                 f"{RTUI} --target gcp 2> {out}; echo EXIT=$? >> {out}; sleep 30")
    eventually("rtui's exit status", lambda: "EXIT=" in (out.read_text() if out.exists() else ""), timeout=30)
    lines = out.read_text().strip().splitlines()
    assert lines == ["rtui: invalid --target='gcp' (from flag): expected one of local, aws, kube", "EXIT=2"]


@pytest.mark.ray
@pytest.mark.timeout(420)
def test_local_flow_by_keys_detach_resume_and_teardown(terminal: Terminal, tmp_path: Path) -> None:
    """The local flow end to end with the real binary: plan, apply, watch the job; `q` asks, `y`
    detaches (the job goes on); `rtui --resume` shows the spooled lines and the graph; `D` plus the
    typed cluster name tears it all down."""
    env = (f"RTUI_STATE_DIR={tmp_path}/state RTUI_CONFIG_DIR={tmp_path}/cfg TERM=xterm-256color "
           "RTUI_STEPS=100000 RTUI_LOCAL_CPUS=2")
    terminal.run("new-session", "-d", "-s", "run", "-x", "120", "-y", "40",
                 f"cd {tmp_path} && env {env} {RTUI}; echo DETACHED-EXIT=$?; sleep 300")
    terminal.wait_for("run", "Where should this run go?")
    terminal.wait_for("run", "Ray and PyTorch installed", timeout=60)
    terminal.run("send-keys", "-t", "run", "Enter")
    terminal.wait_for("run", "ray.job.train", timeout=60)  # the plan
    terminal.run("send-keys", "-t", "run", "a")
    terminal.wait_for("run", "GLOO", timeout=180)  # the dashboard's badge: the job's workers talk
    terminal.wait_for("run", "RUNNING", timeout=60)
    terminal.run("send-keys", "-t", "run", "q")
    terminal.wait_for("run", "The job is still running.")
    terminal.run("send-keys", "-t", "run", "y")
    screen = terminal.wait_for("run", "DETACHED-EXIT=0", timeout=30)
    assert "nothing was torn down" in screen and "--resume r" in screen

    terminal.run("new-window", "-t", "run", f"cd {tmp_path} && env {env} {RTUI} --resume; "
                                           "echo RESUMED-EXIT=$?; sleep 300")
    screen = terminal.wait_for("run", "GLOO", timeout=60)  # replayed from the spool
    assert "step" in screen
    terminal.run("send-keys", "-t", "run", "D")
    terminal.wait_for("run", "Type the cluster name")
    terminal.run("send-keys", "-t", "run", "rtui-ray", "Enter")
    terminal.wait_for("run", "is down", timeout=120)
    terminal.run("send-keys", "-t", "run", "q")
    terminal.wait_for("run", "RESUMED-EXIT=0", timeout=30)
    records = list((tmp_path / "state" / "runs").glob("*.json"))
    statuses = [json.loads(r.read_text())["status"] for r in records]
    assert statuses and set(statuses) == {"down"}, statuses


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_second_job_on_the_same_run_is_its_own(terminal: Terminal, tmp_path: Path) -> None:
    """Issue 21, item 1, through the real binary: a 20-step job, then a 5-step one on the same run.
    `up --json` reports the new job's steps, `status` and `logs` show it, `logs --job 1` the first,
    and `rtui --resume` shows step 5/5 (not 20/5)."""
    from tests.conftest import json_lines, run_rtui
    from training.protocol import METRIC_TAG

    first = run_rtui("up", "--yes", "--steps", "20", timeout=400)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    second = run_rtui("up", "--yes", "--steps", "5", "--json", timeout=300)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    events = json_lines(second.stdout)
    run_id = events[0]["data"]["run_id"]
    steps = [e["message"] for e in events if e["step"] == "train" and e["kind"] == "progress"
             and e["message"].startswith("step")]
    assert steps and steps[-1].startswith("step 5/5") and not any("step 20" in s for s in steps), steps
    status = json_lines(run_rtui("status", "--json", check=True).stdout)[0]
    assert status["job"]["submission_id"] == f"rtui-{run_id}-2" and status["job"]["status"] == "SUCCEEDED"
    assert status["last_metric"]["step"] == 5 and status["summary"]["steps"] == 5
    assert run_rtui("logs", check=True).stdout.count(METRIC_TAG) == 5
    assert run_rtui("logs", "--job", "1", check=True).stdout.count(METRIC_TAG) == 20

    env = f"RTUI_STATE_DIR={tmp_path}/state RTUI_CONFIG_DIR={tmp_path}/cfg TERM=xterm-256color"
    terminal.run("new-session", "-d", "-s", "resumed", "-x", "120", "-y", "40",
                 f"cd {tmp_path} && env {env} {RTUI} --resume; echo RESUMED-EXIT=$?; sleep 300")
    screen = terminal.wait_for("resumed", "step 5/5", timeout=60)
    assert "step 20/5" not in screen
    terminal.run("send-keys", "-t", "resumed", "q")
    try:
        terminal.wait_for("resumed", "RESUMED-EXIT=0", timeout=5)
    except AssertionError:  # the cluster stays up: the detach question first
        terminal.run("send-keys", "-t", "resumed", "y")
        terminal.wait_for("resumed", "RESUMED-EXIT=0", timeout=30)
    down = run_rtui("down", run_id, "--yes", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
