"""The kube target when the cluster is not a fresh, willing one (issue 12): what rtui adopts, refuses, reports.

Each test drives the real CLI (from this checkout) over HTTPS against the emulated API server,
with fake_control playing the controllers, scheduler and kubelets. The access-side failures
(tokens, logs, bad input) are in test_kube_failures_access.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from targets.kube import raycluster
from targets.kube.pods import PodProblem
from tests.kube.conftest import KubeCluster
from tests.kube.crds import load_yaml
from tests.kube.kube_world import RUN_LABEL, KubeWorld, events, failure, gpu_cluster, wait_until, world

__all__ = ["world"]  # the fixture, imported for pytest

GPU, EFA = "nvidia.com/gpu", "vpc.amazonaws.com/efa"


def _daemonset(name: str, namespace: str, image: str) -> dict[str, object]:
    labels = {"app.kubernetes.io/name": name}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace, "labels": {**labels, "helm.sh/chart": "x"}},
            "spec": {"selector": {"matchLabels": labels}, "updateStrategy": {"type": "RollingUpdate"},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "nodeSelector": {"nvidia.com/gpu.present": "true"},
                         "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                         "containers": [{"name": "plugin", "image": image}]}}}}


def _existing_addons(cluster: KubeCluster, crds: Path) -> None:
    """A cluster that already runs KubeRay 1.6.0 (Helm) and both device plugins (GPU Operator, EKS chart)."""
    cluster.add_namespace("kuberay-system")
    cluster.add_namespace("gpu-operator")
    crd = load_yaml(crds / "ray.io_rayclusters.yaml")
    cluster.install_crd(crd)  # installed long ago: Established
    labels = {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/managed-by": "Helm"}
    cluster.create({"apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "kuberay-operator", "namespace": "kuberay-system", "labels": labels},
                    "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                             "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                                 {"name": "kuberay-operator", "image": "quay.io/kuberay/operator:v1.6.0"}]}}}})
    cluster.set_deployment_available("kuberay-system", "kuberay-operator")
    cluster.create(_daemonset("nvidia-device-plugin-daemonset", "gpu-operator",
                              "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"))
    cluster.create(_daemonset("aws-efa-k8s-device-plugin-daemonset", "kube-system",
                              "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.6"))


ADOPTED = (("Deployment", "kuberay-operator", "kuberay-system"),
           ("DaemonSet", "nvidia-device-plugin-daemonset", "gpu-operator"),
           ("DaemonSet", "aws-efa-k8s-device-plugin-daemonset", "kube-system"),
           ("CustomResourceDefinition", "rayclusters.ray.io", None))


def _versions(cluster: KubeCluster) -> dict[tuple[str, str, str | None], str]:
    """The resourceVersion of each object the user installed ("gone" once deleted)."""
    return {(kind, name, ns): ((cluster.get(kind, name, ns) or {}).get("metadata") or {}).get("resourceVersion", "gone")
            for kind, name, ns in ADOPTED}


def test_existing_operator_and_device_plugins_are_adopted_untouched_and_kept(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    _existing_addons(world.cluster, Path(world.env["RTUI_KUBERAY_CRDS"]))
    wait_until("the adopted plugins to run", lambda: all(
        (d.get("status") or {}).get("numberReady") == 2 for d in world.cluster.objects("DaemonSet")))
    before = _versions(world.cluster)  # once the fake controllers wrote their status: nothing changes them now

    plan = json.loads(world.rtui("plan", "--json").stdout)
    changes = {c["address"]: c for c in plan["changes"]}
    for address, where in (("kube.kuberay-operator", "kuberay-system/kuberay-operator"),
                           ("kube.device-plugin.nvidia", "gpu-operator/nvidia-device-plugin-daemonset"),
                           ("kube.device-plugin.efa", "kube-system/aws-efa-k8s-device-plugin-daemonset")):
        assert changes[address]["action"] == "noop", changes[address]
        assert "adopted" in changes[address]["reason"] and where in changes[address]["reason"], changes[address]

    up = world.rtui("up", "--yes", "--json", timeout=120)
    assert events(up.stdout)[-1]["data"]["job_status"] == "SUCCEEDED"
    assert _versions(world.cluster) == before
    # rtui installed no operator or plugin of its own beside them.
    assert sorted(world.labelled()) == ["DaemonSet/rtui-ray-image-prepull", "Namespace/rtui",
                                        "NetworkPolicy/rtui-ray-ray", "RayCluster/rtui-ray", "Secret/rtui-ray-job-env",
                                        "Secret/rtui-ray-ray-token", "ServiceAccount/rtui-ray-ray-worker"]
    assert world.cluster.get("Namespace", "rtui-kuberay") is None

    world.rtui("down", "--yes", timeout=120)
    assert world.labelled() == []
    assert _versions(world.cluster) == before
    for kind, name, ns in before:
        obj = world.cluster.get(kind, name, ns)
        assert obj is not None and RUN_LABEL not in (obj["metadata"].get("labels") or {}), (kind, name)


def test_gpu_nodes_without_efa_fail_with_the_node_then_run_over_tcp(world: KubeWorld) -> None:
    gpu_cluster(world.cluster, efa=0)
    up = world.rtui("up", "--yes", "--json", timeout=120, check=False)
    assert up.returncode == 1
    line = failure(up.stdout)
    assert "\n" not in line and "node gpu-0" in line and EFA in line and "--require-transport any" in line, line
    assert "Traceback" not in up.stderr

    again = world.rtui("up", "--yes", "--json", "--require-transport", "any", timeout=120)
    assert events(again.stdout)[-1]["data"]["job_status"] == "SUCCEEDED", again.stdout[-2000:]
    workers = [p for p in world.cluster.objects("Pod", "rtui")
               if p["metadata"]["labels"].get("ray.io/node-type") == "worker"]
    assert len(workers) == 2
    for pod in workers:
        resources = pod["spec"]["containers"][0]["resources"]
        assert EFA not in resources.get("limits", {}) and EFA not in resources.get("requests", {}), resources
        assert resources["limits"][GPU] == "4"
    assert len(world.head.jobs) == 1


def test_worker_pending_for_efa_held_elsewhere_fails_at_the_deadline_with_the_reason(
        world: KubeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Nodes advertise EFA but another pod holds it: a wait (it may free up), then a failure that says why.

    In-process, so the deadline can be shortened without a knob production would read.
    """
    from tui import cli

    gpu_cluster(world.cluster)
    world.control.held = {"gpu-0": {EFA: 1}, "gpu-1": {EFA: 1}}
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(raycluster, "UNSCHEDULABLE_TIMEOUT_S", 1.0)
    assert cli.main(["up", "--yes", "--json"]) == 1
    line = failure(capsys.readouterr().out)
    assert "\n" not in line and f"Insufficient {EFA}" in line and "not scheduled" in line, line
    assert "(unschedulable for 1s)" in line, line  # how long it waited
    assert not world.head.jobs


def test_the_unschedulable_clock_restarts_when_the_pods_get_placed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raycluster, "UNSCHEDULABLE_TIMEOUT_S", 60.0)
    stuck = PodProblem(f"pod w: not scheduled: 2 nodes lack {EFA}", False, (EFA,), unscheduled=True)
    now = [0.0]
    clock = raycluster.Unscheduled(clock=lambda: now[0])
    assert clock.fatal(stuck) is None
    now[0] += 61
    assert clock.fatal(PodProblem('Pulling image "x" (still pulling)', False)) is None  # placed: the clock stops
    assert clock.fatal(stuck) is None  # and starts again from zero
    now[0] += 59
    assert clock.fatal(stuck) is None
    now[0] += 2
    assert clock.fatal(stuck) == f"pod w: not scheduled: 2 nodes lack {EFA} (unschedulable for 61s)"
    assert clock.fatal(PodProblem("pod w: cannot pull image x", True)) == "pod w: cannot pull image x"


def test_image_pull_backoff_fails_naming_the_image(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    pinned = f"{world.registry.image()}@{world.registry.tags['rtui/ray:test']}"
    world.control.bad_images.add(pinned)
    up = world.rtui("up", "--yes", timeout=120, check=False)
    assert up.returncode == 1 and "Traceback" not in up.stdout + up.stderr
    failed = [ln for ln in up.stdout.splitlines() if " ✗ " in ln and " ✗ run " not in ln]
    assert failed and all(pinned in ln and "cannot pull image" in ln for ln in failed), up.stdout[-3000:]
    assert not world.head.jobs


def test_sigkill_mid_apply_then_up_again_makes_nothing_twice(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    world.control.timings.addon_s = 0.5  # the operator is still rolling out when the kill lands
    proc = world.start("up", "--yes", "--json")
    try:
        wait_until("the operator Deployment", lambda: world.cluster.get("Deployment", "kuberay-operator",
                                                                        "rtui-kuberay"), timeout=60)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not world.cluster.objects("RayCluster") and not world.head.jobs  # it died mid-apply

    up = world.rtui("up", "--yes", "--json", timeout=120)
    assert events(up.stdout)[-1]["data"]["job_status"] == "SUCCEEDED", up.stdout[-2000:]
    assert len(world.cluster.objects("RayCluster")) == 1
    names = sorted(d["metadata"]["name"] for d in world.cluster.objects("DaemonSet"))
    assert names == ["rtui-efa-device-plugin", "rtui-nvidia-device-plugin", "rtui-ray-image-prepull"], names
    assert len(world.cluster.objects("Deployment")) == 1
    assert len(world.head.jobs) == 1, list(world.head.jobs)
    runs = {o["metadata"]["labels"][RUN_LABEL] for kind in ("RayCluster", "DaemonSet", "Namespace")
            for o in world.cluster.objects(kind) if RUN_LABEL in (o["metadata"].get("labels") or {})}
    assert len(runs) == 1, runs  # the second up continued the killed run, it did not start another
    assert_no_secret(world, world.cluster.token)


def assert_no_secret(world: KubeWorld, *secrets: str) -> None:
    """Nothing of the kubeconfig's credentials in rtui's state dir, spools or cache."""
    roots = [world.state, Path(world.env["RTUI_CACHE_DIR"])]
    files = [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in files), files  # the spool is among them
    for path in files:
        text = path.read_bytes().decode(errors="replace")
        for secret in secrets:
            assert secret not in text, path


def test_a_kuberay_operator_that_cannot_pull_its_image_fails_at_once_naming_it(world: KubeWorld) -> None:
    """The operator's wait reads its pod's state, as the Ray pods' and cluster-autoscaler's do: an image
    the registry does not hold ends the step with Kubernetes' reason, not after the add-on timeout."""
    gpu_cluster(world.cluster)
    pinned = f"{world.registry.image('kuberay/operator')}:v1.7.0@{world.registry.tags['kuberay/operator:v1.7.0']}"
    world.control.bad_images.add(pinned)
    up = world.rtui("up", "--yes", timeout=120, check=False)
    assert up.returncode == 1 and "Traceback" not in up.stdout + up.stderr
    failed = [ln for ln in up.stdout.splitlines() if " ✗ " in ln and "KubeRay" in ln]
    assert failed and f"cannot pull image {pinned}" in failed[0], up.stdout[-3000:]
    # At once: the wait read the pod's state, it did not run out its timeout (backend/waiting.py's
    # "still ... after N min" would say so) -- a behaviour, not an elapsed-time figure.
    assert not re.search(r": still .* after \d", failed[0]), failed[0]
    assert not world.head.jobs
