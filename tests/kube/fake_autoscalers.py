"""The test as Ray's autoscaler and as a node autoscaler, each by the rules it documents (issue 26).

``RayAutoscaler`` plays the autoscaler KubeRay runs beside the Ray head when a RayCluster sets
``enableInTreeAutoscaling`` (Ray 2.58, autoscaler v2):

- It scales on logical demand, never on machine load: a job's Ray Train placement group that does
  not fit asks for workers, up to ``maxReplicas`` (docs.ray.io, cluster/kubernetes/user-guides/
  configuring-autoscaling: "adjusts the number of nodes to meet queue demands").
- It removes a worker only once it has been idle, with no task, actor or placement-group bundle
  on it, for ``autoscalerOptions.idleTimeoutSeconds`` ("the number of seconds to wait before
  scaling down a worker pod which is not using Ray resources", KubeRay's ray-cluster.autoscaler.yaml),
  never below ``minReplicas``. A running Ray Train job holds a bundle on every worker, so while a job
  of this head is PENDING or RUNNING no worker is idle.
- It scales down as KubeRay's node provider does: lower ``replicas`` and name the pods in
  ``scaleStrategy.workersToDelete`` in one patch; KubeRay deletes exactly those pods
  (fake_control.FakeControlPlane._worker_group). It clears ``workersToDelete`` once they are gone.

``NodeAutoscaler`` plays cluster-autoscaler on a GPU node group (kubernetes/autoscaler,
cluster-autoscaler/FAQ.md):

- Scale-up: a pod the scheduler marked ``PodScheduled=False, reason Unschedulable`` makes it add
  nodes of the group, as many as those pods need (one GPU worker per node here), up to ``max_nodes``.
  A new node joins without its GPUs: they appear once the device plugin runs on it (fake_control).
- Scale-down: a node of the group that has run no pod other than DaemonSet and mirror pods for
  ``unneeded_s`` (``--scale-down-unneeded-time``, 10 minutes by default) is removed; its DaemonSet
  pods go with it (the pod garbage collector deletes pods bound to a node that is gone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.kube.conftest import KubeCluster

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
BUSY = ("PENDING", "RUNNING")


def _owned_by_daemonset(pod: Obj) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in pod["metadata"].get("ownerReferences") or [])


def _unschedulable(pod: Obj) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or [])


@dataclass
class RayAutoscaler:
    cluster: KubeCluster
    job_states: Callable[[], list[tuple[str, float | None]]]  # (status, end time in s) of the head's jobs
    namespace: str = "rtui"
    name: str = "rtui-ray"
    _running_since: dict[str, float] = field(default_factory=dict)
    removed: list[tuple[float, list[str], bool]] = field(default_factory=list)  # (when, pods, a job was busy)

    def tick(self) -> None:
        rc = self.cluster.get("RayCluster", self.name, self.namespace)
        if rc is None or rc["spec"].get("enableInTreeAutoscaling") is not True:
            return
        idle_s = float((rc["spec"].get("autoscalerOptions") or {}).get("idleTimeoutSeconds", 60))
        groups = [dict(g) for g in rc["spec"]["workerGroupSpecs"]]
        group = groups[0]
        prefix = f"{self.name}-{group['groupName']}-worker-"
        workers = [p for p in self.cluster.objects("Pod", self.namespace) if p["metadata"]["name"].startswith(prefix)]
        now = time.time()
        for pod in workers:
            if (pod.get("status") or {}).get("phase") == "Running":
                self._running_since.setdefault(pod["metadata"]["name"], now)
        jobs = self.job_states()
        busy = any(state in BUSY for state, _ in jobs)
        last_end = max((end for state, end in jobs if end is not None), default=0.0)
        doomed = set((group.get("scaleStrategy") or {}).get("workersToDelete") or [])
        names = {p["metadata"]["name"] for p in workers}
        if doomed and not doomed & names:  # KubeRay deleted them: the list is done with
            group["scaleStrategy"] = {"workersToDelete": []}
            self._patch(groups)
            return
        if busy:
            if group.get("replicas", 0) < group["maxReplicas"]:  # the placement group's demand
                group["replicas"] = group["maxReplicas"]
                self._patch(groups)
            return
        idle = [n for n in sorted(names - doomed)
                if n in self._running_since and now - max(self._running_since[n], last_end) >= idle_s]
        idle = idle[:max(0, len(names - doomed) - group.get("minReplicas", 0))]
        if idle:
            group["replicas"] = max(group.get("minReplicas", 0), group.get("replicas", 0) - len(idle))
            group["scaleStrategy"] = {"workersToDelete": sorted(doomed | set(idle))}
            self.removed.append((now, idle, any(s in BUSY for s, _ in self.job_states())))
            self._patch(groups)

    def _patch(self, groups: list[Obj]) -> None:
        self.cluster.patch("RayCluster", self.name, self.namespace, {"spec": {"workerGroupSpecs": groups}})


@dataclass
class NodeAutoscaler:
    cluster: KubeCluster
    make_node: Callable[[str], None]  # adds a node of the GPU group, by name
    max_nodes: int = 2
    unneeded_s: float = 600.0
    launch_s: float = 0.0  # from the scale-up decision to the node joining (minutes on AWS)
    _empty_since: dict[str, float] = field(default_factory=dict)
    _launching: list[tuple[float, str]] = field(default_factory=list)  # (joins at, name)
    _made: int = 0
    removed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)

    def gpu_nodes(self) -> list[Obj]:
        return [n for n in self.cluster.objects("Node") if GPU in (n["status"].get("capacity") or {})]

    def tick(self) -> None:
        now = time.monotonic()
        for joins_at, name in [entry for entry in self._launching if entry[0] <= now]:
            self._launching.remove((joins_at, name))
            self.make_node(name)
            self.added.append(name)
        nodes = self.gpu_nodes()
        pods = self.cluster.objects("Pod")
        waiting = [p for p in pods if _unschedulable(p) and not p["spec"].get("nodeName")
                   and any(GPU in (c.get("resources") or {}).get("requests", {}) for c in p["spec"]["containers"])]
        coming = len(nodes) + len(self._launching)
        if waiting and coming < self.max_nodes:
            # Nodes already there but still without GPUs (the plugin is starting) count as on their way.
            placed = {p["spec"].get("nodeName") for p in pods if not _owned_by_daemonset(p)}
            free = [n for n in nodes if n["metadata"]["name"] not in placed]
            for _ in range(min(self.max_nodes - coming, max(0, len(waiting) - len(free) - len(self._launching)))):
                self._made += 1
                self._launching.append((now + self.launch_s, f"gpu-auto-{self._made}"))
            return
        if waiting or self._launching:
            return
        for node in nodes:
            name = node["metadata"]["name"]
            used = [p for p in pods if p["spec"].get("nodeName") == name and not _owned_by_daemonset(p)]
            if used:
                self._empty_since.pop(name, None)
                continue
            if now - self._empty_since.setdefault(name, now) >= self.unneeded_s:
                # Noted before the node goes: a test that sees the node gone also sees it noted.
                self.removed.append(name)
                for pod in pods:
                    if pod["spec"].get("nodeName") == name:
                        self.cluster.delete("Pod", pod["metadata"]["name"], pod["metadata"]["namespace"])
                self.cluster.delete("Node", name)
                self._empty_since.pop(name, None)


class Autoscalers:
    """Both players ticking on a thread for the length of a ``with`` block; errors kept for the test."""

    def __init__(self, ray: RayAutoscaler, nodes: NodeAutoscaler, tick_s: float = 0.05) -> None:
        self.ray, self.nodes, self.tick_s = ray, nodes, tick_s
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-autoscalers", daemon=True)

    def __enter__(self) -> Autoscalers:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for player in (self.ray, self.nodes):
                try:
                    player.tick()
                except Exception as exc:  # noqa: BLE001 - kept for the test; a 404 is an object just gone
                    if "not found" not in str(exc):
                        self.errors.append(exc)
            time.sleep(self.tick_s)  # models time: the autoscalers' resync pace
