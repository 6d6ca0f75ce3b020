"""The network: VPC, subnets in two AZs, internet gateway, one NAT gateway, route tables, the node SG.

Lookups go by our tags every time (``find``), so a step that runs after a crash finds what the
crashed one made. Deleting waits out what AWS still holds: the NAT gateway until it is deleted,
and the network interfaces EKS and EFA leave in our subnets (detached ones are deleted here).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from backend.errors import OperationError
from backend.layers.aws.api import AwsApi, Phase, run_filter, tag_map, tag_spec, tags, wait_until
from backend.layers.aws.base import (
    IGW,
    LAYER,
    NAT,
    NODE_SG,
    PRIVATE_RT,
    PUBLIC_RT,
    VPC,
    VPC_CIDR,
    AwsHandler,
    Names,
    subnet_address,
)
from backend.layers.base import Context
from backend.model import Action, Observed, Resource
from backend.runner import Progress

NAT_EXPECTED_S = 90.0
DEPENDENCY_TIMEOUT_S = 900.0  # ENIs of terminated nodes can take minutes to detach


def run_tags(ctx: Context, **extra: str) -> dict[str, str]:
    return tags(ctx.record.run_id, ctx.config.cluster_name, **extra)


async def find(api: AwsApi, ctx: Context, operation: str, key: str, **extra: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = await api.pages("ec2", operation, key, Filters=run_filter(ctx.record.run_id, **extra))
    return found


async def vpc_id(api: AwsApi, ctx: Context) -> str:
    if ctx.config.vpc_id:
        return ctx.config.vpc_id
    vpcs = await find(api, ctx, "describe_vpcs", "Vpcs")
    if not vpcs:
        raise OperationError("this run's VPC is gone", remedy="run `rtui up` again: the plan makes it anew")
    return str(vpcs[0]["VpcId"])


async def subnet_ids(api: AwsApi, ctx: Context, role: str, azs: list[str] | None = None) -> dict[str, str]:
    """AZ -> subnet id of this run's (or the given) ``role`` subnets."""
    if role == "private" and ctx.config.private_subnet_ids:
        subnets = await api.pages("ec2", "describe_subnets", "Subnets",
                                  SubnetIds=ctx.config.private_subnet_id_list())
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
                     group: str | None = None) -> AsyncIterator[Progress]:
    """Call ``attempt`` until AWS stops answering DependencyViolation, deleting the network interfaces
    left detached in the subnet (or on the group) meanwhile and waiting for the attached ones."""
    blocked = ""

    async def look() -> Phase:
        nonlocal blocked
        if await attempt() is not None:
            return Phase(True, f"{what} deleted")
        filters = [{"Name": "subnet-id", "Values": [subnet]}] if subnet else \
            [{"Name": "group-id", "Values": [group or ""]}]
        enis = await api.pages("ec2", "describe_network_interfaces", "NetworkInterfaces", Filters=filters)
        for eni in enis:
            if eni.get("Status") == "available":
                await api.call("ec2", "delete_network_interface", NetworkInterfaceId=eni["NetworkInterfaceId"],
                               ok=("InvalidNetworkInterfaceID.NotFound",))
        attached = [e for e in enis if e.get("Status") != "available"]
        blocked = (f"{len(attached)} network interfaces still attached "
                   f"({', '.join(sorted({e.get('InterfaceType', 'interface') for e in attached}))})"
                   if attached else f"{len(enis)} detached network interfaces deleted")
        return Phase(False, f"{what} in use: {blocked}")

    async for p in wait_until(look, what=f"deleting {what}", expected_s=60.0, timeout_s=DEPENDENCY_TIMEOUT_S,
                              remedy="see the interfaces with `aws ec2 describe-network-interfaces`"):
        yield p


async def _delete_or_blocked(api: AwsApi, operation: str, **kwargs: Any) -> bool | None:
    """True when deleted (or already gone); None while AWS says something still depends on it."""
    try:
        await api.call("ec2", operation, ok=_GONE_CODES, **kwargs)
    except OperationError as exc:
        if "DependencyViolation" in exc.message or "InvalidPlacementGroup.InUse" in exc.message:
            return None
        raise
    return True


_GONE_CODES = ("InvalidVpcID.NotFound", "InvalidSubnetID.NotFound", "InvalidGroup.NotFound",
               "InvalidInternetGatewayID.NotFound", "InvalidRouteTableID.NotFound", "InvalidAllocationID.NotFound",
               "NatGatewayNotFound", "InvalidPlacementGroup.Unknown", "InvalidLaunchTemplateId.NotFound",
               "InvalidLaunchTemplateName.NotFoundException")


class VpcHandler(AwsHandler):
    kind = "aws-vpc"
    title = "Create the VPC"
    address = VPC
    expected_s = 5.0

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        if ctx.config.vpc_id:
            vpcs = await api.pages("ec2", "describe_vpcs", "Vpcs", VpcIds=[ctx.config.vpc_id])
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
                                 TagSpecifications=tag_spec("vpc", run_tags(ctx), ctx.config.cluster_name))
            vid = vpc["Vpc"]["VpcId"]
        self.made(ctx, want, vid)
        # EKS nodes need both: private DNS names for the kubelet, resolution for the endpoint.
        for attribute in ("EnableDnsSupport", "EnableDnsHostnames"):
            setting: dict[str, Any] = {attribute: {"Value": True}}
            await api.call("ec2", "modify_vpc_attribute", VpcId=vid, **setting)
        yield Progress(f"{vid} ({VPC_CIDR}, DNS on)", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)

        async def attempt() -> bool | None:
            return await _delete_or_blocked(api, "delete_vpc", VpcId=have.id)

        async for p in until_free(api, have.id, attempt, group="none"):
            yield p


class SubnetHandler(AwsHandler):
    kind = "aws-subnet"
    title = "Create a subnet"
    expected_s = 3.0

    def step_title(self, address: str, action: Action) -> str:
        if action is Action.CREATE:
            role, az = address.split(".")[2:4]
            return f"Create the {role} subnet in {az}"
        return super().step_title(address, action)

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        out = []
        for s in await find(api, ctx, "describe_subnets", "Subnets"):
            role = tag_map(s.get("Tags")).get("rtui:role", "private")
            out.append(Observed(address=subnet_address(role, s["AvailabilityZone"]), layer=LAYER, kind=self.kind,
                                id=s["SubnetId"], state={"az": s["AvailabilityZone"], "cidr": s["CidrBlock"],
                                                         "role": role},
                                depends_on=(VPC,), reason="exists"))
        if ctx.config.private_subnet_ids:
            for s in await api.pages("ec2", "describe_subnets", "Subnets",
                                     SubnetIds=ctx.config.private_subnet_id_list()):
                out.append(Observed(address=subnet_address("private", s["AvailabilityZone"]), layer=LAYER,
                                    kind=self.kind, id=s["SubnetId"], adopted=True, depends_on=(VPC,),
                                    state={"az": s["AvailabilityZone"], "cidr": s["CidrBlock"], "role": "private"},
                                    reason="given with --private-subnet-ids: adopted"))
        return out

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        role, az = want.spec["role"], want.spec["az"]
        existing = (await subnet_ids(api, ctx, role, [az])).get(az)
        if existing is None:
            # The load-balancer controller finds subnets by these tags (public: internet-facing).
            elb = "kubernetes.io/role/elb" if role == "public" else "kubernetes.io/role/internal-elb"
            subnet = await api.call("ec2", "create_subnet", VpcId=await vpc_id(api, ctx), CidrBlock=want.spec["cidr"],
                                    AvailabilityZone=az,
                                    TagSpecifications=tag_spec("subnet", run_tags(ctx, **{"rtui:role": role, elb: "1"}),
                                                               f"{ctx.config.cluster_name}-{role}-{az}"))
            existing = subnet["Subnet"]["SubnetId"]
        self.made(ctx, want, existing)
        if role == "public":
            await api.call("ec2", "modify_subnet_attribute", SubnetId=existing, MapPublicIpOnLaunch={"Value": True})
        yield Progress(f"{existing} ({want.spec['cidr']} in {az})", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)

        async def attempt() -> bool | None:
            return await _delete_or_blocked(api, "delete_subnet", SubnetId=have.id)

        async for p in until_free(api, f"subnet {have.id}", attempt, subnet=have.id):
            yield p


class InternetGatewayHandler(AwsHandler):
    kind = "aws-internet-gateway"
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
                                TagSpecifications=tag_spec("internet-gateway", run_tags(ctx), ctx.config.cluster_name))
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
        await api.call("ec2", "delete_internet_gateway", InternetGatewayId=have.id, ok=_GONE_CODES)
        yield Progress(f"{have.id} deleted", 1.0)


class NatGatewayHandler(AwsHandler):
    """The NAT gateway and its Elastic IP, one resource: the address exists only for the gateway."""

    kind = "aws-nat-gateway"
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
        api = self.api(ctx)
        live = [n for n in await find(api, ctx, "describe_nat_gateways", "NatGateways")
                if n["State"] in ("pending", "available")]
        if live:
            nid = live[0]["NatGatewayId"]
        else:
            addresses = await find(api, ctx, "describe_addresses", "Addresses")
            allocation = addresses[0]["AllocationId"] if addresses else (await api.call(
                "ec2", "allocate_address", Domain="vpc",
                TagSpecifications=tag_spec("elastic-ip", run_tags(ctx), f"{ctx.config.cluster_name}-nat")))[
                "AllocationId"]
            subnet = (await subnet_ids(api, ctx, "public", [want.spec["az"]]))[want.spec["az"]]
            nat = await api.call("ec2", "create_nat_gateway", SubnetId=subnet, AllocationId=allocation,
                                 ClientToken=f"{ctx.record.run_id}-nat-{allocation}",
                                 TagSpecifications=tag_spec("natgateway", run_tags(ctx), ctx.config.cluster_name))
            nid = nat["NatGateway"]["NatGatewayId"]
        self.made(ctx, want, nid)
        async for p in self.wait_ready(ctx, nid):
            yield p

    def wait_ready(self, ctx: Context, resource_id: str) -> AsyncIterator[Progress]:
        api = self.api(ctx)

        async def look() -> Phase:
            nat = (await api.call("ec2", "describe_nat_gateways", NatGatewayIds=[resource_id]))["NatGateways"][0]
            if nat["State"] == "failed":
                return Phase(False, "failed", failed=f"NAT gateway {resource_id} failed: "
                             f"{nat.get('FailureCode', '')} {nat.get('FailureMessage', '')}".strip(),
                             remedy="run `rtui up` again: the plan replaces it")
            return Phase(nat["State"] == "available", f"NAT gateway {nat['State']}")

        return wait_until(look, what=f"NAT gateway {resource_id}", expected_s=NAT_EXPECTED_S, timeout_s=900.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        await api.call("ec2", "delete_nat_gateway", NatGatewayId=have.id, ok=_GONE_CODES)

        async def look() -> Phase:
            nats = (await api.call("ec2", "describe_nat_gateways", NatGatewayIds=[have.id],
                                   ok=("NatGatewayNotFound",)) or {}).get("NatGateways") or []
            state = nats[0]["State"] if nats else "deleted"
            return Phase(state == "deleted", f"NAT gateway {state}")

        async for p in wait_until(look, what=f"deleting NAT gateway {have.id}", expected_s=60.0, timeout_s=900.0):
            yield p
        for address in await find(api, ctx, "describe_addresses", "Addresses"):
            await api.call("ec2", "release_address", AllocationId=address["AllocationId"], ok=_GONE_CODES)
            yield Progress(f"released {address.get('PublicIp', address['AllocationId'])}", 1.0)


class RouteTableHandler(AwsHandler):
    """Public: 0.0.0.0/0 to the internet gateway. Private: 0.0.0.0/0 to the NAT gateway."""

    kind = "aws-route-table"
    title = "Create a route table"
    updatable = True
    expected_s = 3.0

    def step_title(self, address: str, action: Action) -> str:
        if action is Action.CREATE:
            return f"Route the {address.rsplit('.', 1)[1]} subnets"
        return super().step_title(address, action)

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        subnets = {s["SubnetId"]: s["AvailabilityZone"] for s in await find(api, ctx, "describe_subnets", "Subnets")}
        out = []
        for table in await find(api, ctx, "describe_route_tables", "RouteTables"):
            role = tag_map(table.get("Tags")).get("rtui:role", "private")
            azs = sorted(subnets[a["SubnetId"]] for a in table.get("Associations") or []
                         if a.get("SubnetId") in subnets)
            default = [r for r in table.get("Routes") or [] if r.get("DestinationCidrBlock") == "0.0.0.0/0"]
            via = ("internet-gateway" if default and default[0].get("GatewayId", "").startswith("igw-") else
                   "nat-gateway" if default and default[0].get("NatGatewayId") else "none")
            address = PUBLIC_RT if role == "public" else PRIVATE_RT
            out.append(Observed(address=address, layer=LAYER, kind=self.kind, id=table["RouteTableId"],
                                state={"role": role, "azs": azs, "via": via}, depends_on=(VPC,), reason="exists"))
        return out

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        role = want.spec["role"]
        found = await find(api, ctx, "describe_route_tables", "RouteTables", **{"rtui:role": role})
        if found:
            tid = found[0]["RouteTableId"]
        else:
            table = await api.call("ec2", "create_route_table", VpcId=await vpc_id(api, ctx),
                                   TagSpecifications=tag_spec("route-table", run_tags(ctx, **{"rtui:role": role}),
                                                              f"{ctx.config.cluster_name}-{role}"))
            tid = table["RouteTable"]["RouteTableId"]
        self.made(ctx, want, tid)
        async for p in self._converge(api, ctx, tid, want):
            yield p

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self._converge(self.api(ctx), ctx, have.id, want):
            yield p

    async def _converge(self, api: AwsApi, ctx: Context, tid: str, want: Resource) -> AsyncIterator[Progress]:
        if want.spec["via"] == "internet-gateway":
            gateways = await find(api, ctx, "describe_internet_gateways", "InternetGateways")
            target = {"GatewayId": gateways[0]["InternetGatewayId"]}
        else:
            nats = [n for n in await find(api, ctx, "describe_nat_gateways", "NatGateways")
                    if n["State"] == "available"]
            target = {"NatGatewayId": nats[0]["NatGatewayId"]}
        table = (await api.call("ec2", "describe_route_tables", RouteTableIds=[tid]))["RouteTables"][0]
        default = [r for r in table.get("Routes") or [] if r.get("DestinationCidrBlock") == "0.0.0.0/0"]
        if not default:
            await api.call("ec2", "create_route", RouteTableId=tid, DestinationCidrBlock="0.0.0.0/0", **target)
        elif not all(default[0].get(k) == v for k, v in target.items()):
            await api.call("ec2", "replace_route", RouteTableId=tid, DestinationCidrBlock="0.0.0.0/0", **target)
        associated = {a.get("SubnetId") for a in table.get("Associations") or []}
        wanted = await subnet_ids(api, ctx, want.spec["role"], list(want.spec["azs"]))
        for az, sid in sorted(wanted.items()):
            if sid not in associated:
                await api.call("ec2", "associate_route_table", RouteTableId=tid, SubnetId=sid)
                yield Progress(f"{sid} ({az}) routed via the {want.spec['via']}")
        yield Progress(f"{tid}: 0.0.0.0/0 via the {want.spec['via']}", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        tables = (await api.call("ec2", "describe_route_tables", RouteTableIds=[have.id],
                                 ok=("InvalidRouteTableID.NotFound",)) or {}).get("RouteTables") or []
        for table in tables:
            for association in table.get("Associations") or []:
                if not association.get("Main"):
                    await api.call("ec2", "disassociate_route_table",
                                   AssociationId=association["RouteTableAssociationId"],
                                   ok=("InvalidAssociationID.NotFound",))
        await api.call("ec2", "delete_route_table", RouteTableId=have.id, ok=_GONE_CODES)
        yield Progress(f"{have.id} deleted", 1.0)


class SecurityGroupHandler(AwsHandler):
    """The nodes' group, with the rule EFA needs: all traffic from and to itself, both ways."""

    kind = "aws-security-group"
    title = "Create the node security group (EFA rule)"
    address = NODE_SG
    updatable = True
    expected_s = 3.0

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        out = []
        for group in await find(api, ctx, "describe_security_groups", "SecurityGroups"):
            out.append(Observed(address=NODE_SG, layer=LAYER, kind=self.kind, id=group["GroupId"],
                                state={"efa_rule": _self_rule(group, "IpPermissions")
                                       and _self_rule(group, "IpPermissionsEgress")},
                                depends_on=(VPC,), reason="exists"))
        return out

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        found = await find(api, ctx, "describe_security_groups", "SecurityGroups")
        if found:
            gid = found[0]["GroupId"]
        else:
            name = Names(ctx.config.cluster_name).security_group
            group = await api.call("ec2", "create_security_group", GroupName=name, VpcId=await vpc_id(api, ctx),
                                   Description=f"rtui {ctx.config.cluster_name}: GPU nodes (EFA needs all traffic "
                                               "to and from this group)",
                                   TagSpecifications=tag_spec("security-group", run_tags(ctx), name))
            gid = group["GroupId"]
        self.made(ctx, want, gid)
        async for p in self._rules(api, gid):
            yield p

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self._rules(self.api(ctx), have.id):
            yield p

    async def _rules(self, api: AwsApi, gid: str) -> AsyncIterator[Progress]:
        rule = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": gid, "Description": "EFA: all traffic "
                                                                                          "within the group"}]}]
        for operation in ("authorize_security_group_ingress", "authorize_security_group_egress"):
            await api.call("ec2", operation, GroupId=gid, IpPermissions=rule, ok=("InvalidPermission.Duplicate",))
        yield Progress(f"{gid}: all traffic to and from itself, in and out", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)

        async def attempt() -> bool | None:
            return await _delete_or_blocked(api, "delete_security_group", GroupId=have.id)

        async for p in until_free(api, f"security group {have.id}", attempt, group=have.id):
            yield p


def _self_rule(group: dict[str, Any], key: str) -> bool:
    return any(p.get("IpProtocol") == "-1" and any(pair.get("GroupId") == group["GroupId"]
                                                   for pair in p.get("UserIdGroupPairs") or [])
               for p in group.get(key) or [])

