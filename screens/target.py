"""First screen: pick the target, see the configuration and the live preflight checks.

On the kube target it also offers the kubeconfig's contexts: choosing another posts
``ContextChosen`` and the App makes a session for that context (and this screen anew, whose
checks then run against the other cluster). The allocatable check is one of those checks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Header, OptionList, Static
from textual.widgets.option_list import Option

from backend.errors import RtuiError
from backend.model import CheckStatus
from tui.screen import RtuiScreen

if TYPE_CHECKING:
    from backend.layers.kubernetes.access import KubeContext
    from backend.model import CheckResult

TARGETS = [
    ("local", "Local — a real Ray cluster on this machine, tiny model, no cloud account"),
    ("aws", "AWS — new EKS cluster with EFA GPU nodes (preflight: rtui check --target aws)"),
    ("kube", "Kubernetes — an existing cluster from kubeconfig"),
]
_CHECK_MARK = {CheckStatus.OK: ("✓", "green"), CheckStatus.WARN: ("!", "yellow"), CheckStatus.FAIL: ("✗", "red"),
               CheckStatus.INFO: ("i", "blue")}


def selectable_targets(target: str) -> set[str]:
    """The session's own target; aws is a preflight only in this version, so an aws session keeps local."""
    return {"local"} if target == "aws" else {target}


class TargetScreen(RtuiScreen):
    DEFAULT_CSS = """
    TargetScreen #target-left { width: 1fr; height: auto; }
    TargetScreen #contexts { height: auto; max-height: 8; }
    TargetScreen #contexts-heading { padding: 0 1; text-style: bold; }
    """

    @dataclass
    class Chosen(Message):
        """The user wants the plan for this target."""

    @dataclass
    class ContextChosen(Message):
        """The user picked another kubeconfig context: the App makes a session for it."""

        name: str

    @dataclass
    class ContextsLoaded(Message):
        """The kubeconfig was read (``error`` is its one line when it could not be)."""

        contexts: list[KubeContext]
        current: str | None
        error: str | None = None

    @dataclass
    class ChecksFinished(Message):
        results: list[CheckResult]

    BINDINGS = [
        Binding("enter", "next", "Review plan", id="next", tooltip="Compute the plan for this target"),
        Binding("r", "recheck", "Re-check", id="recheck", tooltip="Run the preflight checks again"),
        Binding("c", "pick_context", "Context", id="context",
                tooltip="Choose the kubeconfig context (Enter on another one re-checks against it)"),
    ]

    checks: list[CheckResult] | None = None
    kubeconfig_current: str | None = None  # the kubeconfig's current-context, once read

    @property
    def kube(self) -> bool:
        return self.session.config.target == "kube"

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="target-body"):
            yield Static("Where should this run go?", classes="heading")
            enabled = selectable_targets(self.session.config.target)
            options = [Option(label, id=name, disabled=name not in enabled) for name, label in TARGETS]
            yield OptionList(*options, id="targets")
            with Horizontal(id="target-details"):
                if self.kube:  # the picker beside the checks: at 80×24 both stay in view
                    with Vertical(id="target-left"):
                        yield Static("Kubeconfig context", id="contexts-heading")
                        yield OptionList(Option("reading the kubeconfig…", disabled=True), id="contexts")
                        yield Static(id="config-summary", classes="panel")
                else:
                    yield Static(id="config-summary", classes="panel")
                yield Static("checking…", id="checks", classes="panel")
        yield Footer()

    def on_mount(self) -> None:
        cfg = self.session.config
        summary = Text()
        summary.append("Configuration\n", style="bold")
        rows = [("cluster", cfg.cluster_name), ("workers", str(cfg.effective_workers())),
                ("steps", str(cfg.steps)), ("seq len × batch", f"{cfg.seq_len} × {cfg.effective_batch_size()}"),
                ("precision", cfg.effective_precision()),
                ("model", f"tiny Qwen2 ({cfg.local_layers} layers, hidden {cfg.local_hidden_size})"
                 if cfg.target == "local" else cfg.model_id)]
        if self.kube:
            rows += [("namespace", cfg.namespace), ("GPU nodes", f"{cfg.gpu_node_count} × {cfg.gpus_per_node} GPUs")]
        for key, value in rows:
            summary.append(f"{key:<16}", style="dim")
            summary.append(f"{value}\n")
        summary.append("\nChange with flags, RTUI_* env or rtui.toml (rtui config show)", style="dim italic")
        self.query_one("#config-summary", Static).update(summary)
        targets = self.query_one("#targets", OptionList)
        if self.kube:  # two rows of air fewer, so the checks fit beside the picker at 80×24
            for widget in (self.query_one(".heading"), targets):
                widget.styles.margin = (0, 0, 0, 0)
        targets.highlighted = next(i for i, (name, _) in enumerate(TARGETS)
                                   if name in selectable_targets(cfg.target))
        # On kube the context is the one choice left to make here: the picker has the focus.
        (self.query_one("#contexts", OptionList) if self.kube else targets).focus()
        # After the first paint: the checks import the target's modules, which the first frame doesn't need.
        self.call_after_refresh(self.run_checks)
        if self.kube:
            self.call_after_refresh(self.load_contexts)

    # --- workers: they post messages, the handlers below change widgets ------------------
    @work(exclusive=True, group="checks")
    async def run_checks(self) -> None:
        try:
            results = await self.session.preflight()
        except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
            self.app.report_error(exc)
            return
        self.post_message(self.ChecksFinished(results))

    @work(exclusive=True, group="contexts")
    async def load_contexts(self) -> None:
        from backend.layers.kubernetes.access import kube_contexts

        try:
            contexts, current = await asyncio.to_thread(kube_contexts, self.session.config.kubeconfig)
        except RtuiError as exc:  # the preflight's Kubernetes API check shows it with its remedy
            self.post_message(self.ContextsLoaded([], None, exc.message))
            return
        except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
            self.app.report_error(exc)
            return
        self.post_message(self.ContextsLoaded(contexts, current))

    def on_target_screen_checks_finished(self, message: ChecksFinished) -> None:
        self.checks = message.results
        self.query_one("#checks", Static).update(render_checks(message.results))

    def on_target_screen_contexts_loaded(self, message: ContextsLoaded) -> None:
        picker = self.query_one("#contexts", OptionList)
        picker.clear_options()
        if message.error is not None:
            picker.add_option(Option(Text(f"no contexts: {message.error}", style="red"), disabled=True))
            picker.disabled = True  # nothing to pick: Enter goes to the targets (and is refused there)
            self.query_one("#targets", OptionList).focus()
            return
        self.kubeconfig_current = message.current
        chosen = self.session.config.context or message.current
        picker.add_options([Option(render_context(c, current=c.name == message.current), id=c.name)
                            for c in message.contexts])
        names = [c.name for c in message.contexts]
        if chosen in names:
            picker.highlighted = names.index(chosen)

    # --- actions -------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "pick_context":
            return self.kube
        return True

    def action_recheck(self) -> None:
        self.query_one("#checks", Static).update("checking…")
        self.checks = None
        self.run_checks()

    def action_pick_context(self) -> None:
        self.query_one("#contexts", OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_list.id == "contexts" and event.option.id is not None:
            in_use = self.session.config.context or self.kubeconfig_current
            if event.option.id != in_use:
                self.post_message(self.ContextChosen(event.option.id))
                return
        self.action_next()

    def action_next(self) -> None:
        failed = [c for c in self.checks or [] if c.status is CheckStatus.FAIL]
        if failed:
            self.notify(f"{failed[0].title}: {failed[0].remedy or failed[0].detail}", severity="error")
            return
        self.post_message(self.Chosen())


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
