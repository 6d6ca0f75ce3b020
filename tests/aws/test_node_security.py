"""Issue 23: the nodes' credentials stay on the node, the cluster's roles are narrow and their trust
conditioned, the API is not open to the world. Through `up` against the AWS double (moto_security)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.aws.conftest import World
from tests.aws.provision_world import REGION, down, eks, iam, session_for, tagged, up

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


@pytest.mark.slow
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


def roles_of(run_id: str) -> dict[str, dict[str, Any]]:
    """Every role of the run: its attached policies and its trust statement(s)."""
    client = iam()
    out = {}
    for role in client.list_roles(PathPrefix="/rtui/")["Roles"]:
        if {"Key": "rtui:run", "Value": run_id} not in client.list_role_tags(RoleName=role["RoleName"])["Tags"]:
            continue
        attached = client.list_attached_role_policies(RoleName=role["RoleName"])["AttachedPolicies"]
        out[role["RoleName"]] = {"policies": sorted(p["PolicyName"] for p in attached),
                                 "trust": role["AssumeRolePolicyDocument"]["Statement"]}
    return out


@pytest.mark.slow
async def test_roles_hold_only_what_each_needs_and_the_cni_gets_its_permissions_by_pod_identity(
        world: World, kube_file: Path) -> None:
    session = session_for()
    plan = await session.plan()
    planned = {c.address for c in plan.changes}
    assert {"aws.iam-role.pod-cni", "aws.pod-identity.cni", "aws.addon.eks-pod-identity-agent"} <= planned
    made = await up(session)
    assert made.ok, made.failures()  # the nodes join: aws-node has the CNI's permissions through pod identity
    roles = roles_of(session.run_id)
    assert {name: r["policies"] for name, r in roles.items()} == {
        f"rtui-{CLUSTER}-cluster": ["AmazonEKSClusterPolicy"],
        f"rtui-{CLUSTER}-nodes": ["AmazonEC2ContainerRegistryPullOnly", "AmazonEKSWorkerNodePolicy"],
        f"rtui-{CLUSTER}-pod-cni": ["AmazonEKS_CNI_Policy"],
        f"rtui-{CLUSTER}-pod-cluster-autoscaler": [],  # its own policy, inline (test_node_autoscaler)
        f"rtui-{CLUSTER}-pod-ray-data": [],  # the run's S3 prefix, inline (test_run_bucket)
        f"rtui-{CLUSTER}-pod-ray-data-workers": []}  # the same, for the workers' own account (issue 33)
    account = boto3.client("sts", region_name=REGION).get_caller_identity()["Account"]
    cluster_arn = eks().describe_cluster(name=CLUSTER)["cluster"]["arn"]
    [pod] = roles[f"rtui-{CLUSTER}-pod-cni"]["trust"]
    assert pod["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(pod["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    assert pod["Condition"]["StringEquals"] == {
        "aws:SourceAccount": account, "aws:RequestTag/eks-cluster-arn": cluster_arn,
        "aws:RequestTag/kubernetes-namespace": "kube-system", "aws:RequestTag/kubernetes-service-account": "aws-node"}
    [node] = roles[f"rtui-{CLUSTER}-nodes"]["trust"]
    assert node["Principal"] == {"Service": "ec2.amazonaws.com"} and "Condition" not in node
    associations = eks().list_pod_identity_associations(clusterName=CLUSTER)["associations"]
    # aws-node's, cluster-autoscaler's (idle GPU nodes go: test_node_autoscaler) and the Ray pods' (the
    # run's S3 data: test_run_bucket).
    assert sorted((a["namespace"], a["serviceAccount"]) for a in associations) == [
        ("kube-system", "aws-node"), ("kube-system", "cluster-autoscaler"), ("rtui", "rtui-ray"),
        ("rtui", "rtui-ray-worker")]
    cni = next(a for a in associations if a["serviceAccount"] == "aws-node")
    association = eks().describe_pod_identity_association(
        clusterName=CLUSTER, associationId=cni["associationId"])["association"]
    assert association["roleArn"] == iam().get_role(RoleName=f"rtui-{CLUSTER}-pod-cni")["Role"]["Arn"]
    assert "eks-pod-identity-agent" in eks().list_addons(clusterName=CLUSTER)["addons"]
    again = await session.plan()
    assert [(c.address, c.reason) for c in again.changes if c.layer == "aws" and c.action.value != "noop"] == []
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
    assert roles_of(session.run_id) == {}


@pytest.mark.slow
async def test_the_cluster_role_is_trusted_for_this_account_and_cluster_only(world: World, kube_file: Path) -> None:
    session = session_for()
    made = await up(session, until="aws.eks-cluster")
    assert made.ok, made.failures()
    account = boto3.client("sts", region_name=REGION).get_caller_identity()["Account"]
    [statement] = roles_of(session.run_id)[f"rtui-{CLUSTER}-cluster"]["trust"]
    assert statement["Principal"] == {"Service": "eks.amazonaws.com"}
    assert statement["Condition"] == {
        "StringEquals": {"aws:SourceAccount": account},
        "ArnLike": {"aws:SourceArn": eks().describe_cluster(name=CLUSTER)["cluster"]["arn"]}}
    assert (await down(session)).ok


@pytest.mark.slow
async def test_the_control_plane_logs_audit_and_authenticator_and_the_plan_prices_them(
        world: World, kube_file: Path) -> None:
    session = session_for()
    plan = await session.plan()
    assert any("CloudWatch" in line for line in plan.usage_costs), plan.usage_costs
    made = await up(session, until="aws.eks-cluster")
    assert made.ok, made.failures()
    logging = eks().describe_cluster(name=CLUSTER)["cluster"]["logging"]["clusterLogging"]
    enabled = {t for group in logging if group["enabled"] for t in group["types"]}
    assert enabled == {"audit", "authenticator"}
    assert (await down(session)).ok


@pytest.mark.slow
async def test_up_and_down_write_a_symlinked_kubeconfig_through_the_link(world: World, kube_file: Path) -> None:
    real = kube_file.parent.parent / "dotfiles" / "kubeconfig"
    kube_file.parent.mkdir(parents=True, exist_ok=True)
    kube_file.symlink_to(real)  # not there yet: the first write makes it, 0600
    session = session_for()
    made = await up(session, until="aws.kubeconfig")
    assert made.ok, made.failures()
    assert kube_file.is_symlink() and real.is_file() and oct(real.stat().st_mode & 0o777) == "0o600"
    arn = eks().describe_cluster(name=CLUSTER)["cluster"]["arn"]
    assert arn in real.read_text()
    assert (await down(session)).ok
    assert kube_file.is_symlink() and arn not in real.read_text()  # the entry went, the link stayed
