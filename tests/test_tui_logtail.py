"""The dashboard's log tails: metric lines hidden, filter, follow/pause, live job status, the head pod tab.

Driven like ``test_tui_dashboard``: a saved run, lines posted as the follower would post them,
and for the live parts a fake Jobs API (``tests.test_follow``) or a fake head-log source.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import TabbedContent

from backend import follow
from backend.errors import OperationError
from backend.layers.base import Context, HeadLogSource
from backend.rayjobs import JobStatus
from backend.store import JobState
from screens.run import HEAD_TAB, JOB_TAB, RunScreen
from tests.pilot_wait import wait_for
from tests.test_follow import METRICS, FakeCluster, FakeJobs
from tests.test_tui_dashboard import DashboardApp, dashboard_session, feed, metric_lines, settle
from tui.logtail import LogTail

# Local runs fed 2-node GPU lines: see tests.conftest.job_of_unknown_size.
pytestmark = pytest.mark.usefixtures("job_of_unknown_size")

WORDS = ["alpha starting", "Beta warming up", "gamma ALPHA again", "delta done"]


async def dashboard(pilot: Pilot[None]) -> RunScreen:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, RunScreen), 5, "run screen")
    await settle(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, RunScreen)
    return screen


def job_tail(screen: RunScreen) -> LogTail:
    return screen.query_one("#tail", LogTail)


async def test_metric_lines_are_hidden_until_m(isolated_env: Path) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard(pilot)
        await feed(pilot, [*WORDS, *metric_lines(1, 3)])
        tail = job_tail(screen)
        assert tail.lines == WORDS
        assert "metric lines hidden (m)" in tail.status_text
        assert screen.metric is not None and screen.metric.step == 3, "hidden lines still feed the graph"
        await pilot.press("m")
        await pilot.pause()
        assert tail.lines[:4] == WORDS and sum("RTUI_METRIC" in line for line in tail.lines) == 3
        await pilot.press("m")
        await pilot.pause()
        assert tail.lines == WORDS


async def test_filter_narrows_counts_and_escape_clears(isolated_env: Path) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard(pilot)
        await feed(pilot, WORDS)
        tail = job_tail(screen)
        await pilot.press("slash", *"alpha")
        await pilot.pause()
        assert tail.lines == ["alpha starting", "gamma ALPHA again"]
        assert "filter: alpha (2 of 4 lines)" in tail.status_text
        await pilot.press("enter")  # keeps the filter; keys go to the screen again
        await feed(pilot, ["epsilon alpha late", "zeta"])
        assert tail.lines == ["alpha starting", "gamma ALPHA again", "epsilon alpha late"]
        assert "filter: alpha (3 of 6 lines)" in tail.status_text
        await pilot.press("slash", "escape")
        await pilot.pause()
        assert tail.lines == [*WORDS, "epsilon alpha late", "zeta"]
        assert "filter" not in tail.status_text


@pytest.mark.slow
async def test_scrolling_up_pauses_and_counts_then_end_resumes(isolated_env: Path) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard(pilot)
        tail = job_tail(screen)
        await feed(pilot, [f"line {i}" for i in range(200)])
        assert tail.following and tail.log_view.is_vertical_scroll_end
        assert screen.check_action("resume_follow", ()) is False, "End is offered only while paused"
        await pilot.press("pageup")
        await pilot.pause()
        assert not tail.following
        top = tail.log_view.scroll_y
        await feed(pilot, [f"new {i}" for i in range(7)])
        assert "+7 new lines" in tail.status_text
        assert tail.log_view.scroll_y == top and tail.lines[-1] == "line 199", "the paused view does not move"
        assert screen.check_action("resume_follow", ()) is True
        await pilot.press("end")
        await pilot.pause()
        assert tail.following and tail.lines[-1] == "new 6" and tail.log_view.is_vertical_scroll_end
        assert "following" in tail.status_text
        await pilot.press("f")
        assert not tail.following
        await pilot.press("f")
        assert tail.following


async def test_the_window_is_bounded_and_the_spool_keeps_everything(isolated_env: Path) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard(pilot)
        lines = [f"row {i}" for i in range(12_000)]
        await feed(pilot, lines)
        tail = job_tail(screen)
        assert len(tail.lines) == 10_000 and tail.lines[-1] == "row 11999"
        assert tail.total == 12_000 and tail.dropped == 0
        assert sum(1 for _ in screen.session.spool().iter_lines()) == 12_000


async def test_a_batch_beyond_the_window_costs_only_the_window(isolated_env: Path) -> None:
    """25k lines in one drain: the ring keeps 20k, of those only the newest 10k (the window) are
    cleaned and written, the rest are counted; the write starts no thread (Textual's Log starts one
    per write to measure widths, with the whole batch in its name)."""
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard(pilot)
        tail = job_tail(screen)
        tail.push([f"row {i}\x1b[0m" if i % 1000 == 0 else f"row {i}" for i in range(25_000)])
        before = {id(w) for w in app.workers}
        tail.drain()
        started = [w.name for w in app.workers if id(w) not in before]
        assert started == [], started
        assert tail.dropped == 5_000 and tail.total == 20_000
        assert len(tail.lines) == 10_000 and tail.lines[0] == "row 15000" and tail.lines[-1] == "row 24999"
        assert "row 24000" in tail.lines, "escapes are still cleaned where a batch has them"


class SteppedJobs(FakeJobs):
    """A job whose state is the one the test set last: it moves on only once the screen showed the one
    before, so no state can come and go between two looks however slow the machine.

    Its log stream ends only once the job has, as ``RayJobs.follow``'s does (it reconnects until the job
    ends): ended while the job ran, the follower stopped, and on a loaded machine (over a second between
    two of the test's looks) the screen kept showing RUNNING."""

    def __init__(self) -> None:
        super().__init__([METRICS], ["PENDING"], pause_s=1.0)
        self._state = JobState.PENDING
        self._ended = asyncio.Event()

    @property
    def state(self) -> JobState:
        return self._state

    @state.setter
    def state(self, value: JobState) -> None:
        self._state = value
        if value.terminal:
            self._ended.set()

    async def status(self, submission_id: str) -> JobStatus:
        return JobStatus(submission_id, self.state, self.message)

    async def follow(self, submission_id: str, *, skip_chars: int = 0,
                     ended: asyncio.Event | None = None) -> AsyncIterator[str]:
        async for chunk in super().follow(submission_id, skip_chars=skip_chars):
            yield chunk
        await self._ended.wait()


async def test_job_status_changes_show_as_they_happen(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "STATUS_EVERY_S", 0.05)
    session = dashboard_session()
    job = session.record.current_job
    assert job is not None
    job.status = JobState.PENDING
    jobs = SteppedJobs()
    session.ctx.cluster = FakeCluster(jobs)
    app = DashboardApp(session, resume=True)

    def shown() -> str:
        return str(app.screen.query_one("#job-status").render()).split()[-1]

    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), 5, "run screen")
        for state in (JobState.PENDING, JobState.RUNNING, JobState.SUCCEEDED):
            jobs.state = state

            def showing(want: str = state.value) -> bool:
                return shown() == want

            await wait_for(pilot, showing, 10, lambda: f"{jobs.state.value} to show (shows {shown()})")


async def test_a_read_only_watcher_sees_the_status_the_follower_saves(isolated_env: Path) -> None:
    """Another rtui follows the job: this one watches the spool and the saved record's status."""
    from backend import flows

    session = dashboard_session()
    job = session.record.current_job
    assert job is not None
    calls = iter([True, True, False])
    session.attached_elsewhere = lambda: next(calls)
    monkey_wait = flows.WATCH_EVERY_S
    flows.WATCH_EVERY_S = 0.01
    try:
        updates = []
        async for update in flows.watch_spool(session, 0):
            updates.append(update)
            job.status = JobState.SUCCEEDED
            session.store.save(session.record)
    finally:
        flows.WATCH_EVERY_S = monkey_wait
    assert [u.status.status for u in updates if u.status] == ["RUNNING", "SUCCEEDED"]


class FakeHead:
    """A kube-like cluster access: no Jobs API here, but a head pod whose log we can read."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.asked: list[str | None] = []

    async def jobs(self, ctx: Context) -> None:
        return None

    def job_env(self, ctx: Context) -> dict[str, str]:
        return {}

    def job_finished(self, ctx: Context) -> None:
        return None

    async def head_log(self, ctx: Context, *, since_time: str | None, follow: bool) -> AsyncIterator[str]:
        self.asked.append(since_time)
        for i, line in enumerate(self.lines):
            yield f"2026-01-01T00:00:{i:02d}Z {line}"


async def test_head_pod_tab_follows_the_head_log(isolated_env: Path) -> None:
    session = dashboard_session()
    head = FakeHead(["head starting", "\x1b[32mgcs up\x1b[0m", "dashboard on 8265"])
    assert isinstance(head, HeadLogSource)
    session.ctx.cluster = head
    app = DashboardApp(session, resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard(pilot)
        head_tail = screen.query_one("#head-tail", LogTail)
        await wait_for(pilot, lambda: len(head_tail.lines) == 3, 5, "head lines")
        assert head_tail.lines == ["head starting", "gcs up", "dashboard on 8265"]
        assert screen.check_action("switch_tail", ()) is True
        tabs = screen.query_one(TabbedContent)
        assert tabs.active == JOB_TAB
        await pilot.press("h")
        await pilot.pause()
        assert tabs.active == HEAD_TAB and screen.active_tail is head_tail
        await pilot.press("slash", *"gcs")
        await pilot.pause()
        assert head_tail.lines == ["gcs up"] and job_tail(screen).filter_text == ""
        assert head.asked == [None]
        spooled = Path(session.record.spool_path).with_suffix(".head.log").read_text().splitlines()
        assert spooled[0] == "2026-01-01T00:00:00Z head starting"


async def test_local_has_no_head_tab_to_switch_to(isolated_env: Path) -> None:
    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard(pilot)
        assert not screen.has_head and screen.check_action("switch_tail", ()) is False
        assert screen.query_one(TabbedContent).tab_count == 1  # no greyed tab (tests/test_tui_layout.py)
        await pilot.press("h")
        assert screen.query_one(TabbedContent).active == JOB_TAB


def test_every_binding_has_an_id_and_a_tooltip() -> None:
    for binding in RunScreen.BINDINGS:
        assert not isinstance(binding, tuple) and binding.id and binding.tooltip, binding


@pytest.mark.slow
async def test_a_two_second_flood_keeps_the_ui_responsive_and_the_spool_whole(isolated_env: Path) -> None:
    """bench/tui_flood.py for 2 s at up to 100k lines/s: nothing is lost from the spool, the view keeps its
    bounded window and accounts for every line, and memory stays bounded. How responsive the loop stays
    (lag p99) and its idle CPU are the bench's figures, reported by `python bench/tui_flood.py`, never
    asserted here: a loaded machine moves them (issue 37)."""
    from bench.tui_flood import flood

    result = await flood(100_000, 2.0, 1.0)
    assert result.lost == 0, result
    assert result.rss_growth_mib < 150, result
    # A full window means the flood passed it: the eviction and the ring's accounting were exercised.
    assert result.window_lines == 10_000 and result.shown_total + result.dropped_from_ring == result.produced


@pytest.mark.parametrize("head", [False, True], ids=["local", "with-a-head-pod"])
@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_resuming_a_finished_run_shows_its_last_lines_while_following(isolated_env: Path, size: tuple[int, int],
                                                                            head: bool) -> None:
    """Issue 40 item 2: `--resume` of a finished run said "122 lines · … · following" while its last lines
    ("rtui-train: done") were below the fold until `f` was pressed twice."""
    from backend.store import RunStore
    from training.protocol import SUMMARY_TAG, format_record

    session = dashboard_session()
    record = session.record
    record.jobs[-1].status = JobState.SUCCEEDED
    RunStore(session.store.root).save(record)
    lines = [f"(RayTrainWorker pid=1000) rtui-train: setting up {i} with a line long enough to wrap at eighty "
             "columns and more" for i in range(60)]
    lines += metric_lines(1, 40) + [f"(RayTrainWorker pid=1000) {format_record(SUMMARY_TAG, {'steps': 40})}",
                                    "(RayTrainWorker pid=1000) model written", "rtui-train: done"]
    session.spool().append("".join(line + "\n" for line in lines))
    if head:
        session.ctx.cluster = FakeHead([f"head line {i}" for i in range(50)])
    app = DashboardApp(session, resume=True)
    async with app.run_test(size=size) as pilot:
        screen = await dashboard(pilot)
        tail = job_tail(screen)
        await wait_for(pilot, lambda: tail.total >= len(lines) and not screen._stale, 10, "the spool replayed")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
        assert tail.following and "following" in tail.status_text
        log = tail.log_view
        assert log.is_vertical_scroll_end, (log.scroll_y, log.max_scroll_y, tail.status_text)
        assert tail.lines[-1] == "rtui-train: done"


class SilentHead(FakeHead):
    """A head pod that logs nothing (``lines`` empty), or whose log cannot be read (``error``)."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__([])
        self.error = error

    async def head_log(self, ctx: Context, *, since_time: str | None, follow: bool) -> AsyncIterator[str]:
        self.asked.append(since_time)
        if self.error is not None:
            raise self.error
        await asyncio.Event().wait()  # follows a log that stays empty
        yield ""


@pytest.mark.parametrize("error", [None, OperationError("the API server refused the log request (403)")],
                         ids=["empty", "unreadable"])
async def test_an_empty_head_pod_tab_says_why(isolated_env: Path, error: Exception | None) -> None:
    """Issue 40 item 6: the Head pod tab showed "0 lines" for a whole job without saying why."""
    session = dashboard_session()
    session.ctx.cluster = SilentHead(error)
    app = DashboardApp(session, resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard(pilot)
        head_tail = screen.query_one("#head-tail", LogTail)
        want = "could not be read: the API server refused" if error else "nothing from the head pod yet"
        await wait_for(pilot, lambda: want in head_tail.status_text, 5, lambda: head_tail.status_text)
