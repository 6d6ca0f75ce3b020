"""The target screen's text: the configuration, the preflight checks and the kubeconfig contexts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

from backend.resources import CheckResult, CheckStatus

if TYPE_CHECKING:
    from targets.kube.kubeconfig import KubeContext

_CHECK_MARK = {CheckStatus.OK: ("✓", "green"), CheckStatus.WARN: ("!", "yellow"), CheckStatus.FAIL: ("✗", "red"),
               CheckStatus.INFO: ("i", "blue")}


def render_context(context: KubeContext, *, current: bool) -> Text:
    text = Text()
    text.append("* " if current else "  ", style="bold green")
    text.append(context.name, style="bold")
    text.append(f"  {context.server or '(no cluster entry)'}", style="dim")
    if context.namespace != "default":
        text.append(f"  ns {context.namespace}", style="dim")
    return text


def render_checks(results: list[CheckResult]) -> Text:
    text = Text()
    text.append("Preflight\n", style="bold")
    for check in results:
        mark, style = _CHECK_MARK[check.status]
        text.append(f"{mark} ", style=style)
        text.append(check.title)
        if check.detail:
            text.append(f" — {check.detail}", style="dim")
        text.append("\n")
        if check.remedy and check.status is not CheckStatus.OK:
            text.append(f"    {check.remedy}\n", style="italic")
    return text


def render_config(rows: list[tuple[str, str]]) -> Group:
    """The run's settings, a value wrapping under its own column (never back under the keys)."""
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return Group(Text("Configuration", style="bold"), table,
                 Text("\nChange with flags, RTUI_* env or rtui.toml (rtui config show)", style="dim italic"))
