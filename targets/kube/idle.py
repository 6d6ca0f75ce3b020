"""Idle GPUs on a Kubernetes cluster (issue 26): how many GPU workers and nodes run now, and
whether a node autoscaler is there to remove (and bring back) the nodes the workers leave.

Ray's autoscaler, which KubeRay runs beside the head, removes idle workers; the nodes are the node
autoscaler's (cluster-autoscaler, Karpenter) or the cluster owner's. rtui only looks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backend.errors import RtuiError
from backend.resources import GpuFleet
from targets.kube import manifests, pods
from targets.kube.config import KubeConfig

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

Obj = dict[str, Any]
# The names their upstream charts and manifests give the Deployment (kubernetes/autoscaler
# charts/cluster-autoscaler: "<release>-aws-cluster-autoscaler" and the like; Karpenter's chart:
# "karpenter"), or the app.kubernetes.io/name label they carry.
NODE_AUTOSCALERS = ("cluster-autoscaler", "karpenter")


@dataclass(frozen=True)
class NodeAutoscaler:
    found: str | None  # "cluster-autoscaler (kube-system/cluster-autoscaler)", or None
    looked: bool  # False: the Deployments could not be listed (RBAC), so nothing is known

    def line(self) -> str:
        if self.found:
            return f"node autoscaler found: {self.found}; it removes the GPU nodes idle workers leave"
        if not self.looked:
            return "could not look for a node autoscaler (Deployments not listable): idle GPU nodes may keep billing"
        return ("no node autoscaler found (cluster-autoscaler, Karpenter): idle workers go, "
                "their GPU nodes stay unless the cluster's owner removes them")


def _autoscaler_of(deployment: Obj) -> str | None:
    meta = deployment.get("metadata") or {}
    name = str(meta.get("name") or "")
    label = str((meta.get("labels") or {}).get("app.kubernetes.io/name") or "")
    for kind in NODE_AUTOSCALERS:
        if kind in name or kind in label:
            return f"{kind} ({meta.get('namespace')}/{name})"
    return None


async def find_node_autoscaler(api: KubeApi) -> NodeAutoscaler:
    """Best effort: a Deployment that is cluster-autoscaler or Karpenter, in any namespace. A managed
    one that runs outside the cluster (GKE, EKS Auto Mode) is not seen: the line says "not found"."""
    try:
        deployments = await api.list("apps/v1", "Deployment")
    except RtuiError:
        return NodeAutoscaler(None, looked=False)
    found = next((a for a in map(_autoscaler_of, deployments) if a), None)
    return NodeAutoscaler(found, looked=True)


async def gpu_fleet(api: KubeApi, config: KubeConfig, raycluster: Obj | None) -> GpuFleet:
    workers = await api.list("v1", "Pod", config.namespace,
                             f"ray.io/cluster={config.cluster_name},ray.io/node-type=worker")
    nodes = [n for n in await api.list("v1", "Node") if pods.is_gpu_node(n)]
    spec = (raycluster or {}).get("spec") or {}
    return GpuFleet(workers=sum(pods.pod_running(p) for p in workers), nodes=len(nodes),
                    full=config.gpu_node_count, autoscaling=spec.get("enableInTreeAutoscaling") is True)


def scales_to_zero(raycluster: Obj | None) -> bool:
    """This RayCluster lets its GPU workers all go (KubeRay's autoscaler on, the group's minimum 0)."""
    spec = (raycluster or {}).get("spec") or {}
    groups = [g for g in spec.get("workerGroupSpecs") or [] if g.get("groupName") == manifests.WORKER_GROUP]
    return spec.get("enableInTreeAutoscaling") is True and any(g.get("minReplicas", 0) == 0 for g in groups)
