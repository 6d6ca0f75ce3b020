"""The IAM roles: the EKS cluster's, the nodes', and one per pod identity, each with its AWS managed
policies and a trust policy narrowed by the conditions AWS documents for its service.

Roles live under the path ``/rtui/`` and carry our tags; a role of our name without this run's
tag is refused (IAM names are global to the account, so another run's role is not ours either).

The nodes' role holds only what a node needs (EKS User Guide, "Amazon EKS node IAM role": the worker
node policy and pulling images); whatever a pod needs of AWS comes through EKS Pod Identity, a role
per service account (``PodIdentity``), never through the node's instance profile.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from backend.config import RunConfig
from backend.layers.base import Context
from backend.resources import Action, Observed, Resource
from backend.runner import Progress
from targets.aws.config import AwsConfig, aws_config
from targets.aws.infra import node_autoscaler
from targets.aws.infra.api import IAM_PATH, RUN_TAG, AwsApi, partition, refuse_foreign, tags
from targets.aws.infra.common import CLUSTER_ROLE, LAYER, NODE_ROLE, AwsHandler, Names
from targets.aws.infra.specs import RoleSpec
from targets.aws.infra.storage import RAY_SERVICE_ACCOUNT, RAY_WORKER_SERVICE_ACCOUNT, data_policy

CLUSTER_POLICIES = ("AmazonEKSClusterPolicy",)
NODE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryPullOnly")
POD_SERVICE = "pods.eks"
SERVICE = {CLUSTER_ROLE: "eks", NODE_ROLE: "ec2"}  # the principal's DNS suffix is the partition's
POD_ROLE_PREFIX = "aws.iam-role.pod-"
POD_IDENTITY_PREFIX = "aws.pod-identity."


@dataclass(frozen=True)
class PodIdentity:
    """A Kubernetes service account that gets AWS credentials of its own role through EKS Pod Identity
    (the ``eks-pod-identity-agent`` add-on hands them to its pods): the role, trusted by EKS Pod Identity
    (the ``pods.eks`` service principal) for that one cluster, namespace and service account, with ``policies``."""

    name: str
    namespace: str
    service_account: str
    policies: tuple[str, ...]
    why: str = ""
    # A policy of its own, inline in the role (cluster, run id, partition, the run's S3 data URI or None
    # → document): for what no AWS managed policy scopes to one run.
    inline: Callable[[str, str, str, str | None], dict[str, Any]] | None = None
    # Whether a run plans it (config, the run's S3 data URI or None; default: always).
    wanted: Callable[[RunConfig, str | None], bool] | None = None
    # Its service account lives in the run's namespace (``--namespace``), not in ``namespace``.
    in_run_namespace: bool = False

    def planned(self, config: AwsConfig, data_uri: str | None = None) -> bool:
        return self.wanted is None or self.wanted(config, data_uri)

    def namespace_in(self, run_namespace: str) -> str:
        return run_namespace if self.in_run_namespace else self.namespace

    @property
    def role_address(self) -> str:
        return POD_ROLE_PREFIX + self.name

    @property
    def address(self) -> str:
        return POD_IDENTITY_PREFIX + self.name


# The VPC CNI manages ENIs and addresses for pods: its permissions go to its own service account, not
# to every pod through the node role (EKS User Guide, "Configure Amazon VPC CNI plug-in to use IRSA/Pod
# Identity"; the vpc-cni add-on supports Pod Identity).
CNI_IDENTITY = PodIdentity("cni", "kube-system", "aws-node", ("AmazonEKS_CNI_Policy",),
                           why="the VPC CNI's ENI permissions, for its aws-node service account only")
# cluster-autoscaler changes the size of this run's GPU Auto Scaling group (issue 26): reads
# everywhere, scales only the groups carrying this cluster's discovery tag and this run's tag
# (``node_autoscaler.autoscaler_policy``). Only when idle workers go (``--idle-minutes`` not 0).
AUTOSCALER_IDENTITY = PodIdentity(
    "cluster-autoscaler", node_autoscaler.NAMESPACE, node_autoscaler.NAME, (),
    why="cluster-autoscaler's scaling of this run's GPU Auto Scaling group, for its service account only",
    inline=lambda cluster, run, part, _data: node_autoscaler.autoscaler_policy(cluster, run, partition=part),
    wanted=lambda config, _data: config.idle_timeout_s() is not None)
# The Ray pods (head and workers) write the run's checkpoints and model to S3 (issue 25): their service
# account gets a role that may touch only the run's own prefix of the bucket (``storage.data_policy``).
# Planned whenever the run's data goes to S3: the run's own bucket, or the user's ``--storage-path``.
DATA_IDENTITY = PodIdentity(
    "ray-data", "", RAY_SERVICE_ACCOUNT, (),
    why="the Ray pods' reads and writes of the run's own S3 prefix, for their service account only",
    inline=lambda cluster, run, part, data: data_policy_for(data or "", part),
    wanted=lambda config, data: bool(data and data.startswith("s3://")), in_run_namespace=True)
# The workers run as an account of their own (issue 33: never the head's, which KubeRay binds its
# autoscaler Role to), so they get the same data role through an association of their own.
DATA_WORKERS_IDENTITY = PodIdentity(
    "ray-data-workers", "", RAY_WORKER_SERVICE_ACCOUNT, (),
    why="the Ray workers' reads and writes of the run's own S3 prefix, for their own token-less service account",
    inline=lambda cluster, run, part, data: data_policy_for(data or "", part),
    wanted=lambda config, data: bool(data and data.startswith("s3://")), in_run_namespace=True)
POD_IDENTITIES: tuple[PodIdentity, ...] = (CNI_IDENTITY, AUTOSCALER_IDENTITY, DATA_IDENTITY, DATA_WORKERS_IDENTITY)
INLINE_POLICY = "rtui-scoped"  # the name of a pod identity role's inline policy


def planned_identities(config: AwsConfig, data_uri: str | None = None) -> tuple[PodIdentity, ...]:
    """The pod identities a run plans; ``data_uri`` is the run's own S3 prefix (``s3://B/P/<run id>``)."""
    return tuple(p for p in POD_IDENTITIES if p.planned(config, data_uri))


def inline_policies(address: str, cluster: str, run_id: str, region: str,
                    data_uri: str | None = None) -> dict[str, str]:
    """The role's inline policies as the plan compares them: name → the document, canonical JSON."""
    identity = pod_identity(address)
    if identity is None or identity.inline is None:
        return {}
    return {INLINE_POLICY: _canonical(identity.inline(cluster, run_id, partition(region).name, data_uri))}


def data_policy_for(data_uri: str, partition_name: str) -> dict[str, Any]:
    """``storage.data_policy`` for an ``s3://bucket/prefix`` URI."""
    bucket, _, prefix = data_uri.removeprefix("s3://").partition("/")
    return data_policy(bucket, prefix, partition_name)


def _canonical(document: Any) -> str:
    doc = json.loads(unquote(document)) if isinstance(document, str) else document
    return json.dumps(doc, sort_keys=True)


def pod_identity(address: str) -> PodIdentity | None:
    return next((p for p in POD_IDENTITIES if address in (p.address, p.role_address)), None)


def role_addresses() -> list[str]:
    return [CLUSTER_ROLE, NODE_ROLE, *(p.role_address for p in POD_IDENTITIES)]


def service_principal(address: str, region: str) -> str:
    """The role's service principal as IAM knows it in the region's partition (``Partition.service_principal``:
    EC2's with aws-cn's DNS suffix there, EKS's with the standard one, as eksctl's partition mappings write them)."""
    if pod_identity(address) is not None:
        return partition(region).service_principal(POD_SERVICE)
    return partition(region).service_principal(SERVICE[address])


def managed_policy_arn(policy: str, region: str) -> str:
    return f"arn:{partition(region).name}:iam::aws:policy/{policy}"


def role_name(ctx: Context, address: str) -> str:
    config = aws_config(ctx)
    names = Names(config.cluster_name)
    if address == CLUSTER_ROLE:
        return names.cluster_role
    if address == NODE_ROLE:
        return names.node_role
    return f"rtui-{config.cluster_name}-pod-{address.removeprefix(POD_ROLE_PREFIX)}"[:64]


def trust_statement(address: str, region: str, account: str, cluster: str, run_namespace: str) -> dict[str, Any]:
    """Who may assume the role, and under which conditions (what ``trust_policy`` writes, what observe reads).

    - The cluster role: EKS, for this account's cluster of this name only (EKS User Guide, "Cross-service
      confused deputy prevention": ``aws:SourceArn`` and ``aws:SourceAccount`` on the cluster role).
    - A pod identity's role: EKS Pod Identity (``sts:AssumeRole`` and ``sts:TagSession``), for this
      cluster, namespace and service account only, by the session tags it sets (EKS User Guide,
      "Create IAM role with trust policy required by EKS Pod Identity", "Enable or disable session tags").
    - The nodes' role: EC2, unconditioned (EC2 sets no source keys when an instance profile's role is
      assumed).
    """
    part = partition(region).name
    cluster_arn = f"arn:{part}:eks:{region}:{account}:cluster/{cluster}"
    service = service_principal(address, region)
    identity = pod_identity(address)
    if identity is not None:
        return {"Effect": "Allow", "Principal": {"Service": service}, "Action": ["sts:AssumeRole", "sts:TagSession"],
                "Condition": {"StringEquals": {"aws:SourceAccount": account,
                                               "aws:RequestTag/eks-cluster-arn": cluster_arn,
                                               "aws:RequestTag/kubernetes-namespace":
                                                   identity.namespace_in(run_namespace),
                                               "aws:RequestTag/kubernetes-service-account":
                                                   identity.service_account}}}
    if address == CLUSTER_ROLE:
        return {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": account},
                              "ArnLike": {"aws:SourceArn": cluster_arn}}}
    return {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}


def trust_policy(statement: dict[str, Any]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


def read_trust(document: Any) -> dict[str, Any]:
    """The single statement of a role's trust policy as IAM returns it (a dict, or URL-encoded JSON)."""
    doc = json.loads(unquote(document)) if isinstance(document, str) else dict(document or {})
    statements = doc.get("Statement") or []
    statements = statements if isinstance(statements, list) else [statements]
    return dict(statements[0]) if len(statements) == 1 else {"statements": statements}


def _normal(statement: dict[str, Any]) -> str:
    """A statement compared as data: one action and a list of one are the same."""
    def norm(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: norm(x) for k, x in sorted(v.items())}
        if isinstance(v, list):
            return norm(v[0]) if len(v) == 1 else sorted(norm(x) for x in v)
        return v

    return json.dumps(norm({k: v for k, v in statement.items() if k != "Sid"}), sort_keys=True)


def trust_shape(statement: dict[str, Any]) -> list[str]:
    """What the plan shows of a trust statement, free of the account: its actions and condition keys."""
    actions = statement.get("Action") or []
    conditions = statement.get("Condition") or {}
    return sorted([*(actions if isinstance(actions, list) else [actions]),
                   *(f"{op} {key}" for op, keys in conditions.items() for key in keys)])


async def role_arn(api: AwsApi, ctx: Context, address: str) -> str:
    role = await api.call("iam", "get_role", RoleName=role_name(ctx, address))
    return str(role["Role"]["Arn"])


class RoleHandler(AwsHandler):
    kind = "aws-iam-role"
    spec_model = RoleSpec
    title = "Create an IAM role"
    updatable = True
    expected_s = 5.0

    def step_title(self, address: str, action: Action) -> str:
        if action is Action.CREATE:
            return f"Create the {address.rsplit('.', 1)[1]} IAM role"
        return super().step_title(address, action)

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        out = []
        for address in role_addresses():
            name = role_name(ctx, address)
            found = await api.call("iam", "get_role", RoleName=name, ok=("NoSuchEntity",))
            if found is None:
                continue
            role_tags = await self._tags(api, name)
            if role_tags.get(RUN_TAG) != ctx.record.run_id:
                continue  # someone else's: preflight refuses it
            attached = await api.pages("iam", "list_attached_role_policies", "AttachedPolicies", RoleName=name)
            trust = read_trust(found["Role"].get("AssumeRolePolicyDocument"))
            inline = {}
            for policy in await api.pages("iam", "list_role_policies", "PolicyNames", RoleName=name):
                got = await api.call("iam", "get_role_policy", RoleName=name, PolicyName=policy, ok=("NoSuchEntity",))
                if got is not None:
                    inline[policy] = _canonical(got["PolicyDocument"])
            out.append(Observed(address=address, layer=LAYER, kind=self.kind, id=name, reason="exists",
                                state={"policies": sorted(p["PolicyName"] for p in attached), "inline": inline,
                                       "service": (trust.get("Principal") or {}).get("Service"),
                                       "trust": _normal(trust), "trust_shape": trust_shape(trust)}))
        return out

    async def foreign(self, api: AwsApi, ctx: Context) -> list[str]:
        """Our role names taken by another run or someone else (the layer's preflight refuses them)."""
        taken = []
        for address in role_addresses():
            name = role_name(ctx, address)
            if await api.call("iam", "get_role", RoleName=name, ok=("NoSuchEntity",)) is not None and \
                    (await self._tags(api, name)).get(RUN_TAG) != ctx.record.run_id:
                taken.append(name)
        return taken

    async def _tags(self, api: AwsApi, name: str) -> dict[str, str]:
        listed: list[dict[str, str]] = await api.pages("iam", "list_role_tags", "Tags", RoleName=name)
        return {t["Key"]: t["Value"] for t in listed}

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = aws_config(ctx)
        api = self.api(ctx)
        name = role_name(ctx, want.address)
        existing = await api.call("iam", "get_role", RoleName=name, ok=("NoSuchEntity",))
        if existing is not None:
            refuse_foreign("IAM role", name, await self._tags(api, name), ctx.record.run_id)
        else:
            await api.call("iam", "create_role", RoleName=name, Path=IAM_PATH,
                           AssumeRolePolicyDocument=trust_policy(await self._statement(api, ctx, want.address)),
                           Description=f"rtui {config.cluster_name}: {want.address.rsplit('.', 1)[1]}",
                           Tags=[{"Key": k, "Value": v} for k, v in
                                 tags(ctx.record.run_id, config.cluster_name).items()],
                           ok=("EntityAlreadyExists",))
        self.made(ctx, want, name)
        spec = RoleSpec.of(want)
        async for p in self._policies(api, name, spec.policies, spec.inline or {}):
            yield p

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        """The plan knows the trust's shape, not the account: the account-bound statement is compared
        when the role is updated (``update`` rewrites it when it differs)."""
        if not have.healthy:
            return super().compare(want, have)
        changed = [k for k in ("policies", "service") if have.state.get(k) != want.spec.get(k)]
        if (have.state.get("inline") or {}) != (want.spec.get("inline") or {}):
            changed.append("inline policy")
        trust = RoleSpec.of(want).trust
        if trust and have.state.get("trust_shape") != trust:
            changed.append("trust")
        if changed:
            return Action.UPDATE, f"changed: {', '.join(changed)}"
        return Action.NOOP, have.reason or "in place"

    async def _statement(self, api: AwsApi, ctx: Context, address: str) -> dict[str, Any]:
        config = aws_config(ctx)
        account = str((await api.identity())["Account"])
        return trust_statement(address, config.region, account, config.cluster_name, config.namespace)

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        statement = await self._statement(api, ctx, want.address)
        if have.state.get("trust") != _normal(statement):
            await api.call("iam", "update_assume_role_policy", RoleName=have.id, PolicyDocument=trust_policy(statement))
            yield Progress(f"{have.id}: trust policy narrowed")
        spec = RoleSpec.of(want)
        async for p in self._policies(api, have.id, spec.policies, spec.inline or {}):
            yield p

    async def _policies(self, api: AwsApi, name: str, wanted: list[str],
                        inline: dict[str, str]) -> AsyncIterator[Progress]:
        for policy, document in inline.items():
            await api.call("iam", "put_role_policy", RoleName=name, PolicyName=policy, PolicyDocument=document)
            yield Progress(f"{name}: inline policy {policy} put")
        for policy in await api.pages("iam", "list_role_policies", "PolicyNames", RoleName=name):
            if policy not in inline:
                await api.call("iam", "delete_role_policy", RoleName=name, PolicyName=policy, ok=("NoSuchEntity",))
        attached = {p["PolicyName"]: p["PolicyArn"] for p in
                    await api.pages("iam", "list_attached_role_policies", "AttachedPolicies", RoleName=name)}
        for policy in wanted:
            if policy not in attached:
                await api.call("iam", "attach_role_policy", RoleName=name,
                               PolicyArn=managed_policy_arn(policy, api.region))
                yield Progress(f"{name}: {policy} attached")
        for policy, arn in attached.items():
            if policy not in wanted:
                await api.call("iam", "detach_role_policy", RoleName=name, PolicyArn=arn, ok=("NoSuchEntity",))
        yield Progress(f"{name} with {', '.join([*wanted, *inline]) or 'no policy'}", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        attached: list[dict[str, Any]] = await api.pages("iam", "list_attached_role_policies", "AttachedPolicies",
                                                         RoleName=have.id)
        for policy in attached:
            await api.call("iam", "detach_role_policy", RoleName=have.id, PolicyArn=policy["PolicyArn"],
                           ok=("NoSuchEntity",))
        # IAM refuses to delete a role that still has inline policies (DeleteConflict).
        for name in await api.pages("iam", "list_role_policies", "PolicyNames", RoleName=have.id):
            await api.call("iam", "delete_role_policy", RoleName=have.id, PolicyName=name, ok=("NoSuchEntity",))
        # A managed nodegroup's instance profile normally goes with the nodegroup; one left would block.
        profiles = await api.pages("iam", "list_instance_profiles_for_role", "InstanceProfiles", RoleName=have.id)
        for profile in profiles:
            await api.call("iam", "remove_role_from_instance_profile", RoleName=have.id,
                           InstanceProfileName=profile["InstanceProfileName"], ok=("NoSuchEntity",))
        await api.call("iam", "delete_role", RoleName=have.id, ok=("NoSuchEntity",))
        yield Progress(f"{have.id} deleted", 1.0)
