"""Nothing another team relies on goes with rtui's run (issue 35, item 7).

- A CRD's deletion deletes every object of its kind (the customresourcecleanup finalizer), and an
  operator whose CRD is gone fails its informers ("failed to list *v1.RayCluster: the server could
  not find the requested resource"): rtui's KubeRay CRDs stay while another team's KubeRay operator
  runs, even with no ray.io object left.
- The kubelet's device manager stops advertising a resource once its plugin's socket is gone
  (pkg/kubelet/cm/devicemanager), and a pod that asks for it is then refused on that node
  (UnexpectedAdmissionError): rtui's device plugins stay while a pod that is not rtui's requests
  ``nvidia.com/gpu`` or ``vpc.amazonaws.com/efa``.
- The namespaced operator (``--watch-namespace``) reconciles only RayClusters in the namespaces it
  watches: one in another namespace does not use it, so it goes with the last run it serves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kube.kube_world import KubeWorld, gpu_cluster, world

__all__ = ["world"]  # the fixture, imported for pytest

CRDS = ("rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io")
OPERATOR = ("Deployment", "kuberay-operator", "rtui-kuberay")
NVIDIA = ("DaemonSet", "rtui-nvidia-device-plugin", "kube-system")
EFA = ("DaemonSet", "rtui-efa-device-plugin", "kube-system")


def _their_operator(world: KubeWorld, namespace: str) -> None:
    """Another team's KubeRay operator (their Helm release, watching their namespace), installed after rtui's
    CRDs were there: Helm's crds/ directory skips CRDs that already exist, so theirs rely on rtui's."""
    world.cluster.add_namespace(namespace)
    labels = {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/managed-by": "Helm"}
    world.cluster.create({"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": "kuberay-operator", "namespace": namespace, "labels": labels},
                          "spec": {"selector": {"matchLabels": labels}, "template": {
                              "metadata": {"labels": labels}, "spec": {"containers": [{
                                  "name": "kuberay-operator", "image": "quay.io/kuberay/operator:v1.7.0",
                                  "args": ["--watch-namespace", namespace]}]}}}})


def test_another_teams_operator_keeps_rtuis_crds(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    world.rtui("up", "--yes", "--until", "kube.raycluster", timeout=120)
    _their_operator(world, "team-b")
    down = world.rtui("down", "--yes", timeout=120)
    assert {c["metadata"]["name"] for c in world.cluster.objects("CustomResourceDefinition")} == set(CRDS), \
        down.stdout[-2000:]
    assert "team-b/kuberay-operator" in down.stdout, down.stdout[-2000:]
    assert world.cluster.get("Deployment", "kuberay-operator", "team-b") is not None
    assert world.cluster.get("RayCluster", "rtui-ray", "rtui") is None


def test_a_gpu_pod_that_is_not_rtuis_keeps_the_device_plugins(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    world.rtui("up", "--yes", "--gpu-node-count", "1", "--until", "kube.gpu-workers", timeout=120)
    assert world.cluster.get(*NVIDIA) is not None
    world.cluster.add_namespace("team-b")
    world.cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "infer", "namespace": "team-b"},
                          "spec": {"nodeName": "gpu-1", "containers": [{
                              "name": "main", "image": "x",
                              "resources": {"limits": {"nvidia.com/gpu": "1", "vpc.amazonaws.com/efa": "1"}}}]},
                          "status": {"phase": "Running"}})
    down = world.rtui("down", "--yes", timeout=120)
    assert world.cluster.get(*NVIDIA) is not None, down.stdout[-2000:]
    assert world.cluster.get(*EFA) is not None, down.stdout[-2000:]
    assert "team-b/infer" in down.stdout, down.stdout[-2000:]


def test_the_namespaced_operator_goes_with_its_last_run(world: KubeWorld) -> None:
    """A RayCluster in a namespace the operator does not watch is not its user."""
    gpu_cluster(world.cluster)
    world.rtui("up", "--yes", "--until", "kube.raycluster", timeout=120)
    world.cluster.add_namespace("team-c")
    world.cluster.create({"apiVersion": "ray.io/v1", "kind": "RayCluster",
                          "metadata": {"name": "theirs", "namespace": "team-c"},
                          "spec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                              {"name": "ray-head", "image": "rayproject/ray:2.58.0"}]}}}}})
    down = world.rtui("down", "--yes", timeout=120)
    assert world.cluster.get(*OPERATOR) is None, down.stdout[-2000:]
    assert world.cluster.get("RayCluster", "theirs", "team-c") is not None


# ---- the run's namespace goes, and a namespace still going is said so (issue 35, item 7) --------------

def test_down_delete_data_then_up_works(world: KubeWorld, tmp_path: Path) -> None:
    """`rtui model` reads through a ``sleep`` pod and deletes it; with a grace period that ``sleep`` (PID 1,
    no SIGTERM handler) waits out (kube_lifecycle), it stayed Terminating for 30 s, `down --delete-data`
    right after skipped the namespace, and the next `up` was refused."""
    from tests.kube.test_kube_storage import _write_model, storage_class

    gpu_cluster(world.cluster)
    storage_class(world.cluster, "efs", "efs.csi.aws.com")
    world.rtui("up", "--yes", "--storage-size", "50Gi", "--until", "kube.raycluster", timeout=120)
    [pvc] = world.cluster.objects("PersistentVolumeClaim", "rtui")
    run_id = pvc["metadata"]["labels"]["rtui.dev/run"]
    world.control.volumes[("rtui", pvc["metadata"]["name"])] = tmp_path / "volume"
    _write_model(tmp_path / "volume" / run_id / "rtui-train" / "model", {"config.json": b"{}"})
    world.rtui("down", "--yes", timeout=120)
    world.rtui("model", run_id, "--to", str(tmp_path / "copy"), timeout=120)
    gone = world.rtui("down", run_id, "--delete-data", "--yes", timeout=120)
    assert world.cluster.get("Namespace", "rtui") is None, gone.stdout[-2000:] + gone.stderr[-2000:]
    world.rtui("up", "--yes", "--storage-size", "50Gi", "--until", "kube.raycluster", timeout=120)


def test_up_waits_for_a_namespace_still_terminating(world: KubeWorld, tmp_path: Path) -> None:
    """`down && up`: the last run's namespace is still Terminating (a pod in its grace period); up says so,
    with the namespace controller's conditions, waits, and makes it anew."""
    gpu_cluster(world.cluster)
    world.rtui("up", "--yes", "--until", "kube.namespace", timeout=120)
    world.cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "slow", "namespace": "rtui"},
                          "spec": {"terminationGracePeriodSeconds": 4,
                                   "containers": [{"name": "main", "image": "x", "command": ["sleep", "9999"]}]},
                          "status": {"phase": "Running"}})
    world.cluster.delete("Namespace", "rtui")
    assert (world.cluster.read("Namespace", "rtui").get("status") or {}).get("phase") == "Terminating"
    fresh = {**world.env, "RTUI_STATE_DIR": str(tmp_path / "state-b")}
    up = world.rtui("up", "--yes", "--until", "kube.namespace", check=False, timeout=120, env=fresh)
    text = up.stdout + up.stderr
    assert up.returncode == 0, text[-2000:]
    assert "still being deleted: Some resources are remaining: pods. has 1 resource instances" in text, text[-2000:]
    live = world.cluster.read("Namespace", "rtui")
    assert not live["metadata"].get("deletionTimestamp") and world.cluster.get("Pod", "slow", "rtui") is None


def test_a_create_in_a_terminating_namespace_is_not_called_forbidden(world: KubeWorld) -> None:
    """NamespaceLifecycle's 403 is no RBAC refusal: the error says the namespace is going."""
    import asyncio

    from backend.errors import OperationError
    from targets.kube.api import Forbidden, KubeApi

    world.cluster.add_namespace("team-d")
    world.cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "slow", "namespace": "team-d"},
                          "spec": {"terminationGracePeriodSeconds": 600,
                                   "containers": [{"name": "main", "image": "x", "command": ["sleep", "9999"]}]},
                          "status": {"phase": "Running"}})
    world.cluster.delete("Namespace", "team-d")
    api = KubeApi.from_kubeconfig(str(world.cluster.kubeconfig))
    try:
        with pytest.raises(OperationError) as raised:
            asyncio.run(api.apply({"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": "x", "namespace": "team-d"}}))
    finally:
        api.close()
    assert not isinstance(raised.value, Forbidden)
    assert "namespace team-d is still being deleted" in raised.value.message
