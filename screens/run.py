"""The running job: status, latest metrics, and the live log tail."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from backend.telemetry import MetricPoint, Telemetry
from backend.textutil import display_lines
from tui.widgets import LogTail

REPLAY_LINES = 5_000


class RunScreen(Screen[None]):
    BINDINGS = [
        Binding("f", "toggle_follow", "Follow", id="follow", tooltip="Follow the newest log lines (or pause)"),
        Binding("D", "teardown", "Tear down", id="teardown", tooltip="Stop the job and remove the cluster"),
    ]

    @dataclass
    class JobStatusChanged(Message):
        status: str
        message: str

    def __init__(self) -> None:
        super().__init__()
        self.job_status = "?"
        self.telemetry = Telemetry()

    @property
    def metric(self) -> MetricPoint | None:
        return self.telemetry.series.latest

    @property
    def summary(self) -> dict[str, Any] | None:
        return self.telemetry.series.summary

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="job-status", classes="panel")
        yield Static("waiting for the first step…", id="metrics", classes="panel")
        yield LogTail(id="tail")
        yield Footer()

    def on_mount(self) -> None:
        job = self.app.session.record.current_job  # type: ignore[attr-defined]
        if job is not None:
            self.job_status = job.status
        self._render_status("")
        self.query_one(LogTail).focus()
        self.follow_job()

    def _render_status(self, message: str) -> None:
        session = self.app.session  # type: ignore[attr-defined]
        job = session.record.current_job
        text = Text()
        text.append("job ", style="dim")
        text.append(job.submission_id if job else "-", style="bold")
        style = {"SUCCEEDED": "bold green", "FAILED": "bold red", "STOPPED": "red", "RUNNING": "bold yellow"}
        text.append(f"  {self.job_status}", style=style.get(self.job_status, "bold"))
        if message:
            text.append(f"  {message.splitlines()[0][:100]}", style="dim")
        dash = session.record.resources.get("dashboard_url")
        if dash:
            text.append(f"   dashboard {dash}", style="dim")
        self.query_one("#job-status", Static).update(text)

    def _take_lines(self, lines: list[str]) -> None:
        """Show new lines; the metrics come from telemetry, which reads the spool once."""
        self.query_one(LogTail).push(display_lines(lines))
        self.telemetry.feed_from(self.app.session.spool().path)  # type: ignore[attr-defined]
        self._render_metrics()

    def _transport_label(self) -> str:
        if self.app.session.config.target == "local":  # type: ignore[attr-defined]
            return "gloo/TCP (local: no NCCL)"
        verdict = self.telemetry.transport
        return verdict.label

    def _render_metrics(self) -> None:
        m = self.metric
        if m is None:
            return
        steps = self.app.session.config.steps  # type: ignore[attr-defined]
        text = Text()
        text.append(f"step {m.step}/{steps}", style="bold")
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
        session = self.app.session  # type: ignore[attr-defined]
        spool = session.spool()
        if spool.exists():
            # Replay from disk: the view gets the tail, telemetry the whole history once.
            replay = deque(spool.iter_lines(), maxlen=REPLAY_LINES)
            self._take_lines(list(replay))
        try:
            if not self.app.acquire():  # type: ignore[attr-defined]
                await self._watch_spool(spool.size())
                return
            if not await session.target.cluster_alive():
                self.post_message(self.JobStatusChanged("cluster not running", ""))
                return
            follower = session.follower()
            async for batch in follower.lines():
                self._take_lines(batch)
                if follower.last_status and follower.last_status.status != self.job_status:
                    self.post_message(self.JobStatusChanged(follower.last_status.status,
                                                            follower.last_status.message))
            if follower.last_status:
                self.post_message(self.JobStatusChanged(follower.last_status.status, follower.last_status.message))
            session.record.telemetry = self.telemetry.snapshot(tail=0)
            session.store.save(session.record)
        except Exception as exc:  # noqa: BLE001
            self.app.report_error(exc)  # type: ignore[attr-defined]

    async def _watch_spool(self, offset: int) -> None:
        """Another rtui owns the run: show what it writes to the spool."""
        self.notify("Another rtui is attached to this run: watching its log read-only.")
        spool = self.app.session.spool()  # type: ignore[attr-defined]
        while True:
            lines, offset = spool.read_from(offset)
            if lines:
                self._take_lines(lines)
            await asyncio.sleep(0.5)

    def on_run_screen_job_status_changed(self, message: JobStatusChanged) -> None:
        self.job_status = message.status
        self._render_status(message.message)

    def action_toggle_follow(self) -> None:
        tail = self.query_one(LogTail)
        tail.following = not tail.following

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "teardown" and self.app.read_only)  # type: ignore[attr-defined]

    def action_teardown(self) -> None:
        from screens.confirm import ConfirmTeardown

        session = self.app.session  # type: ignore[attr-defined]

        def confirmed(yes: bool | None) -> None:
            if yes and self.app.acquire():  # type: ignore[attr-defined]
                from screens.provision import ProvisionScreen

                self.workers.cancel_group(self, "follow")
                self.app.switch_screen(ProvisionScreen(mode="teardown"))

        self.app.push_screen(ConfirmTeardown(session.config.cluster_name, f"run {session.run_id}"), confirmed)
