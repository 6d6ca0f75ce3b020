"""Shared things stay shared (issue 19, item 4): CRDs, the operator and the device plugins.

Through the CLI against the emulator, which deletes every object of a CRD's kind with the CRD
(as the real cleanup finalizer does) and stops advertising a device once its plugin is gone.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.kube.crds import load_yaml
from tests.kube.kube_world import RUN_LABEL, KubeWorld, events, gpu_cluster, world

__all__ = ["world"]  # the fixture, imported for pytest

CRDS = ("rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io")
OPERATOR = ("Deployment", "kuberay-operator", "rtui-kuberay")
PLUGINS = (("DaemonSet", "rtui-nvidia-device-plugin", "kube-system"), ("DaemonSet", "rtui-efa-device-plugin",
                                                                       "kube-system"))


def _their_crds(world: KubeWorld) -> None:
    """KubeRay's CRDs left by a Helm release (Helm never deletes CRDs), no operator running."""
    for path in sorted(Path(world.env["RTUI_KUBERAY_CRDS"]).glob("ray.io_*.yaml")):
        crd = load_yaml(path)
        crd["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "Helm"}
        world.cluster.install_crd(crd)


def _versions(world: KubeWorld, *objects: tuple[str, str, str | None]) -> dict[str, str]:
    return {f"{k}/{n}": ((world.cluster.get(k, n, ns) or {}).get("metadata") or {}).get("resourceVersion", "gone")
            for k, n, ns in objects}


def test_crds_someone_else_installed_and_another_teams_rayjob_survive_up_and_down(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    _their_crds(world)
    world.cluster.add_namespace("team-b")
    world.cluster.create({"apiVersion": "ray.io/v1", "kind": "RayJob",
                          "metadata": {"name": "nightly", "namespace": "team-b"}, "spec": {"entrypoint": "x"}})
    theirs = (*(("CustomResourceDefinition", n, None) for n in CRDS), ("RayJob", "nightly", "team-b"))
    before = _versions(world, *theirs)

    up = world.rtui("up", "--yes", "--json", "--until", "kube.raycluster", timeout=120)
    assert events(up.stdout)[-1]["kind"] == "done", up.stdout[-2000:]
    assert world.cluster.get(*OPERATOR) is not None  # rtui ran its own operator against their CRDs
    assert _versions(world, *theirs) == before  # never applied over, never relabelled
    for name in CRDS:
        assert RUN_LABEL not in world.cluster.read("CustomResourceDefinition", name)["metadata"]["labels"]

    world.rtui("down", "--yes", timeout=120)
    assert _versions(world, *theirs) == before  # the CRDs and the other team's RayJob are still there
    assert world.labelled() == []


def test_two_runs_share_the_operator_and_plugins_and_the_last_one_out_removes_them(
        world: KubeWorld, tmp_path: Path) -> None:
    gpu_cluster(world.cluster)
    until = ("--until", "kube.gpu-workers")  # each run holds one GPU node
    second = {**world.env, "RTUI_STATE_DIR": str(tmp_path / "state-b")}
    # One operator for both namespaces: the first run installs it cluster-wide (by default it would
    # watch only the first run's namespace, and the second run's preflight says so).
    a = ["--gpu-node-count", "1", "--operator-scope", "cluster"]
    b = [*a, "--namespace", "team-b", "--cluster-name", "ray-b"]
    world.rtui("up", "--yes", *a, *until, timeout=120)
    plan = json.loads(world.rtui("plan", "--json", *b, env=second).stdout)
    shared = {c["address"]: c for c in plan["changes"] if c["address"] in (
        "kube.kuberay-operator", "kube.device-plugin.nvidia", "kube.device-plugin.efa")}
    assert {c["action"] for c in shared.values()} == {"noop"}, shared
    world.rtui("up", "--yes", *b, *until, timeout=120, env=second)
    assert world.cluster.get("RayCluster", "ray-b", "team-b") is not None

    world.rtui("down", "--yes", timeout=120)  # the first run goes: the second one's RayCluster still needs them
    assert world.cluster.get("RayCluster", "rtui-ray", "rtui") is None
    kept = _versions(world, OPERATOR, *PLUGINS, *(("CustomResourceDefinition", n, None) for n in CRDS))
    assert "gone" not in kept.values(), kept

    world.rtui("down", "--yes", *b, timeout=120, env=second)  # the last one out removes them
    assert set(_versions(world, OPERATOR, *PLUGINS, *(("CustomResourceDefinition", n, None)
                                                      for n in CRDS)).values()) == {"gone"}
    assert world.labelled() == []


def test_gpu_nodes_that_already_advertise_gpus_get_no_plugin_of_rtuis(world: KubeWorld) -> None:
    """GKE's plugin, the GPU Operator's under another image, a Helm release: whatever makes the GPUs
    allocatable counts, seen on the nodes themselves."""
    gpu_cluster(world.cluster, advertised=True)
    plan = json.loads(world.rtui("plan", "--json").stdout)
    changes = {c["address"]: c for c in plan["changes"]}
    for address, resource in (("kube.device-plugin.nvidia", "nvidia.com/gpu"),
                              ("kube.device-plugin.efa", "vpc.amazonaws.com/efa")):
        assert changes[address]["action"] == "noop" and resource in changes[address]["reason"], changes[address]
    world.rtui("up", "--yes", "--until", "kube.gpu-workers", timeout=120)
    assert not [d["metadata"]["name"] for d in world.cluster.objects("DaemonSet") if "plugin" in d["metadata"]["name"]]
    world.rtui("down", "--yes", timeout=120)
    assert world.labelled() == []


def test_rtuis_crds_stay_while_another_teams_rayjob_uses_them(world: KubeWorld) -> None:
    """Deleting a CRD deletes every object of its kind: a RayJob left anywhere keeps all of them."""
    gpu_cluster(world.cluster)
    world.rtui("up", "--yes", "--until", "kube.raycluster", timeout=120)
    world.cluster.add_namespace("team-b")
    world.cluster.create({"apiVersion": "ray.io/v1", "kind": "RayJob",
                          "metadata": {"name": "nightly", "namespace": "team-b"}, "spec": {"entrypoint": "x"}})
    down = world.rtui("down", "--yes", timeout=120)
    assert "RayJob team-b/nightly" in down.stdout, down.stdout[-2000:]
    assert world.cluster.get("RayJob", "nightly", "team-b") is not None
    assert {c["metadata"]["name"] for c in world.cluster.objects("CustomResourceDefinition")} == set(CRDS)
    assert world.cluster.get(*OPERATOR) is None  # no RayCluster is left to use the operator
