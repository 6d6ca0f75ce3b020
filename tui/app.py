"""The Textual app: routes between screens and owns the run session and its lock.

Screens render and route; the backend does the work. Long operations run in
workers that post messages; the only place that turns a backend error into a
notification is ``RtuiApp.report_error``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from backend.errors import RtuiError
from backend.session import RunSession
from backend.store import RunLockedError, RunStatus


class RtuiApp(App[None]):
    CSS_PATH = Path(__file__).with_name("rtui.tcss")
    TITLE = "rtui"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("q", "quit_detach", "Quit", id="quit", tooltip="Quit; never tears anything down"),
        Binding("ctrl+q", "quit_detach", "Quit", show=False, id="quit_ctrl", priority=True,
                tooltip="Quit; never tears anything down"),
        Binding("question_mark,f1", "toggle_help", "Help", id="help", tooltip="Show every key"),
    ]

    def __init__(self, session: RunSession, *, resume: bool = False, read_only: bool = False) -> None:
        super().__init__()
        self.session = session
        self.resume = resume
        self.read_only = read_only
        self._lock: contextlib.AbstractContextManager[None] | None = None
        self.sub_title = f"{session.config.target} · {session.config.cluster_name} · run {session.run_id}"

    # --- lifecycle ---------------------------------------------------------------------
    def get_default_screen(self) -> Screen[Any]:
        """The first screen is the default one: no blank screen is laid out before it."""
        record = self.session.record
        if self.resume and record.current_job is not None and record.status is not RunStatus.DOWN:
            from screens.run import RunScreen

            return RunScreen()
        if self.resume and record.status is not RunStatus.DOWN and record.resources:
            from screens.plan import PlanScreen

            return PlanScreen()
        from screens.target import TargetScreen

        return TargetScreen()

    def acquire(self) -> bool:
        """Hold the run's lock from the first change until we exit (crash-safe: kernel releases it)."""
        if self._lock is not None:
            return True
        lock = self.session.store.lock(self.session.run_id)
        try:
            lock.__enter__()
        except RunLockedError as exc:
            self.report_error(exc)
            return False
        except RtuiError as exc:
            self.report_error(exc)
            return False
        self._lock = lock
        return True

    def release(self) -> None:
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None

    def on_unmount(self) -> None:
        self.release()

    # --- errors and actions ------------------------------------------------------------
    def report_error(self, exc: BaseException) -> None:
        text = str(exc) if isinstance(exc, RtuiError) else f"{type(exc).__name__}: {exc}"
        self.notify(text, title="Error", severity="error", timeout=10)

    def action_toggle_help(self) -> None:
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def action_quit_detach(self) -> None:
        from screens.confirm import ConfirmDetach
        from screens.provision import ProvisionScreen

        if isinstance(self.screen, ConfirmDetach):
            return
        if isinstance(self.screen, ProvisionScreen) and self.screen.running:
            def answered(yes: bool | None) -> None:
                if yes:
                    self._exit_detached()

            self.push_screen(ConfirmDetach(self.session.run_id), answered)
            return
        self._exit_detached()

    def _exit_detached(self) -> None:
        record = self.session.record
        saved = self.session.store.path_for(record.run_id).exists()
        if saved and record.status is not RunStatus.DOWN:
            message = (f"Detached from run {record.run_id}; nothing was torn down.\n"
                       f"Resume: rtui --resume {record.run_id}   ·   tear down: rtui down {record.run_id} --yes")
        else:
            message = None
        self.exit(return_code=0, message=message)
