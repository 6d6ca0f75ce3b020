"""The EKS cluster, its core add-ons, the caller's access entry, and the kubeconfig entry for kubectl.

The cluster authenticates by access entries (``authenticationMode: API``); the caller becomes
cluster admin through an entry of its own, made explicitly so the plan shows it. The kubeconfig
entry holds an exec plugin, never a token (``targets.aws.eks``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from backend.errors import OperationError
from backend.layers.base import Context
from backend.resources import Action, Observed, Resource
from backend.runner import Progress
from backend.waiting import Look, wait_until
from targets.aws.config import aws_config
from targets.aws.infra.api import EKS_TOKEN, RUN_TAG, AwsApi, partition, refuse_foreign, tags
from targets.aws.infra.common import (
    ACCESS_ENTRY,
    CLUSTER_ROLE,
    EKS_CLUSTER,
    KUBECONFIG,
    LAYER,
    AwsHandler,
    create_token,
)
from targets.aws.infra.iam import role_arn
from targets.aws.infra.network import delete_cluster_groups, security_group_id, subnet_ids
from targets.aws.infra.specs import AccessEntrySpec, AddonSpec, EksClusterSpec, KubeconfigSpec

CLUSTER_EXPECTED_S = 600.0
CLUSTER_DELETE_S = 300.0
ADDON_EXPECTED_S = 60.0
ADMIN_POLICY_NAME = "AmazonEKSClusterAdminPolicy"
NAMESPACE_POLICY_NAME = "AmazonEKSAdminPolicy"  # what --access-scope namespace leaves (aws/access_scope.py)
# Control-plane logs kept: who called the API and what it did (audit), and who authenticated
# (authenticator). They go to CloudWatch Logs, billed per GB ingested and stored (CloudWatch pricing,
# standard log class in us-east-1: $0.50/GB ingested, $0.03/GB-month stored; other regions differ).
CONTROL_PLANE_LOGS = ("audit", "authenticator")
CLOUDWATCH_LOGS_PER_GB = 0.50
CLOUDWATCH_LOGS_GB_MONTH = 0.03


def log_setting(types: list[str]) -> dict[str, Any]:
    return {"clusterLogging": [{"types": list(types), "enabled": True}]}


def enabled_logs(cluster: dict[str, Any]) -> list[str]:
    return sorted({t for group in (cluster.get("logging") or {}).get("clusterLogging") or []
                   if group.get("enabled") for t in group.get("types") or []})


def admin_policy(region: str) -> str:
    return f"arn:{partition(region).name}:eks::aws:cluster-access-policy/{ADMIN_POLICY_NAME}"
_NOT_FOUND = ("ResourceNotFoundException",)


async def describe_cluster(api: AwsApi, name: str) -> dict[str, Any] | None:
    found = await api.call("eks", "describe_cluster", name=name, ok=_NOT_FOUND)
    return None if found is None else dict(found["cluster"])


def assumed_role_name(caller_arn: str) -> str | None:
    """The role of an STS assumed-role session ARN (``...:assumed-role/<role>/<session>``), else None."""
    if ":assumed-role/" not in caller_arn:
        return None
    return caller_arn.split(":assumed-role/", 1)[1].split("/")[0]


async def caller_principal(api: AwsApi) -> str:
    """The IAM principal an access entry names: the role behind an assumed-role session, as IAM writes
    its ARN, path included (IAM Identity Center roles live under ``/aws-reserved/sso.<DNS suffix>/``,
    and EKS refuses their ARN without it), so it comes from ``iam:GetRole``, not from the STS ARN."""
    caller = str((await api.identity())["Arn"])
    role = assumed_role_name(caller)
    if role is None:
        return caller  # an IAM user's ARN is already its IAM ARN
    found = await api.call("iam", "get_role", RoleName=role)
    return str(found["Role"]["Arn"])


class EksClusterHandler(AwsHandler):
    kind = "aws-eks-cluster"
    spec_model = EksClusterSpec
    title = "Create the EKS control plane"
    address = EKS_CLUSTER
    expected_s = CLUSTER_EXPECTED_S
    updatable = True

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        cluster = await describe_cluster(api, aws_config(ctx).cluster_name)
        if cluster is None or (cluster.get("tags") or {}).get(RUN_TAG) != ctx.record.run_id:
            return []  # another's cluster of this name: preflight refuses it
        status = cluster["status"]
        vpc = cluster.get("resourcesVpcConfig") or {}
        return [Observed(address=EKS_CLUSTER, layer=LAYER, kind=self.kind, id=cluster["name"],
                         state={"version": cluster.get("version"),
                                "public_cidrs": sorted(vpc.get("publicAccessCidrs") or ["0.0.0.0/0"]),
                                "logs": enabled_logs(cluster),
                                "pending": "creating" if status == "CREATING" else
                                "updating" if status == "UPDATING" else None,
                                "endpoint": cluster.get("endpoint")},
                         healthy=status not in ("FAILED", "DELETING"), reason=status.lower())]

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        if have.state.get("pending") or not have.healthy:
            return super().compare(want, have)
        changed = [k for k in ("version", "public_cidrs", "logs") if have.state.get(k) != want.spec.get(k)]
        if changed:
            return Action.UPDATE, f"changed: {', '.join(changed)}"
        return Action.NOOP, have.reason

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        name = aws_config(ctx).cluster_name
        existing = await describe_cluster(api, name)
        if existing is not None:
            refuse_foreign("EKS cluster", name, existing.get("tags") or {}, ctx.record.run_id)
        else:
            spec = EksClusterSpec.of(want)
            subnets = await subnet_ids(api, ctx, "private", list(spec.azs))
            await api.call(
                "eks", "create_cluster", name=name, version=spec.version,
                roleArn=await role_arn(api, ctx, CLUSTER_ROLE),
                resourcesVpcConfig={"subnetIds": [subnets[az] for az in spec.azs],
                                    "securityGroupIds": [await security_group_id(api, ctx)],
                                    "endpointPrivateAccess": True, "endpointPublicAccess": True,
                                    "publicAccessCidrs": list(spec.public_cidrs)},
                accessConfig={"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": False},
                logging=log_setting(list(spec.logs)),
                tags=tags(ctx.record.run_id, name),
                clientRequestToken=create_token(ctx, want.address, limits=EKS_TOKEN),
                ok=("ResourceInUseException",), new_role=True)
        self.made(ctx, want, name)
        async for p in self.wait_ready(ctx, name):
            yield p

    def wait_ready(self, ctx: Context, resource_id: str) -> AsyncIterator[Progress]:
        api = self.api(ctx)

        async def look() -> Look:
            cluster = await describe_cluster(api, resource_id)
            status = cluster["status"] if cluster else "GONE"
            if status in ("FAILED", "GONE"):
                return Look(False, status, fatal=f"EKS cluster {resource_id} is {status.lower()}",
                             remedy="see its events in the EKS console; `rtui down` then `rtui up` makes it anew")
            return Look(status == "ACTIVE", f"control plane {status.lower()}")

        return wait_until(look, what=f"EKS cluster {resource_id}", expected_s=CLUSTER_EXPECTED_S, timeout_s=1800.0,
                          clock=api.clock)

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        api, spec = self.api(ctx), EksClusterSpec.of(want)
        if not have.state.get("pending"):
            if have.state.get("public_cidrs") != spec.public_cidrs:
                await api.call("eks", "update_cluster_config", name=have.id, resourcesVpcConfig={
                    "endpointPublicAccess": True, "publicAccessCidrs": list(spec.public_cidrs)})
                yield Progress(f"public endpoint limited to {', '.join(spec.public_cidrs)}")
            elif have.state.get("logs") != spec.logs:
                await api.call("eks", "update_cluster_config", name=have.id, logging=log_setting(list(spec.logs)))
                yield Progress(f"control-plane logs: {', '.join(spec.logs)}")
            elif have.state.get("version") != spec.version:
                await api.call("eks", "update_cluster_version", name=have.id, version=spec.version)
                yield Progress(f"upgrading to Kubernetes {spec.version}")
        async for p in self.wait_ready(ctx, have.id):
            yield p

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        vpc = ((await describe_cluster(api, have.id) or {}).get("resourcesVpcConfig") or {}).get("vpcId")
        await api.call("eks", "delete_cluster", name=have.id, ok=_NOT_FOUND)

        async def look() -> Look:
            cluster = await describe_cluster(api, have.id)
            return Look(cluster is None, "control plane deleted" if cluster is None else
                         f"control plane {cluster['status'].lower()}")

        async for p in wait_until(look, what=f"deleting EKS cluster {have.id}", expected_s=CLUSTER_DELETE_S,
                                  timeout_s=1800.0, clock=api.clock):
            yield p
        if vpc:  # also in an adopted VPC, which rtui never deletes
            async for p in delete_cluster_groups(api, str(vpc), have.id):
                yield p


def _configuration(raw: str | None) -> dict[str, Any] | None:
    """An add-on's configuration values as EKS returns them (a JSON string; empty when none)."""
    try:
        values = json.loads(raw) if raw else None
    except ValueError:
        return None
    return values if isinstance(values, dict) else None


class AddonHandler(AwsHandler):
    kind = "aws-eks-addon"
    spec_model = AddonSpec
    title = "Install an EKS add-on"
    expected_s = ADDON_EXPECTED_S
    updatable = True  # its configuration values change in place (UpdateAddon)

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        name = aws_config(ctx).cluster_name
        cluster = await describe_cluster(api, name)
        if cluster is None or (cluster.get("tags") or {}).get(RUN_TAG) != ctx.record.run_id:
            return []
        out = []
        for addon_name in (await api.call("eks", "list_addons", clusterName=name, ok=_NOT_FOUND) or {}).get(
                "addons") or []:
            addon = (await api.call("eks", "describe_addon", clusterName=name, addonName=addon_name,
                                    ok=_NOT_FOUND) or {}).get("addon")
            if addon is None:
                continue
            status = addon["status"]
            out.append(Observed(address=f"aws.addon.{addon_name}", layer=LAYER, kind=self.kind,
                                id=f"{name}/{addon_name}", depends_on=(EKS_CLUSTER,),
                                state={"name": addon_name, "pending": "creating" if status == "CREATING" else None,
                                       "configuration": _configuration(addon.get("configurationValues"))},
                                healthy=status not in ("CREATE_FAILED", "DELETING", "DELETE_FAILED"),
                                reason=status.lower()))
        return out

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        spec = AddonSpec.of(want)
        name, addon = aws_config(ctx).cluster_name, spec.name
        configuration = spec.configuration
        extra: dict[str, Any] = {"configurationValues": json.dumps(configuration)} if configuration else {}
        await api.call("eks", "create_addon", clusterName=name, addonName=addon, resolveConflicts="OVERWRITE",
                       tags=tags(ctx.record.run_id, name), **extra,
                       clientRequestToken=create_token(ctx, want.address, limits=EKS_TOKEN),
                       ok=("ResourceInUseException",))
        self.made(ctx, want, f"{name}/{addon}")
        async for p in self.wait_ready(ctx, f"{name}/{addon}"):
            yield p

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        """An add-on of an earlier rtui made without today's configuration values (vpc-cni's network
        policy agent): EKS applies them in place, on the running add-on."""
        api = self.api(ctx)
        cluster, addon = have.id.split("/", 1)
        await api.call("eks", "update_addon", clusterName=cluster, addonName=addon, resolveConflicts="OVERWRITE",
                       configurationValues=json.dumps(AddonSpec.of(want).configuration or {}))
        async for p in self.wait_ready(ctx, have.id):
            yield p

    def wait_ready(self, ctx: Context, resource_id: str) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        cluster, addon = resource_id.split("/", 1)

        async def look() -> Look:
            found = (await api.call("eks", "describe_addon", clusterName=cluster, addonName=addon,
                                    ok=_NOT_FOUND) or {}).get("addon")
            status = found["status"] if found else "GONE"
            # DEGRADED after a create does not heal by waiting: its health issues say what to fix.
            if status in ("CREATE_FAILED", "DEGRADED", "GONE"):
                issues = "; ".join(f"{i.get('code')}: {i.get('message')}" for i in
                                   ((found or {}).get("health") or {}).get("issues") or [])
                return Look(False, status, fatal=f"add-on {addon} {status.lower()}" + (f" ({issues})" if issues
                                                                                         else ""),
                             remedy="fix what its health issues name (`aws eks describe-addon`), then `rtui up` "
                                    "again")
            return Look(status == "ACTIVE", f"{addon} {status.lower()}")

        return wait_until(look, what=f"add-on {addon}", expected_s=ADDON_EXPECTED_S, timeout_s=1200.0, clock=api.clock)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        cluster, addon = have.id.split("/", 1)
        await api.call("eks", "delete_addon", clusterName=cluster, addonName=addon, ok=_NOT_FOUND)

        async def look() -> Look:
            found = await api.call("eks", "describe_addon", clusterName=cluster, addonName=addon, ok=_NOT_FOUND)
            return Look(found is None, f"{addon} " + ("deleted" if found is None else
                                                       found["addon"]["status"].lower()))

        async for p in wait_until(look, what=f"deleting add-on {addon}", expected_s=30.0, timeout_s=900.0,
                                  clock=api.clock):
            yield p


async def caller_access_entry(api: AwsApi, ctx: Context) -> tuple[str, dict[str, Any], list[dict[str, Any]]] | None:
    """The caller's access entry on this run's EKS cluster and its associated access policies, as
    (principal, entry, policies); None when the cluster is not this run's or the entry is not there."""
    name = aws_config(ctx).cluster_name
    cluster = await describe_cluster(api, name)
    if cluster is None or (cluster.get("tags") or {}).get(RUN_TAG) != ctx.record.run_id:
        return None
    principal = await caller_principal(api)
    entry = await api.call("eks", "describe_access_entry", clusterName=name, principalArn=principal, ok=_NOT_FOUND)
    if entry is None:
        return None
    listed = await api.call("eks", "list_associated_access_policies", clusterName=name, principalArn=principal,
                            ok=_NOT_FOUND) or {}
    return principal, dict(entry["accessEntry"]), list(listed.get("associatedAccessPolicies") or [])


class AccessEntryHandler(AwsHandler):
    kind = "aws-access-entry"
    spec_model = AccessEntrySpec
    title = "Make the caller cluster admin (access entry)"
    address = ACCESS_ENTRY
    expected_s = 3.0

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        config = aws_config(ctx)
        found = await caller_access_entry(api, ctx)
        if found is None:
            return []
        name = config.cluster_name
        principal, _, policies = found
        associated = {p.get("policyArn") for p in policies}
        admin = admin_policy(config.region) in associated
        # Narrowed on purpose (--access-scope namespace): the access-scope layer's resource says so.
        narrowed = f":cluster-access-policy/{NAMESPACE_POLICY_NAME}" in " ".join(str(a) for a in associated)
        return [Observed(address=ACCESS_ENTRY, layer=LAYER, kind=self.kind, id=f"{name}|{principal}",
                         depends_on=(EKS_CLUSTER,), state={"principal": principal, "policy": "cluster-admin"},
                         healthy=admin or narrowed,
                         reason="exists" if admin else "narrowed to a namespace (aws.access-scope)" if narrowed
                         else "the admin policy is not associated")]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = aws_config(ctx)
        api = self.api(ctx)
        name = config.cluster_name
        principal = await caller_principal(api)
        await api.call("eks", "create_access_entry", clusterName=name, principalArn=principal, type="STANDARD",
                       tags=tags(ctx.record.run_id, name),
                       clientRequestToken=create_token(ctx, want.address, limits=EKS_TOKEN),
                       ok=("ResourceInUseException",))
        self.made(ctx, want, f"{name}|{principal}")
        await api.call("eks", "associate_access_policy", clusterName=name, principalArn=principal,
                       policyArn=admin_policy(config.region), accessScope={"type": "cluster"})
        yield Progress(f"{principal} is cluster admin", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        cluster, principal = have.id.split("|", 1)
        await self.api(ctx).call("eks", "delete_access_entry", clusterName=cluster, principalArn=principal,
                                 ok=_NOT_FOUND)
        yield Progress(f"access entry of {principal} deleted", 1.0)


def kubeconfig_path(ctx: Context) -> Path:
    # lazy: the kubeconfig writer only when applied; this module is on the aws target's first frame
    from targets.aws.eks import kubeconfig_path as path_for

    return path_for(aws_config(ctx).kubeconfig)


def _entries(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text()) if path.exists() else None
    except (OSError, yaml.YAMLError):
        return {}
    return doc if isinstance(doc, dict) else {}


class KubeconfigHandler(AwsHandler):
    """The context kubectl and k9s use afterwards; named by the cluster ARN, as the AWS CLI names it."""

    kind = "aws-kubeconfig"
    spec_model = KubeconfigSpec
    title = "Write the kubeconfig context"
    address = KUBECONFIG
    expected_s = 1.0
    updatable = True

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        cluster = await describe_cluster(api, aws_config(ctx).cluster_name)
        if cluster is None or (cluster.get("tags") or {}).get(RUN_TAG) != ctx.record.run_id:
            return self._left_behind(ctx)
        path = kubeconfig_path(ctx)
        doc = _entries(path)
        entry = next((c for c in doc.get("clusters") or [] if isinstance(c, dict) and c.get("name") == cluster["arn"]),
                     None)
        if entry is None:
            return []
        server = (entry.get("cluster") or {}).get("server")
        return [Observed(address=KUBECONFIG, layer=LAYER, kind=self.kind, id=f"{path}|{cluster['arn']}",
                         depends_on=(EKS_CLUSTER,), state={"path": str(path), "context": "the cluster ARN"},
                         healthy=server == cluster.get("endpoint"),
                         reason="written" if server == cluster.get("endpoint") else "points at an old endpoint")]

    def _left_behind(self, ctx: Context) -> list[Observed]:
        """The entry this run wrote, still in the file, of a cluster gone first (deleted by hand):
        teardown takes it out too, as eksctl's delete does."""
        entry = ctx.record.resources.get(KUBECONFIG)
        if entry is None or not entry.live or not entry.id or "|" not in entry.id:
            return []
        path, name = entry.id.split("|", 1)
        if not any(isinstance(c, dict) and c.get("name") == name for c in _entries(Path(path)).get("clusters") or []):
            return []
        return [Observed(address=KUBECONFIG, layer=LAYER, kind=self.kind, id=entry.id, depends_on=(EKS_CLUSTER,),
                         state={"path": path, "context": "the cluster ARN"}, healthy=False,
                         reason="its cluster is gone")]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        # lazy: the kubeconfig writer only when applied; this module is on the aws target's first frame
        from targets.aws.eks import write_kubeconfig_entry

        config = aws_config(ctx)
        cluster = await describe_cluster(self.api(ctx), config.cluster_name)
        if cluster is None or not cluster.get("endpoint"):
            raise OperationError(f"EKS cluster {config.cluster_name} has no endpoint yet",
                                 remedy="run `rtui up` again once it is active")
        path = kubeconfig_path(ctx)
        context = write_kubeconfig_entry(path, cluster_name=cluster["name"], region=config.region,
                                         endpoint=cluster["endpoint"],
                                         ca_data_b64=cluster["certificateAuthority"]["data"], arn=cluster["arn"],
                                         profile=config.profile)
        self.made(ctx, want, f"{path}|{context}")
        yield Progress(f"context {context} in {path}", 1.0)

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self.create(ctx, want):
            yield p

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        # lazy: the kubeconfig writer only when applied; this module is on the aws target's first frame
        from targets.aws.eks import remove_kubeconfig_entry

        path, name = have.id.split("|", 1)
        remove_kubeconfig_entry(path, name)
        yield Progress(f"context {name} removed from {path}", 1.0)
