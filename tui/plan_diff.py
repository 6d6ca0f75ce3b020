"""The plan as the TUI shows it: Terraform's symbols, one heading per layer, wrapped to the width.

Pure functions build the lines for a given width (so tests read exactly what is drawn), and
``PlanDiff`` is the Static that draws them at its own width. Every line carries its symbol as
text, so the plan still reads without colour (NO_COLOR).
"""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text
from textual.geometry import Size
from textual.widgets import Static

from backend import targets
from backend.resources import Action, Change, Plan

ACTION_STYLE = {Action.CREATE: "green", Action.UPDATE: "yellow", Action.REPLACE: "magenta", Action.DELETE: "red",
                Action.NOOP: "dim"}
VERB = {Action.CREATE: "to create", Action.UPDATE: "to update", Action.REPLACE: "to replace",
        Action.DELETE: "to delete"}
CHANGE_INDENT = 2  # where a change's symbol column starts
ATTR_INDENT = 8  # where its attributes start (under the address)


def money(per_hour: float) -> str:
    return f"${per_hour:.2f}" if per_hour >= 0.10 else f"${per_hour:.3f}"


def value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def hang(line: Text, indent: int, width: int) -> list[Text]:
    """``line`` wrapped to ``width``, every continuation indented by ``indent`` (never back to column 0).

    Breaks after a space in the second half of the room when there is one, else mid-word.
    """
    width = max(width, indent + 12)
    plain = line.plain
    cuts: list[int] = []
    start, room = 0, width
    while len(plain) - start > room:
        end = start + room
        space = plain.rfind(" ", start + room // 2, end)
        cut = space + 1 if space >= 0 else end
        cuts.append(cut)
        start, room = cut, width - indent
    if not cuts:
        return [line]
    parts = line.divide(cuts)
    out: list[Text] = []
    for i, part in enumerate(parts):
        part.rstrip()
        out.append(part if i == 0 else Text.assemble(" " * indent, part))
    return out


def _attribute(key: str, width: int, value: Text) -> list[Text]:
    prefix = " " * ATTR_INDENT + f"{key} = "
    # Under the value when that leaves room enough; else just under the key.
    indent = len(prefix) if len(prefix) <= width // 2 else ATTR_INDENT + 2
    return hang(Text.assemble((prefix, "dim"), value), indent, width)


def _attributes(change: Change, width: int) -> list[Text]:
    before, after = change.before or {}, change.after or {}
    lines: list[Text] = []
    if change.action in (Action.UPDATE, Action.REPLACE) and change.before is not None:
        # Only what changes, before → after (Terraform's ~ lines).
        for key in dict.fromkeys([*after, *before]):
            old, new = before.get(key), after.get(key)
            if old == new:
                continue
            value = Text.assemble((value_text(old), "red"), " → ", (value_text(new), "green"))
            lines += _attribute(key, width, value)
    else:
        shown = before if change.action is Action.DELETE else after
        for key, new in shown.items():
            lines += _attribute(key, width, Text(value_text(new)))
    for code, quota in change.quota.items():
        vcpus, headroom = quota.get("vcpus") or 0, quota.get("headroom")
        short = headroom is not None and vcpus > headroom
        text = f"uses {vcpus:.0f} vCPUs of {code}" + (f", headroom {headroom:.0f}" if headroom is not None else "")
        lines += hang(Text.assemble(" " * ATTR_INDENT, (text, "bold red" if short else "cyan")),
                      ATTR_INDENT + 2, width)
    if change.cost_note and change.action is not Action.DELETE:
        lines += hang(Text.assemble(" " * ATTR_INDENT, (f"cost: {change.cost_note}", "dim")), ATTR_INDENT + 2, width)
    return lines


def change_lines(change: Change, width: int) -> list[Text]:
    style = ACTION_STYLE[change.action]
    head = Text.assemble(" " * CHANGE_INDENT, (f"{change.symbol:>3} ", f"bold {style}"),
                         (change.address, "bold" if change.action is not Action.NOOP else "dim"))
    if change.cost_per_hour:
        head.append(f"  {money(change.cost_per_hour)}/h", style="dim" if change.action is Action.NOOP else "bold")
    if change.reason and change.action is not Action.CREATE:
        head.append(f"  # {change.reason}", style="dim italic")
    lines = hang(head, ATTR_INDENT, width)
    if change.action is not Action.NOOP:
        lines += _attributes(change, width)
    return lines


def layer_summary(changes: list[Change], cost: float) -> str:
    counts = {a: sum(1 for c in changes if c.action is a) for a in Action}
    parts = [f"{n} {VERB[a]}" for a, n in counts.items() if n and a is not Action.NOOP]
    if counts[Action.NOOP]:
        parts.append(f"{counts[Action.NOOP]} unchanged")
    return ", ".join(parts) + (f" · {money(cost)}/hour" if cost else "")


def plan_lines(plan: Plan, width: int, *, show_unchanged: bool = False) -> list[Text]:
    """Every line of the diff at ``width`` columns: a heading per layer, its changes, its unchanged ones."""
    lines: list[Text] = []
    for layer in plan.layers():
        changes = [c for c in plan.changes if c.layer == layer]
        if lines:
            lines.append(Text())
        title = plan.layer_titles.get(layer, "")
        heading = Text.assemble((layer, "bold underline"), (f" — {title}" if title else "", "bold"),
                                (f"   {layer_summary(changes, plan.layer_cost_per_hour(layer))}", "dim"))
        lines += hang(heading, 4, width)
        for change in changes:
            if change.action is not Action.NOOP:
                lines += change_lines(change, width)
        unchanged = [c for c in changes if c.action is Action.NOOP]
        if unchanged and show_unchanged:
            for change in unchanged:
                lines += change_lines(change, width)
        elif unchanged:
            lines += hang(Text(" " * (CHANGE_INDENT + 4) + f"{len(unchanged)} unchanged (u shows them)", style="dim"),
                          ATTR_INDENT, width)
    if not plan.changes:
        lines.append(Text("The plan is empty.", style="dim"))
    return lines


def quota_use(plan: Plan) -> dict[str, tuple[float, float | None]]:
    """vCPUs each quota gives to what the plan creates or changes, and the headroom it has."""
    use: dict[str, tuple[float, float | None]] = {}
    for change in plan.changes:
        if change.action in (Action.NOOP, Action.DELETE):
            continue
        for code, quota in change.quota.items():
            total, headroom = use.get(code, (0.0, None))
            use[code] = (total + (quota.get("vcpus") or 0.0), quota.get("headroom", headroom))
    return use


def summary_lines(plan: Plan, width: int) -> list[Text]:
    counts = plan.counts()
    lines = hang(Text(f"Plan: {counts['create']} to create, {counts['update']} to update, "
                      f"{counts['replace']} to replace, {counts['delete']} to delete, "
                      f"{counts['noop']} unchanged.", style="bold"), 6, width)
    cost = plan.cost_per_hour
    cost_text = Text.assemble(("Cost: ", "bold"), f"{money(cost)}/hour while up" if cost else
                              targets.get(plan.target).unpriced)
    if cost:
        for usage in plan.usage_costs:
            cost_text.append(f", {usage}")
        if plan.price_source:
            cost_text.append(f" ({plan.price_source})", style="yellow" if "estimate" in plan.price_source else "dim")
    lines += hang(cost_text, 6, width)
    quotas = quota_use(plan)
    if quotas:
        quota_text = Text("Quota: ", style="bold")
        for i, (code, (vcpus, headroom)) in enumerate(quotas.items()):
            short = headroom is not None and vcpus > headroom
            quota_text.append(" · " if i else "")
            quota_text.append(f"{vcpus:.0f} vCPUs of {code}" + (f", headroom {headroom:.0f}" if headroom is not None
                                                                else ""), style="bold red" if short else "cyan")
        lines += hang(quota_text, 7, width)
    for note in plan.notes:
        lines += hang(Text.assemble(("Note: ", "bold yellow"), note), 6, width)
    if plan.is_noop:
        lines.append(Text("Nothing to create: applying follows the existing job.", style="green"))
    return lines


def join(lines: list[Text]) -> Text:
    text = Text("\n").join(lines)
    text.no_wrap = True
    text.overflow = "crop"
    return text


def render_plan(plan: Plan, width: int = 100, *, show_unchanged: bool = False) -> Text:
    """The whole review as one text (the diff, then the totals), for tests and plain output."""
    return join([*plan_lines(plan, width, show_unchanged=show_unchanged), Text(), *summary_lines(plan, width)])


class PlanDiff(Static):
    """The diff, laid out for the width it is given (so long values wrap with a hanging indent)."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__("planning…", id=id, classes=classes)
        self.plan: Plan | None = None
        self.show_unchanged = False

    def show(self, plan: Plan | None, *, show_unchanged: bool | None = None) -> None:
        self.plan = plan
        if show_unchanged is not None:
            self.show_unchanged = show_unchanged
        self.refresh(layout=True)

    def lines(self, width: int) -> list[Text]:
        if self.plan is None:
            return [Text("planning…")]
        return plan_lines(self.plan, width, show_unchanged=self.show_unchanged)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.lines(width))

    def render(self) -> Text:
        return join(self.lines(self.content_region.width or self.size.width or 80))


class PlanSummary(Static):
    """The plan's totals: counts, the hourly cost while up, the quota it consumes."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.plan: Plan | None = None

    def show(self, plan: Plan | None) -> None:
        self.plan = plan
        self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(summary_lines(self.plan, width)) if self.plan is not None else 1

    def render(self) -> Text:
        if self.plan is None:
            return Text("")
        return join(summary_lines(self.plan, self.content_region.width or self.size.width or 80))
