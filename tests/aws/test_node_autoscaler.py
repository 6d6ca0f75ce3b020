"""cluster-autoscaler's side of idle GPUs on aws (issue 26, item 2): the pure parts, checked against what
its AWS cloud provider reads (kubernetes/autoscaler cluster-autoscaler/cloudprovider/aws/README.md)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from kubernetes.client import ApiClient

from backend.config import RunConfig
from backend.layers.aws import node_autoscaler as na
from backend.model import Action
from tests.aws.conftest import World
from tests.aws.provision_world import REGION, down, eks, iam, session_for, tagged, up

RUN = "r20261204-120000-abcd"


def aws(**fields: object) -> RunConfig:
    return RunConfig(target="aws", **fields)


def test_the_gpu_group_may_shrink_to_zero_only_when_idle_workers_go() -> None:
    assert na.gpu_scaling_config(aws()) == {"minSize": 0, "maxSize": 2, "desiredSize": 2}
    assert na.gpu_scaling_config(aws(idle_minutes=0)) == {"minSize": 2, "maxSize": 2, "desiredSize": 2}


def test_the_asg_tags_describe_the_seed_worker_node_for_a_scale_up_from_zero() -> None:
    tags = na.gpu_asg_tags(aws(), "rtui-ray", RUN)
    assert tags == {
        "k8s.io/cluster-autoscaler/enabled": "true",
        "k8s.io/cluster-autoscaler/rtui-ray": "owned",
        "rtui:run": RUN,
        "k8s.io/cluster-autoscaler/node-template/label/nvidia.com/gpu.present": "true",
        "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu": "true:NoSchedule",
        "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu": "4",
        "k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa": "1",
    }
    # Without EFA the pods ask for none, and the template offers none.
    assert not any("efa" in k for k in na.gpu_asg_tags(aws(require_transport="any"), "rtui-ray", RUN))
    # ASG tag values are at most 256 characters, keys 128 (the AutoScaling API's limits).
    assert all(len(k) <= 128 and len(v) <= 256 for k, v in tags.items())


def test_the_policy_reads_everywhere_and_scales_only_this_runs_groups() -> None:
    policy = na.autoscaler_policy("rtui-ray", RUN, partition="aws-cn")
    read, scale = policy["Statement"]
    assert read["Resource"] == "*" and all(":Describe" in a or ":Get" in a for a in read["Action"])
    assert set(scale["Action"]) == {"autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"}
    assert scale["Resource"].startswith("arn:aws-cn:autoscaling:")
    assert scale["Condition"] == {"StringEquals": {"aws:ResourceTag/k8s.io/cluster-autoscaler/rtui-ray": "owned",
                                                   "aws:ResourceTag/rtui:run": RUN}}
    # The tags the condition asks for are the ones the group gets.
    tags = na.gpu_asg_tags(aws(), "rtui-ray", RUN)
    for key, value in scale["Condition"]["StringEquals"].items():
        assert tags[key.removeprefix("aws:ResourceTag/")] == value
    assert len(json.dumps(policy)) < 6144  # an inline policy's size limit


def test_the_image_is_pinned_to_the_clusters_minor() -> None:
    assert na.cluster_autoscaler_image("1.34") == "registry.k8s.io/autoscaling/cluster-autoscaler:v1.34.5"
    assert na.cluster_autoscaler_image("1.29") is None


def test_the_manifests_discover_this_clusters_groups_and_stay_off_the_gpu_nodes() -> None:
    labels = {"app.kubernetes.io/managed-by": "rtui", "rtui.dev/run": RUN}
    objects = na.cluster_autoscaler_manifests(aws(), "rtui-ray", labels)
    kinds = [o["kind"] for o in objects]
    assert kinds == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment"]
    assert all(o["metadata"]["labels"] == labels for o in objects)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.k8s.io/autoscaling/cluster-autoscaler:v1.34.5"
    assert "--node-group-auto-discovery=asg:tag=k8s.io/cluster-autoscaler/enabled,k8s.io/cluster-autoscaler/rtui-ray" \
        in container["command"]
    assert "--cloud-provider=aws" in container["command"]
    # The selector picks the template's pods; the pod keeps off GPU nodes (it would pin one).
    assert deployment["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"][
        "labels"].items()
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}]
    # It may evict pods and update nodes cluster-wide, and write only its own status ConfigMap in kube-system.
    role = next(o for o in objects if o["kind"] == "ClusterRole")
    assert {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]} in role["rules"]
    ns_role = next(o for o in objects if o["kind"] == "Role")
    assert {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["delete", "get", "update"],
            "resourceNames": ["cluster-autoscaler-status"]} in ns_role["rules"]


def test_the_manifests_hold_only_fields_kubernetes_knows() -> None:
    """Each object through the official client's model (the Kubernetes API's schema): a misspelt or
    unknown field would be dropped, so the round trip would differ."""
    client = ApiClient()
    for obj in na.cluster_autoscaler_manifests(aws(), "rtui-ray", {"rtui.dev/run": RUN}):
        model = client.deserialize(json.dumps(obj), f"V1{obj['kind']}", "application/json")
        assert client.sanitize_for_serialization(model) == obj, obj["kind"]


# --- through `plan`/`up`/`down` on the aws double ---------------------------------------------------

GPU_GROUP = {"clusterName": "rtui-ray", "nodegroupName": "rtui-ray-gpu"}


def _gpu_asg() -> str:
    group = eks().describe_nodegroup(**GPU_GROUP)["nodegroup"]
    return str(group["resources"]["autoScalingGroups"][0]["name"])


def _asg_tags(name: str) -> dict[str, str]:
    listed = autoscaling().describe_tags(Filters=[{"Name": "auto-scaling-group", "Values": [name]}])["Tags"]
    return {t["Key"]: t["Value"] for t in listed}


def autoscaling() -> Any:
    return boto3.client("autoscaling", region_name=REGION)


@pytest.mark.usefixtures("fast_backoff")
async def test_up_lets_the_gpu_group_shrink_to_zero_and_tags_its_asg_for_a_scale_up(world: World,
                                                                                  kube_file: Path) -> None:
    session = session_for()
    done = await up(session)
    assert done.ok, done.failures()
    gpu = eks().describe_nodegroup(**GPU_GROUP)["nodegroup"]
    assert gpu["scalingConfig"] == {"minSize": 0, "maxSize": 2, "desiredSize": 2}
    system = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-system")["nodegroup"]
    assert system["scalingConfig"]["minSize"] == system["scalingConfig"]["maxSize"]
    tags = _asg_tags(_gpu_asg())
    wanted = na.gpu_asg_tags(session.config, "rtui-ray", session.run_id)
    assert {k: tags.get(k) for k in wanted} == wanted
    # DescribeAutoScalingGroups shows the same tags (what cluster-autoscaler's discovery reads).
    (group,) = autoscaling().describe_auto_scaling_groups(AutoScalingGroupNames=[_gpu_asg()])["AutoScalingGroups"]
    assert {t["Key"]: t["Value"] for t in group["Tags"]}.items() >= wanted.items()
    # cluster-autoscaler's service account has its own role, with the policy scoped to this run's groups.
    associations = eks().list_pod_identity_associations(clusterName="rtui-ray", namespace="kube-system",
                                                        serviceAccount="cluster-autoscaler")["associations"]
    assert len(associations) == 1
    role = eks().describe_pod_identity_association(clusterName="rtui-ray", associationId=associations[0][
        "associationId"])["association"]["roleArn"].rsplit("/", 1)[1]
    assert iam().list_attached_role_policies(RoleName=role)["AttachedPolicies"] == []
    (name,) = iam().list_role_policies(RoleName=role)["PolicyNames"]
    document = iam().get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
    assert document == na.autoscaler_policy("rtui-ray", session.run_id)
    trust = iam().get_role(RoleName=role)["Role"]["AssumeRolePolicyDocument"]["Statement"][0]["Condition"]
    assert trust["StringEquals"]["aws:RequestTag/kubernetes-service-account"] == "cluster-autoscaler"
    # A second plan finds nothing to do.
    again = await session_for().plan()
    assert [c.address for c in again.changes if c.layer == "aws" and c.action is not Action.NOOP] == []
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


@pytest.mark.usefixtures("fast_backoff")
async def test_idle_minutes_0_keeps_the_fixed_size_and_no_template_tags(world: World, kube_file: Path) -> None:
    session = session_for(idle_minutes="0")
    assert (await up(session)).ok
    gpu = eks().describe_nodegroup(**GPU_GROUP)["nodegroup"]
    assert gpu["scalingConfig"] == {"minSize": 2, "maxSize": 2, "desiredSize": 2}
    assert not any("node-template" in k for k in _asg_tags(_gpu_asg()))
    assert eks().list_pod_identity_associations(clusterName="rtui-ray", serviceAccount="cluster-autoscaler",
                                                namespace="kube-system")["associations"] == []
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


@pytest.mark.usefixtures("fast_backoff")
async def test_a_size_cluster_autoscaler_chose_is_not_drift(world: World, kube_file: Path) -> None:
    session = session_for()
    assert (await up(session)).ok
    # cluster-autoscaler takes the idle nodes away: it sets the group's desired capacity, as its
    # AWS cloud provider does, and EKS reports the new size as the nodegroup's.
    autoscaling().set_desired_capacity(AutoScalingGroupName=_gpu_asg(), DesiredCapacity=0)
    assert eks().describe_nodegroup(**GPU_GROUP)["nodegroup"]["scalingConfig"]["desiredSize"] == 0
    plan = await session_for().plan()
    change = plan.change("aws.nodegroup.gpu")
    assert change is not None and change.action is Action.NOOP, (change.action, change.reason) if change else None
    assert (await up(session_for())).ok
    assert eks().describe_nodegroup(**GPU_GROUP)["nodegroup"]["scalingConfig"]["desiredSize"] == 0
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


def _kube(world: World, tmp_path: Path) -> Any:
    """The official Kubernetes client on the cluster's API (the emulator EKS's endpoint names)."""
    from kubernetes import client as k8s

    ca = tmp_path / "ca.pem"
    assert world.script.cluster_ca is not None
    ca.write_bytes(base64.b64decode(world.script.cluster_ca))
    config = k8s.Configuration(host=eks().describe_cluster(name="rtui-ray")["cluster"]["endpoint"])
    config.ssl_ca_cert = str(ca)
    config.api_key = {"authorization": "Bearer k8s-aws-v1.test"}
    return k8s.ApiClient(config)


@pytest.mark.usefixtures("fast_backoff")
async def test_up_installs_cluster_autoscaler_for_this_clusters_groups_and_down_removes_it(
        world: World, kube_file: Path, tmp_path: Path) -> None:
    from kubernetes import client as k8s

    session = session_for()
    plan = await session.plan()
    step = plan.change("aws.cluster-autoscaler")
    assert step is not None and step.action is Action.CREATE
    assert set(step.depends_on) >= {"aws.pod-identity.cluster-autoscaler", "aws.nodegroup.system"}
    assert (await up(session)).ok
    api = _kube(world, tmp_path)
    deployment = k8s.AppsV1Api(api).read_namespaced_deployment("cluster-autoscaler", "kube-system")
    pod = deployment.spec.template.spec
    assert pod is not None
    (container,) = pod.containers
    assert container.image == "registry.k8s.io/autoscaling/cluster-autoscaler:v1.34.5"
    assert "--node-group-auto-discovery=asg:tag=k8s.io/cluster-autoscaler/enabled,k8s.io/cluster-autoscaler/rtui-ray" \
        in (container.command or [])
    assert pod.service_account_name == "cluster-autoscaler"
    k8s.CoreV1Api(api).read_namespaced_service_account("cluster-autoscaler", "kube-system")
    k8s.RbacAuthorizationV1Api(api).read_cluster_role("cluster-autoscaler")
    again = await session_for().plan()
    assert [c.address for c in again.changes if c.layer == "aws" and c.action is not Action.NOOP] == []
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
    # With --idle-minutes 0 nothing of it is planned.
    fixed = await session_for(idle_minutes="0").plan()
    assert {c.address for c in fixed.changes} & {"aws.cluster-autoscaler", "aws.asg-tags.gpu",
                                                 "aws.pod-identity.cluster-autoscaler"} == set()
