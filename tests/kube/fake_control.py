"""The test as Kubernetes' controllers and kubelets: it reads objects over the emulator and writes status.

It plays KubeRay (a RayCluster gets a head pod, worker pods and a head service), the DaemonSet and
Deployment controllers (``fake_deployments``: Available only once its pods are scheduled and
pulled), the device plugins (GPU nodes advertise ``nvidia.com/gpu`` and
``vpc.amazonaws.com/efa`` once a plugin's DaemonSet is ready), the scheduler (a worker that fits
no node stays Pending with Kubernetes' own FailedScheduling message) and the kubelet (an image is
pulled once per node, then cached; a bad image backs off; an image with no manifest for the node's
architecture fails as containerd fails it). A pod that admission refuses is reported as its controller
reports it: KubeRay's FailedToCreateHeadPod/FailedToCreateWorkerPod events and ReplicaFailure condition
on the RayCluster, the DaemonSet controller's FailedCreate event. Durations are parameters, so a
benchmark can run the seed's timings scaled down.
"""

from __future__ import annotations

import base64
import copy
import itertools
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from kubernetes.utils.quantity import parse_quantity as _parse_quantity

from tests.eventually import eventually
from tests.kube import fake_deployments
from tests.kube.conftest import KubeCluster
from tests.kube.fake_ray import FakeRayHead
from tests.kube.fake_registry import FakeRegistry
from tests.kube.kmock_ext import ApiError, now_rfc3339
from tests.kube.kuberay_double import operator_env, operator_secret
from tests.kube.pod_network import Source, admitted

Obj = dict[str, Any]
GPU, EFA = "nvidia.com/gpu", "vpc.amazonaws.com/efa"


def parse_quantity(value: str | int | float) -> Decimal:
    """A Kubernetes quantity ("500m", "160Gi") as the official client parses it."""
    return Decimal(_parse_quantity(value))  # type: ignore[no-untyped-call]  # kubernetes.utils is untyped


@dataclass
class Timings:
    addon_s: float = 0.0  # a device plugin's DaemonSet or a Deployment's pulled pod becoming ready
    pull_s: float = 0.0  # the Ray image's first pull on a node
    start_s: float = 0.0  # a pod from image-present to Running (and Ready)
    stop_s: float = 0.0  # pods going after their RayCluster is deleted


@dataclass
class FakeControlPlane:
    cluster: KubeCluster
    timings: Timings = field(default_factory=Timings)
    jobs_url: str = ""  # where the head service's dashboard port leads once the head is ready
    bad_images: set[str] = field(default_factory=set)
    registry: FakeRegistry | None = None  # set: an image under its host pulls only if it holds the tag
    # The KubeRay release it plays: the auth env and Secret as that release makes them (kuberay_double).
    kuberay_version: str = "1.7.0"
    # The architectures an image's index lists, by the image as pods name it or a part of its name (a
    # repository such as "kuberay/operator"); one not listed: amd64 only (the default image, an AWS DLC,
    # is built for x86_64 alone).
    platforms: dict[str, frozenset[str]] = field(default_factory=dict)
    # Extended resources that pods the test does not show hold on a node: {node: {resource: count}}.
    held: dict[str, dict[str, int]] = field(default_factory=dict)
    # How often the controllers look for a change to the store: a pass over every object runs only
    # when the store published one (as an informer's watch wakes a real controller), when a test
    # asks (``settled``), or every ``resync_s`` (a real controller's resync): what a test changes
    # outside the store (``bad_images``, ``volumes``…) and the durations above are seen then.
    tick_s: float = 0.01
    resync_s: float = 0.25
    # The directory standing for each claim's volume: {(namespace, claim): dir}; a reader pod's command runs there.
    volumes: dict[tuple[str, str], Path] = field(default_factory=dict)
    # Where a claim's directory is made when the test named none: the working directory, which is the
    # test's tmp_path (tests/conftest.py's isolated_env), so no volume outlives its test in /tmp.
    volume_root: Path = field(default_factory=Path.cwd)
    _first_seen: dict[str, float] = field(default_factory=dict)
    _pulled: dict[tuple[str, str], float] = field(default_factory=dict)  # (node, image) -> when it is cached
    _events: set[str] = field(default_factory=set)
    _pod_ips: dict[tuple[str, str], str] = field(default_factory=dict)  # the kubelet's podIP, one per pod
    _advertised: set[tuple[str, str]] = field(default_factory=set)  # (node, resource) a plugin DS of the test's made
    _node_arch: dict[str, str] = field(default_factory=dict)  # node -> its kubernetes.io/arch, each tick
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    errors: list[BaseException] = field(default_factory=list)
    # Passes over the cluster finished so far (``settled``): how a test knows the controllers have
    # looked at what it just made, before it checks that they did nothing with it.
    passes: int = 0
    _pass_wanted: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> FakeControlPlane:
        self._thread = threading.Thread(target=self._loop, name="fake-control", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        seen, last = -1, 0.0
        while not self._stop.is_set():
            changes = self.cluster.kube.changes
            timed = any(vars(self.timings).values())
            resync = min(self.resync_s, 0.05) if timed else self.resync_s
            if changes != seen or self._pass_wanted.is_set() or time.monotonic() - last >= resync:
                self._pass_wanted.clear()
                seen, last = changes, time.monotonic()  # a write during the pass makes another
                try:
                    self.tick()
                except Exception as exc:  # noqa: BLE001 - kept for the test to see; the loop goes on
                    # An object rtui deleted between this tick's list and its update: a real controller
                    # sees the same 404 and moves on.
                    if "not found" not in str(exc):
                        self.errors.append(exc)
                self.passes += 1
            self._stop.wait(self.tick_s)  # models time: how soon the controllers see a change

    def settled(self, timeout: float = 10.0) -> None:
        """Return once a whole pass began and ended after this call: every object made before it has
        been seen by the controllers, so "they did nothing with it" can be checked (a positive signal that
        the moment passed, not a guess of how long a pass takes)."""
        start = self.passes

        def passed() -> bool:
            self._pass_wanted.set()  # a pass now, not at the next resync
            return self.passes >= start + 2

        eventually("the fake control plane to finish a whole pass", passed, timeout)

    def _age(self, key: str) -> float:
        now = time.monotonic()
        return now - self._first_seen.setdefault(key, now)

    # ---- one pass over the cluster ------------------------------------------------------------------
    def tick(self) -> None:
        nodes = self.cluster.objects("Node")
        self._node_arch = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get("kubernetes.io/arch", "")
                           for n in nodes}
        daemonsets = self.cluster.objects("DaemonSet")
        for ds in daemonsets:
            self._daemonset(ds, nodes)
        self._withdraw(daemonsets, nodes)
        for dep in self.cluster.objects("Deployment"):
            fake_deployments.reconcile(self, dep, nodes)
        clusters = self.cluster.objects("RayCluster")
        for rc in clusters:
            self._raycluster(rc, nodes)
        live = {(rc["metadata"]["namespace"], rc["metadata"]["name"]) for rc in clusters}
        for claim in self.cluster.objects("PersistentVolumeClaim"):
            self._claim(claim)
        for pod in self.cluster.objects("Pod"):
            self._pod(pod, nodes, live)
        self._collect_garbage()
        fake_deployments.collect_garbage(self)

    def _daemonset(self, ds: Obj, nodes: list[Obj]) -> None:
        meta = ds["metadata"]
        image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
        # The DaemonSet controller places a pod where the template's selector, affinity and
        # tolerations (plus the ones it adds itself) allow: pkg/controller/daemon (nodeShouldRunDaemonPod).
        template = {**ds["spec"]["template"]["spec"], "tolerations": [
            *(ds["spec"]["template"]["spec"].get("tolerations") or []), *DAEMONSET_TOLERATIONS]}
        targets = [n for n in nodes if placement_misfit(template, n) is None]
        key = f"ds/{meta['namespace']}/{meta['name']}"
        scheduled = len(targets)
        if "k8s-device-plugin" in image or "efa-k8s-device-plugin" in image:
            ready = self._age(key) >= self.timings.addon_s
            if ready:
                self._advertise(EFA if "efa" in image else GPU, targets)
        else:  # the image pre-pull: ready where the image is cached
            # Every node pulls at once: a list, not all()'s short circuit, starts each node's clock.
            ready = all([self._cached(n["metadata"]["name"], image) for n in targets])
            # A pod admission refused is not there: its node counts as desired, never as scheduled.
            scheduled = self._daemonset_pods(ds, targets, image)
            ready = ready and scheduled == len(targets)
        count = len(targets) if ready else 0
        status = ds.get("status") or {}
        if status.get("numberReady") != count or status.get("desiredNumberScheduled") != len(targets) \
                or status.get("currentNumberScheduled") != scheduled:
            self.cluster.set_status("DaemonSet", meta["name"], meta["namespace"], {
                "desiredNumberScheduled": len(targets), "currentNumberScheduled": scheduled,
                "numberReady": count, "numberAvailable": count, "updatedNumberScheduled": len(targets),
                "observedGeneration": ds["metadata"].get("generation", 1)})

    def _daemonset_pods(self, ds: Obj, targets: list[Obj], image: str) -> int:
        """One pod per node, so a pull that fails shows where Kubernetes shows it: on the pod. Returns how
        many of the pods exist (admission may refuse them)."""
        meta = ds["metadata"]
        ns, container = meta["namespace"], ds["spec"]["template"]["spec"]["containers"][0]["name"]
        existing = {p["metadata"]["name"]: p for p in self.cluster.objects("Pod", ns)}
        made = 0
        for node in targets:
            name = f"{meta['name']}-{node['metadata']['name']}"
            if name not in existing:
                try:
                    self.cluster.create({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name, "namespace": ns,
                                     "labels": dict(ds["spec"]["template"].get("metadata", {}).get("labels", {})),
                                     "ownerReferences": [{"kind": "DaemonSet", "name": meta["name"]}]},
                        "spec": {**ds["spec"]["template"]["spec"], "nodeName": node["metadata"]["name"]},
                        "status": {"phase": "Pending"}})
                except ApiError as refused:
                    # The DaemonSet controller's record of a refused create (pkg/controller/controller_utils.go,
                    # FailedCreatePodReason: "Error creating: <the API's message>"), on the DaemonSet.
                    self._event(ns, meta["name"], "FailedCreate", f"Error creating: {refused.message}", "Warning",
                                involved="DaemonSet")
                    continue
            made += 1
            failure = self._pull_failure(node["metadata"]["name"], image)
            if failure:
                self._event(ns, name, "Failed", f'Failed to pull image "{image}": {failure}', "Warning")
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
        return made

    def _collect_garbage(self) -> None:
        """Pods of a DaemonSet that is gone go too (the garbage collector's ownerReferences)."""
        live = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in self.cluster.objects("DaemonSet")}
        for pod in self.cluster.objects("Pod"):
            meta = pod["metadata"]
            owners = [o["name"] for o in meta.get("ownerReferences") or [] if o.get("kind") == "DaemonSet"]
            if owners and (meta["namespace"], owners[0]) not in live:
                self.cluster.delete("Pod", meta["name"], meta["namespace"])

    def _withdraw(self, daemonsets: list[Obj], nodes: list[Obj]) -> None:
        """A device plugin that is gone no longer advertises: the kubelet's device manager drops the
        resource of a plugin whose endpoint stopped (pkg/kubelet/cm/devicemanager/manager.go, its
        capacity 0 after the endpoint's grace period; at once here)."""
        running = {EFA if "efa" in image else GPU for ds in daemonsets
                   for image in [ds["spec"]["template"]["spec"]["containers"][0]["image"]]
                   if "k8s-device-plugin" in image}
        for node in nodes:
            name = node["metadata"]["name"]
            gone = [r for r in (GPU, EFA) if (name, r) in self._advertised and r not in running]
            if gone:
                allocatable = {**node["status"].get("allocatable", {}), **{r: "0" for r in gone}}
                self.cluster.set_status("Node", name, None, {**node["status"], "allocatable": allocatable})
                self._advertised -= {(name, r) for r in gone}

    def _advertise(self, resource: str, nodes: list[Obj]) -> None:
        for node in nodes:
            self._advertised.add((node["metadata"]["name"], resource))
            capacity = node["status"].get("capacity", {})
            allocatable = node["status"].get("allocatable", {})
            if resource in capacity and allocatable.get(resource) != capacity[resource]:
                self.cluster.set_status("Node", node["metadata"]["name"], None,
                                        {**node["status"], "allocatable": {**allocatable,
                                                                           resource: capacity[resource]}})

    def _pull_failure(self, node: str, image: str) -> str | None:
        """Why the kubelet cannot pull ``image`` on ``node``: a missing image, or no manifest for the node's
        architecture in the image's index (containerd's error as the kubelet reports it: "no match for
        platform in manifest: not found", containerd core/images/image.go / platforms matching)."""
        if image in self.bad_images:
            return "not found"
        arch = self._node_arch.get(node) or "amd64"
        listed = self.platforms.get(image) or next((p for key, p in self.platforms.items() if key in image), None)
        if arch not in (listed or frozenset({"amd64"})):
            return f'failed to pull and unpack image "{image}": no match for platform in manifest: not found'
        return None

    def _cached(self, node: str, image: str) -> bool:
        if self._pull_failure(node, image):
            return False
        now = time.monotonic()
        ready_at = self._pulled.setdefault((node, image), now + self.timings.pull_s)
        return now >= ready_at

    # ---- KubeRay ------------------------------------------------------------------------------------
    def _raycluster(self, rc: Obj, nodes: list[Obj]) -> None:
        meta, spec = rc["metadata"], rc["spec"]
        ns, name = meta["namespace"], meta["name"]
        existing = {p["metadata"]["name"] for p in self.cluster.objects("Pod", ns)}
        auth = self._auth(rc)
        head = with_token_env(spec["headGroupSpec"]["template"], auth, self.kuberay_version)
        autoscaling = spec.get("enableInTreeAutoscaling") is True
        if autoscaling:
            head = with_autoscaler_sidecar(head)
        if not self._make_pod(ns, f"{name}-head-0", name, "head", "headgroup", head, existing):
            return  # reconcilePods returns on a head it could not create: no worker is tried
        for group in spec.get("workerGroupSpecs", []):
            self._worker_group(ns, name, {**group, "template": with_token_env(group["template"], auth,
                                                                                self.kuberay_version)},
                               autoscaling, existing)
        if self.cluster.get("Service", f"{name}-head-svc", ns) is None:
            self.cluster.create({"apiVersion": "v1", "kind": "Service",
                                 "metadata": {"name": f"{name}-head-svc", "namespace": ns,
                                              "labels": {"ray.io/cluster": name}},
                                 "spec": {"selector": {"ray.io/cluster": name, "ray.io/node-type": "head"},
                                          "ports": [{"name": "dashboard", "port": 8265}]}})

    def _auth(self, rc: Obj) -> str | None:
        """The Secret the Ray containers read RAY_AUTH_TOKEN from, None without token auth.

        KubeRay v1.7.0 (ray-operator/controllers/ray/raycluster_controller.go ``reconcileAuthSecret``):
        with ``authOptions.mode: token`` and no ``secretName`` it creates a Secret named after the
        cluster holding a random ``auth_token``; with a ``secretName`` it creates nothing and uses that
        Secret as it is (a missing one leaves the pods unable to start). v1.5.x knows no ``secretName``:
        always its own Secret; before v1.5.1 no auth (``kuberay_double.operator_secret``)."""
        meta = rc["metadata"]
        secret = operator_secret(self.kuberay_version, rc["spec"].get("authOptions"), meta["name"])
        if secret is None or secret != meta["name"]:
            return secret
        if self.cluster.get("Secret", meta["name"], meta["namespace"]) is None:
            self.cluster.create({"apiVersion": "v1", "kind": "Secret",
                                 "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                                              "labels": {"ray.io/cluster": meta["name"]}},
                                 "data": {"auth_token": base64.b64encode(secrets.token_hex(16).encode()).decode()}})
        return str(meta["name"])

    def _container_env(self, ns: str, container: Obj) -> dict[str, str] | str:
        """The container's environment as the kubelet resolves it, or why it cannot start (the
        kubelet's CreateContainerConfigError message for a missing Secret or key)."""
        out: dict[str, str] = {}
        for var in container.get("env") or []:
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            if ref is None:
                out[var["name"]] = str(var.get("value", ""))
                continue
            secret = self.cluster.get("Secret", ref["name"], ns)
            if secret is None:
                return f'secret "{ref["name"]}" not found'
            value = secret_value(secret, ref["key"])
            if value is None:
                return f"couldn't find key {ref['key']} in Secret {ns}/{ref['name']}"
            out[var["name"]] = value
        return out

    def _worker_group(self, ns: str, cluster: str, group: Obj, autoscaling: bool, existing: set[str]) -> None:
        """KubeRay v1.7.0's reconcilePods for one worker group (raycluster_controller.go): the pods named
        in ``scaleStrategy.workersToDelete`` go first, whatever ``replicas`` says; the desired count is
        ``replicas`` clamped into [minReplicas, maxReplicas] (utils.GetWorkerGroupDesiredReplicas); missing
        pods are made; surplus pods are deleted at random only when the in-tree autoscaler is off: with
        it on, the autoscaler alone picks which pods go (ENABLE_RANDOM_POD_DELETE unset)."""
        gname = group["groupName"]
        prefix = f"{cluster}-{gname}-worker-"
        doomed = set((group.get("scaleStrategy") or {}).get("workersToDelete") or [])
        for pod_name in sorted(doomed & existing):
            if pod_name.startswith(prefix):
                self.cluster.delete("Pod", pod_name, ns)
                existing.discard(pod_name)
        live = sorted((n for n in existing if n.startswith(prefix)), key=lambda n: int(n.rsplit("-", 1)[1]))
        low, high = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
        replicas = group.get("replicas")
        desired = low if replicas is None or replicas < low else min(replicas, high)
        if len(live) < desired:
            taken = {int(n.rsplit("-", 1)[1]) for n in live}
            free = (i for i in range(desired + len(taken)) if i not in taken)
            for i in itertools.islice(free, desired - len(live)):
                self._make_pod(ns, f"{prefix}{i}", cluster, "worker", gname, group["template"], existing)
        elif len(live) > desired and not autoscaling:
            for pod_name in live[desired:]:
                self.cluster.delete("Pod", pod_name, ns)

    def _make_pod(self, ns: str, pod_name: str, cluster: str, node_type: str, group: str, template: Obj,
                  existing: set[str]) -> bool:
        """Create the pod unless it exists; False when the API server refused it."""
        if pod_name in existing:
            return True
        try:
            self.cluster.create({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": ns,
                             "labels": {**template.get("metadata", {}).get("labels", {}), "ray.io/cluster": cluster,
                                        "ray.io/node-type": node_type, "ray.io/group": group},
                             "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                "spec": template["spec"], "status": {"phase": "Pending"}})
        except ApiError as refused:
            self._replica_failure(ns, cluster, node_type, pod_name, refused.message)
            return False
        return True

    def _replica_failure(self, ns: str, cluster: str, node_type: str, pod_name: str, error: str) -> None:
        """KubeRay v1.7.0 when the API server refuses a pod (raycluster_controller.go createHeadPod /
        createWorkerPod): a Warning event on the RayCluster, ``FailedToCreateHeadPod`` ("Failed to create
        head Pod <ns>/<name>, <err>") or ``FailedToCreateWorkerPod``, and in calculateStatus the condition
        ReplicaFailure=True, reason ``FailedCreateHeadPod``/``FailedCreateWorkerPod`` (utils.ErrFailedCreate*),
        message the joined error (errors.Join: the reason, a newline, the API's message)."""
        role = "Head" if node_type == "head" else "Worker"
        self._event(ns, cluster, f"FailedToCreate{role}Pod", f"Failed to create {node_type} Pod {ns}/{pod_name}, "
                                                              f"{error}", "Warning", involved="RayCluster")
        live = self.cluster.get("RayCluster", cluster, ns)
        if live is None:
            return
        conditions = [c for c in (live.get("status") or {}).get("conditions") or [] if c["type"] != "ReplicaFailure"]
        failure = {"type": "ReplicaFailure", "status": "True", "reason": f"FailedCreate{role}Pod",
                   "message": f"FailedCreate{role}Pod\n{error}", "lastTransitionTime": now_rfc3339()}
        self.cluster.set_status("RayCluster", cluster, ns, {**(live.get("status") or {}),
                                                            "conditions": [*conditions, failure]})

    # ---- the PV controller and the CSI provisioners -------------------------------------------------
    def _claim(self, claim: Obj) -> None:
        """Bind a claim as the PV controller and an external provisioner would (kubernetes.io/docs/concepts/
        storage/persistent-volumes/ "Binding", /storage-classes/ "Volume binding mode"):

        - no storageClassName (no default class when it was made): only a pre-made PV of no class can
          bind it; there is none here, so it stays Pending (event FailedBinding, the PV controller's
          "no persistent volumes available for this claim and no storage class is set");
        - a class that does not exist: Pending (ProvisioningFailed "storageclass.storage.k8s.io ... not found");
        - a provisioner that cannot give the access mode asked (a block-device CSI driver such as
          ebs.csi.aws.com asked for ReadWriteMany): Pending, ProvisioningFailed (aws-ebs-csi-driver's
          controller refuses MULTI_NODE_MULTI_WRITER with InvalidArgument);
        - ``volumeBindingMode: WaitForFirstConsumer``: bound once a pod using it is scheduled; else at once."""
        meta, spec = claim["metadata"], claim.get("spec") or {}
        ns, name = meta["namespace"], meta["name"]
        if (claim.get("status") or {}).get("phase") == "Bound":
            return
        class_name = spec.get("storageClassName")
        if not class_name:
            self._event(ns, name, "FailedBinding", "no persistent volumes available for this claim and no storage "
                                                   "class is set", "Normal", involved="PersistentVolumeClaim")
            return
        storage_class = self.cluster.get("StorageClass", class_name)
        if storage_class is None:
            self._event(ns, name, "ProvisioningFailed", f'storageclass.storage.k8s.io "{class_name}" not found',
                        "Warning", involved="PersistentVolumeClaim")
            return
        modes = spec.get("accessModes") or []
        provisioner = storage_class.get("provisioner", "")
        if provisioner in SINGLE_NODE_PROVISIONERS and "ReadWriteMany" in modes:
            self._event(ns, name, "ProvisioningFailed",
                        f'failed to provision volume with StorageClass "{class_name}": rpc error: code = '
                        "InvalidArgument desc = Volume capabilities MULTI_NODE_MULTI_WRITER not supported. "
                        "Only AccessModes [ReadWriteOnce ReadWriteOncePod] supported.", "Warning",
                        involved="PersistentVolumeClaim")
            return
        if storage_class.get("volumeBindingMode") == "WaitForFirstConsumer" and not any(
                p["spec"].get("nodeName") and name in claims_of(p) for p in self.cluster.objects("Pod", ns)):
            self._event(ns, name, "WaitForFirstConsumer", "waiting for first consumer to be created before binding",
                        "Normal", involved="PersistentVolumeClaim")
            return
        size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "0")
        self.cluster.set_status("PersistentVolumeClaim", name, ns, {
            "phase": "Bound", "accessModes": modes, "capacity": {"storage": size}})
        self.cluster.patch("PersistentVolumeClaim", name, ns, {"spec": {"volumeName": f"pvc-{meta.get('uid', name)}"}})

    def _volume_misfit(self, pod: Obj) -> str | None:
        """Why a pod's claims keep it off every node (kube-scheduler's VolumeBinding filter): a missing
        claim, or an unbound claim that no provisioning at scheduling time will bind (an Immediate
        class's claim is bound before, or never)."""
        ns = pod["metadata"]["namespace"]
        for claim_name in claims_of(pod):
            claim = self.cluster.get("PersistentVolumeClaim", claim_name, ns)
            if claim is None:
                return f'persistentvolumeclaim "{claim_name}" not found'
            if (claim.get("status") or {}).get("phase") == "Bound":
                continue
            class_name = (claim.get("spec") or {}).get("storageClassName")
            storage_class = self.cluster.get("StorageClass", class_name) if class_name else None
            if storage_class is None or storage_class.get("volumeBindingMode") != "WaitForFirstConsumer":
                return "pod has unbound immediate PersistentVolumeClaims"
        return None

    def _attach_conflict(self, pod: Obj) -> str | None:
        """The attach/detach controller's Multi-Attach error: a ReadWriteOnce volume is attached to one
        node; a pod on another node waits in ContainerCreating (kubernetes.io/docs/concepts/storage/
        persistent-volumes/ "Access Modes": ReadWriteOnce, "mounted as read-write by a single node")."""
        meta = pod["metadata"]
        for claim_name in claims_of(pod):
            claim = self.cluster.get("PersistentVolumeClaim", claim_name, meta["namespace"]) or {}
            if "ReadWriteMany" in ((claim.get("status") or {}).get("accessModes") or []):
                continue
            users = [p["metadata"]["name"] for p in self.cluster.objects("Pod", meta["namespace"])
                     if claim_name in claims_of(p) and p["metadata"]["name"] != meta["name"]
                     and (p.get("status") or {}).get("phase") == "Running"
                     and p["spec"].get("nodeName") != pod["spec"].get("nodeName")]
            if users:
                volume = (claim.get("spec") or {}).get("volumeName", claim_name)
                return f'Multi-Attach error for volume "{volume}" Volume is already used by pod(s) {", ".join(users)}'
        return None

    # ---- scheduler and kubelet ----------------------------------------------------------------------
    def _pod(self, pod: Obj, nodes: list[Obj], live_clusters: set[tuple[str, str]]) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        ns, name = meta["namespace"], meta["name"]
        cluster = meta.get("labels", {}).get("ray.io/cluster")
        if meta.get("labels", {}).get("rtui.dev/role") == "data-reader":
            self._run_to_end(pod, nodes)
            return
        if meta.get("labels", {}).get("rtui.dev/role") == "netpol-probe":
            self._run_probe(pod)
            return
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
        failure = self._pull_failure(node, image)
        if failure:
            self._event(ns, name, "Failed", f'Failed to pull image "{image}": {failure}', "Warning")
            self.cluster.set_status("Pod", name, ns, {"phase": "Pending", "containerStatuses": [{
                "name": pod["spec"]["containers"][0]["name"], "image": image, "ready": False, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff",
                                      "message": f'Back-off pulling image "{image}"'}}}]})
            return
        if not self._cached(node, image):
            self._first_seen.pop(f"start/{ns}/{name}", None)  # the start clock runs from the pull's end
            return
        conflict = self._attach_conflict(pod)
        if conflict:
            self._event(ns, name, "FailedAttachVolume", conflict, "Warning")
            return
        env = self._container_env(ns, pod["spec"]["containers"][0])
        if isinstance(env, str):
            self.cluster.set_status("Pod", name, ns, {"phase": "Pending", "containerStatuses": [{
                "name": pod["spec"]["containers"][0]["name"], "image": image, "ready": False, "restartCount": 0,
                "state": {"waiting": {"reason": "CreateContainerConfigError", "message": env}}}]})
            return
        if self._age(f"start/{ns}/{name}") >= self.timings.start_s:
            if meta["labels"].get("ray.io/node-type") == "head" and self.jobs_url in FakeRayHead.running:
                # ``ray start`` in token mode takes RAY_AUTH_TOKEN; without RAY_AUTH_MODE=token, no auth.
                FakeRayHead.running[self.jobs_url].auth_token = \
                    env.get("RAY_AUTH_TOKEN") if env.get("RAY_AUTH_MODE") == "token" else None
            self._pod_ips.setdefault((ns, name), f"10.244.{len(self._pod_ips) // 250}.{len(self._pod_ips) % 250 + 2}")
            self.cluster.set_status("Pod", name, ns, {
                "phase": "Running", "podIP": self._pod_ips[(ns, name)],
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": pod["spec"]["containers"][0]["name"], "image": image, "ready": True,
                                       "restartCount": 0, "state": {"running": {"startedAt": "now"}}}]})
            if meta["labels"].get("ray.io/node-type") == "head" and self.jobs_url:
                self.cluster.proxy_to(ns, f"{cluster}-head-svc", "dashboard", self.jobs_url)

    def _run_to_end(self, pod: Obj, nodes: list[Obj]) -> None:
        """The kubelet of a pod that runs one command and ends (restartPolicy Never): scheduled like any
        pod (its claim must be bound), then its command runs here in the directory standing for the
        volume mounted at its workingDir, and its stdout becomes its log; a ``sleep`` stays Running
        with that directory as what ``exec`` sees (``RtuiKube._serve_exec``). The mount must be read-only
        (the pod only reads), else the fake refuses to run it."""
        meta, spec = pod["metadata"], pod["spec"]
        ns, name = meta["namespace"], meta["name"]
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Running"):
            return
        if not spec.get("nodeName") and self._schedule(pod, nodes) is None:
            return
        container = spec["containers"][0]
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == container["workingDir"])
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        claim = volume["persistentVolumeClaim"]["claimName"]
        assert mount.get("readOnly") and volume["persistentVolumeClaim"].get("readOnly"), "mounted read-write"
        if (ns, claim) not in self.volumes:
            self.volumes[(ns, claim)] = Path(tempfile.mkdtemp(prefix=f"vol-{claim}-", dir=self.volume_root))
        where = self.volumes[(ns, claim)]
        if container["command"][0] == "sleep":  # it waits to be exec'd into: Running until deleted
            self.cluster.kube.exec_dirs[(ns, name)] = where
            self.cluster.set_status("Pod", name, ns, {"phase": "Running", "containerStatuses": [{
                "name": container["name"], "ready": True, "restartCount": 0,
                "state": {"running": {"startedAt": "now"}}}]})
            return
        self.cluster.set_status("Pod", name, ns, {"phase": "Running"})
        command = [sys.executable if c == "python" else c for c in container["command"]]
        done = subprocess.run(command, cwd=where, capture_output=True, text=True, timeout=60)
        self.cluster.feed_log(ns, name, (done.stdout + done.stderr).splitlines())
        self.cluster.set_status("Pod", name, ns, {
            "phase": "Succeeded" if done.returncode == 0 else "Failed",
            "containerStatuses": [{"name": container["name"], "ready": False, "restartCount": 0,
                                   "state": {"terminated": {"exitCode": done.returncode}}}]})

    def _run_probe(self, pod: Obj) -> None:
        """The kubelet and the pod network of rtui's NetworkPolicy probe: its own command runs here, with
        its target (``python -c SCRIPT <ip> <port> <wait>``) swapped for a loopback port that accepts
        when the emulator's pod network (``pod_network.admitted``, only while it enforces policies)
        lets a connection from this pod reach the pod at ``<ip>``, and a closed one when it does not
        (a CNI that rejects; one that drops makes the probe time out, which reads the same). The API
        server's Service, which no policy of the run's namespace stands in front of, always accepts."""
        meta, spec = pod["metadata"], pod["spec"]
        ns, name = meta["namespace"], meta["name"]
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Running"):
            return
        container = spec["containers"][0]
        command = list(container["command"])
        ip, port = command[-3], int(command[-2])
        target = next((p for p in self.cluster.objects("Pod", ns) if (p.get("status") or {}).get("podIP") == ip),
                      None)
        self._pod_ips.setdefault((ns, name), f"10.244.{len(self._pod_ips) // 250}.{len(self._pod_ips) % 250 + 2}")
        namespace = self.cluster.get("Namespace", ns) or {"metadata": {}}
        source = Source(ip=self._pod_ips[(ns, name)], namespace=ns, labels=dict(meta.get("labels") or {}), pod=name,
                        namespace_labels={"kubernetes.io/metadata.name": ns,
                                          **(namespace["metadata"].get("labels") or {})})
        policies = self.cluster.objects("NetworkPolicy")
        reached = target is not None and (not self.cluster.kube.enforce_policies
                                          or admitted(policies, target, source, port))
        self.cluster.set_status("Pod", name, ns, {"phase": "Running", "podIP": self._pod_ips[(ns, name)]})
        with socket.socket() as open_port, socket.socket() as api_server, socket.socket() as closed:
            for s in (open_port, api_server, closed):
                s.bind(("127.0.0.1", 0))
            open_port.listen()
            api_server.listen()
            # ``closed`` is bound and never listens: a connection to it is refused.
            command[-3:-1] = ["127.0.0.1", str((open_port if reached else closed).getsockname()[1])]
            env = {**os.environ, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                   "KUBERNETES_SERVICE_PORT": str(api_server.getsockname()[1])}
            done = subprocess.run([sys.executable if c == "python" else c for c in command], env=env,
                                  capture_output=True, text=True, timeout=60)
        self.cluster.feed_log(ns, name, (done.stdout + done.stderr).splitlines())
        self.cluster.set_status("Pod", name, ns, {
            "phase": "Succeeded" if done.returncode == 0 else "Failed",
            "containerStatuses": [{"name": container["name"], "ready": False, "restartCount": 0,
                                   "state": {"terminated": {"exitCode": done.returncode}}}]})

    def _schedule(self, pod: Obj, nodes: list[Obj]) -> str | None:
        """kube-scheduler's filters, as far as a Ray pod meets them: NodeUnschedulable, NodeAffinity
        (nodeSelector and required affinity), TaintToleration and NodeResourcesFit (requests of the
        pods already bound plus ``held``, against allocatable: cpu, memory and extended resources).
        A pod no node passes gets the scheduler's own FailedScheduling message, built like
        ``FitError.Error`` (kubernetes/kubernetes, pkg/scheduler/framework/types.go): per reason the
        number of nodes, sorted, then the preemption summary."""
        meta, spec = pod["metadata"], pod["spec"]
        wants = pod_requests(spec)
        reasons: dict[str, int] = {}
        fits: list[str] = []
        for node in nodes:
            misfit = placement_misfit(spec, node) or self._volume_misfit(pod)
            whys = [misfit] if misfit else [f"Insufficient {r}" for r in self._insufficient(node, wants)]
            if not whys:
                fits.append(node["metadata"]["name"])
            for why in whys:  # each reason counts its nodes
                reasons[why] = reasons.get(why, 0) + 1
        if not fits:
            n = len(nodes)
            summary = ", ".join(sorted(f"{count} {why}" for why, count in reasons.items())) or "no nodes"
            message = f"0/{n} nodes are available: {summary}. preemption: 0/{n} nodes are available: " \
                      f"{n} No preemption victims found for incoming pod."
            self._event(meta["namespace"], meta["name"], "FailedScheduling", message, "Warning")
            self.cluster.set_status("Pod", meta["name"], meta["namespace"], {
                "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                    "reason": "Unschedulable", "message": message}]})
            return None
        self.cluster.patch("Pod", meta["name"], meta["namespace"], {"spec": {"nodeName": fits[0]}})
        return fits[0]

    def _insufficient(self, node: Obj, wants: dict[str, Decimal]) -> list[str]:
        name = node["metadata"]["name"]
        allocatable = {k: parse_quantity(v) for k, v in (node["status"].get("allocatable") or {}).items()}
        used: dict[str, Decimal] = {k: Decimal(v) for k, v in self.held.get(name, {}).items()}
        for other in self.cluster.objects("Pod"):
            if other["spec"].get("nodeName") == name and (other.get("status") or {}).get("phase") not in (
                    "Succeeded", "Failed"):
                for resource, amount in pod_requests(other["spec"]).items():
                    used[resource] = used.get(resource, Decimal(0)) + amount
        return [r for r, amount in wants.items()
                if amount > 0 and allocatable.get(r, Decimal(0)) - used.get(r, Decimal(0)) < amount]

    def _event(self, ns: str, pod: str, reason: str, message: str, kind: str, *,
               involved: str = "Pod") -> None:
        key = f"{ns}/{involved}/{pod}/{reason}/{message}"
        if key not in self._events:
            self._events.add(key)
            self.cluster.add_event(ns, involved, pod, reason, message, type=kind)


# KubeRay v1.7.0's autoscaler sidecar (common/pod.go, BuildAutoscalerContainer): the Ray image, 500m CPU
# and 512Mi as request and limit unless autoscalerOptions.resources says otherwise.
AUTOSCALER_RESOURCES = {"cpu": "500m", "memory": "512Mi"}


def with_autoscaler_sidecar(template: Obj) -> Obj:
    """The head pod template as KubeRay makes it when ``enableInTreeAutoscaling`` is on: the
    autoscaler container beside the head's, so its requests count where the head is scheduled."""
    spec = template["spec"]
    sidecar = {"name": "autoscaler", "image": spec["containers"][0]["image"],
               "resources": {"requests": dict(AUTOSCALER_RESOURCES), "limits": dict(AUTOSCALER_RESOURCES)}}
    return {**template, "spec": {**spec, "containers": [*spec["containers"], sidecar]}}


# What the DaemonSet controller adds to every pod it makes (pkg/controller/daemon/util/daemonset_util.go).
DAEMONSET_TOLERATIONS = [{"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": e} for k, e in (
    ("not-ready", "NoExecute"), ("unreachable", "NoExecute"), ("disk-pressure", "NoSchedule"),
    ("memory-pressure", "NoSchedule"), ("pid-pressure", "NoSchedule"), ("unschedulable", "NoSchedule"))]


# CSI drivers of block devices: one node mounts a volume read-write at a time (ReadWriteOnce,
# ReadWriteOncePod); asked for ReadWriteMany their provisioners fail. (aws-ebs-csi-driver,
# gcp-compute-persistent-disk-csi-driver, azuredisk-csi-driver, rancher local-path-provisioner docs.)
SINGLE_NODE_PROVISIONERS = frozenset({"ebs.csi.aws.com", "kubernetes.io/aws-ebs", "pd.csi.storage.gke.io",
                                      "kubernetes.io/gce-pd", "disk.csi.azure.com", "kubernetes.io/azure-disk",
                                      "rancher.io/local-path"})


def claims_of(pod: Obj) -> list[str]:
    """The PersistentVolumeClaims a pod's volumes name."""
    return [v["persistentVolumeClaim"]["claimName"] for v in (pod.get("spec") or {}).get("volumes") or []
            if v.get("persistentVolumeClaim")]


def secret_value(secret: Obj, key: str) -> str | None:
    """A Secret's value: the API server folds ``stringData`` into ``data`` (base64) on write."""
    if key in (secret.get("stringData") or {}):
        return str(secret["stringData"][key])
    data = (secret.get("data") or {}).get(key)
    return base64.b64decode(data).decode() if data is not None else None


def with_token_env(template: Obj, secret_name: str | None, version: str = "1.7.0") -> Obj:
    """The pod template with the env KubeRay ``version`` adds to the Ray container under token auth
    (ray-operator/controllers/ray/common/pod.go ``SetContainerTokenAuthEnvVars``): RAY_AUTH_MODE=token
    and RAY_AUTH_TOKEN from the Secret's ``auth_token`` key; from v1.6.0 each only where the container
    has none, v1.5.x appends both whatever is there (``kuberay_double.operator_env``)."""
    if secret_name is None:
        return template
    out = copy.deepcopy(template)
    container = out["spec"]["containers"][0]
    # operator_env decides by the Secret alone here: the one _auth resolved for this release.
    container["env"] = operator_env(version, container.get("env") or [], secret_name,
                                    {"mode": "token", "secretName": secret_name})
    return out


def pod_requests(spec: Obj) -> dict[str, Decimal]:
    """The pod's requests summed over its containers; a limit without a request is the request
    (the API server's defaulting, pkg/apis/core/v1/defaults.go)."""
    out: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        resources = c.get("resources") or {}
        for name, value in {**(resources.get("limits") or {}), **(resources.get("requests") or {})}.items():
            out[name] = out.get(name, Decimal(0)) + parse_quantity(value)
    return out


def _term_matches(term: Obj, labels: dict[str, str]) -> bool:
    for e in term.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        present = key in labels
        if op == "In":
            ok = present and labels[key] in values
        elif op == "NotIn":
            ok = not present or labels[key] not in values
        else:
            ok = present == (op == "Exists")
        if not ok:
            return False
    return True


def _tolerated(taint: Obj, tolerations: list[Obj]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if not t.get("key") and t.get("operator") == "Exists":
            return True
        if t.get("key") == taint.get("key") and (
                t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", "")):
            return True
    return False


def placement_misfit(spec: Obj, node: Obj) -> str | None:
    """Why the scheduler's label and taint filters reject ``node`` for a pod of ``spec``, in its words."""
    if node.get("spec", {}).get("unschedulable") and not _tolerated(
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}, spec.get("tolerations") or []):
        return "node(s) were unschedulable"
    labels = node["metadata"].get("labels") or {}
    selector_ok = all(labels.get(k) == v for k, v in (spec.get("nodeSelector") or {}).items())
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if not selector_ok or (terms and not any(_term_matches(t, labels) for t in terms)):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, spec.get("tolerations") or []):
            return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    return None
