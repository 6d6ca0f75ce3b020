"""Provisioning (or teardown): one pane per step, updated from the runner's events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from backend.model import EventKind, Plan, StepEvent
from backend.runner import select_until
from tui.widgets import StepPane

Mode = Literal["apply", "teardown"]
APPLY_UNTIL = "job"  # the run screen follows the job itself


class ProvisionScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "back", "Back", id="back", tooltip="Back to the plan (only once steps have stopped)"),
        Binding("r", "retry", "Retry", id="retry", tooltip="Re-plan and apply again after a failure"),
    ]

    @dataclass
    class StepEventPosted(Message):
        """The runner reported something about a step."""

        event: StepEvent

    @dataclass
    class Finished(Message):
        """Every step has stopped; ``ok`` is False if any failed or was cancelled."""

        ok: bool

    def __init__(self, plan: Plan | None = None, *, mode: Mode = "apply") -> None:
        super().__init__()
        self.plan = plan
        self.mode = mode
        self.running = True
        self.ok = False

    def _steps(self):  # type: ignore[no-untyped-def]
        target = self.app.session.target  # type: ignore[attr-defined]
        if self.mode == "teardown":
            return target.teardown_steps()
        assert self.plan is not None
        return select_until(target.apply_steps(self.plan), APPLY_UNTIL)

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="steps"):
            title = "Provisioning" if self.mode == "apply" else "Tearing down"
            yield Static(title, classes="heading")
            for step in self._steps():
                yield StepPane(step.id, step.title, step.expected_s)
            yield Static("", id="outcome")
        yield Footer()

    def on_mount(self) -> None:
        self.run_steps()

    @work(exclusive=True, group="steps")
    async def run_steps(self) -> None:
        session = self.app.session  # type: ignore[attr-defined]
        ok = True
        try:
            events = session.apply(self.plan, until=APPLY_UNTIL) if self.mode == "apply" else session.teardown()
            async for event in events:
                ok = ok and event.kind not in (EventKind.FAILED, EventKind.CANCELLED)
                self.post_message(self.StepEventPosted(event))
        except Exception as exc:  # noqa: BLE001
            ok = False
            self.app.report_error(exc)  # type: ignore[attr-defined]
        self.post_message(self.Finished(ok))

    def on_provision_screen_step_event_posted(self, message: StepEventPosted) -> None:
        panes = self.query(f"#step-{message.event.step}")
        if panes:
            panes.first(StepPane).apply_event(message.event)

    def on_provision_screen_finished(self, message: Finished) -> None:
        self.running = False
        self.ok = message.ok
        self.refresh_bindings()
        outcome = self.query_one("#outcome", Static)
        run_id = self.app.session.run_id  # type: ignore[attr-defined]
        if self.mode == "apply" and message.ok:
            from screens.run import RunScreen

            self.app.switch_screen(RunScreen())
        elif self.mode == "teardown" and message.ok:
            outcome.update(f"Run {run_id} is down: every process and file it created is gone. Press q to quit.")
            self.app.sub_title = f"run {run_id} · down"
        else:
            outcome.update("Something failed (see the red step). r retries, escape goes back; nothing was torn down.")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("back", "retry"):
            return None if self.running else (action == "back" or not self.ok)
        return True

    def action_back(self) -> None:
        from screens.plan import PlanScreen

        self.app.switch_screen(PlanScreen())

    def action_retry(self) -> None:
        if self.mode == "teardown":
            self.app.switch_screen(ProvisionScreen(mode="teardown"))
        else:
            self.action_back()
