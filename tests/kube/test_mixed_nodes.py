"""Mixed clusters (issue 35, item 6): arm64 nodes beside amd64 ones, CPU nodes nobody tainted.

Every node carries ``kubernetes.io/os`` and ``kubernetes.io/arch`` (the kubelet sets them:
https://kubernetes.io/docs/reference/labels-annotations-taints/#kubernetes-io-arch). An image whose index
lists no manifest for a node's architecture cannot be pulled there (containerd: "no match for platform in
manifest: not found"), and the default image, an AWS DLC, is built for x86_64 alone. The pre-pull DaemonSet
puts a multi-GB image only where the workers can run (the GPU nodes), never on every untainted node of a
shared cluster, and waits for no node it cannot use.
"""

from __future__ import annotations

import pytest

from targets.kube import raycluster
from tests.kube.kube_world import KubeWorld, events, failure, gpu_cluster, world

__all__ = ["world"]  # the fixture, imported for pytest


def _in_process(world: KubeWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    # A bound instead of 30 minutes, so a regression fails here instead of hanging the suite.
    monkeypatch.setattr(raycluster, "PULL_TIMEOUT_S", 30.0)


def _pods(world: KubeWorld) -> dict[str, list[str]]:
    """Where each of the run's pods was placed, by role (head, worker, prepull)."""
    out: dict[str, list[str]] = {}
    for pod in world.cluster.objects("Pod", "rtui"):
        labels = pod["metadata"].get("labels") or {}
        role = labels.get("ray.io/node-type") or ("prepull" if "image-prepull" in pod["metadata"]["name"] else "other")
        out.setdefault(role, []).append(pod["spec"].get("nodeName") or "")
    return {k: sorted(v) for k, v in out.items()}


def test_arm64_and_cpu_only_nodes_get_no_prepull_and_the_head_lands_on_amd64(
        world: KubeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tui import cli

    # Listed first, so a scheduler with no constraint to stop it would pick them first.
    world.cluster.add_node("arm-system", gpus=0, efa=0, arch="arm64")
    world.cluster.add_node("arm-gpu", gpus=4, efa=1, arch="arm64")
    world.cluster.add_node("batch-cpu", gpus=0, efa=0)  # someone else's CPU node, untainted
    gpu_cluster(world.cluster, advertised=True)
    # The add-ons' images are built for both (KubeRay's operator, NVIDIA's and AWS's device plugins publish
    # linux/amd64 and linux/arm64 in their indexes); the Ray image, an AWS DLC, for amd64 alone.
    both = frozenset({"amd64", "arm64"})
    world.control.platforms.update({"kuberay/operator": both, "k8s-device-plugin": both,
                                    "aws-efa-k8s-device-plugin": both})
    _in_process(world, monkeypatch)
    code = cli.main(["up", "--yes", "--json"])
    out = capsys.readouterr().out
    assert code == 0, failure(out)
    assert events(out)[-1]["data"]["job_status"] == "SUCCEEDED"
    placed = _pods(world)
    assert placed["prepull"] == ["gpu-0", "gpu-1"]  # not arm-gpu, not batch-cpu, not the system node
    assert placed["head"] in (["system-0"], ["batch-cpu"])  # amd64, off the GPU nodes
    assert placed["worker"] == ["gpu-0", "gpu-1"]
    # What rtui schedules says so itself, not by luck of the node order.
    ds = world.cluster.read("DaemonSet", f"{'rtui-ray'}-image-prepull", "rtui")
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux",
                                                             "kubernetes.io/arch": "amd64"}
