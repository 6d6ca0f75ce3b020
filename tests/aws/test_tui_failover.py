"""The wizard offers to move the GPU nodes when AWS has no capacity for them (aws target, moto)."""

from __future__ import annotations

from pathlib import Path

from screens.plan import PlanScreen
from screens.provision import ProvisionScreen
from targets.aws.facts import AwsFacts
from targets.aws.infra.nodes import CapacityError
from tests.aws.conftest import World
from tests.aws.provision_world import gpu_az, session_for
from tests.pilot_wait import wait_for
from tui.app import RtuiApp


async def test_no_capacity_offers_the_move_and_the_plan_moves_the_gpu_nodes(world: World, kube_file: Path) -> None:
    session = session_for()
    await session.plan()
    first = AwsFacts.of(session.record.facts).gpu_az or gpu_az(session)
    cause = f"nodegroup g: InsufficientInstanceCapacity in {first} (AsgInstanceLaunchFailures)"
    failed = CapacityError(cause, az=first)
    app = RtuiApp(session)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "target screen")
        screen = ProvisionScreen(mode="apply")
        screen.running, screen.no_capacity = False, failed
        assert ProvisionScreen.check_action(screen, "fail_over", ()) is True
        app.post_message(ProvisionScreen.FailoverRequested(failed))
        await wait_for(pilot, lambda: type(app.screen).__name__ == "PlanScreen", 5, "the plan screen")
        await wait_for(pilot, lambda: getattr(app.screen, "plan", None) is not None, 30, "the new plan")
        moved = AwsFacts.of(session.record.facts).az_moves[0]
        assert moved.from_az == first and moved.to != first
        plan = app.screen.plan if isinstance(app.screen, PlanScreen) else None
        assert plan is not None
        gpu = plan.change("aws.nodegroup.gpu")
        assert gpu is not None and gpu.after is not None and gpu.after["azs"] == [moved.to]
        assert plan.change(f"aws.subnet.private.{moved.to}") is not None
        await pilot.press("q")


async def test_no_spot_capacity_offers_on_demand_there_and_the_plan_makes_it(world: World, kube_file: Path) -> None:
    """Issue 41: on a Spot run `m` says it moves the GPU nodes to On-Demand (asked once, by the key), and
    the plan after it makes them On-Demand in the same AZ; a later `m` would move the AZ."""
    session = session_for(spot=True)
    await session.plan()
    first = AwsFacts.of(session.record.facts).gpu_az or gpu_az(session)
    failed = CapacityError(f"nodegroup g: InsufficientInstanceCapacity for Spot in {first} (AsgInstanceLaunchFailures)",
                           az=first)
    app = RtuiApp(session)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "target screen")
        screen = ProvisionScreen(mode="apply")
        screen.running, screen.no_capacity = False, failed
        hint = session.target.fail_over_hint(session.config, session.record.facts)
        assert hint is not None and "m moves them to On-Demand there" in hint
        app.post_message(ProvisionScreen.FailoverRequested(failed))
        await wait_for(pilot, lambda: type(app.screen).__name__ == "PlanScreen", 5, "the plan screen")
        await wait_for(pilot, lambda: getattr(app.screen, "plan", None) is not None, 30, "the new plan")
        fallback = AwsFacts.of(session.record.facts).spot_fallback
        assert fallback is not None and fallback.az == first and AwsFacts.of(session.record.facts).az_moves == []
        plan = app.screen.plan if isinstance(app.screen, PlanScreen) else None
        assert plan is not None
        gpu = plan.change("aws.nodegroup.gpu")
        assert gpu is not None and gpu.after is not None
        assert gpu.after["capacity_type"] == "ON_DEMAND" and gpu.after["azs"] == [first]
        assert "AZ" in str(session.target.fail_over_hint(session.config, session.record.facts))
        await pilot.press("q")
