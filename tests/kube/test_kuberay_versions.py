"""Issue 35 item 2: a KubeRay someone else installed is used only if it can carry rtui's RayCluster.

The double (``kuberay_double``, its docstring cites each release's source) serves the RayCluster CRD of
KubeRay 1.4.2, 1.5.1, 1.6.2 or 1.7.0, prunes what that schema lacks as kube-apiserver does, publishes it
in ``/openapi/v3``, and its operator (``FakeControlPlane.kuberay_version``) adds the auth env as that
release does: 1.5.1 appends its own ``RAY_AUTH_TOKEN`` after whatever the container has.
"""

from __future__ import annotations

import json

import pytest

from tests.kube.fake_control import secret_value
from tests.kube.kmock_ext import ApiError
from tests.kube.kube_world import KubeWorld, events, gpu_cluster, world
from tests.kube.kuberay_double import operator_env, raycluster_crd

__all__ = ["world"]  # the fixture, imported for pytest

NAMESPACE, CLUSTER = "rtui", "rtui-ray"
TOKEN_SECRET = f"{CLUSTER}-ray-token"


def their_kuberay(world: KubeWorld, version: str) -> None:
    """KubeRay ``version`` as a platform team installs it: its RayCluster CRD and its operator in ``kuberay``."""
    world.cluster.install_crd(raycluster_crd(version))
    world.cluster.add_namespace("kuberay")
    labels = {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/version": f"v{version}"}
    world.cluster.create({"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": "kuberay-operator", "namespace": "kuberay", "labels": labels},
                          "spec": {"selector": {"matchLabels": labels}, "template": {
                              "metadata": {"labels": labels}, "spec": {"containers": [{
                                  "name": "kuberay-operator",
                                  "image": f"quay.io/kuberay/operator:v{version}"}]}}}})
    world.control.kuberay_version = version


def one_line_refusal(world: KubeWorld, *args: str) -> str:
    done = world.rtui(*args, check=False)
    out = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, out[-2000:]
    assert "Traceback" not in out and len(out.splitlines()) <= 2, out  # the error and its remedy
    return out


def test_the_double_plays_what_each_release_does_with_rtuis_auth() -> None:
    rtui_env = [{"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": TOKEN_SECRET, "key": "auth_token"}}}]
    auth = {"mode": "token", "secretName": TOKEN_SECRET}
    appended = operator_env("1.5.1", rtui_env, CLUSTER, {"mode": "token"})
    # 1.5.1 appends its own after rtui's: the kubelet keeps the last, the cluster-named Secret's token.
    assert [v["valueFrom"]["secretKeyRef"]["name"] for v in appended if v["name"] == "RAY_AUTH_TOKEN"] == \
        [TOKEN_SECRET, CLUSTER]
    assert operator_env("1.7.0", rtui_env, CLUSTER, auth)[:1] == rtui_env  # kept, nothing added twice
    assert operator_env("1.4.2", [], CLUSTER, auth) == []  # no token auth at all


HEAD_TEMPLATE = {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.58.0"}]}}


def test_the_api_server_drops_what_an_old_crd_lacks(world: KubeWorld) -> None:
    world.cluster.install_crd(raycluster_crd("1.5.1"))
    world.cluster.add_namespace("team-a")
    stored = world.cluster.create({"apiVersion": "ray.io/v1", "kind": "RayCluster",
                                   "metadata": {"name": "c", "namespace": "team-a"},
                                   "spec": {"authOptions": {"mode": "token", "secretName": "s"}, "madeUp": 1,
                                            "headGroupSpec": {"rayStartParams": {}, "template": HEAD_TEMPLATE}}})
    assert stored["spec"] == {"authOptions": {"mode": "token"},
                              "headGroupSpec": {"rayStartParams": {}, "template": HEAD_TEMPLATE}}


def test_the_api_server_refuses_a_raycluster_without_what_its_crd_requires(world: KubeWorld) -> None:
    """KubeRay's CRD requires ``spec.headGroupSpec`` and its ``template``; the API server refuses the object,
    422 Invalid, naming the field. (The emulator once stored it, and the KubeRay double then failed on it
    with KeyError('template') whenever it reconciled before the test ended.)"""
    world.cluster.install_crd(raycluster_crd("1.7.0"))
    world.cluster.add_namespace("team-a")
    with pytest.raises(ApiError) as refused:
        world.cluster.create({"apiVersion": "ray.io/v1", "kind": "RayCluster",
                              "metadata": {"name": "c", "namespace": "team-a"},
                              "spec": {"headGroupSpec": {"rayStartParams": {}}}})
    assert refused.value.code == 422 and refused.value.reason == "Invalid"
    assert 'RayCluster.ray.io "c" is invalid: spec.headGroupSpec.template: Required value' in refused.value.message
    assert world.cluster.get("RayCluster", "c", "team-a") is None


def test_kuberay_1_5_is_refused_in_one_line_at_plan_time_naming_the_minimum(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    their_kuberay(world, "1.5.1")
    out = one_line_refusal(world, "plan")
    assert "1.6.0" in out and "spec.authOptions.secretName" in out, out
    assert world.labelled() == []


def test_kuberay_1_4_is_refused_naming_the_missing_auth_options(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    their_kuberay(world, "1.4.2")
    out = one_line_refusal(world, "plan")
    assert "1.6.0" in out and "spec.authOptions" in out, out


def test_a_user_who_may_not_read_crds_is_refused_from_the_published_openapi(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    their_kuberay(world, "1.5.1")
    world.cluster.forbid("get", "customresourcedefinitions")
    out = one_line_refusal(world, "plan")
    assert "/openapi/v3/apis/ray.io/v1" in out and "spec.authOptions.secretName" in out, out
    assert world.cluster.requests("GET", "/openapi/v3/apis/ray.io/v1"), "the schema was not read from OpenAPI"


def test_an_old_operator_beside_new_crds_is_refused_by_its_version(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    their_kuberay(world, "1.5.1")
    world.cluster.delete("CustomResourceDefinition", "rayclusters.ray.io")
    world.cluster.install_crd(raycluster_crd("1.7.0"))  # CRDs upgraded, the operator not
    out = one_line_refusal(world, "plan")
    assert "kuberay/kuberay-operator is 1.5.1, older than 1.6.0" in out, out


def test_kuberay_1_6_plans(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    their_kuberay(world, "1.6.2")
    plan = json.loads(world.rtui("plan", "--json").stdout)
    assert plan["counts"], plan


def test_with_kuberay_1_7_the_job_runs_on_rtuis_token_set_once_by_the_operator(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    their_kuberay(world, "1.7.0")
    up = world.rtui("up", "--yes", "--json", timeout=180)
    last = events(up.stdout)[-1]
    assert last["kind"] == "done" and last["data"]["job_status"] == "SUCCEEDED", last
    rc = world.cluster.read("RayCluster", CLUSTER, NAMESPACE)
    assert rc["spec"]["authOptions"] == {"mode": "token", "secretName": TOKEN_SECRET}
    groups = [rc["spec"]["headGroupSpec"], *rc["spec"]["workerGroupSpecs"]]
    # rtui leaves the auth env to the operator (KubeRay adds it to the autoscaler and init containers too).
    assert [v["name"] for g in groups for v in g["template"]["spec"]["containers"][0].get("env") or []
            if v["name"].startswith("RAY_AUTH")] == []
    head = world.cluster.read("Pod", f"{CLUSTER}-head-0", NAMESPACE)
    tokens = [v for v in head["spec"]["containers"][0]["env"] if v["name"] == "RAY_AUTH_TOKEN"]
    assert tokens == [{"name": "RAY_AUTH_TOKEN",
                       "valueFrom": {"secretKeyRef": {"name": TOKEN_SECRET, "key": "auth_token"}}}]
    # Ray runs with the token in rtui's Secret, and no request of rtui's carried another (403).
    assert world.head.auth_token == secret_value(world.cluster.read("Secret", TOKEN_SECRET, NAMESPACE), "auth_token")
    assert [s for _, s in world.head.refused if s == 403] == [], world.head.refused
    world.rtui("down", "--yes", timeout=120)
