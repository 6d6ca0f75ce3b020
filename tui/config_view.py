"""The palette's Show config: what the run's job is submitted with, one row a field, in a modal that
scrolls and closes on escape (a toast hid itself after 20 s, and at 80×24 its top was off the screen)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static


class ConfigScreen(ModalScreen[None]):
    """``rows``: (field, value, where it came from), as ``RunConfig.effective_rows`` gives them."""

    BINDINGS = [Binding("escape,q", "dismiss", "Close", id="close-config", tooltip="Close the config")]
    AUTO_FOCUS = "#config-fields"  # the keys scroll the fields at once

    def __init__(self, title: str, rows: list[tuple[str, Any, str]]) -> None:
        super().__init__()
        self.heading = title
        self.rows = [(field, value, source) for field, value, source in rows if value not in (None, "")]

    def text(self) -> str:
        """The fields as plain lines: name, value, source, two spaces apart."""
        return "\n".join(f"{field}  {value}  {source}" for field, value, source in self.rows)

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, expand=True, padding=(0, 2, 0, 0))
        table.add_column("field", no_wrap=True, style="bold")
        table.add_column("value", overflow="fold")
        table.add_column("source", overflow="fold", style="dim")
        for field, value, source in self.rows:
            table.add_row(field, Text(str(value)), source)
        with Vertical(id="config"):
            yield Label(self.heading, id="config-heading", classes="heading")
            with VerticalScroll(id="config-fields"):
                yield Static(table)
            yield Label("↑↓ pgup pgdn home end scroll · escape closes", classes="detail")
