"""Widgets: a step pane for provisioning (the log tail is in ``tui.logtail``)."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.visual import VisualType
from textual.widgets import Footer, Label, ProgressBar, Static

from backend.resources import EventKind, StepEvent

_NUMBERS = re.compile(r"\d+(?:\.\d+)?")
_STATUS_STYLE = {
    "pending": ("○", "dim"), "running": ("◐", "bold yellow"), "done": ("✓", "bold green"),
    "failed": ("✗", "bold red"), "skipped": ("=", "green"), "cancelled": ("⊘", "red"),
}


class StepMessage(Static):
    """A pane's message lines (progress, or the cause and the remedy of a failure), as tall as they wrap.

    Textual (8.2) caches a widget's box model under a counter that ``refresh(layout=True)`` advances only
    when no layout is already pending for it. A burst of events right after the pane is mounted (before
    its first idle) lets a layout pass cache the height of an earlier text, and later updates, under the
    same counter, kept it: a failure's second line (its remedy) was cut off. Each update drops that cache.
    """

    def update(self, content: VisualType = "", *, layout: bool = True) -> None:
        super().update(content, layout=layout)
        cache = getattr(self, "_box_model_cache", None)  # private to Textual: tolerate its absence
        if cache is not None:
            cache.clear()


class StepPane(Vertical):
    """One provisioning step: status, title, elapsed time, last message, progress."""

    status: reactive[str] = reactive("pending")
    """pending | running | done | failed | skipped | cancelled"""
    message: reactive[str] = reactive("")

    RECENT = 3  # messages a pane keeps on screen

    def __init__(self, step_id: str, title: str, expected_s: float, *,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(id=self.dom_id(step_id), classes="step-pane")
        self.step_id = step_id
        self.title_text = title
        self.expected_s = expected_s
        # A running step's elapsed time (and its ETA bar) is measured against this; a stopped one's
        # comes from its events' timestamps alone.
        self.clock = clock
        self.started: float | None = None
        self.ended: float | None = None
        self.reported_fraction = False  # the step reports its own progress; else the bar follows the ETA
        self.recent: deque[str] = deque(maxlen=self.RECENT)

    @staticmethod
    def dom_id(step_id: str) -> str:
        """A widget id for a step (addresses hold dots, which ids may not)."""
        return "step-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in step_id)

    def compose(self) -> ComposeResult:
        with Horizontal(classes="step-head"):
            yield Label(id="step-status")
            yield Label(self.title_text, classes="step-title")
            yield Label("", id="step-elapsed")
        yield StepMessage("", id="step-message")
        yield ProgressBar(total=1.0, show_eta=False, show_percentage=True, id="step-progress")

    def on_mount(self) -> None:
        self._render_status()
        self.set_interval(0.5, self._tick)

    def _tick(self) -> None:
        if self.started is None:
            return
        end = self.ended if self.ended is not None else self.clock()
        elapsed = end - self.started
        left = self.expected_s - elapsed
        eta = f" · ~{left:.0f}s left" if self.ended is None and self.status == "running" and left >= 1 else ""
        self.query_one("#step-elapsed", Label).update(f"{elapsed:5.1f}s{eta}")
        if self.status == "running" and not self.reported_fraction and self.expected_s > 0:
            # No progress of its own: the bar follows the typical duration, never reaching the end.
            self.query_one("#step-progress", ProgressBar).update(progress=min(0.95, elapsed / self.expected_s))

    def _say(self, message: str) -> None:
        if message:
            if self.recent and _NUMBERS.sub("#", self.recent[-1]) == _NUMBERS.sub("#", message):
                self.recent[-1] = message  # a counter moving ("waiting (2s)", "(3s)"): one line, updated
            else:
                self.recent.append(message)
        self.message = "\n".join(self.recent)

    def _render_status(self) -> None:
        mark, style = _STATUS_STYLE.get(self.status, ("?", ""))
        self.query_one("#step-status", Label).update(Text(f"{mark} ", style=style))
        self.set_class(self.status == "failed", "-failed")
        self.set_class(self.status in ("done", "skipped"), "-done")

    def watch_status(self) -> None:
        if self.is_mounted:
            self._render_status()

    def watch_message(self, message: str) -> None:
        if self.is_mounted:
            self.query_one("#step-message", StepMessage).update(Text(message))

    def apply_event(self, event: StepEvent) -> None:
        bar = self.query_one("#step-progress", ProgressBar)
        if event.kind is EventKind.STARTED:
            self.started = self.started or event.ts
            self.status = "running"
        elif event.kind is EventKind.PROGRESS:
            if event.message:
                self._say(event.message)
            if event.fraction is not None:
                self.reported_fraction = True
                bar.update(progress=event.fraction)
        elif event.kind is EventKind.RETRYING:
            self._say(f"↻ {event.message}")
        elif event.kind in (EventKind.DONE, EventKind.SKIPPED):
            self.ended = event.ts
            self.started = self.started or event.ts
            self.status = "done" if event.kind is EventKind.DONE else "skipped"
            bar.update(progress=1.0)
            # Done: its outcome is the last word; the chatter before it goes (a pane a line shorter).
            last = event.message or (self.recent[-1] if self.recent else "")
            self.recent.clear()
            self._say(last)
        elif event.kind in (EventKind.FAILED, EventKind.CANCELLED):
            self.ended = event.ts
            self.status = "failed" if event.kind is EventKind.FAILED else "cancelled"
            # The root cause and what to do, in place of the progress chatter.
            self.recent.clear()
            self.message = event.message + (f"\n→ {event.remedy}" if event.remedy else "")
        self._tick()


class RtuiFooter(Footer):
    """Textual's footer, tightened below ``NARROW`` columns so every key stays on the line: compact (no
    padding around each key) and without the palette's ``^p`` hint (the help, `?`, names ctrl+p). At 80
    columns the run screen's footer otherwise ended "q Qui▏" and `? Help` was off the screen."""

    NARROW = 100

    def on_resize(self) -> None:
        narrow = self.size.width < self.NARROW
        self.compact = narrow
        self.show_command_palette = not narrow
