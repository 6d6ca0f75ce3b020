"""Issue 34, item 5: no capacity is seen from the Auto Scaling group's activities, not only at CREATE_FAILED.

AWS's order (tests/aws/moto_activities.py cites it): a managed nodegroup's group tries to launch as soon
as EKS makes it, and each try EC2 refuses is a ``Failed`` scaling activity whose status reason says
InsufficientInstanceCapacity (DescribeScalingActivities); EKS keeps the nodegroup CREATING while the group
retries (health issue AsgInstanceLaunchFailures) and turns it CREATE_FAILED only at the end. Here EKS waits
an hour before its verdict: the step must fail from the activity, while the nodegroup is still CREATING,
with the same error the CREATE_FAILED path raises (``--az-failover`` catches it by type)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backend.errors import NoCapacity
from backend.resources import EventKind
from tests.aws.conftest import World
from tests.aws.provision_world import down, eks, gpu_az, session_for, tagged, up

pytestmark = pytest.mark.usefixtures("fast_backoff")


@pytest.mark.slow
async def test_no_capacity_fails_the_gpu_nodes_from_the_groups_activity_while_eks_still_says_creating(
        world: World, kube_file: Path) -> None:
    planned = session_for()
    await planned.plan()
    first = gpu_az(planned)
    world.script.ice_zones["g6.12xlarge"] = {first}
    world.script.timings.capacity_verdict = 3600.0  # EKS's CREATE_FAILED comes an hour after the failed launch

    session = session_for()
    # A bound against a hang only (without the fix the step waits for CREATE_FAILED): no timing is asserted.
    failed = await asyncio.wait_for(up(session), 120)
    assert not failed.ok
    fault = next(e for e in failed.events if e.step == "aws.nodegroup.gpu" and e.kind is EventKind.FAILED)
    assert "InsufficientInstanceCapacity" in fault.message, fault.message
    assert f"sufficient g6.12xlarge capacity in the Availability Zone you requested ({first})" in fault.message
    assert isinstance(fault.error, NoCapacity) and fault.error.az == first
    assert fault.remedy is not None and "--az-failover" in fault.remedy
    # The order of what happened: the step failed before EKS gave its verdict.
    group = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    assert group["status"] == "CREATING"

    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
