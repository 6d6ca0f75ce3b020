"""Issue 23 item 7: on a shared cluster the KubeRay operator rtui installs acts on the run's namespace only.

The real CLI (this checkout) against the emulated API server. The emulator evaluates no Role for the
operator's account (the test plays the operator), so what is checked is what a real API server
would hold afterwards, and that a user who may not write cluster-wide RBAC (as on a shared cluster
where one team owns a namespace) can still bring a run up: the request for a ClusterRole is what
KubeRay's chart avoids with ``singleNamespaceInstall`` (v1.7.0 ``helm-chart/kuberay-operator``).
"""

from __future__ import annotations

from tests.kube.crds import install_shared_crds
from tests.kube.kube_world import KubeWorld, events, failure, gpu_cluster, world

__all__ = ["world"]  # the fixture, imported for pytest


def _operator_args(world: KubeWorld) -> list[str]:
    operator = world.cluster.get("Deployment", "kuberay-operator", "rtui-kuberay")
    assert operator is not None
    return list(operator["spec"]["template"]["spec"]["containers"][0]["args"])


def test_a_user_without_cluster_rbac_rights_gets_an_operator_bound_to_the_run_namespace(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    for verb in ("create", "patch", "update"):
        for resource in ("clusterroles", "clusterrolebindings"):
            world.cluster.forbid(verb, resource)
    up = world.rtui("up", "--yes", "--json", "--until", "kube", timeout=150, check=False)
    assert up.returncode == 0, failure(up.stdout) if events(up.stdout) else up.stderr[-2000:]
    assert [o for o in world.cluster.objects("ClusterRole") + world.cluster.objects("ClusterRoleBinding")
            if "rtui.dev/run" in (o["metadata"].get("labels") or {})] == []
    role = world.cluster.get("Role", "rtui-kuberay-operator", "rtui")
    binding = world.cluster.get("RoleBinding", "rtui-kuberay-operator", "rtui")
    assert role is not None and binding is not None
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberay-operator", "namespace": "rtui-kuberay"}]
    assert _operator_args(world)[-2:] == ["--watch-namespace", "rtui"]
    world.rtui("down", "--yes", timeout=150)
    assert world.labelled() == []


def test_cluster_wide_only_when_asked(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    world.rtui("up", "--yes", "--until", "kube", "--operator-scope", "cluster", timeout=150)
    assert world.cluster.get("ClusterRole", "rtui-kuberay-operator") is not None
    assert world.cluster.get("Role", "rtui-kuberay-operator", "rtui") is None
    assert "--watch-namespace" not in _operator_args(world)
    world.rtui("down", "--yes", "--operator-scope", "cluster", timeout=150)
    assert world.labelled() == []


def test_an_operator_that_watches_other_namespaces_is_named_before_anything_is_applied(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    install_shared_crds(world.cluster)
    world.cluster.add_namespace("team-a")
    labels = {"app.kubernetes.io/name": "kuberay-operator"}
    world.cluster.create({"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": "kuberay-operator", "namespace": "team-a", "labels": labels},
                          "spec": {"selector": {"matchLabels": labels}, "template": {
                              "metadata": {"labels": labels}, "spec": {"containers": [{
                                  "name": "kuberay-operator", "image": "quay.io/kuberay/operator:v1.7.0",
                                  "args": ["--watch-namespace", "team-a"]}]}}}})
    refused = world.rtui("up", "--yes", check=False)
    assert refused.returncode == 2, (refused.stdout[-1500:], refused.stderr[-1500:])
    assert "team-a/kuberay-operator watches only team-a, not rtui" in refused.stdout + refused.stderr
    assert world.labelled() == []
