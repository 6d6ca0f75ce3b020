"""Issue 20 item 8: the reservation the preflight counts is the one the GPU nodes launch into.

The GPU AZ has no On-Demand capacity (``ice_zones``), so the nodes come up only where the launch
really draws on the reservation (tests/aws/moto_reservations.py says how EC2 decides that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backend.resources import Action
from tests.aws.conftest import World
from tests.aws.provision_world import down, ec2, eks, gpu_az, session_for, tagged, up

pytestmark = pytest.mark.usefixtures("fast_backoff")
ZONE = "us-east-1c"


def _gpu_launch(session: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The GPU nodegroup as EKS describes it, and its launch template's data."""
    group = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    ref = group["launchTemplate"]
    data = ec2().describe_launch_template_versions(LaunchTemplateId=ref["id"], Versions=[str(ref["version"])])
    return group, data["LaunchTemplateVersions"][0]["LaunchTemplateData"]


async def _up_in_reservation(world: World, cr: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    world.script.ice_zones["g6.12xlarge"] = {ZONE}
    session = session_for()
    made = await up(session)
    assert made.ok, made.failures()
    assert gpu_az(session) == ZONE
    assert cr["AvailableInstanceCount"] == cr["TotalInstanceCount"] - 2
    group, data = _gpu_launch(session)
    assert group["status"] == "ACTIVE"
    # The nodes fill the reservation (no free slot left): a second plan keeps naming it, changes nothing.
    again = await session.plan()
    assert [(c.address, c.reason) for c in again.changes if c.layer == "aws" and c.action is not Action.NOOP] == []
    return session, group, data


def _our_placement_groups() -> list[str]:
    return sorted(g["GroupName"] for g in ec2().describe_placement_groups()["PlacementGroups"]
                  if g["GroupName"].startswith("rtui-") and g.get("State") != "deleted")


async def _down_gives_back(session: Any, cr: dict[str, Any]) -> None:
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
    assert cr["AvailableInstanceCount"] == cr["TotalInstanceCount"]


@pytest.mark.slow
async def test_a_targeted_odcr_is_named_by_the_launch_template(world: World, kube_file: Path) -> None:
    cr = world.reserve("us-east-1", ZONE, count=2, match="targeted")
    session, group, data = await _up_in_reservation(world, cr)
    target = data["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target["CapacityReservationId"] == cr["CapacityReservationId"]
    assert group.get("capacityType", "ON_DEMAND") == "ON_DEMAND" and "InstanceMarketOptions" not in data
    # Its capacity is held outside any placement group: a fresh cluster group would have to hold the
    # nodes anyway (InsufficientInstanceCapacity), so the nodes go where the reservation has them.
    assert "GroupName" not in (data.get("Placement") or {})
    assert _our_placement_groups() == []
    await _down_gives_back(session, cr)


@pytest.mark.slow
async def test_a_capacity_block_takes_a_capacity_block_nodegroup(world: World, kube_file: Path) -> None:
    cr = world.reserve("us-east-1", ZONE, count=2, kind="capacity-block")
    session, group, data = await _up_in_reservation(world, cr)
    assert group["capacityType"] == "CAPACITY_BLOCK"
    assert data["InstanceMarketOptions"]["MarketType"] == "capacity-block"
    target = data["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target["CapacityReservationId"] == cr["CapacityReservationId"]
    # A Capacity Block is co-located already and takes no placement group.
    assert "GroupName" not in (data.get("Placement") or {})
    assert _our_placement_groups() == []
    await _down_gives_back(session, cr)


@pytest.mark.slow
async def test_an_open_odcr_is_used_without_naming_it(world: World, kube_file: Path) -> None:
    cr = world.reserve("us-east-1", ZONE, count=2)
    session, group, data = await _up_in_reservation(world, cr)
    assert "CapacityReservationSpecification" not in data
    assert group.get("capacityType", "ON_DEMAND") == "ON_DEMAND"
    await _down_gives_back(session, cr)


@pytest.mark.slow
async def test_a_targeted_odcr_in_a_cluster_placement_group_takes_the_nodes_into_that_group(
        world: World, kube_file: Path) -> None:
    ec2().create_placement_group(GroupName="team-p-group", Strategy="cluster")
    cr = world.reserve("us-east-1", ZONE, count=2, match="targeted", placement_group="team-p-group")
    plan = await session_for().plan()
    lt = next(c for c in plan.changes if c.address == "aws.launch-template.gpu")
    assert lt.after is not None and lt.after["placement_group"] == "team-p-group"
    assert "aws.placement-group.gpu" not in {c.address for c in plan.changes}  # none of ours is made
    session, _, data = await _up_in_reservation(world, cr)
    assert data["Placement"]["GroupName"] == "team-p-group"
    assert _our_placement_groups() == []
    await _down_gives_back(session, cr)
    assert [g["GroupName"] for g in ec2().describe_placement_groups()["PlacementGroups"]] == ["team-p-group"]


async def test_an_open_odcr_in_another_placement_group_is_not_counted(world: World) -> None:
    from targets.aws.cloud import PreflightRequest, run_preflight

    other = world.reserve("us-east-1", ZONE, count=2, placement_group="someone-elses-group")
    (region,) = (await run_preflight(PreflightRequest())).regions
    zone = next(z for z in region.zones if z.zone == ZONE)
    (found,) = zone.reservations
    assert found.id == other["CapacityReservationId"] and found.placement_group == "someone-elses-group"
    assert not found.usable  # the GPU nodes launch into rtui's own group: it would take none of them
    assert "placement group someone-elses-group" in found.why_unusable


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["expired", "cancelled"])
async def test_a_recorded_reservation_that_ended_is_named_no_more(world: World, kube_file: Path, ending: str) -> None:
    from tui.render import format_plan

    cr = world.reserve("us-east-1", ZONE, count=2, match="targeted")
    session, _, _ = await _up_in_reservation(world, cr)
    # The reservation ends while the nodes run (EC2 keeps describing it, with its state and end date).
    cr["State"] = ending
    cr.update({"EndDateType": "limited", "EndDate": "2026-12-01T00:00:00Z"} if ending == "expired" else {})
    world.script.ice_zones.clear()
    plan = await session.plan()
    lt = plan.change("aws.launch-template.gpu")
    assert lt is not None and lt.after is not None and lt.after["reservation"] is None
    said = "expired on 2026-12-01" if ending == "expired" else "cancelled"
    # (beside the idle-cost line every plan with --idle-minutes has: test_idle_cost)
    notes = [n for n in plan.notes if not n.startswith("idle after")]
    assert notes == [f"capacity reservation {cr['CapacityReservationId']} {said}: "
                          "the GPU nodes now use On-Demand capacity"]
    assert f"Note: capacity reservation {cr['CapacityReservationId']} {said}" in format_plan(plan)
    assert (await down(session)).ok
