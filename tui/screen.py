"""What every rtui screen shares: the app's rtui side, typed, without importing the app.

Screens never import ``tui.app`` (it imports them to route between them): they reach it through
``WizardApp``, the few things a screen may ask of the app beside Textual's own ``App`` API.
``tui.app.RtuiApp`` implements it, which mypy checks where the app is made (``tui/app.py``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from textual.screen import Screen

from backend.session import RunSession


@runtime_checkable
class WizardApp(Protocol):
    """The app as a screen sees it: the run's session, whether changes are allowed, where errors go."""

    @property
    def session(self) -> RunSession: ...

    @property
    def read_only(self) -> bool: ...

    def report_error(self, exc: BaseException) -> None:
        """Show ``exc`` to the user as one line (a notification); never a traceback."""
        ...


class RtuiScreen(Screen[None]):
    """A screen that renders and posts messages; the App decides which screen comes next."""

    @property
    def wizard(self) -> WizardApp:
        app = self.app
        if not isinstance(app, WizardApp):  # a screen of rtui runs in rtui's app, never another
            raise TypeError(f"{type(self).__name__} needs an app with a session, not {type(app).__name__}")
        return app

    @property
    def session(self) -> RunSession:
        return self.wizard.session
