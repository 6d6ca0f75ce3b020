"""What lets cluster-autoscaler take the GPU nodes idle workers leave, and bring them back (issue 26).

Pure data, as the aws layer will apply it:

- The GPU nodegroup's scaling config: ``minSize`` 0 when ``--idle-minutes`` lets the workers go,
  so the Auto Scaling group may shrink to nothing; ``maxSize`` and the starting size are the count.
- The Auto Scaling group's tags. cluster-autoscaler finds the group by its two auto-discovery tags,
  and, to scale a group up from zero, builds a template node from the instance type plus the
  ``k8s.io/cluster-autoscaler/node-template/{label,taint,resources}/…`` tags
  (kubernetes/autoscaler, cluster-autoscaler/cloudprovider/aws/README.md, "Scaling a node group to
  0"). For an EKS managed nodegroup it reads labels and taints from ``eks:DescribeNodegroup`` too,
  but extended resources (``nvidia.com/gpu``, ``vpc.amazonaws.com/efa``) only from ASG tags, and
  EKS does not copy a nodegroup's tags to its ASG: they go on the ASG itself.
- The IAM policy cluster-autoscaler's pod gets through EKS Pod Identity: the read-only calls it
  needs on every group (they take no resource-level permissions), and the two that change a group
  only where the group carries this cluster's discovery tag and this run's tag (the README's
  "recommended" policy, scoped by ``aws:ResourceTag``).
"""

from __future__ import annotations

from typing import Any

from backend.config import RunConfig
from backend.layers.kubernetes.manifests import EFA_RESOURCE, GPU_NODE_LABEL, GPU_RESOURCE

TAG_PREFIX = "k8s.io/cluster-autoscaler"
RUN_TAG = "rtui:run"
# cluster-autoscaler's minor follows the cluster's (its README's version table); pinned by patch.
CLUSTER_AUTOSCALER_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler"
CLUSTER_AUTOSCALER_VERSIONS = {"1.34": "v1.34.5"}
# What bills while the GPU nodes are scaled to zero, as the plan says it.
IDLE_NOTE = "while idle (GPU nodes scaled to zero) the system node, EKS and the NAT keep billing (about $0.35/h)"


def gpu_scaling_config(config: RunConfig) -> dict[str, int]:
    count = config.gpu_node_count
    return {"minSize": 0 if config.idle_timeout_s() else count, "maxSize": count, "desiredSize": count}


def discovery_tags(cluster_name: str) -> dict[str, str]:
    """The two tags ``--node-group-auto-discovery=asg:tag=…`` matches (the chart's autoDiscovery)."""
    return {f"{TAG_PREFIX}/enabled": "true", f"{TAG_PREFIX}/{cluster_name}": "owned"}


def gpu_asg_tags(config: RunConfig, cluster_name: str, run_id: str, efa_interfaces: int = 1) -> dict[str, str]:
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
    """The pinned image for the cluster's minor, or None where none is pinned (the plan says so)."""
    version = CLUSTER_AUTOSCALER_VERSIONS.get(".".join(kubernetes_version.split(".")[:2]))
    return f"{CLUSTER_AUTOSCALER_IMAGE}:{version}" if version else None


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
