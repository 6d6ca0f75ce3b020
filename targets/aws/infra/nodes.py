"""The nodes: a cluster placement group, the GPU launch template (an EFA per network card), two nodegroups.

A nodegroup that fails says why in AWS's words: its health issues and the last scaling
activity of its Auto Scaling group. Insufficient capacity is its own error (``CapacityError``)
so ``--az-failover`` can move the GPU nodes to the next feasible AZ.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from backend.errors import NoCapacity, OperationError
from backend.layers.base import Context
from backend.ledger import BILLING
from backend.resources import Action, Observed, Resource
from backend.runner import Progress
from backend.waiting import Look, wait_until
from targets.aws.config import aws_config
from targets.aws.infra import node_autoscaler as na
from targets.aws.infra.api import EKS_TOKEN, RUN_TAG, AwsApi, tag_map, tag_spec, tags
from targets.aws.infra.cluster import describe_cluster
from targets.aws.infra.common import (
    GPU_ASG_TAGS,
    GPU_NODES,
    LAUNCH_TEMPLATE,
    LAYER,
    NODE_ROLE,
    PLACEMENT_GROUP,
    SYSTEM_LAUNCH_TEMPLATE,
    SYSTEM_NODES,
    AwsHandler,
    Names,
    create_token,
)
from targets.aws.infra.iam import role_arn
from targets.aws.infra.network import find, run_tags, security_group_id, subnet_ids
from targets.aws.infra.specs import AsgTagsSpec, LaunchTemplateSpec, NodegroupSpec, PlacementGroupSpec

NODEGROUP_EXPECTED_S = 240.0
NODEGROUP_DELETE_S = 300.0
_NOT_FOUND = ("ResourceNotFoundException",)
ICE = "InsufficientInstanceCapacity"
LAUNCH_TEMPLATE_TOKEN = (1, 128)  # CreateLaunchTemplate takes longer tokens than other EC2 calls
# IMDSv2 only, and its token answers travel one hop: the node itself, never a pod behind the CNI (a
# pod would otherwise take the node role's credentials). EKS's AL2023 AMIs default to a hop limit of 2
# (ImdsSupport v2.0), so every nodegroup has a launch template that says 1. Pods needing AWS get
# their own role through EKS Pod Identity, whose agent runs on the host network.
METADATA_OPTIONS = {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"}


class CapacityError(NoCapacity):
    """AWS had no capacity for the GPU type in this AZ (the nodegroup could not launch its nodes)."""

    def __init__(self, message: str, *, az: str, remedy: str | None = None) -> None:
        super().__init__(message, az=az, code=ICE, remedy=remedy)


class PlacementGroupHandler(AwsHandler):
    kind = "aws-placement-group"
    spec_model = PlacementGroupSpec
    title = "Create the cluster placement group"
    address = PLACEMENT_GROUP
    expected_s = 2.0

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        return [Observed(address=PLACEMENT_GROUP, layer=LAYER, kind=self.kind, id=g["GroupName"],
                         state={"strategy": g.get("Strategy"), "az": tag_map(g.get("Tags")).get("rtui:az")},
                         reason=g.get("State", "available"))
                for g in await find(api, ctx, "describe_placement_groups", "PlacementGroups")
                if g.get("State") not in ("deleting", "deleted")]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        az = PlacementGroupSpec.of(want).az
        name = Names(aws_config(ctx).cluster_name).placement_group(az)
        await api.call("ec2", "create_placement_group", GroupName=name, Strategy="cluster",
                       TagSpecifications=tag_spec("placement-group", run_tags(ctx, **{"rtui:az": az})),
                       ok=("InvalidPlacementGroup.Duplicate",))
        self.made(ctx, want, name)
        yield Progress(f"{name} (cluster strategy: the GPU nodes on one network spine)", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        config = aws_config(ctx)
        api = self.api(ctx)
        # AWS refuses to delete a group its instances run in (InvalidPlacementGroup.InUse). When a
        # failover moves the GPU nodes, this step runs before the nodegroup's own replacement:
        # the nodegroup whose launch template names the group goes first, and is waited for.
        cluster, name = config.cluster_name, Names(config.cluster_name).gpu_nodegroup
        if await _placed_in(api, cluster, name, have.id):
            async for p in delete_nodegroup(api, cluster, name):
                yield p

        async def look() -> Look:
            try:
                await api.call("ec2", "delete_placement_group", GroupName=have.id,
                               ok=("InvalidPlacementGroup.Unknown",))
            except OperationError as exc:
                if "InUse" in exc.message:
                    return Look(False, "instances still in the group")
                raise
            return Look(True, f"{have.id} deleted")

        async for p in wait_until(look, what=f"deleting placement group {have.id}", expected_s=30.0, timeout_s=900.0,
                                  clock=api.clock):
            yield p


def launch_template_data(ctx: Context, groups: list[str], want: Resource) -> dict[str, Any]:
    """``groups``: the EKS cluster security group and the EFA group. EKS adds its cluster group only to
    nodes whose launch template names none; a template that names only the EFA group would cut the GPU
    nodes off the system node (the Ray head, CoreDNS), whose only group admits just itself."""
    node_tags, spec = run_tags(ctx), LaunchTemplateSpec.of(want)
    data: dict[str, Any] = {
        "NetworkInterfaces": network_interfaces(groups, spec.efa_interfaces if spec.efa else 0),
        "MetadataOptions": dict(METADATA_OPTIONS),
        "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {
            "VolumeSize": spec.volume_gb, "VolumeType": "gp3", "DeleteOnTermination": True}}],
        "TagSpecifications": [*tag_spec("instance", node_tags, f"{aws_config(ctx).cluster_name}-gpu"),
                              *tag_spec("network-interface", node_tags), *tag_spec("volume", node_tags)],
    }
    if spec.placement_group:  # none for a Capacity Block or an ODCR held outside any group
        data["Placement"] = {"GroupName": spec.placement_group}
    # A targeted ODCR or a Capacity Block takes only instances that name it (EC2 API reference,
    # CapacityReservationSpecification); a Capacity Block also wants the capacity-block market (EKS User
    # Guide, capacity-blocks-mng). Open ODCRs need nothing: matching instances land in them by default.
    if spec.reservation:
        data["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": spec.reservation}}
        if spec.capacity_block:
            data["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    return data


def system_launch_template_data(ctx: Context, want: Resource) -> dict[str, Any]:
    """The system nodes' template: metadata options and the root disk only. It names no security group
    and no network interface, so EKS still puts the nodes in the cluster security group (EKS User
    Guide, "Customize managed nodes with launch templates"), as it did without a template."""
    node_tags = run_tags(ctx)
    return {
        "MetadataOptions": dict(METADATA_OPTIONS),
        "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {
            "VolumeSize": LaunchTemplateSpec.of(want).volume_gb, "VolumeType": "gp3", "DeleteOnTermination": True}}],
        "TagSpecifications": [*tag_spec("instance", node_tags, f"{aws_config(ctx).cluster_name}-system"),
                              *tag_spec("volume", node_tags)],
    }


def network_interfaces(groups: list[str], efa: int) -> list[dict[str, Any]]:
    """One EFA interface per network card. EC2 User Guide, "Maximize network bandwidth on instances
    with multiple network cards" (efa-acc-inst-types): the primary interface on network card 0 at
    device index 0; every further one on the next network card at device index 1."""
    def interface(card: int) -> dict[str, Any]:
        out: dict[str, Any] = {"DeviceIndex": 0 if card == 0 else 1, "NetworkCardIndex": card,
                               "Groups": list(groups), "DeleteOnTermination": True}
        if efa:
            out["InterfaceType"] = "efa"
        return out

    return [interface(card) for card in range(max(1, efa))]


async def node_groups(api: AwsApi, ctx: Context) -> list[str]:
    """The GPU nodes' security groups: the EKS cluster's own (reachability to the system node and the
    control plane) and this run's EFA group (all traffic between the GPU nodes)."""
    config = aws_config(ctx)
    cluster = await describe_cluster(api, config.cluster_name)
    cluster_group = ((cluster or {}).get("resourcesVpcConfig") or {}).get("clusterSecurityGroupId")
    if not cluster_group:
        raise OperationError(f"EKS cluster {config.cluster_name} reports no cluster security group yet",
                             remedy="run `rtui up` again once the cluster is active")
    return [str(cluster_group), await security_group_id(api, ctx)]


class LaunchTemplateHandler(AwsHandler):
    """Both nodegroups' launch templates: the GPU nodes' (EFA interfaces, placement, reservation) and
    the system nodes' (metadata options and disk only), told apart by their names."""

    kind = "aws-launch-template"
    spec_model = LaunchTemplateSpec
    title = "Create the GPU launch template (EFA interface, IMDSv2)"
    address = LAUNCH_TEMPLATE
    expected_s = 2.0

    def step_title(self, address: str, action: Action) -> str:
        if action is Action.CREATE and address == SYSTEM_LAUNCH_TEMPLATE:
            return "Create the system launch template (IMDSv2, hop limit 1)"
        return super().step_title(address, action)

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        if want.address == SYSTEM_LAUNCH_TEMPLATE and have.healthy:
            disk, needed = have.state.get("volume_gb"), LaunchTemplateSpec.of(want).volume_gb
            if disk is not None and disk > needed:  # a bigger disk than needed stays
                want = want.model_copy(update={"spec": {**want.spec, "volume_gb": disk}})
        return super().compare(want, have)

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        config = aws_config(ctx)
        out = []
        templates = await find(api, ctx, "describe_launch_templates", "LaunchTemplates")
        cluster = await describe_cluster(api, config.cluster_name) if templates else None
        system_name = Names(config.cluster_name).system_launch_template
        for template in templates:
            versions = await api.call("ec2", "describe_launch_template_versions",
                                      LaunchTemplateId=template["LaunchTemplateId"], Versions=["$Latest"])
            data = (versions.get("LaunchTemplateVersions") or [{}])[0].get("LaunchTemplateData") or {}
            metadata = data.get("MetadataOptions") or {}
            volume_gb = ((data.get("BlockDeviceMappings") or [{}])[0].get("Ebs") or {}).get("VolumeSize")
            hop_limit = metadata.get("HttpPutResponseHopLimit")
            common = {"volume_gb": volume_gb, "imdsv2": metadata.get("HttpTokens") == "required",
                      "imds_hop_limit": None if hop_limit is None else int(hop_limit),
                      "version": template.get("LatestVersionNumber")}
            if template.get("LaunchTemplateName") == system_name:
                out.append(Observed(address=SYSTEM_LAUNCH_TEMPLATE, layer=LAYER, kind=self.kind,
                                    id=template["LaunchTemplateId"], state=common, reason="exists"))
                continue
            interface = (data.get("NetworkInterfaces") or [{}])[0]
            cluster_group = ((cluster or {}).get("resourcesVpcConfig") or {}).get("clusterSecurityGroupId")
            out.append(Observed(address=LAUNCH_TEMPLATE, layer=LAYER, kind=self.kind, id=template["LaunchTemplateId"],
                                state={**common,
                                       "efa": interface.get("InterfaceType") == "efa",
                                       "efa_interfaces": sum(1 for nic in data.get("NetworkInterfaces") or []
                                                             if nic.get("InterfaceType") == "efa"),
                                       "placement_group": (data.get("Placement") or {}).get("GroupName"),
                                       "reservation": ((data.get("CapacityReservationSpecification") or {})
                                                       .get("CapacityReservationTarget") or {})
                                       .get("CapacityReservationId"),
                                       "capacity_block": (data.get("InstanceMarketOptions") or {})
                                       .get("MarketType") == "capacity-block",
                                       "cluster_sg": cluster_group is not None and all(
                                           cluster_group in (nic.get("Groups") or [])
                                           for nic in data.get("NetworkInterfaces") or [{}])},
                                reason="exists"))
        return out

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        names = Names(aws_config(ctx).cluster_name)
        system, spec = want.address == SYSTEM_LAUNCH_TEMPLATE, LaunchTemplateSpec.of(want)
        name = names.system_launch_template if system else names.launch_template
        found = [t for t in await find(api, ctx, "describe_launch_templates", "LaunchTemplates")
                 if t.get("LaunchTemplateName") == name]
        if found:
            tid = found[0]["LaunchTemplateId"]
        else:
            data = (system_launch_template_data(ctx, want) if system
                    else launch_template_data(ctx, await node_groups(api, ctx), want))
            template = await api.call(
                "ec2", "create_launch_template", LaunchTemplateName=name,
                ClientToken=create_token(ctx, want.address,
                                         *([] if system else [spec.placement_group or "no-group"]),
                                         limits=LAUNCH_TEMPLATE_TOKEN),
                LaunchTemplateData=data, TagSpecifications=tag_spec("launch-template", run_tags(ctx)))
            tid = template["LaunchTemplate"]["LaunchTemplateId"]
        self.made(ctx, want, tid)
        efa = spec.efa_interfaces if spec.efa else 0
        yield Progress(f"{tid}: " + (f"{efa} EFA interface{'s' if efa > 1 else ''} (one per network card), "
                                     if efa else "") + "IMDSv2 only, hop limit 1, "
                       f"{spec.volume_gb} GB root", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        await self.api(ctx).call("ec2", "delete_launch_template", LaunchTemplateId=have.id,
                                 ok=("InvalidLaunchTemplateId.NotFound", "InvalidLaunchTemplateId.Malformed"))
        yield Progress(f"{have.id} deleted", 1.0)


async def failure_report(api: AwsApi, nodegroup: dict[str, Any]) -> tuple[str, bool]:
    """AWS's reasons a nodegroup failed: its health issues and its ASG's last scaling activity."""
    issues = (nodegroup.get("health") or {}).get("issues") or []
    parts = [f"{i.get('code')}: {i.get('message')}" for i in issues]
    groups = [g["name"] for g in (nodegroup.get("resources") or {}).get("autoScalingGroups") or [] if g.get("name")]
    for group in groups[:1]:
        activities = (await api.call("autoscaling", "describe_scaling_activities", AutoScalingGroupName=group,
                                     MaxRecords=5, ok=("ValidationError",)) or {}).get("Activities") or []
        failed = [a for a in activities if a.get("StatusCode") in ("Failed", "Cancelled")]
        said = failed[0].get("StatusMessage", "") if failed else ""
        if said and not any(said in p for p in parts):
            parts.append(f"last scaling activity of {group}: {said}")
    text = "; ".join(p for p in parts if p) or "no reason given"
    return text, ICE in text


async def launch_shortfall(api: AwsApi, nodegroup: dict[str, Any]) -> str | None:
    """Why the nodegroup's Auto Scaling group could not launch for lack of capacity, while EKS still says
    CREATING (None: no such try). The group tries at once and records each failed try as a scaling
    activity; EKS keeps retrying and says CREATE_FAILED only minutes later (Auto Scaling User Guide,
    "Troubleshoot ... EC2 instance launch failures"; EKS API reference, Issue AsgInstanceLaunchFailures)."""
    created = nodegroup.get("createdAt")
    for group in [g["name"] for g in (nodegroup.get("resources") or {}).get("autoScalingGroups") or []
                  if g.get("name")][:1]:
        activities = (await api.call("autoscaling", "describe_scaling_activities", AutoScalingGroupName=group,
                                     MaxRecords=5, ok=("ValidationError",)) or {}).get("Activities") or []
        for activity in activities:
            said = str(activity.get("StatusMessage") or "")
            started = activity.get("StartTime")
            recent = created is None or started is None or started >= created  # not a group of the same name before
            if activity.get("StatusCode") == "Failed" and ICE in said and recent:
                return f"last scaling activity of {group}: {said}"
    return None


class NodegroupHandler(AwsHandler):
    kind = "aws-nodegroup"
    spec_model = NodegroupSpec
    title = "Create a managed nodegroup"
    expected_s = NODEGROUP_EXPECTED_S
    updatable = True

    def step_title(self, address: str, action: Action) -> str:
        if action is Action.CREATE:
            return f"Create the {address.rsplit('.', 1)[1]} nodes"
        return super().step_title(address, action)

    def names(self, ctx: Context) -> dict[str, str]:
        n = Names(aws_config(ctx).cluster_name)
        return {SYSTEM_NODES: n.system_nodegroup, GPU_NODES: n.gpu_nodegroup}

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        cluster = await describe_cluster(api, aws_config(ctx).cluster_name)
        if cluster is None or (cluster.get("tags") or {}).get(RUN_TAG) != ctx.record.run_id:
            return []
        # Ours by tag, and those given with --private-subnet-ids (adopted, untagged).
        subnets = {az_subnet: az for az, az_subnet in (await subnet_ids(api, ctx, "private")).items()}
        subnets.update({s["SubnetId"]: s["AvailabilityZone"] for s in await find(api, ctx, "describe_subnets",
                                                                                 "Subnets")})
        out = []
        for address, name in self.names(ctx).items():
            group = (await api.call("eks", "describe_nodegroup", clusterName=cluster["name"], nodegroupName=name,
                                    ok=_NOT_FOUND) or {}).get("nodegroup")
            if group is None:
                continue
            status = group["status"]
            scaling = group.get("scalingConfig") or {}
            healthy = status not in ("CREATE_FAILED", "DELETING", "DELETE_FAILED", "DEGRADED")
            reason = status.lower()
            if not healthy:
                reason += f": {(await failure_report(api, group))[0]}"
            out.append(Observed(
                address=address, layer=LAYER, kind=self.kind, id=f"{cluster['name']}/{name}",
                state={"instance_type": (group.get("instanceTypes") or [None])[0],
                       "instance_types": list(group.get("instanceTypes") or []),
                       "size": scaling.get("desiredSize"), "min_size": scaling.get("minSize"),
                       "max_size": scaling.get("maxSize"),
                       "capacity_type": group.get("capacityType") or "ON_DEMAND",
                       "disk_gb": group.get("diskSize") or await _template_disk(api, group),
                       "launch_template": bool((group.get("launchTemplate") or {}).get("id")),
                       "azs": sorted({subnets.get(s, s) for s in group.get("subnets") or []}),
                       "pending": "creating" if status == "CREATING" else "updating" if status == "UPDATING" else None},
                healthy=healthy, reason=reason))
        return out

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        if have.state.get("pending") or not have.healthy:
            return super().compare(want, have)
        def same(key: str) -> bool:  # AZs are a set: observed sorted, planned GPU AZ first
            have_v, want_v = have.state.get(key), want.spec.get(key)
            return sorted(have_v or []) == sorted(want_v or []) if key == "azs" else have_v == want_v

        replaced: list[str] = [k for k in ("instance_type", "azs", "capacity_type", "launch_template")
                               if k in want.spec and not same(k)]
        spec = NodegroupSpec.of(want)
        if have.state.get("instance_types") and have.state["instance_types"] != spec.types():
            # UpdateNodegroupConfig changes sizes, labels and taints: the types are fixed when the group is made.
            replaced.append("instance types")
        if replaced:
            return Action.REPLACE, f"changed: {', '.join(replaced)}"
        disk, needed = have.state.get("disk_gb"), spec.disk_gb
        if disk is not None and needed is not None and disk < needed:  # a bigger disk than needed stays
            return Action.REPLACE, f"disk {disk} GB, the image needs {needed} GB"
        # The bounds are ours; the size within them is cluster-autoscaler's once the group may shrink
        # (min below max): a size it chose is not drift to undo.
        low, high = spec.bounds()
        if (have.state.get("min_size"), have.state.get("max_size")) != (low, high):
            if have.state.get("max_size") != high:
                return Action.UPDATE, f"size {have.state.get('size')} → {spec.size}"
            return Action.UPDATE, f"minimum size {have.state.get('min_size')} → {low}"
        if low == high and have.state.get("size") != spec.size:
            return Action.UPDATE, f"size {have.state.get('size')} → {spec.size}"
        return Action.NOOP, have.reason

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        cluster, name = aws_config(ctx).cluster_name, self.names(ctx)[want.address]
        spec = NodegroupSpec.of(want)
        subnets = await subnet_ids(api, ctx, "private", list(spec.azs))
        request: dict[str, Any] = {
            "clusterName": cluster, "nodegroupName": name, "nodeRole": await role_arn(api, ctx, NODE_ROLE),
            "subnets": [subnets[az] for az in spec.azs], "instanceTypes": spec.types(),
            "amiType": spec.ami_type, "labels": dict(spec.labels),
            "scalingConfig": _scaling(spec),
            "tags": tags(ctx.record.run_id, cluster),
            "clientRequestToken": create_token(ctx, want.address, *spec.azs, limits=EKS_TOKEN),
        }
        if spec.taints:
            request["taints"] = list(spec.taints)
        if (spec.capacity_type or "ON_DEMAND") != "ON_DEMAND":
            request["capacityType"] = spec.capacity_type  # CAPACITY_BLOCK: the template names the block
        if spec.launch_template:
            names = Names(cluster)
            template_name = names.launch_template if want.address == GPU_NODES else names.system_launch_template
            templates = [t for t in await find(api, ctx, "describe_launch_templates", "LaunchTemplates")
                         if t.get("LaunchTemplateName") == template_name]
            if not templates:
                raise OperationError(f"launch template {template_name} is gone",
                                     remedy="run `rtui up` again: the plan makes it anew")
            request["launchTemplate"] = {"id": templates[0]["LaunchTemplateId"],
                                         "version": str(templates[0]["LatestVersionNumber"])}
        else:
            request["diskSize"] = spec.disk_gb or 50
        await api.call("eks", "create_nodegroup", **request, ok=("ResourceInUseException",), new_role=True)
        self.made(ctx, want, f"{cluster}/{name}")
        async for p in self._until_ready(ctx, want, f"{cluster}/{name}"):
            yield p

    async def _until_ready(self, ctx: Context, want: Resource, resource_id: str) -> AsyncIterator[Progress]:
        try:
            async for p in self.wait_ready(ctx, resource_id):
                yield p
        except CapacityError:
            # The nodegroup stays in the ledger (teardown deletes it). AWS may have launched some of
            # its nodes before it ran out: they run and bill until the nodegroup goes, so the cost
            # meter leaves it out only when its Auto Scaling group has no instance left.
            cluster, name = resource_id.split("/", 1)
            if not await running_instances(self.api(ctx), cluster, name):
                ctx.ledger.update(want.address, outputs={BILLING: False})
            raise

    def wait_ready(self, ctx: Context, resource_id: str) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        cluster, name = resource_id.split("/", 1)

        async def look() -> Look:
            group = (await api.call("eks", "describe_nodegroup", clusterName=cluster, nodegroupName=name,
                                    ok=_NOT_FOUND) or {}).get("nodegroup")
            status = group["status"] if group else "GONE"
            short = await launch_shortfall(api, group) if group and status == "CREATING" else None
            if short or status in ("CREATE_FAILED", "DEGRADED", "GONE", "DELETE_FAILED"):
                why, capacity = (short, True) if short else await failure_report(api, group or {})
                if capacity:
                    azs = await subnet_azs(api, (group or {}).get("subnets") or [])
                    spot = (group or {}).get("capacityType") == "SPOT"
                    raise CapacityError(f"nodegroup {name}: {ICE}{' for Spot' if spot else ''} in {', '.join(azs)} "
                                        f"({why})", az=azs[0] if azs else "",
                                        remedy=("`rtui up --spot-fallback on-demand` moves the GPU nodes to On-Demand "
                                                "there; `rtui up --az-failover` to the next feasible AZ" if spot else
                                                "`rtui up --az-failover` moves the GPU nodes to the next feasible AZ"))
                return Look(False, status, fatal=f"nodegroup {name} {status.lower()}: {why}",
                             remedy="fix what AWS names, then `rtui up` again replaces the nodegroup")
            return Look(status == "ACTIVE", f"nodegroup {status.lower()}")

        return wait_until(look, what=f"nodegroup {name}", expected_s=NODEGROUP_EXPECTED_S, timeout_s=1800.0,
                          clock=api.clock)

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        if not have.state.get("pending"):
            cluster, name = have.id.split("/", 1)
            spec = NodegroupSpec.of(want)
            size = spec.size
            await self.api(ctx).call("eks", "update_nodegroup_config", clusterName=cluster, nodegroupName=name,
                                     scalingConfig=_scaling(spec))
            yield Progress(f"{name}: {have.state.get('size')} → {size} nodes")
        async for p in self._until_ready(ctx, want, have.id):
            yield p

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        cluster, name = have.id.split("/", 1)
        async for p in delete_nodegroup(self.api(ctx), cluster, name):
            yield p


def _scaling(spec: NodegroupSpec) -> dict[str, int]:
    """The scaling config a create or an update asks for: the planned size (``rtui up`` wants the
    nodes), within the planned bounds."""
    low, high = spec.bounds()
    return {"minSize": low, "maxSize": high, "desiredSize": spec.size}


async def delete_nodegroup(api: AwsApi, cluster: str, name: str) -> AsyncIterator[Progress]:
    """Delete a nodegroup and wait until EKS no longer describes it (its instances are gone)."""
    await api.call("eks", "delete_nodegroup", clusterName=cluster, nodegroupName=name, ok=_NOT_FOUND)

    async def look() -> Look:
        group = (await api.call("eks", "describe_nodegroup", clusterName=cluster, nodegroupName=name,
                                ok=_NOT_FOUND) or {}).get("nodegroup")
        state = "deleted" if group is None else group["status"].lower()
        return Look(group is None, f"nodegroup {state}")

    async for p in wait_until(look, what=f"deleting nodegroup {name}", expected_s=NODEGROUP_DELETE_S,
                              timeout_s=1800.0, clock=api.clock):
        yield p


async def _template_disk(api: AwsApi, group: dict[str, Any]) -> int | None:
    """The root disk a nodegroup's launch template gives (EKS reports no ``diskSize`` then)."""
    template = group.get("launchTemplate") or {}
    if not template.get("id"):
        return None
    versions = await api.call("ec2", "describe_launch_template_versions", LaunchTemplateId=template["id"],
                              Versions=[str(template.get("version") or "$Latest")],
                              ok=("InvalidLaunchTemplateId.NotFound", "InvalidLaunchTemplateId.VersionNotFound"))
    data = ((versions or {}).get("LaunchTemplateVersions") or [{}])[0].get("LaunchTemplateData") or {}
    size = ((data.get("BlockDeviceMappings") or [{}])[0].get("Ebs") or {}).get("VolumeSize")
    return None if size is None else int(size)


async def _placed_in(api: AwsApi, cluster: str, name: str, placement_group: str) -> bool:
    """Whether the nodegroup exists and its launch template puts its instances in ``placement_group``."""
    group = (await api.call("eks", "describe_nodegroup", clusterName=cluster, nodegroupName=name,
                            ok=_NOT_FOUND) or {}).get("nodegroup") or {}
    template = group.get("launchTemplate") or {}
    if not template.get("id"):
        return False
    versions = await api.call("ec2", "describe_launch_template_versions", LaunchTemplateId=template["id"],
                              Versions=[str(template.get("version") or "$Latest")],
                              ok=("InvalidLaunchTemplateId.NotFound", "InvalidLaunchTemplateId.VersionNotFound"))
    data = ((versions or {}).get("LaunchTemplateVersions") or [{}])[0].get("LaunchTemplateData") or {}
    return bool((data.get("Placement") or {}).get("GroupName") == placement_group)



async def subnet_azs(api: AwsApi, subnet_ids: list[str]) -> list[str]:
    if not subnet_ids:
        return []
    subnets = await api.pages("ec2", "describe_subnets", "Subnets", SubnetIds=subnet_ids)
    return sorted({s["AvailabilityZone"] for s in subnets})


async def running_instances(api: AwsApi, cluster: str, name: str) -> list[str]:
    """The instances the nodegroup's Auto Scaling groups hold now (any lifecycle state but gone)."""
    group = (await api.call("eks", "describe_nodegroup", clusterName=cluster, nodegroupName=name,
                            ok=_NOT_FOUND) or {}).get("nodegroup") or {}
    names = [g["name"] for g in (group.get("resources") or {}).get("autoScalingGroups") or [] if g.get("name")]
    if not names:
        return []
    groups = await api.pages("autoscaling", "describe_auto_scaling_groups", "AutoScalingGroups",
                             AutoScalingGroupNames=names)
    return [i["InstanceId"] for g in groups for i in g.get("Instances") or []
            if i.get("LifecycleState") not in ("Terminated",)]


class AsgTagsHandler(AwsHandler):
    """The tags cluster-autoscaler reads on the GPU nodes' Auto Scaling group (``node_autoscaler.gpu_asg_tags``).

    EKS makes the group and never copies the nodegroup's tags onto it (EKS API reference, TagResource:
    tags "don't propagate to any other resources"), so they are set on the group once the nodegroup is
    ACTIVE (``autoscaling:CreateOrUpdateTags``). They go with the group; ``delete`` removes ours from a
    group that stays (EKS's own discovery tags are left to EKS)."""

    kind = "aws-asg-tags"
    spec_model = AsgTagsSpec
    title = "Tag the GPU nodes' Auto Scaling group for cluster-autoscaler (scale from zero)"
    address = GPU_ASG_TAGS
    expected_s = 2.0
    updatable = True

    @staticmethod
    def _ours(found: dict[str, str], cluster: str) -> dict[str, str]:
        template = f"{na.TAG_PREFIX}/node-template/"
        keep = {*na.discovery_tags(cluster), na.RUN_TAG}
        return {k: v for k, v in found.items() if k in keep or k.startswith(template)}

    async def _group(self, api: AwsApi, cluster: str, name: str) -> str | None:
        group = (await api.call("eks", "describe_nodegroup", clusterName=cluster, nodegroupName=name,
                                ok=_NOT_FOUND) or {}).get("nodegroup") or {}
        names = [g["name"] for g in (group.get("resources") or {}).get("autoScalingGroups") or [] if g.get("name")]
        return names[0] if names else None

    async def _tags(self, api: AwsApi, group: str) -> dict[str, str]:
        listed = await api.pages("autoscaling", "describe_tags", "Tags",
                                 Filters=[{"Name": "auto-scaling-group", "Values": [group]}])
        return {t["Key"]: t.get("Value", "") for t in listed}

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        config = aws_config(ctx)
        cluster = await describe_cluster(api, config.cluster_name)
        if cluster is None or (cluster.get("tags") or {}).get(RUN_TAG) != ctx.record.run_id:
            return []
        group = await self._group(api, cluster["name"], Names(config.cluster_name).gpu_nodegroup)
        if group is None:
            return []
        ours = self._ours(await self._tags(api, group), cluster["name"])
        if ours.get(na.RUN_TAG) != ctx.record.run_id:
            return []  # not tagged by this run yet
        return [Observed(address=GPU_ASG_TAGS, layer=LAYER, kind=self.kind, id=group, state={"tags": ours},
                         depends_on=(GPU_NODES,), reason="tagged")]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        cluster = aws_config(ctx).cluster_name
        group = await self._group(api, cluster, Names(cluster).gpu_nodegroup)
        if group is None:
            raise OperationError(f"the GPU nodegroup of {cluster} reports no Auto Scaling group",
                                 remedy="run `rtui up` again once the nodegroup is active")
        async for p in self._apply(ctx, want, group, {}):
            yield p

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self._apply(ctx, want, have.id, dict(have.state.get("tags") or {})):
            yield p

    async def _apply(self, ctx: Context, want: Resource, group: str, had: dict[str, str]) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        wanted = dict(AsgTagsSpec.of(want).tags)
        await api.call("autoscaling", "create_or_update_tags", Tags=[
            {"ResourceId": group, "ResourceType": "auto-scaling-group", "Key": k, "Value": v,
             "PropagateAtLaunch": False} for k, v in wanted.items()])
        self.made(ctx, want, group)
        stale = [k for k in had if k not in wanted]
        if stale:
            await api.call("autoscaling", "delete_tags", Tags=[
                {"ResourceId": group, "ResourceType": "auto-scaling-group", "Key": k} for k in stale])
        yield Progress(f"{group}: {len(wanted)} tags (discovery, node template: labels, taint, "
                       "nvidia.com/gpu, EFA)", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        keep = set(na.discovery_tags(aws_config(ctx).cluster_name))  # EKS's own
        mine = [k for k in have.state.get("tags") or {} if k not in keep]
        if mine:
            await self.api(ctx).call("autoscaling", "delete_tags", ok=("ValidationError",), Tags=[
                {"ResourceId": have.id, "ResourceType": "auto-scaling-group", "Key": k} for k in mine])
        yield Progress(f"{have.id}: cluster-autoscaler's template tags removed", 1.0)
