"""Time to first interactive frame: `rtui` vs a hello-world Textual app, in a real terminal.

Each program is started in a fresh tmux pane; the clock runs from the launch until its
first screen's text is visible in `tmux capture-pane`. Median of N runs each, same script.
Run: .venv/bin/python bench/first_frame.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HELLO = '''
from textual.app import App
from textual.widgets import Footer, Header, Static
class Hello(App):
    def compose(self):
        yield Header()
        yield Static("Hello, first frame")
        yield Footer()
Hello().run()
'''


SOCKET = f"rtui-bench-{os.getpid()}"


def tmux(*args: str, check: bool = False) -> str:
    # A private server, kept alive by a parked session, so no run races a server shutting down.
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, check=check).stdout


def time_to_text(command: str, needle: str, env: dict[str, str], timeout: float = 30.0) -> float:
    session = f"ff{os.getpid()}{time.monotonic_ns() % 100000}"
    env_prefix = " ".join(f"{k}={v}" for k, v in env.items())
    start = time.perf_counter()
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "40", f"env {env_prefix} {command}", check=True)
    try:
        while time.perf_counter() - start < timeout:
            if needle in tmux("capture-pane", "-p", "-t", session):
                return time.perf_counter() - start
            time.sleep(0.005)
        raise RuntimeError(f"{needle!r} did not appear within {timeout}s")
    finally:
        tmux("kill-session", "-t", session)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    bindir = Path(sys.executable).parent
    tmux("new-session", "-d", "-s", "parked", "sleep 600", check=True)
    socket = tmux("display-message", "-p", "#{socket_path}").strip()
    try:
        measure(bindir, args.runs)
    finally:
        tmux("kill-server")
        if socket:  # tmux 3.3 leaves its socket file (/tmp/tmux-<uid>/<name>) behind when killed
            Path(socket).unlink(missing_ok=True)


def measure(bindir: Path, runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        hello = Path(tmp) / "hello.py"
        hello.write_text(HELLO)
        env = {"RTUI_STATE_DIR": f"{tmp}/state", "RTUI_CONFIG_DIR": f"{tmp}/cfg", "TERM": "xterm-256color"}
        # Warm the page cache once for both, so neither pays a cold disk.
        time_to_text(f"{sys.executable} {hello}", "Hello, first frame", env)
        time_to_text(f"{bindir}/rtui", "Where should this run go?", env)
        hello_times, rtui_times = [], []
        for _ in range(runs):
            hello_times.append(time_to_text(f"{sys.executable} {hello}", "Hello, first frame", env))
            rtui_times.append(time_to_text(f"{bindir}/rtui", "Where should this run go?", env))
    h, r = statistics.median(hello_times), statistics.median(rtui_times)
    print(f"hello-world Textual: median {h * 1000:.0f} ms over {runs} runs")
    print(f"rtui (local target): median {r * 1000:.0f} ms over {runs} runs")
    print(f"ratio rtui / hello: {r / h:.2f}x (goal <= 1.5x)")


if __name__ == "__main__":
    main()
