"""What lets cluster-autoscaler take the GPU nodes idle workers leave, and bring them back (issue 26).

Pure data, as the aws layer will apply it:

- The GPU nodegroup's scaling config: ``minSize`` 0 when ``--idle-minutes`` lets the workers go,
  so the Auto Scaling group may shrink to nothing; ``maxSize`` and the starting size are the count.
- The Auto Scaling group's tags. cluster-autoscaler finds the group by its two auto-discovery tags,
  and, to scale a group up from zero, builds a template node from the instance type plus the
  ``k8s.io/cluster-autoscaler/node-template/{label,taint,resources}/…`` tags
  (kubernetes/autoscaler, cluster-autoscaler/cloudprovider/aws/README.md, "Scaling a node group to
  0"). For an EKS managed nodegroup it reads labels and taints from ``eks:DescribeNodegroup`` too,
  but extended resources (the GPU and EFA device resources) only from ASG tags, and
  EKS does not copy a nodegroup's tags to its ASG: they go on the ASG itself.
- The IAM policy cluster-autoscaler's pod gets through EKS Pod Identity: the read-only calls it
  needs on every group (they take no resource-level permissions), and the two that change a group
  only where the group carries this cluster's discovery tag and this run's tag (the README's
  "recommended" policy, scoped by ``aws:ResourceTag``).
"""

from __future__ import annotations

from typing import Any

from backend.errors import UserError
from targets.aws.config import AwsConfig
from targets.kube.manifests import EFA_RESOURCE, GPU_NODE_LABEL, GPU_RESOURCE

TAG_PREFIX = "k8s.io/cluster-autoscaler"
RUN_TAG = "rtui:run"
# cluster-autoscaler's minor follows the cluster's (its README's version table); pinned by patch, the
# latest of each minor (kubernetes/autoscaler tags cluster-autoscaler-1.32.7 … -1.35.2). These are the
# Kubernetes versions rtui offers on aws: those EKS creates clusters at (EKS User Guide, "Understand
# the Kubernetes version lifecycle on EKS") that have one, since without it idle GPU nodes never leave.
CLUSTER_AUTOSCALER_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler"
CLUSTER_AUTOSCALER_VERSIONS = {"1.32": "v1.32.7", "1.33": "v1.33.6", "1.34": "v1.34.5", "1.35": "v1.35.2"}
OFFERED_KUBERNETES_VERSIONS = tuple(CLUSTER_AUTOSCALER_VERSIONS)
# What bills while the GPU nodes are scaled to zero, as the plan says it.
IDLE_NOTE = "while idle (GPU nodes scaled to zero) the system node, EKS and the NAT keep billing (about $0.35/h)"


def gpu_scaling_config(config: AwsConfig) -> dict[str, int]:
    count = config.gpu_node_count
    return {"minSize": 0 if config.idle_timeout_s() else count, "maxSize": count, "desiredSize": count}


def discovery_tags(cluster_name: str) -> dict[str, str]:
    """The two tags ``--node-group-auto-discovery=asg:tag=…`` matches (the chart's autoDiscovery)."""
    return {f"{TAG_PREFIX}/enabled": "true", f"{TAG_PREFIX}/{cluster_name}": "owned"}


def gpu_asg_tags(config: AwsConfig, cluster_name: str, run_id: str, efa_interfaces: int = 1) -> dict[str, str]:
    """Every tag the GPU nodes' Auto Scaling group needs for cluster-autoscaler to scale it from zero:
    the template node's label, its taint (``value:effect``) and the extended resources a worker asks
    for; and this run's tag, which the policy's scaling statement requires (EKS tags the group with
    the discovery tags itself, but never with the nodegroup's own tags)."""
    template = f"{TAG_PREFIX}/node-template"
    tags = {
        **discovery_tags(cluster_name),
        RUN_TAG: run_id,
        f"{template}/label/{GPU_NODE_LABEL}": "true",
        f"{template}/taint/{GPU_RESOURCE}": "true:NoSchedule",
        f"{template}/resources/{GPU_RESOURCE}": str(config.gpus_per_node),
    }
    if config.wants_efa():
        tags[f"{template}/resources/{EFA_RESOURCE}"] = str(max(1, efa_interfaces))
    return tags


def cluster_autoscaler_image(kubernetes_version: str) -> str | None:
    """The pinned image for the cluster's minor, or None where none is pinned (``offered_version`` refuses it)."""
    version = CLUSTER_AUTOSCALER_VERSIONS.get(".".join(kubernetes_version.split(".")[:2]))
    return f"{CLUSTER_AUTOSCALER_IMAGE}:{version}" if version else None


def check_offered_version(kubernetes_version: str) -> None:
    """Refuses a Kubernetes version rtui pins no cluster-autoscaler for: a cluster at it would plan a GPU
    group that may shrink to zero and an idle price that nothing delivers (nothing takes the nodes)."""
    if cluster_autoscaler_image(kubernetes_version) is None:
        raise UserError(f"Kubernetes {kubernetes_version} is not offered on aws: rtui pins cluster-autoscaler "
                        f"(which takes idle GPU nodes away) for {', '.join(OFFERED_KUBERNETES_VERSIONS)} only",
                        remedy=f"pass --kubernetes-version {OFFERED_KUBERNETES_VERSIONS[-1]} (or another of those)")


def autoscaler_policy(cluster_name: str, run_id: str, *, partition: str = "aws") -> dict[str, Any]:
    """The IAM policy of cluster-autoscaler's role: reads everywhere, changes only this run's groups."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "Discover",
                "Effect": "Allow",
                "Action": ["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
                           "autoscaling:DescribeLaunchConfigurations", "autoscaling:DescribeScalingActivities",
                           "autoscaling:DescribeTags", "ec2:DescribeImages", "ec2:DescribeInstanceTypes",
                           "ec2:DescribeLaunchTemplateVersions", "ec2:GetInstanceTypesFromInstanceRequirements",
                           "eks:DescribeNodegroup"],
                "Resource": "*",
            },
            {
                "Sid": "ScaleThisRunsGroups",
                "Effect": "Allow",
                "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
                "Resource": f"arn:{partition}:autoscaling:*:*:autoScalingGroup:*:autoScalingGroupName/*",
                "Condition": {"StringEquals": {f"aws:ResourceTag/{TAG_PREFIX}/{cluster_name}": "owned",
                                               f"aws:ResourceTag/{RUN_TAG}": run_id}},
            },
        ],
    }


NAMESPACE = "kube-system"
NAME = "cluster-autoscaler"
STATUS_CONFIGMAP = "cluster-autoscaler-status"


def _rules(*rules: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]) -> list[dict[str, Any]]:
    """(apiGroups, resources, verbs, resourceNames) as RBAC rules."""
    out = []
    for groups, resources, verbs, names in rules:
        rule: dict[str, Any] = {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}
        if names:
            rule["resourceNames"] = list(names)
        out.append(rule)
    return out


_READ = ("watch", "list", "get")
# The chart's ClusterRole and Role, rule for rule, as it renders them for ``cloudProvider: aws`` with a
# cluster-scoped RBAC, no PodSecurityPolicy, the priority expander off and leader election on a Lease
# (kubernetes/autoscaler, cluster-autoscaler/charts/cluster-autoscaler/templates/clusterrole.yaml and
# role.yaml, chart 9.59.0): what it reads to simulate scheduling (a node's attached CSI volumes too:
# without volumeattachments CA 1.34 stops adding nodes, kubernetes/autoscaler#8678), what it writes to
# drain a node, and the optional APIs (DRA, ProvisioningRequest, CapacityBuffer) it watches when served.
_CLUSTER_RULES = _rules(
    (("",), ("events", "endpoints"), ("create", "patch"), ()),
    (("",), ("pods/eviction",), ("create",), ()),
    (("",), ("pods/status",), ("update",), ()),
    (("",), ("endpoints",), ("get", "update"), (NAME,)),
    (("",), ("nodes",), ("watch", "list", "get", "update"), ()),
    (("",), ("podtemplates",), ("get", "list", "watch", "create", "update", "patch"), ()),
    (("resource.k8s.io",), ("resourceslices", "deviceclasses", "resourceclaims"), _READ, ()),
    (("",), ("namespaces", "pods", "services", "replicationcontrollers", "persistentvolumeclaims",
             "persistentvolumes"), _READ, ()),
    (("batch",), ("jobs", "cronjobs"), _READ, ()),
    (("batch", "extensions"), ("jobs",), ("get", "list", "patch", "watch"), ()),
    (("extensions",), ("replicasets", "daemonsets"), _READ, ()),
    (("policy",), ("poddisruptionbudgets",), ("watch", "list"), ()),
    (("apps",), ("daemonsets", "deployments", "replicasets", "statefulsets"), _READ, ()),
    (("storage.k8s.io",), ("storageclasses", "csinodes", "csidrivers", "csistoragecapacities",
                           "volumeattachments"), _READ, ()),
    (("",), ("configmaps",), ("list", "watch", "get"), ()),
    (("coordination.k8s.io",), ("leases",), ("create",), ()),
    (("coordination.k8s.io",), ("leases",), ("get", "update"), (NAME,)),
    (("autoscaling.x-k8s.io",), ("provisioningrequests", "provisioningrequests/status"),
     ("get", "list", "watch", "update", "patch"), ()),
    (("autoscaling.x-k8s.io",), ("capacitybuffers", "capacityquotas"), ("get", "list", "watch"), ()),
    (("autoscaling.x-k8s.io",), ("capacityquotas/status", "capacitybuffers/status"), ("update", "patch"), ()),
)
_NAMESPACE_RULES = _rules(
    (("",), ("configmaps",), ("create",), ()),
    (("",), ("configmaps",), ("delete", "get", "update"), (STATUS_CONFIGMAP,)),
)


def cluster_autoscaler_manifests(config: AwsConfig, cluster_name: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """cluster-autoscaler as its chart installs it with ``cloudProvider: aws`` and
    ``autoDiscovery.clusterName``: ServiceAccount (its IAM comes through a Pod Identity association,
    no annotation), ClusterRole/Role and bindings, and a one-replica Deployment on the system node."""
    image = cluster_autoscaler_image(config.kubernetes_version)
    if image is None:
        raise ValueError(f"no cluster-autoscaler pinned for Kubernetes {config.kubernetes_version}")
    meta = {"name": NAME, "labels": dict(labels)}
    ns_meta = {**meta, "namespace": NAMESPACE}
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    selector = {"app.kubernetes.io/name": NAME}
    discovery = ",".join(f"{k}" for k in discovery_tags(cluster_name))
    args = ["./cluster-autoscaler", "--cloud-provider=aws", f"--namespace={NAMESPACE}",
            f"--node-group-auto-discovery=asg:tag={discovery}", "--logtostderr=true",
            "--stderrthreshold=info", "--v=4"]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": ns_meta, "automountServiceAccountToken": True},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta,
         "rules": _CLUSTER_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
         "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": ns_meta,
         "rules": _NAMESPACE_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": ns_meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
         "subjects": subject},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": ns_meta, "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**labels, **selector}},
                "spec": {
                    "serviceAccountName": NAME,
                    "priorityClassName": "system-cluster-critical",
                    # Never on a GPU node: it would keep the node it runs on from being removed.
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": GPU_NODE_LABEL, "operator": "NotIn", "values": ["true"]}]}]}}},
                    "containers": [{
                        "name": NAME, "image": image, "command": args,
                        "env": [{"name": "AWS_REGION", "value": config.region}],
                        "ports": [{"name": "http", "containerPort": 8085}],
                        "livenessProbe": {"httpGet": {"path": "/health-check", "port": 8085}},
                        "resources": {"requests": {"cpu": "100m", "memory": "300Mi"},
                                      "limits": {"memory": "300Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                    }],
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "fsGroup": 65534},
                },
            },
        }},
    ]
