"""`?`/`f1` at 80×24: the help lists every named key of the screen below with what it does, whole
(wrapped, never cut), inside the terminal; the footer shows each screen's primary action."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from screens.run import RunScreen
from tests.pilot_wait import wait_for
from tests.test_tui import fixed_session
from tests.test_tui_dashboard import DashboardApp, dashboard_session, settle
from tui.app import RtuiApp
from tui.help import HelpScreen, key_rows

# Local runs fed 2-node GPU lines: see tests.conftest.job_of_unknown_size.
pytestmark = pytest.mark.usefixtures("job_of_unknown_size")

SIZE = (80, 24)
_FRAME = re.compile(r"[█▀▄▌▐▊▎▏│╭╮╰╯─]")


def screen_text(pilot: Pilot[None]) -> str:
    """What the terminal shows, as one line of words: borders dropped, wrapped lines joined."""
    strips = pilot.app.screen._compositor.render_strips()
    return " ".join(_FRAME.sub(" ", " ".join(strip.text for strip in strips)).split())


def footer_text(pilot: Pilot[None]) -> str:
    return pilot.app.screen._compositor.render_strips()[-1].text  # the bottom row


async def check_help(pilot: Pilot[None], primary: str) -> None:
    app = pilot.app
    below = app.screen
    await wait_for(pilot, lambda: primary in footer_text(pilot), 5,
                   lambda: f"{primary!r} in the footer of {type(below).__name__}: {footer_text(pilot)!r}")
    rows = key_rows(below)
    named = {b.description for _key, b in ((k, a.binding) for k, a in below.active_bindings.items()) if b.id}
    assert {r.name for r in rows} == named and primary in named
    await pilot.press("question_mark")
    await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), 5, "the help")
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()  # the help laid out and the app idle (waits on idle, not a fixed time)
    help_box = app.screen.query_one("#help")
    assert help_box.region.right <= SIZE[0] and help_box.region.bottom <= SIZE[1], help_box.region
    table = app.screen.query_one("#help-table", Static)
    scroller = app.screen.query_one("#help-keys")
    assert table.region.height <= scroller.region.height, "rows hidden below the fold at 80×24"
    shown = screen_text(pilot)
    for row in rows:
        assert row.name in shown and " ".join(row.what.split()) in shown, (row, shown)
    await pilot.press("question_mark")
    await wait_for(pilot, lambda: app.screen is below, 5, "the help to close")


async def test_help_and_footer_on_the_local_screens_at_80x24(isolated_env: Path) -> None:
    app = RtuiApp(fixed_session())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen"
                       and getattr(app.screen, "checks", None) is not None, 15, "the checks")
        await check_help(pilot, "Review plan")
        await pilot.press("enter")
        await wait_for(pilot, lambda: getattr(app.screen, "plan", None) is not None, 15, "the plan")
        await check_help(pilot, "Apply")


async def test_help_on_the_run_dashboard_at_80x24(isolated_env: Path) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), 5, "run screen")
        await settle(pilot)
        await check_help(pilot, "Tear down")
        await pilot.press("f1")  # f1 opens it too, and escape closes it
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), 5, "the help")
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), 5, "the dashboard")
