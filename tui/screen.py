"""What every rtui screen shares: the app's rtui side, typed, without importing the app, and the one place
where a failed worker becomes a notification.

Screens never import ``tui.app`` (it imports them to route between them): they reach it through
``WizardApp``, the few things a screen may ask of the app beside Textual's own ``App`` API.
``tui.app.RtuiApp`` implements it, which mypy checks where the app is made (``tui/app.py``).

Workers (``@work(exit_on_error=False)``, and the panels' ``run_worker``) let their exceptions out: Textual
marks the worker ERROR and posts ``Worker.StateChanged`` to the screen, which reports it once
(``WizardApp.report_error``: one line, never a traceback, the app goes on). A screen that must also
change something when a worker fails (a step list that ended, a check that failed) says so in
``worker_failed``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from textual.screen import Screen
from textual.worker import Worker, WorkerState

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

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place a failed worker is reported (DESIGN.md §7)."""
        if event.state is not WorkerState.ERROR or event.worker.error is None:
            return
        if not self.worker_failed(event.worker, event.worker.error):
            self.wizard.report_error(event.worker.error)

    def worker_failed(self, worker: Worker[Any], error: BaseException) -> bool:
        """What this screen does when one of its workers failed; True when it shows the failure itself
        (then no notification says it again). Workers never touch widgets: post a message here."""
        return False
