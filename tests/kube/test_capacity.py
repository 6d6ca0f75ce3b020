"""Preflight's GPU node check counts the room there is now (issue 35, item 5).

kube-scheduler's NodeResourcesFit places a pod only where its requests fit in the node's allocatable
minus the requests of the pods already bound there that have not terminated ("Resource Management for
Pods and Containers", kubernetes.io/docs/concepts/configuration/manage-resources-containers/). The
emulated scheduler (fake_control._schedule) does the same. A GPU node whose device plugin is not
running yet has no ``nvidia.com/gpu`` allocatable and, without GPU Feature Discovery, no
``nvidia.com/gpu.present`` label; its instance type (``node.kubernetes.io/instance-type``, set by the
kubelet from the cloud provider) or GKE's/EKS's accelerator labels still say it has GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.resolve import resolve_config
from backend.resources import CheckResult, CheckStatus
from backend.session import RunSession
from tests.kube.conftest import KubeCluster


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("RTUI_STATE_DIR", str(tmp_path / "state"))
    yield tmp_path


async def _gpu_check(cluster: KubeCluster, **flags: str) -> CheckResult:
    session = RunSession.for_config(resolve_config({
        "target": "kube", "kubeconfig": str(cluster.kubeconfig), "allow_unpinned": "true", **flags}, environ={}))
    checks = {c.id: c for c in await session.preflight()}
    return checks["kube.gpu-nodes"]


def _busy_pod(cluster: KubeCluster, node: str, gpus: int) -> None:
    """Another team's training pod, bound to ``node`` and running, holding ``gpus`` of its GPUs."""
    if cluster.get("Namespace", "team-b") is None:
        cluster.add_namespace("team-b")
    cluster.create({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"train-{node}", "namespace": "team-b"},
                    "spec": {"nodeName": node, "containers": [{
                        "name": "main", "image": "x",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
                    "status": {"phase": "Running"}})


async def test_gpus_another_pod_holds_are_not_room_for_a_worker(kube_cluster: KubeCluster, state: Path) -> None:
    """Two 4-GPU nodes, one of them busy with another team's 4-GPU pod: only one worker of two fits now."""
    kube_cluster.add_node("system-0", gpus=0, efa=0)
    for name in ("gpu-0", "gpu-1"):
        kube_cluster.add_node(name, gpus=4, efa=1)
    _busy_pod(kube_cluster, "gpu-1", 4)
    check = await _gpu_check(kube_cluster, gpu_node_count="2", require_transport="any")
    assert check.status is CheckStatus.FAIL, check
    assert "1 of 2 workers fit now" in (check.detail or ""), check.detail
    assert "gpu-1" in (check.detail or "") and "team-b/train-gpu-1" in (check.detail or ""), check.detail


async def test_a_finished_pod_holds_nothing(kube_cluster: KubeCluster, state: Path) -> None:
    kube_cluster.add_node("system-0", gpus=0, efa=0)
    for name in ("gpu-0", "gpu-1"):
        kube_cluster.add_node(name, gpus=4, efa=1)
    _busy_pod(kube_cluster, "gpu-1", 4)
    kube_cluster.set_pod_phase("team-b", "train-gpu-1", "Succeeded")
    check = await _gpu_check(kube_cluster, gpu_node_count="2", require_transport="any")
    assert check.status is CheckStatus.OK, check


@pytest.mark.parametrize("labels", [
    {"node.kubernetes.io/instance-type": "g6.12xlarge"},  # EKS, the plugin not installed yet
    {"cloud.google.com/gke-accelerator": "nvidia-l4"},  # a GKE accelerator pool
    {"k8s.amazonaws.com/accelerator": "nvidia-tesla-a10g"},
])
async def test_gpu_nodes_no_plugin_serves_yet_count(kube_cluster: KubeCluster, state: Path,
                                                     labels: dict[str, str]) -> None:
    """No plugin yet: no nvidia.com/gpu allocatable and no gpu.present label; the node is a GPU node all
    the same, checked again once the plugin runs (WARN), never 'no node has GPUs' (FAIL)."""
    kube_cluster.add_node("system-0", gpus=0, efa=0)
    for name in ("gpu-0", "gpu-1"):
        node = kube_cluster.add_node(name, gpus=4, efa=0, gpu_label=False, labels=labels)
        allocatable = {**node["status"]["allocatable"], "nvidia.com/gpu": None}
        kube_cluster.set_status("Node", name, None, {**node["status"], "allocatable": allocatable})
    check = await _gpu_check(kube_cluster, gpu_node_count="2", require_transport="any")
    assert check.status is CheckStatus.WARN, check
    assert "allocatable nvidia.com/gpu is 0" in (check.detail or ""), check.detail


async def test_an_amd_gpu_instance_is_no_nvidia_node(kube_cluster: KubeCluster, state: Path) -> None:
    kube_cluster.add_node("system-0", gpus=0, efa=0)
    kube_cluster.add_node("amd-0", gpus=0, efa=0, labels={"node.kubernetes.io/instance-type": "g4ad.16xlarge"})
    check = await _gpu_check(kube_cluster, gpu_node_count="1", require_transport="any")
    assert check.status is CheckStatus.FAIL, check
    assert "no node has GPUs" in (check.detail or ""), check.detail


async def test_a_pool_that_scales_from_zero_is_said_so(kube_cluster: KubeCluster, state: Path) -> None:
    """No GPU node now, a cluster-autoscaler runs: the GPU pool scales from zero (WARN, not FAIL)."""
    kube_cluster.add_node("system-0", gpus=0, efa=0)
    kube_cluster.create({"apiVersion": "apps/v1", "kind": "Deployment",
                         "metadata": {"name": "cluster-autoscaler", "namespace": "kube-system"},
                         "spec": {"selector": {"matchLabels": {"app": "ca"}}, "template": {
                             "metadata": {"labels": {"app": "ca"}},
                             "spec": {"containers": [{"name": "ca", "image": "registry.k8s.io/autoscaling/"
                                                                             "cluster-autoscaler:v1.34.0"}]}}}})
    check = await _gpu_check(kube_cluster, gpu_node_count="2", require_transport="any")
    assert check.status is CheckStatus.WARN, check
    assert "scales from zero" in (check.detail or ""), check.detail
