"""Plan review: what will be created or changed, Terraform-style, before anything happens."""

from __future__ import annotations

from dataclasses import dataclass

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Header, Static

from backend.planner import PlanResult
from backend.resources import Action
from tui.plan_diff import PlanDiff, PlanSummary, render_plan
from tui.screen import RtuiScreen
from tui.widgets import RtuiFooter

__all__ = ["PlanScreen", "render_plan"]


class PlanScreen(RtuiScreen):
    HELP_TITLE = "the plan"

    @dataclass
    class Approved(Message):
        """Apply this plan (the App asks again first where it costs money)."""

        plan: PlanResult

    @dataclass
    class BackRequested(Message):
        """Back to choosing the target."""

    BINDINGS = [
        Binding("a", "apply", "Apply", id="apply", tooltip="Create what the plan says and start the job"),
        Binding("u", "toggle_unchanged", "Unchanged", id="toggle-unchanged",
                tooltip="Show or hide the resources the plan leaves as they are"),
        Binding("r", "replan", "Re-plan", id="replan", tooltip="Discover the live state again"),
        Binding("escape", "back", "Back", id="back", tooltip="Back to the target"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.plan: PlanResult | None = None
        self.show_unchanged = False

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="plan-body"):
            yield Static("Review the plan", classes="heading")
            yield PlanDiff(id="plan")
        yield PlanSummary(id="plan-summary")
        yield RtuiFooter()

    def on_mount(self) -> None:
        self.compute()

    @work(exclusive=True, group="plan", exit_on_error=False)
    async def compute(self) -> None:
        self.plan = None
        self._show()
        self.plan = await self.session.plan()  # a failure: RtuiScreen says it; nothing to apply
        self._show()

    def _show(self) -> None:
        self.query_one(PlanDiff).show(self.plan, show_unchanged=self.show_unchanged)
        self.query_one(PlanSummary).show(self.plan)
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "apply":
            # Hidden, not dimmed, until there is a plan to apply: a dimmed key still reads as an offer,
            # and pressing it while planning did nothing (issue 21 item 5).
            return not self.wizard.read_only and self.plan is not None
        if action == "toggle_unchanged":
            return self.plan is not None and any(c.action is Action.NOOP for c in self.plan.changes)
        return True

    def action_toggle_unchanged(self) -> None:
        self.show_unchanged = not self.show_unchanged
        self._show()

    def action_replan(self) -> None:
        self.compute()

    def action_back(self) -> None:
        self.post_message(self.BackRequested())

    def action_apply(self) -> None:
        if self.plan is not None:
            self.post_message(self.Approved(self.plan))
