"""A provisioning step's pane: a moving counter is one line, a done step keeps its outcome, a failure
shows its cause and remedy; the elapsed time and ETA are never cut."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Label, Static

from backend.resources import EventKind, StepEvent
from tests.pilot_wait import wait_for
from tui.widgets import StepPane

T0 = 1_767_225_600.0


class PaneApp(App[None]):
    CSS_PATH = "../tui/rtui.tcss"

    def compose(self) -> ComposeResult:
        yield StepPane("local.ray-head", "Start the Ray head", 20.0, clock=lambda: T0 + 3.2)


def message(app: App[None]) -> str:
    return str(app.query_one("#step-message", Static).render())


async def test_counters_collapse_done_keeps_its_outcome_and_the_eta_fits() -> None:
    app = PaneApp()
    async with app.run_test(size=(80, 12)) as pilot:
        pane = app.query_one(StepPane)
        pane.apply_event(StepEvent(step=pane.step_id, kind=EventKind.STARTED, ts=T0))
        for second in (1, 2, 3):
            pane.apply_event(StepEvent(step=pane.step_id, kind=EventKind.PROGRESS, ts=T0 + second,
                                       message=f"waiting for the dashboard ({second}s)"))
        pane.apply_event(StepEvent(step=pane.step_id, kind=EventKind.PROGRESS, ts=T0 + 3,
                                   message="starting 2 workers"))
        await wait_for(pilot, lambda: message(app).splitlines() == ["waiting for the dashboard (3s)",
                                                                     "starting 2 workers"], 5, lambda: message(app))
        label = app.query_one("#step-elapsed", Label)
        assert str(label.render()).strip() == "3.2s · ~17s left"
        # Whole on screen: the label grows with its text (at the next layout).
        await wait_for(pilot, lambda: label.region.width >= len("3.2s · ~17s left"), 5, lambda: str(label.region))
        pane.apply_event(StepEvent(step=pane.step_id, kind=EventKind.DONE, ts=T0 + 4.5,
                                   message="dashboard up at http://127.0.0.1:8265"))
        await wait_for(pilot, lambda: message(app) == "dashboard up at http://127.0.0.1:8265", 5, lambda: message(app))
        assert str(app.query_one("#step-elapsed", Label).render()).strip() == "4.5s"


async def test_a_failure_replaces_the_chatter_with_cause_and_remedy() -> None:
    app = PaneApp()
    async with app.run_test(size=(80, 12)) as pilot:
        pane = app.query_one(StepPane)
        pane.apply_event(StepEvent(step=pane.step_id, kind=EventKind.STARTED, ts=T0))
        pane.apply_event(StepEvent(step=pane.step_id, kind=EventKind.PROGRESS, ts=T0 + 1, message="trying"))
        pane.apply_event(StepEvent(step=pane.step_id, kind=EventKind.FAILED, ts=T0 + 2, message="port 6379 taken",
                                   remedy="set --ray-port"))
        await wait_for(pilot, lambda: message(app).splitlines() == ["port 6379 taken", "→ set --ray-port"], 5,
                       lambda: message(app))
        assert pane.has_class("-failed")
