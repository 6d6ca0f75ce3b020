"""Issue 35 item 1: a namespace-admin token on a shared cluster where the platform team runs KubeRay.

The emulator judges every request by Kubernetes RBAC (``kube_rbac``): the test's own token is in
``system:masters`` (the platform team), the user's is bound to the ``admin`` ClusterRole in ``team-a``
only, which a platform team running KubeRay extends with ``ray.io`` by ClusterRole aggregation. At the
cluster scope kube-apiserver answers that user 403 Forbidden; its access reviews say so beforehand.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kube import kube_rbac
from tests.kube.conftest import TOKEN, KubeCluster
from tests.kube.crds import install_shared_crds
from tests.kube.kube_world import KubeWorld, events, failure, gpu_cluster, make_world

ALICE = "alice-token-0"
TEAM = "team-a"
WRITES = ("POST", "PATCH", "PUT", "DELETE")
REVIEWS = "/apis/authorization.k8s.io/v1/selfsubject"


def shared_cluster(cluster: KubeCluster) -> None:
    """What the platform team made before the user comes: GPU nodes whose plugins run, KubeRay's CRDs and
    operator in its own namespace, the team's namespace and the user's admin binding in it."""
    gpu_cluster(cluster, advertised=True)
    install_shared_crds(cluster)
    labels = {"app.kubernetes.io/name": "kuberay-operator"}
    cluster.add_namespace("ray-system")
    cluster.create({"apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "kuberay-operator", "namespace": "ray-system", "labels": labels},
                    "spec": {"selector": {"matchLabels": labels}, "template": {
                        "metadata": {"labels": labels}, "spec": {"containers": [{
                            "name": "kuberay-operator", "image": "quay.io/kuberay/operator:v1.7.0"}]}}}})
    cluster.set_deployment_available("ray-system", "kuberay-operator")
    cluster.add_namespace(TEAM)
    cluster.create(kube_rbac.ray_user_aggregate())
    cluster.create(kube_rbac.namespace_admin_binding(TEAM, "alice"))
    cluster.require_token(lambda token: token in (TOKEN, ALICE))
    cluster._on_loop(lambda: kube_rbac.install(cluster.kube, {
        TOKEN: kube_rbac.Subject("platform", frozenset({"system:masters", "system:authenticated"})),
        ALICE: kube_rbac.Subject("alice", frozenset({"system:authenticated"}))}))


@pytest.fixture
def team(kube_cluster: KubeCluster, tmp_path: Path) -> Iterator[KubeWorld]:
    """The world, with rtui holding the namespace admin's kubeconfig (its context's namespace: team-a)."""
    for world in make_world(kube_cluster, tmp_path):
        shared_cluster(kube_cluster)
        kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "alice.kubeconfig", user={"token": ALICE},
                                                   namespace=TEAM)
        world.env["KUBECONFIG"] = str(kubeconfig)
        yield world


def _ask(cluster: KubeCluster, token: str, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    context = ssl.create_default_context(cadata=cluster.ca_pem.decode())
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(cluster.url + path, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _can(cluster: KubeCluster, verb: str, resource: str, group: str = "", namespace: str | None = None) -> bool:
    status, review = _ask(cluster, ALICE, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "group": group,
                                        **({"namespace": namespace} if namespace else {})}}})
    assert status == 201, review
    return bool(review["status"]["allowed"])


def test_the_emulator_judges_a_namespace_admin_as_kube_apiserver_does(kube_cluster: KubeCluster) -> None:
    shared_cluster(kube_cluster)
    # The cluster scope: 403 with the RBAC authorizer's message and the Status details of NewForbidden.
    status, body = _ask(kube_cluster, ALICE, "GET", "/apis/apps/v1/daemonsets")
    assert status == 403 and body["reason"] == "Forbidden" and body["details"] == {"kind": "daemonsets",
                                                                                   "group": "apps"}
    assert body["message"] == ('daemonsets.apps is forbidden: User "alice" cannot list resource "daemonsets" in '
                               'API group "apps" at the cluster scope')
    assert _ask(kube_cluster, ALICE, "GET", "/api/v1/nodes")[0] == 403
    assert _ask(kube_cluster, ALICE, "GET", "/api/v1/namespaces/default/endpoints/kubernetes")[0] == 403
    # Its own namespace: everything namespaced, its Namespace object to read, ray.io by aggregation.
    assert _ask(kube_cluster, ALICE, "GET", f"/apis/apps/v1/namespaces/{TEAM}/daemonsets")[0] == 200
    assert _ask(kube_cluster, ALICE, "GET", f"/api/v1/namespaces/{TEAM}")[0] == 200
    assert _ask(kube_cluster, ALICE, "GET", f"/apis/ray.io/v1/namespaces/{TEAM}/rayclusters")[0] == 200
    assert _ask(kube_cluster, ALICE, "DELETE", f"/api/v1/namespaces/{TEAM}")[0] == 403
    assert _ask(kube_cluster, ALICE, "GET", "/api/v1/namespaces/ray-system/pods")[0] == 403
    # The platform's token (system:masters) may do anything.
    assert _ask(kube_cluster, TOKEN, "GET", "/api/v1/nodes")[0] == 200
    # The access reviews say the same before any request is made.
    assert not _can(kube_cluster, "list", "nodes")
    assert not _can(kube_cluster, "list", "customresourcedefinitions", "apiextensions.k8s.io")
    assert _can(kube_cluster, "create", "pods", namespace=TEAM)
    assert _can(kube_cluster, "create", "rayclusters", "ray.io", namespace=TEAM)
    assert not _can(kube_cluster, "create", "pods", namespace="default")
    status, rules = _ask(kube_cluster, ALICE, "POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": TEAM}})
    assert status == 201 and rules["status"]["incomplete"] is False
    assert any("ray.io" in r["apiGroups"] and "rayclusters" in r["resources"] for r in rules["status"]["resourceRules"])
    status, rules = _ask(kube_cluster, ALICE, "POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": "default"}})
    assert not any("pods" in r["resources"] for r in rules["status"]["resourceRules"])


def _writes(cluster: KubeCluster) -> list[str]:
    return [f"{r.method} {r.path}" for r in cluster.requests() if r.method in WRITES
            and not r.path.startswith(REVIEWS) and r.authorization == ALICE]


# The KubeRay version check (kuberay_version.py, issue 35 item 2) tries these two reads and falls back on a
# 403 (to the API server's OpenAPI; to no operator): tolerated here until it asks rights.py first.
TRIED_BY_THE_VERSION_CHECK = {"GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayclusters.ray.io",
                              "GET /apis/apps/v1/deployments"}


def _refused(cluster: KubeCluster) -> list[str]:
    """The user's requests the API server refused (403), but for the version check's two tries."""
    return [f"{r.method} {r.path}" for r in cluster.requests() if r.status == 403 and r.authorization == ALICE
            and f"{r.method} {r.path}" not in TRIED_BY_THE_VERSION_CHECK]


def test_plan_with_namespace_rights_uses_the_clusters_kuberay_and_writes_nothing(team: KubeWorld) -> None:
    done = team.rtui("plan", "--json", "--namespace", TEAM, check=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    plan = json.loads(done.stdout)
    addresses = {c["address"] for c in plan["changes"]}
    assert not addresses & {"kube.device-plugin.nvidia", "kube.device-plugin.efa", "kube.kuberay-operator"}, addresses
    namespace = next(c for c in plan["changes"] if c["address"] == "kube.namespace")
    assert namespace["action"] == "noop", namespace  # adopted: the user's, as it is
    # The plan says which mode and why, and what it could not see, in its notes.
    notes = [ln for ln in team.rtui("plan", "--namespace", TEAM).stdout.splitlines() if ln.startswith("Note:")]
    assert any("namespace-only" in n and "list nodes" in n for n in notes), notes
    assert any("ray.io/v1" in n for n in notes) and any("device plugins" in n for n in notes), notes
    assert _writes(team.cluster) == []
    # Nothing cluster-wide was asked for after the access review said it is not allowed.
    assert _refused(team.cluster) == []


def test_check_says_which_mode_and_why(team: KubeWorld) -> None:
    done = team.rtui("check", "--namespace", TEAM, check=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    line = next(ln for ln in done.stdout.splitlines() if "namespace-only" in ln)
    assert "list nodes" in line and TEAM in line, line


def test_up_runs_a_job_and_down_leaves_the_namespace(team: KubeWorld) -> None:
    up = team.rtui("up", "--yes", "--json", "--namespace", TEAM, timeout=180, check=False)
    assert up.returncode == 0, failure(up.stdout) if events(up.stdout) else up.stderr[-2000:]
    last = events(up.stdout)[-1]
    assert last["kind"] == "done" and last["data"]["job_status"] == "SUCCEEDED", last
    assert team.cluster.get("RayCluster", "rtui-ray", TEAM) is not None
    assert [o for o in team.cluster.objects("DaemonSet") + team.cluster.objects("Deployment")
            if o["metadata"]["namespace"] != TEAM and "rtui.dev/run" in (o["metadata"].get("labels") or {})] == []
    assert _refused(team.cluster) == []

    team.rtui("down", "--yes", "--namespace", TEAM, timeout=180)
    assert team.labelled() == []
    namespace = team.cluster.get("Namespace", TEAM)
    assert namespace is not None and team.cluster.get("RoleBinding", "alice-admin", TEAM) is not None
    assert team.cluster.get("Deployment", "kuberay-operator", "ray-system") is not None
    assert team.cluster.get("CustomResourceDefinition", "rayclusters.ray.io") is not None
