"""The two IAM roles: the EKS cluster's and the nodes', each with its AWS managed policies.

Roles live under the path ``/rtui/`` and carry our tags; a role of our name without this run's
tag is refused (IAM names are global to the account, so another run's role is not ours either).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from backend.layers.aws.api import IAM_PATH, RUN_TAG, AwsApi, partition, refuse_foreign, tags
from backend.layers.aws.base import CLUSTER_ROLE, LAYER, NODE_ROLE, AwsHandler, Names
from backend.layers.base import Context
from backend.model import Action, Observed, Resource
from backend.runner import Progress

CLUSTER_POLICIES = ("AmazonEKSClusterPolicy",)
NODE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly",
                 "AmazonSSMManagedInstanceCore")
SERVICE = {CLUSTER_ROLE: "eks", NODE_ROLE: "ec2"}  # the principal's DNS suffix is the partition's


def service_principal(address: str, region: str) -> str:
    """The role's service principal as IAM knows it in the region's partition (``Partition.service_principal``:
    EC2's with aws-cn's DNS suffix there, EKS's with the standard one, as eksctl's partition mappings write them)."""
    return partition(region).service_principal(SERVICE[address])


def managed_policy_arn(policy: str, region: str) -> str:
    return f"arn:{partition(region).name}:iam::aws:policy/{policy}"


def role_name(ctx: Context, address: str) -> str:
    names = Names(ctx.config.cluster_name)
    return names.cluster_role if address == CLUSTER_ROLE else names.node_role


def trust_policy(service: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]})


async def role_arn(api: AwsApi, ctx: Context, address: str) -> str:
    role = await api.call("iam", "get_role", RoleName=role_name(ctx, address))
    return str(role["Role"]["Arn"])


class RoleHandler(AwsHandler):
    kind = "aws-iam-role"
    title = "Create an IAM role"
    updatable = True
    expected_s = 5.0

    def step_title(self, address: str, action: Action) -> str:
        if action is Action.CREATE:
            return f"Create the {address.rsplit('.', 1)[1]} IAM role"
        return super().step_title(address, action)

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        out = []
        for address in (CLUSTER_ROLE, NODE_ROLE):
            name = role_name(ctx, address)
            found = await api.call("iam", "get_role", RoleName=name, ok=("NoSuchEntity",))
            if found is None:
                continue
            role_tags = await self._tags(api, name)
            if role_tags.get(RUN_TAG) != ctx.record.run_id:
                continue  # someone else's: preflight refuses it
            attached = await api.pages("iam", "list_attached_role_policies", "AttachedPolicies", RoleName=name)
            out.append(Observed(address=address, layer=LAYER, kind=self.kind, id=name, reason="exists",
                                state={"policies": sorted(p["PolicyName"] for p in attached),
                                       "service": service_principal(address, ctx.config.region)}))
        return out

    async def foreign(self, api: AwsApi, ctx: Context) -> list[str]:
        """Our role names taken by another run or someone else (the layer's preflight refuses them)."""
        taken = []
        for address in (CLUSTER_ROLE, NODE_ROLE):
            name = role_name(ctx, address)
            if await api.call("iam", "get_role", RoleName=name, ok=("NoSuchEntity",)) is not None and \
                    (await self._tags(api, name)).get(RUN_TAG) != ctx.record.run_id:
                taken.append(name)
        return taken

    async def _tags(self, api: AwsApi, name: str) -> dict[str, str]:
        listed: list[dict[str, str]] = await api.pages("iam", "list_role_tags", "Tags", RoleName=name)
        return {t["Key"]: t["Value"] for t in listed}

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        name = role_name(ctx, want.address)
        existing = await api.call("iam", "get_role", RoleName=name, ok=("NoSuchEntity",))
        if existing is not None:
            refuse_foreign("IAM role", name, await self._tags(api, name), ctx.record.run_id)
        else:
            await api.call("iam", "create_role", RoleName=name, Path=IAM_PATH,
                           AssumeRolePolicyDocument=trust_policy(want.spec["service"]),
                           Description=f"rtui {ctx.config.cluster_name}: {want.address.rsplit('.', 1)[1]}",
                           Tags=[{"Key": k, "Value": v} for k, v in
                                 tags(ctx.record.run_id, ctx.config.cluster_name).items()],
                           ok=("EntityAlreadyExists",))
        self.made(ctx, want, name)
        async for p in self._policies(api, name, want.spec["policies"]):
            yield p

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self._policies(self.api(ctx), have.id, want.spec["policies"]):
            yield p

    async def _policies(self, api: AwsApi, name: str, wanted: list[str]) -> AsyncIterator[Progress]:
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
        yield Progress(f"{name} with {', '.join(wanted)}", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        attached: list[dict[str, Any]] = await api.pages("iam", "list_attached_role_policies", "AttachedPolicies",
                                                         RoleName=have.id)
        for policy in attached:
            await api.call("iam", "detach_role_policy", RoleName=have.id, PolicyArn=policy["PolicyArn"],
                           ok=("NoSuchEntity",))
        # A managed nodegroup's instance profile normally goes with the nodegroup; one left would block.
        profiles = await api.pages("iam", "list_instance_profiles_for_role", "InstanceProfiles", RoleName=have.id)
        for profile in profiles:
            await api.call("iam", "remove_role_from_instance_profile", RoleName=have.id,
                           InstanceProfileName=profile["InstanceProfileName"], ok=("NoSuchEntity",))
        await api.call("iam", "delete_role", RoleName=have.id, ok=("NoSuchEntity",))
        yield Progress(f"{have.id} deleted", 1.0)
