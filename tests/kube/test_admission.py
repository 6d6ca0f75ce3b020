"""Pods that a namespace's admission refuses are seen within seconds, named with the rule (issue 35, item 4).

A namespace that enforces Pod Security ``restricted`` (one rtui adopts, or one a platform labels for every
team) refuses a pod that may run as root: kube-apiserver answers KubeRay's create with 403 ('pods "x" is
forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true ...',
https://kubernetes.io/docs/concepts/security/pod-security-admission/), KubeRay records a Warning event
``FailedToCreateHeadPod`` on the RayCluster and sets ``ReplicaFailure`` (raycluster_controller.go), and the
DaemonSet controller records ``FailedCreate`` on the DaemonSet. No pod ever exists to report anything, so
rtui must read those, not wait for a head pod until its 30-minute deadline.

The images: Ray's own (rayproject/ray) run as uid 1000 ``ray`` (ray-project/ray docker/base-deps/Dockerfile,
``USER $RAY_UID``); the default AWS DLC image has no USER (aws/deep-learning-containers docker/ray/
Dockerfile.cuda) and runs as root. The pre-pull only sleeps, so it always runs as nobody.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.errors import RtuiError
from backend.ledger import ResourceStatus
from backend.resolve import resolve_config
from backend.resources import Resource, Spec
from backend.session import RunSession
from backend.store import RunStore
from targets.kube import handlers, raycluster
from targets.kube import manifests as m
from targets.kube.config import KubeConfig
from targets.kube.layer import every_object
from targets.kube.raycluster import PrepullHandler, RayClusterHandler, WorkersHandler
from targets.kube.specs import PrepullSpec, RayClusterSpec
from tests.kube import pod_security as pss
from tests.kube.conftest import KubeCluster
from tests.kube.crds import install_shared_crds
from tests.kube.fake_control import FakeControlPlane

RAY_IMAGE = "rayproject/ray:2.58.0-py311-gpu"
# As a team's namespace often is: the level, no version (PodSecurity then checks "latest").
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def session_for(tmp_path: Path, **values: Any) -> RunSession:
    config = resolve_config({"target": "kube", "idle_minutes": 0, "gpu_node_count": 1, **values}, environ={}).config
    store = RunStore(tmp_path / "state")
    return RunSession(store, store.create(config), config)


@pytest.fixture
def control(kube_cluster: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeControlPlane]:
    # A bound instead of 30 minutes, so a regression fails here instead of hanging the suite.
    monkeypatch.setattr(raycluster, "PULL_TIMEOUT_S", 30.0)
    install_shared_crds(kube_cluster)
    kube_cluster.add_node("system-0", gpus=0, efa=0)
    kube_cluster.add_node("gpu-0")
    with FakeControlPlane(kube_cluster) as plane:
        yield plane
    assert not plane.errors, plane.errors[:3]


async def restricted_namespace(session: RunSession) -> None:
    """The run's namespace with what the Ray pods need (token, job-env, the workers' account), enforcing
    ``restricted``; everything but the RayCluster and the pre-pull, which the test applies through rtui."""
    api = RayClusterHandler().api(session.ctx)
    config = KubeConfig.of(session.config)
    objects, _ = every_object(config, session.run_id)
    for obj in objects:
        if obj["metadata"].get("namespace", config.namespace) != config.namespace:
            continue
        if obj["kind"] == "Namespace":
            obj["metadata"]["labels"] = {k: v for k, v in obj["metadata"]["labels"].items()
                                         if not k.startswith(pss.LABEL_PREFIX)} | RESTRICTED
        elif obj["kind"] == "Secret" and obj["metadata"]["name"] == m.ray_token_secret_name(config):
            obj["stringData"] = {m.RAY_TOKEN_KEY: "t0ken"}
        elif obj["kind"] not in ("Secret", "ServiceAccount"):
            continue
        await api.apply(obj)


def want(session: RunSession, address: str, kind: str) -> Resource:
    """What the plan asks of a step, and its ledger entry, as the planner writes it before the create (the
    image by its tag: no registry here)."""
    session.ctx.ledger.set(address, kind, ResourceStatus.INTENDED, layer="kube")
    config = KubeConfig.of(session.config)
    spec: Spec = PrepullSpec(image=config.image, digest=None)
    if kind == RayClusterHandler.kind:
        spec = RayClusterSpec(image=config.image, digest=None, pinning="by tag", gpu_nodes=config.gpu_node_count,
                              gpus_per_node=config.gpus_per_node, efa=config.wants_efa(),
                              ray_version=config.ray_version, hf_token=False, auth="token",
                              idle_timeout_s=config.idle_timeout_s(),
                              worker_service_account=m.worker_service_account_name(config),
                              pod_security=m.POD_SECURITY["enforce"])
    return Resource(address=address, layer="kube", kind=kind, spec=spec.as_spec())


@pytest.mark.slow
async def test_a_root_image_in_a_restricted_namespace_is_refused_naming_the_rule(
        control: FakeControlPlane, kube_cluster: KubeCluster, tmp_path: Path) -> None:
    session = session_for(tmp_path)  # the default image: an AWS DLC, root
    await restricted_namespace(session)
    handler = RayClusterHandler()
    with pytest.raises(RtuiError) as refused:
        async for _ in handler.create(session.ctx, want(session, handlers.RAYCLUSTER, handler.kind)):
            pass
    line = str(refused.value)
    # What KubeRay saw comes first, then rtui's line names it: the rule, the level and the control.
    rc = kube_cluster.read("RayCluster", session.config.cluster_name, KubeConfig.of(session.config).namespace)
    failure = [c for c in rc["status"]["conditions"] if c["type"] == "ReplicaFailure"]
    assert failure and failure[0]["status"] == "True" and failure[0]["reason"] == "FailedCreateHeadPod"
    assert line.startswith('Pod Security "restricted:latest" in namespace rtui refused the head pod: '
                           'runAsNonRoot != true (containers "ray-head"'), line
    assert not re.search(r": still .* after \d", line), line  # it did not wait for its deadline
    assert "\n" not in line and "rayproject/ray:2.58.0-gpu" in (refused.value.remedy or ""), refused.value.remedy
    session.close()


@pytest.mark.slow
async def test_a_non_root_image_runs_in_a_restricted_namespace(
        control: FakeControlPlane, kube_cluster: KubeCluster, tmp_path: Path) -> None:
    session = session_for(tmp_path, image=RAY_IMAGE)
    await restricted_namespace(session)
    for handler, address in ((RayClusterHandler(), handlers.RAYCLUSTER), (WorkersHandler(), handlers.WORKERS)):
        async for _ in handler.create(session.ctx, want(session, address, handler.kind)):
            pass
    pods = {p["metadata"]["labels"].get("ray.io/node-type") for p in kube_cluster.objects("Pod", "rtui")}
    assert pods == {"head", "worker"}
    session.close()


@pytest.mark.slow
async def test_the_prepull_of_a_root_image_runs_in_a_restricted_namespace(
        control: FakeControlPlane, kube_cluster: KubeCluster, tmp_path: Path) -> None:
    session = session_for(tmp_path)
    await restricted_namespace(session)
    handler = PrepullHandler()
    async for _ in handler.create(session.ctx, want(session, handlers.PREPULL, handler.kind)):
        pass
    assert [p["spec"]["nodeName"] for p in kube_cluster.objects("Pod", "rtui")] == ["gpu-0"]
    session.close()


@pytest.mark.slow
async def test_a_refused_prepull_is_seen_from_the_daemonsets_events(
        control: FakeControlPlane, kube_cluster: KubeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy rtui cannot foresee (a pre-pull that runs as root, say an older rtui's): the DaemonSet controller's
    FailedCreate event is read, and the step fails naming the rule."""
    session = session_for(tmp_path)
    await restricted_namespace(session)
    made = m.image_prepull

    def as_root(*args: Any, **kwargs: Any) -> m.Manifest:
        ds = made(*args, **kwargs)
        for c in ds["spec"]["template"]["spec"]["containers"]:
            c["securityContext"] = {k: v for k, v in c["securityContext"].items() if not k.startswith("runAs")}
        ds["spec"]["template"]["spec"]["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
        return ds

    monkeypatch.setattr(m, "image_prepull", as_root)
    handler = PrepullHandler()
    with pytest.raises(RtuiError) as refused:
        async for _ in handler.create(session.ctx, want(session, handlers.PREPULL, handler.kind)):
            pass
    line = str(refused.value)
    assert line.startswith('Pod Security "restricted:latest" in namespace rtui refused the pre-pull\'s pods: '
                           'runAsNonRoot != true'), line
    session.close()


def test_every_pod_of_a_non_root_image_passes_restricted_and_the_prepull_always() -> None:
    for image in (RAY_IMAGE, "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"):
        config = resolve_config({"target": "kube", "image": image}, environ={}).config
        objects, _ = every_object(KubeConfig.of(config), "r20260101-120000-abcd")
        for obj in objects:
            if obj["metadata"].get("namespace") != KubeConfig.of(config).namespace:
                continue
            for what, meta, spec in pss.pod_specs(obj):
                found = pss.restricted_violations(meta, spec)
                if obj["kind"] == "DaemonSet" or image == RAY_IMAGE:
                    assert found == [], (image, what, found)
                else:  # the DLC image runs as root: its Ray pods pass all but non-root
                    assert found and all(f.startswith("runAsNonRoot") for f in found), (what, found)


@pytest.mark.parametrize(("message", "rule"), [
    ('pods "h" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true (pod or container '
     '"ray-head" must set securityContext.runAsNonRoot=true)', 'Pod Security "restricted:latest"'),
    ('admission webhook "validate.kyverno.svc-fail" denied the request: resource Pod/team-a/h was blocked due to '
     'the following policies', 'admission webhook "validate.kyverno.svc-fail"'),
    ('pods "h" is forbidden: exceeded quota: compute, requested: requests.cpu=2, used: requests.cpu=9, '
     'limited: requests.cpu=10', 'ResourceQuota "compute"'),
])
def test_the_refusal_names_the_rule(message: str, rule: str) -> None:
    from targets.kube.admission import refusal_rule

    assert refusal_rule(message) == rule


async def test_preflight_refuses_a_root_image_for_a_namespace_that_enforces_restricted(
        kube_cluster: KubeCluster, tmp_path: Path) -> None:
    """The user's namespace (adopted, issue 35 item 1) enforces restricted: with a root image the plan refuses
    in one line naming the rule, before anything is applied; Ray's image passes; another level says nothing."""
    from backend.resources import CheckStatus
    from targets.kube.admission import pod_security_check

    kube_cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {
        **RESTRICTED, "pod-security.kubernetes.io/enforce-version": "v1.33"}}})
    kube_cluster.add_namespace("team-b")
    session = session_for(tmp_path, namespace="team-a")
    api = RayClusterHandler().api(session.ctx)
    refused = await pod_security_check(api, KubeConfig.of(session.config))
    assert refused is not None and refused.status is CheckStatus.FAIL
    assert 'enforces Pod Security "restricted:v1.33"' in refused.detail and "runs as root" in refused.detail
    assert refused.remedy and "rayproject/ray:2.58.0-gpu" in refused.remedy
    config = KubeConfig.of(session.config)
    ray = await pod_security_check(api, config.model_copy(update={"image": RAY_IMAGE}))
    assert ray is not None and ray.status is CheckStatus.OK and "uid 1000" in ray.detail
    assert await pod_security_check(api, config.model_copy(update={"namespace": "team-b"})) is None
    session.close()
