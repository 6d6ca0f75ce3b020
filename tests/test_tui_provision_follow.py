"""Issue 40 item 3: with many steps, the provisioning view keeps the running ones in view (it stayed on the
finished ones, the running steps off-screen until End), unless the reader scrolled up to look back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
from textual.containers import VerticalScroll
from textual.widgets import Label

from backend.planner import PlanResult
from backend.resources import Action, Change, EventKind, StepEvent
from backend.runner import Progress, Step
from screens.provision import ProvisionScreen
from tests.pilot_wait import wait_for
from tests.test_tui import fixed_session
from tui.app import RtuiApp
from tui.widgets import StepPane

STEPS = [f"k8s.step-{i:02d}" for i in range(45)]
DONE, RUNNING = 30, 3


async def _noop() -> AsyncIterator[Progress]:
    """The outline's steps are never run here: the events come from the scripted apply."""
    return
    yield


class ManyStepsApp(RtuiApp):
    """The real app on a provisioning screen of 45 steps: 30 done, 3 running that never end."""

    def on_mount(self) -> None:
        plan = PlanResult(target="kube", changes=[
            Change(address=s, layer="kube", kind="k", action=Action.CREATE) for s in STEPS])
        self.gate = asyncio.Event()

        async def apply(plan: PlanResult, *, until: str | None = None) -> AsyncIterator[StepEvent]:
            for step in STEPS[:DONE]:
                yield StepEvent(step=step, kind=EventKind.STARTED, message="working", ts=0.0)
                yield StepEvent(step=step, kind=EventKind.DONE, message="made", ts=1.0)
            for step in STEPS[DONE:DONE + RUNNING]:
                yield StepEvent(step=step, kind=EventKind.STARTED, message="working", ts=2.0)
            await self.gate.wait()  # the running steps outlast the test

        self.session.apply = apply
        outline = [Step(id=s, title=f"Make {s}", action=_noop, expected_s=30.0) for s in STEPS]
        self.push_screen(ProvisionScreen(plan, outline=outline, clock=lambda: 3.0))


def whole(label: Label) -> bool:
    """The label shows a running step's ETA, and all of its text."""
    text = str(label.render())
    return "left" in text and label.region.width >= len(text)


def visible(pane: StepPane, box: VerticalScroll) -> bool:
    return box.region.y <= pane.region.y and pane.region.bottom <= box.region.bottom


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@pytest.mark.slow
async def test_the_running_steps_stay_in_view(isolated_env: Path, size: tuple[int, int]) -> None:
    app = ManyStepsApp(fixed_session(target="kube"))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ProvisionScreen), 5, "the provision screen")
        screen = app.screen
        assert isinstance(screen, ProvisionScreen)
        panes = {p.step_id: p for p in screen.query(StepPane)}
        await wait_for(pilot, lambda: panes[STEPS[DONE]].status == "running", 5, "the running steps")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
        box = screen.query_one("#steps", VerticalScroll)
        first = panes[STEPS[DONE]]
        await wait_for(pilot, lambda: visible(first, box), 5, lambda: f"{first.region} in {box.region}")
        # Each running pane's time and ETA whole ("Install the EFA device plugin 0.0s ·" was cut).
        for pane in (panes[s] for s in STEPS[DONE:DONE + RUNNING]):
            label = pane.query_one("#step-elapsed", Label)
            await wait_for(pilot, partial(whole, label), 5, partial(str, label.region))
        # The reader scrolls up to a finished step: a step starting then does not pull the view away.
        await pilot.press("home")
        await pilot.pause()
        top = box.scroll_y
        assert top == 0 and not screen.follow_running, "the reader is at the first step"
        app.screen.post_message(ProvisionScreen.StepEventPosted(
            StepEvent(step=STEPS[DONE + RUNNING], kind=EventKind.STARTED, message="working", ts=2.5)))
        await wait_for(pilot, lambda: panes[STEPS[DONE + RUNNING]].status == "running", 5, "one more running")
        await pilot.pause()
        assert box.scroll_y == top
        app.gate.set()
