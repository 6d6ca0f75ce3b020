"""Item 7 of issue 21: layouts that fit, at 120x40 and 80x24.

The job log shows whole lines (wrapped, no horizontal scrollbar), its status line is never cut,
the local target has no greyed "Head pod" tab, the badge's `why` lines share one indentation,
at 80x24 `g` switches the log and the graph (named in the footer and the help), and the
palette's Quit says it tears nothing down. (The aws matrix and the target screen at 80x24 are
checked against moto in ``tests/aws/test_tui_target_aws.py``.)
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Footer, Log, TabbedContent
from textual.widgets._footer import FooterKey

from screens.run import HEAD_TAB, RunScreen
from tests.pilot_wait import screen_text, wait_for
from tests.snap import SnapCompare
from tests.test_tui_dashboard import (
    SOCKET_FALLBACK_LINES,
    DashboardApp,
    dashboard_session,
    feed,
    metric_lines,
    settle,
)
from tui.help import key_rows
from tui.logtail import LogTail
from tui.throughput import ThroughputGraph
from tui.transport_badge import TransportBadge

# Local runs fed 2-node GPU lines: see tests.conftest.job_of_unknown_size.
pytestmark = pytest.mark.usefixtures("job_of_unknown_size")

SIZES = pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
LONG = ("(RayTrainWorker pid=1000, ip=10.0.1.11) ip-10-0-1-11:1:8 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] "
        "[receive] via NET/Libfabric/0 end-of-line-marker")


async def dashboard(pilot: Pilot[None]) -> RunScreen:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, RunScreen), 5, "run screen")
    await settle(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, RunScreen)
    return screen


@SIZES
async def test_the_job_log_shows_whole_lines_without_a_horizontal_scrollbar(
        isolated_env: Path, size: tuple[int, int]) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=size) as pilot:
        screen = await dashboard(pilot)
        await feed(pilot, [LONG, "short line"])
        log = screen.query_one("#tail", LogTail).log_view
        width = log.scrollable_content_region.width
        assert all(len(line) <= width for line in log.lines), (width, log.lines)
        assert log.max_scroll_x == 0 and not log.show_horizontal_scrollbar
        text = "\n".join(screen_text(pilot))
        assert "end-of-line-marker" in text and "short line" in text


@SIZES
async def test_the_log_status_line_is_never_cut(isolated_env: Path, size: tuple[int, int]) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=size) as pilot:
        screen = await dashboard(pilot)
        tail = screen.query_one("#tail", LogTail)
        await feed(pilot, [f"line {i}" for i in range(200)])
        tail.following = False
        await feed(pilot, [f"later {i}" for i in range(7)])
        status = tail.status_text
        assert "+7 new" in status and "End" in status
        label = tail.query_one(".log-status")
        assert label.region.right <= tail.region.right
        # Inside its pane: as many rows as it wraps to, none over the border below (issue 40 item 8).
        assert label.region.height >= -(-len(status) // label.content_region.width), (label.region, status)
        assert label.region.bottom <= tail.region.bottom, (label.region, tail.region)
        shown = " ".join(strip.text for strip in label.render_lines(label.region.reset_offset))
        # Every word of the status line is on screen, in order (wrapped if it must, never cut).
        assert " ".join(status.split()) == " ".join(shown.split()), (status, shown)


async def test_local_has_no_head_pod_tab(isolated_env: Path) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard(pilot)
        tabs = screen.query_one(TabbedContent)
        assert tabs.tab_count == 1 and not tabs.query(f"#{HEAD_TAB}")
        assert "Head pod" not in "\n".join(screen_text(pilot))


async def test_the_why_lines_share_one_indentation(isolated_env: Path) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await dashboard(pilot)
        await feed(pilot, [*SOCKET_FALLBACK_LINES, *metric_lines(1, 3)])
        await pilot.press("t")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()  # the toggle handled and laid out: the app idle, not a fixed time
        badge = screen.query_one(TransportBadge)
        lines = [strip.text.rstrip() for strip in badge.render_lines(badge.region.reset_offset)]
        lines = lines[next(i for i, x in enumerate(lines) if x.lstrip().startswith("why:")):]  # after the badge
        entries = [x for x in lines if x.lstrip().startswith(("why:", "evidence:", "warning:"))]
        rest = [x for x in lines if x and x not in entries]
        assert len(entries) >= 3 and rest, lines  # some entries wrap at 80 columns
        entry_indent = {len(x) - len(x.lstrip()) for x in entries}
        rest_indent = {len(x) - len(x.lstrip()) for x in rest}
        assert len(entry_indent) == 1 and len(rest_indent) == 1, lines
        assert rest_indent.pop() > entry_indent.pop(), lines  # a wrapped entry hangs under its text


async def test_at_80x24_g_switches_between_the_log_and_the_graph(isolated_env: Path) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await dashboard(pilot)
        await feed(pilot, metric_lines(1, 12))
        graph, tails = screen.query_one(ThroughputGraph), screen.query_one("#tails")
        assert not graph.display and tails.display
        footer = {key.key_display: key.description for key in screen.query_one(Footer).query(FooterKey)}
        assert footer.get("g") == "Graph/log", footer
        assert any(row.keys == "g" and "graph" in row.name.lower() for row in key_rows(screen)), key_rows(screen)
        await pilot.press("g")
        await wait_for(pilot, lambda: graph.display and graph.region.width >= 70 and graph.region.height >= 10, 5,
                       lambda: f"the graph at full size (at {graph.region})")
        assert not tails.display
        shown = {key.key_display for key in screen.query_one(Footer).query(FooterKey)}
        assert "g" in shown and not shown & {"f", "/"}, shown  # the log's keys go with it
        await pilot.press("g")
        await wait_for(pilot, lambda: not graph.display and tails.display, 5, "the log back")
        assert screen.focused is screen.query_one("#tail", LogTail).log_view


async def test_at_120x40_g_gives_the_log_the_whole_width(isolated_env: Path) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard(pilot)
        graph, log = screen.query_one(ThroughputGraph), screen.query_one("#tail", LogTail).query_one(Log)
        assert graph.display and log.region.width < 80
        await pilot.press("g")
        await wait_for(pilot, lambda: not graph.display and log.region.width >= 118, 5,
                       lambda: f"the log at full width (at {log.region})")


async def test_the_palette_quit_says_it_tears_nothing_down(isolated_env: Path) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard(pilot)
        quits = [c for c in app.get_system_commands(screen) if c.title.startswith("Quit")]
        assert len(quits) == 1 and "tears nothing down" in quits[0].help, quits
        quit_command = quits[0].callback  # the q binding's action, as the palette runs it
        assert isinstance(quit_command, partial) and quit_command.args[0] == "quit_detach"


def test_graph_view_80x24_snapshot(snap_compare: SnapCompare, isolated_env: Path) -> None:
    async def graph(pilot: Pilot[None]) -> None:
        await dashboard(pilot)
        await feed(pilot, [*SOCKET_FALLBACK_LINES, *metric_lines(1, 24, tokens=1900.0, step_time=4.1)])
        await pilot.press("g")
        await pilot.wait_for_scheduled_animations()

    assert snap_compare(DashboardApp(dashboard_session(), resume=True), run_before=graph, terminal_size=(80, 24))


@SIZES
async def test_the_why_text_takes_the_whole_width_and_leaves_the_body_room(isolated_env: Path,
                                                                            size: tuple[int, int]) -> None:
    """Issue 40 item 8: at 80 columns `t` wrapped the why at ~45 columns (beside the sparkline) and squeezed
    the graph to one axis line. The why now takes the row's whole width; the sparkline comes back with `t`."""
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=size) as pilot:
        screen = await dashboard(pilot)
        await feed(pilot, [*SOCKET_FALLBACK_LINES, *metric_lines(1, 3)])
        await pilot.press("t")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
        badge, body = screen.query_one(TransportBadge), screen.query_one("#run-body")
        assert badge.region.width >= size[0] - 4, badge.region
        assert body.region.height >= 6, body.region
        await pilot.press("t")
        await pilot.pause()
        assert screen.query_one("#spark").display

