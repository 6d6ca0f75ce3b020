"""`?`/`f1`: every key of the screen below, built from its bindings (what each does and why).

Textual's own help panel is a third of the width: at 80×24 its descriptions wrap a word a line.
This one is a modal over the screen, a row a binding (all its keys on one row), this screen's keys
before the app's, tooltips wrapped under their column; keys that do nothing right now are dimmed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Label, Static


@dataclass(frozen=True)
class KeyRow:
    keys: str
    name: str
    what: str
    enabled: bool
    everywhere: bool  # the App's key rather than this screen's


def key_rows(screen: Screen[Any]) -> list[KeyRow]:
    """The screen's named bindings as it stands (keys hidden by `check_action` are left out), then the App's.
    A widget's own movement keys (arrows, page up) are one line under the table, not a row each."""
    app = screen.app
    rows: dict[str, KeyRow] = {}
    keys: dict[str, list[str]] = {}
    for key, active in screen.active_bindings.items():
        binding = active.binding
        if not binding.id:
            continue
        ident = f"{binding.action}/{binding.description}"  # `q` and `ctrl+q` quit alike: one row
        keys.setdefault(ident, []).append(app.get_key_display(Binding(key, binding.action)))
        if ident not in rows:
            rows[ident] = KeyRow("", binding.description, binding.tooltip or "", active.enabled,
                                 everywhere=active.node is app)
    ordered = sorted(rows.items(), key=lambda item: item[1].everywhere)  # stable: the binding order within
    return [KeyRow(" ".join(dict.fromkeys(keys[ident])), row.name, row.what, row.enabled, row.everywhere)
            for ident, row in ordered]


def render_rows(rows: list[KeyRow]) -> Table:
    table = Table(box=None, show_header=False, expand=True, padding=(0, 1, 0, 0))
    table.add_column("keys", no_wrap=True, style="bold", justify="right")
    table.add_column("name", no_wrap=True)
    table.add_column("what", ratio=1, overflow="fold")
    for i, row in enumerate(rows):
        if i and row.everywhere and not rows[i - 1].everywhere:
            table.add_row("", "", "")  # a blank row between this screen's keys and the app's
        style = "" if row.enabled else "dim"
        what = Text(row.what, style="dim" if not row.enabled else "")
        if not row.enabled:
            what.append("  (not now)", style="dim italic")
        table.add_row(Text(row.keys, style=style or "bold"), Text(row.name, style=style), what)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,f1,q", "dismiss", "Close", id="close-help",
                        tooltip="Close the help")]

    def __init__(self, title: str, rows: list[KeyRow]) -> None:
        super().__init__()
        self.heading = title
        self.rows = rows

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Label(f"Keys · {self.heading}", classes="heading")
            with VerticalScroll(id="help-keys"):
                yield Static(render_rows(self.rows), id="help-table")
            yield Label("↑↓ move · tab: next pane · ctrl+p: every command · escape closes",
                        classes="detail")
