"""The Ray pods' own ServiceAccount: the user's (kube, ``--service-account``) or the one the cluster
below gives AWS credentials to (issue 25).

On kube the credentials come from the cluster's own mechanism, keyed on the account's name (on EKS a
Pod Identity association for ``<namespace>/<name>`` the user made beforehand; rtui never holds the
pods' credentials): rtui makes the account in the run's namespace, where no account of the user's
can be before, and refuses one of that name that is not this run's.

On the aws target the Ray head and workers write the run's checkpoints and model to S3. EKS Pod
Identity hands credentials to the pods of one service account (the aws layer's association names
it, with a role scoped to the run's prefix): rtui makes that account in the run's namespace and the
RayCluster's pods run as it.

Its Kubernetes token stays mounted (the default): with idle scaling on (issue 26) KubeRay's autoscaler
sidecar in the head pod talks to the API server as the head pod's service account: KubeRay binds its
autoscaler Role to the account the head pod names (ray-operator utils.GetHeadGroupServiceAccountName,
used by reconcileAutoscalerRoleBinding), and expects a named account to exist. Pod Identity adds a
projected token volume of its own for the AWS credentials (EKS User Guide, "Understand how EKS Pod
Identity works"), independent of this one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from backend.errors import UserError
from backend.layers.base import Context
from backend.layers.kubernetes import manifests
from backend.layers.kubernetes.handlers import LAYER, NAMESPACE, KubeHandler, delete_ours, object_id, ours
from backend.model import Observed, Resource
from backend.runner import Progress

if TYPE_CHECKING:
    from backend.layers.kubernetes.access import KubeApi

SERVICE_ACCOUNT = "k8s.serviceaccount.ray"


class ServiceAccountHandler(KubeHandler):
    kind = "k8s-serviceaccount"
    title = "Create the Ray pods' service account (their AWS role comes through it)"
    expected_s = 1.0

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        # The account of the namespace labelled as this run's Ray pods' (its name is the stack's to choose).
        live = next((a for a in await api.list("v1", "ServiceAccount", ctx.config.namespace)
                     if ours(a, ctx.record.run_id)
                     and (a["metadata"].get("labels") or {}).get(manifests.PURPOSE_LABEL) == manifests.RAY_PODS), None)
        if live is None:
            return None
        name = str(live["metadata"]["name"])
        return Observed(address=SERVICE_ACCOUNT, layer=LAYER, kind=self.kind, id=f"{ctx.config.namespace}/{name}",
                        state={"name": name}, depends_on=(NAMESPACE,), reason="exists")

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        obj = manifests.service_account(ctx.config.namespace, str(want.spec["name"]), ctx.record.run_id)
        api = self.api(ctx)
        live = await api.get("v1", "ServiceAccount", str(want.spec["name"]), ctx.config.namespace)
        if live is not None and not ours(live, ctx.record.run_id):
            raise UserError(f"the ServiceAccount {object_id(obj)} exists and is not this run's",
                            remedy="name another with --service-account")
        await api.apply(obj)
        ctx.ledger.update(want.address, id=object_id(obj))
        yield Progress(f"service account {object_id(obj)}", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        name = have.id.split("/", 1)[1]
        async for p in delete_ours(self.api(ctx), ctx, [manifests.service_account(ctx.config.namespace, name,
                                                                                  ctx.record.run_id)]):
            yield p
