"""Issue 20 item 8: the reservation the preflight counts is the one the GPU nodes launch into.

The GPU AZ has no On-Demand capacity (``ice_zones``), so the nodes come up only where the launch
really draws on the reservation (tests/aws/moto_reservations.py says how EC2 decides that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backend.model import Action
from tests.aws.conftest import World
from tests.aws.provision_world import down, ec2, eks, session_for, tagged, up

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
    assert session.stack.layer("aws").topology.gpu_az == ZONE  # type: ignore[attr-defined]
    assert cr["AvailableInstanceCount"] == cr["TotalInstanceCount"] - 2
    group, data = _gpu_launch(session)
    assert group["status"] == "ACTIVE"
    # The nodes fill the reservation (no free slot left): a second plan keeps naming it, changes nothing.
    again = await session.plan()
    assert [(c.address, c.reason) for c in again.changes if c.layer == "aws" and c.action is not Action.NOOP] == []
    return session, group, data


async def _down_gives_back(session: Any, cr: dict[str, Any]) -> None:
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
    assert cr["AvailableInstanceCount"] == cr["TotalInstanceCount"]


async def test_a_targeted_odcr_is_named_by_the_launch_template(world: World, kube_file: Path) -> None:
    cr = world.reserve("us-east-1", ZONE, count=2, match="targeted")
    session, group, data = await _up_in_reservation(world, cr)
    target = data["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target["CapacityReservationId"] == cr["CapacityReservationId"]
    assert group.get("capacityType", "ON_DEMAND") == "ON_DEMAND" and "InstanceMarketOptions" not in data
    await _down_gives_back(session, cr)


async def test_a_capacity_block_takes_a_capacity_block_nodegroup(world: World, kube_file: Path) -> None:
    cr = world.reserve("us-east-1", ZONE, count=2, kind="capacity-block")
    session, group, data = await _up_in_reservation(world, cr)
    assert group["capacityType"] == "CAPACITY_BLOCK"
    assert data["InstanceMarketOptions"]["MarketType"] == "capacity-block"
    target = data["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target["CapacityReservationId"] == cr["CapacityReservationId"]
    await _down_gives_back(session, cr)


async def test_an_open_odcr_is_used_without_naming_it(world: World, kube_file: Path) -> None:
    cr = world.reserve("us-east-1", ZONE, count=2)
    session, group, data = await _up_in_reservation(world, cr)
    assert "CapacityReservationSpecification" not in data
    assert group.get("capacityType", "ON_DEMAND") == "ON_DEMAND"
    await _down_gives_back(session, cr)
