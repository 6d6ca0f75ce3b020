"""The Textual app: owns the session, its lock and the routing between screens.

Screens render and post messages (``PlanScreen.Approved``, ``ProvisionScreen.Finished``,
``RunScreen.TeardownRequested``…); only this class decides which screen comes next, and
no screen imports another. Long operations run in workers that post messages; the only
place that turns a backend error into a notification is ``RtuiApp.report_error``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from backend.errors import RtuiError, UserError
from backend.session import RunSession
from backend.store import RunStatus

if TYPE_CHECKING:
    from screens.plan import PlanScreen
    from screens.provision import ProvisionScreen
    from screens.run import RunScreen
    from screens.target import TargetScreen


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
        self._lock: contextlib.ExitStack | None = None
        self._set_subtitle()

    def _set_subtitle(self) -> None:
        s = self.session
        down = " · down" if s.record.status is RunStatus.DOWN else ""
        # On kube, which cluster: the context the kubeconfig names (or its current one).
        where = f" @ {s.config.context}" if s.config.target == "kube" and s.config.context else ""
        if s.config.target == "aws":  # and where: the AZ once chosen, else the region
            where = f" @ {s.config.availability_zone or s.config.region}"
        self.sub_title = f"{s.config.target}{where} · {s.config.cluster_name} · run {s.run_id}{down}"

    # --- routing -----------------------------------------------------------------------
    def get_default_screen(self) -> Screen[Any]:
        """The first screen is the default one: no blank screen is laid out before it."""
        record = self.session.record
        if self.resume and record.status is not RunStatus.DOWN and record.current_job is not None:
            from screens.run import RunScreen

            return RunScreen()
        if self.resume and record.status is not RunStatus.DOWN and record.resources:
            from screens.plan import PlanScreen

            return PlanScreen()
        from screens.target import TargetScreen

        return TargetScreen()

    def _go(self, screen: Screen[Any]) -> None:
        """Show ``screen`` in place of the current main screen (modals above it are closed).

        The default screen cannot be switched away (Textual keeps no result callback for it:
        ``switch_screen`` on it raises IndexError), so it stays at the bottom with its workers
        stopped, and the main screen is the one pushed above it.
        """
        while len(self.screen_stack) > 2:
            self.pop_screen()
        if len(self.screen_stack) == 2:
            self.switch_screen(screen)
        else:
            self.workers.cancel_node(self.screen)
            self.push_screen(screen)

    def on_target_screen_chosen(self, _message: TargetScreen.Chosen) -> None:
        from screens.plan import PlanScreen

        self._go(PlanScreen())

    def on_target_screen_context_chosen(self, message: TargetScreen.ContextChosen) -> None:
        """Another kubeconfig context: the same run, configured for it, checked afresh on a new TargetScreen."""
        if message.name == self.session.config.context:
            return
        self._reconfigure({"context": message.name}, f"context {self.session.config.context or '(current)'}",
                          "or start rtui with --context")

    def on_target_screen_zone_chosen(self, message: TargetScreen.ZoneChosen) -> None:
        """Another feasible AZ: the same run with that availability zone (and its region), checked afresh."""
        config = self.session.config
        if (message.region, message.zone) == (config.region, config.availability_zone):
            return
        self._reconfigure({"region": message.region, "availability_zone": message.zone},
                          f"{config.availability_zone or config.region}", "or start rtui with --availability-zone")

    def _reconfigure(self, update: dict[str, Any], where: str, otherwise: str) -> None:
        """A new session for the same run with ``update`` applied to its config, and a new TargetScreen."""
        old = self.session
        if old.record.resources:  # its resources live where it was applied
            self.report_error(UserError(f"run {old.run_id} already has resources in {where}",
                                        remedy=f"tear it down first (`rtui down {old.run_id} --yes`), {otherwise}"))
            return
        self.release()  # a lock is the old session's (a failed apply that created nothing)
        config = old.config.model_copy(update=update)
        old.record.config = config.model_dump(mode="json")
        self.session = RunSession(old.store, old.record, config)
        self._set_subtitle()
        from screens.target import TargetScreen

        self._go(TargetScreen())

    def on_target_screen_quota_increase_asked(self, message: TargetScreen.QuotaIncreaseAsked) -> None:
        """Filing a quota request is a support case with AWS: only after a yes in the modal."""
        if self.read_only:
            return
        from screens.quota import ConfirmQuotaIncrease
        from screens.target import TargetScreen

        target = self.screen
        region = message.requests[0][0]  # the screen asks for one region's quotas at a time

        def answered(yes: bool | None) -> None:
            if yes and isinstance(target, TargetScreen):
                target.file_quota_increase(region)

        self.push_screen(ConfirmQuotaIncrease(message.requests), answered)

    def on_plan_screen_back_requested(self, _message: PlanScreen.BackRequested) -> None:
        from screens.target import TargetScreen

        self._go(TargetScreen())

    def on_plan_screen_approved(self, message: PlanScreen.Approved) -> None:
        if self.read_only or not self.acquire():
            return
        from backend.planner import apply_steps
        from screens.provision import ProvisionScreen

        outline = apply_steps(self.session.stack, self.session.ctx, message.plan)
        self._go(ProvisionScreen(message.plan, outline=outline))

    def on_provision_screen_finished(self, message: ProvisionScreen.Finished) -> None:
        self._set_subtitle()
        if message.mode == "apply" and message.ok:
            from screens.run import RunScreen

            self._go(RunScreen())

    def on_provision_screen_back_requested(self, message: ProvisionScreen.BackRequested) -> None:
        if self.session.record.status is RunStatus.DOWN:
            self._new_run()
            return
        from screens.plan import PlanScreen

        self._go(PlanScreen())

    def on_provision_screen_retry_requested(self, message: ProvisionScreen.RetryRequested) -> None:
        from screens.plan import PlanScreen
        from screens.provision import ProvisionScreen

        self._go(ProvisionScreen(mode="teardown") if message.mode == "teardown" else PlanScreen())

    def on_run_screen_teardown_requested(self, _message: RunScreen.TeardownRequested) -> None:
        if self.read_only:
            return
        from screens.confirm import ConfirmTeardown

        def confirmed(yes: bool | None) -> None:
            if yes:
                # After the modal is gone: routing from inside its dismissal would race its pop.
                self.call_after_refresh(self._teardown)

        session = self.session
        self.push_screen(ConfirmTeardown(session.config.cluster_name, f"run {session.run_id}"), confirmed)

    def _teardown(self) -> None:
        if not self.acquire():
            return
        from screens.provision import ProvisionScreen

        self._go(ProvisionScreen(mode="teardown"))

    def _new_run(self) -> None:
        """After a teardown, going back starts a new run of the same config (never re-applies a dead one)."""
        old = self.session
        self.release()
        record = old.store.new(target=old.config.target, cluster_name=old.config.cluster_name,
                               config=old.config.model_dump(mode="json"))
        self.session = RunSession(old.store, record, old.config)
        self._set_subtitle()
        from screens.target import TargetScreen

        self._go(TargetScreen())

    # --- the run's lock ------------------------------------------------------------------
    def acquire(self) -> bool:
        """Hold the run's and its cluster's lock from the first change until we exit."""
        if self._lock is not None:
            return True
        held = contextlib.ExitStack()
        try:
            held.enter_context(self.session.changing())
        except RtuiError as exc:
            held.close()
            self.report_error(exc)
            return False
        self._lock = held
        return True

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
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

        if isinstance(self.screen, ConfirmDetach):
            return
        if getattr(self.screen, "running", False):
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
