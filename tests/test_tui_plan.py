"""The plan review screen: every change kind, collapsed no-ops, wrapping, costs, quota, and the apply gate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widgets import Label

from backend.planner import PlanResult
from backend.resources import Action, Change
from backend.session import RunSession
from screens.confirm import ConfirmApply, apply_summary
from screens.plan import PlanScreen
from tests.pilot_wait import wait_for
from tests.snap import SnapCompare
from tests.test_tui import fixed_session
from tui.app import RtuiApp
from tui.plan_diff import PlanDiff, PlanSummary, plan_lines

G = "L-DB2E81BA"
LONG_ENTRYPOINT = ("python -m training.train --steps 100 --seq-len 128 --batch-size 1 --lr 1e-05 --num-workers 8 "
                   "--precision bf16 --shard full --data cycle --device cuda --model-id Qwen/Qwen2.5-1.5B "
                   "--require-transport efa")


def every_kind() -> PlanResult:
    """One change of each kind, and no-ops in two layers (hand-built: no cloud behind it)."""
    return PlanResult(target="aws", changes=[
        Change(address="aws.vpc", layer="aws", kind="vpc", action=Action.NOOP, reason="in place"),
        Change(address="aws.subnet.private.us-east-1a", layer="aws", kind="subnet", action=Action.NOOP),
        Change(address="aws.eks-cluster", layer="aws", kind="eks-cluster", action=Action.NOOP, cost_per_hour=0.10),
        Change(address="aws.nat-gateway", layer="aws", kind="nat-gateway", action=Action.CREATE,
               after={"az": "us-east-1a"}, cost_per_hour=0.05, reason="does not exist"),
        Change(address="aws.nodegroup.system", layer="aws", kind="nodegroup", action=Action.UPDATE,
               before={"instance_type": "m7i.xlarge", "size": 1}, after={"instance_type": "m7i.xlarge", "size": 2},
               cost_per_hour=0.4032, reason="size differs", quota={"L-1216C47A": {"vcpus": 8, "headroom": 640}}),
        Change(address="aws.nodegroup.gpu", layer="aws", kind="nodegroup", action=Action.REPLACE,
               before={"instance_type": "g6.48xlarge", "size": 2}, after={"instance_type": "g6.12xlarge", "size": 2},
               cost_per_hour=9.2032, reason="instance_type cannot change in place",
               quota={G: {"vcpus": 96, "headroom": 192}}),
        Change(address="aws.placement-group.old", layer="aws", kind="placement-group", action=Action.DELETE,
               before={"strategy": "cluster"}, reason="no longer wanted"),
        Change(address="kube.namespace", layer="kube", kind="namespace", action=Action.NOOP),
        Change(address="ray.job.train", layer="ray-job", kind="ray-job", action=Action.CREATE,
               after={"entrypoint": LONG_ENTRYPOINT, "workers": 8}),
    ], layer_titles={"aws": "AWS infrastructure", "kube": "Kubernetes objects", "ray-job": "Ray job"})


class PlanApp(RtuiApp):
    """The real app opening on the plan screen; the session's plan is the one given (else its own)."""

    def __init__(self, session: RunSession, plan: PlanResult | None = None, *, read_only: bool = False) -> None:
        if plan is not None:
            async def planned() -> PlanResult:
                return plan

            session.plan = planned
        super().__init__(session, read_only=read_only)
        self.applied: list[PlanResult] = []

    def get_default_screen(self) -> Screen[None]:
        return PlanScreen()

    def _apply(self, plan: PlanResult) -> None:  # what follows the gate is tested elsewhere
        self.applied.append(plan)


async def planned(pilot: Pilot[None], timeout: float = 5) -> PlanScreen:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, PlanScreen) and pilot.app.screen.plan, timeout, "plan")
    screen = pilot.app.screen
    assert isinstance(screen, PlanScreen)
    return screen


def diff_text(screen: PlanScreen) -> str:
    return str(screen.query_one(PlanDiff).render())


def summary_text(screen: PlanScreen) -> str:
    return str(screen.query_one(PlanSummary).render())


def aws_session() -> RunSession:
    return fixed_session(target="aws", region="us-east-1")


async def test_every_change_kind_with_symbols_before_after_and_costs(isolated_env: Path) -> None:
    app = PlanApp(aws_session(), every_kind())
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await planned(pilot)
        text = diff_text(screen)
        lines = text.splitlines()
        assert lines[0].startswith("aws — AWS infrastructure   1 to create, 1 to update, 1 to replace, "
                                   "1 to delete, 3 unchanged")
        assert "kube — Kubernetes objects" in text and "ray-job — Ray job" in text
        # The symbol is text, not only a colour: the plan reads with NO_COLOR.
        assert "  + aws.nat-gateway  $0.050/h" in text
        assert "  ~ aws.nodegroup.system  $0.40/h  # size differs" in text
        assert "-/+ aws.nodegroup.gpu  $9.20/h  # instance_type cannot change in place" in text
        assert "  - aws.placement-group.old  # no longer wanted" in text
        assert "        strategy = cluster" in text  # what a delete removes
        # Updates and replacements show only the keys that change, before → after.
        assert "size = 1 → 2" in text and "instance_type = g6.48xlarge → g6.12xlarge" in text
        assert "instance_type = m7i.xlarge" not in text and "size = 2 → 2" not in text
        assert "uses 96 vCPUs of L-DB2E81BA, headroom 192" in text
        assert "uses 8 vCPUs of L-1216C47A, headroom 640" in text
        # No-ops: one dim line per layer until `u`.
        assert "3 unchanged (u shows them)" in text and "1 unchanged (u shows them)" in text
        assert "aws.vpc" not in text and "kube.namespace" not in text
        summary = summary_text(screen)
        assert "Plan: 2 to create, 1 to update, 1 to replace, 1 to delete, 4 unchanged." in summary
        assert "Cost: $9.76/hour while up" in summary  # no-ops count (they stay up), deletions do not
        assert "Quota: 8 vCPUs of L-1216C47A, headroom 640 · 96 vCPUs of L-DB2E81BA, headroom 192" in summary

        await pilot.press("u")
        text = diff_text(screen)
        assert "aws.vpc  # in place" in text and "kube.namespace" in text and "aws.eks-cluster  $0.10/h" in text
        assert "unchanged (u shows them)" not in text
        await pilot.press("u")
        assert "aws.vpc" not in diff_text(screen)


async def test_bindings_have_ids_and_tooltips() -> None:
    for bindings in (PlanScreen.BINDINGS, ConfirmApply.BINDINGS):
        for binding in bindings:
            assert not isinstance(binding, tuple)
            assert binding.id and binding.tooltip, binding


async def test_long_values_wrap_under_their_key_at_80_columns(isolated_env: Path) -> None:
    app = PlanApp(aws_session(), every_kind())
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await planned(pilot)
        widget = screen.query_one(PlanDiff)
        width = widget.content_region.width
        lines = diff_text(screen).splitlines()
        assert all(len(line) <= width for line in lines)
        first = next(i for i, line in enumerate(lines) if "entrypoint = python -m training.train" in line)
        column = lines[first].index("python")
        rest = lines[first + 1:lines.index("        workers = 8")]
        assert len(rest) >= 2, lines
        for line in rest:  # a hanging indent: each continuation starts under the value, never at column 0
            assert line[:column].strip() == "" and line[column] != " ", (column, line)
        assert " ".join(x.strip() for x in [lines[first].split(" = ", 1)[1], *rest]) == LONG_ENTRYPOINT
        # The totals stay on screen at 80×24, under the scrolling diff.
        assert screen.query_one(PlanSummary).region.bottom <= 23


def test_hanging_indent_for_a_value_with_no_spaces() -> None:
    change = Change(address="kube.secret", layer="kube", kind="secret", action=Action.CREATE,
                    after={"data": "x" * 150})
    lines = [t.plain for t in plan_lines(PlanResult(target="kube", changes=[change]), 60)]
    assert [len(line) for line in lines[2:]] == [60, 60, 60, 15 + 15]
    assert all(line.startswith(" " * 15 + "x") for line in lines[3:])


async def refuse_then_apply(pilot: Pilot[None], app: PlanApp, no: str) -> None:
    """On the apply confirmation: ``no`` goes back to the plan with nothing applied; `a` then `y` applies."""
    await pilot.press(no)
    await wait_for(pilot, lambda: isinstance(app.screen, PlanScreen), 5, "back to the plan")
    assert app.applied == []
    await pilot.press("a")
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmApply), 5, "the apply confirmation")
    await pilot.press("y")
    await wait_for(pilot, lambda: app.applied, 5, "the apply")


async def test_apply_on_aws_shows_the_hourly_cost_and_needs_a_second_key(isolated_env: Path) -> None:
    plan = every_kind()
    app = PlanApp(aws_session(), plan)
    async with app.run_test(size=(80, 24)) as pilot:
        await planned(pilot)
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmApply), 5, "the apply confirmation")
        shown = str(app.screen.query_one("#apply-summary").render())
        assert shown == "Apply: creates 2 resources, updates 1, replaces 1, deletes 1, $9.76/hour while up"
        await pilot.press("enter", "a", "space")  # none of these is the answer
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()  # the keys handled and the app idle: the modal still asks (waits on idle, not a fixed time)
        assert isinstance(app.screen, ConfirmApply) and app.applied == []
        await refuse_then_apply(pilot, app, "escape")
        assert app.applied == [plan] and isinstance(app.screen, PlanScreen)


async def test_a_free_local_plan_applies_on_the_first_key(isolated_env: Path) -> None:
    plan = PlanResult(target="local", changes=[
        Change(address="local.ray-head", layer="local-ray", kind="ray-head", action=Action.CREATE, after={"cpus": 2})])
    app = PlanApp(fixed_session(), plan)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await planned(pilot)
        assert "Cost: free (local)" in summary_text(screen)
        assert not screen.check_action("toggle_unchanged", ())  # nothing to unfold
        await pilot.press("a")
        await wait_for(pilot, lambda: app.applied, 5, "the apply")
        assert not isinstance(app.screen, ConfirmApply)


async def test_a_free_plan_that_changes_a_shared_cluster_asks_twice_naming_what(isolated_env: Path) -> None:
    """Issue 40 item 7: kube applied on one key although it installs CRDs, an operator and device plugins on a
    cluster its user shares with others. Confirmation goes by consequence: cluster-wide objects ask twice."""
    plan = PlanResult(target="kube", changes=[
        Change(address="kube.namespace", layer="kube", kind="kube-namespace", action=Action.CREATE),
        Change(address="kube.kuberay-operator", layer="kube", kind="kuberay-operator", action=Action.CREATE,
               cluster_wide="KubeRay's CRDs, for every namespace"),
        Change(address="kube.device-plugin.nvidia", layer="kube", kind="kube-device-plugin-nvidia",
               action=Action.NOOP, cluster_wide="a DaemonSet on every GPU node"),
    ])
    app = PlanApp(fixed_session(target="kube"), plan)
    async with app.run_test(size=(80, 24)) as pilot:
        await planned(pilot)
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmApply), 5, "the apply confirmation")
        shown = " ".join(str(label.render()) for label in app.screen.query(Label))
        assert "kube.kuberay-operator" in shown and "KubeRay's CRDs, for every namespace" in shown, shown
        assert "kube.device-plugin.nvidia" not in shown, "a change that is a no-op changes nothing"
        assert "costing money" not in shown, shown
        await refuse_then_apply(pilot, app, "n")


def test_apply_summary_wording() -> None:
    one = PlanResult(target="aws", changes=[Change(address="a", layer="aws", kind="k", action=Action.CREATE,
                                                   cost_per_hour=1.5)])
    assert apply_summary(one) == "Apply: creates 1 resource, $1.50/hour while up"


# --- SVG snapshots (nothing on this screen reads the clock or blinks) ---------------------------
def _snapshot(snap_compare: SnapCompare, size: tuple[int, int], *keys: str) -> bool:
    async def drive(pilot: Pilot[None]) -> None:
        await planned(pilot)
        await pilot.press(*keys)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()  # the keys handled and laid out: the app idle, not a fixed time

    return bool(snap_compare(PlanApp(aws_session(), every_kind()), run_before=drive, terminal_size=size))


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
def test_plan_every_kind_snapshot(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    assert _snapshot(snap_compare, size)


def test_plan_unchanged_shown_120x40_snapshot(snap_compare: SnapCompare) -> None:
    assert _snapshot(snap_compare, (120, 40), "u")


def test_apply_confirmation_80x24_snapshot(snap_compare: SnapCompare) -> None:
    assert _snapshot(snap_compare, (80, 24), "a")


async def test_apply_is_not_offered_until_the_plan_is_made(isolated_env: Path) -> None:
    """While the plan is being made the footer shows no `a Apply` and the key does nothing; once it is
    made the key is offered and works (issue 21 item 5: the footer never offers a key that is refused)."""
    plan = PlanResult(target="local", changes=[
        Change(address="local.ray-head", layer="local-ray", kind="ray-head", action=Action.CREATE, after={"cpus": 2})])
    release = asyncio.Event()
    session = fixed_session()

    async def slow_plan() -> PlanResult:
        await release.wait()
        return plan

    app = PlanApp(session)
    session.plan = slow_plan
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, PlanScreen), 5, "the plan screen")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()  # the app idle: the footer is drawn (waits on idle, not a fixed time)
        footer = {key for key, b in app.screen.active_bindings.items() if b.binding.show}
        assert "a" not in footer, footer
        await pilot.press("a")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()  # the key handled and the app idle: nothing applied (waits on idle, not a fixed time)
        assert app.applied == []
        release.set()
        screen = await planned(pilot)
        assert screen.check_action("apply", ()) is True
        await pilot.press("a")
        await wait_for(pilot, lambda: app.applied, 5, "the apply")
