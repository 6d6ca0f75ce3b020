"""The running job: status, latest metrics, and the live log tail."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Footer, Header, Static

from backend import flows
from backend.follow import JobUpdate
from backend.store import JobState
from backend.telemetry import MetricPoint, Telemetry
from backend.textutil import display_lines
from tui.screen import RtuiScreen
from tui.widgets import LogTail

REPLAY_LINES = 5_000
_STATUS_STYLE: dict[str, str] = {JobState.SUCCEEDED: "bold green", JobState.FAILED: "bold red", JobState.STOPPED: "red",
                 JobState.RUNNING: "bold yellow"}


class RunScreen(RtuiScreen):
    BINDINGS = [
        Binding("f", "toggle_follow", "Follow", id="follow", tooltip="Follow the newest log lines (or pause)"),
        Binding("D", "teardown", "Tear down", id="teardown", tooltip="Stop the job and remove the cluster"),
    ]

    @dataclass
    class JobStatusChanged(Message):
        status: str
        message: str

    @dataclass
    class LinesArrived(Message):
        lines: list[str]

    @dataclass
    class TeardownRequested(Message):
        """The user pressed D: the App asks for the cluster name, then tears down."""

    def __init__(self) -> None:
        super().__init__()
        self.job_status = "?"
        self.telemetry = Telemetry()

    @property
    def metric(self) -> MetricPoint | None:
        return self.telemetry.series.latest

    @property
    def summary(self) -> dict[str, object] | None:
        return self.telemetry.series.summary

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="job-status", classes="panel")
        yield Static("waiting for the first step…", id="metrics", classes="panel")
        yield LogTail(id="tail")
        yield Footer()

    def on_mount(self) -> None:
        job = self.session.record.current_job
        if job is not None:
            self.job_status = job.status.value
        self._render_status("")
        self.query_one(LogTail).focus()
        self.follow_job()

    def _render_status(self, message: str) -> None:
        job = self.session.record.current_job
        text = Text()
        text.append("job ", style="dim")
        text.append(job.submission_id if job else "-", style="bold")
        text.append(f"  {self.job_status}", style=_STATUS_STYLE.get(self.job_status, "bold"))
        if message:
            text.append(f"  {message.splitlines()[0][:100]}", style="dim")
        self.query_one("#job-status", Static).update(text)

    def _transport_label(self) -> str:
        verdict = self.telemetry.transport
        return verdict.label + (f" ({verdict.basis})" if verdict.basis else "")

    def _render_metrics(self) -> None:
        m = self.metric
        if m is None:
            return
        text = Text()
        text.append(f"step {m.step}/{self.session.config.steps}", style="bold")
        text.append(f"   loss {m.loss if m.loss is not None else float('nan'):.4f}")
        text.append(f"   {m.tokens_per_s or 0:,.0f} tokens/s", style="bold cyan")
        text.append(f"   step {(m.step_time_s or 0) * 1000:.0f} ms")
        text.append(f"   transport: {self._transport_label()}", style="dim")
        if self.summary:
            text.append(f"\nfinished: mean {self.summary.get('tokens_per_s_mean', 0):,.0f} tokens/s, "
                        f"final loss {self.summary.get('final_loss')}", style="green")
        self.query_one("#metrics", Static).update(text)

    @work(exclusive=True, group="follow")
    async def follow_job(self) -> None:
        """Replay the spool, then attach (or watch read-only); widgets change only in handlers."""
        spool = self.session.spool()
        offset = spool.size()
        if spool.exists():  # the view gets the tail, telemetry the whole history once
            self.post_message(self.LinesArrived(list(deque(spool.iter_lines(), maxlen=REPLAY_LINES))))
        try:
            async for update in flows.attach(self.session, replayed_bytes=offset):
                if isinstance(update, flows.Attached):
                    if update.read_only:
                        self.app.notify("Another rtui is attached to this run: watching its log read-only.")
                    elif not update.cluster_alive:
                        self.post_message(self.JobStatusChanged("cluster not running", ""))
                    continue
                self._post_update(update)
        except Exception as exc:  # noqa: BLE001 - one place shows it
            self.app.report_error(exc)

    def _post_update(self, update: JobUpdate) -> None:
        if update.lines:
            self.post_message(self.LinesArrived(update.lines))
        if update.status is not None:
            self.post_message(self.JobStatusChanged(update.status.status, update.status.message))

    def on_run_screen_lines_arrived(self, message: LinesArrived) -> None:
        self.query_one(LogTail).push(display_lines(message.lines))
        self.telemetry.feed_from(self.session.spool().path)  # telemetry reads the spool once, in order
        self._render_metrics()

    def on_run_screen_job_status_changed(self, message: JobStatusChanged) -> None:
        self.job_status = message.status
        self._render_status(message.message)

    def action_toggle_follow(self) -> None:
        tail = self.query_one(LogTail)
        tail.following = not tail.following

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "teardown" and self.app.read_only)

    def action_teardown(self) -> None:
        self.post_message(self.TeardownRequested())
