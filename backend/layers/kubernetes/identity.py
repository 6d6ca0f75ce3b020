"""The ServiceAccount the Ray pods run as (``--service-account``): how they get credentials on kube.

rtui makes it in the run's namespace (a namespace rtui makes, so no account of the user's can be
there before); the credentials come from the cluster's own mechanism, keyed on its name: on EKS a
Pod Identity association for ``<namespace>/<name>`` made beforehand (``aws eks
create-pod-identity-association``; it may name an account that does not exist yet), whose agent
injects ``AWS_CONTAINER_CREDENTIALS_FULL_URI`` into the pods, which boto3 in the job reads. rtui
never holds or passes the pods' credentials.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from backend.errors import UserError
from backend.layers.base import Context
from backend.layers.kubernetes import manifests
from backend.layers.kubernetes.handlers import LAYER, NAMESPACE, KubeHandler, delete_ours, object_id, ours
from backend.model import CheckResult, CheckStatus, Observed, Resource
from backend.runner import Progress

if TYPE_CHECKING:
    from backend.config import RunConfig
    from backend.layers.kubernetes.access import KubeApi

POD_ACCOUNT = "k8s.serviceaccount.ray"


def account_spec(config: RunConfig) -> dict[str, str]:
    return {"name": config.service_account,
            "credentials": f"the cluster's, for {config.namespace}/{config.service_account} (an EKS Pod Identity "
                           "association made beforehand); rtui passes none"}


def check(config: RunConfig) -> CheckResult:
    """What rtui can say about the pods' credentials: not what they may do (it never holds them)."""
    where = f" write {config.storage_path}" if config.storage_path and "://" in config.storage_path else ""
    return CheckResult(
        id="kube.service-account", title="Pods' service account", status=CheckStatus.INFO,
        detail=f"the Ray pods{where or ' run'} as {config.namespace}/{config.service_account}; the storage check "
               "above used your own credentials, not theirs",
        remedy=None if not where else f"give {config.namespace}/{config.service_account} a role that may write there "
                                      "(EKS: aws eks create-pod-identity-association)")


class PodAccountHandler(KubeHandler):
    kind = "k8s-serviceaccount"
    title = "Create the Ray pods' ServiceAccount"
    expected_s = 1.0

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        if not ctx.config.service_account:
            return None
        live = await api.get("v1", "ServiceAccount", ctx.config.service_account, ctx.config.namespace)
        if live is None or not ours(live, ctx.record.run_id):
            return None
        return Observed(address=POD_ACCOUNT, layer=LAYER, kind=self.kind, id=object_id(live),
                        state=account_spec(ctx.config), depends_on=(NAMESPACE,), reason="exists")

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        account = manifests.service_account(ctx.config, ctx.record.run_id)
        live = await api.get("v1", "ServiceAccount", ctx.config.service_account, ctx.config.namespace)
        if live is not None and not ours(live, ctx.record.run_id):
            raise UserError(f"the ServiceAccount {object_id(account)} exists and is not this run's",
                            remedy="name another with --service-account")
        await api.apply(account)
        ctx.ledger.update(want.address, id=object_id(account))
        yield Progress(f"the Ray pods run as {object_id(account)}", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        async for p in delete_ours(self.api(ctx), ctx, [manifests.service_account(ctx.config, ctx.record.run_id)]):
            yield p
