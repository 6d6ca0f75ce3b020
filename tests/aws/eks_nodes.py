"""A managed nodegroup's nodes joining the cluster's Kubernetes API, as EKS's do.

When a nodegroup turns ACTIVE its instances' kubelets register one Node each, labelled and tainted
as the nodegroup says (EKS API reference, CreateNodegroup: ``labels`` "the Kubernetes labels to
apply to the nodes in the node group", ``taints`` "the Kubernetes taints to be applied to the
nodes", effects ``NO_SCHEDULE | NO_EXECUTE | PREFER_NO_SCHEDULE``), plus the labels EKS and the
kubelet add (``eks.amazonaws.com/nodegroup``, ``node.kubernetes.io/instance-type``,
``topology.kubernetes.io/zone``). A GPU node lists ``nvidia.com/gpu`` and
``vpc.amazonaws.com/efa`` in its capacity; they become allocatable once a device plugin runs
(``FakeControlPlane._advertise``). When the nodegroup goes, its nodes go.
"""

from __future__ import annotations

import zlib
from typing import Any

from tests.kube.conftest import KubeCluster

_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
# (vCPUs, memory, GPUs, EFA interfaces) of the instance types the tests use (EC2 instance types page).
_SHAPES = {"m7i.xlarge": ("4", "16Gi", 0, 0), "m7i.2xlarge": ("8", "32Gi", 0, 0), "t3.medium": ("2", "4Gi", 0, 0),
           "g6.12xlarge": ("48", "192Gi", 4, 1), "g6.24xlarge": ("96", "384Gi", 4, 1),
           "g6.48xlarge": ("192", "768Gi", 8, 1),
           "p5.48xlarge": ("192", "2048Gi", 8, 32)}
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"


def register(cluster: KubeCluster, eks_cluster: str, nodegroup: str, info: dict[str, Any]) -> None:
    for i in range(int(info.get("desired_size") or 0)):
        _join(cluster, f"ip-10-0-{zlib.crc32(f'{eks_cluster}/{nodegroup}'.encode()) % 250}-{i}.ec2.internal",
              nodegroup, info)


def replace_node(cluster: KubeCluster, nodegroup: str, info: dict[str, Any], replacement: str) -> tuple[str, str]:
    """One of the group's nodes goes (its instance was interrupted: the kubelet stops, the node object is
    removed as the instance terminates) and the replacement instance's kubelet registers another; the
    names of both."""
    gone = next(n["metadata"]["name"] for n in cluster.objects("Node")
                if (n["metadata"].get("labels") or {}).get(NODEGROUP_LABEL) == nodegroup)
    cluster.delete("Node", gone)
    new = f"ip-10-0-{zlib.crc32(replacement.encode()) % 250}-{replacement[-4:]}.ec2.internal"
    _join(cluster, new, nodegroup, info)
    return gone, new


def _join(cluster: KubeCluster, name: str, nodegroup: str, info: dict[str, Any]) -> None:
    cpu, memory, gpus, efa = _SHAPES.get(info["instance_type"], ("4", "16Gi", 0, 0))
    capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
    extended = {"nvidia.com/gpu": str(gpus), "vpc.amazonaws.com/efa": str(efa)} if gpus else {}
    taints = [{"key": t["key"], "value": t.get("value", ""), "effect": _EFFECTS[t["effect"]]}
              for t in info.get("taints") or []]
    # kubernetes.io/os and /arch: set by every kubelet on its node (x86_64 AMIs here).
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              NODEGROUP_LABEL: nodegroup,
              "node.kubernetes.io/instance-type": info["instance_type"], **dict(info.get("labels") or {})}
    if info.get("zone"):
        labels["topology.kubernetes.io/zone"] = info["zone"]
    if cluster.get("Node", name) is None:
        cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                        "spec": {"taints": taints},
                        "status": {"capacity": {**capacity, **extended}, "allocatable": dict(capacity),
                                   "conditions": [{"type": "Ready", "status": "True"}]}})


def deregister(cluster: KubeCluster, _eks_cluster: str, nodegroup: str, _info: dict[str, Any]) -> None:
    for node in cluster.objects("Node"):
        if (node["metadata"].get("labels") or {}).get(NODEGROUP_LABEL) == nodegroup:
            cluster.delete("Node", node["metadata"]["name"])
