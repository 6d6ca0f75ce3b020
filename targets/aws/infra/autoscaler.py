"""cluster-autoscaler in the EKS cluster, as a resource of the aws plan (issue 26).

Its objects (``node_autoscaler.cluster_autoscaler_manifests``: the chart's, pinned by version) are
applied through the Kubernetes layer's apply machinery once its service account's Pod Identity
association exists (EKS injects the credentials when a pod starts, so the association comes first)
and the system nodes run. It is ready when its Deployment is Available (its pod scheduled on a
system node, its image pulled, running): until then nothing takes idle GPU nodes away, so the step
waits for it and, when the pod cannot run, fails with the reason Kubernetes gives (the pod's
PodScheduled=False message, an image it cannot pull). Teardown deletes only what carries this
run's labels.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from backend.errors import ApiUnreachable
from backend.layers.base import Context
from backend.resources import Observed, Resource
from backend.runner import Progress
from backend.waiting import Look, wait_until
from targets.aws.config import aws_config
from targets.aws.infra import node_autoscaler as na
from targets.aws.infra.api import AwsApi
from targets.aws.infra.common import LAYER, AwsHandler
from targets.aws.infra.specs import ClusterAutoscalerSpec
from targets.kube import manifests
from targets.kube.addons import deployment_available
from targets.kube.cluster_api import ClusterNotReady, cluster_api
from targets.kube.handlers import apply_all, delete_ours, deployment_check, ours

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

CLUSTER_AUTOSCALER = "aws.cluster-autoscaler"
# Its image (~30 MB) pulls and starts in well under a minute on a running system node; a pod that
# no node takes is not going to be placed by waiting (the system nodegroup does not grow).
AVAILABLE_TIMEOUT_S = 180.0


def _objects(ctx: Context) -> list[dict[str, Any]]:
    config = aws_config(ctx)
    return na.cluster_autoscaler_manifests(config, config.cluster_name, manifests.labels(ctx.record.run_id))


class ClusterAutoscalerHandler(AwsHandler):
    kind = "aws-cluster-autoscaler"
    spec_model = ClusterAutoscalerSpec
    title = "Install cluster-autoscaler (empty GPU nodes go)"
    address = CLUSTER_AUTOSCALER
    expected_s = 3.0
    updatable = True

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        try:
            kube = await cluster_api(ctx)
            live = await kube.get("apps/v1", "Deployment", na.NAME, na.NAMESPACE)
        except ClusterNotReady:
            return []
        except ApiUnreachable as exc:  # it lives in the EKS cluster, which its deletion takes with it
            ctx.note_unanswered("cluster-autoscaler", exc, "the EKS cluster")
            return []
        if live is None or not ours(live, ctx.record.run_id):
            return []

        container = live["spec"]["template"]["spec"]["containers"][0]
        state: dict[str, Any] = {"image": container.get("image"), "command": list(container.get("command") or [])}
        available, why = deployment_available(live)
        if not available:
            state["pending"] = why  # installed but not running: `up` waits for it again
        return [Observed(address=CLUSTER_AUTOSCALER, layer=LAYER, kind=self.kind, id=f"{na.NAMESPACE}/{na.NAME}",
                         state=state, reason="installed" if available else why)]

    @staticmethod
    def spec(ctx: Context, image: str) -> ClusterAutoscalerSpec:
        deployment = next(o for o in _objects(ctx) if o["kind"] == "Deployment")
        return ClusterAutoscalerSpec(image=image,
                                     command=deployment["spec"]["template"]["spec"]["containers"][0]["command"])

    def kube_objects(self, ctx: Context, want: Resource) -> list[dict[str, Any]]:
        return _objects(ctx)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        kube = await cluster_api(ctx)
        async for p in apply_all(kube, self.kube_objects(ctx, want)):
            yield p
        self.made(ctx, want, f"{na.NAMESPACE}/{na.NAME}")
        async for p in wait_available(kube):
            yield p
        yield Progress(f"{ClusterAutoscalerSpec.of(want).image}: scales this run's GPU group between 0 and "
                       f"{aws_config(ctx).gpu_node_count} nodes", 1.0)

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self.create(ctx, want):
            yield p

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        try:
            kube = await cluster_api(ctx)
        except ClusterNotReady:
            return
        async for p in delete_ours(kube, ctx, _objects(ctx)):
            yield p


async def wait_available(kube: KubeApi) -> AsyncIterator[Progress]:
    """Until cluster-autoscaler's Deployment is Available; a pod that cannot run ends the wait with
    Kubernetes' own reason (``pods.pod_problem``: not schedulable, image not pullable)."""

    async def available() -> Look:
        live = await kube.get("apps/v1", "Deployment", na.NAME, na.NAMESPACE)
        if live is None:
            return Look(False, "waiting for the Deployment to appear")
        return await deployment_check(kube, live)

    remedy = f"see `kubectl -n {na.NAMESPACE} describe pod -l app.kubernetes.io/name={na.NAME}`"
    async for p in wait_until(available, what="cluster-autoscaler did not become available",
                            timeout_s=AVAILABLE_TIMEOUT_S, remedy=remedy):
        yield p
