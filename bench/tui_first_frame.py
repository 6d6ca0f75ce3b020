"""Time to the first interactive frame: `rtui` against a hello-world Textual app, same script.

    .venv/bin/python bench/tui_first_frame.py [--reps 5]

Each program runs in a pseudo-terminal (80×24) from process start until its first screen's text
is on the terminal (rtui: the target question; hello: its label), then gets `q`/ctrl+q. Runs
alternate; the medians and their ratio are printed (the issue's goal: <= 1.5).

With ``--floor``, a third program is timed too: the hello-world app started only after what rtui
does before its App exists (the command line parsed, the configuration resolved and validated, the
run's session made: pydantic and the backend's models). Its ratio is the floor no TUI change can
go below; rtui's ratio minus it is what the App and its first screen cost. A fourth program, the
hello-world app after only ``import backend.config`` (pydantic and the RunConfig model), shows how
much of that floor is pydantic's: what any first frame that validates the configuration with
pydantic before it draws pays.

Both run as a user starts them the second time: Python writes bytecode (a PYTHONDONTWRITEBYTECODE
in this environment is dropped for the children) and one unmeasured run of each comes first, so
neither pays for compiling its sources or a cold page cache.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import pty
import select
import statistics
import struct
import sys
import tempfile
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELLO = """
from textual.app import App
from textual.widgets import Footer, Header, Label

class Hello(App):
    BINDINGS = [("q", "quit", "Quit")]

    def compose(self):
        yield Header()
        yield Label("Hello, first frame")
        yield Footer()

Hello().run()
"""
# What `rtui` does before its App is made (tui.cli._wizard), then the same hello-world app.
BEFORE_APP = """
import tui.cli
tui.cli.wizard_session(tui.cli.build_parser().parse_args([]))
"""
# Only the configuration's model (pydantic, RunConfig), then the same hello-world app.
BEFORE_CONFIG = """
import backend.config
"""


def first_frame(argv: list[str], marker: bytes, env: dict[str, str], timeout: float = 60.0) -> float:
    started = time.perf_counter()
    pid, fd = pty.fork()
    if pid == 0:  # the child: the program, on the pty
        os.execve(argv[0], argv, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    seen = b""
    try:
        while marker not in seen.replace(b"\x1b", b""):
            if time.perf_counter() - started > timeout:
                raise SystemExit(f"{argv}: no first frame after {timeout}s")
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    break
            # Textual draws runs of text between cursor moves: look at the words, not the escapes.
            seen = seen[-200_000:]
        elapsed = time.perf_counter() - started
        os.write(fd, b"q")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            select.select([fd], [], [], 0.05)
            with contextlib.suppress(OSError):
                os.read(fd, 65536)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        return elapsed
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--floor", action="store_true",
                        help="also time the hello-world app after rtui's pre-App work (config, session)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rtui-first-frame-") as tmp:
        hello = Path(tmp) / "hello.py"
        hello.write_text(HELLO)
        floor = Path(tmp) / "floor.py"
        floor.write_text(BEFORE_APP + HELLO)
        config_floor = Path(tmp) / "config_floor.py"
        config_floor.write_text(BEFORE_CONFIG + HELLO)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env |= {"TERM": "xterm-256color", "RTUI_STATE_DIR": f"{tmp}/state", "RTUI_CONFIG_DIR": f"{tmp}/cfg",
                "COLUMNS": "80", "LINES": "24"}
        rtui = str(Path(sys.executable).with_name("rtui"))
        programs = {"hello": ([sys.executable, str(hello)], b"Hello, first frame"),
                    "rtui": ([rtui], b"Where should this run go")}
        if args.floor:  # the repository on the path, as rtui's own entry point has it
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
            programs["floor"] = ([sys.executable, str(floor)], b"Hello, first frame")
            programs["config"] = ([sys.executable, str(config_floor)], b"Hello, first frame")
        times: dict[str, list[float]] = {name: [] for name in programs}
        for argv, marker in programs.values():  # warm-up, not counted
            first_frame(argv, marker, env)
        for _ in range(args.reps):
            for name, (argv, marker) in programs.items():
                times[name].append(first_frame(argv, marker, env))
    hello_s, rtui_s = statistics.median(times["hello"]), statistics.median(times["rtui"])
    print(f"hello-world Textual app: {hello_s * 1000:.0f} ms; rtui: {rtui_s * 1000:.0f} ms "
          f"(medians of {args.reps}): ratio {rtui_s / hello_s:.2f}")
    if args.floor:
        floor_s = statistics.median(times["floor"])
        print(f"hello-world app after rtui's pre-App work (command line, config, session): {floor_s * 1000:.0f} ms: "
              f"ratio {floor_s / hello_s:.2f} (the floor below the TUI)")
        config_s = statistics.median(times["config"])
        print(f"hello-world app after only the config model (pydantic, RunConfig): {config_s * 1000:.0f} ms: "
              f"ratio {config_s / hello_s:.2f} (what validating with pydantic before the first frame costs)")


if __name__ == "__main__":
    main()
