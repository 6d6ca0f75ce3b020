"""First screen: pick the target, see the configuration and the live preflight checks.

What every target has is drawn here: the targets, the configuration, the checks. The run's target
adds its own panel (``tui.target_panel``; the kube context picker in ``targets.kube.panel``, the aws
feasibility matrix in ``targets.aws.panel``), whose module loads with this screen, not before.
The panel's keys are its own (``TargetPanel.bindings``, added to this screen's when it is made); it
picks another context or AZ by posting ``Reconfigure``: the App makes a session for it (and this
screen anew, whose checks then run against it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Header, OptionList, Static
from textual.widgets.option_list import Option
from textual.worker import Worker

from backend import targets
from backend.errors import RtuiError
from backend.resources import CheckResult, CheckStatus
from tui.checks import render_checks, render_config
from tui.target_panel import PanelHost, PanelUpdated, TargetPanel, panel_for
from tui.widgets import RtuiFooter


def selectable_targets(target: str) -> set[str]:
    """The session's own target: its run, record and lock belong to it (another target is another run)."""
    return {target}


def unselectable_reason(target: str) -> str | None:
    """Why the greyed targets cannot be chosen in a session for ``target`` (None when none is greyed)."""
    others = [name for name in targets.names() if name not in selectable_targets(target)]
    if not others:
        return None
    article = "an" if target[0] in "aeiou" else "a"
    return f"greyed: this is {article} {target} run; use `rtui --target {'|'.join(others)}`"


class TargetScreen(PanelHost):
    HELP_TITLE = "the target and its checks"
    # At 24 rows the matrix and the context picker give up rows so the configuration and the checks
    # keep a panel each; a panel whose text is longer scrolls inside itself.
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]
    DEFAULT_CSS = """
    TargetScreen #target-left { width: 1fr; height: 1fr; }
    TargetScreen #target-left #config-box { width: 100%; }
    TargetScreen.-short #target-body { padding: 0 2; }
    TargetScreen.-short #matrix { max-height: 7; }
    TargetScreen.-short #contexts { max-height: 4; }
    TargetScreen #contexts { height: auto; max-height: 8; }
    TargetScreen #contexts-heading { padding: 0 1; text-style: bold; }
    TargetScreen #targets { border-subtitle-color: $text-muted; border-subtitle-style: italic; }
    """

    @dataclass
    class Chosen(Message):
        """The user wants the plan for this target."""

    @dataclass
    class ChecksFinished(Message):
        results: list[CheckResult]

    BINDINGS = [
        # A priority binding: the focused list's own Enter would shadow it, and hide it from the footer.
        Binding("enter", "next", "Review plan", id="next", priority=True,
                tooltip="Compute the plan for this target (on another AZ or context: use that one first)"),
        Binding("r", "recheck", "Re-check", id="recheck", tooltip="Run the preflight checks again"),
    ]

    checks: list[CheckResult] | None = None

    @cached_property
    def panel(self) -> TargetPanel:
        """The run's target's part of this screen."""
        return panel_for(self.session.target, self)

    def compose(self) -> ComposeResult:
        # The panel's own keys join the screen's (a fresh list per key: the class's map is shared).
        keys = self._bindings.key_to_bindings
        for binding in self.panel.bindings:
            keys[binding.key] = [*keys.get(binding.key, []), binding]
        yield Header()
        with Vertical(id="target-body"):
            yield Static("Where should this run go?", classes="heading")
            target = self.session.config.target
            enabled = selectable_targets(target)
            options = [Option(targets.get(name).label, id=name, disabled=name not in enabled)
                       for name in targets.names()]
            choices = OptionList(*options, id="targets")
            choices.border_subtitle = unselectable_reason(target)
            yield choices
            yield from self.panel.above()
            with Horizontal(id="target-details"):
                beside = list(self.panel.beside_config())
                if beside:
                    with Vertical(id="target-left"):
                        yield from beside
                        yield self._config_box()
                else:
                    yield self._config_box()
                with VerticalScroll(id="checks-box", classes="panel"):
                    yield Static("checking…", id="checks")
        yield RtuiFooter()

    @staticmethod
    def _config_box() -> VerticalScroll:
        return VerticalScroll(Static(id="config-summary"), id="config-box", classes="panel")

    def on_mount(self) -> None:
        cfg = self.session.config
        tiny = cfg.target_defaults().tiny
        rows = [("cluster", cfg.cluster_name), ("workers", str(cfg.effective_workers())),
                ("steps", str(cfg.steps)),
                ("seq len × batch", f"{cfg.effective_seq_len()} × {cfg.effective_batch_size()}"),
                ("precision", cfg.effective_precision()),
                ("model", cfg.effective_model_id()
                 or f"tiny Qwen2 ({tiny.layers} layers, hidden {tiny.hidden_size})")]
        self.query_one("#config-summary", Static).update(render_config(rows + self.panel.config_rows()))
        choices = self.query_one("#targets", OptionList)
        if self.panel.compact:  # two rows of air fewer, so the checks fit beside the picker at 80×24
            for widget in (self.query_one(".heading"), choices):
                widget.styles.margin = (0, 0, 0, 0)
        choices.highlighted = next(i for i, name in enumerate(targets.names())
                                   if name in selectable_targets(cfg.target))
        # Where the target has a choice left to make (a context, an AZ), its picker has the focus.
        (self.panel.mounted() or choices).focus()
        # After the first paint: the checks import the target's modules, which the first frame doesn't need.
        self.call_after_refresh(self.run_checks)
        self.call_after_refresh(self.panel.after_first_paint)

    # --- workers: they post messages, the handlers below change widgets ------------------
    @work(exclusive=True, group="checks", exit_on_error=False)
    async def run_checks(self) -> None:
        self.panel.before_checks()
        self.post_message(self.ChecksFinished(await self.session.preflight()))

    def worker_failed(self, worker: Worker[Any], error: BaseException) -> bool:
        if worker.group != "checks":
            return False
        line = error.message if isinstance(error, RtuiError) else f"{type(error).__name__}: {error}"
        taken = self.panel.takes_failure()
        check_id, title = taken or ("preflight", "Checks")
        # The checks panel has the failure too (never "checking…" for ever).
        self.post_message(self.ChecksFinished([CheckResult(
            id=check_id, title=title, status=CheckStatus.FAIL, detail=line,
            remedy=error.remedy if isinstance(error, RtuiError) else None)]))
        return taken is not None  # the panel says it (the aws matrix): no notification too

    def on_target_screen_checks_finished(self, message: ChecksFinished) -> None:
        self.checks = message.results
        self.query_one("#checks", Static).update(render_checks(self.panel.checks_finished(message.results)))
        self.refresh_bindings()

    @on(PanelUpdated)
    def panel_updated(self, message: PanelUpdated) -> None:
        message.apply()

    # --- actions -------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "next":  # offered only where Enter acts: no plan to review past a failed check
            return not any(c.status is CheckStatus.FAIL for c in self.checks or []) or self._enter_picks()
        if action == "panel":
            return self.panel.enabled(str(parameters[0]))
        return True

    def _enter_picks(self) -> bool:
        """Whether Enter would pick another option of the panel (that it does even past a failed check)."""
        focused = self.focused
        if not isinstance(focused, OptionList) or focused.highlighted is None or focused.id not in self.panel.pickers:
            return False
        option = focused.get_option_at_index(focused.highlighted)
        if option.disabled or option.id is None:
            return False
        return self.panel.enter_picks(focused.id, option.id)

    def action_recheck(self) -> None:
        self.query_one("#checks", Static).update("checking…")
        self.checks = None
        self.panel.rechecking()
        self.refresh_bindings()
        self.run_checks()

    def action_panel(self, name: str) -> None:
        """A key of the panel's own (``TargetPanel.bindings``)."""
        self.panel.act(name)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_list.id in self.panel.pickers:
            self.refresh_bindings()  # the quota on offer is the highlighted region's; Enter may pick it

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """A click on an option (Enter is the screen's own key, below)."""
        event.stop()
        self.choose(event.option_list.id, event.option.id)

    def action_next(self) -> None:
        focused = self.focused
        option = None
        if isinstance(focused, OptionList) and focused.highlighted is not None:
            option = focused.get_option_at_index(focused.highlighted)
        if option is not None and not option.disabled:
            self.choose(focused.id if isinstance(focused, OptionList) else None, option.id)
        else:
            self.go_on()

    def choose(self, list_id: str | None, option_id: str | None) -> None:
        """Enter on an option: another AZ or context is used first (a new session); the one in use goes on."""
        if list_id in self.panel.pickers and option_id is not None and self.panel.choose(list_id, option_id):
            return
        self.go_on()

    def go_on(self) -> None:
        failed = [c for c in self.checks or [] if c.status is CheckStatus.FAIL]
        if failed:
            self.notify(f"{failed[0].title}: {failed[0].remedy or failed[0].detail}", severity="error")
            return
        self.post_message(self.Chosen())
