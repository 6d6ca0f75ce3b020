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

from backend.resources import Action
from targets.aws.config import AwsConfig
from targets.aws.infra import node_autoscaler as na
from tests.aws.conftest import EksKube, World
from tests.aws.provision_world import REGION, down, eks, iam, session_for, tagged, up

RUN = "r20261204-120000-abcd"


def aws(**fields: object) -> AwsConfig:
    return AwsConfig(target="aws", **fields)


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


@pytest.mark.slow
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
    wanted = na.gpu_asg_tags(AwsConfig.of(session.config), "rtui-ray", session.run_id)
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# --- waiting for it to run (the emulator's Deployment controller: tests/kube/fake_deployments.py) ---

def _failed_step(outcome: Any, address: str) -> str:
    (line,) = [f for f in outcome.failures() if f.startswith(f"{address}:")]
    return str(line)


@pytest.mark.slow
@pytest.mark.usefixtures("fast_backoff")
async def test_up_is_done_only_once_cluster_autoscaler_runs_on_the_system_node(
        world: World, eks_kube: EksKube, kube_file: Path) -> None:
    session = session_for()
    assert (await up(session)).ok
    deployment = eks_kube.cluster.read("Deployment", "cluster-autoscaler", "kube-system")
    conditions = {c["type"]: c["status"] for c in deployment["status"]["conditions"]}
    assert conditions["Available"] == "True"
    (pod,) = [p for p in eks_kube.cluster.objects("Pod", "kube-system")
              if p["metadata"]["labels"].get("app.kubernetes.io/name") == "cluster-autoscaler"]
    node = eks_kube.cluster.read("Node", pod["spec"]["nodeName"])
    assert node["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] == "rtui-ray-system"
    assert (await down(session)).ok


@pytest.mark.slow
@pytest.mark.usefixtures("fast_backoff")
async def test_up_fails_in_one_line_naming_why_cluster_autoscalers_pod_cannot_be_scheduled(
        world: World, eks_kube: EksKube, kube_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from targets.aws.infra import autoscaler

    monkeypatch.setattr(autoscaler, "AVAILABLE_TIMEOUT_S", 1.5, raising=False)
    # The system nodes carry a taint the pod does not tolerate (an account's node policy, say):
    # Kubernetes never places it, and nothing removes idle GPU nodes.
    join = world.script.on_nodegroup_active
    assert join is not None
    taint = {"key": "dedicated", "value": "infra", "effect": "NO_SCHEDULE"}
    world.script.on_nodegroup_active = lambda eks, group, info: join(
        eks, group, {**info, "taints": [*info["taints"], taint]} if group.endswith("-system") else info)
    session = session_for()
    outcome = await up(session)
    assert not outcome.ok
    line = _failed_step(outcome, "aws.cluster-autoscaler")
    assert "\n" not in line
    assert "cluster-autoscaler did not become available" in line
    # The scheduler's own words: the system node's taint, the GPU nodes the pod's affinity keeps it off.
    assert "not scheduled: 0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: infra}, " \
           "2 node(s) didn't match Pod's node affinity/selector" in line, line
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


@pytest.mark.slow
@pytest.mark.usefixtures("fast_backoff")
async def test_up_fails_at_once_when_cluster_autoscalers_image_cannot_be_pulled(
        world: World, eks_kube: EksKube, kube_file: Path) -> None:
    image = na.cluster_autoscaler_image("1.34")
    assert image is not None
    eks_kube.control.bad_images.add(image)
    session = session_for()
    outcome = await up(session)
    assert not outcome.ok
    line = _failed_step(outcome, "aws.cluster-autoscaler")
    assert f"cannot pull image {image}" in line and "not found" in line, line
    assert (await down(session)).ok


# --- RBAC as the upstream chart grants it, and a version for every offered Kubernetes (issue 34, item 3) ---

_R = ("watch", "list", "get")
# The upstream chart's ClusterRole for ``cloudProvider: aws``, ``rbac.clusterScoped: true``, no PSP
# (kubernetes/autoscaler, cluster-autoscaler/charts/cluster-autoscaler/templates/clusterrole.yaml,
# chart 9.59.0 / appVersion 1.35.0, commit 55c37cd5eb55): (apiGroups, resources, verbs, resourceNames).
# Its ``volumeattachments`` row is the one kubernetes/autoscaler#8678 is about: CA 1.34 lists them to
# count a node's attached CSI volumes, and without the grant it stops adding nodes.
CHART_CLUSTER_ROLE: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = [
    (("",), ("events", "endpoints"), ("create", "patch"), ()),
    (("",), ("pods/eviction",), ("create",), ()),
    (("",), ("pods/status",), ("update",), ()),
    (("",), ("endpoints",), ("get", "update"), ("cluster-autoscaler",)),
    (("",), ("nodes",), ("watch", "list", "get", "update"), ()),
    (("",), ("podtemplates",), ("get", "list", "watch", "create", "update", "patch"), ()),
    (("resource.k8s.io",), ("resourceslices", "deviceclasses", "resourceclaims"), _R, ()),
    (("",), ("namespaces", "pods", "services", "replicationcontrollers", "persistentvolumeclaims",
             "persistentvolumes"), _R, ()),
    (("batch",), ("jobs", "cronjobs"), _R, ()),
    (("batch", "extensions"), ("jobs",), ("get", "list", "patch", "watch"), ()),
    (("extensions",), ("replicasets", "daemonsets"), _R, ()),
    (("policy",), ("poddisruptionbudgets",), ("watch", "list"), ()),
    (("apps",), ("daemonsets", "deployments", "replicasets", "statefulsets"), _R, ()),
    (("storage.k8s.io",), ("storageclasses", "csinodes", "csidrivers", "csistoragecapacities",
                           "volumeattachments"), _R, ()),
    (("",), ("configmaps",), ("list", "watch", "get"), ()),
    (("coordination.k8s.io",), ("leases",), ("create",), ()),
    (("coordination.k8s.io",), ("leases",), ("get", "update"), ("cluster-autoscaler",)),
    (("autoscaling.x-k8s.io",), ("provisioningrequests", "provisioningrequests/status"),
     ("get", "list", "watch", "update", "patch"), ()),
    (("autoscaling.x-k8s.io",), ("capacitybuffers", "capacityquotas"), ("get", "list", "watch"), ()),
    (("autoscaling.x-k8s.io",), ("capacityquotas/status", "capacitybuffers/status"), ("update", "patch"), ()),
]
# The chart's Role (templates/role.yaml, same commit), with the priority expander off and leader
# election on a Lease (the defaults): only its own status ConfigMap in its namespace.
CHART_ROLE: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = [
    (("",), ("configmaps",), ("create",), ()),
    (("",), ("configmaps",), ("delete", "get", "update"), ("cluster-autoscaler-status",)),
]
# The Kubernetes versions EKS creates clusters at as of this writing (EKS User Guide, "Understand the
# Kubernetes version lifecycle on EKS": 1.35 released 2026-01-28; 1.31's extended support ends
# 2026-11-26), and the latest cluster-autoscaler patch of each minor (kubernetes/autoscaler tags
# cluster-autoscaler-1.32.7, -1.33.6, -1.34.5, -1.35.2; CA's minor follows Kubernetes').
OFFERED = {"1.32": "v1.32.7", "1.33": "v1.33.6", "1.34": "v1.34.5", "1.35": "v1.35.2"}


def _grants(rules: Any) -> set[tuple[str, str, str, str]]:
    """Each (apiGroup, resource, verb, resourceName or '') a rule list allows: rules compare as what they grant."""
    out = set()
    for rule in rules:
        groups, resources, verbs, names = (rule if isinstance(rule, tuple) else (
            rule["apiGroups"], rule["resources"], rule["verbs"], rule.get("resourceNames") or ()))
        out |= {(g, r, v, n) for g in groups for r in resources for v in verbs for n in (names or ("",))}
    return out


def test_the_cluster_role_and_role_grant_what_the_upstream_chart_grants() -> None:
    objects = {o["kind"]: o for o in na.cluster_autoscaler_manifests(aws(), "rtui-ray", {"rtui.dev/run": RUN})}
    cluster_role, role = _grants(objects["ClusterRole"]["rules"]), _grants(objects["Role"]["rules"])
    assert ("storage.k8s.io", "volumeattachments", "list", "") in cluster_role
    assert cluster_role == _grants(CHART_CLUSTER_ROLE), (cluster_role ^ _grants(CHART_CLUSTER_ROLE))
    assert role == _grants(CHART_ROLE), (role ^ _grants(CHART_ROLE))


def test_every_offered_kubernetes_version_has_its_own_cluster_autoscaler() -> None:
    assert tuple(OFFERED) == na.OFFERED_KUBERNETES_VERSIONS
    for minor, tag in OFFERED.items():
        assert na.cluster_autoscaler_image(minor) == f"registry.k8s.io/autoscaling/cluster-autoscaler:{tag}"
        assert na.cluster_autoscaler_image(f"{minor}.0") == na.cluster_autoscaler_image(minor)


@pytest.mark.slow
async def test_the_plan_of_every_offered_version_installs_cluster_autoscaler_of_its_minor(world: World) -> None:
    for minor in OFFERED:
        plan = await session_for(kubernetes_version=minor).plan()
        step = plan.change("aws.cluster-autoscaler")
        assert step is not None and step.after is not None, minor
        image = str(step.after["image"])
        assert image.rsplit(":", 1)[1].startswith(f"v{minor}."), (minor, image)
        gpu = plan.change("aws.nodegroup.gpu")
        assert gpu is not None and gpu.after is not None and gpu.after["min_size"] == 0, minor
        assert [n for n in plan.notes if n.startswith("idle after")], minor


async def test_a_version_rtui_offers_no_cluster_autoscaler_for_is_refused_in_one_line(world: World) -> None:
    from backend.errors import UserError

    # EKS still creates 1.31 clusters in extended support until 2026-11-26, but without a pinned
    # cluster-autoscaler the GPU nodes would never leave: the plan must not promise the idle price.
    with pytest.raises(UserError) as caught:
        await session_for(kubernetes_version="1.31").plan()
    assert "1.31" in caught.value.message and "\n" not in caught.value.message
    assert caught.value.remedy is not None and "--kubernetes-version 1.35" in caught.value.remedy


# --- its own service account under RBAC: the calls cluster-autoscaler makes, allowed by what rtui applied ---

# Built-in resources kube-apiserver 1.34 serves that the emulator does not list by default (the
# scheduler framework's informers CA starts: kubernetes/autoscaler, cluster-autoscaler/utils/kubernetes/
# listers.go and the vendored scheduler's volume plugins; VolumeAttachment for CSI volume limits).
_SERVED_FOR_CA = {
    ("", "v1", "replicationcontrollers"): ("ReplicationController", True, True),
    ("", "v1", "persistentvolumes"): ("PersistentVolume", False, True),
    ("apps", "v1", "replicasets"): ("ReplicaSet", True, True),
    ("apps", "v1", "statefulsets"): ("StatefulSet", True, True),
    ("batch", "v1", "jobs"): ("Job", True, True),
    ("policy", "v1", "poddisruptionbudgets"): ("PodDisruptionBudget", True, True),
    ("storage.k8s.io", "v1", "csinodes"): ("CSINode", False, False),
    ("storage.k8s.io", "v1", "csidrivers"): ("CSIDriver", False, False),
    ("storage.k8s.io", "v1", "csistoragecapacities"): ("CSIStorageCapacity", True, False),
    ("storage.k8s.io", "v1", "volumeattachments"): ("VolumeAttachment", False, True),
}
# What cluster-autoscaler lists and watches to simulate scheduling on a template node before it adds
# one (its informers), as (group, version, plural).
_CA_READS = [("", "v1", p) for p in ("nodes", "pods", "services", "namespaces", "replicationcontrollers",
                                     "persistentvolumeclaims", "persistentvolumes")] + [
    ("apps", "v1", p) for p in ("daemonsets", "replicasets", "statefulsets")] + [
    ("batch", "v1", "jobs"), ("policy", "v1", "poddisruptionbudgets")] + [
    ("storage.k8s.io", "v1", p) for p in ("storageclasses", "csinodes", "csidrivers", "csistoragecapacities",
                                          "volumeattachments")]


def _path(group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{where}/{plural}" + (f"/{name}" if name else "")


@pytest.mark.slow
@pytest.mark.usefixtures("fast_backoff")
async def test_cluster_autoscaler_scales_from_zero_with_only_the_rights_rtui_gave_its_service_account(
        world: World, eks_kube: EksKube, eks_authz: Any, kube_file: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client.exceptions import ApiException

    from tests.aws.eks_authz import eks_authorizer, service_account_of, service_account_token
    from tests.kube import kmock_ext

    for key, kind in _SERVED_FOR_CA.items():
        monkeypatch.setitem(kmock_ext.KINDS, key, kind)
    # The API server takes EKS tokens and the service account tokens it issued.
    eks_kube.cluster.require_token(lambda t: t.startswith("k8s-aws-v1.") or service_account_of(t) is not None)
    session = session_for()
    assert (await up(session)).ok
    token = service_account_token("kube-system", "cluster-autoscaler")
    api = _kube(world, tmp_path)

    def call(method: str, path: str, body: Any = None) -> int:
        try:
            answer = api.call_api(method, f"{api.configuration.host}{path}", body=body, header_params={
                "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            answer.read()
            return int(answer.status)
        except ApiException as err:
            return int(err.status)

    # The GPU group at zero (cluster-autoscaler took the idle nodes), and a worker pod waits for one.
    autoscaling().set_desired_capacity(AutoScalingGroupName=_gpu_asg(), DesiredCapacity=0)
    reads = [("GET", _path(*key), None) for key in _CA_READS]
    writes = [  # its status ConfigMap, its leader-election Lease, an event on the pod it scales up for
        ("GET", _path("", "v1", "configmaps", "kube-system"), None),
        ("POST", _path("coordination.k8s.io", "v1", "leases", "kube-system"),
         {"metadata": {"name": "cluster-autoscaler"}, "spec": {}}),
        ("POST", _path("", "v1", "configmaps", "kube-system"),
         {"metadata": {"name": "cluster-autoscaler-status"}, "data": {"status": "scaling up"}}),
        ("POST", _path("", "v1", "events", "kube-system"),
         {"metadata": {"name": "ca-scale-up"}, "reason": "TriggeredScaleUp",
          "involvedObject": {"kind": "Pod", "namespace": "rtui", "name": "worker"}}),
    ]
    refused: dict[str, int] = {}
    for method, path, body in [*reads, *writes]:
        status = call(method, path, body)
        if status not in (200, 201):
            refused[f"{method} {path}"] = status
    # Its informers watch what they list (authorized as ``watch``, a stream the test does not open).
    authorize = eks_authorizer(eks_kube.cluster.kube)
    refused.update({f"watch {plural}": 403 for group, _, plural in _CA_READS
                    if authorize(kmock_ext.Access(token, "watch", plural, group, None, None)) is not None})
    assert refused == {}, refused
    # Nothing beyond: it may not read Secrets, nor write the run's RayCluster's pods.
    assert call("GET", _path("", "v1", "secrets", "kube-system")) == 403
    assert call("POST", _path("", "v1", "pods", "kube-system"), {"metadata": {"name": "x"}}) == 403
    # With what it saw it raises the group back (its AWS side: its Pod Identity role, tested above).
    autoscaling().set_desired_capacity(AutoScalingGroupName=_gpu_asg(), DesiredCapacity=2)
    assert eks().describe_nodegroup(**GPU_GROUP)["nodegroup"]["scalingConfig"]["desiredSize"] == 2
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
