"""The kube target on a fresh cluster (issue 19, item 1): KubeRay's CRDs are not there yet.

A real API server answers a ray.io resource before its CRD exists, or before the CRD is
Established, with the NotFound handler's Status (404, no details); the emulator does the same
(kmock_ext.RtuiKube._kind), so rtui's discovery, plan, up and down are tested against it.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.kube.conftest import KubeCluster
from tests.kube.crds import load_yaml
from tests.kube.kmock_ext import NOT_SERVED
from tests.kube.kube_world import KubeWorld, events, gpu_cluster, wait_until, world

__all__ = ["world"]  # the fixture, imported for pytest

RAY_PATH = "/apis/ray.io/v1/namespaces/default/rayclusters"


def _get(cluster: KubeCluster, path: str) -> tuple[int, dict[str, Any]]:
    context = ssl.create_default_context(cadata=cluster.ca_pem.decode())
    request = urllib.request.Request(cluster.url + path, headers={"Authorization": f"Bearer {cluster.token}"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:  # noqa: S310 (loopback)
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_emulator_answers_ray_io_like_kube_apiserver_until_the_crd_is_established(
        kube_cluster: KubeCluster) -> None:
    unserved = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "message": NOT_SERVED, "reason": "NotFound", "code": 404}
    assert _get(kube_cluster, RAY_PATH) == (404, unserved)  # no details key at all, as the real one
    assert _get(kube_cluster, "/apis/ray.io/v1") == (404, unserved)
    groups = _get(kube_cluster, "/apis")[1]["groups"]
    assert "ray.io" not in {g["name"] for g in groups}

    kube_cluster.establish_after(0.5)
    shared = Path(__file__).resolve().parents[2].parent / "shared" / "schemas" / "kuberay"
    crd = load_yaml(shared / "ray.io_rayclusters.yaml")
    kube_cluster.create(crd)
    assert _get(kube_cluster, RAY_PATH) == (404, unserved)  # created, not yet Established
    wait_until("the CRD to be Established", lambda: _get(kube_cluster, RAY_PATH)[0] == 200, timeout=30)
    status, body = _get(kube_cluster, RAY_PATH)
    assert status == 200 and body["kind"] == "RayClusterList" and body["items"] == []
    conditions = {c["type"]: c["status"] for c in
                  kube_cluster.read("CustomResourceDefinition", "rayclusters.ray.io")["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert "ray.io" in {g["name"] for g in _get(kube_cluster, "/apis")[1]["groups"]}
    # A missing object of a served kind is another 404: one that names it.
    status, body = _get(kube_cluster, RAY_PATH + "/nope")
    assert status == 404 and body["details"]["name"] == "nope"


def test_a_fresh_cluster_plans_applies_and_tears_down_through_the_cli(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    world.cluster.establish_after(3.0)  # longer than the operator takes: a call made without waiting fails
    plan = json.loads(world.rtui("plan", "--json").stdout)
    actions = {c["address"]: c["action"] for c in plan["changes"]}
    assert actions["kube.kuberay-operator"] == "create" and actions["kube.raycluster"] == "create", actions

    up = world.rtui("up", "--yes", "--json", "--until", "kube.raycluster", timeout=120)
    assert events(up.stdout)[-1]["kind"] == "done", up.stdout[-2000:]
    assert world.cluster.get("RayCluster", "rtui-ray", "rtui") is not None
    # Once rtui applied the CRDs, it made no call on their kinds before the server served them.
    served = world.cluster.requests()
    first_crd = next(i for i, r in enumerate(served)
                     if "/customresourcedefinitions/" in r.path and r.method == "PATCH")
    assert any(r.message == NOT_SERVED for r in served[:first_crd])  # discovery met the fresh cluster
    early = [(r.method, r.path) for r in served[first_crd:] if "/apis/ray.io/" in r.path and r.message == NOT_SERVED]
    assert early == [], early

    world.rtui("down", "--yes", timeout=120)
    assert world.labelled() == []


def test_down_on_a_cluster_that_never_had_the_crds(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    world.rtui("up", "--yes", "--until", "kube.namespace", timeout=60)
    assert world.cluster.get("CustomResourceDefinition", "rayclusters.ray.io") is None
    status = world.rtui("status", "--json")
    assert "Traceback" not in status.stderr
    down = world.rtui("down", "--yes", timeout=60)
    assert "Traceback" not in down.stdout + down.stderr
    assert world.labelled() == []
