"""EKS Pod Identity associations: a Kubernetes service account gets its own IAM role (``iam.PodIdentity``).

One resource kind for every association (the VPC CNI's today; a bucket's or the cluster
autoscaler's later): its role is an ``aws.iam-role.pod-<name>`` of the IAM handler, and the
``eks-pod-identity-agent`` add-on hands the role's credentials to the service account's pods.
Associations go with the cluster; teardown deletes them first all the same.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from backend.layers.base import Context
from backend.resources import Action, Observed, Resource
from backend.runner import Progress
from targets.aws.config import aws_config
from targets.aws.infra.api import EKS_TOKEN, RUN_TAG, AwsApi, tags
from targets.aws.infra.cluster import describe_cluster
from targets.aws.infra.common import EKS_CLUSTER, LAYER, AwsHandler, create_token
from targets.aws.infra.iam import POD_IDENTITIES, PodIdentity, role_arn, role_name
from targets.aws.infra.specs import PodIdentitySpec

POD_IDENTITY_AGENT = "eks-pod-identity-agent"
_NOT_FOUND = ("ResourceNotFoundException",)


def _identity(address: str) -> PodIdentity:
    return next(p for p in POD_IDENTITIES if p.address == address)


class PodIdentityHandler(AwsHandler):
    kind = "aws-pod-identity"
    spec_model = PodIdentitySpec
    title = "Give a service account its own IAM role (EKS Pod Identity)"
    expected_s = 3.0

    def step_title(self, address: str, action: Action) -> str:
        identity = next((p for p in POD_IDENTITIES if p.address == address), None)
        if identity is not None and action is Action.CREATE:
            where = "the run's namespace" if identity.in_run_namespace else identity.namespace
            return f"Give {where}/{identity.service_account} its IAM role (Pod Identity)"
        return super().step_title(address, action)

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        config = aws_config(ctx)
        name = config.cluster_name
        cluster = await describe_cluster(api, name)
        if cluster is None or (cluster.get("tags") or {}).get(RUN_TAG) != ctx.record.run_id:
            return []
        listed = (await api.call("eks", "list_pod_identity_associations", clusterName=name, ok=_NOT_FOUND)
                  or {}).get("associations") or []
        out = []
        for identity in POD_IDENTITIES:
            found = next((a for a in listed if a.get("namespace") == identity.namespace_in(config.namespace)
                          and a.get("serviceAccount") == identity.service_account), None)
            if found is None:
                continue
            association = (await api.call("eks", "describe_pod_identity_association", clusterName=name,
                                          associationId=found["associationId"], ok=_NOT_FOUND) or {}).get(
                "association") or {}
            out.append(Observed(address=identity.address, layer=LAYER, kind=self.kind,
                                id=f"{name}/{found['associationId']}", depends_on=(EKS_CLUSTER,),
                                state=self._state(identity, config.namespace,
                                                  str(association.get("roleArn", "")).rsplit("/", 1)[-1]),
                                reason="exists"))
        return out

    @staticmethod
    def _state(identity: PodIdentity, run_namespace: str, role: str) -> dict[str, object]:
        return {"namespace": identity.namespace_in(run_namespace), "service_account": identity.service_account,
                "role": role}

    @staticmethod
    def spec(ctx: Context, identity: PodIdentity) -> PodIdentitySpec:
        state = PodIdentityHandler._state(identity, aws_config(ctx).namespace, role_name(ctx, identity.role_address))
        return PodIdentitySpec(**state, policies=list(identity.policies))

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        trimmed = want.model_copy(update={"spec": {k: v for k, v in want.spec.items() if k != "policies"}})
        return super().compare(trimmed, have)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = aws_config(ctx)
        api = self.api(ctx)
        identity = _identity(want.address)
        name = config.cluster_name
        namespace = identity.namespace_in(config.namespace)
        made = await api.call("eks", "create_pod_identity_association", clusterName=name,
                              namespace=namespace, serviceAccount=identity.service_account,
                              roleArn=await role_arn(api, ctx, identity.role_address),
                              tags=tags(ctx.record.run_id, name),
                              clientRequestToken=create_token(ctx, want.address, limits=EKS_TOKEN),
                              ok=("ResourceInUseException",), new_role=True)
        if made is None:  # made before (a lost reply): find it
            listed = (await api.call("eks", "list_pod_identity_associations", clusterName=name,
                                     namespace=namespace, serviceAccount=identity.service_account)
                      or {}).get("associations") or []
            association_id = listed[0]["associationId"]
        else:
            association_id = made["association"]["associationId"]
        self.made(ctx, want, f"{name}/{association_id}")
        yield Progress(f"{namespace}/{identity.service_account} → {role_name(ctx, identity.role_address)} "
                       f"({', '.join([*identity.policies, *(['its scoped policy'] if identity.inline else [])])})",
                       1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        cluster, association_id = have.id.split("/", 1)
        await self.api(ctx).call("eks", "delete_pod_identity_association", clusterName=cluster,
                                 associationId=association_id, ok=_NOT_FOUND)
        yield Progress(f"pod identity association {association_id} deleted", 1.0)
