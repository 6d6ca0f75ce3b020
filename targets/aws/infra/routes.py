"""Routes and the node security group: 0.0.0.0/0 via the internet or the NAT gateway; the EFA rule."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from backend.errors import OperationError
from backend.layers.base import Context
from backend.resources import Action, Observed, Resource
from backend.runner import Progress
from targets.aws.config import aws_config
from targets.aws.infra.api import AwsApi, client_token, tag_map, tag_spec
from targets.aws.infra.common import LAYER, NODE_SG, PRIVATE_RT, PUBLIC_RT, VPC, AwsHandler, Names
from targets.aws.infra.network import GONE_CODES, delete_or_blocked, find, run_tags, subnet_ids, until_free, vpc_id
from targets.aws.infra.specs import RouteTableSpec, SecurityGroupSpec


class RouteTableHandler(AwsHandler):
    """Public: 0.0.0.0/0 to the internet gateway. Private: 0.0.0.0/0 to the NAT gateway."""

    kind = "aws-route-table"
    spec_model = RouteTableSpec
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
        role = RouteTableSpec.of(want).role
        found = await find(api, ctx, "describe_route_tables", "RouteTables", **{"rtui:role": role})
        if found:
            tid = found[0]["RouteTableId"]
        else:
            request: dict[str, Any] = {"VpcId": await vpc_id(api, ctx),
                       "TagSpecifications": tag_spec("route-table", run_tags(ctx, **{"rtui:role": role}),
                                                     f"{aws_config(ctx).cluster_name}-{role}")}
            table = await api.call("ec2", "create_route_table", **request,
                                   ClientToken=client_token(ctx.record.run_id, f"rt-{role}", request=request))
            tid = table["RouteTable"]["RouteTableId"]
        self.made(ctx, want, tid)
        async for p in self._converge(api, ctx, tid, want):
            yield p

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self._converge(self.api(ctx), ctx, have.id, want):
            yield p

    async def _converge(self, api: AwsApi, ctx: Context, tid: str, want: Resource) -> AsyncIterator[Progress]:
        if RouteTableSpec.of(want).via == "internet-gateway":
            gateways = await find(api, ctx, "describe_internet_gateways", "InternetGateways")
            if not gateways:
                raise OperationError("this run's internet gateway is gone: the public subnets have no route out",
                                     remedy="run `rtui up` again: the plan makes it anew")
            target = {"GatewayId": gateways[0]["InternetGatewayId"]}
        else:
            nats = [n for n in await find(api, ctx, "describe_nat_gateways", "NatGateways")
                    if n["State"] == "available"]
            if not nats:
                raise OperationError("no NAT gateway of this run is available: the private subnets have no route out",
                                     remedy="run `rtui up` again: the plan makes (or waits for) the NAT gateway")
            target = {"NatGatewayId": nats[0]["NatGatewayId"]}
        table = (await api.call("ec2", "describe_route_tables", RouteTableIds=[tid]))["RouteTables"][0]
        default = [r for r in table.get("Routes") or [] if r.get("DestinationCidrBlock") == "0.0.0.0/0"]
        if not default:
            await api.call("ec2", "create_route", RouteTableId=tid, DestinationCidrBlock="0.0.0.0/0", **target)
        elif not all(default[0].get(k) == v for k, v in target.items()):
            await api.call("ec2", "replace_route", RouteTableId=tid, DestinationCidrBlock="0.0.0.0/0", **target)
        associated = {a.get("SubnetId") for a in table.get("Associations") or []}
        spec = RouteTableSpec.of(want)
        wanted = await subnet_ids(api, ctx, spec.role, list(spec.azs))
        for az, sid in sorted(wanted.items()):
            if sid not in associated:
                await api.call("ec2", "associate_route_table", RouteTableId=tid, SubnetId=sid)
                yield Progress(f"{sid} ({az}) routed via the {spec.via}")
        yield Progress(f"{tid}: 0.0.0.0/0 via the {spec.via}", 1.0)

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
        await api.call("ec2", "delete_route_table", RouteTableId=have.id, ok=GONE_CODES)
        yield Progress(f"{have.id} deleted", 1.0)


class SecurityGroupHandler(AwsHandler):
    """The nodes' group, with the rule EFA needs: all traffic from and to itself, both ways."""

    kind = "aws-security-group"
    spec_model = SecurityGroupSpec
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
        config = aws_config(ctx)
        api = self.api(ctx)
        found = await find(api, ctx, "describe_security_groups", "SecurityGroups")
        if found:
            gid = found[0]["GroupId"]
        else:
            name = Names(config.cluster_name).security_group
            group = await api.call("ec2", "create_security_group", GroupName=name, VpcId=await vpc_id(api, ctx),
                                   Description=f"rtui {config.cluster_name}: GPU nodes (EFA needs all traffic "
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
            return await delete_or_blocked(api, "delete_security_group", GroupId=have.id)

        async for p in until_free(api, f"security group {have.id}", attempt, group=have.id):
            yield p


def _self_rule(group: dict[str, Any], key: str) -> bool:
    return any(p.get("IpProtocol") == "-1" and any(pair.get("GroupId") == group["GroupId"]
                                                   for pair in p.get("UserIdGroupPairs") or [])
               for p in group.get(key) or [])

