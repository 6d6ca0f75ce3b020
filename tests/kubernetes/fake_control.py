"""The test as Kubernetes' controllers and kubelets: it reads objects over the emulator and writes status.

It plays KubeRay (a RayCluster gets a head pod, worker pods and a head service), the DaemonSet and
Deployment controllers, the device plugins (GPU nodes advertise ``nvidia.com/gpu`` and
``vpc.amazonaws.com/efa`` once a plugin's DaemonSet is ready), the scheduler (a worker that fits
no node stays Pending with Kubernetes' own FailedScheduling message) and the kubelet (an image is
pulled once per node, then cached; a bad image backs off). Durations are parameters, so a
benchmark can run the seed's timings scaled down.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.kubernetes.conftest import KubeCluster

Obj = dict[str, Any]
GPU, EFA = "nvidia.com/gpu", "vpc.amazonaws.com/efa"


@dataclass
class Timings:
    addon_s: float = 0.0  # a device plugin's DaemonSet or the operator's Deployment becoming ready
    pull_s: float = 0.0  # the Ray image's first pull on a node
    start_s: float = 0.0  # a pod from image-present to Running (and Ready)
    stop_s: float = 0.0  # pods going after their RayCluster is deleted


@dataclass
class FakeControlPlane:
    cluster: KubeCluster
    timings: Timings = field(default_factory=Timings)
    jobs_url: str = ""  # where the head service's dashboard port leads once the head is ready
    bad_images: set[str] = field(default_factory=set)
    # Extended resources that pods the test does not show hold on a node: {node: {resource: count}}.
    held: dict[str, dict[str, int]] = field(default_factory=dict)
    tick_s: float = 0.01
    _first_seen: dict[str, float] = field(default_factory=dict)
    _pulled: dict[tuple[str, str], float] = field(default_factory=dict)  # (node, image) -> when it is cached
    _events: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    errors: list[BaseException] = field(default_factory=list)

    def __enter__(self) -> FakeControlPlane:
        self._thread = threading.Thread(target=self._loop, name="fake-control", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - kept for the test to see; the loop goes on
                # An object rtui deleted between this tick's list and its update: a real controller
                # sees the same 404 and moves on.
                if "not found" not in str(exc):
                    self.errors.append(exc)
            time.sleep(self.tick_s)

    def _age(self, key: str) -> float:
        now = time.monotonic()
        return now - self._first_seen.setdefault(key, now)

    # ---- one pass over the cluster ------------------------------------------------------------------
    def tick(self) -> None:
        nodes = self.cluster.objects("Node")
        for ds in self.cluster.objects("DaemonSet"):
            self._daemonset(ds, nodes)
        for dep in self.cluster.objects("Deployment"):
            meta = dep["metadata"]
            if not (dep.get("status") or {}).get("availableReplicas") and \
                    self._age(f"dep/{meta['namespace']}/{meta['name']}") >= self.timings.addon_s:
                n = dep["spec"].get("replicas", 1)
                self.cluster.set_status("Deployment", meta["name"], meta["namespace"], {
                    "observedGeneration": meta.get("generation", 1), "replicas": n, "readyReplicas": n,
                    "availableReplicas": n, "updatedReplicas": n,
                    "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                                   {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]})
        clusters = self.cluster.objects("RayCluster")
        for rc in clusters:
            self._raycluster(rc, nodes)
        live = {(rc["metadata"]["namespace"], rc["metadata"]["name"]) for rc in clusters}
        for pod in self.cluster.objects("Pod"):
            self._pod(pod, nodes, live)
        self._collect_garbage()

    def _daemonset(self, ds: Obj, nodes: list[Obj]) -> None:
        meta = ds["metadata"]
        image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
        gpu_only = bool(ds["spec"]["template"]["spec"].get("nodeSelector")) or \
            "affinity" in ds["spec"]["template"]["spec"]
        targets = [n for n in nodes if not gpu_only or _is_gpu(n)]
        key = f"ds/{meta['namespace']}/{meta['name']}"
        if "k8s-device-plugin" in image or "efa-k8s-device-plugin" in image:
            ready = self._age(key) >= self.timings.addon_s
            if ready:
                self._advertise(EFA if "efa" in image else GPU, nodes)
        else:  # the image pre-pull: ready where the image is cached
            # Every node pulls at once: a list, not all()'s short circuit, starts each node's clock.
            ready = all([self._cached(n["metadata"]["name"], image) for n in targets])
            self._daemonset_pods(ds, targets, image)
        count = len(targets) if ready else 0
        if (ds.get("status") or {}).get("numberReady") != count or "desiredNumberScheduled" not in (ds.get("status")
                                                                                                    or {}):
            self.cluster.set_status("DaemonSet", meta["name"], meta["namespace"], {
                "desiredNumberScheduled": len(targets), "currentNumberScheduled": len(targets),
                "numberReady": count, "numberAvailable": count, "updatedNumberScheduled": len(targets),
                "observedGeneration": ds["metadata"].get("generation", 1)})

    def _daemonset_pods(self, ds: Obj, targets: list[Obj], image: str) -> None:
        """One pod per node, so a pull that fails shows where Kubernetes shows it: on the pod."""
        meta = ds["metadata"]
        ns, container = meta["namespace"], ds["spec"]["template"]["spec"]["containers"][0]["name"]
        existing = {p["metadata"]["name"]: p for p in self.cluster.objects("Pod", ns)}
        for node in targets:
            name = f"{meta['name']}-{node['metadata']['name']}"
            if name not in existing:
                self.cluster.create({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": ns,
                                 "labels": dict(ds["spec"]["template"].get("metadata", {}).get("labels", {})),
                                 "ownerReferences": [{"kind": "DaemonSet", "name": meta["name"]}]},
                    "spec": {**ds["spec"]["template"]["spec"], "nodeName": node["metadata"]["name"]},
                    "status": {"phase": "Pending"}})
            if image in self.bad_images:
                self._event(ns, name, "Failed", f'Failed to pull image "{image}": not found', "Warning")
                waiting = {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}
                status: Obj = {"phase": "Pending", "containerStatuses": [{
                    "name": container, "image": image, "ready": False, "restartCount": 0,
                    "state": {"waiting": waiting}}]}
            elif self._cached(node["metadata"]["name"], image):
                status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                          "containerStatuses": [{"name": container, "image": image, "ready": True, "restartCount": 0,
                                                 "state": {"running": {"startedAt": "now"}}}]}
            else:
                continue
            if (existing.get(name) or {}).get("status") != status:
                self.cluster.set_status("Pod", name, ns, status)

    def _collect_garbage(self) -> None:
        """Pods of a DaemonSet that is gone go too (the garbage collector's ownerReferences)."""
        live = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in self.cluster.objects("DaemonSet")}
        for pod in self.cluster.objects("Pod"):
            meta = pod["metadata"]
            owners = [o["name"] for o in meta.get("ownerReferences") or [] if o.get("kind") == "DaemonSet"]
            if owners and (meta["namespace"], owners[0]) not in live:
                self.cluster.delete("Pod", meta["name"], meta["namespace"])

    def _advertise(self, resource: str, nodes: list[Obj]) -> None:
        for node in nodes:
            capacity = node["status"].get("capacity", {})
            allocatable = node["status"].get("allocatable", {})
            if resource in capacity and allocatable.get(resource) != capacity[resource]:
                self.cluster.set_status("Node", node["metadata"]["name"], None,
                                        {**node["status"], "allocatable": {**allocatable,
                                                                           resource: capacity[resource]}})

    def _cached(self, node: str, image: str) -> bool:
        if image in self.bad_images:
            return False
        now = time.monotonic()
        ready_at = self._pulled.setdefault((node, image), now + self.timings.pull_s)
        return now >= ready_at

    # ---- KubeRay ------------------------------------------------------------------------------------
    def _raycluster(self, rc: Obj, nodes: list[Obj]) -> None:
        meta, spec = rc["metadata"], rc["spec"]
        ns, name = meta["namespace"], meta["name"]
        existing = {p["metadata"]["name"] for p in self.cluster.objects("Pod", ns)}
        head = spec["headGroupSpec"]["template"]
        self._make_pod(ns, f"{name}-head-0", name, "head", "headgroup", head, existing)
        for group in spec.get("workerGroupSpecs", []):
            for i in range(group.get("replicas", 1)):
                self._make_pod(ns, f"{name}-{group['groupName']}-worker-{i}", name, "worker", group["groupName"],
                               group["template"], existing)
        if self.cluster.get("Service", f"{name}-head-svc", ns) is None:
            self.cluster.create({"apiVersion": "v1", "kind": "Service",
                                 "metadata": {"name": f"{name}-head-svc", "namespace": ns,
                                              "labels": {"ray.io/cluster": name}},
                                 "spec": {"ports": [{"name": "dashboard", "port": 8265}]}})

    def _make_pod(self, ns: str, pod_name: str, cluster: str, node_type: str, group: str, template: Obj,
                  existing: set[str]) -> None:
        if pod_name in existing:
            return
        self.cluster.create({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": ns,
                         "labels": {**template.get("metadata", {}).get("labels", {}), "ray.io/cluster": cluster,
                                    "ray.io/node-type": node_type, "ray.io/group": group},
                         "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "spec": template["spec"], "status": {"phase": "Pending"}})

    # ---- scheduler and kubelet ----------------------------------------------------------------------
    def _pod(self, pod: Obj, nodes: list[Obj], live_clusters: set[tuple[str, str]]) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        ns, name = meta["namespace"], meta["name"]
        cluster = meta.get("labels", {}).get("ray.io/cluster")
        if cluster is None:
            return
        if (ns, cluster) not in live_clusters:
            if self._age(f"gone/{ns}/{name}") >= self.timings.stop_s:
                self.cluster.delete("Pod", name, ns)
            return
        if status.get("phase") == "Running":
            return
        node = pod["spec"].get("nodeName") or self._schedule(pod, nodes)
        if node is None:
            return
        image = pod["spec"]["containers"][0]["image"]
        if image in self.bad_images:
            self._event(ns, name, "Failed", f'Failed to pull image "{image}": not found', "Warning")
            self.cluster.set_status("Pod", name, ns, {"phase": "Pending", "containerStatuses": [{
                "name": pod["spec"]["containers"][0]["name"], "image": image, "ready": False, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff",
                                      "message": f'Back-off pulling image "{image}"'}}}]})
            return
        if not self._cached(node, image):
            self._first_seen.pop(f"start/{ns}/{name}", None)  # the start clock runs from the pull's end
            return
        if self._age(f"start/{ns}/{name}") >= self.timings.start_s:
            self.cluster.set_status("Pod", name, ns, {
                "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": pod["spec"]["containers"][0]["name"], "image": image, "ready": True,
                                       "restartCount": 0, "state": {"running": {"startedAt": "now"}}}]})
            if meta["labels"].get("ray.io/node-type") == "head" and self.jobs_url:
                self.cluster.proxy_to(ns, f"{cluster}-head-svc", "dashboard", self.jobs_url)

    def _schedule(self, pod: Obj, nodes: list[Obj]) -> str | None:
        limits = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
        wants_gpu = int(limits.get(GPU, 0))
        wants_efa = int(limits.get(EFA, 0))
        meta = pod["metadata"]
        fits, short = [], {GPU: 0, EFA: 0}
        for node in nodes:
            if wants_gpu and not _is_gpu(node):
                continue
            if not wants_gpu and _is_gpu(node):
                continue  # the head keeps off GPU nodes (its NotIn affinity)
            allocatable = node["status"].get("allocatable", {})
            held = self.held.get(node["metadata"]["name"], {})
            if int(allocatable.get(GPU, 0)) - held.get(GPU, 0) < wants_gpu:
                short[GPU] += 1
                continue
            if int(allocatable.get(EFA, 0)) - held.get(EFA, 0) < wants_efa:
                short[EFA] += 1
                continue
            used = [p for p in self.cluster.objects("Pod") if p["spec"].get("nodeName") == node["metadata"]["name"]
                    and p["metadata"].get("labels", {}).get("ray.io/node-type") == "worker"]
            if wants_gpu and used:
                short[GPU] += 1
                continue
            fits.append(node["metadata"]["name"])
        if not fits:
            reasons = ", ".join(f"{n} Insufficient {r}" for r, n in short.items() if n)
            message = f"0/{len(nodes)} nodes are available: {reasons or 'no node matches'}. preemption: 0/" \
                      f"{len(nodes)} nodes are available: {len(nodes)} No preemption victims found for incoming pod."
            self._event(meta["namespace"], meta["name"], "FailedScheduling", message, "Warning")
            self.cluster.set_status("Pod", meta["name"], meta["namespace"], {
                "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                    "reason": "Unschedulable", "message": message}]})
            return None
        self.cluster.patch("Pod", meta["name"], meta["namespace"], {"spec": {"nodeName": fits[0]}})
        return fits[0]

    def _event(self, ns: str, pod: str, reason: str, message: str, kind: str) -> None:
        key = f"{ns}/{pod}/{reason}/{message}"
        if key not in self._events:
            self._events.add(key)
            self.cluster.add_event(ns, "Pod", pod, reason, message, type=kind)


def _is_gpu(node: Obj) -> bool:
    return node["metadata"].get("labels", {}).get("nvidia.com/gpu.present") == "true"
