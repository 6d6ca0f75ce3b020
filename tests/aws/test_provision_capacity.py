"""Issue 20 item 6: capacity failover when AWS launched some of the GPU nodes before it ran out."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backend.resources import EventKind
from backend.session import cost_meter
from tests.aws.conftest import World
from tests.aws.provision_world import RUN_TAG, down, ec2, eks, gpu_az, session_for, tagged, up

pytestmark = pytest.mark.usefixtures("fast_backoff")


def _asg_instances(nodegroup: str) -> list[str]:
    import boto3

    group = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName=nodegroup)["nodegroup"]
    asg = group["resources"]["autoScalingGroups"][0]["name"]
    found = boto3.client("autoscaling", region_name="us-east-1").describe_auto_scaling_groups(
        AutoScalingGroupNames=[asg])["AutoScalingGroups"]
    return [i["InstanceId"] for g in found for i in g["Instances"]]


@pytest.mark.slow
async def test_partial_capacity_bills_then_fails_over_deleting_the_old_nodes_before_their_placement_group(
        world: World, kube_file: Path) -> None:
    plan_session = session_for()
    await plan_session.plan()
    first = gpu_az(plan_session)
    world.script.ice_zones["g6.12xlarge"] = {first}

    stuck = session_for()
    failed = await up(stuck)
    assert not failed.ok
    fault = next(e for e in failed.events if e.step == "aws.nodegroup.gpu" and e.kind is EventKind.FAILED)
    assert "InsufficientInstanceCapacity" in fault.message
    # AWS launched one of the two nodes before it ran out: it runs, so it bills.
    assert len(_asg_instances("rtui-ray-gpu")) == 1
    meter = cost_meter(stuck.record)
    assert meter is not None and meter.resources["aws.nodegroup.gpu"].per_hour > 4

    # The old placement group holds that instance until its nodegroup is gone: a failover that deletes
    # the group first waits forever (AWS: InvalidPlacementGroup.InUse).
    moved = await asyncio.wait_for(up(stuck, az_failover=True), 120)
    assert moved.ok, moved.failures()
    gpu = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    az = ec2().describe_subnets(SubnetIds=gpu["subnets"])["Subnets"][0]["AvailabilityZone"]
    assert az != first and gpu["status"] == "ACTIVE"
    groups = ec2().describe_placement_groups(
        Filters=[{"Name": f"tag:{RUN_TAG}", "Values": [stuck.run_id]}])["PlacementGroups"]
    assert [g["GroupName"] for g in groups] == [f"rtui-rtui-ray-gpu-{az}"]
    assert (await down(stuck)).ok
    assert tagged(stuck.run_id) == {}


@pytest.mark.slow
async def test_tokens_fit_each_api_for_short_and_long_cluster_names(world: World, kube_file: Path) -> None:
    for name in ("a", "c" * 40):
        session = session_for(cluster_name=name)
        made = await up(session)
        assert made.ok, (name, made.failures())
        assert (await down(session)).ok
        assert tagged(session.run_id) == {}
