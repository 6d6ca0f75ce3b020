"""What a target adds to the first screen: the hooks ``screens.target.TargetScreen`` calls.

The screen draws what every target has (the targets, the configuration, the checks); the run's
target names its panel (``Target.panel``, "module:Class", imported when the screen is built) for
the rest: the aws feasibility matrix (``targets.aws.panel``), the kube context picker
(``targets.kube.panel``). The local target has none beyond this base: its configuration summary.

A panel's workers post a ``PanelUpdated`` (or a subclass) with what to change; the screen applies it
in its handler (workers never touch widgets, DESIGN.md §7).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from textual.message import Message
from textual.widget import Widget

if TYPE_CHECKING:
    from backend.model import CheckResult
    from backend.targets import Target
    from screens.target import TargetScreen


class TargetPanel:
    """The first screen's part of one target; this base adds nothing (the local target's)."""

    # The screen's actions this panel serves (pick_context, pick_zone, all_regions, request_quota).
    offers: ClassVar[frozenset[str]] = frozenset()
    # The option lists whose Enter picks something of the panel (another context, another AZ).
    pickers: ClassVar[frozenset[str]] = frozenset()
    # Whether the targets list gives up its margins, so the checks fit beside the panel at 80×24.
    compact: ClassVar[bool] = False

    def __init__(self, screen: TargetScreen) -> None:
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
        """Whether one of ``offers`` can act now."""
        return True

    def enter_picks(self, list_id: str, option_id: str) -> bool:
        """Whether Enter on this option of one of ``pickers`` picks another one (it acts even past a failed check)."""
        return False

    def choose(self, list_id: str, option_id: str) -> bool:
        """Enter on an option of one of ``pickers``: True when it picked another one (the screen goes no further)."""
        return False

    def act(self, action: str) -> None:
        """One of ``offers``, run."""


def panel_for(target: Target, screen: TargetScreen) -> TargetPanel:
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
