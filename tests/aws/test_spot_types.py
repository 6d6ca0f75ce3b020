"""Issue 41: `--spot-types` widens the Spot pool of the GPU nodegroup with instance types of the same GPUs.

The double's Spot group launches from a type that has Spot capacity in its AZ (tests/aws/moto_provision.py,
after EKS's capacity-optimized Spot groups), so a pool of two finds capacity where one alone had none."""

from __future__ import annotations

from pathlib import Path

import boto3

from backend.resolve import resolve_config
from targets.aws.cloud.catalog import SPOT_QUOTA_G_VT
from targets.aws.cloud.pricing import spot_prices
from targets.aws.config import AwsConfig
from tests.aws.conftest import World
from tests.aws.eks_nodes import NODEGROUP_LABEL
from tests.aws.provision_world import down, eks, session_for, tagged, up
from tests.conftest import run_rtui

GPU, WIDER = "g6.12xlarge", "g6.24xlarge"
NOW = {"us-east-1a": 1.7311, "us-east-1b": 1.2544, "us-east-1c": 1.9802, "us-east-1d": 1.5003}


def _spot_price(world: World, instance_type: str, az: str) -> float | None:
    """The Linux Spot price in effect now, as EC2 answers it (the double's price model)."""
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=world.endpoint)
    return spot_prices(ec2, instance_type).get(az)


def _gpu_az(session: object) -> str:
    return str(session.stack.layer("aws").topology.gpu_az)  # type: ignore[attr-defined]


async def test_a_spot_group_of_two_types_launches_the_one_with_capacity_and_stays_as_planned(
        world: World, kube_file: Path) -> None:
    world.script.spot_prices[("us-east-1", GPU)] = NOW
    planned = session_for(spot=True, gpu_node_count=1, spot_types=WIDER)
    plan = await planned.plan()
    gpu = plan.change("aws.nodegroup.gpu")
    assert gpu is not None and gpu.after is not None and gpu.after["instance_types"] == [GPU, WIDER]
    assert any(n.startswith(f"The Spot GPU nodes may be any of {GPU}, {WIDER}") for n in plan.notes), plan.notes
    # The Spot quota counts the node as the largest of the types (g6.24xlarge: 96 vCPUs, against 48).
    assert gpu.quota == {SPOT_QUOTA_G_VT: {"vcpus": 96.0, "headroom": gpu.quota[SPOT_QUOTA_G_VT]["headroom"]}}
    # Priced at the dearest type's Spot price in the AZ, and named so (the On-Demand beside is the first type's).
    az = _gpu_az(planned)
    dearest = max(float(p) for p in (_spot_price(world, t, az) for t in (GPU, WIDER)) if p is not None)
    assert gpu.cost_note is not None and f"{GPU} or {WIDER} Spot in {az} ${dearest:.4f}/h, the dearest of them" \
        in gpu.cost_note, gpu.cost_note
    world.script.spot_ice_zones[GPU] = {az}  # Spot has no g6.12xlarge there, but has g6.24xlarge

    session = session_for(spot=True, gpu_node_count=1, spot_types=WIDER)
    made = await up(session)
    assert made.ok, made.failures()
    group = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    assert (group["capacityType"], group["instanceTypes"], group["status"]) == ("SPOT", [GPU, WIDER], "ACTIVE")
    assert world.kube is not None
    nodes = [n for n in world.kube.objects("Node")
             if (n["metadata"].get("labels") or {}).get(NODEGROUP_LABEL) == "rtui-ray-gpu"]
    assert [n["metadata"]["labels"]["node.kubernetes.io/instance-type"] for n in nodes] == [WIDER]
    again = await session.plan()
    assert [c.address for c in again.changes if c.layer == "aws" and c.action != "noop"] == []

    # Dropping the extra type makes the group anew: EKS fixes a nodegroup's types when it is made.
    narrower = session_for(spot=True, gpu_node_count=1)
    changed = (await narrower.plan()).change("aws.nodegroup.gpu")
    assert changed is not None and changed.action == "replace" and "instance types" in changed.reason, changed
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


def test_spot_types_need_spot_and_instance_type_names(world: World) -> None:
    without = run_rtui("plan", "--target", "aws", "--region", "us-east-1", "--spot-types", WIDER)
    assert without.returncode == 2 and "--spot-types" in without.stderr and "--spot" in without.stderr, \
        without.stderr
    assert "Traceback" not in without.stderr
    bad = run_rtui("plan", "--target", "aws", "--region", "us-east-1", "--spot", "--spot-types", "g6 24xlarge")
    assert bad.returncode == 2 and "instance types" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_the_gpu_node_type_is_never_listed_twice(world: World) -> None:
    config = AwsConfig.of(resolve_config({"target": "aws", "spot": "true", "spot_types": f"{WIDER},{GPU},{WIDER}"},
                                         environ={}).config)
    assert config.spot_type_list() == [WIDER]


async def test_a_session_reads_the_spot_advisor_once_however_often_it_plans(world: World, kube_file: Path) -> None:
    session = session_for(spot=True)
    for _ in range(2):
        await session.plan()
    reads = [c for c in world.script.calls if c == ("s3", "us-east-1", "GetObject")]
    assert len(reads) == 1
