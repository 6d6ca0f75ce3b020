"""Issue 20 items 4 and 5: the AZs of an `aws` run — zone IDs EKS refuses, and a given VPC's subnets."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.model import Action
from tests.aws.conftest import World
from tests.aws.provision_world import down, ec2, eks, session_for, tagged, up

pytestmark = pytest.mark.usefixtures("fast_backoff")


def _zone_ids() -> dict[str, str]:
    return {z["ZoneName"]: z["ZoneId"] for z in ec2().describe_availability_zones()["AvailabilityZones"]}


async def test_a_given_az_eks_refuses_holds_the_gpu_nodes_only(world: World, kube_file: Path) -> None:
    # us-east-1e is zone ID use1-az3 in moto's account: EKS refuses it for control-plane subnets.
    world.offer("us-east-1", "us-east-1e", "g6.12xlarge")
    session = session_for(availability_zone="us-east-1e")
    made = await up(session)
    assert made.ok, made.failures()
    ids = _zone_ids()
    cluster = eks().describe_cluster(name="rtui-ray")["cluster"]
    cluster_azs = {s["AvailabilityZone"] for s in
                   ec2().describe_subnets(SubnetIds=cluster["resourcesVpcConfig"]["subnetIds"])["Subnets"]}
    assert len(cluster_azs) == 2 and "use1-az3" not in {ids[z] for z in cluster_azs}
    gpu = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    assert [s["AvailabilityZone"] for s in ec2().describe_subnets(SubnetIds=gpu["subnets"])["Subnets"]] == [
        "us-east-1e"]
    again = await session.plan()
    assert [c.address for c in again.changes if c.layer == "aws" and c.action is not Action.NOOP] == []
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
