"""Issue 20 items 4 and 5: the AZs of an `aws` run — zone IDs EKS refuses, and a given VPC's subnets."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.resources import Action
from tests.aws.conftest import World
from tests.aws.provision_world import down, ec2, eks, given_vpc, session_for, tagged, up

pytestmark = pytest.mark.usefixtures("fast_backoff")


def _zone_ids() -> dict[str, str]:
    return {z["ZoneName"]: z["ZoneId"] for z in ec2().describe_availability_zones()["AvailabilityZones"]}


@pytest.mark.slow
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


@pytest.mark.slow
async def test_a_given_vpc_takes_its_azs_from_its_subnets_and_a_second_up_changes_nothing(
        world: World, kube_file: Path) -> None:
    vpc, private = given_vpc(("us-east-1a", "us-east-1c"))
    session = session_for(vpc_id=vpc, private_subnet_ids=",".join(private))
    plan = await session.plan()
    made_here = [c.address for c in plan.changes if c.action is Action.CREATE and c.address.startswith("aws.subnet")]
    assert made_here == []  # nothing is planned inside a VPC rtui did not create
    planned = plan.change("aws.eks-cluster")
    assert planned is not None and planned.after is not None
    assert sorted(planned.after["azs"]) == ["us-east-1a", "us-east-1c"]
    made = await up(session)
    assert made.ok, made.failures()
    cluster = eks().describe_cluster(name="rtui-ray")["cluster"]
    assert sorted(cluster["resourcesVpcConfig"]["subnetIds"]) == sorted(private)
    again = await session.plan()
    assert [(c.address, c.reason) for c in again.changes
            if c.layer == "aws" and c.action is not Action.NOOP] == []
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
    assert len(ec2().describe_subnets(SubnetIds=private)["Subnets"]) == 2


@pytest.mark.slow
async def test_a_given_vpc_with_subnets_in_one_az_is_refused_in_one_line(world: World, kube_file: Path) -> None:
    from backend.errors import UserError

    vpc, private = given_vpc(("us-east-1a",))
    with pytest.raises(UserError) as refused:
        await session_for(vpc_id=vpc, private_subnet_ids=",".join(private)).plan()
    assert "two AZs" in refused.value.message and "\n" not in refused.value.message
    assert "--private-subnet-ids" in (refused.value.remedy or "")
    vpc2, private2 = given_vpc(("us-east-1a", "us-east-1b"))
    with pytest.raises(UserError) as outside:
        await session_for(vpc_id=vpc2, private_subnet_ids=",".join(private2), availability_zone="us-east-1c").plan()
    assert "us-east-1c" in outside.value.message and "no private subnet" in outside.value.message
