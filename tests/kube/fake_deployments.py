"""The Deployment controller, as strict as the real one: Available only when its pods run.

Kubernetes' Deployment status (docs: concepts/workloads/controllers/deployment, "Deployment
status"; pkg/controller/deployment/sync.go ``calculateStatus`` and util/deployment_util.go): the
controller makes a ReplicaSet per pod template (its pods carry ``pod-template-hash``) and reports
``Available=True`` (reason ``MinimumReplicasAvailable``, "Deployment has minimum availability.")
only while at least ``replicas - maxUnavailable`` pods are ready (``maxUnavailable`` 25% by
default, rounded down); otherwise ``Available=False``, reason ``MinimumReplicasUnavailable``,
"Deployment does not have minimum availability.".

A pod runs only where the scheduler places it (docs: scheduling-eviction/taint-and-toleration,
assign-pod-node; ``FakeControlPlane._schedule``: nodeSelector and required node affinity,
taints a toleration must allow, room for the requests) and once its image is pulled: an image in
``bad_images``, or one under the registry double's host whose tag that registry does not hold,
backs off (ImagePullBackOff) forever. A pod placed nowhere is ``PodScheduled=False`` with the
scheduler's FailedScheduling message: what ``kubectl describe`` shows a person.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.kube.fake_control import FakeControlPlane

Obj = dict[str, Any]


def template_hash(dep: Obj) -> str:
    """The ReplicaSet's ``pod-template-hash``: a function of the pod template only."""
    text = json.dumps(dep["spec"]["template"], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def min_available(dep: Obj) -> int:
    """``replicas - maxUnavailable``; maxUnavailable a count or a percentage rounded down."""
    replicas = int(dep["spec"].get("replicas", 1))
    strategy = (dep["spec"].get("strategy") or {}).get("rollingUpdate") or {}
    most = strategy.get("maxUnavailable", "25%")
    unavailable = math.floor(replicas * int(most[:-1]) / 100) if isinstance(most, str) else int(most)
    return max(replicas - unavailable, 0)


def reconcile(control: FakeControlPlane, dep: Obj, nodes: list[Obj]) -> None:
    """One pass of the Deployment controller, the scheduler and the kubelets over ``dep``'s pods."""
    meta, spec = dep["metadata"], dep["spec"]
    ns, name = meta["namespace"], meta["name"]
    rs = f"{name}-{template_hash(dep)}"
    replicas = int(spec.get("replicas", 1))
    mine = {p["metadata"]["name"]: p for p in control.cluster.objects("Pod", ns)
            if _owner(p) == rs}
    for i in range(replicas):
        pod_name = f"{rs}-{i}"
        if pod_name not in mine:
            template = spec["template"]
            mine[pod_name] = control.cluster.create({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": ns,
                             "labels": {**(template.get("metadata") or {}).get("labels", {}),
                                        "pod-template-hash": rs.rsplit("-", 1)[1]},
                             "ownerReferences": [{"kind": "ReplicaSet", "name": rs}]},
                "spec": copy.deepcopy(template["spec"]), "status": {"phase": "Pending"}})
    ready = sum(_run(control, pod, nodes) for pod in mine.values())
    _set_status(control, dep, replicas, ready)


def _owner(pod: Obj) -> str | None:
    owners = [o["name"] for o in pod["metadata"].get("ownerReferences") or [] if o.get("kind") == "ReplicaSet"]
    return owners[0] if owners else None


def pullable(control: FakeControlPlane, image: str) -> bool:
    """Whether a kubelet can pull ``image``: not a known-bad one, and, under the registry double's
    host, a tag that registry holds."""
    if image in control.bad_images:
        return False
    registry = control.registry
    if registry is not None and image.startswith(f"{registry.host}/"):
        repo, _, tag = image.removeprefix(f"{registry.host}/").partition("@")[0].rpartition(":")
        return f"{repo}:{tag}" in registry.tags
    return True


def _run(control: FakeControlPlane, pod: Obj, nodes: list[Obj]) -> bool:
    """Schedule, pull and start one pod; whether it is ready."""
    meta, status = pod["metadata"], pod.get("status") or {}
    ns, name = meta["namespace"], meta["name"]
    if status.get("phase") == "Running":
        return True
    node = pod["spec"].get("nodeName") or control._schedule(pod, nodes)
    if node is None:
        return False
    if any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in status.get("conditions") or []):
        # Placed at last (room freed, a node joined): the scheduler's condition says so.
        control.cluster.set_status("Pod", name, ns, {"phase": "Pending",
                                                     "conditions": [{"type": "PodScheduled", "status": "True"}]})
    container = pod["spec"]["containers"][0]
    image = container["image"]
    if not pullable(control, image):
        control._event(ns, name, "Failed", f'Failed to pull image "{image}": not found', "Warning")
        waiting = {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}
        control.cluster.set_status("Pod", name, ns, {
            "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": container["name"], "image": image, "ready": False,
                                   "restartCount": 0, "state": {"waiting": waiting}}]})
        return False
    if not control._cached(node, image) or control._age(f"start/{ns}/{name}") < control.timings.addon_s:
        return False
    control.cluster.set_status("Pod", name, ns, {
        "phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"},
                                           {"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": container["name"], "image": image, "ready": True, "restartCount": 0,
                               "state": {"running": {"startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ")}}}]})
    return True


def _set_status(control: FakeControlPlane, dep: Obj, replicas: int, ready: int) -> None:
    meta = dep["metadata"]
    available = ready >= min_available(dep)
    if available:
        condition = {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                     "message": "Deployment has minimum availability."}
    else:
        condition = {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
                     "message": "Deployment does not have minimum availability."}
    rs = f"{meta['name']}-{template_hash(dep)}"
    progressing = {"type": "Progressing", "status": "True",
                   "reason": "NewReplicaSetAvailable" if ready >= replicas else "ReplicaSetUpdated",
                   "message": f'ReplicaSet "{rs}" has successfully progressed.' if ready >= replicas
                   else f'ReplicaSet "{rs}" is progressing.'}
    status: Obj = {"observedGeneration": meta.get("generation", 1), "replicas": replicas,
                   "updatedReplicas": replicas, "conditions": [condition, progressing]}
    if ready:
        status.update(readyReplicas=ready, availableReplicas=ready)
    if replicas - ready:
        status["unavailableReplicas"] = replicas - ready
    if dep.get("status") != status:
        control.cluster.set_status("Deployment", meta["name"], meta["namespace"], status)


def collect_garbage(control: FakeControlPlane) -> None:
    """Pods of a ReplicaSet no live Deployment has (deleted, or its template changed) go: the
    garbage collector's ownerReferences, the old ReplicaSet scaled to zero by a rollout."""
    current = {f"{d['metadata']['namespace']}/{d['metadata']['name']}-{template_hash(d)}"
               for d in control.cluster.objects("Deployment")}
    for pod in control.cluster.objects("Pod"):
        owner = _owner(pod)
        if owner is not None and f"{pod['metadata']['namespace']}/{owner}" not in current:
            control.cluster.delete("Pod", pod["metadata"]["name"], pod["metadata"]["namespace"])
