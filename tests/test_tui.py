"""The wizard as a person uses it: Pilot for behaviour, SVG snapshots for looks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widgets import Label

from backend.resolve import resolve_config
from backend.session import RunSession
from backend.store import RunStatus, RunStore
from screens.confirm import ConfirmTeardown
from screens.plan import PlanScreen
from screens.run import RunScreen
from targets.local.cluster import cluster_family
from tests.pilot_wait import wait_for
from tests.snap import SnapCompare
from tui.app import RtuiApp
from tui.logtail import LogTail
from tui.widgets import StepPane

FIXED_RUN_ID = "r20260101-000000-beef"


def fixed_session(**flags: str) -> RunSession:
    local = {"local_cpus": "2"} if flags.get("target", "local") == "local" else {}
    session = RunSession.for_config(resolve_config({**local, **flags}, environ={}))
    session.record.run_id = FIXED_RUN_ID
    session.record.spool_path = str(RunStore().spool_dir / f"{FIXED_RUN_ID}.log")
    return session




async def test_read_only_hides_apply_and_plan_writes_nothing(isolated_env: Path) -> None:
    app = RtuiApp(fixed_session(), read_only=True)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "target screen")
        await pilot.press("enter")
        await wait_for(pilot, lambda: getattr(app.screen, "plan", None) is not None, 10, "plan")
        assert app.screen.check_action("apply", ()) is False
        await pilot.press("a")
        await pilot.pause()  # the key and whatever it posted are processed: the moment has passed
        assert type(app.screen).__name__ == "PlanScreen"
        await pilot.press("q")
    assert app.return_code == 0
    assert not isolated_env.exists(), "browsing the plan must not write state"


class ConfirmHarness(App[None]):
    """An app that opens on a teardown modal (``modal``: made on mount; a plain one by default)."""

    def __init__(self, modal: Callable[[], ConfirmTeardown] | None = None) -> None:
        super().__init__()
        self.answer: bool | None = None
        self.modal = modal or (lambda: ConfirmTeardown("rtui-ray", "run r1"))

    def compose(self) -> ComposeResult:
        return iter(())

    def on_mount(self) -> None:
        def done(value: bool | None) -> None:
            self.answer = value

        self.push_screen(self.modal(), done)


async def test_teardown_needs_the_exact_cluster_name() -> None:
    app = ConfirmHarness()
    async with app.run_test() as pilot:
        await pilot.press(*"rtui-rat", "enter")
        await wait_for(pilot, lambda: "not the cluster name" in str(app.screen.query_one("#confirm-error").render()),
                       5, "the refusal")
        assert app.answer is None
        await pilot.press("backspace", "y", "enter")
        await wait_for(pilot, lambda: app.answer is True, 5, "the answer yes")
    app2 = ConfirmHarness()
    async with app2.run_test() as pilot:
        await pilot.press("escape")
        await wait_for(pilot, lambda: app2.answer is False, 5, "the answer no")


def test_plan_screen_snapshot(snap_compare: SnapCompare) -> None:
    async def to_plan(pilot: Pilot[Any]) -> None:
        await pilot.press("enter")
        await wait_for(pilot, lambda: getattr(pilot.app.screen, "plan", None) is not None, 10, "plan")

    assert snap_compare(RtuiApp(fixed_session(steps="20")), run_before=to_plan, terminal_size=(110, 30))


@pytest.mark.ray
async def test_pilot_drives_the_whole_local_flow(isolated_env: Path) -> None:
    app = RtuiApp(RunSession.for_config(resolve_config({"steps": "12"})))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "target screen")
        await pilot.press("enter")
        await wait_for(pilot, lambda: getattr(app.screen, "plan", None) is not None, 15, "plan")
        plan = app.screen
        assert isinstance(plan, PlanScreen) and plan.plan is not None
        assert [c.action for c in plan.plan.changes] == ["create", "create"]
        await pilot.press("a")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ProvisionScreen", 5, "provisioning")
        panes = {p.step_id for p in app.screen.query(StepPane)}
        assert panes == {"local.ray-head", "ray.job.train"}
        await wait_for(pilot, lambda: type(app.screen).__name__ == "RunScreen", 120, "run screen")
        run = app.screen
        assert isinstance(run, RunScreen)
        await wait_for(pilot, lambda: run.job_status == "SUCCEEDED", 240, "job to succeed")
        await wait_for(pilot, lambda: run.metric is not None and run.metric.step == 12 and run.summary is not None,
                       10, "the last metric and the summary")
        assert run.metric is not None and run.metric.step == 12
        assert run.summary is not None and run.summary["steps"] == 12
        tail = run.query_one("#tail", LogTail)
        assert not any("RTUI_METRIC" in line for line in tail.lines), "metric lines are hidden until m"
        await pilot.press("m")
        await wait_for(pilot, lambda: any("RTUI_METRIC" in line for line in tail.lines), 5, "the metric lines")
        assert not any("\x1b[" in line for line in tail.lines), "ANSI escapes must not reach the view"
        metrics_text = str(run.query_one("#metrics").render())
        assert "step 12/12" in metrics_text
        assert str(run.query_one("TransportBadge").render()).startswith(" GLOO (CPU)  backend")

        record = app.session.record
        cluster_dir = Path(str(record.resources["local.ray-head"].id))
        assert cluster_family(cluster_dir)
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmTeardown), 5, "the teardown modal")
        await pilot.press(*"rtui-ray", "enter")
        await wait_for(pilot, lambda: "down" in str(app.sub_title), 60, "teardown")
        assert RunStore().load(record.run_id).status is RunStatus.DOWN
        assert not cluster_family(cluster_dir) and not cluster_dir.exists()
        await pilot.press("escape")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "a new run")
        assert app.session.run_id != record.run_id
        await pilot.press("q")
    assert app.return_code == 0


async def test_quit_while_steps_run_asks_first(isolated_env: Path) -> None:
    import asyncio

    from backend.planner import PlanResult
    from backend.resources import Action, Change, EventKind, StepEvent
    from screens.confirm import ConfirmDetach
    from screens.provision import ProvisionScreen

    session = fixed_session()
    plan = PlanResult(target="local", changes=[
        Change(address="local.ray-head", layer="local-ray", kind="ray-head", action=Action.CREATE),
        Change(address="ray.job.train", layer="ray-job", kind="ray-job", action=Action.CREATE)])

    async def slow_apply(plan: PlanResult, *, until: str | None = None) -> AsyncIterator[StepEvent]:
        yield StepEvent(step="local.ray-head", kind=EventKind.STARTED, message="Start the Ray head")
        await asyncio.sleep(30)  # models time: a step still running when the user quits

    session.apply = slow_apply
    app = RtuiApp(session)
    async with app.run_test(size=(110, 36)) as pilot:
        await app.push_screen(ProvisionScreen(plan))
        await wait_for(pilot, lambda: app.screen.query("StepPane"), 5, "panes")
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDetach), 5, "the detach question")
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, ProvisionScreen), 5, "the steps again")
        assert isinstance(app.screen, ProvisionScreen) and app.screen.running
        await pilot.press("q", "y")
        await wait_for(pilot, lambda: app.return_code is not None, 5, "the app to exit")
    assert app.return_code == 0


def resumable_session() -> RunSession:
    """A saved run that has a job, as `rtui --resume` finds it (its cluster is gone)."""
    from backend.store import JobRecord, JobState

    session = fixed_session()
    session.record.jobs.append(JobRecord(submission_id="rtui-x-1", submitted_at=0.0, spec_hash="h",
                                         status=JobState.RUNNING))
    session.record.status = RunStatus.UP
    session.store.save(session.record)
    return RunSession.resume(FIXED_RUN_ID)


async def test_teardown_right_after_resume_then_escape_starts_a_new_run(isolated_env: Path) -> None:
    """`D` on the first screen of `rtui --resume` tears down; escape then never offers to apply the dead run."""
    app = RtuiApp(resumable_session(), resume=True)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_for(pilot, lambda: type(app.screen).__name__ == "RunScreen", 5, "run screen")
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmTeardown), 5, "the confirm modal")
        await pilot.press(*"rtui-ray", "enter")
        await wait_for(pilot, lambda: RunStore().load(FIXED_RUN_ID).status is RunStatus.DOWN, 15, "teardown")
        await wait_for(pilot, lambda: not getattr(app.screen, "running", True), 5, "steps to stop")
        assert type(app.screen).__name__ == "ProvisionScreen" and "down" in str(app.sub_title)
        await pilot.press("escape")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "the target screen")
        assert app.session.run_id != FIXED_RUN_ID and app.session.record.status is RunStatus.PLANNED
        assert len(app.screen_stack) <= 2
        await pilot.press("q")
    assert app.return_code == 0


async def test_every_transition_goes_through_app_messages(isolated_env: Path) -> None:
    """Target → plan → back → plan: screens post, the App routes; the stack holds one main screen."""
    app = RtuiApp(fixed_session())
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "target screen")
        await pilot.press("enter")
        await wait_for(pilot, lambda: getattr(app.screen, "plan", None) is not None, 10, "plan")
        assert len(app.screen_stack) <= 2
        await pilot.press("escape")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "back to the target")
        assert len(app.screen_stack) <= 2
        await pilot.press("q")


async def test_a_run_that_keeps_no_data_is_not_offered_to_delete_it() -> None:
    """Issue 40 item 6: a kube run without storage was offered "to delete checkpoints and models too"."""
    app = ConfirmHarness(lambda: ConfirmTeardown("rtui-ray", "run r1", data_line=None, keeps_data=False))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmTeardown), 5, "the modal")
        shown = " ".join(str(label.render()) for label in app.screen.query(Label))
        assert "Checkpoints and models" not in shown and "delete data" not in shown, shown
        await pilot.press(*"rtui-ray delete data", "enter")
        await wait_for(pilot, lambda: "keeps no checkpoints" in str(app.screen.query_one("#confirm-error").render()),
                       5, "the refusal")
        assert app.answer is None


async def test_teardown_of_a_kube_run_without_storage_does_not_offer_its_data(isolated_env: Path) -> None:
    from tui.app import RtuiApp

    session = RunSession.for_config(resolve_config({"target": "kube"}))
    assert session.data_store() is None
    app = RtuiApp(session)
    modal = app.teardown_modal()
    assert modal.data_line is None and not modal.keeps_data
