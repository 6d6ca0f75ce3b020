"""What every rtui screen shares: the typed app, reached without casts."""

from __future__ import annotations

from textual import getters
from textual.screen import Screen

from backend.session import RunSession
from tui.app import RtuiApp


class RtuiScreen(Screen[None]):
    """A screen that renders and posts messages; the App decides which screen comes next."""

    app = getters.app(RtuiApp)

    @property
    def session(self) -> RunSession:
        return self.app.session
