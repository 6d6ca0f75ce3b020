"""The emulator's Deployment controller is no kinder than Kubernetes': Available only when its pods
can be scheduled and pulled (tests/kube/fake_deployments.py cites the references)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.eventually import eventually as wait_on
from tests.kube.conftest import KubeCluster
from tests.kube.fake_control import FakeControlPlane
from tests.kube.fake_registry import FakeRegistry

Obj = dict[str, Any]
TAINT = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}


def deployment(name: str, image: str = "registry.k8s.io/pause:3.10", **pod: Any) -> Obj:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "kube-system", "generation": 1},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": name, "image": image, "resources": {
                                      "requests": {"cpu": "100m", "memory": "300Mi"}}}], **pod}}}}


def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """``tests.eventually.eventually``, naming the condition by its line in this file."""
    return wait_on(f"the condition at line {check.__code__.co_firstlineno}", check, timeout)


def available(cluster: KubeCluster, name: str) -> Obj:
    """The Deployment's Available condition, {} before the controller wrote one."""
    conditions = {c["type"]: c for c in (cluster.read("Deployment", name, "kube-system").get("status") or {}).get(
        "conditions") or []}
    return conditions.get("Available") or {}


def pods_of(cluster: KubeCluster, name: str) -> list[Obj]:
    return [p for p in cluster.objects("Pod", "kube-system") if p["metadata"]["labels"].get("app") == name]


def test_a_pod_that_tolerates_nothing_on_a_tainted_node_leaves_the_deployment_unavailable(
        kube_cluster: KubeCluster) -> None:
    kube_cluster.add_node("system-0", gpus=0, efa=0, taints=[TAINT])
    kube_cluster.create(deployment("picky"))
    kube_cluster.create(deployment("tolerant", tolerations=[{"key": "dedicated", "operator": "Exists"}]))
    with FakeControlPlane(kube_cluster):
        eventually(lambda: available(kube_cluster, "tolerant").get("status") == "True")
        condition = eventually(lambda: available(kube_cluster, "picky"))
        assert condition["status"] == "False" and condition["reason"] == "MinimumReplicasUnavailable"
        (pod,) = pods_of(kube_cluster, "picky")
        scheduled = eventually(lambda: next((c for c in (kube_cluster.read("Pod", pod["metadata"]["name"],
                                                                              "kube-system").get("status") or {})
                                             .get("conditions") or [] if c["type"] == "PodScheduled"), None))
        assert scheduled["status"] == "False"
        assert "1 node(s) had untolerated taint {dedicated: infra}" in scheduled["message"]
    assert available(kube_cluster, "picky")["status"] == "False"


def test_a_node_selector_no_node_matches_and_an_unpullable_image_leave_it_unavailable(
        kube_cluster: KubeCluster) -> None:
    kube_cluster.add_node("system-0", gpus=0, efa=0)
    with FakeRegistry() as registry:
        kube_cluster.create(deployment("nowhere", nodeSelector={"role": "system"}))
        kube_cluster.create(deployment("missing", image=f"{registry.host}/autoscaling/cluster-autoscaler:v9"))
        kube_cluster.create(deployment("there", image=f"{registry.host}/kuberay/operator:v1.7.0"))
        with FakeControlPlane(kube_cluster, registry=registry) as control:
            eventually(lambda: available(kube_cluster, "there").get("status") == "True")
            eventually(lambda: available(kube_cluster, "nowhere") and available(kube_cluster, "missing"))
            control.settled()  # another whole pass: still not Available
            assert available(kube_cluster, "nowhere")["status"] == "False"
            assert available(kube_cluster, "missing")["status"] == "False"
            (pod,) = pods_of(kube_cluster, "missing")
            waiting = eventually(lambda: (kube_cluster.read("Pod", pod["metadata"]["name"], "kube-system")
                                          .get("status") or {}).get("containerStatuses"))
            assert waiting[0]["state"]["waiting"]["reason"] == "ImagePullBackOff"
            # The Deployment's pods go with it (the garbage collector).
            kube_cluster.delete("Deployment", "there", "kube-system")
            eventually(lambda: not pods_of(kube_cluster, "there"))


def test_a_pod_placed_once_a_node_joins_runs_and_the_deployment_becomes_available(kube_cluster: KubeCluster) -> None:
    kube_cluster.create(deployment("waiting", nodeSelector={"role": "system"}))
    with FakeControlPlane(kube_cluster):
        eventually(lambda: available(kube_cluster, "waiting").get("status") == "False")
        kube_cluster.add_node("system-0", gpus=0, efa=0, labels={"role": "system"})
        eventually(lambda: available(kube_cluster, "waiting").get("status") == "True")
        (pod,) = pods_of(kube_cluster, "waiting")
        assert pod["spec"]["nodeName"] == "system-0"
        assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["PodScheduled"] == "True"
