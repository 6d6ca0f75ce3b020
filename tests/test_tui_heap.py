"""tui.heap: the wizard's modules load with the collector paused, then frozen out of every collection."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import tui.cli
from tests.conftest import REPO


def run_python(code: str) -> str:
    """``code`` in a Python process of its own, as rtui is (the collector's state is per process)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                          check=True).stdout


def test_what_loading_loaded_is_frozen_and_the_collector_runs_again() -> None:
    """In a process of its own, as rtui is: a full collection after the load walks only what came after."""
    code = ("import gc, json\n"
            "from tui.heap import loading\n"
            "with loading():\n"
            "    paused = not gc.isenabled()\n"
            "    import tui.app, screens.run\n"
            "print(json.dumps([paused, gc.isenabled(), gc.get_freeze_count(), len(gc.get_objects())]))\n")
    out = run_python(code)
    paused, enabled_after, frozen, tracked = json.loads(out)
    assert paused and enabled_after
    assert frozen > 20_000, frozen  # the wizard's modules: Textual, pydantic, the backend, the screens
    assert tracked < frozen / 10, (tracked, frozen)


def test_loading_leaves_a_paused_collector_paused() -> None:
    code = ("import gc\n"
            "from tui.heap import loading\n"
            "gc.disable()\n"
            "with loading():\n"
            "    import json\n"
            "print(gc.isenabled())\n")
    out = run_python(code)
    assert out.strip() == "False"


def test_the_wizard_loads_the_app_inside_loading(monkeypatch: pytest.MonkeyPatch, isolated_env: object) -> None:
    from tui.app import RtuiApp

    seen: list[str] = []

    @contextmanager
    def spy() -> Iterator[None]:
        seen.append("load")
        yield
        seen.append("loaded")

    monkeypatch.setattr(tui.cli, "loading", spy)
    monkeypatch.setattr(tui.cli, "_is_tty", lambda stream: True)
    monkeypatch.setattr(RtuiApp, "run", lambda self, *a, **k: seen.append("run"))
    assert tui.cli._wizard(tui.cli.build_parser().parse_args([])) == 0
    assert seen == ["load", "loaded", "run"]


def test_settle_freezes_only_where_loading_ran() -> None:
    code = ("import gc, json\n"
            "from tui import heap\n"
            "heap.settle()\n"
            "before = gc.get_freeze_count()\n"
            "with heap.loading():\n"
            "    pass\n"
            "import screens.run\n"
            "after_load = gc.get_freeze_count()\n"
            "heap.settle()\n"
            "print(json.dumps([before, after_load, gc.get_freeze_count()]))\n")
    out = run_python(code)
    before, after_load, settled = json.loads(out)
    assert before == 0  # a host process (pytest's) that never called loading() keeps its collector
    assert settled > after_load + 5_000  # the run screen's modules, loaded after, frozen by settle
