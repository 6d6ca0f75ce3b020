"""The aws layer (DESIGN.md §3): network, IAM, EKS and its nodes, under the Kubernetes layer.

``prepare`` settles the AZs once per run: the GPU AZ (``--availability-zone``, else the one this
run chose before, else preflight's recommendation), a second AZ the EKS control plane accepts,
and the feasible ones to fail over to. They are kept in the run record, so a later plan (when
our own nodes use the quota preflight would count) never moves them by itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from backend.aio import all_or_none
from backend.delivery import S3_STANDARD_PER_GIB_MONTH, effective_storage_path, run_storage_uri
from backend.errors import ApiUnreachable, OperationError, UserError
from backend.layers.base import Context, Handler, Layer
from backend.resources import CheckResult, CheckStatus, Leftover, NodeLoss, Observed, Resource
from targets.aws.cloud import run_preflight
from targets.aws.cloud.catalog import quota_code_for
from targets.aws.cloud.pricing import (
    PlanShape,
    PriceBook,
    RegionPrices,
    builtin_region_prices,
    price_plan,
    spot_nodes_cost,
)
from targets.aws.cloud.public_ip import public_cidr
from targets.aws.cloud.report import reserved_nodes
from targets.aws.cloud.spot_advisor import SpotAdvisor
from targets.aws.config import AwsConfig, aws_config
from targets.aws.facts import AzMove, SpotFallback, SpotRisk, aws_facts
from targets.aws.infra import network, routes
from targets.aws.infra.api import RUN_TAG
from targets.aws.infra.autoscaler import CLUSTER_AUTOSCALER, ClusterAutoscalerHandler
from targets.aws.infra.cluster import (
    CLOUDWATCH_LOGS_GB_MONTH,
    CLOUDWATCH_LOGS_PER_GB,
    CONTROL_PLANE_LOGS,
    AccessEntryHandler,
    AddonHandler,
    EksClusterHandler,
    KubeconfigHandler,
    describe_cluster,
)
from targets.aws.infra.common import (
    ACCESS_ENTRY,
    ADDON_CONFIGURATION,
    ADDONS,
    CLUSTER_ROLE,
    EKS_CLUSTER,
    GPU_ASG_TAGS,
    GPU_NODES,
    IGW,
    KUBECONFIG,
    LAUNCH_TEMPLATE,
    LAYER,
    NAT,
    NODE_ROLE,
    NODE_SG,
    PLACEMENT_GROUP,
    PRIVATE_RT,
    PUBLIC_RT,
    ROOT_VOLUME_GB,
    SYSTEM_LAUNCH_TEMPLATE,
    SYSTEM_NODES,
    VPC,
    AwsHandler,
    NamedReservation,
    Names,
    Topology,
    addon_address,
    aws_api,
    subnet_address,
    subnet_cidr,
    system_disk_gb,
)
from targets.aws.infra.endpoints import S3_ENDPOINT, S3EndpointHandler, missing_endpoint_note
from targets.aws.infra.given_vpc import GivenVpcRefused, check_given_vpc, egress_note
from targets.aws.infra.iam import (
    AUTOSCALER_IDENTITY,
    CLUSTER_POLICIES,
    CNI_IDENTITY,
    DATA_IDENTITY,
    NODE_POLICIES,
    POD_IDENTITY_PREFIX,
    RoleHandler,
    inline_policies,
    planned_identities,
    service_principal,
    trust_shape,
    trust_statement,
)
from targets.aws.infra.logs import LOG_GROUP, LogGroupHandler, log_group_name
from targets.aws.infra.node_autoscaler import (
    check_offered_version,
    cluster_autoscaler_image,
    gpu_asg_tags,
    gpu_scaling_config,
)
from targets.aws.infra.node_hours import GpuGroup, gpu_group, gpu_node_hours, gpu_node_losses, gpu_spot_cost
from targets.aws.infra.nodes import AsgTagsHandler, LaunchTemplateHandler, NodegroupHandler, PlacementGroupHandler
from targets.aws.infra.podidentity import POD_IDENTITY_AGENT, PodIdentityHandler
from targets.aws.infra.preflight_request import preflight_request
from targets.aws.infra.storage import BUCKET, BucketHandler, name_for, storage_uri
from targets.aws.infra.sweep import sweep
from targets.kube.registry import image_size

if TYPE_CHECKING:
    from targets.aws.cloud import PreflightReport
    from targets.aws.cloud.report import RegionReport, ZoneReport

GPU_LABEL = "nvidia.com/gpu.present"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}
AMI_GPU = "AL2023_x86_64_NVIDIA"
AMI_CPU = "AL2023_x86_64_STANDARD"
# The order things are made in; teardown goes the other way (each waits for what depends on it).
ORDER = (BUCKET, VPC, "aws.subnet", IGW, NAT, PUBLIC_RT, PRIVATE_RT, S3_ENDPOINT, NODE_SG, CLUSTER_ROLE, NODE_ROLE,
         "aws.iam-role", LOG_GROUP, EKS_CLUSTER, ACCESS_ENTRY, KUBECONFIG, "aws.addon", "aws.pod-identity",
         PLACEMENT_GROUP, "aws.launch-template", SYSTEM_NODES, GPU_NODES, GPU_ASG_TAGS, CLUSTER_AUTOSCALER)


@dataclass
class MatrixWatch:
    """Who watches the next feasibility matrix fill in (the TUI): the regions about to be checked,
    then each region as its checks return. ``all_regions`` widens it beyond the config's region."""

    on_listed: Callable[[list[str]], None] | None = None
    on_region: Callable[[RegionReport], None] | None = None
    all_regions: bool = False


def _rank(address: str) -> int:
    return next((i for i, prefix in enumerate(ORDER) if address == prefix or address.startswith(prefix + ".")),
                len(ORDER))


class AwsLayer(Layer):
    name = LAYER
    sweeps = True
    holds_above = "the EKS cluster"  # deleting it deletes every Kubernetes object and Ray pod in it
    _handlers: ClassVar[dict[str, Handler]] = {h.kind: h for h in (
        network.VpcHandler(), network.SubnetHandler(), network.InternetGatewayHandler(), network.NatGatewayHandler(),
        routes.RouteTableHandler(), routes.SecurityGroupHandler(), RoleHandler(), EksClusterHandler(),
        AddonHandler(), AccessEntryHandler(), KubeconfigHandler(), PlacementGroupHandler(), LaunchTemplateHandler(),
        NodegroupHandler(), PodIdentityHandler(), AsgTagsHandler(), ClusterAutoscalerHandler(), BucketHandler(),
        LogGroupHandler(), S3EndpointHandler())}

    def __init__(self) -> None:
        self.topology: Topology | None = None
        self.preflight_checks: list[CheckResult] = []
        self.report: PreflightReport | None = None  # the matrix the AZs were settled from
        self.watch: MatrixWatch | None = None
        self._book: PriceBook | None = None  # the session's instance prices, shared with the preflight
        self._advisor: SpotAdvisor | None = None  # the session's read of the Spot Instance Advisor, likewise
        self._planned_prices: RegionPrices | None = None  # what the last ``desired`` priced with
        self._planned_nat = False
        self._notes: list[str] = []  # what the last settling of the AZs decided differently, one line each
        self._idle_note = ""  # what the last ``desired`` bills while the GPU nodes are scaled to zero
        self._group_read: tuple[float, GpuGroup | None] | None = None  # the GPU group as read for a moment
        self._s3_note = ""  # with --vpc-id: the user's private subnets route S3 through their NAT

    @property
    def handlers(self) -> Mapping[str, Handler]:
        return self._handlers

    async def node_hours(self, ctx: Context, address: str, *, since: float, now: float) -> float | None:
        """The GPU nodes' hours from their Auto Scaling group's activities (``node_hours``)."""
        if address != GPU_NODES:
            return None
        return gpu_node_hours(await self._gpu_group_at(ctx, now), since=since, now=now)

    async def node_cost(self, ctx: Context, address: str, *, since: float, now: float) -> float | None:
        """Spot GPU nodes at the Spot price in effect each moment they ran (``gpu_spot_cost``); On-Demand
        ones are left to the plan's price, which does not move."""
        az = aws_facts(ctx).gpu_az
        if address != GPU_NODES or not self.buys_spot(ctx) or not az:
            return None
        disk = self.prices(aws_config(ctx)).ebs_per_hour(ROOT_VOLUME_GB)
        return await gpu_spot_cost(ctx, await self._gpu_group_at(ctx, now), since=since, now=now, az=az,
                                   disk_per_node_hour=disk)

    async def node_losses(self, ctx: Context, *, since: float, now: float) -> list[NodeLoss]:
        """GPU nodes the provider took away (a Spot interruption), from their group's activities."""
        return gpu_node_losses(await self._gpu_group_at(ctx, now), since=since, now=now)

    async def _gpu_group_at(self, ctx: Context, now: float) -> GpuGroup | None:
        """The GPU group and its activities, read once for a moment ``now``: a status report asks its
        node-hours, its Spot cost and its losses of one read."""
        if self._group_read is None or self._group_read[0] != now:
            self._group_read = (now, await gpu_group(ctx))
        return self._group_read[1]

    def settle_offline(self, ctx: Context) -> None:
        """`rtui manifest`: the AZs and the bucket's name come from AWS; no Kubernetes object is made from
        either, so the region's first two AZs and a name standing for the bucket do. That the run has its own
        bucket (no --storage-path) is what matters: the Ray pods then get a service account for it."""
        config = aws_config(ctx)
        if self.topology is None:
            azs = [config.availability_zone or f"{config.region}a"]
            azs.append(next(z for z in (f"{config.region}a", f"{config.region}b") if z not in azs))
            self.topology = Topology(network_azs=azs, gpu_az=azs[0], az_index={z: i for i, z in enumerate(azs)})
        facts, own = ctx.record.facts, aws_facts(ctx)
        if not config.storage_path and not own.data_bucket:
            own.data_bucket = f"{config.cluster_name}-data"
            facts.storage_path = storage_uri(own.data_bucket)

    # --- the AZs -----------------------------------------------------------------------------
    async def prepare(self, ctx: Context) -> None:
        # The prices are asked while the preflight runs: the plan waits for neither twice.
        self.topology, _, _, _, self._s3_note = await all_or_none(
            self._topology(ctx), self._region_prices(ctx), self._api_cidrs(ctx), self._data_bucket(ctx),
            missing_endpoint_note(aws_api(ctx), ctx))

    async def _data_bucket(self, ctx: Context) -> None:
        """Without --storage-path the run's data goes to its own bucket: its name (from the account) and
        the storage path the job and `rtui model/status/down` use, kept in the run record."""
        if aws_config(ctx).storage_path:
            return
        name = await name_for(aws_api(ctx), ctx)
        facts, own = ctx.record.facts, aws_facts(ctx)
        if own.data_bucket != name or facts.storage_path != storage_uri(name):
            own.data_bucket, facts.storage_path = name, storage_uri(name)
            ctx.save()

    async def explain_unanswered(self, ctx: Context, exc: ApiUnreachable) -> ApiUnreachable:
        """The EKS endpoint admits only ``publicAccessCidrs``: a caller whose address moved since `up` (a
        laptop on another network) gets no answer at all. Said as that, with how to get back in."""
        admitted = self.api_cidr_list(ctx)
        try:
            now = await asyncio.to_thread(public_cidr)
        except OperationError:
            return exc
        address = ipaddress.ip_address(now.split("/")[0])
        if not admitted or any(address in ipaddress.ip_network(c) for c in admitted):
            return exc
        return ApiUnreachable(
            f"the EKS API endpoint admits only {', '.join(admitted)} and your address is now {now.split('/')[0]}: "
            f"it does not answer you ({exc.message})",
            remedy=f"`rtui up --api-cidrs {now}` admits your new address (the endpoint is updated in place); "
                   "`rtui down` works from anywhere")

    async def _api_cidrs(self, ctx: Context) -> list[str]:
        """Who may reach the EKS API endpoint: ``--api-cidrs``, else the caller's public address, learned
        once per run and kept in its record (a later plan from elsewhere does not move it by itself)."""
        given = aws_config(ctx).api_cidr_list()
        if given:
            return given
        learned = aws_facts(ctx).api_cidrs
        if not learned:
            learned = [await asyncio.to_thread(public_cidr)]
            aws_facts(ctx).api_cidrs = learned
            ctx.save()
        return learned

    @staticmethod
    def api_cidr_list(ctx: Context) -> list[str]:
        return aws_config(ctx).api_cidr_list() or list(aws_facts(ctx).api_cidrs)

    async def _region_prices(self, ctx: Context) -> RegionPrices:
        config = aws_config(ctx)
        return await asyncio.to_thread(self.price_book(ctx).region, config.region,
                                       (config.gpu_node_type, config.system_node_type))

    def price_book(self, ctx: Context) -> PriceBook:
        if self._book is None:
            self._book = PriceBook(aws_api(ctx).session)
        return self._book

    def prices(self, config: AwsConfig) -> RegionPrices:
        """The region's prices this session asked for; the table, labelled, before any was asked."""
        types = (config.gpu_node_type, config.system_node_type)
        known = self._book.known(config.region, types) if self._book is not None else None
        return known or builtin_region_prices(config.region, types)

    def price_source(self, ctx: Context) -> str:
        prices = self._planned_prices
        if prices is None:
            return ""
        return prices.source

    def plan_notes(self, ctx: Context) -> list[str]:
        return [*self._notes, *(note for note in (self._idle_note, self._s3_note) if note)]

    async def _reservation_ended(self, ctx: Context, reservation_id: str, zone: ZoneReport | None) -> str | None:
        """How the recorded reservation ended ("expired on 2026-12-01", "cancelled", "no longer exists");
        None while it is active. The matrix lists only live reservations; one it no longer lists is asked
        for by id (EC2 still describes an ended one for a while, with its state and end date)."""
        listed = next((r for r in (zone.reservations if zone else []) if r.id == reservation_id), None)
        if listed is not None and listed.state == "active" and not _past(listed.end_date):
            return None
        try:
            found = await aws_api(ctx).call("ec2", "describe_capacity_reservations",
                                                   CapacityReservationIds=[reservation_id],
                                                   ok=("InvalidCapacityReservationId.NotFound",))
        except OperationError:
            return None  # not readable now (a permission, the network): keep naming it, as before
        cr = next(iter((found or {}).get("CapacityReservations") or []), None)
        if cr is None:
            return "no longer exists"
        state, end = str(cr.get("State", "")), cr.get("EndDate")
        end_text = end.isoformat() if hasattr(end, "isoformat") else str(end) if end else None
        if state == "active" and not _past(end_text):
            return None
        if state in ("active", "expired"):
            return "expired" + (f" on {end_text[:10]}" if end_text else "")
        return state

    def usage_costs(self, ctx: Context) -> list[str]:
        prices = self._planned_prices
        if prices is None:
            return []
        logs = (f"+ ${CLOUDWATCH_LOGS_PER_GB:.2f}/GB (+ ${CLOUDWATCH_LOGS_GB_MONTH:.2f}/GB-month) CloudWatch "
                f"Logs: control-plane {', '.join(CONTROL_PLANE_LOGS)} logs")
        return [*([f"+ ${prices.nat_per_gb:.3f}/GB NAT data processing"] if self._planned_nat else []), logs]

    async def _topology(self, ctx: Context) -> Topology:
        config, facts = aws_config(ctx), aws_facts(ctx)
        request, watch = preflight_request(ctx), self.watch or MatrixWatch()
        if watch.all_regions:
            request = request.model_copy(update={"all_regions": True})
        self.report = None
        self._notes = []
        # The image's size from its registry, asked while the matrix fills in (it never raises, and
        # gives up within its own deadline).
        sized = asyncio.ensure_future(asyncio.to_thread(image_size, config.image))
        try:
            if self._advisor is None:
                self._advisor = SpotAdvisor(aws_api(ctx).session)
            report = await run_preflight(request, on_region=watch.on_region, on_listed=watch.on_listed,
                                         prices=self.price_book(ctx), advisor=self._advisor)
        except BaseException:
            sized.cancel()
            raise
        image = await sized
        disk_gb, disk_why = system_disk_gb(image.compressed_bytes)
        if image.compressed_bytes is None and facts.system_disk_gb:
            # A registry that does not answer now never shrinks nor grows the disk this run sized before.
            disk_gb, disk_why = facts.system_disk_gb, "as sized before"
        self.report = report
        self.preflight_checks = [*_first_reasons(report, config.region), *report.to_check_results()]
        region = next((r for r in report.regions if r.region == config.region), None)
        if region is None or not region.zones:
            why = region.error or "; ".join(region.reasons) if region else "not checked"
            raise UserError(f"cannot plan in {config.region}: {why}",
                            remedy="`rtui check --target aws --all-regions` shows where it can run")
        # A given VPC's private subnets fix the AZs: nothing is planned inside a VPC rtui did not make.
        given = await self._given_subnet_azs(ctx) if config.vpc_id else None
        in_reach = [z for z in region.zones if given is None or z.zone in given]
        zones = {z.zone: z for z in region.zones}
        feasible = [z.zone for z in in_reach if z.feasible]
        recommended = (report.recommendation.zone if report.recommendation
                       and report.recommendation.region == config.region else None)
        if given is not None and recommended not in given:
            recommended = next(iter(sorted(feasible, key=lambda a: zones[a].verdict != "feasible")), None)
        gpu_az = config.availability_zone or facts.gpu_az or recommended
        if gpu_az is None:
            blockers = _first_reasons(report, config.region)
            if blockers:
                raise UserError(blockers[0].detail, remedy=blockers[0].remedy)
            first = region.reasons[0] if region.reasons else "no AZ has what the plan needs"
            raise UserError(f"no feasible AZ in {config.region}: {first}",
                            remedy="`rtui check --target aws --all-regions` shows where it can run")
        if gpu_az not in zones:
            raise UserError(f"{gpu_az} is not an AZ of {config.region}",
                            remedy=f"choose one of {', '.join(sorted(zones))}")
        if given is not None and gpu_az not in given:
            raise UserError(f"no private subnet of {config.vpc_id} is in the GPU AZ {gpu_az}",
                            remedy=f"choose one of {', '.join(sorted(given))} or add a subnet in {gpu_az} "
                                   "to --private-subnet-ids")
        if given is not None:  # what EKS needs of the VPC itself: DNS, and a private way out of each subnet
            vpc = config.vpc_id or ""
            self._notes.append(egress_note(vpc, await check_given_vpc(aws_api(ctx), vpc,
                                                                      config.private_subnet_id_list())))
        network_azs = list(facts.network_azs)
        if not network_azs:
            network_azs = _control_plane_azs(
                in_reach, gpu_az, config.region if given is None else "--private-subnet-ids",
                "choose another --region" if given is None
                else "add a private subnet of another AZ EKS accepts to --private-subnet-ids")
        index = {zone: i for i, zone in enumerate(sorted(zones))}
        quota, system_quota = region.quota, region.system_quota
        named = {z.zone: reserved_nodes(z.reservations)[1] for z in region.zones}
        reservations = {az: NamedReservation(r.id, r.kind, r.placement_group)
                        for az, r in named.items() if r is not None}
        if self.buys_spot(ctx):
            # A reservation holds On-Demand capacity (a Capacity Block's too): Spot nodes never draw on it.
            if reservations.get(gpu_az) is not None:
                self._notes.append(f"capacity reservation {reservations[gpu_az].id} in {gpu_az} is On-Demand "
                                   "capacity: the Spot GPU nodes do not use it (without --spot they would)")
            reservations = {}
            self._notes.append(
                "Spot GPU nodes: AWS may take one back with two minutes' notice (the managed node group "
                "handles it: EKS turns on its Capacity Rebalancing, launches a replacement when EC2 says a node "
                "is at risk, and cordons and drains that node once the new one is Ready or the notice "
                "comes; no termination handler is installed), and the cluster "
                f"placement group that keeps their EFA traffic close needs room for all {config.gpu_node_count} in "
                "one part of the AZ, which makes Spot capacity scarcer; without --spot they run On-Demand")
            risk = region.spot_interruptions
            facts.spot_risk = None if risk is None else SpotRisk(
                per_node_hour=risk.per_hour,
                source=f"the Spot Instance Advisor's {risk.text()} for {risk.instance_type} in {config.region}")
            if config.spot_type_list():
                self._notes.append(
                    f"The Spot GPU nodes may be any of {', '.join([config.gpu_node_type, *config.spot_type_list()])}: "
                    "a wider pool AWS is less often short of; priced at the dearest of them in the AZ, and "
                    f"cluster-autoscaler sizes a node it adds as a {config.gpu_node_type}")
            if not config.max_failures:
                self._notes.append(
                    "Spot with --max-failures 0: the first interruption ends the job; with --max-failures N Ray "
                    "Train restarts the workers on the replacement node and goes on from the newest complete "
                    "checkpoint (--checkpoint-every sets how many steps are done again)")
        elif config.spot and (fallback := facts.spot_fallback) is not None:
            self._notes.append(
                f"Spot GPU nodes went On-Demand in {fallback.az} at "
                f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(fallback.at))}: AWS had no Spot capacity for them "
                "(--spot-fallback on-demand); they stay On-Demand for this run")
        # The reservation this run's nodes already fill shows no free slot now: keep naming it, while it
        # lasts. One that expired or was cancelled is named no more, and the plan says what replaces it.
        kept = None if self.buys_spot(ctx) else facts.reservation
        if kept is not None and kept.az and kept.id:
            ended = await self._reservation_ended(ctx, kept.id, zones.get(kept.az))
            if ended is None:
                reservations[kept.az] = NamedReservation(kept.id, kept.kind or "odcr", kept.placement_group)
            elif kept.az == gpu_az:
                zone = zones.get(gpu_az)
                uses = _capacity_used(reservations.get(gpu_az), reserved_nodes(zone.reservations)[0] if zone else 0,
                                      config.gpu_node_count)
                self._notes.append(f"capacity reservation {kept.id} {ended}: the GPU nodes now use {uses}")
        return Topology(
            reservations=reservations, system_disk_gb=disk_gb, system_disk_why=f"{disk_why} ({image.reason})",
            network_azs=network_azs, gpu_az=gpu_az, az_index=index,
            failover_azs=[z for z in feasible if z != gpu_az and z not in facts.failed_azs],
            spot_prices={z.zone: z.spot_price for z in region.zones if z.spot_price is not None},
            gpu_quota_code=quota.code if quota else quota_code_for(config.gpu_node_type, spot=self.buys_spot(ctx)),
            gpu_headroom=quota.headroom if quota else None,
            system_quota_code=system_quota.code if system_quota else quota_code_for(config.system_node_type),
            system_headroom=system_quota.headroom if system_quota else None,
            # A GPU node may be any of the Spot types: its quota counts the largest.
            vcpus={config.gpu_node_type: max([report.gpu_instance.vcpus if report.gpu_instance else 0,
                                              *(i.vcpus for i in report.spot_instances)]),
                   config.system_node_type: report.system_instance.vcpus if report.system_instance else 0},
            efa_interfaces=max(1, report.gpu_instance.efa_per_node) if report.gpu_instance else 1)

    async def _given_subnet_azs(self, ctx: Context) -> dict[str, str]:
        """AZ -> subnet of ``--private-subnet-ids`` (EKS needs two AZs it accepts among them)."""
        config = aws_config(ctx)
        ids = config.private_subnet_id_list()
        if not ids:
            raise UserError(f"--vpc-id {config.vpc_id} needs its private subnets",
                            remedy="pass --private-subnet-ids with subnets in at least two AZs")
        try:
            subnets = await aws_api(ctx).pages("ec2", "describe_subnets", "Subnets", SubnetIds=ids)
        except OperationError as exc:
            raise UserError(f"cannot read --private-subnet-ids: {exc.message}",
                            remedy="check the subnet ids and the region") from None
        outside = [s["SubnetId"] for s in subnets if s["VpcId"] != config.vpc_id]
        if outside:
            raise UserError(f"subnet {outside[0]} is not in {config.vpc_id}",
                            remedy="pass only private subnets of --vpc-id")
        by_az = {s["AvailabilityZone"]: s["SubnetId"] for s in sorted(subnets, key=lambda s: s["SubnetId"])}
        if len(by_az) < 2:
            raise UserError(f"EKS needs private subnets in two AZs and --private-subnet-ids has them in "
                            f"{len(by_az)} ({', '.join(sorted(by_az))})",
                            remedy="add a private subnet of another AZ to --private-subnet-ids")
        return by_az

    def applying(self, ctx: Context) -> None:
        self.remember(ctx)

    def remember(self, ctx: Context) -> None:
        """Keep the AZs this run builds in (called when it applies)."""
        if self.topology is not None:
            topo = self.topology
            facts = aws_facts(ctx)
            facts.gpu_az, facts.network_azs, facts.system_disk_gb = topo.gpu_az, topo.network_azs, topo.system_disk_gb
            named = topo.gpu_reservation
            facts.reservation = named.to_fact(topo.gpu_az) if named else None
            ctx.save()

    def buys_spot(self, ctx: Context) -> bool:
        """The GPU nodes are bought on Spot: ``--spot``, unless they went On-Demand when Spot had none."""
        return aws_config(ctx).spot and aws_facts(ctx).spot_fallback is None

    def fall_back_to_on_demand(self, ctx: Context, az: str, why: str) -> None:
        """From now on the run's GPU nodes are On-Demand (``--spot-fallback on-demand``, or `m` in the
        TUI); the record says when and why, and every later plan keeps them so."""
        aws_facts(ctx).spot_fallback = SpotFallback(az=az, why=why[:300], at=time.time())
        ctx.save()

    def fail_over(self, ctx: Context, failed_az: str, why: str) -> str | None:
        """Move the GPU nodes to the next feasible AZ; the record says why. None when none is left."""
        topology = self.topology
        if topology is None:
            return None
        facts = aws_facts(ctx)
        failed = [*facts.failed_azs, failed_az]
        remaining = [z for z in topology.failover_azs if z not in failed]
        if not remaining:
            return None
        move = AzMove(from_az=failed_az, to=remaining[0], why=why[:300], at=time.time())
        facts.gpu_az, facts.failed_azs, facts.az_moves = remaining[0], failed, [*facts.az_moves, move]
        ctx.save()
        topology.gpu_az = remaining[0]
        topology.failover_azs = remaining[1:]
        return remaining[0]

    # --- desired state ---------------------------------------------------------------------
    def desired(self, ctx: Context, below: Sequence[Resource]) -> list[Resource]:
        config, topo = aws_config(ctx), self.topology
        if topo is None:
            raise UserError("the aws layer was asked for a plan before its AZs were settled")
        check_offered_version(config.kubernetes_version)  # idle GPU nodes need its cluster-autoscaler
        names = Names(config.cluster_name)
        out: list[Resource] = []

        def res(address: str, kind: str, spec: dict[str, Any], *deps: str, cost: float | None = 0.0,
                quota: dict[str, dict[str, float | None]] | None = None, note: str = "") -> None:
            out.append(Resource(address=address, layer=LAYER, kind=kind, spec=spec, depends_on=deps,
                                cost_per_hour=cost, cost_note=note, quota=quota or {}))

        prices = self.prices(config)
        self._planned_prices = prices
        adopted = bool(config.vpc_id)
        self._planned_nat = not adopted
        cost = price_plan(prices, PlanShape(
            gpu_node_type=config.gpu_node_type, gpu_node_count=config.gpu_node_count, gpu_disk_gb=ROOT_VOLUME_GB,
            system_node_type=config.system_node_type, system_node_count=config.system_node_count,
            system_disk_gb=topo.system_disk_gb, nat_gateway=not adopted)).parts
        if self.buys_spot(ctx):  # the GPU nodes at the GPU AZ's Spot price: every figure of the plan says it
            cost["gpu_nodes"] = spot_nodes_cost(prices, config.gpu_node_type, config.gpu_node_count, ROOT_VOLUME_GB,
                                                topo.gpu_az, topo.spot_prices.get(topo.gpu_az),
                                                also=tuple(config.spot_type_list()))
        self._idle_note = _idle_note(config, cost, nat=not adopted)
        private = [subnet_address("private", az) for az in topo.subnet_azs]
        res(VPC, "aws-vpc", {"cidr": "10.0.0.0/16"} if not adopted else {"cidr": None})
        for az in topo.subnet_azs:
            res(subnet_address("private", az), "aws-subnet",
                {"az": az, "cidr": subnet_cidr("private", topo.az_index[az]), "role": "private"}, VPC)
        if not adopted:
            public = [subnet_address("public", az) for az in topo.network_azs]
            for az in topo.network_azs:
                res(subnet_address("public", az), "aws-subnet",
                    {"az": az, "cidr": subnet_cidr("public", topo.az_index[az]), "role": "public"}, VPC)
            res(IGW, "aws-internet-gateway", {}, VPC)
            nat = cost["nat_gateway"]
            res(NAT, "aws-nat-gateway", {"az": topo.network_azs[0]}, IGW, public[0], cost=nat.per_hour, note=nat.note)
            res(PUBLIC_RT, "aws-route-table", {"role": "public", "via": "internet-gateway",
                                               "azs": sorted(topo.network_azs)}, IGW, *public)
            res(PRIVATE_RT, "aws-route-table", {"role": "private", "via": "nat-gateway",
                                                "azs": sorted(topo.subnet_azs)}, NAT, *private)
            res(S3_ENDPOINT, S3EndpointHandler.kind, S3EndpointHandler.spec(config.region), VPC, PRIVATE_RT,
                note=f"free: S3 traffic of the private subnets skips the NAT's ${prices.nat_per_gb:.3f}/GB")
        routes = () if adopted else (PRIVATE_RT,)
        res(NODE_SG, "aws-security-group", {"efa_rule": True}, VPC)
        own_bucket = not config.storage_path and aws_facts(ctx).data_bucket
        if own_bucket:
            res(BUCKET, BucketHandler.kind, BucketHandler.spec(aws_facts(ctx).data_bucket or ""),
                note=f"${S3_STANDARD_PER_GIB_MONTH}/GB-month of what it holds")
        # The run's own prefix in S3 (its bucket's, or the user's --storage-path): the Ray pods' role reaches
        # that prefix only.
        storage = effective_storage_path(config.storage_path, ctx.record.facts.storage_path)
        data_uri = run_storage_uri(storage, ctx.record.run_id) if storage and storage.startswith("s3://") else None
        def role(address: str, policies: Sequence[str]) -> None:
            # The trust's actions and condition keys (the account is filled in when the role is made).
            shape = trust_shape(trust_statement(address, config.region, "", config.cluster_name, config.namespace))
            spec: dict[str, Any] = {"service": service_principal(address, config.region),
                                    "policies": sorted(policies), "trust": shape}
            inline = inline_policies(address, config.cluster_name, ctx.record.run_id, config.region, data_uri)
            if inline:
                spec["inline"] = inline
            res(address, "aws-iam-role", spec)

        role(CLUSTER_ROLE, CLUSTER_POLICIES)
        role(NODE_ROLE, NODE_POLICIES)
        identities = planned_identities(config, data_uri)
        for identity in identities:
            role(identity.role_address, identity.policies)
        cluster_private = [subnet_address("private", az) for az in topo.network_azs]
        cidrs = self.api_cidr_list(ctx)
        access = ("OPEN TO THE WHOLE INTERNET (0.0.0.0/0): anyone can reach the API endpoint, which still asks "
                  "for credentials" if "0.0.0.0/0" in cidrs else f"only from {', '.join(sorted(cidrs))}")
        # Made before the cluster (EKS writes into it, and would make it untagged otherwise), deleted after it;
        # the cluster does not depend on it, so a group made anew never makes the cluster again.
        res(LOG_GROUP, LogGroupHandler.kind, {"name": log_group_name(config.cluster_name)},
            note=f"${CLOUDWATCH_LOGS_GB_MONTH:.2f}/GB-month of the control-plane logs it keeps")
        res(EKS_CLUSTER, "aws-eks-cluster", {"version": config.kubernetes_version, "azs": topo.network_azs,
                                             "auth": "API", "endpoint_private": True,
                                             "public_cidrs": sorted(cidrs), "api_access": access,
                                             "logs": sorted(CONTROL_PLANE_LOGS)},
            CLUSTER_ROLE, NODE_SG, *cluster_private, cost=cost["eks_control_plane"].per_hour)
        res(ACCESS_ENTRY, "aws-access-entry", {"policy": "cluster-admin"}, EKS_CLUSTER)
        res(KUBECONFIG, "aws-kubeconfig", {"context": "the cluster ARN"}, EKS_CLUSTER, ACCESS_ENTRY)
        for addon in ADDONS:
            deps = (EKS_CLUSTER, SYSTEM_NODES) if addon == "coredns" else (EKS_CLUSTER,)
            configuration = ADDON_CONFIGURATION.get(addon)
            res(addon_address(addon), "aws-eks-addon",
                {"name": addon, **({"configuration": configuration} if configuration else {})}, *deps)
        for identity in identities:
            # The data role's pods write to the bucket: it exists before they can start.
            data_deps = (BUCKET,) if identity is DATA_IDENTITY and own_bucket else ()
            res(identity.address, "aws-pod-identity", PodIdentityHandler.spec(ctx, identity), EKS_CLUSTER,
                identity.role_address, addon_address(POD_IDENTITY_AGENT), *data_deps)
        efa = config.wants_efa()
        named = topo.gpu_reservation
        block = named is not None and named.kind == "capacity-block"
        placement, own_group = topo.gpu_placement_group
        if own_group:
            placement = names.placement_group(topo.gpu_az)
            res(PLACEMENT_GROUP, "aws-placement-group", {"strategy": "cluster", "az": topo.gpu_az})
        res(LAUNCH_TEMPLATE, "aws-launch-template",
            {"efa": efa, "efa_interfaces": topo.efa_interfaces if efa else 0, "volume_gb": ROOT_VOLUME_GB,
             "imdsv2": True, "imds_hop_limit": 1, "cluster_sg": True, "reservation": named.id if named else None,
             "capacity_block": block, "placement_group": placement},
            NODE_SG, EKS_CLUSTER, *((PLACEMENT_GROUP,) if own_group else ()),
            note="" if named is None else _placement_note(named))
        res(SYSTEM_LAUNCH_TEMPLATE, "aws-launch-template",
            {"volume_gb": topo.system_disk_gb, "imdsv2": True, "imds_hop_limit": 1}, EKS_CLUSTER)
        # The nodes join once aws-node can assign addresses: its permissions come by pod identity.
        node_deps = (EKS_CLUSTER, NODE_ROLE, *routes, addon_address("vpc-cni"), addon_address("kube-proxy"),
                     CNI_IDENTITY.address)
        system_cost, gpu_cost = cost["system_nodes"], cost["gpu_nodes"]
        scaling = gpu_scaling_config(config)  # min 0 when idle workers go (cluster-autoscaler takes their nodes)
        spot_types = config.spot_type_list() if self.buys_spot(ctx) else []
        res(SYSTEM_NODES, "aws-nodegroup",
            {"instance_type": config.system_node_type, "size": config.system_node_count, "azs": topo.network_azs,
             "ami_type": AMI_CPU, "labels": {"role": "system"}, "disk_gb": topo.system_disk_gb,
             "launch_template": True},
            *node_deps, *cluster_private, SYSTEM_LAUNCH_TEMPLATE,
            cost=system_cost.per_hour, note=system_cost.note,
            quota=self._quota(topo.system_quota_code, topo.system_headroom,
                              topo.vcpus.get(config.system_node_type, 0) * config.system_node_count))
        res(GPU_NODES, "aws-nodegroup",
            {"instance_type": config.gpu_node_type, "size": config.gpu_node_count,
             "min_size": scaling["minSize"], "max_size": scaling["maxSize"], "azs": [topo.gpu_az],
             "ami_type": AMI_GPU, "labels": {GPU_LABEL: "true"}, "taints": [GPU_TAINT], "launch_template": True,
             "capacity_type": "SPOT" if self.buys_spot(ctx) else "CAPACITY_BLOCK" if block else "ON_DEMAND",
             **({"instance_types": [config.gpu_node_type, *spot_types]} if spot_types else {})},
            *node_deps, subnet_address("private", topo.gpu_az), LAUNCH_TEMPLATE,
            cost=gpu_cost.per_hour, note=gpu_cost.note,
            quota=self._quota(topo.gpu_quota_code, topo.gpu_headroom,
                              topo.vcpus.get(config.gpu_node_type, 0) * config.gpu_node_count))
        if config.idle_timeout_s():  # the group may shrink to zero: cluster-autoscaler must know its nodes
            res(GPU_ASG_TAGS, "aws-asg-tags", {"tags": gpu_asg_tags(config, config.cluster_name, ctx.record.run_id,
                                                                    topo.efa_interfaces if efa else 0)}, GPU_NODES)
            image = cluster_autoscaler_image(config.kubernetes_version)
            if image is not None:  # its credentials come with its pods, which start on the system node
                res(CLUSTER_AUTOSCALER, "aws-cluster-autoscaler", ClusterAutoscalerHandler.spec(ctx, image),
                    KUBECONFIG, SYSTEM_NODES, AUTOSCALER_IDENTITY.address)
        return sorted(out, key=lambda r: _rank(r.address))

    @staticmethod
    def _quota(code: str | None, headroom: float | None, vcpus: int) -> dict[str, dict[str, float | None]]:
        return {code: {"vcpus": float(vcpus), "headroom": headroom}} if code else {}

    # --- discovery ---------------------------------------------------------------------------
    async def discover(self, ctx: Context) -> list[Observed]:
        api = aws_api(ctx)
        found = await all_or_none(*(h.observe(api, ctx) for h in self._handlers.values()
                                    if isinstance(h, AwsHandler)))
        observed = [o for per_kind in found for o in per_kind]
        return self._with_teardown_order(sorted(observed, key=lambda o: _rank(o.address)))

    def _with_teardown_order(self, observed: list[Observed]) -> list[Observed]:
        """Each found resource depends on everything found that is made before it: teardown then
        goes strictly in reverse (a NAT gateway before its subnet, the nodegroups before the cluster)."""
        out = []
        for o in observed:
            earlier = tuple(p.address for p in observed if _rank(p.address) < _rank(o.address)
                            and _needs(o.address, p.address))
            out.append(o.model_copy(update={"depends_on": tuple(dict.fromkeys([*o.depends_on, *earlier]))}))
        return out

    # --- checks ----------------------------------------------------------------------------
    async def preflight(self, ctx: Context) -> list[CheckResult]:
        # Always afresh: a preflight is what AWS says now (quota filed, capacity freed); plan re-prepares too.
        config = aws_config(ctx)
        try:
            await self.prepare(ctx)
        except GivenVpcRefused as exc:
            return [*self.preflight_checks,
                    CheckResult(id="aws.vpc", title=f"VPC {config.vpc_id}", status=CheckStatus.FAIL,
                                detail=exc.message, remedy=exc.remedy)]
        except UserError as exc:
            return [*self.preflight_checks,
                    CheckResult(id="aws.azs", title="AZs", status=CheckStatus.FAIL, detail=exc.message,
                                remedy=exc.remedy)]
        results = list(self.preflight_checks)
        results.extend(await self._names_taken(ctx))
        if config.vpc_id:
            results.extend(await self._given_vpc(ctx))
        return results

    async def _names_taken(self, ctx: Context) -> list[CheckResult]:
        config = aws_config(ctx)
        api = aws_api(ctx)
        name = config.cluster_name
        out = []
        cluster = await describe_cluster(api, name)
        if cluster is not None and (cluster.get("tags") or {}).get(RUN_TAG) != ctx.record.run_id:
            owner = "another rtui run" if RUN_TAG in (cluster.get("tags") or {}) else "someone else"
            out.append(CheckResult(id="aws.name.cluster", title=f"EKS cluster {name}", status=CheckStatus.FAIL,
                                   detail=f"exists in {config.region} and belongs to {owner}",
                                   remedy="choose another --cluster-name (rtui never takes over what it did not make)"))
        for stack in (f"eksctl-{name}-cluster", name):
            found = await api.call("cloudformation", "describe_stacks", StackName=stack, ok=("ValidationError",))
            live = [s for s in (found or {}).get("Stacks") or [] if s.get("StackStatus") != "DELETE_COMPLETE"]
            if live:
                out.append(CheckResult(id="aws.name.stack", title=f"CloudFormation stack {stack}",
                                       status=CheckStatus.FAIL, detail="exists: a cluster of this name is managed "
                                       "by eksctl or CloudFormation", remedy="choose another --cluster-name"))
        role_handler = self._handlers["aws-iam-role"]
        assert isinstance(role_handler, RoleHandler)
        for role in await role_handler.foreign(api, ctx):
            out.append(CheckResult(id="aws.name.role", title=f"IAM role {role}", status=CheckStatus.FAIL,
                                   detail="exists and was not made by this run",
                                   remedy="choose another --cluster-name"))
        return out

    async def _given_vpc(self, ctx: Context) -> list[CheckResult]:
        api, config, topo = aws_api(ctx), aws_config(ctx), self.topology
        assert topo is not None
        ids = config.private_subnet_id_list()
        if not ids:
            return [CheckResult(id="aws.vpc", title=f"VPC {config.vpc_id}", status=CheckStatus.FAIL,
                                detail="--vpc-id needs its private subnets", remedy="pass --private-subnet-ids")]
        subnets = await api.pages("ec2", "describe_subnets", "Subnets", SubnetIds=ids)
        problems = [f"{s['SubnetId']} is in {s['VpcId']}" for s in subnets if s["VpcId"] != config.vpc_id]
        azs = {s["AvailabilityZone"] for s in subnets}
        if topo.gpu_az not in azs:
            problems.append(f"no private subnet in the GPU AZ {topo.gpu_az}")
        if len(azs) < 2:
            problems.append("EKS needs private subnets in two AZs")
        # DNS and each subnet's way out were checked by prepare (given_vpc), which refuses in one line.
        return [CheckResult(id="aws.vpc", title=f"VPC {config.vpc_id}",
                            status=CheckStatus.FAIL if problems else CheckStatus.OK,
                            detail=problems[0] if problems else f"{len(subnets)} private subnets in {sorted(azs)}",
                            remedy="fix the subnets or drop --vpc-id to let rtui build a VPC" if problems else None)]

    async def sweep(self, ctx: Context) -> list[Leftover]:
        config = aws_config(ctx)

        async def prices(types: tuple[str, ...]) -> RegionPrices:
            return await asyncio.to_thread(self.price_book(ctx).region, config.region, types)

        return await sweep(aws_api(ctx), ctx, prices)


def _first_reasons(report: PreflightReport, region_name: str) -> list[CheckResult]:
    """The blockers a user acts on, each on its own line with its remedy, before the matrix's summary."""
    region = next((r for r in report.regions if r.region == region_name), None)
    if region is None or not region.zones:
        return []
    out = []
    if not any(z.gpu_offered for z in region.zones):  # nothing else matters where the type is not sold
        return [CheckResult(id="aws.offered", title="GPU instance type", status=CheckStatus.FAIL,
                            detail=f"{report.gpu_node_type} is not offered in any AZ of {region_name}",
                            remedy="`rtui check --target aws --all-regions` shows where it is")]
    request = f"`rtui check --target aws --region {region_name} --request-quota-increase --yes`"
    for what, quota in (("GPU", region.quota), ("system node", region.system_quota)):
        if quota is not None and quota.ok is False:
            out.append(CheckResult(
                id="aws.quota", title=f"{what} vCPU quota", status=CheckStatus.FAIL,
                detail=f"quota {quota.code} ({quota.name}) in {region_name} is short by {quota.shortfall} vCPUs "
                       f"(limit {quota.limit:.0f}, used {quota.used}, needed {quota.needed})",
                remedy=f"{request} asks AWS for {quota.request_value}"))
    if not out and not any(z.feasible for z in region.zones):
        reasons = sorted({r for z in region.zones for r in z.reasons})
        out.append(CheckResult(id="aws.azs", title="AZs", status=CheckStatus.FAIL,
                               detail=f"no AZ of {region_name} can run the plan: {'; '.join(reasons[:3])}",
                               remedy="`rtui check --target aws --all-regions` shows where it can run"))
    return out


def _needs(later: str, earlier: str) -> bool:
    """Whether ``later`` must go before ``earlier`` is deleted (they share the VPC; IAM stands apart)."""
    if BUCKET in (earlier, later):  # the bucket shares nothing with the rest: it goes when the job is gone
        return False
    if LOG_GROUP in (earlier, later):  # it shares only the cluster's name: it goes once the cluster is gone
        return earlier == LOG_GROUP and later == EKS_CLUSTER
    if earlier.startswith("aws.iam-role."):
        return later in (EKS_CLUSTER, SYSTEM_NODES, GPU_NODES) or later.startswith(POD_IDENTITY_PREFIX)
    if later.startswith("aws.iam-role."):
        return False
    if earlier == PLACEMENT_GROUP:
        return later in (LAUNCH_TEMPLATE, GPU_NODES)
    return True



def _idle_note(config: AwsConfig, cost: Mapping[str, Any], *, nat: bool) -> str:
    """What still bills while cluster-autoscaler has taken every GPU node (the plan's priced parts but
    the GPU nodes), beside the full size; empty with ``--idle-minutes 0`` (the nodes never go)."""
    if not config.idle_timeout_s():
        return ""
    full = sum(float(p.per_hour or 0.0) for p in cost.values())
    idle = full - float(cost["gpu_nodes"].per_hour or 0.0)
    billing = "the system node, EKS and the NAT gateway" if nat else "the system node and EKS"
    return (f"idle after {config.idle_minutes:g} min without a job: the GPU nodes scale to zero "
            f"(cluster-autoscaler) and {billing} keep billing, ${idle:.2f}/h instead of ${full:.2f}/h")


def _control_plane_azs(zones: Sequence[ZoneReport], gpu_az: str, where: str, remedy: str) -> list[str]:
    """The two AZs of the network and the control plane: the GPU AZ first when EKS takes its zone ID
    (else it holds only the GPU subnet), then AZs EKS takes, those offering the system type first."""
    accepted = [z for z in zones if z.eks_supported]
    ranked = sorted(accepted, key=lambda z: (z.zone != gpu_az, not z.system_offered, z.zone))
    picked = [z.zone for z in ranked[:2]]
    if len(picked) < 2:
        raise UserError(f"EKS needs subnets in two AZs and {where} has {len(picked)} it accepts", remedy=remedy)
    return picked


def _placement_note(named: NamedReservation) -> str:
    """Why the GPU nodes go where they go when a reservation holds them."""
    if named.kind == "capacity-block":
        return f"Capacity Block {named.id}: co-located already, no placement group"
    if named.placement_group:
        return f"targeted ODCR {named.id}: into its placement group {named.placement_group}"
    return f"targeted ODCR {named.id}: made outside any placement group, so none (its capacity is not in one)"


def _past(when: str | None) -> bool:
    """Whether an ISO timestamp (a reservation's end date) has passed."""
    if not when:
        return False
    try:
        moment = datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        return False
    return moment.timestamp() <= time.time()


def _capacity_used(named: NamedReservation | None, open_reserved: int, count: int) -> str:
    """What capacity the GPU nodes of a plan launch into, in words."""
    if named is not None:
        return f"{'Capacity Block' if named.kind == 'capacity-block' else 'targeted ODCR'} {named.id}"
    if open_reserved:
        return f"open capacity reservations for {min(open_reserved, count)} of {count} nodes, On-Demand for the rest"
    return "On-Demand capacity"
