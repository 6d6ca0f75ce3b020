"""A failed worker becomes one notification, in one place (issue 24 item 5): never a traceback, never an exit.

Screens declare their workers with ``exit_on_error=False`` and let exceptions out; ``RtuiScreen`` turns the
worker's ERROR state into the app's one-line error notification (``RtuiApp.report_error``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from textual import work
from textual.app import ComposeResult
from textual.notifications import Notification
from textual.widgets import Footer, Static

from backend.errors import OperationError
from backend.planner import PlanResult
from screens.plan import PlanScreen
from tests.pilot_wait import wait_for
from tests.test_tui import fixed_session
from tests.test_tui_plan import PlanApp
from tui.app import RtuiApp
from tui.screen import RtuiScreen

REPO = Path(__file__).resolve().parents[1]


class FailingScreen(RtuiScreen):
    """A screen whose worker raises once it is mounted, as any screen's worker may."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    def compose(self) -> ComposeResult:
        yield Static("a screen with a failing worker")
        yield Footer()

    def on_mount(self) -> None:
        self.fail()

    @work(exclusive=True, group="failing", exit_on_error=False)
    async def fail(self) -> None:
        raise self.error


class FailingApp(RtuiApp):
    def __init__(self, error: BaseException) -> None:
        super().__init__(fixed_session())
        self.error = error

    def get_default_screen(self) -> FailingScreen:
        return FailingScreen(self.error)


def errors(app: RtuiApp) -> list[Notification]:
    return [n for n in app._notifications if n.severity == "error"]


@pytest.mark.parametrize(("error", "line"), [
    (OperationError("the API server refused the call", remedy="check the cluster"),
     "the API server refused the call — check the cluster"),
    # Not one of ours: its type says what it is, and its lines become one.
    (RuntimeError("first line\n  second line"), "RuntimeError: first line second line"),
])
async def test_a_worker_that_raises_shows_one_notification_and_no_traceback(
        isolated_env: Path, capfd: pytest.CaptureFixture[str], error: BaseException, line: str) -> None:
    app = FailingApp(error)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: bool(errors(app)), 5, "the error notification")
        screen = app.screen
        assert isinstance(screen, FailingScreen)  # the app goes on, on its screen
        await pilot.pause()
        assert [n.message for n in errors(app)] == [line]  # once
        assert app.is_running
    assert app.return_code in (None, 0)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "first line" not in err


async def test_a_plan_that_fails_is_said_once_and_the_screen_stays(
        isolated_env: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Through a real screen: the plan screen's worker lets the failure out; the app says it once."""
    session = fixed_session()

    async def failing_plan() -> PlanResult:
        raise OperationError("the Ray head did not answer", remedy="see `rtui status`")

    monkeypatch.setattr(session, "plan", failing_plan)
    app = PlanApp(session)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: bool(errors(app)), 5, "the error notification")
        assert [n.message for n in errors(app)] == ["the Ray head did not answer — see `rtui status`"]
        screen = app.screen
        assert isinstance(screen, PlanScreen) and screen.plan is None
        assert screen.check_action("apply", ()) is False  # nothing to apply: hidden
    assert "Traceback" not in "".join(capfd.readouterr())


# Where workers run: the screens, the app and its widgets, and the targets' first-screen panels.
UI_FILES = ("tui/*.py", "screens/*.py", "targets/*/panel.py")


def _ui_files() -> list[Path]:
    return sorted(path for pattern in UI_FILES for path in REPO.glob(pattern))


def _work_calls() -> list[tuple[str, int, ast.Call]]:
    found = []
    for path in _ui_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                    "work", "run_worker"):
                found.append((str(path.relative_to(REPO)), node.lineno, node))
    return found


def test_every_worker_lets_its_failure_reach_the_one_place() -> None:
    """A worker made with Textual's default (exit_on_error=True) would end the app with a traceback; one that
    catches and reports by itself is a second place. Neither is left in tui/, screens/ or a target's panel."""
    calls = _work_calls()
    assert calls, "no workers found: the scan is broken"
    exiting = [f"{path}:{line}" for path, line, call in calls
               if not any(k.arg == "exit_on_error" and isinstance(k.value, ast.Constant) and k.value.value is False
                          for k in call.keywords)]
    assert not exiting, f"workers that would exit the app on an error: {exiting}"
    reporting = [f"{path.relative_to(REPO)}:{n.lineno}" for path in _ui_files()
                 if path.parts[-2] != "tui"  # the app (which says it) and the base screen (which asks it to)
                 for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Attribute) and n.attr == "report_error"]
    catching = [f"{path.relative_to(REPO)}:{n.lineno}" for path in _ui_files()
                for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.ExceptHandler) and n.type is not None and ast.unparse(n.type) == "Exception"]
    assert not catching, f"except Exception in the UI (a failure it hides from the one place): {catching}"
    assert not reporting, f"screens that report errors themselves: {reporting}"
