"""Provisioning (or teardown): one pane per step, updated from the runner's events."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Header, Static
from textual.worker import Worker

from backend import flows
from backend.errors import NoCapacity
from backend.planner import PlanResult
from backend.resources import EventKind, StepEvent
from backend.runner import Step
from tui.screen import RtuiScreen
from tui.widgets import RtuiFooter, StepPane

Mode = Literal["apply", "teardown"]


class ProvisionScreen(RtuiScreen):
    HELP_TITLE = "the steps"
    BINDINGS = [
        Binding("escape", "back", "Back", id="back", tooltip="Back (only once steps have stopped)"),
        Binding("r", "retry", "Retry", id="retry", tooltip="Re-plan and apply again after a failure"),
        Binding("m", "fail_over", "Move GPU AZ", id="failover",
                tooltip="The provider has no capacity for the machines here: move them where it has, and re-plan"),
    ]

    @dataclass
    class StepEventPosted(Message):
        """The runner reported something about a step."""

        event: StepEvent

    @dataclass
    class Finished(Message):
        """Every step has stopped; ``ok`` is False if any failed or was cancelled."""

        mode: Mode
        ok: bool

    @dataclass
    class BackRequested(Message):
        mode: Mode
        ok: bool

    @dataclass
    class RetryRequested(Message):
        mode: Mode

    @dataclass
    class FailoverRequested(Message):
        """The provider had no capacity: the App asks the target to move the machines (``Target.fail_over``)."""

        failed: NoCapacity

    def __init__(self, plan: PlanResult | None = None, *, mode: Mode = "apply",
                 outline: list[Step] | None = None, clock: Callable[[], float] = time.time,
                 delete_data: bool = False) -> None:
        super().__init__()
        self.plan = plan
        self.delete_data = delete_data  # teardown: the run's checkpoints and model go too
        self.clock = clock  # what running panes measure their elapsed time against
        self.mode: Mode = mode
        self.outline = outline or []
        self.running = True
        self.ok = False
        self.no_capacity: NoCapacity | None = None
        self.kept_data = False  # teardown: the run's data was kept on purpose (its step says where)
        # The view keeps the first running step in view, until the reader scrolls up to look back (the
        # bottom, End, resumes it): with dozens of steps the running ones were below the finished ones.
        self.follow_running = True
        self._own_scroll = False

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="steps"):
            yield Static("Provisioning" if self.mode == "apply" else "Tearing down", classes="heading")
            for step in self.outline:
                yield StepPane(step.id, step.title, step.expected_s, clock=self.clock)
        # Below the steps, not among them: what to do next stays in view however many steps scroll.
        yield Static("", id="outcome")
        yield RtuiFooter()

    def on_mount(self) -> None:
        self.watch(self.query_one("#steps", VerticalScroll), "scroll_y", self._scrolled, init=False)
        self.run_steps()

    def _scrolled(self, old: float, new: float) -> None:
        if self._own_scroll:
            return
        box = self.query_one("#steps", VerticalScroll)
        if new < old:
            self.follow_running = False
        elif box.is_vertical_scroll_end:
            self.follow_running = True

    def _show_running(self) -> None:
        """Bring the first running step to the top of the view (those after it follow below)."""
        running = [p for p in self.query(StepPane) if p.status == "running"]
        if not (self.follow_running and running):
            return
        self._own_scroll = True
        try:
            self.query_one("#steps", VerticalScroll).scroll_to_widget(running[0], animate=False, top=True,
                                                                      immediate=True)
        finally:
            self._own_scroll = False

    @work(exclusive=True, group="steps", exit_on_error=False)
    async def run_steps(self) -> None:
        ok = True
        if self.mode == "apply":
            assert self.plan is not None
            events = flows.apply_plan(self.session, self.plan)
        else:
            events = flows.down(self.session, delete_data=self.delete_data)
        async for event in events:
            ok = ok and event.kind not in (EventKind.FAILED, EventKind.CANCELLED)
            self.post_message(self.StepEventPosted(event))
        self.post_message(self.Finished(self.mode, ok))

    def worker_failed(self, worker: Worker[Any], error: BaseException) -> bool:
        if worker.group == "steps":  # the steps ended, not well: the App decides what comes next
            self.post_message(self.Finished(self.mode, False))
        return False  # and the notification says why

    async def on_provision_screen_step_event_posted(self, message: StepEventPosted) -> None:
        event = message.event
        if isinstance(event.error, NoCapacity):
            self.no_capacity = event.error
        self.kept_data = self.kept_data or "kept" in event.data
        panes = self.query(f"#{StepPane.dom_id(event.step)}")
        if panes:
            pane = panes.first(StepPane)
        else:  # teardown steps come from discovery: a pane per step as it starts
            expected = event.data.get("expected_s") if event.kind is EventKind.STARTED else None
            pane = StepPane(event.step, event.message or event.step,
                            float(expected) if isinstance(expected, int | float) else 1.0, clock=self.clock)
            await self.query_one("#steps").mount(pane)
        pane.apply_event(event)
        if event.kind is EventKind.STARTED:
            self.call_after_refresh(self._show_running)

    def on_provision_screen_finished(self, message: Finished) -> None:
        self.running = False
        self.ok = message.ok
        self.refresh_bindings()
        run_id = self.session.run_id
        outcome = self.query_one("#outcome", Static)
        if message.mode == "teardown" and message.ok:
            outcome.update(f"Run {run_id} is down: everything it created is gone"
                           + (" but its data, kept on purpose" if self.kept_data else "")
                           + (" and the orphan sweep found nothing left" if self.query("#step-sweep") else "")
                           + ". Escape starts a new run; q quits.")
        elif self.no_capacity is not None and (hint := self.fail_over_hint):
            outcome.update(f"{hint}; r retries here.")
        elif not message.ok:
            outcome.update("Something failed (see the red step). r retries, escape goes back; nothing was torn down.")
        outcome.display = bool(outcome.content)
        failed = self.query(".step-pane.-failed")
        if failed:  # at the top (once the outcome has its room): its cause and remedy, then what it held up
            self.call_after_refresh(failed.first().scroll_visible, animate=False, top=True)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "retry":  # only after a failure: never offered while steps run
            return not self.running and not self.ok
        if action == "back":
            return None if self.running else True
        if action == "fail_over":
            return (self.no_capacity is not None and bool(self.fail_over_hint)
                    and not self.running and not self.wizard.read_only)
        return True

    @property
    def fail_over_hint(self) -> str | None:
        """What `m` does here, in the target's words (None: nothing)."""
        return self.session.target.fail_over_hint(self.session.config, self.session.record.facts)

    @property
    def tearing_down(self) -> bool:
        """A teardown is running here (another D would only start it over)."""
        return self.mode == "teardown" and self.running

    def action_fail_over(self) -> None:
        if self.no_capacity is not None:
            self.post_message(self.FailoverRequested(self.no_capacity))

    def action_back(self) -> None:
        self.post_message(self.BackRequested(self.mode, self.ok))

    def action_retry(self) -> None:
        self.post_message(self.RetryRequested(self.mode))
