"""Plan review: what will be created or changed, Terraform-style, before anything happens."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Header, Static

from backend.model import Action, Plan
from backend.planner import PlanResult
from tui.screen import RtuiScreen

_STYLE = {Action.CREATE: "green", Action.UPDATE: "yellow", Action.REPLACE: "magenta", Action.DELETE: "red",
          Action.NOOP: "dim"}


def render_plan(plan: Plan) -> Text:
    text = Text()
    for layer in plan.layers():
        text.append(f"{layer}\n", style="bold underline")
        for change in (c for c in plan.changes if c.layer == layer):
            style = _STYLE[change.action]
            text.append(f"{change.symbol:>3} ", style=f"bold {style}")
            text.append(change.address, style=f"bold {style}")
            if change.reason:
                text.append(f"   # {change.reason}", style="dim italic")
            text.append("\n")
            shown = change.after if change.action is not Action.DELETE else change.before
            for key, value in (shown or {}).items():
                before = (change.before or {}).get(key) if change.action in (Action.UPDATE, Action.REPLACE) else None
                text.append(f"      {key} = ", style="dim")
                if before is not None and before != value:
                    text.append(f"{before} → ", style="red")
                text.append(f"{value}\n")
    counts = plan.counts()
    text.append(f"\nPlan: {counts['create']} to create, {counts['update']} to update, "
                f"{counts['replace']} to replace, {counts['delete']} to delete, {counts['noop']} unchanged.",
                style="bold")
    text.append(f"  Cost: ${plan.cost_per_hour:.2f}/hour" if plan.cost_per_hour else "  Cost: free (local)")
    if plan.is_noop:
        text.append("\nNothing to create: applying follows the existing job.", style="green")
    return text


class PlanScreen(RtuiScreen):
    @dataclass
    class Approved(Message):
        """Apply this plan."""

        plan: PlanResult

    @dataclass
    class BackRequested(Message):
        """Back to choosing the target."""

    BINDINGS = [
        Binding("a", "apply", "Apply", id="apply", tooltip="Create what the plan says and start the job"),
        Binding("escape", "back", "Back", id="back", tooltip="Back to the target"),
        Binding("r", "replan", "Re-plan", id="replan", tooltip="Discover the live state again"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.plan: PlanResult | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="plan-body"):
            yield Static("Review the plan", classes="heading")
            yield Static("planning…", id="plan", classes="panel")
        yield Footer()

    def on_mount(self) -> None:
        self.compute()

    @work(exclusive=True, group="plan")
    async def compute(self) -> None:
        self.plan = None
        self.refresh_bindings()
        try:
            plan = await self.session.plan()
        except Exception as exc:  # noqa: BLE001
            self.app.report_error(exc)
            return
        self.plan = plan
        self.query_one("#plan", Static).update(render_plan(plan))
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "apply":
            if self.app.read_only:
                return False
            return True if self.plan is not None else None
        return True

    def action_replan(self) -> None:
        self.compute()

    def action_back(self) -> None:
        self.post_message(self.BackRequested())

    def action_apply(self) -> None:
        if self.plan is not None:
            self.post_message(self.Approved(self.plan))
