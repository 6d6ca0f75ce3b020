"""The real `rtui` binary in a real terminal (tmux): first screen renders, `q` exits 0."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RTUI

pytestmark = [pytest.mark.tmux,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


class Terminal:
    def __init__(self, socket: str) -> None:
        self.socket = socket

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              check=False).stdout

    def wait_for(self, session: str, needle: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.run("capture-pane", "-p", "-t", session)
            if needle in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} never appeared; screen was:\n{screen}")


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    term = Terminal(f"rtui-test-{os.getpid()}")
    term.run("new-session", "-d", "-s", "parked", "sleep 600")  # keeps the private server up
    yield term
    term.run("kill-server")


def test_first_screen_renders_and_q_exits_zero(terminal: Terminal, tmp_path: Path) -> None:
    exit_file = tmp_path / "exit"
    env = f"RTUI_STATE_DIR={tmp_path}/state RTUI_CONFIG_DIR={tmp_path}/cfg TERM=xterm-256color"
    terminal.run("new-session", "-d", "-s", "app", "-x", "110", "-y", "35",
                 f"cd {tmp_path} && env {env} {RTUI}; echo $? > {exit_file}; sleep 30")
    screen = terminal.wait_for("app", "Where should this run go?")
    assert "Local — a real Ray cluster on this machine" in screen
    terminal.wait_for("app", "Ray and PyTorch installed")  # the live preflight arrived
    terminal.run("send-keys", "-t", "app", "q")
    deadline = time.monotonic() + 15
    while not exit_file.exists() or not exit_file.read_text().strip():
        assert time.monotonic() < deadline, "rtui did not exit on q"
        time.sleep(0.1)
    assert exit_file.read_text().strip() == "0"
    assert not (tmp_path / "state").exists(), "quitting from the first screen leaves nothing behind"


def test_bad_flag_in_a_terminal_is_one_line(terminal: Terminal, tmp_path: Path) -> None:
    out = tmp_path / "out"
    terminal.run("new-session", "-d", "-s", "bad", "-x", "110", "-y", "10",
                 f"{RTUI} --target gcp 2> {out}; echo EXIT=$? >> {out}; sleep 30")
    deadline = time.monotonic() + 15
    while "EXIT=" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    lines = out.read_text().strip().splitlines()
    assert lines == ["rtui: invalid --target='gcp' (from flag): expected one of local, aws, kube", "EXIT=2"]
