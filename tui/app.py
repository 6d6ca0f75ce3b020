"""The Textual app: owns the session, its lock and the routing between screens.

Screens render and post messages (``PlanScreen.Approved``, ``ProvisionScreen.Finished``,
``RunScreen.TeardownRequested``…); only this class decides which screen comes next, and
no screen imports another. Long operations run in workers that post messages; the only
place that turns a backend error into a notification is ``RtuiApp.report_error``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import ModalScreen, Screen

from backend.config import reconfigured
from backend.errors import RtuiError, UserError
from backend.planner import apply_steps
from backend.resources import GpuFleet
from backend.session import Billed, RunSession, cost_meter
from backend.store import RunStatus
from backend.trust import remember
from screens.confirm import ConfirmApply, ConfirmConfigFile, ConfirmDetach, ConfirmTeardown, PickRun
from screens.plan import PlanScreen
from screens.target import TargetScreen
from tui.config_view import ConfigScreen
from tui.help import HelpScreen, key_rows
from tui.invocation import rtui_command
from tui.render import accrued_words, per_hour_words
from tui.target_panel import ConfirmAsked, Reconfigure

if TYPE_CHECKING:
    from backend.planner import PlanResult
    from backend.resolve import ResolvedConfig
    from screens.provision import ProvisionScreen
    from screens.run import RunScreen
    from tui.screen import WizardApp


QUIT_TIP = "Quit; it tears nothing down (asks first while work is in flight)"


class RtuiApp(App[None]):
    CSS_PATH = Path(__file__).with_name("rtui.tcss")
    TITLE = "rtui"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("q", "quit_detach", "Quit", id="quit", tooltip=QUIT_TIP),
        Binding("ctrl+q", "quit_detach", "Quit", show=False, id="quit_ctrl", priority=True, tooltip=QUIT_TIP),
        Binding("question_mark,f1", "toggle_help", "Help", id="help", tooltip="Show every key"),
        Binding("D", "teardown", "Tear down", id="teardown_any",
                tooltip="Delete everything this run made (asks for the cluster name first)"),
    ]

    def __init__(self, session: RunSession, *, resume: bool = False, read_only: bool = False,
                 choose_from: list[str] | None = None, clock: Callable[[], float] = time.time,
                 confirm_config: ResolvedConfig | None = None) -> None:
        super().__init__()
        # A checkout's config file sets held fields not confirmed yet: the session runs without them until a yes.
        self.confirm_config = confirm_config
        self.session = session
        # What "now" is for what the app itself shows (the teardown modal's cost so far); tests freeze it.
        self.clock = clock
        self.resume = resume
        self.read_only = read_only
        # Several live runs and no id given to --resume: the user picks one first.
        self.choose_from = choose_from or []
        self._lock: contextlib.ExitStack | None = None
        self._set_subtitle()

    def _set_subtitle(self) -> None:
        s = self.session
        down = " · down" if s.record.status is RunStatus.DOWN else ""
        if not down and s.record.facts.stopped_while_idle is not None:
            down = " · stopped while idle"
        where = s.target.where(s.config)  # which cluster: a kube context, an aws AZ (or region)
        where = f" @ {where}" if where else ""
        # The run's state before its long id: at 80 columns the title's end is cut off.
        self.sub_title = f"{s.config.target}{where} · {s.config.cluster_name}{down} · run {s.run_id}"

    # --- routing -----------------------------------------------------------------------
    def get_default_screen(self) -> Screen[Any]:
        """The first screen is the default one: no blank screen is laid out before it."""
        record = self.session.record
        if self.resume and record.status is not RunStatus.DOWN and record.current_job is not None:
            # lazy: the run screen (the graph, flows: ~300 ms) loads when first shown; not on the first frame
            from screens.run import RunScreen

            return RunScreen()
        if self.resume and record.status is not RunStatus.DOWN and record.resources:
            return PlanScreen()

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
        self._go(PlanScreen())

    def on_reconfigure(self, message: Reconfigure) -> None:
        """The first screen's panel changed a setting (another context, another AZ): the same run, configured
        so, checked afresh on a new TargetScreen."""
        self._reconfigure(message.update, message.where, message.otherwise)

    def _reconfigure(self, update: dict[str, Any], where: str, otherwise: str) -> None:
        """A new session for the same run with ``update`` applied to its config, and a new TargetScreen."""
        old = self.session
        if old.record.resources:  # its resources live where it was applied
            self.report_error(UserError(f"run {old.run_id} already has resources in {where}",
                                        remedy=f"tear it down first (`rtui down {old.run_id} --yes`), {otherwise}"))
            return
        self.release()  # a lock is the old session's (a failed apply that created nothing)
        config = reconfigured(old.config, update)
        old.record.use_config(config)
        self._replace_session(RunSession(old.store, old.record, config))
        self._set_subtitle()

        self._go(TargetScreen())

    def on_confirm_asked(self, message: ConfirmAsked) -> None:
        """A change a panel makes only after a yes in its modal (filing a quota request is a support case)."""
        if self.read_only:
            return
        asking = self.screen

        def answered(yes: bool | None) -> None:
            if yes and self.screen is asking:
                message.then()

        self.push_screen(message.modal, answered)

    def on_plan_screen_back_requested(self, _message: PlanScreen.BackRequested) -> None:
        self._go(TargetScreen())

    def on_plan_screen_approved(self, message: PlanScreen.Approved) -> None:
        if self.read_only:
            return
        plan = message.plan
        costs_money = self.session.target.costs_money or plan.cost_per_hour > 0
        if plan.is_noop or not (costs_money or plan.cluster_wide()):
            self._apply(plan)
            return
        # What costs money by the hour, or changes what everyone on the cluster shares, is asked for
        # twice: `a` on the plan, then `y` here.

        def confirmed(yes: bool | None) -> None:
            if yes:
                # After the modal is gone: routing from inside its dismissal would race its pop.
                self.call_after_refresh(self._apply, plan)

        self.push_screen(ConfirmApply(plan), confirmed)

    def _apply(self, plan: PlanResult) -> None:
        if not self.acquire():
            return
        # lazy: the provisioning screen (flows: ~230 ms) loads when first shown; not on the first frame
        from screens.provision import ProvisionScreen

        outline = apply_steps(self.session.stack, self.session.ctx, plan)
        self._go(ProvisionScreen(plan, outline=outline))

    def on_provision_screen_finished(self, message: ProvisionScreen.Finished) -> None:
        self._set_subtitle()
        if message.mode == "apply" and message.ok:
            # lazy: the run screen (the graph, flows: ~300 ms) loads when first shown; not on the first frame
            from screens.run import RunScreen

            self._go(RunScreen())

    def on_provision_screen_back_requested(self, message: ProvisionScreen.BackRequested) -> None:
        if self.session.record.status is RunStatus.DOWN:
            self._new_run()
            return

        self._go(PlanScreen())

    def on_provision_screen_retry_requested(self, message: ProvisionScreen.RetryRequested) -> None:
        # lazy: the provisioning screen (flows: ~230 ms) loads when first shown; not on the first frame
        from screens.provision import ProvisionScreen

        self._go(ProvisionScreen(mode="teardown") if message.mode == "teardown" else PlanScreen())

    def on_provision_screen_failover_requested(self, message: ProvisionScreen.FailoverRequested) -> None:
        # lazy: flows (~160 ms) loads with the screens that run steps; not on the first frame
        from backend import flows

        moved = flows.fail_over(self.session, message.failed)
        if moved is None:
            nowhere, remedy = self.session.target.nowhere_to_move
            self.report_error(UserError(nowhere, remedy=remedy))
            return
        self.notify(moved, title="Fail-over", timeout=10)
        self._go(PlanScreen())

    def on_run_screen_teardown_requested(self, _message: RunScreen.TeardownRequested) -> None:
        self.action_teardown()

    def has_resources(self) -> bool:
        """Whether teardown means anything: something was made (or applied: discovery finds the rest)."""
        record = self.session.record
        if record.status is RunStatus.DOWN:
            return False
        return record.status is not RunStatus.PLANNED or any(r.live for r in record.resources.values())

    def action_teardown(self) -> None:
        if self.read_only or not self.has_resources():
            return

        modal = self.teardown_modal()

        def confirmed(yes: bool | None) -> None:
            if yes:
                # After the modal is gone: routing from inside its dismissal would race its pop.
                self.call_after_refresh(self._teardown, modal.delete_data)

        self.push_screen(modal, confirmed)

    def teardown_modal(self) -> ConfirmTeardown:
        """What `D` asks: what the run made and costs, and its kept data (only where it keeps any)."""
        session = self.session
        keeps_data = session.data_store() is not None
        return ConfirmTeardown(session.config.cluster_name, f"run {session.run_id}",
                               details=teardown_summary(session, now=self.clock(), gpu=self.gpu_fleet_seen(),
                                                        billed=self.billed_seen()),
                               data_line=(lambda: kept_data_line(session)) if keeps_data else None,
                               keeps_data=keeps_data)

    def billed_seen(self) -> Billed | None:
        """What the run screen last read of the provider's records of the nodes (None before it has)."""
        for screen in reversed(self.screen_stack):
            billed = getattr(screen, "billed", None)
            if isinstance(billed, Billed):
                return billed
        return None

    def gpu_fleet_seen(self) -> GpuFleet | None:
        """The GPU nodes as the run screen last saw them (None before it has seen any): what they cost
        now, scaled down while idle or not, is what the teardown modal says."""
        for screen in reversed(self.screen_stack):
            fleet = getattr(screen, "gpu_fleet", None)
            if isinstance(fleet, GpuFleet):
                return fleet
        return None

    def _teardown(self, delete_data: bool = False) -> None:
        if not self.acquire():
            return
        # lazy: the provisioning screen (flows: ~230 ms) loads when first shown; not on the first frame
        from screens.provision import ProvisionScreen

        self._go(ProvisionScreen(mode="teardown", delete_data=delete_data))

    def _new_run(self) -> None:
        """After a teardown, going back starts a new run of the same config (never re-applies a dead one)."""
        old = self.session
        self.release()
        record = old.store.new(old.config)
        self._replace_session(RunSession(old.store, record, old.config))
        self._set_subtitle()

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
        self.session.close()  # the session ends with the app: its clients and their threads too

    def _replace_session(self, new: RunSession) -> None:
        """Switch to ``new``; the old session's clients close once the screens using them are gone."""
        old, self.session = self.session, new
        self.call_after_refresh(old.close)

    # --- errors and actions ------------------------------------------------------------
    def report_error(self, exc: BaseException) -> None:
        text = str(exc) if isinstance(exc, RtuiError) else f"{type(exc).__name__}: {exc}"
        self.notify(" ".join(text.split()), title="Error", severity="error", timeout=10)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "teardown":
            # Hidden when there is nothing to tear down, in --read-only, above a modal, and while a
            # teardown runs (during an apply it acts: it stops the apply and tears down).
            return (not self.read_only and self.has_resources() and not isinstance(self.screen, ModalScreen)
                    and not getattr(self.screen, "tearing_down", False))
        return True

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The palette (ctrl+p): what the footer offers now, from the same bindings (one per action, those that
        act now: a dimmed or hidden key is no command either), then the two commands no key runs, then Textual's."""
        offered: set[str] = set()
        for node, binding, enabled, tooltip in screen.active_bindings.values():
            if binding.show and enabled and binding.action not in offered:
                offered.add(binding.action)
                yield SystemCommand(binding.description, tooltip or binding.description,
                                    partial(self.run_action, binding.action, node))
        yield SystemCommand("Show config", "The run's effective configuration, field by field", self._show_config)
        yield SystemCommand("Resume command", "How to come back to this run from a shell", self._show_resume)
        # Textual's own Quit would exit at once, without the detach question (ours is the q binding's); its
        # "Keys" panel is a second help beside ours (`?`, every key of the screen).
        theirs = {self.action_quit, self.action_show_help_panel, self.action_hide_help_panel}
        yield from (c for c in super().get_system_commands(screen) if c.callback not in theirs)

    def _show_config(self) -> None:
        """What the job runs with: the target's fields, auto values resolved, each with its source."""
        config = self.session.config
        self.push_screen(ConfigScreen(f"Config of run {self.session.run_id} ({config.target})",
                                      config.effective_rows(self.session.sources)))

    def _show_resume(self) -> None:
        self.notify(f"{rtui_command()} --resume {self.session.run_id}", title="Resume this run", timeout=15)

    def _ask_config_confirmation(self, resolved: ResolvedConfig) -> None:
        path, sha256 = resolved.config_file, resolved.config_sha256
        assert path is not None and sha256 is not None  # an unconfirmed file was read

        def answered(yes: bool | None) -> None:
            if not yes:
                self.exit(return_code=2, message=f"rtui: nothing was run: {path} was not confirmed — pass the "
                                                 "values you want as flags, or review it and answer y")
                return
            remember(Path(path), sha256)
            update = dict(resolved.unconfirmed)
            self._reconfigure(update, path, "or run elsewhere")
            self.session.sources.update({f: f"file:{path} (confirmed)" for f in update})

        self.push_screen(ConfirmConfigFile(path, dict(resolved.unconfirmed)), answered)

    def on_mount(self) -> None:
        if self.confirm_config is not None and self.confirm_config.unconfirmed:
            self._ask_config_confirmation(self.confirm_config)
        if self.choose_from:
            def picked(run_id: str | None) -> None:
                if run_id and run_id != self.session.run_id:
                    self._replace_session(RunSession.resume(run_id, self.session.store))
                    self._set_subtitle()
                    self._go(self.get_default_screen())

            self.push_screen(PickRun(self.choose_from, self.session.store), picked)

    def action_toggle_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss()
        else:
            self.push_screen(HelpScreen(getattr(self.screen, "HELP_TITLE", "this screen"), key_rows(self.screen)))

    def action_quit_detach(self) -> None:
        if isinstance(self.screen, ConfirmDetach):
            return
        steps_running = bool(getattr(self.screen, "running", False))
        job_running = str(getattr(self.screen, "job_status", "")) in ("PENDING", "RUNNING")
        if steps_running or job_running:
            def answered(yes: bool | None) -> None:
                if yes:
                    self._exit_detached()

            self.push_screen(ConfirmDetach(self.session.run_id, job=job_running and not steps_running,
                                           command=rtui_command()), answered)
            return
        self._exit_detached()

    def _exit_detached(self) -> None:
        record = self.session.record
        saved = self.session.store.path_for(record.run_id).exists()
        if saved and record.status is not RunStatus.DOWN:
            rtui = rtui_command()
            message = (f"Detached from run {record.run_id}; nothing was torn down.\n"
                       f"Resume: {rtui} --resume {record.run_id}   ·   tear down: {rtui} down {record.run_id} --yes")
        else:
            message = None
        self.exit(return_code=0, message=message)


if TYPE_CHECKING:  # what screens reach through tui.screen.WizardApp, checked here
    _app_as_screens_see_it: type[WizardApp] = RtuiApp


def teardown_summary(session: RunSession, *, now: float | None = None, gpu: GpuFleet | None = None,
                     billed: Billed | None = None) -> list[str]:
    """What the teardown modal lists: what this run has made, by layer, and what it costs per hour
    (and has cost up to ``now``, the wall clock unless given): with ``gpu``, the GPU nodes there are
    now, beside the price at full size when they differ; with ``billed``, what the provider's records
    say the nodes cost so far."""
    by_layer: dict[str, list[str]] = {}
    for address, entry in session.record.resources.items():
        if entry.live:
            by_layer.setdefault(entry.layer or "other", []).append(address)
    lines = [f"{layer}: {', '.join(names[:6])}" + (f" +{len(names) - 6} more" if len(names) > 6 else "")
             for layer, names in by_layer.items()]
    cost = cost_meter(session.record, now=now, gpu=gpu, billed=billed)
    if cost is not None and cost.per_hour_full:
        lines.append(f"These cost {per_hour_words(cost.per_hour, cost.per_hour_full)} "
                     f"({accrued_words(cost.accrued, cost.accrued_exact)}).")
    return lines or ["Nothing is recorded as made; discovery looks again before deleting."]


async def kept_data_line(session: RunSession) -> str | None:
    """What teardown keeps of the run's data, None for nothing. Seconds at times (a kube volume is read
    by a pod, S3 listed): the modal shows "measuring…" meanwhile."""
    store = session.data_store()
    usage = await store.usage() if store is not None else None
    if usage is not None and not usage.empty:
        return f"Kept unless you say so: {usage.describe()}"
    return None
