"""Room for the GPU workers now: per node, what is allocatable less what the pods already there request.

kube-scheduler's NodeResourcesFit places a pod on a node only when the pod's requests fit in the
node's allocatable minus the requests of every pod already bound there that has not terminated
(pkg/scheduler/framework/plugins/noderesources/fit.go; "Resource Management for Pods and
Containers": "the scheduler ensures that, for each resource type, the sum of the resource requests
of the scheduled containers is less than the capacity of the node"). Allocatable alone says OK on a
busy cluster while the workers would sit Pending.

A pod's request for a resource is the larger of its containers' sum and its largest init
container, plus its overhead ("Init Containers: Resource sharing within containers"; "Pod
Overhead"); a container that gives only a limit is given that limit as its request by the API
server's defaulting, so the limit is read where the request is absent.

Which nodes count as GPU nodes before any device plugin runs: those that advertise ``nvidia.com/gpu``,
those labelled by GPU Feature Discovery, NFD, GKE or EKS as having NVIDIA GPUs, and those of an EC2
instance type of an NVIDIA GPU family (the label every EKS node carries), which rtui's device
plugin serves once it runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from targets.kube import pods
from targets.kube.manifests import GPU_RESOURCE, RUN_LABEL

Obj = Mapping[str, Any]

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# Labels that say a node has NVIDIA GPUs whatever its device plugin: GPU Feature Discovery
# (nvidia.com/gpu.product, .count), NFD's PCI vendor 10de (NVIDIA), GKE's accelerator node pools
# (cloud.google.com/gke-accelerator=nvidia-...), EKS's GPU AMIs and eksctl (k8s.amazonaws.com/accelerator).
GPU_LABELS: tuple[str, ...] = ("nvidia.com/gpu.product", "nvidia.com/gpu.count", "cloud.google.com/gke-accelerator",
                               "k8s.amazonaws.com/accelerator")
NFD_NVIDIA_PCI = "feature.node.kubernetes.io/pci-10de.present"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
# EC2 families with NVIDIA GPUs (g4ad has AMD GPUs, inf/trn are not GPUs): the instance type label.
_NVIDIA_FAMILIES = re.compile(r"^(g4dn|g5|g5g|g6|g6e|g6f|gr6|g7|g7e|p3|p3dn|p4d|p4de|p5|p5e|p5en|p6-[a-z0-9]+|"
                              r"p6e-[a-z0-9]+)\.")
_DONE = ("Succeeded", "Failed")


def has_nvidia_gpus(node: Obj, gpu_node_type: str | None = None) -> bool:
    """A GPU node now (advertising GPUs, or labelled ``nvidia.com/gpu.present``) or one a device plugin will
    serve: its labels or its instance type say it has NVIDIA GPUs."""
    if pods.is_gpu_node(node):
        return True
    labels = (node.get("metadata") or {}).get("labels") or {}
    if labels.get(NFD_NVIDIA_PCI) == "true" or any(labels.get(k) for k in GPU_LABELS):
        return True
    instance = str(labels.get(INSTANCE_TYPE_LABEL) or "")
    return bool(instance) and (instance == gpu_node_type or bool(_NVIDIA_FAMILIES.match(instance)))


def _quantity(value: object) -> Decimal:
    # lazy: kubernetes.utils imports the whole client; only when a node is checked
    from kubernetes.utils.quantity import parse_quantity

    try:
        return Decimal(parse_quantity(value))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, ArithmeticError):
        return Decimal(0)


def _container_requests(container: Obj) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {k: _quantity(v) for k, v in merged.items()}


def pod_requests(pod: Obj) -> dict[str, Decimal]:
    """What the scheduler holds for ``pod`` on its node: max(sum of containers, largest init container)
    plus overhead, per resource."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        for k, v in _container_requests(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in spec.get("initContainers") or []:
        for k, v in _container_requests(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    for k, v in (spec.get("overhead") or {}).items():
        total[k] = total.get(k, Decimal(0)) + _quantity(v)
    return total


@dataclass(frozen=True)
class NodeRoom:
    """How many workers one GPU node can take now, and, when fewer than it could empty, why."""

    node: str
    workers: int
    why: str | None = None  # "nvidia.com/gpu: 4 allocatable, 4 requested by 1 other pod (team-b/train), 0 free"
    gpus_known: bool = True  # False: no plugin yet and no label says how many GPUs


def room(node: Obj, others: Sequence[Obj], worker: Mapping[str, str]) -> NodeRoom:
    """Workers (each asking ``worker``) that fit on ``node`` beside ``others`` (the pods bound to it)."""
    name = pods.node_name(node)
    labels = (node.get("metadata") or {}).get("labels") or {}
    allocatable = {k: _quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
    gpus_known = True
    if allocatable.get(GPU_RESOURCE, Decimal(0)) == 0:
        # No plugin yet: GPU Feature Discovery's count when there is one, else unknown (not the limit).
        count = labels.get(GPU_COUNT_LABEL)
        if count and str(count).isdigit():
            allocatable[GPU_RESOURCE] = Decimal(int(count))
        else:
            gpus_known = False
    live = [p for p in others if ((p.get("status") or {}).get("phase") not in _DONE)]
    used: dict[str, Decimal] = {}
    for p in live:
        for k, v in pod_requests(p).items():
            used[k] = used.get(k, Decimal(0)) + v
    fit: int | None = None
    why = None
    for resource, text in worker.items():
        want = _quantity(text)
        if want <= 0 or (resource == GPU_RESOURCE and not gpus_known):
            continue
        free = allocatable.get(resource, Decimal(0)) - used.get(resource, Decimal(0))
        n = max(0, int(free // want))
        if fit is None or n < fit:
            fit = n
            if used.get(resource) and n == 0:
                holders = [p for p in live if pod_requests(p).get(resource)]
                first = holders[0]["metadata"] if holders else {}
                more = f" (+{len(holders) - 1} more)" if len(holders) > 1 else ""
                why = (f"{resource}: {_show(resource, allocatable.get(resource, Decimal(0)))} allocatable, "
                       f"{_show(resource, used[resource])} requested by pods already there "
                       f"({first.get('namespace')}/{first.get('name')}{more}), a worker needs {text}")
    return NodeRoom(name, fit or 0, why, gpus_known)


def _show(resource: str, value: Decimal) -> str:
    if resource == "memory":
        gib = value / 2**30
        return f"{gib.quantize(Decimal('0.1')).normalize():f}Gi"
    return f"{value.normalize():f}"


def rooms(nodes: Sequence[Obj], all_pods: Sequence[Obj], worker: Mapping[str, str], run_id: str) -> list[NodeRoom]:
    """``room`` of each node, beside the pods bound to it that are not this run's own (its workers of a
    previous apply would take their own place again)."""
    by_node: dict[str, list[Obj]] = {}
    for p in all_pods:
        node = (p.get("spec") or {}).get("nodeName")
        if node and ((p.get("metadata") or {}).get("labels") or {}).get(RUN_LABEL) != run_id:
            by_node.setdefault(str(node), []).append(p)
    return [room(n, by_node.get(pods.node_name(n), []), worker) for n in nodes]

