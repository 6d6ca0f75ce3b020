"""The orphan sweep: after teardown, ask AWS for anything still carrying this run's tag, and
for anything at all still in the run's VPC (tagged or not).

It looks at every resource type the aws layer makes (and the network interfaces EKS and EFA
leave in our subnets), straight from the APIs, not from the record. Whatever it finds is
listed with what it still costs per hour, at the same region prices the plan used (the Pricing
API, or the built-in table labelled an estimate), asked only when something billable is left;
``rtui down`` then exits non-zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from backend.aio import all_or_none
from backend.layers.base import Context
from backend.resources import Leftover
from targets.aws.cloud.pricing import RegionPrices
from targets.aws.config import aws_config
from targets.aws.infra.api import CLUSTER_TAG, IAM_PATH, RUN_TAG, AwsApi, run_filter
from targets.aws.infra.cluster import CLOUDWATCH_LOGS_GB_MONTH
from targets.aws.infra.endpoints import live_endpoints
from targets.aws.infra.logs import find_group, log_group_name, owned_by_run
from targets.aws.infra.storage import kept_bucket

_NOT_FOUND = ("ResourceNotFoundException",)

# What a leftover bills per hour at a region's prices (the kind of Leftover.state tells which).
Bill = Callable[[RegionPrices], float]
PriceLookup = Callable[[tuple[str, ...]], Awaitable[RegionPrices]]


def _instances_of(instance_type: str, count: int = 1) -> Bill:
    return lambda prices: (prices.instance(instance_type) or 0.0) * count


def _cluster(prices: RegionPrices) -> float:
    return prices.eks_cluster_per_hour


def _nat(prices: RegionPrices) -> float:
    return prices.nat_per_hour


def _public_ip(prices: RegionPrices) -> float:
    return prices.public_ipv4_per_hour


async def sweep(api: AwsApi, ctx: Context, prices: PriceLookup) -> list[Leftover]:
    """What is left of the run; ``prices`` gives the region's prices for some instance types (the
    session's, so the plan, the matrix and the sweep quote the same figures)."""
    config = aws_config(ctx)
    run = ctx.record.run_id
    bills: dict[int, Bill] = {}
    finders: list[Callable[[], Awaitable[list[Leftover]]]] = [
        lambda: _eks(api, ctx, bills), lambda: _ec2(api, ctx, bills), lambda: _roles(api, run),
        lambda: _log_group(api, ctx),
        lambda: kept_bucket(api, ctx)]  # the run's bucket: kept on purpose while it holds data
    found = [item for group in await all_or_none(*(f() for f in finders)) for item in group]
    billed = [item for item in found if id(item) in bills]
    if billed:
        types = tuple(sorted({item.state.split(",")[0] for item in billed if item.kind in ("instance", "nodegroup")}
                             | {config.gpu_node_type, config.system_node_type}))
        quote = await prices(types)
        found = [dataclasses.replace(item, cost_per_hour=round(bills[id(item)](quote), 4), price_source=quote.source)
                 if id(item) in bills else item for item in found]
    # What bills first: a user reading one line sees the costly leftovers.
    return sorted(found, key=lambda item: -item.cost_per_hour)


def _billed(bills: dict[int, Bill], item: Leftover, bill: Bill) -> Leftover:
    bills[id(item)] = bill
    return item


async def _eks(api: AwsApi, ctx: Context, bills: dict[int, Bill]) -> list[Leftover]:
    out: list[Leftover] = []
    name = aws_config(ctx).cluster_name
    cluster = await api.call("eks", "describe_cluster", name=name, ok=_NOT_FOUND)
    if cluster is None or (cluster["cluster"].get("tags") or {}).get(RUN_TAG) != ctx.record.run_id:
        return out
    out.append(_billed(bills, Leftover("EKS cluster", name, cluster["cluster"]["status"].lower()), _cluster))
    groups = await api.pages("eks", "list_nodegroups", "nodegroups", clusterName=name)
    for group_name in groups:
        group = (await api.call("eks", "describe_nodegroup", clusterName=name, nodegroupName=group_name,
                                ok=_NOT_FOUND) or {}).get("nodegroup")
        if group is None:
            continue
        size = (group.get("scalingConfig") or {}).get("desiredSize") or 0
        instance_type = (group.get("instanceTypes") or [""])[0]
        out.append(_billed(bills, Leftover("nodegroup", f"{name}/{group_name}",
                                           f"{instance_type}, {size} nodes, {group['status'].lower()}"),
                           _instances_of(instance_type, size)))
    for addon in await api.pages("eks", "list_addons", "addons", clusterName=name):
        out.append(Leftover("EKS add-on", f"{name}/{addon}"))
    return out


async def _ec2(api: AwsApi, ctx: Context, bills: dict[int, Bill]) -> list[Leftover]:
    run = ctx.record.run_id

    async def tagged(operation: str, key: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = await api.pages("ec2", operation, key, Filters=run_filter(run))
        return found

    kinds = [("describe_vpcs", "Vpcs"), ("describe_subnets", "Subnets"),
             ("describe_internet_gateways", "InternetGateways"), ("describe_nat_gateways", "NatGateways"),
             ("describe_addresses", "Addresses"), ("describe_route_tables", "RouteTables"),
             ("describe_security_groups", "SecurityGroups"), ("describe_launch_templates", "LaunchTemplates"),
             ("describe_placement_groups", "PlacementGroups"), ("describe_network_interfaces", "NetworkInterfaces")]
    found = await all_or_none(*(tagged(operation, key) for operation, key in kinds))
    vpcs, subnets, gateways, nats, addresses, tables, groups, templates, placement, enis = found
    instances = await _instances(api, ctx, bills)
    out = [Leftover("VPC", v["VpcId"]) for v in vpcs]
    out += [Leftover("subnet", s["SubnetId"], s["AvailabilityZone"]) for s in subnets]
    out += [Leftover("internet gateway", g["InternetGatewayId"]) for g in gateways]
    out += [_billed(bills, Leftover("NAT gateway", n["NatGatewayId"], n["State"]), _nat) for n in nats
            if n["State"] != "deleted"]
    out += [_billed(bills, Leftover("Elastic IP", a["AllocationId"], a.get("PublicIp", "")), _public_ip)
            for a in addresses]
    out += [Leftover("route table", t["RouteTableId"]) for t in tables]
    out += [Leftover("VPC endpoint", e["VpcEndpointId"], f"{e.get('ServiceName', '')}, {e.get('State', '')}")
            for e in await live_endpoints(api, run_filter(run))]
    out += [Leftover("security group", g["GroupId"]) for g in groups]
    out += [Leftover("launch template", t["LaunchTemplateId"]) for t in templates]
    out += [Leftover("placement group", g["GroupName"]) for g in placement if g.get("State") != "deleted"]
    # Interfaces EKS made in our subnets carry no tag of ours: look in the subnets too.
    seen = {e["NetworkInterfaceId"] for e in enis}
    if subnets:
        more = await api.pages("ec2", "describe_network_interfaces", "NetworkInterfaces",
                               Filters=[{"Name": "subnet-id", "Values": [s["SubnetId"] for s in subnets]}])
        enis += [e for e in more if e["NetworkInterfaceId"] not in seen]
    out += [Leftover("network interface", e["NetworkInterfaceId"],
                     f"{e.get('InterfaceType', 'interface')}, {e.get('Status', '')}") for e in enis]
    out += instances
    if vpcs:
        seen_ids = {item.id for item in out}
        out += [item for item in await _in_vpcs(api, [v["VpcId"] for v in vpcs], bills) if item.id not in seen_ids]
    return out


async def _in_vpcs(api: AwsApi, vpc_ids: list[str], bills: dict[int, Bill]) -> list[Leftover]:
    """Whatever is still in the run's VPC, tagged by us or not (EKS's own security group, what a
    controller or a user made there): each of them keeps the VPC from being deleted."""
    in_vpc = [{"Name": "vpc-id", "Values": vpc_ids}]
    groups, subnets, tables, enis, gateways, nats, reservations = await all_or_none(
        api.pages("ec2", "describe_security_groups", "SecurityGroups", Filters=in_vpc),
        api.pages("ec2", "describe_subnets", "Subnets", Filters=in_vpc),
        api.pages("ec2", "describe_route_tables", "RouteTables", Filters=in_vpc),
        api.pages("ec2", "describe_network_interfaces", "NetworkInterfaces", Filters=in_vpc),
        api.pages("ec2", "describe_internet_gateways", "InternetGateways",
                  Filters=[{"Name": "attachment.vpc-id", "Values": vpc_ids}]),
        api.pages("ec2", "describe_nat_gateways", "NatGateways", Filters=in_vpc),
        api.pages("ec2", "describe_instances", "Reservations", Filters=[
            *in_vpc, {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}]))
    out = [Leftover("security group", g["GroupId"], g.get("GroupName", "")) for g in groups
           if g.get("GroupName") != "default"]
    out += [Leftover("subnet", s["SubnetId"], s["AvailabilityZone"]) for s in subnets]
    out += [Leftover("route table", t["RouteTableId"]) for t in tables
            if not any(a.get("Main") for a in t.get("Associations") or [])]
    out += [Leftover("network interface", e["NetworkInterfaceId"],
                     f"{e.get('InterfaceType', 'interface')}, {e.get('Status', '')}") for e in enis]
    out += [Leftover("internet gateway", g["InternetGatewayId"]) for g in gateways]
    out += [_billed(bills, Leftover("NAT gateway", n["NatGatewayId"], n["State"]), _nat) for n in nats
            if n["State"] not in ("deleted", "deleting")]
    out += [_billed(bills, Leftover("instance", i["InstanceId"], f"{i['InstanceType']}, {i['State']['Name']}"),
                    _instances_of(i["InstanceType"])) for r in reservations for i in r.get("Instances") or []]
    return out


async def _log_group(api: AwsApi, ctx: Context) -> list[Leftover]:
    """The control plane's log group, when it is this run's: EKS keeps it after the cluster, and its
    stored logs bill by the GB-month (no hourly figure)."""
    name = log_group_name(aws_config(ctx).cluster_name)
    found = await find_group(api, name)
    if found is None or not owned_by_run(ctx, found[1]):
        return []
    stored_mb = float(found[2].get("storedBytes") or 0) / 1e6
    return [Leftover("CloudWatch log group", name,
                     f"{stored_mb:.1f} MB stored, ${CLOUDWATCH_LOGS_GB_MONTH:.2f}/GB-month in us-east-1")]


async def _instances(api: AwsApi, ctx: Context, bills: dict[int, Bill]) -> list[Leftover]:
    reservations = await api.pages("ec2", "describe_instances", "Reservations", Filters=[
        *run_filter(ctx.record.run_id),
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])
    out = []
    for reservation in reservations:
        for instance in reservation.get("Instances") or []:
            out.append(_billed(bills, Leftover("instance", instance["InstanceId"],
                                               f"{instance['InstanceType']}, {instance['State']['Name']}"),
                               _instances_of(instance["InstanceType"])))
    return out


async def _roles(api: AwsApi, run: str) -> list[Leftover]:
    out = []
    for role in await api.pages("iam", "list_roles", "Roles", PathPrefix=IAM_PATH):
        role_tags = await api.pages("iam", "list_role_tags", "Tags", RoleName=role["RoleName"])
        if any(t["Key"] == RUN_TAG and t["Value"] == run for t in role_tags):
            out.append(Leftover("IAM role", role["RoleName"]))
    return out


async def runs_of_cluster(api: AwsApi, cluster_name: str) -> list[str]:
    """The run ids AWS has resources of for this cluster name (by our tags), newest VPC first:
    how `rtui down` finds a run whose record this machine no longer has."""
    found: list[str] = []
    cluster = await api.call("eks", "describe_cluster", name=cluster_name, ok=_NOT_FOUND)
    if cluster is not None and (cluster["cluster"].get("tags") or {}).get(RUN_TAG):
        found.append(cluster["cluster"]["tags"][RUN_TAG])
    for kind, key in (("describe_vpcs", "Vpcs"), ("describe_nat_gateways", "NatGateways"),
                      ("describe_subnets", "Subnets")):
        items = await api.pages("ec2", kind, key, Filters=[{"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster_name]}])
        for item in items:
            run = next((t["Value"] for t in item.get("Tags") or [] if t["Key"] == RUN_TAG), None)
            if run:
                found.append(run)
    return list(dict.fromkeys(found))
