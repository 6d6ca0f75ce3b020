"""What a target adds to the first screen: the hooks ``screens.target.TargetScreen`` calls.

The screen draws what every target has (the targets, the configuration, the checks); the run's
target names its panel (``Target.panel``, "module:Class", imported when the screen is built) for
the rest: the aws feasibility matrix (``targets.aws.panel``), the kube context picker
(``targets.kube.panel``). The local target has none beyond this base: its configuration summary.

A panel's workers post a ``PanelUpdated`` (or a subclass) with what to change; the screen applies it
in its handler (workers never touch widgets, DESIGN.md §7). The panel's keys are its own (``bindings``:
each action ``panel('<name>')``, which the screen hands to ``act``). What the App must do for it is one
of two messages, neither naming a target's concepts: ``Reconfigure`` (the same run with some settings
changed, checked afresh: another AZ, another context) and ``ConfirmAsked`` (a modal first, then the
panel's own callback: a quota request).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from textual.binding import Binding
from textual.message import Message
from textual.screen import ModalScreen
from textual.widget import Widget

from tui.screen import RtuiScreen

if TYPE_CHECKING:
    from backend.resources import CheckResult
    from backend.targets import Target


class TargetPanel:
    """The first screen's part of one target; this base adds nothing (the local target's)."""

    # Its keys: each binding's action is ``panel('<name>')``; the screen calls ``enabled`` and ``act`` with the name.
    bindings: ClassVar[tuple[Binding, ...]] = ()
    # The option lists whose Enter picks something of the panel (another context, another AZ).
    pickers: ClassVar[frozenset[str]] = frozenset()
    # Whether the targets list gives up its margins, so the checks fit beside the panel at 80×24.
    compact: ClassVar[bool] = False

    def __init__(self, screen: PanelHost) -> None:
        self.screen = screen

    def above(self) -> Iterable[Widget]:
        """Widgets above the configuration and the checks."""
        return ()

    def beside_config(self) -> Iterable[Widget]:
        """Widgets in a column with the configuration box, left of the checks (none: the box alone)."""
        return ()

    def config_rows(self) -> list[tuple[str, str]]:
        """Rows of the configuration summary after the common ones."""
        return []

    def mounted(self) -> Widget | None:
        """Once mounted: the widget that gets the focus (None: the targets list)."""
        return None

    def after_first_paint(self) -> None:
        """What loads after the first frame (besides the checks)."""

    def before_checks(self) -> None:
        """Just before the preflight runs."""

    def takes_failure(self) -> tuple[str, str] | None:
        """(check id, title) when the panel says a failed preflight itself (no notification then)."""
        return None

    def checks_finished(self, results: list[CheckResult]) -> list[CheckResult]:
        """The checks done: what the checks box shows (the panel may show some of them itself)."""
        return results

    def rechecking(self) -> None:
        """The checks run again."""

    def enabled(self, action: str) -> bool:
        """Whether the key of ``bindings`` for this action can act now (else the footer hides it)."""
        return True

    def enter_picks(self, list_id: str, option_id: str) -> bool:
        """Whether Enter on this option of one of ``pickers`` picks another one (it acts even past a failed check)."""
        return False

    def choose(self, list_id: str, option_id: str) -> bool:
        """Enter on an option of one of ``pickers``: True when it picked another one (the screen goes no further)."""
        return False

    def act(self, action: str) -> None:
        """The action of one of ``bindings``, run."""


class PanelHost(RtuiScreen):
    """The screen a panel is on (``screens.target.TargetScreen``), as the panel may use it."""

    def action_recheck(self) -> None:
        """Run the checks again."""
        raise NotImplementedError


def panel_for(target: Target[Any], screen: PanelHost) -> TargetPanel:
    """The target's panel on ``screen``: its module is imported now (the first screen's, never before)."""
    if target.panel is None:
        return TargetPanel(screen)
    module, _, name = target.panel.partition(":")
    panel = getattr(importlib.import_module(module), name)(screen)
    if not isinstance(panel, TargetPanel):
        raise TypeError(f"{target.panel} is not a TargetPanel")
    return panel


@dataclass
class PanelUpdated(Message):
    """A panel's worker has news: the screen's handler runs ``apply`` (which changes the widgets)."""

    apply: Callable[[], None]


@dataclass
class Reconfigure(Message):
    """The same run with ``update`` applied to its config, checked afresh on a new first screen (another AZ,
    another context). ``where`` names what it had (for the refusal when the run already has resources
    there) and ``otherwise`` the other way to get there."""

    update: dict[str, Any]
    where: str
    otherwise: str


@dataclass
class ConfirmAsked(Message):
    """A change that must be confirmed first: the App shows ``modal`` and calls ``then`` on a yes, while the
    screen that asked is still on top (never in read-only mode)."""

    modal: ModalScreen[bool]
    then: Callable[[], None]
