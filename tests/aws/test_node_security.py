"""Issue 23: the nodes' credentials stay on the node, the cluster's roles are narrow and their trust
conditioned, the API is not open to the world. Through `up` against the AWS double (moto_security)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.aws.conftest import World
from tests.aws.provision_world import REGION, down, eks, session_for, tagged, up

pytestmark = pytest.mark.usefixtures("fast_backoff")
CLUSTER = "rtui-ray"


def node_metadata() -> dict[str, dict[str, Any]]:
    """Instance ID -> its metadata options, for every node of every nodegroup of the cluster."""
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    ec2 = boto3.client("ec2", region_name=REGION)
    out: dict[str, dict[str, Any]] = {}
    for name in eks().list_nodegroups(clusterName=CLUSTER)["nodegroups"]:
        group = eks().describe_nodegroup(clusterName=CLUSTER, nodegroupName=name)["nodegroup"]
        asgs = [a["name"] for a in group["resources"]["autoScalingGroups"]]
        ids = [i["InstanceId"] for g in autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=asgs)[
            "AutoScalingGroups"] for i in g["Instances"]]
        assert ids, f"nodegroup {name} has no nodes"
        for reservation in ec2.describe_instances(InstanceIds=ids)["Reservations"]:
            for instance in reservation["Instances"]:
                out[f"{name}/{instance['InstanceId']}"] = instance["MetadataOptions"]
    return out


async def test_every_node_requires_imdsv2_with_hop_limit_1(world: World, kube_file: Path) -> None:
    session = session_for()
    made = await up(session)  # up() also checks the Ray job's reachability across the nodes' groups
    assert made.ok, made.failures()
    nodes = node_metadata()
    assert {n.split("/")[0] for n in nodes} == {f"{CLUSTER}-system", f"{CLUSTER}-gpu"}
    loose = {n: (m["HttpTokens"], m["HttpPutResponseHopLimit"]) for n, m in nodes.items()
             if (m["HttpTokens"], m["HttpPutResponseHopLimit"], m["HttpEndpoint"]) != ("required", 1, "enabled")}
    assert loose == {}, f"nodes whose pods can reach the node role's credentials: {loose}"
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
