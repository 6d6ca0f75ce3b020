"""The live log tail (Toolong-style): a bounded window of lines, a filter, follow and pause.

Producers ``push`` lines into a pending ring; one timer drains it at 20 Hz with a single
``Log.write_lines`` (one ``write_line`` per line costs ~140 µs, DESIGN.md §8). The widget keeps
at most ``max_lines`` lines; the history lives in the run's spool on disk.

A drain's work is bounded by what the view can keep, not by how fast lines arrive: of a batch
larger than the window only its newest ``max_lines`` are cleaned, filtered and cut (the older ones
would leave the window in the same drain; they are counted, and the spool has them), and only the
rows the log can hold are written. A flood of 100k lines/s then costs the loop a bounded slice of
each frame (bench/tui_flood.py).

What is shown is derived from the window: metric lines (``RTUI_METRIC {json}``, which feed the
graph) are hidden unless asked for, and a filter keeps only lines that contain its text. While
the view is scrolled up it is paused: new lines are counted ("+N new lines") but not written, so
the text under the reader does not move. Reaching the bottom (End) follows again. ``Log`` never
wraps, so lines are cut to the view's width when written (the rest hangs indented below): every
line is whole on screen and there is no horizontal scrollbar; a resize writes the window again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import islice
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Input, Label, Log

from backend.textutil import display_lines
from training.protocol import METRIC_TAG

DRAIN_HZ = 20
WRAP_INDENT = "  "  # a wrapped line's continuation hangs under its text


def wrap_lines(lines: list[str], width: int, *, keep: int | None = None) -> list[str]:
    """Cut each line longer than ``width`` into pieces, at a space when one is in the piece's second
    half, continuations indented. With ``keep``, only the newest ``keep`` rows are made: the lines
    are cut from the last one back until that many rows are in hand (a flood cuts no more lines
    than the log can hold)."""
    if width <= len(WRAP_INDENT) + 8 or max(map(len, lines), default=0) <= width:
        # Not laid out yet or too narrow to read (then nothing is cut), or every line fits.
        return lines if keep is None else lines[-keep:] if keep else []
    rows: list[list[str]] = []  # per line, newest first
    made = 0
    step = width - len(WRAP_INDENT)
    for line in reversed(lines):
        if keep is not None and made >= keep:
            break
        if len(line) <= width:
            pieces = [line]
        else:
            pieces = []
            start, room, first = 0, width, True
            while len(line) - start > room:
                space = line.rfind(" ", start + room // 2, start + room)
                end = space + 1 if space > 0 else start + room
                pieces.append(line[start:end] if first else WRAP_INDENT + line[start:end])
                start, room, first = end, step, False
            pieces.append(WRAP_INDENT + line[start:])
        rows.append(pieces)
        made += len(pieces)
    out = [row for pieces in reversed(rows) for row in pieces]
    return out if keep is None else out[-keep:] if keep else []


def clean_lines(lines: list[str]) -> list[str]:
    """``display_lines`` for a batch: one look at the whole batch first (a flood's lines rarely hold
    an escape, a carriage return or a tab), then line by line only when one does."""
    blob = "\n".join(lines)
    if "\x1b" in blob or "\r" in blob or "\t" in blob:
        return display_lines(lines)
    return lines


class TailLog(Log):
    """Textual's ``Log`` without its per-write thread.

    ``Log.write_lines`` starts a thread worker on every call to measure the new lines' widest cell
    width (and the worker's name is built from ``repr`` of the whole batch): under a flood that is
    20 threads a second, each holding the interpreter lock while the loop waits. Here the lines are
    already cut to the view's width and the view never scrolls sideways, so the width is measured
    in the call, by ``len``. (``_update_size`` is Textual 8.2.8's hook, pinned in pyproject.toml;
    tests/test_tui_logtail.py checks that a write starts no worker.)
    """

    def _measure_inline(self, updates: int, lines: list[str]) -> None:
        if lines:
            self._update_maximum_width(updates, max(map(len, lines)))

    # In place of Log's thread worker (typed as returning a Worker, which an inline call has no need of).
    _update_size: Any = _measure_inline

    def on_resize(self) -> None:
        """A following view keeps its newest line in view when it gets shorter or taller: Log scrolls
        to the end only on a write, and a row taken by a line above left it that row short (a change of
        width is LogTail's, which re-wraps). A paused view stays where the reader is."""
        if self.auto_scroll:
            self.scroll_end(animate=False, immediate=True)


class FilterInput(Input):
    """The `/` filter: Enter keeps it and goes back to the log, Escape clears it."""

    BINDINGS = [Binding("escape", "clear_filter", "Clear filter", id="filter_clear",
                        tooltip="Clear the filter and go back to the log")]

    def action_clear_filter(self) -> None:
        self.value = ""
        tail = next((a for a in self.ancestors if isinstance(a, LogTail)), None)
        if tail is not None:
            tail.close_filter()


class LogTail(Vertical):
    """A bounded, filterable, pausable view of a stream of log lines."""

    DEFAULT_CSS = """
    LogTail > Log { height: 1fr; }
    LogTail > FilterInput { display: none; height: 3; }
    LogTail.-filtering > FilterInput { display: block; }
    LogTail > Log { overflow-x: hidden; }
    LogTail > .log-status { height: auto; width: 100%; }
    """

    following: reactive[bool] = reactive(True)
    """Keep the newest line in view. Scrolling up pauses it; reaching the bottom resumes it."""
    show_metrics: reactive[bool] = reactive(False)
    filter_text: reactive[str] = reactive("")

    note: reactive[str] = reactive("")
    """Said in the status line: what became of the stream (it ended, it could not be read)."""

    def __init__(self, *, ring_size: int = 20_000, max_lines: int = 10_000, id: str | None = None,
                 empty_note: str = "") -> None:
        """``empty_note``: said while no line has come, so an empty view is never unexplained."""
        super().__init__(id=id)
        self.empty_note = empty_note
        self._pending: deque[str] = deque(maxlen=ring_size)  # arrived, not drained yet
        self._window: deque[str] = deque(maxlen=max_lines)  # what the view is derived from
        self._max_lines = max_lines
        self._writing = False  # our own scrolls must not pause or resume follow
        self.unseen = 0  # lines that would be shown, arrived while paused
        self._matching = 0  # lines of the window that pass the filter and the metric choice
        self.dropped = 0  # lines that left the pending ring before a drain (a flood beyond ring_size)
        self.total = 0  # lines drained since mount (including ones the window no longer holds)
        self._wrap_width = 0  # the log's content width the shown lines were cut to
        self._status_rows = 0  # the status line's height when last laid out

    def compose(self) -> ComposeResult:
        yield FilterInput(placeholder="filter (substring, any case) — Enter keeps it, Escape clears it")
        yield TailLog(max_lines=self._max_lines, auto_scroll=True)
        yield Label("", classes="log-status")

    @property
    def log_view(self) -> Log:
        return self.query_one(Log)

    def on_mount(self) -> None:
        self.watch(self.log_view, "scroll_y", self._scrolled, init=False)
        self.set_interval(1 / DRAIN_HZ, self.drain)
        # Once mounted (it is not yet, in its own on_mount): a view no line ever reaches still says so.
        self.call_after_refresh(self._update_status)

    # --- what is shown ---------------------------------------------------------------------
    def shows(self, line: str) -> bool:
        """Whether a line passes the metric choice and the filter (substring, any case)."""
        return bool(self._visible([line]))

    def push(self, lines: Iterable[str]) -> None:
        """Queue raw lines (cheap: any number per frame); the next drain cleans and shows them."""
        batch = lines if isinstance(lines, list) else list(lines)
        pending = self._pending
        assert pending.maxlen is not None
        self.dropped += max(0, len(pending) + len(batch) - pending.maxlen)
        pending.extend(batch)

    def _visible(self, lines: Iterable[str]) -> list[str]:
        """``shows`` over many lines, with the choices read once (a flood calls this per frame)."""
        needle = self.filter_text.casefold()
        hide_metrics = not self.show_metrics
        if not needle:
            return [x for x in lines if METRIC_TAG not in x] if hide_metrics else list(lines)
        return [x for x in lines if needle in x.casefold() and not (hide_metrics and METRIC_TAG in x)]

    def drain(self) -> None:
        pending, window = self._pending, self._window
        if not pending:
            return
        assert window.maxlen is not None
        # Only what the window can hold is cleaned: older lines of the batch would leave it in this
        # same drain (they are counted in ``total``; the spool keeps them).
        passed = max(0, len(pending) - window.maxlen)
        if passed and not self.following:  # still news to the paused reader: "+N new lines" counts them
            self.unseen += len(self._visible(islice(pending, passed)))
        batch = clean_lines(list(islice(pending, passed, None)))
        pending.clear()
        self.total += passed
        evicted = len(window) + len(batch) - window.maxlen
        if evicted > 0 and self.filter_text:
            gone = [window[i] for i in range(min(evicted, len(window)))]
            self._matching -= len(self._visible(gone))
        window.extend(batch)
        self.total += len(batch)
        visible = self._visible(batch)
        self._matching += len(visible)
        if self.following:
            self._write(visible)
        else:
            self.unseen += len(visible)
        self._update_status()

    def _write(self, lines: list[str], *, clear: bool = False) -> None:
        log = self.log_view
        self._wrap_width = width = log.scrollable_content_region.width
        lines = wrap_lines(lines, width, keep=log.max_lines)  # rows beyond it would be pruned at once
        self._writing = True
        try:
            if clear:
                log.clear()
            if lines:
                log.write_lines(lines, scroll_end=self.following)
            if self.following:
                log.scroll_end(animate=False, immediate=True)
        finally:
            self._writing = False

    def rebuild(self) -> None:
        """Show the window again through the current filter and metric choice."""
        self.unseen = 0
        visible = self._visible(self._window)
        self._matching = len(visible)
        self._write(visible, clear=True)
        self._update_status()

    def _update_status(self) -> None:
        if not self.is_mounted:
            return
        parts = []
        if self.filter_text:
            parts.append(f"filter: {self.filter_text} ({self._matching} of {len(self._window)} lines)")
        else:
            parts.append(f"{self.total} lines")
        if self.note:
            parts.append(self.note)
        elif not self.total and self.empty_note:
            parts.append(self.empty_note)
        if not self.show_metrics:
            parts.append("metric lines hidden (m)")
        parts.append("following" if self.following else f"paused · +{self.unseen} new lines (End to follow)")
        label = self.query_one(".log-status", Label)
        text = " · ".join(parts)
        # A layout only when the line may change height (it wraps when narrow): a flood updates it
        # every drain, and a layout of the whole screen each time held the loop for a frame or more.
        width = max(label.content_region.width, 1)
        rows = -(-len(text) // width)
        label.update(text, layout=rows != self._status_rows or not label.content_region.width)
        self._status_rows = rows

    @property
    def _rewrap(self) -> bool:
        """The view's width changed since the shown lines were cut to it."""
        return self.log_view.scrollable_content_region.width != self._wrap_width

    def on_resize(self) -> None:
        if self.following and self._rewrap:  # paused, the text under the reader stays until End
            self.rebuild()

    # --- follow, filter, metrics -----------------------------------------------------------
    def _scrolled(self, old: float, new: float) -> None:
        if self._writing:
            return
        at_end = self.log_view.is_vertical_scroll_end
        # Only a move up pauses: the log's own scroll to the end after a write lands a frame later,
        # and toggling follow (and the footer's keys) on it cost a layout of the screen each time.
        if self.following and not at_end and new < old:
            self.following = False
        elif not self.following and at_end:
            self.following = True

    def on_mouse_scroll_up(self) -> None:
        self.following = False

    def watch_following(self, following: bool) -> None:
        if not self.is_mounted:
            return
        self.log_view.auto_scroll = following
        if following and (self.unseen or self._rewrap):
            self.rebuild()  # what arrived while paused, in order, then the bottom
        elif following:
            self._write([])
        self._update_status()
        self.screen.refresh_bindings()  # End (resume) is offered only while paused

    def resume(self) -> None:
        """End: follow again, from the newest line."""
        if self.following:
            self._write([])
        self.following = True

    def watch_note(self) -> None:
        self._update_status()

    def watch_show_metrics(self) -> None:
        if self.is_mounted:
            self.rebuild()

    def watch_filter_text(self) -> None:
        if self.is_mounted:
            self.rebuild()

    def open_filter(self) -> None:
        self.add_class("-filtering")
        box = self.query_one(FilterInput)
        box.value = self.filter_text
        box.focus()

    def close_filter(self) -> None:
        """Escape: no filter, the input goes away, the log has the focus again."""
        self.filter_text = ""
        self.remove_class("-filtering")
        self.log_view.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.filter_text = event.value

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not event.value:
            self.remove_class("-filtering")
        self.log_view.focus()

    @property
    def lines(self) -> list[str]:
        """The lines on screen now (after the filter and the metric choice)."""
        return [str(line) for line in self.log_view.lines]

    @property
    def status_text(self) -> str:
        return str(self.query_one(".log-status", Label).render())
