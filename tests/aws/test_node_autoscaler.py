"""cluster-autoscaler's side of idle GPUs on aws (issue 26, item 2): the pure parts, checked against what
its AWS cloud provider reads (kubernetes/autoscaler cluster-autoscaler/cloudprovider/aws/README.md)."""

from __future__ import annotations

import json

from kubernetes.client import ApiClient

from backend.config import RunConfig
from backend.layers.aws import node_autoscaler as na

RUN = "r20261204-120000-abcd"


def aws(**fields: object) -> RunConfig:
    return RunConfig(target="aws", **fields)  # type: ignore[arg-type]


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
