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

No pod mounts its Kubernetes token but the head with idle scaling on (issue 26): KubeRay's autoscaler
sidecar talks to the API server as the head pod's service account, to which KubeRay binds its autoscaler
Role, pods patch and rayclusters patch (ray-operator utils.GetHeadGroupServiceAccountName, used by
reconcileAutoscalerRoleBinding; a named account must exist). The head asks for the token on its pod spec,
which overrides the account's ``automountServiceAccountToken: false``. Pod Identity adds a projected token
volume of its own for the AWS credentials (EKS User Guide, "Understand how EKS Pod Identity works"),
independent of this one.

The workers never mount a token (issue 33): with no storage identity they run as an account of their
own (``WorkerAccountHandler``), bound to nothing; with one, they share it (the credentials are keyed on
its one name) without its token, so the autoscaler's rights stay in the head.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from backend.errors import UserError
from backend.layers.base import Context
from backend.resources import Observed, Resource
from backend.runner import Progress
from targets.kube import manifests
from targets.kube.config import kube_config
from targets.kube.handlers import LAYER, NAMESPACE, KubeHandler, delete_ours, object_id, ours
from targets.kube.specs import ServiceAccountSpec

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

SERVICE_ACCOUNT = "kube.serviceaccount.ray"
WORKER_ACCOUNT = "kube.serviceaccount.ray-workers"


class ServiceAccountHandler(KubeHandler):
    kind = "kube-serviceaccount"
    spec_model = ServiceAccountSpec
    title = "Create the Ray pods' service account (their AWS role comes through it)"
    expected_s = 1.0
    address = SERVICE_ACCOUNT
    purpose = manifests.RAY_PODS
    conflict_remedy = "name another with --service-account"

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        # The account of the namespace labelled as this run's, for this purpose (its name is the stack's to choose).
        config = kube_config(ctx)
        live = next((a for a in await api.list("v1", "ServiceAccount", config.namespace)
                     if ours(a, ctx.record.run_id)
                     and (a["metadata"].get("labels") or {}).get(manifests.PURPOSE_LABEL) == self.purpose), None)
        if live is None:
            return None
        name = str(live["metadata"]["name"])
        return Observed(address=self.address, layer=LAYER, kind=self.kind, id=f"{config.namespace}/{name}",
                        state={"name": name}, depends_on=(NAMESPACE,), reason="exists")

    def kube_objects(self, ctx: Context, want: Resource) -> list[manifests.Manifest]:
        name = ServiceAccountSpec.of(want).name
        return [manifests.service_account(kube_config(ctx).namespace, name, ctx.record.run_id, self.purpose)]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        (obj,) = self.kube_objects(ctx, want)
        api = self.api(ctx)
        live = await api.get("v1", "ServiceAccount", ServiceAccountSpec.of(want).name, kube_config(ctx).namespace)
        if live is not None and not ours(live, ctx.record.run_id):
            raise UserError(f"the ServiceAccount {object_id(obj)} exists and is not this run's",
                            remedy=self.conflict_remedy)
        await api.apply(obj)
        ctx.ledger.update(want.address, id=object_id(obj))
        yield Progress(f"service account {object_id(obj)}", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        name = have.id.split("/", 1)[1]
        async for p in delete_ours(self.api(ctx), ctx, [manifests.service_account(kube_config(ctx).namespace, name,
                                                                                  ctx.record.run_id, self.purpose)]):
            yield p


class WorkerAccountHandler(ServiceAccountHandler):
    """The workers' own account, when no storage identity is theirs to share: no token, no role."""

    kind = "kube-serviceaccount-workers"
    title = "Create the Ray workers' service account (no token, no role)"
    address = WORKER_ACCOUNT
    purpose = manifests.RAY_WORKERS
    conflict_remedy = "choose another --cluster-name (the workers' account is named after it)"
