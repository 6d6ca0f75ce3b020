"""The orphan sweep: after teardown, ask AWS for anything still carrying this run's tag, and
for anything at all still in the run's VPC (tagged or not).

It looks at every resource type the aws layer makes (and the network interfaces EKS and EFA
leave in our subnets), straight from the APIs, not from the record. Whatever it finds is
listed with what it still costs per hour; ``rtui down`` then exits non-zero.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from backend.aws import catalog
from backend.layers.aws.api import CLUSTER_TAG, IAM_PATH, RUN_TAG, AwsApi, run_filter
from backend.layers.aws.base import CLUSTER_COST, PUBLIC_IPV4_PER_HOUR, instance_price
from backend.layers.base import Context
from backend.model import Leftover

_NOT_FOUND = ("ResourceNotFoundException",)


async def sweep(api: AwsApi, ctx: Context) -> list[Leftover]:
    run = ctx.record.run_id
    finders: list[Callable[[], Awaitable[list[Leftover]]]] = [
        lambda: _eks(api, ctx), lambda: _ec2(api, ctx), lambda: _roles(api, run)]
    found = await asyncio.gather(*(f() for f in finders))
    # What bills first: a user reading one line sees the costly leftovers.
    return sorted((item for group in found for item in group), key=lambda item: -item.cost_per_hour)


async def _eks(api: AwsApi, ctx: Context) -> list[Leftover]:
    out: list[Leftover] = []
    name = ctx.config.cluster_name
    cluster = await api.call("eks", "describe_cluster", name=name, ok=_NOT_FOUND)
    if cluster is None or (cluster["cluster"].get("tags") or {}).get(RUN_TAG) != ctx.record.run_id:
        return out
    out.append(Leftover("EKS cluster", name, cluster["cluster"]["status"].lower(), CLUSTER_COST))
    groups = await api.pages("eks", "list_nodegroups", "nodegroups", clusterName=name)
    for group_name in groups:
        group = (await api.call("eks", "describe_nodegroup", clusterName=name, nodegroupName=group_name,
                                ok=_NOT_FOUND) or {}).get("nodegroup")
        if group is None:
            continue
        size = (group.get("scalingConfig") or {}).get("desiredSize") or 0
        price = instance_price(ctx.config, (group.get("instanceTypes") or [""])[0]) or 0.0
        out.append(Leftover("nodegroup", f"{name}/{group_name}", group["status"].lower(), round(price * size, 4)))
    for addon in await api.pages("eks", "list_addons", "addons", clusterName=name):
        out.append(Leftover("EKS add-on", f"{name}/{addon}"))
    return out


async def _ec2(api: AwsApi, ctx: Context) -> list[Leftover]:
    run = ctx.record.run_id

    async def tagged(operation: str, key: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = await api.pages("ec2", operation, key, Filters=run_filter(run))
        return found

    kinds = [("describe_vpcs", "Vpcs"), ("describe_subnets", "Subnets"),
             ("describe_internet_gateways", "InternetGateways"), ("describe_nat_gateways", "NatGateways"),
             ("describe_addresses", "Addresses"), ("describe_route_tables", "RouteTables"),
             ("describe_security_groups", "SecurityGroups"), ("describe_launch_templates", "LaunchTemplates"),
             ("describe_placement_groups", "PlacementGroups"), ("describe_network_interfaces", "NetworkInterfaces")]
    found = await asyncio.gather(*(tagged(operation, key) for operation, key in kinds))
    vpcs, subnets, gateways, nats, addresses, tables, groups, templates, placement, enis = found
    instances = await _instances(api, ctx)
    out = [Leftover("VPC", v["VpcId"]) for v in vpcs]
    out += [Leftover("subnet", s["SubnetId"], s["AvailabilityZone"]) for s in subnets]
    out += [Leftover("internet gateway", g["InternetGatewayId"]) for g in gateways]
    out += [Leftover("NAT gateway", n["NatGatewayId"], n["State"], catalog.NAT_GATEWAY_PER_HOUR) for n in nats
            if n["State"] != "deleted"]
    out += [Leftover("Elastic IP", a["AllocationId"], a.get("PublicIp", ""), PUBLIC_IPV4_PER_HOUR) for a in addresses]
    out += [Leftover("route table", t["RouteTableId"]) for t in tables]
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
        out += [item for item in await _in_vpcs(api, [v["VpcId"] for v in vpcs]) if item.id not in seen_ids]
    return out


async def _in_vpcs(api: AwsApi, vpc_ids: list[str]) -> list[Leftover]:
    """Whatever is still in the run's VPC, tagged by us or not (EKS's own security group, what a
    controller or a user made there): each of them keeps the VPC from being deleted."""
    in_vpc = [{"Name": "vpc-id", "Values": vpc_ids}]
    groups, subnets, tables, enis, gateways, nats, reservations = await asyncio.gather(
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
    out += [Leftover("NAT gateway", n["NatGatewayId"], n["State"], catalog.NAT_GATEWAY_PER_HOUR) for n in nats
            if n["State"] not in ("deleted", "deleting")]
    out += [Leftover("instance", i["InstanceId"], f"{i['InstanceType']}, {i['State']['Name']}")
            for r in reservations for i in r.get("Instances") or []]
    return out


async def _instances(api: AwsApi, ctx: Context) -> list[Leftover]:
    reservations = await api.pages("ec2", "describe_instances", "Reservations", Filters=[
        *run_filter(ctx.record.run_id),
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])
    out = []
    for reservation in reservations:
        for instance in reservation.get("Instances") or []:
            out.append(Leftover("instance", instance["InstanceId"],
                                f"{instance['InstanceType']}, {instance['State']['Name']}",
                                instance_price(ctx.config, instance["InstanceType"]) or 0.0))
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
