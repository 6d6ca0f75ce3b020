"""Issue 23 item 7, second half: ``--access-scope namespace`` on the aws target, end to end against the
AWS double and the Kubernetes emulator authorizing each request as EKS does (``tests.aws.eks_authz``),
with the test as the cluster's controllers (``tests.kube.fake_control``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backend.errors import UserError
from backend.ledger import ResourceStatus
from backend.resources import Action
from targets.aws.config import AwsConfig
from targets.aws.infra.access_scope import ACCESS_SCOPE, AccessScopeHandler
from targets.kube.cluster_api import cluster_api
from tests.aws.conftest import EksKube, World
from tests.aws.provision_world import down, eks, session_for, tagged, up
from tests.kube.conftest import KubeCluster
from tests.kube.crds import crd_dir
from tests.kube.fake_ray import FakeRayHead

pytestmark = pytest.mark.usefixtures("fast_backoff")

CLUSTER_ADMIN = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
ADMIN = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSAdminPolicy"


def secret(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "probe", "namespace": namespace}}


def policies() -> dict[str, dict[str, Any]]:
    (who,) = eks().list_access_entries(clusterName="rtui-ray")["accessEntries"]
    listed = eks().list_associated_access_policies(clusterName="rtui-ray", principalArn=who)
    return {p["policyArn"]: p["accessScope"] for p in listed["associatedAccessPolicies"]}


@pytest.fixture
def ray_head() -> Any:
    head = FakeRayHead(steps=3).start()
    yield head
    head.stop()


@pytest.fixture
def narrowed_world(eks_kube: EksKube, eks_authz: KubeCluster, ray_head: FakeRayHead, tmp_path: Path) -> Any:
    """The aws world's own control plane (``eks_kube``: nodes join as their nodegroups turn active)
    leads the head's dashboard to the Ray head double."""
    eks_kube.control.jobs_url = ray_head.url
    yield crd_dir(tmp_path)
    assert not eks_kube.control.errors, eks_kube.control.errors[:3]


@pytest.mark.slow
async def test_namespace_scope_narrows_after_the_installs_and_down_restores_first(
        world: World, eks_authz: KubeCluster, narrowed_world: Path) -> None:
    session = session_for(access_scope="namespace", kuberay_crds=str(narrowed_world))
    plan = await session.plan()
    (change,) = [c for c in plan.changes if c.address == ACCESS_SCOPE]
    # After everything that needs cluster admin to install, and shown as what it leaves.
    assert set(change.depends_on) >= {"aws.access-entry.admin", "aws.cluster-autoscaler", "kube.namespace",
                                      "kube.device-plugin.nvidia", "kube.kuberay-operator"}
    assert change.after == {"scope": "namespace", "namespaces": ["rtui"], "policy": "AmazonEKSAdminPolicy",
                            "group": "rtui-rtui-ray-caller"}
    assert any(n.startswith("access scope:") for n in plan.notes)

    made = await up(session, until=ACCESS_SCOPE)
    assert made.ok, made.failures()
    assert policies() == {ADMIN: {"type": "namespace", "namespaces": ["rtui"]}}
    # Nothing rtui did was refused: each cluster-wide write came before the narrowing.
    assert [s.path for s in eks_authz.requests() if s.status == 403] == []
    # The caller's own client is now refused anything cluster-wide or in another namespace, not in its own.
    api = await cluster_api(session.ctx)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "x"},
            "rules": []}
    for obj in (role, secret("kube-system")):
        with pytest.raises(UserError, match="forbidden"):
            await api.apply(obj)
    with pytest.raises(UserError, match="forbidden"):
        await api.delete("v1", "Namespace", "rtui")
    await api.apply(secret("rtui"))
    await api.delete("v1", "Secret", "probe", "rtui")
    assert await api.get("ray.io/v1", "RayCluster", "rtui-ray", "rtui") is None  # asked, not refused (the Role)

    # A second plan sees what the first made through the narrowed access (reads granted by RBAC): no-op.
    made_here = {a for a, r in session.record.resources.items() if r.status is ResourceStatus.READY}
    assert {ACCESS_SCOPE, "kube.namespace", "kube.kuberay-operator", "aws.cluster-autoscaler"} <= made_here
    again = await session.plan()
    changed = [(c.address, c.action, c.reason) for c in again.changes
               if c.address in made_here and c.action is not Action.NOOP]
    assert changed == []

    # Made cluster admin again by hand (README: to change a cluster-wide install): the next up narrows again.
    (who,) = eks().list_access_entries(clusterName="rtui-ray")["accessEntries"]
    eks().associate_access_policy(clusterName="rtui-ray", principalArn=who, policyArn=CLUSTER_ADMIN,
                                  accessScope={"type": "cluster"})
    widened = await session.plan()
    assert [(c.action, c.reason) for c in widened.changes if c.address == ACCESS_SCOPE] == \
        [(Action.REPLACE, "half narrowed: cluster admin still associated")]
    assert (await up(session, until=ACCESS_SCOPE)).ok
    assert policies() == {ADMIN: {"type": "namespace", "namespaces": ["rtui"]}}

    before = len(eks_authz.requests())
    gone = await down(session)
    assert gone.ok, gone.failures()
    assert [s.path for s in eks_authz.requests()[before:] if s.status == 403] == []
    assert tagged(session.run_id) == {}
    # Restoring came before every deletion of a cluster-wide object.
    done = [e.step for e in gone.events if e.kind.value == "done"]
    assert done.index(ACCESS_SCOPE) < min(done.index(a) for a in ("kube.namespace", "kube.kuberay-operator",
                                                                   "aws.cluster-autoscaler"))


@pytest.mark.slow
async def test_a_down_that_crashed_between_restoring_and_cleaning_up_is_finished_by_the_next(
        world: World, eks_authz: KubeCluster, narrowed_world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = session_for(access_scope="namespace", kuberay_crds=str(narrowed_world))
    assert (await up(session, until=ACCESS_SCOPE)).ok

    real_delete = AccessScopeHandler.delete

    async def crash_after_the_first_call(self: AccessScopeHandler, ctx: Any, have: Any) -> Any:
        async for p in real_delete(self, ctx, have):
            yield p
            raise RuntimeError("killed mid-restore")

    monkeypatch.setattr(AccessScopeHandler, "delete", crash_after_the_first_call)
    crashed = await down(session)
    assert not crashed.ok
    # Cluster admin is back, the namespaced policy still there: the next down finds it again.
    assert policies() == {ADMIN: {"type": "namespace", "namespaces": ["rtui"]},
                          CLUSTER_ADMIN: {"type": "cluster", "namespaces": []}}
    monkeypatch.setattr(AccessScopeHandler, "delete", real_delete)
    again = await down(session)
    assert again.ok, again.failures()
    assert tagged(session.run_id) == {}


async def test_the_default_scope_plans_no_narrowing(world: World, kube_file: Path) -> None:
    session = session_for()
    plan = await session.plan()
    assert AwsConfig.of(session.config).access_scope == "cluster"
    assert ACCESS_SCOPE not in {c.address for c in plan.changes}
    assert not [n for n in plan.notes if n.startswith("access scope:")]


@pytest.mark.slow
async def test_the_namespaced_rest_of_the_cluster_is_made_by_the_narrowed_caller(
        world: World, eks_authz: KubeCluster, narrowed_world: Path, ray_head: FakeRayHead) -> None:
    session = session_for(access_scope="namespace", kuberay_crds=str(narrowed_world))
    assert (await up(session, until=ACCESS_SCOPE)).ok
    before = len(eks_authz.requests())
    # The secrets, the NetworkPolicy (it reads the API server's Endpoints in default), the prepull, the
    # RayCluster and its workers: all after the narrowing, none refused.
    rest = await up(session, until=None)  # and the job, through the API server's service proxy
    assert rest.ok, rest.failures()
    assert ray_head.jobs, "no job reached the Ray head"
    assert [s.path for s in eks_authz.requests()[before:] if s.status == 403] == []
    assert eks_authz.get("RayCluster", "rtui-ray", "rtui") is not None
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
    # Nothing of the grants is left: no role or binding of this run, anywhere.
    kinds = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    left = [(kind, o["metadata"]["name"]) for kind in kinds for o in eks_authz.objects(kind)
            if (o["metadata"].get("labels") or {}).get("rtui.dev/run") == session.run_id]
    assert left == []
