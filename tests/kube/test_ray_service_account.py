"""The Ray pods' own ServiceAccount (issue 25, aws): made in the run's namespace with the run's labels,
found again by discovery, never taken when another run's, removed by teardown. Against the Kubernetes
emulator over real HTTP (the official client)."""

from __future__ import annotations

from pathlib import Path

from backend.ledger import ResourceStatus
from backend.resolve import resolve_config
from backend.resources import Resource
from backend.session import RunSession
from backend.store import RunStore
from targets.kube import manifests
from targets.kube.config import KubeConfig
from targets.kube.manifests import service_account
from targets.kube.serviceaccount import SERVICE_ACCOUNT, ServiceAccountHandler
from tests.kube.conftest import KubeCluster


def session_for(tmp_path: Path) -> RunSession:
    config = resolve_config({"target": "kube"}, environ={}).config
    store = RunStore(tmp_path / "state")
    return RunSession(store, store.create(config), config)


async def test_the_account_is_made_found_and_removed_as_this_runs(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    session = session_for(tmp_path)
    handler = ServiceAccountHandler()
    api = handler.api(session.ctx)
    await api.apply(manifests.namespace(KubeConfig.of(session.config), session.run_id))
    assert await handler.observe(api, session.ctx) is None

    want = Resource(address=SERVICE_ACCOUNT, layer="kube", kind=handler.kind, spec={"name": "rtui-ray"})
    # As the planner does before create:
    session.ctx.ledger.set(SERVICE_ACCOUNT, handler.kind, ResourceStatus.INTENDED, layer="kube")
    async for _ in handler.create(session.ctx, want):
        pass
    live = await api.get("v1", "ServiceAccount", "rtui-ray", KubeConfig.of(session.config).namespace)
    assert live is not None and live["metadata"]["labels"]["rtui.dev/run"] == session.run_id
    # No token unless a pod asks: only the head does, on its pod spec, for KubeRay's autoscaler sidecar
    # (idle scaling), which talks to the API as the head pod's account (issue 33).
    assert live["automountServiceAccountToken"] is False
    found = await handler.observe(api, session.ctx)
    assert found is not None and found.id == f"{KubeConfig.of(session.config).namespace}/rtui-ray"
    assert found.state == {"name": "rtui-ray"}

    async for _ in handler.delete(session.ctx, found):
        pass
    assert await api.get("v1", "ServiceAccount", "rtui-ray", KubeConfig.of(session.config).namespace) is None
    session.close()


async def test_another_runs_account_is_not_this_runs(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    session = session_for(tmp_path)
    handler = ServiceAccountHandler()
    api = handler.api(session.ctx)
    await api.apply(manifests.namespace(KubeConfig.of(session.config), session.run_id))
    await api.apply(service_account(KubeConfig.of(session.config).namespace, "rtui-ray", "r20260101-000000-0000"))
    assert await handler.observe(api, session.ctx) is None
    session.close()


async def test_the_operators_account_of_this_run_is_not_the_ray_pods(kube_cluster: KubeCluster,
                                                                     tmp_path: Path) -> None:
    """The KubeRay operator's account carries the run's labels when it is scoped to the run's namespace
    (addons.kuberay_operator): teardown of the Ray pods' account must never take it."""
    session = session_for(tmp_path)
    handler = ServiceAccountHandler()
    api = handler.api(session.ctx)
    await api.apply(manifests.namespace(KubeConfig.of(session.config), session.run_id))
    await api.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {
        "name": "kuberay-operator", "namespace": KubeConfig.of(session.config).namespace,
        "labels": manifests.labels(session.run_id)}})
    assert await handler.observe(api, session.ctx) is None
    session.close()
