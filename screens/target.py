"""First screen: pick the target, see the configuration and the live preflight checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Footer, Header, OptionList, Static
from textual.widgets.option_list import Option

from backend.model import CheckStatus
from tui.screen import RtuiScreen

if TYPE_CHECKING:
    from backend.model import CheckResult

TARGETS = [
    ("local", "Local — a real Ray cluster on this machine, tiny model, no cloud account"),
    ("aws", "AWS — new EKS cluster with EFA GPU nodes (preflight: rtui check --target aws)"),
    ("kube", "Kubernetes — an existing cluster from kubeconfig"),
]
_CHECK_MARK = {CheckStatus.OK: ("✓", "green"), CheckStatus.WARN: ("!", "yellow"), CheckStatus.FAIL: ("✗", "red"),
               CheckStatus.INFO: ("i", "blue")}


class TargetScreen(RtuiScreen):
    @dataclass
    class Chosen(Message):
        """The user wants the plan for this target."""

    BINDINGS = [
        Binding("enter", "next", "Review plan", id="next", tooltip="Compute the plan for this target"),
        Binding("r", "recheck", "Re-check", id="recheck", tooltip="Run the preflight checks again"),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="target-body"):
            yield Static("Where should this run go?", classes="heading")
            options = [Option(label, id=name, disabled=name != "local") for name, label in TARGETS]
            yield OptionList(*options, id="targets")
            with Horizontal(id="target-details"):
                yield Static(id="config-summary", classes="panel")
                yield Static("checking…", id="checks", classes="panel")
        yield Footer()

    checks: list[CheckResult] | None = None

    def on_mount(self) -> None:
        cfg = self.session.config
        summary = Text()
        summary.append("Configuration\n", style="bold")
        rows = [("cluster", cfg.cluster_name), ("workers", str(cfg.effective_workers())),
                ("steps", str(cfg.steps)), ("seq len × batch", f"{cfg.seq_len} × {cfg.effective_batch_size()}"),
                ("precision", cfg.effective_precision()),
                ("model", f"tiny Qwen2 ({cfg.local_layers} layers, hidden {cfg.local_hidden_size})"
                 if cfg.target == "local" else cfg.model_id)]
        for key, value in rows:
            summary.append(f"{key:<16}", style="dim")
            summary.append(f"{value}\n")
        summary.append("\nChange with flags, RTUI_* env or rtui.toml (rtui config show)", style="dim italic")
        self.query_one("#config-summary", Static).update(summary)
        targets = self.query_one(OptionList)
        targets.highlighted = 0
        targets.focus()
        # After the first paint: the checks import the target's modules, which the first frame doesn't need.
        self.call_after_refresh(self.run_checks)

    @work(exclusive=True, group="checks")
    async def run_checks(self) -> None:
        panel = self.query_one("#checks", Static)
        panel.update("checking…")
        try:
            results = await self.session.preflight()
        except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
            self.app.report_error(exc)
            return
        self.checks = results
        panel.update(render_checks(results))

    def action_recheck(self) -> None:
        self.run_checks()

    def on_option_list_option_selected(self, _event: OptionList.OptionSelected) -> None:
        self.action_next()

    def action_next(self) -> None:
        failed = [c for c in self.checks or [] if c.status is CheckStatus.FAIL]
        if failed:
            self.notify(f"{failed[0].title}: {failed[0].remedy or failed[0].detail}", severity="error")
            return
        self.post_message(self.Chosen())


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
