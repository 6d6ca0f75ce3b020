"""A following log tail keeps its newest line in view when its view changes height (issue 37).

The run screen's tail shrank by a row after the first refresh (a line above it grew) and, following,
stayed a row short of its end: which frame a snapshot caught then depended on the machine's speed.
Only a change of width re-wraps and rebuilds the view (``LogTail.on_resize``); a change of height
alone must still scroll a following view to its end, and leave a paused one where the reader is.
"""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widgets import Static

from tests.pilot_wait import wait_for
from tui.logtail import LogTail

LINES = [f"line {i}" for i in range(200)]


class Harness(App[None]):
    CSS = "#above { height: 1; }"

    def compose(self) -> ComposeResult:
        yield Static("a line above the tail", id="above")
        yield LogTail(id="tail")


async def filled(pilot: Pilot[None]) -> LogTail:
    tail = pilot.app.query_one(LogTail)
    tail.push(LINES)
    await wait_for(pilot, lambda: tail.total == len(LINES), 5, "the lines drained")
    await pilot.pause()
    return tail


async def shorten(pilot: Pilot[None], tail: LogTail) -> None:
    """The line above grows by two rows: the tail's view loses two, at the same width."""
    rows = tail.log_view.scrollable_content_region.height
    pilot.app.query_one("#above", Static).styles.height = 3
    await wait_for(pilot, lambda: tail.log_view.scrollable_content_region.height == rows - 2, 5,
                   "the shorter view laid out")
    await pilot.pause()


async def test_a_following_tail_stays_at_its_end_when_its_view_gets_shorter() -> None:
    async with Harness().run_test(size=(80, 24)) as pilot:
        tail = await filled(pilot)
        assert tail.following and tail.log_view.is_vertical_scroll_end
        await shorten(pilot, tail)
        assert tail.following
        assert tail.log_view.is_vertical_scroll_end, (tail.log_view.scroll_y, tail.log_view.max_scroll_y)


async def test_a_paused_tail_stays_where_the_reader_is_when_its_view_gets_shorter() -> None:
    async with Harness().run_test(size=(80, 24)) as pilot:
        tail = await filled(pilot)
        tail.log_view.scroll_to(y=50, animate=False, immediate=True)
        await wait_for(pilot, lambda: not tail.following, 5, "scrolling up to pause the tail")
        await shorten(pilot, tail)
        assert not tail.following and tail.log_view.scroll_y == 50
