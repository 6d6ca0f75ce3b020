"""The kube target's part of the first screen: the kubeconfig's contexts, beside the configuration.

Choosing another context posts ``Reconfigure`` and the App makes a session for
that context (and the screen anew, whose checks then run against the other cluster).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from backend.errors import RtuiError
from targets.kube.config import KubeConfig
from tui.checks import render_context
from tui.target_panel import PanelUpdated, Reconfigure, TargetPanel

if TYPE_CHECKING:
    from targets.kube.kubeconfig import KubeContext


@dataclass
class ContextsLoaded(PanelUpdated):
    """The kubeconfig was read (or could not be: the picker then says why)."""


class ContextPanel(TargetPanel):
    bindings = (Binding("c", "panel('pick_context')", "Context", id="context",
                        tooltip="Choose the kubeconfig context (Enter on another one re-checks against it)"),)
    pickers = frozenset({"contexts"})
    compact = True
    kubeconfig_current: str | None = None  # the kubeconfig's current-context, once read

    def beside_config(self) -> Iterable[Widget]:
        # The picker beside the checks: at 80×24 both stay in view.
        yield Static("Kubeconfig context", id="contexts-heading")
        yield OptionList(Option("reading the kubeconfig…", disabled=True), id="contexts")

    def picker(self) -> OptionList:
        return self.screen.query_one("#contexts", OptionList)

    @property
    def config(self) -> KubeConfig:
        return KubeConfig.of(self.screen.session.config)

    def config_rows(self) -> list[tuple[str, str]]:
        cfg = self.config
        return [("namespace", cfg.namespace), ("GPU nodes", f"{cfg.gpu_node_count} × {cfg.gpus_per_node} GPUs")]

    def mounted(self) -> Widget | None:
        return self.picker()  # the context is the one choice left to make here

    def after_first_paint(self) -> None:
        self.screen.run_worker(self.load_contexts(), exclusive=True, group="contexts", exit_on_error=False)

    async def load_contexts(self) -> None:
        # lazy: the kubernetes client (~1 s) after the first frame: the picker paints, then fills
        from targets.kube.kubeconfig import kube_contexts

        try:
            contexts, current = await asyncio.to_thread(kube_contexts, self.config.kubeconfig)
        except RtuiError as exc:  # the preflight's Kubernetes API check shows it with its remedy
            error = exc.message
            self.screen.post_message(ContextsLoaded(lambda: self.show_error(error)))
            return
        self.screen.post_message(ContextsLoaded(lambda: self.show(contexts, current)))

    def show_error(self, error: str) -> None:
        picker = self.picker()
        picker.clear_options()
        picker.add_option(Option(Text(f"no contexts: {error}", style="red"), disabled=True))
        picker.disabled = True  # nothing to pick: Enter goes to the targets (and is refused there)
        self.screen.query_one("#targets", OptionList).focus()

    def show(self, contexts: list[KubeContext], current: str | None) -> None:
        picker = self.picker()
        picker.clear_options()
        self.kubeconfig_current = current
        chosen = self.config.context or current
        picker.add_options([Option(render_context(c, current=c.name == current), id=c.name) for c in contexts])
        names = [c.name for c in contexts]
        if chosen in names:
            picker.highlighted = names.index(chosen)

    def in_use(self) -> str | None:
        return self.config.context or self.kubeconfig_current

    def enter_picks(self, list_id: str, option_id: str) -> bool:
        return option_id != self.in_use()

    def choose(self, list_id: str, option_id: str) -> bool:
        if option_id == self.in_use():
            return False
        had = self.config.context or "(current)"
        self.screen.post_message(Reconfigure({"context": option_id}, f"context {had}", "or start rtui with --context"))
        return True

    def act(self, action: str) -> None:
        self.picker().focus()
