"""The confirmation before rtui files a vCPU quota increase request with AWS (a support case)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from targets.aws.cloud.report import QuotaStatus


class ConfirmQuotaIncrease(ModalScreen[bool]):
    """Answers True only on ``y``: filing a request is an explicit act, never a default."""

    DEFAULT_CSS = """
    ConfirmQuotaIncrease { align: center middle; }
    #quota-confirm { width: 74; max-width: 100%; height: auto; border: thick $warning; padding: 1 2;
                     background: $surface; }
    """
    BINDINGS = [
        Binding("y", "answer(True)", "File the request", id="quota_yes",
                tooltip="Ask AWS for this quota now (a Service Quotas request)"),
        Binding("n,escape", "answer(False)", "Cancel", id="quota_no", tooltip="Go back without asking AWS"),
    ]

    def __init__(self, requests: list[tuple[str, QuotaStatus]]) -> None:
        super().__init__()
        self.requests = requests

    def compose(self) -> ComposeResult:
        text = Text()
        text.append("Request a quota increase from AWS?\n\n", style="bold")
        for region, quota in self.requests:
            limit = f"{quota.limit:.0f}" if quota.limit is not None else "?"
            text.append(f"{region}  {quota.code}", style="bold")
            text.append(f" {quota.name}\n" if quota.name else "\n", style="dim")
            text.append(f"  limit {limit} → {quota.request_value} vCPUs "
                        f"(used {quota.used}, the plan needs {quota.needed})\n")
        text.append("\nAWS may take hours to days to answer; the request shows in the Service Quotas console.\n",
                    style="dim italic")
        text.append("y", style="bold")
        text.append(" file it   ")
        text.append("n", style="bold")
        text.append(" cancel")
        with Vertical(id="quota-confirm"):
            yield Static(text, id="quota-text")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
