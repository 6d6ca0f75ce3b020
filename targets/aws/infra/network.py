"""The network: VPC, subnets in two AZs, internet gateway, one NAT gateway (routes and the SG: ``routes``).

Lookups go by our tags every time (``find``), so a step that runs after a crash finds what the
crashed one made. Deleting waits out what AWS still holds: the NAT gateway until it is deleted,
and the network interfaces EKS and EFA leave in our subnets (detached ones are deleted here).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from backend.errors import OperationError
from backend.layers.base import Context
from backend.resources import Action, Observed, Resource
from backend.runner import Progress
from backend.waiting import Look, wait_until
from targets.aws.config import aws_config
from targets.aws.infra.api import AwsApi, client_token, run_filter, tag_map, tag_spec, tags
from targets.aws.infra.common import (
    IGW,
    LAYER,
    NAT,
    VPC,
    VPC_CIDR,
    AwsHandler,
    subnet_address,
)
from targets.aws.infra.specs import InternetGatewaySpec, NatGatewaySpec, SubnetSpec, VpcSpec

NAT_EXPECTED_S = 90.0
DEPENDENCY_TIMEOUT_S = 900.0  # ENIs of terminated nodes can take minutes to detach


def run_tags(ctx: Context, **extra: str) -> dict[str, str]:
    return tags(ctx.record.run_id, aws_config(ctx).cluster_name, **extra)


async def find(api: AwsApi, ctx: Context, operation: str, key: str, **extra: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = await api.pages("ec2", operation, key, Filters=run_filter(ctx.record.run_id, **extra))
    return found


async def vpc_id(api: AwsApi, ctx: Context) -> str:
    config = aws_config(ctx)
    if config.vpc_id:
        return config.vpc_id
    vpcs = await find(api, ctx, "describe_vpcs", "Vpcs")
    if not vpcs:
        raise OperationError("this run's VPC is gone", remedy="run `rtui up` again: the plan makes it anew")
    return str(vpcs[0]["VpcId"])


async def subnet_ids(api: AwsApi, ctx: Context, role: str, azs: list[str] | None = None) -> dict[str, str]:
    """AZ -> subnet id of this run's (or the given) ``role`` subnets."""
    config = aws_config(ctx)
    if role == "private" and config.private_subnet_ids:
        subnets = await api.pages("ec2", "describe_subnets", "Subnets",
                                  SubnetIds=config.private_subnet_id_list())
    else:
        subnets = await find(api, ctx, "describe_subnets", "Subnets", **{"rtui:role": role})
    out = {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}
    return {az: out[az] for az in azs if az in out} if azs is not None else out


async def security_group_id(api: AwsApi, ctx: Context) -> str:
    groups = await find(api, ctx, "describe_security_groups", "SecurityGroups")
    if not groups:
        raise OperationError("this run's node security group is gone", remedy="run `rtui up` again")
    return str(groups[0]["GroupId"])


async def until_free(api: AwsApi, what: str, attempt: Any, *, subnet: str | None = None,
                     group: str | None = None, vpc: str | None = None) -> AsyncIterator[Progress]:
    """Call ``attempt`` until AWS stops answering DependencyViolation, deleting the network interfaces
    left detached in the subnet (or on the group) meanwhile and naming, at each look, those that still
    hold it: an instance's, or another service's (requester-managed), which only that service removes."""
    service_held = False

    async def look() -> Look:
        nonlocal service_held
        if await attempt() is not None:
            return Look(True, f"{what} deleted")
        name, value = ("subnet-id", subnet) if subnet else ("vpc-id", vpc) if vpc else ("group-id", group or "")
        enis = await api.pages("ec2", "describe_network_interfaces", "NetworkInterfaces",
                               Filters=[{"Name": name, "Values": [value]}])
        # EC2 refuses to delete another service's interface (EC2 User Guide, "Requester-managed network
        # interfaces"); in a VPC the subnets went first, so nothing there is ours to delete.
        for eni in enis:
            if eni.get("Status") == "available" and not eni.get("RequesterManaged") and not vpc:
                await api.call("ec2", "delete_network_interface", NetworkInterfaceId=eni["NetworkInterfaceId"],
                               ok=("InvalidNetworkInterfaceID.NotFound",))
        holding = [e for e in enis if e.get("Status") != "available" or e.get("RequesterManaged") or vpc]
        service_held = any(e.get("RequesterManaged") for e in holding)
        shown = [eni_holder(e) for e in holding[:4]] + ([f"{len(holding) - 4} more"] if len(holding) > 4 else [])
        blocked = (f"held by {', '.join(shown)}" if holding
                   else f"{len(enis)} detached network interfaces deleted" if enis else "waiting for AWS")
        return Look(False, f"{what} in use: {blocked}")

    try:
        async for p in wait_until(look, what=f"deleting {what}", expected_s=60.0, timeout_s=DEPENDENCY_TIMEOUT_S,
                                  remedy="see the interfaces with `aws ec2 describe-network-interfaces`",
                                  clock=api.clock):
            yield p
    except OperationError as exc:
        if not (service_held and exc.message.startswith(f"deleting {what}: still")):
            raise
        raise OperationError(exc.message, remedy="remove what uses them (a Lambda function's VPC settings, a load "
                             "balancer, a VPC endpoint), or wait until AWS does; then `rtui down` again") from None


# Who made a requester-managed interface, by its InterfaceType, else by its Description's start.
_SERVICES = {"lambda": "Lambda", "network_load_balancer": "ELB", "gateway_load_balancer": "ELB",
             "gateway_load_balancer_endpoint": "VPC endpoint", "vpc_endpoint": "VPC endpoint",
             "nat_gateway": "NAT gateway", "transit_gateway": "transit gateway", "api_gateway_managed": "API Gateway"}
_DESCRIBED = (("AWS Lambda", "Lambda"), ("ELB ", "ELB"), ("Amazon EKS", "EKS"), ("VPC Endpoint", "VPC endpoint"),
              ("Interface for NAT Gateway", "NAT gateway"), ("RDS", "RDS"), ("EFS", "EFS"))


def eni_holder(eni: dict[str, Any]) -> str:
    """One interface that keeps a subnet, group or VPC in use, said as who holds it."""
    eid, kind = str(eni.get("NetworkInterfaceId")), str(eni.get("InterfaceType") or "interface")
    description = str(eni.get("Description") or "")
    if eni.get("RequesterManaged"):
        who = _SERVICES.get(kind) or next((s for start, s in _DESCRIBED if description.startswith(start)),
                                          f"requester {eni.get('RequesterId') or 'unknown'}")
        said = f" '{description}'" if description else ""
        return f"{eid} ({who}{said}, requester-managed: AWS removes it when its service lets go)"
    instance = (eni.get("Attachment") or {}).get("InstanceId")
    return f"{eid} ({kind}, " + (f"attached to {instance})" if instance else f"{eni.get('Status') or 'in use'})")


EKS_CLUSTER_TAG = "aws:eks:cluster-name"


async def delete_cluster_groups(api: AwsApi, vpc: str, cluster: str) -> AsyncIterator[Progress]:
    """Delete the ``eks-cluster-sg-*`` group EKS made for ``cluster`` when it is still in the VPC.

    EKS deletes it with the cluster unless something still uses it (the detached interfaces of the
    nodes, often), and then leaves it for good: it carries EKS's tag ``aws:eks:cluster-name``, not
    ours, and would block the VPC's deletion (DependencyViolation)."""
    groups = await api.pages("ec2", "describe_security_groups", "SecurityGroups", Filters=[
        {"Name": "vpc-id", "Values": [vpc]}, {"Name": f"tag:{EKS_CLUSTER_TAG}", "Values": [cluster]}])
    for group in groups:
        gid = str(group["GroupId"])

        async def attempt(gid: str = gid) -> bool | None:
            return await delete_or_blocked(api, "delete_security_group", GroupId=gid)

        async for p in until_free(api, f"security group {gid} (EKS's, left behind)", attempt, group=gid):
            yield p


async def delete_or_blocked(api: AwsApi, operation: str, **kwargs: Any) -> bool | None:
    """True when deleted (or already gone); None while AWS says something still depends on it."""
    try:
        await api.call("ec2", operation, ok=GONE_CODES, **kwargs)
    except OperationError as exc:
        if "DependencyViolation" in exc.message or "InvalidPlacementGroup.InUse" in exc.message:
            return None
        raise
    return True


GONE_CODES = ("InvalidVpcID.NotFound", "InvalidSubnetID.NotFound", "InvalidGroup.NotFound",
               "InvalidInternetGatewayID.NotFound", "InvalidRouteTableID.NotFound", "InvalidAllocationID.NotFound",
               "NatGatewayNotFound", "InvalidPlacementGroup.Unknown", "InvalidLaunchTemplateId.NotFound",
               "InvalidLaunchTemplateName.NotFoundException")


class VpcHandler(AwsHandler):
    kind = "aws-vpc"
    spec_model = VpcSpec
    title = "Create the VPC"
    address = VPC
    expected_s = 5.0

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        config = aws_config(ctx)
        if config.vpc_id:
            vpcs = await api.pages("ec2", "describe_vpcs", "Vpcs", VpcIds=[config.vpc_id])
            return [Observed(address=VPC, layer=LAYER, kind=self.kind, id=v["VpcId"], adopted=True,
                             state={"cidr": v["CidrBlock"]}, reason="given with --vpc-id: adopted") for v in vpcs]
        return [Observed(address=VPC, layer=LAYER, kind=self.kind, id=v["VpcId"], state={"cidr": v["CidrBlock"]},
                         reason="exists") for v in await find(api, ctx, "describe_vpcs", "Vpcs")]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        found = await find(api, ctx, "describe_vpcs", "Vpcs")
        if found:
            vid = found[0]["VpcId"]
        else:
            vpc = await api.call("ec2", "create_vpc", CidrBlock=VPC_CIDR,
                                 TagSpecifications=tag_spec("vpc", run_tags(ctx), aws_config(ctx).cluster_name))
            vid = vpc["Vpc"]["VpcId"]
        self.made(ctx, want, vid)
        # EKS nodes need both: private DNS names for the kubelet, resolution for the endpoint.
        for attribute in ("EnableDnsSupport", "EnableDnsHostnames"):
            setting: dict[str, Any] = {attribute: {"Value": True}}
            await api.call("ec2", "modify_vpc_attribute", VpcId=vid, **setting)
        yield Progress(f"{vid} ({VPC_CIDR}, DNS on)", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        async for p in delete_cluster_groups(api, have.id, aws_config(ctx).cluster_name):
            yield p
        # The NAT gateway's address, when the gateway went without rtui (by hand, or failed): it bills.
        for address in await find(api, ctx, "describe_addresses", "Addresses"):
            if not address.get("AssociationId"):
                await api.call("ec2", "release_address", AllocationId=address["AllocationId"], ok=GONE_CODES)
                yield Progress(f"released {address.get('PublicIp', address['AllocationId'])}")

        async def attempt() -> bool | None:
            return await delete_or_blocked(api, "delete_vpc", VpcId=have.id)

        async for p in until_free(api, have.id, attempt, vpc=have.id):
            yield p


class SubnetHandler(AwsHandler):
    kind = "aws-subnet"
    spec_model = SubnetSpec
    title = "Create a subnet"
    expected_s = 3.0

    def step_title(self, address: str, action: Action) -> str:
        if action is Action.CREATE:
            role, az = address.split(".")[2:4]
            return f"Create the {role} subnet in {az}"
        return super().step_title(address, action)

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        config = aws_config(ctx)
        out = []
        for s in await find(api, ctx, "describe_subnets", "Subnets"):
            role = tag_map(s.get("Tags")).get("rtui:role", "private")
            out.append(Observed(address=subnet_address(role, s["AvailabilityZone"]), layer=LAYER, kind=self.kind,
                                id=s["SubnetId"], state={"az": s["AvailabilityZone"], "cidr": s["CidrBlock"],
                                                         "role": role},
                                depends_on=(VPC,), reason="exists"))
        if config.private_subnet_ids:
            for s in await api.pages("ec2", "describe_subnets", "Subnets",
                                     SubnetIds=config.private_subnet_id_list()):
                out.append(Observed(address=subnet_address("private", s["AvailabilityZone"]), layer=LAYER,
                                    kind=self.kind, id=s["SubnetId"], adopted=True, depends_on=(VPC,),
                                    state={"az": s["AvailabilityZone"], "cidr": s["CidrBlock"], "role": "private"},
                                    reason="given with --private-subnet-ids: adopted"))
        return out

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        spec = SubnetSpec.of(want)
        role, az = spec.role, spec.az
        existing = (await subnet_ids(api, ctx, role, [az])).get(az)
        if existing is None:
            # The load-balancer controller finds subnets by these tags (public: internet-facing).
            elb = "kubernetes.io/role/elb" if role == "public" else "kubernetes.io/role/internal-elb"
            subnet = await api.call("ec2", "create_subnet", VpcId=await vpc_id(api, ctx), CidrBlock=spec.cidr,
                                    AvailabilityZone=az,
                                    TagSpecifications=tag_spec("subnet", run_tags(ctx, **{"rtui:role": role, elb: "1"}),
                                                               f"{aws_config(ctx).cluster_name}-{role}-{az}"))
            existing = subnet["Subnet"]["SubnetId"]
        self.made(ctx, want, existing)
        if role == "public":
            await api.call("ec2", "modify_subnet_attribute", SubnetId=existing, MapPublicIpOnLaunch={"Value": True})
        yield Progress(f"{existing} ({spec.cidr} in {az})", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)

        async def attempt() -> bool | None:
            return await delete_or_blocked(api, "delete_subnet", SubnetId=have.id)

        async for p in until_free(api, f"subnet {have.id}", attempt, subnet=have.id):
            yield p


class InternetGatewayHandler(AwsHandler):
    kind = "aws-internet-gateway"
    spec_model = InternetGatewaySpec
    title = "Create the internet gateway"
    address = IGW
    expected_s = 3.0

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        return [Observed(address=IGW, layer=LAYER, kind=self.kind, id=g["InternetGatewayId"], depends_on=(VPC,),
                         state={"attached": bool(g.get("Attachments"))}, reason="exists")
                for g in await find(api, ctx, "describe_internet_gateways", "InternetGateways")]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        found = await find(api, ctx, "describe_internet_gateways", "InternetGateways")
        if found:
            gid, attached = found[0]["InternetGatewayId"], bool(found[0].get("Attachments"))
        else:
            gw = await api.call("ec2", "create_internet_gateway",
                                TagSpecifications=tag_spec("internet-gateway", run_tags(ctx),
                                                           aws_config(ctx).cluster_name))
            gid, attached = gw["InternetGateway"]["InternetGatewayId"], False
        self.made(ctx, want, gid)
        if not attached:
            await api.call("ec2", "attach_internet_gateway", InternetGatewayId=gid, VpcId=await vpc_id(api, ctx))
        yield Progress(f"{gid} attached", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        for gw in await api.pages("ec2", "describe_internet_gateways", "InternetGateways",
                                  InternetGatewayIds=[have.id]):
            for attachment in gw.get("Attachments") or []:
                await api.call("ec2", "detach_internet_gateway", InternetGatewayId=have.id,
                               VpcId=attachment["VpcId"], ok=("Gateway.NotAttached",))
        await api.call("ec2", "delete_internet_gateway", InternetGatewayId=have.id, ok=GONE_CODES)
        yield Progress(f"{have.id} deleted", 1.0)


class NatGatewayHandler(AwsHandler):
    """The NAT gateway and its Elastic IP, one resource: the address exists only for the gateway."""

    kind = "aws-nat-gateway"
    spec_model = NatGatewaySpec
    title = "Create the NAT gateway"
    address = NAT
    expected_s = NAT_EXPECTED_S

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        out = []
        for nat in await api.pages("ec2", "describe_nat_gateways", "NatGateways",
                                   Filters=[*run_filter(ctx.record.run_id),
                                            {"Name": "state", "Values": ["pending", "available", "failed"]}]):
            state = nat["State"]
            out.append(Observed(address=NAT, layer=LAYER, kind=self.kind, id=nat["NatGatewayId"],
                                state={"pending": "pending" if state == "pending" else None,
                                       "subnet": nat.get("SubnetId")},
                                healthy=state != "failed", reason=f"{state}"
                                + (f": {nat.get('FailureMessage')}" if nat.get("FailureMessage") else "")))
        return out

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        if have.state.get("pending"):
            return Action.UPDATE, "pending: waiting for it"
        return (Action.NOOP, "available") if have.healthy else (Action.REPLACE, have.reason)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = aws_config(ctx)
        api = self.api(ctx)
        live = [n for n in await find(api, ctx, "describe_nat_gateways", "NatGateways")
                if n["State"] in ("pending", "available")]
        if live:
            nid = live[0]["NatGatewayId"]
        else:
            addresses = await find(api, ctx, "describe_addresses", "Addresses")
            allocation = addresses[0]["AllocationId"] if addresses else (await api.call(
                "ec2", "allocate_address", Domain="vpc",
                TagSpecifications=tag_spec("elastic-ip", run_tags(ctx), f"{config.cluster_name}-nat")))[
                "AllocationId"]
            az = NatGatewaySpec.of(want).az
            subnet = (await subnet_ids(api, ctx, "public", [az])).get(az)
            if subnet is None:
                raise OperationError(f"no public subnet of this run in {az} for the NAT gateway",
                                     remedy="run `rtui up` again: the plan makes the subnet first")
            request: dict[str, Any] = {"SubnetId": subnet, "AllocationId": allocation,
                       "TagSpecifications": tag_spec("natgateway", run_tags(ctx), config.cluster_name)}
            made_before = await api.pages("ec2", "describe_nat_gateways", "NatGateways",
                                          Filters=run_filter(ctx.record.run_id))
            token = client_token(ctx.record.run_id, "nat", str(len(made_before)), request=request)
            nat = await api.call("ec2", "create_nat_gateway", **request, ClientToken=token)
            nid = nat["NatGateway"]["NatGatewayId"]
        self.made(ctx, want, nid)
        async for p in self.wait_ready(ctx, nid):
            yield p

    def wait_ready(self, ctx: Context, resource_id: str) -> AsyncIterator[Progress]:
        api = self.api(ctx)

        async def look() -> Look:
            nat = (await api.call("ec2", "describe_nat_gateways", NatGatewayIds=[resource_id]))["NatGateways"][0]
            if nat["State"] == "failed":
                return Look(False, "failed", fatal=f"NAT gateway {resource_id} failed: "
                             f"{nat.get('FailureCode', '')} {nat.get('FailureMessage', '')}".strip(),
                             remedy="run `rtui up` again: the plan replaces it")
            return Look(nat["State"] == "available", f"NAT gateway {nat['State']}")

        return wait_until(look, what=f"NAT gateway {resource_id}", expected_s=NAT_EXPECTED_S, timeout_s=900.0,
                          clock=api.clock)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        await api.call("ec2", "delete_nat_gateway", NatGatewayId=have.id, ok=GONE_CODES)

        async def look() -> Look:
            nats = (await api.call("ec2", "describe_nat_gateways", NatGatewayIds=[have.id],
                                   ok=("NatGatewayNotFound",)) or {}).get("NatGateways") or []
            state = nats[0]["State"] if nats else "deleted"
            return Look(state == "deleted", f"NAT gateway {state}")

        async for p in wait_until(look, what=f"deleting NAT gateway {have.id}", expected_s=60.0, timeout_s=900.0,
                                  clock=api.clock):
            yield p
        for address in await find(api, ctx, "describe_addresses", "Addresses"):
            await api.call("ec2", "release_address", AllocationId=address["AllocationId"], ok=GONE_CODES)
            yield Progress(f"released {address.get('PublicIp', address['AllocationId'])}", 1.0)
