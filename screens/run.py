"""The running job: status, latest metrics, and the live log tails (the job's, the head pod's)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Header, Input, Label, Sparkline, Static, TabbedContent, TabPane

from backend import flows
from backend.errors import OperationError
from backend.follow import JobUpdate
from backend.layers.base import HeadLogSource
from backend.resources import CostMeter, GpuFleet, Interruption, interruptions_summary
from backend.session import Billed, cost_meter
from backend.store import JobState
from backend.telemetry import MetricPoint, Telemetry
from tui import heap
from tui.logtail import LogTail
from tui.render import gpu_line, interruption_line, interruptions_words, per_hour_words
from tui.screen import RtuiScreen
from tui.throughput import RunStats, ThroughputGraph, ThroughputSnapshot
from tui.transport_badge import TransportBadge, TransportSnapshot
from tui.widgets import RtuiFooter

REPLAY_LINES = 5_000
REFRESH_S = 0.25  # the dashboard's widgets get new snapshots at most this often
GPU_REFRESH_S = 5.0  # GPU nodes come and go in minutes: an API round trip every few seconds is plenty
# The provider's records of what the nodes billed (a few API calls on aws): they move by the minute.
BILLED_REFRESH_S = 30.0
COST_REFRESH_S = 2.0  # with no new lines only the cost meter moves: redrawing it at 4 Hz cost ~6 % of a core
HEAD_BATCH_S = 0.05  # head-log lines reach the screen in batches at most this often
JOB_TAB, HEAD_TAB = "tab-job", "tab-head"
_STATUS_STYLE: dict[str, str] = {JobState.SUCCEEDED: "bold green", JobState.FAILED: "bold red", JobState.STOPPED: "red",
                 JobState.RUNNING: "bold yellow"}


class RunScreen(RtuiScreen):
    HELP_TITLE = "the run"
    # Below 100 columns the graph folds away (`g` shows it in the log's place): the log tail and the
    # sparkline matter more. Wider, `g` hides the graph so the log has the whole width.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    # The footer holds what fits at 80 columns; m, t and l are named where they act (the tail's status
    # line, the badge, the graph's title) and in the help.
    BINDINGS = [
        Binding("f", "toggle_follow", "Follow", id="follow", tooltip="Follow the newest log lines (or pause)"),
        # Priority: the focused log's own End would only scroll; this one also follows again.
        Binding("end", "resume_follow", "Resume", id="resume", priority=True,
                tooltip="Jump to the newest line and follow again"),
        Binding("slash", "filter", "Filter", id="filter",
                tooltip="Show only lines that contain some text (any case); Escape clears it"),
        Binding("m", "toggle_metrics", "Metric lines", show=False, id="metrics",
                tooltip="Show or hide the RTUI_METRIC lines that feed the graph"),
        Binding("h", "switch_tail", "Job/head log", id="switch_tail",
                tooltip="Switch between the job's driver log and the Ray head pod's log"),
        Binding("t", "toggle_transport", "Transport why", show=False, id="transport",
                tooltip="Show or hide why the NCCL transport badge says what it says"),
        Binding("l", "toggle_graph", "Loss/tok/s", show=False, id="graph",
                tooltip="Switch the graph between tokens/s and loss"),
        Binding("g", "toggle_view", "Graph/log", id="view",
                tooltip="Narrow: switch between the log and the graph; wide: hide or show the graph beside the log"),
        Binding("D", "teardown", "Tear down", id="teardown", tooltip="Stop the job and remove the cluster"),
        Binding("M", "fetch_model", "Fetch model", id="fetch_model",
                tooltip="Copy the run's model (a Hugging Face directory) to ./rtui-model-RUN_ID"),
    ]

    @dataclass
    class JobStatusChanged(Message):
        status: str
        message: str

    @dataclass
    class LinesArrived(Message):
        lines: list[str]

    @dataclass
    class HeadLinesArrived(Message):
        lines: list[str]

    @dataclass
    class HeadLogEnded(Message):
        """The head pod's log stream ended: ``error`` when it could not be read."""

        error: str | None = None

    @dataclass
    class GpuFleetChanged(Message):
        """GPU workers and nodes now (issue 26), with what the provider's records say the nodes billed so
        far (their node-hours, and Spot nodes at the price history): the cost meter's inputs."""

        fleet: GpuFleet
        billed: Billed

    @dataclass
    class InterruptionsFound(Message):
        """Where the job stopped and went on from a checkpoint, with what took its node (issue 41)."""

        found: list[Interruption]

    @dataclass
    class TeardownRequested(Message):
        """The user pressed D: the App asks for the cluster name, then tears down."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.job_status = "?"
        self.telemetry = Telemetry()
        self.clock = clock
        self._stale = True  # telemetry moved on since the widgets' last snapshots
        self._refreshed_at = 0.0
        self.gpu_fleet: GpuFleet | None = None  # kube and aws: the GPU side now
        self.billed = Billed()  # what the GPU watcher last read of the provider's records
        self._status_message = ""
        self.interruptions: list[Interruption] = []

    @property
    def metric(self) -> MetricPoint | None:
        return self.telemetry.series.latest

    @property
    def summary(self) -> dict[str, object] | None:
        return self.telemetry.series.summary

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="job-status", classes="panel")
        with Horizontal(id="run-head"):
            yield TransportBadge(id="transport")
            yield Label("tok/s ", id="spark-label")
            yield Sparkline([], id="spark")
        yield RunStats(id="metrics", classes="panel")
        with Horizontal(id="run-body"):
            yield ThroughputGraph(id="graph")
            with TabbedContent(id="tails", initial=JOB_TAB):
                with TabPane("Job log", id=JOB_TAB):
                    yield LogTail(id="tail")
                if self.has_head:  # on local the head is a process here: no tab to grey out
                    with TabPane("Head pod", id=HEAD_TAB):
                        yield LogTail(id="head-tail", empty_note="nothing from the head pod yet")
        yield RtuiFooter()

    def on_mount(self) -> None:
        # The job's own node count (its target reads the config): on one machine the badge says
        # intra-node, never a TCP alarm from the Socket net NCCL announces everywhere (issue 39).
        self.telemetry.job_nodes = self.session.job_nodes()
        job = self.session.record.current_job
        if job is not None:
            self.job_status = job.status.value
        self._render_status("")
        self.refresh_dashboard()
        self.set_interval(REFRESH_S, self.refresh_dashboard)
        self.query_one("#tail", LogTail).log_view.focus()
        self.follow_job()
        if self.has_head:
            self.follow_head()
            self.watch_gpu()
        # The run screen's modules loaded after the wizard's (tui.heap): out of every full collection too.
        self.call_after_refresh(heap.settle)

    @property
    def has_head(self) -> bool:
        """Whether the target runs its Ray head in a pod with a log of its own (kube, aws)."""
        return isinstance(self.session.ctx.cluster, HeadLogSource)

    @property
    def active_tail(self) -> LogTail:
        pane = self.query_one(TabbedContent).active_pane
        tails = pane.query(LogTail) if pane is not None else None
        return tails.first() if tails else self.query_one("#tail", LogTail)

    def _render_status(self, message: str) -> None:
        self._status_message = message
        job = self.session.record.current_job
        text = Text()
        text.append("job ", style="dim")
        text.append(job.submission_id if job else "-", style="bold")
        text.append(f"  {self.job_status}", style=_STATUS_STYLE.get(self.job_status, "bold"))
        if message:
            text.append(f"  {message.splitlines()[0][:100]}", style="dim")
        if self.gpu_fleet is not None:
            ranks = self.session.config.effective_workers()
            text.append(f"\n{gpu_line(self.gpu_fleet, ranks=ranks)}", style="dim")
            meter = self.cost_meter()
            if meter is not None:
                text.append(f"  {per_hour_words(meter.per_hour, meter.per_hour_full)}", style="dim")
        if self.interruptions:
            summary = interruptions_summary(self.interruptions)
            text.append(f"\n{interruption_line(summary['items'][-1])} · {interruptions_words(summary)}",
                        style="yellow")
        self.query_one("#job-status", Static).update(text)

    @work(exclusive=True, group="interruptions", exit_on_error=False)
    async def find_interruptions(self) -> None:
        """The job's restarts (its log) with their causes (the target's records of its nodes)."""
        self.post_message(self.InterruptionsFound(await self.session.interruptions(self.telemetry)))

    def on_run_screen_interruptions_found(self, message: InterruptionsFound) -> None:
        if message.found != self.interruptions:
            self.interruptions = message.found
            self._render_status(self._status_message)

    @work(exclusive=True, group="gpu", exit_on_error=False)
    async def watch_gpu(self) -> None:
        """GPU workers and nodes as they go while idle and come back for a job (issue 26)."""
        billed, billed_at = self.billed, -math.inf
        while True:
            fleet = await self.session.gpu_fleet()
            if fleet is not None:
                if time.monotonic() - billed_at >= BILLED_REFRESH_S:
                    # The records not answering this time: the last reading stands.
                    with contextlib.suppress(OperationError):
                        billed, billed_at = await self.session.billed(self.clock()), time.monotonic()
                self.post_message(self.GpuFleetChanged(fleet, billed))
            if any(i.loss is None for i in self.interruptions):
                self.find_interruptions()  # the provider records a lost node a little after the job sees it
            await asyncio.sleep(GPU_REFRESH_S)

    def on_run_screen_gpu_fleet_changed(self, message: GpuFleetChanged) -> None:
        if (message.fleet, message.billed) != (self.gpu_fleet, self.billed):
            self.gpu_fleet, self.billed = message.fleet, message.billed
            self._render_status(self._status_message)
            self._stale = True

    def cost_meter(self) -> CostMeter | None:
        """The run's cost meter as `rtui status` and the teardown modal read it: each priced resource since
        it was made, the GPU nodes at their size now, and what the provider's records say they billed."""
        return cost_meter(self.session.record, now=self.clock(), gpu=self.gpu_fleet, billed=self.billed)

    def refresh_dashboard(self) -> None:
        """Hand the badge, stats, sparkline and graph fresh snapshots (equal ones repaint nothing)."""
        meter = self.cost_meter()
        cost = meter.per_hour if meter is not None else None
        now = time.monotonic()
        # A priced run's cost keeps running without new lines, slowly enough to redraw it seldom.
        if not (self._stale or (cost and now - self._refreshed_at >= COST_REFRESH_S)):
            return
        self._stale, self._refreshed_at = False, now
        throughput = ThroughputSnapshot.build(
            self.telemetry.series, total_steps=self.session.config.steps, cost_per_hour=cost,
            cost_so_far=meter.accrued if meter is not None else None,
            cost_exact=meter.accrued_exact if meter is not None else True)
        self.query_one(TransportBadge).snapshot = TransportSnapshot.from_verdict(self.telemetry.transport)
        stats = self.query_one(RunStats)
        model_appeared = throughput.model_uri is not None and stats.snapshot.model_uri is None
        stats.snapshot = throughput
        if model_appeared:
            self.refresh_bindings()  # M (fetch the model) is possible now
        self.query_one(ThroughputGraph).snapshot = throughput
        spark = self.query_one(Sparkline)
        if spark.data != (data := throughput.spark):
            spark.data = data

    @work(exclusive=True, group="follow", exit_on_error=False)
    async def follow_job(self) -> None:
        """Replay the spool, then attach (or watch read-only); widgets change only in handlers."""
        spool = self.session.spool()
        offset = spool.size()
        if spool.exists():  # the view gets the tail, telemetry the whole history once
            self.post_message(self.LinesArrived(list(deque(spool.iter_lines(), maxlen=REPLAY_LINES))))
        # Closed when the worker ends or is cancelled, not when the collector gets to it: the follow holds
        # the run's lock, and a `down` right after the screen goes must find it free.
        async with contextlib.aclosing(flows.attach(self.session, replayed_bytes=offset)) as updates:
            async for update in updates:
                if isinstance(update, flows.Attached):
                    if update.read_only:
                        self.notify("Another rtui is attached to this run: watching its log read-only.")
                    elif not update.cluster_alive:
                        self.post_message(self.JobStatusChanged("cluster not running", ""))
                    continue
                self._post_update(update)

    @work(exclusive=True, group="head-log", exit_on_error=False)
    async def follow_head(self) -> None:
        """The head pod's log (spooled by ``flows.head_log``), posted in batches."""
        batch: list[str] = []

        async def read() -> None:
            async for line in flows.head_log(self.session, follow=True):
                batch.append(line)

        reader = asyncio.create_task(read())
        try:
            while True:
                done, _ = await asyncio.wait({reader}, timeout=HEAD_BATCH_S)
                if batch:
                    self.post_message(self.HeadLinesArrived(batch[:]))
                    batch.clear()
                if done:
                    error = reader.exception()
                    self.post_message(self.HeadLogEnded(" ".join(str(error).split()) if error else None))
                    return
        finally:
            reader.cancel()

    def on_run_screen_head_lines_arrived(self, message: HeadLinesArrived) -> None:
        self.query_one("#head-tail", LogTail).push(message.lines)

    def on_run_screen_head_log_ended(self, message: HeadLogEnded) -> None:
        tail = self.query_one("#head-tail", LogTail)
        tail.note = (f"the head pod's log could not be read: {message.error[:160]}" if message.error
                     else "the head pod's log ended")

    def _post_update(self, update: JobUpdate) -> None:
        if update.lines:
            self.post_message(self.LinesArrived(update.lines))
        if update.status is not None:
            self.post_message(self.JobStatusChanged(update.status.status, update.status.message))

    def on_run_screen_lines_arrived(self, message: LinesArrived) -> None:
        self.query_one("#tail", LogTail).push(message.lines)
        self.telemetry.feed_from(self.session.spool().path)  # telemetry reads the spool once, in order
        self._stale = True  # the next refresh tick shows it
        found = self.telemetry.series.restarts.found
        if len(found) != len(self.interruptions):
            self.find_interruptions()  # a new one: ask the target what took its node
        elif [i.restart for i in self.interruptions] != found:  # one went on: the same causes
            self.interruptions = [replace(i, restart=r) for i, r in zip(self.interruptions, found, strict=True)]
            self._render_status(self._status_message)

    def on_run_screen_job_status_changed(self, message: JobStatusChanged) -> None:
        self.job_status = message.status
        self._render_status(message.message)

    def action_toggle_follow(self) -> None:
        tail = self.active_tail
        tail.following = not tail.following

    def action_resume_follow(self) -> None:
        self.active_tail.resume()

    def action_filter(self) -> None:
        self.active_tail.open_filter()

    def action_toggle_metrics(self) -> None:
        tail = self.active_tail
        tail.show_metrics = not tail.show_metrics

    def action_switch_tail(self) -> None:
        tabs = self.query_one(TabbedContent)
        tabs.active = HEAD_TAB if tabs.active == JOB_TAB else JOB_TAB
        self.active_tail.log_view.focus()

    def on_tabbed_content_tab_activated(self, _event: TabbedContent.TabActivated) -> None:
        self.refresh_bindings()

    def action_toggle_transport(self) -> None:
        self.query_one(TransportBadge).toggle()

    def action_toggle_view(self) -> None:
        """The graph instead of the log (narrow), or the log alone at the full width (wide)."""
        self.toggle_class("-alt-view")
        if not self.log_hidden:
            self.active_tail.log_view.focus()
        self.refresh_bindings()

    @property
    def log_hidden(self) -> bool:
        """Narrow, with the graph in the log's place: the log's keys do nothing."""
        return self.has_class("-narrow", "-alt-view")

    def action_toggle_graph(self) -> None:
        graph = self.query_one(ThroughputGraph)
        graph.show_loss = not graph.show_loss

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "teardown":
            return not self.wizard.read_only
        if action == "fetch_model":  # once the job has written one
            return self.query_one(RunStats).snapshot.model_uri is not None
        if action in ("toggle_follow", "resume_follow", "filter", "toggle_metrics", "switch_tail") and self.log_hidden:
            return False
        if action == "switch_tail":
            return self.has_head
        if action == "resume_follow":  # not while typing a filter: End moves the cursor there
            return not self.active_tail.following and not isinstance(self.focused, Input)
        return True

    @work(exclusive=True, group="fetch-model", exit_on_error=False)
    async def action_fetch_model(self) -> None:
        copied = await flows.fetch_model(self.session, Path.cwd() / f"rtui-model-{self.session.run_id}")
        self.notify(f"Model copied to {copied}", title="Model")

    def action_teardown(self) -> None:
        self.post_message(self.TeardownRequested())
