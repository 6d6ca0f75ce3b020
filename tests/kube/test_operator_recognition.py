"""Issue 35 item 8: a KubeRay operator is recognised by what KubeRay's own manifests put on it, not only by
an image path ending ``kuberay/operator``.

Platform teams mirror images (``registry.corp/ray/kuberay-operator:v1.6.0``) or rename them; what stays is
what KubeRay's manifests set on the Deployment (checked in ray-project/kuberay):
- ``helm-chart/kuberay-operator/templates/deployment.yaml``: pod template labels
  ``app.kubernetes.io/name: <chart name>`` (``kuberay-operator``) and ``app.kubernetes.io/component:
  kuberay-operator``; the container is named after the chart (``kuberay-operator``) and runs ``/manager``
  with ``--watch-namespace`` when it watches some namespaces only;
- ``ray-operator/config/manager/manager.yaml`` (kustomize): labels ``app.kubernetes.io/name: kuberay``,
  ``app.kubernetes.io/component: kuberay-operator``, container ``kuberay-operator``, command ``/manager``.
A mirrored operator missed by discovery means rtui installs a second controller beside it (two operators
reconcile every RayCluster), skips its watched-namespace check and its version check.
"""

from __future__ import annotations

from typing import Any

from targets.kube import addons, kuberay_version
from tests.kube.crds import install_shared_crds
from tests.kube.kube_world import KubeWorld, gpu_cluster, world
from tests.kube.kuberay_double import raycluster_crd

__all__ = ["world"]  # the fixture, imported for pytest

MIRROR = "registry.corp/ray/kuberay-operator"


def chart_operator(image: str, *, namespace: str = "team-a", version: str | None = None,
                   args: list[str] | None = None, chart_labels: bool = True) -> dict[str, Any]:
    """A Deployment as KubeRay's chart renders it, with its image mirrored to ``image``."""
    labels = {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/instance": "kuberay"}
    template = {**labels, "app.kubernetes.io/component": "kuberay-operator"} if chart_labels else {}
    meta_labels = {**(labels if chart_labels else {}), **({"app.kubernetes.io/version": version} if version else {})}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "kuberay-operator", "namespace": namespace, "labels": meta_labels},
            "spec": {"selector": {"matchLabels": template or {"app": "op"}}, "template": {
                "metadata": {"labels": template or {"app": "op"}},
                "spec": {"containers": [{"name": "kuberay-operator", "image": image, "command": ["/manager"],
                                         "args": args or []}]}}}}


def test_a_mirrored_operator_is_found_by_the_charts_labels() -> None:
    crds = [raycluster_crd("1.7.0")]
    mirrored = chart_operator(f"{MIRROR}:v1.6.0", args=["--watch-namespace", "team-a"])
    assert addons.find_kuberay_operator([mirrored], crds) is mirrored
    assert addons.kuberay_operators([mirrored]) == [mirrored]
    assert addons.watched_namespaces(mirrored) == ["team-a"]
    assert kuberay_version.operator_release(mirrored) == "1.6.0"


def test_a_renamed_operator_without_labels_is_found_by_its_container_and_binary() -> None:
    renamed = chart_operator("mirror.example/platform/ray-controller:v1.6.2", chart_labels=False)
    assert addons.kuberay_operators([renamed]) == [renamed]
    # A container of that name that is not KubeRay's manager binary is not taken for the operator.
    other = chart_operator("quay.io/prometheus/prometheus:v3.0.0", chart_labels=False)
    other["spec"]["template"]["spec"]["containers"][0].pop("command")
    assert addons.kuberay_operators([other]) == []


def test_a_mirrored_operator_watching_another_namespace_is_named_before_anything_is_applied(
        world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    install_shared_crds(world.cluster)
    world.cluster.add_namespace("team-a")
    world.cluster.create(chart_operator(f"{MIRROR}:v1.7.0", args=["--watch-namespace", "team-a"]))
    refused = world.rtui("up", "--yes", check=False)
    assert refused.returncode == 2, (refused.stdout[-1500:], refused.stderr[-1500:])
    assert "team-a/kuberay-operator watches only team-a, not rtui" in refused.stdout + refused.stderr
    assert world.labelled() == []


def test_an_old_mirrored_operator_is_refused_by_its_version(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    world.cluster.install_crd(raycluster_crd("1.7.0"))  # CRDs upgraded, the mirrored operator not
    world.cluster.add_namespace("kuberay")
    world.cluster.create(chart_operator(f"{MIRROR}:v1.5.1", namespace="kuberay"))
    done = world.rtui("plan", check=False)
    out = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, out[-2000:]
    assert "kuberay/kuberay-operator is 1.5.1, older than 1.6.0" in out, out
