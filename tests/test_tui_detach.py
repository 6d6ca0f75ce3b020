"""Item 2 of issue 21: `q` while steps or a job run asks first, in a box that reads like the teardown box.

Centred, wrapped (no line cut at the box's edge), the exact `--resume` command on a line of its own,
and the footer showing the modal's own keys (y / n), not the screen's below. Pilot checks at 80x24
and 120x40, and SVG snapshots of both questions (steps running; a job running).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Footer, Label
from textual.widgets._footer import FooterKey

from backend.planner import PlanResult
from backend.resources import Action, Change, EventKind, StepEvent
from screens.confirm import ConfirmDetach
from screens.provision import ProvisionScreen
from screens.run import RunScreen
from tests.pilot_wait import screen_text as rendered_lines
from tests.pilot_wait import wait_for
from tests.snap import SnapCompare
from tests.test_tui import FIXED_RUN_ID, fixed_session
from tests.test_tui_dashboard import DashboardApp, dashboard_session, settle
from tui.app import RtuiApp

# Local runs fed 2-node GPU lines: see tests.conftest.job_of_unknown_size.
pytestmark = pytest.mark.usefixtures("job_of_unknown_size")

SIZES = pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
RESUME = f"rtui --resume {FIXED_RUN_ID}"


class StepsRunningApp(RtuiApp):
    """The real app with a provisioning screen whose first step never ends."""

    def on_mount(self) -> None:
        session = self.session
        plan = PlanResult(target="local", changes=[
            Change(address="local.ray-head", layer="local-ray", kind="ray-head", action=Action.CREATE),
            Change(address="ray.job.train", layer="ray-job", kind="ray-job", action=Action.CREATE)])

        async def slow_apply(plan: PlanResult, *, until: str | None = None) -> AsyncIterator[StepEvent]:
            yield StepEvent(step="local.ray-head", kind=EventKind.STARTED, message="Start the Ray head", ts=0.0)
            await asyncio.sleep(60)  # models time: a step that outlasts the test (it is never awaited to its end)

        session.apply = slow_apply
        self.push_screen(ProvisionScreen(plan, clock=lambda: 0.0))


async def ask_on_provision(pilot: Pilot[None]) -> None:
    await wait_for(pilot, lambda: pilot.app.screen.query("StepPane"), 5, "panes")
    await pilot.press("q")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmDetach), 5, "the detach question")
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()  # the modal laid out and the app idle (waits on idle, not a fixed time)


async def ask_on_run(pilot: Pilot[None]) -> None:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, RunScreen), 5, "run screen")
    await settle(pilot)
    pilot.app.screen.post_message(RunScreen.JobStatusChanged("RUNNING", ""))
    await wait_for(pilot, lambda: getattr(pilot.app.screen, "job_status", "") == "RUNNING", 5, "RUNNING")
    await pilot.press("q")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmDetach), 5, "the detach question")
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()  # the modal laid out and the app idle (waits on idle, not a fixed time)


def check_whole(pilot: Pilot[None], size: tuple[int, int]) -> None:
    modal = pilot.app.screen
    assert isinstance(modal, ConfirmDetach)
    box = modal.query_one("#confirm")
    width, height = size
    # Centred like the teardown box: equal margins left and right (±1), and not pinned to the top.
    left, right = box.region.x, width - box.region.right
    assert abs(left - right) <= 1 and left > 0, (box.region, size)
    assert box.region.y > 0 and box.region.bottom < height
    # Every label is whole: as tall as its wrapped text, inside the box.
    for label in modal.query(Label):
        assert label.region.right <= box.region.right and label.region.height >= 1, label
        assert label.region.height == label.get_content_height(label.size, label.size, label.size.width), label
    lines = rendered_lines(pilot)
    assert any(RESUME in line for line in lines), "\n".join(lines)  # the exact command, on one line
    # The footer is the modal's own: y and n, nothing of the screen below.
    footers = list(modal.query(Footer))
    assert footers and footers[0].region.y == height - 1
    keys = {key.description for key in footers[0].query(FooterKey)}
    assert {"Detach", "Stay"} <= keys and not keys & {"Follow", "Retry", "Filter", "Tear down"}, keys


@SIZES
async def test_detach_question_while_steps_run_is_whole(isolated_env: Path, size: tuple[int, int]) -> None:
    app = StepsRunningApp(fixed_session())
    async with app.run_test(size=size) as pilot:
        await ask_on_provision(pilot)
        assert "Steps are still running." in "\n".join(rendered_lines(pilot))
        check_whole(pilot, size)
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, ProvisionScreen), 5, "back to the steps")


@SIZES
async def test_detach_question_while_the_job_runs_is_whole(isolated_env: Path, size: tuple[int, int]) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=size) as pilot:
        await ask_on_run(pilot)
        assert "The job is still running." in "\n".join(rendered_lines(pilot))
        check_whole(pilot, size)


@SIZES
def test_detach_steps_snapshot(snap_compare: SnapCompare, isolated_env: Path, size: tuple[int, int]) -> None:
    assert snap_compare(StepsRunningApp(fixed_session()), run_before=ask_on_provision, terminal_size=size)


@SIZES
def test_detach_job_snapshot(snap_compare: SnapCompare, isolated_env: Path, size: tuple[int, int]) -> None:
    assert snap_compare(DashboardApp(dashboard_session(), resume=True), run_before=ask_on_run, terminal_size=size)
