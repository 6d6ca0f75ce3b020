"""The aws layer (DESIGN.md §3): network, IAM, EKS and its nodes, under the Kubernetes layer.

The layer holds what one session learns (the matrix, the prices, the AZs settled) and answers the
Layer contract from it; the work is in its own modules: ``zones`` settles the AZs and reservation
from the preflight's matrix (``prepare``), ``desired`` lists the resources a plan makes, ``order``
the order they are made and torn down in, ``checks`` the preflight's own checks, and one module per
kind of resource its handler (network, routes, iam, cluster, nodes, ...).

``prepare`` settles the AZs once per run and the run record keeps them, so a later plan (when our
own nodes use the quota preflight would count) never moves them by itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from backend.aio import all_or_none
from backend.errors import ApiUnreachable, OperationError, UserError
from backend.layers.base import Context, Handler, Layer
from backend.resources import CheckResult, CheckStatus, Leftover, NodeLoss, Observed, Resource
from targets.aws.cloud import run_preflight
from targets.aws.cloud.pricing import PriceBook, RegionPrices, builtin_region_prices
from targets.aws.cloud.public_ip import public_cidr
from targets.aws.cloud.spot_advisor import SpotAdvisor
from targets.aws.config import AwsConfig, aws_config
from targets.aws.facts import AzMove, SpotFallback, aws_facts
from targets.aws.infra import network, routes
from targets.aws.infra.autoscaler import ClusterAutoscalerHandler
from targets.aws.infra.checks import given_vpc, names_taken
from targets.aws.infra.cluster import (
    CLOUDWATCH_LOGS_GB_MONTH,
    CLOUDWATCH_LOGS_PER_GB,
    CONTROL_PLANE_LOGS,
    AccessEntryHandler,
    AddonHandler,
    EksClusterHandler,
    KubeconfigHandler,
)
from targets.aws.infra.common import (
    GPU_NODES,
    LAYER,
    ROOT_VOLUME_GB,
    AwsHandler,
    Topology,
    aws_api,
    system_disk_gb,
)
from targets.aws.infra.desired import desired_resources
from targets.aws.infra.endpoints import S3EndpointHandler, missing_endpoint_note
from targets.aws.infra.given_vpc import GivenVpcRefused
from targets.aws.infra.iam import RoleHandler
from targets.aws.infra.logs import LogGroupHandler
from targets.aws.infra.node_hours import GpuGroup, gpu_group, gpu_node_hours, gpu_node_losses, gpu_spot_cost
from targets.aws.infra.nodes import AsgTagsHandler, LaunchTemplateHandler, NodegroupHandler, PlacementGroupHandler
from targets.aws.infra.order import rank, with_teardown_order
from targets.aws.infra.podidentity import PodIdentityHandler
from targets.aws.infra.preflight_request import preflight_request
from targets.aws.infra.storage import BucketHandler, name_for, storage_uri
from targets.aws.infra.sweep import sweep
from targets.aws.infra.zones import first_reasons, settle_azs
from targets.kube.registry import image_size

if TYPE_CHECKING:
    from targets.aws.cloud import PreflightReport
    from targets.aws.cloud.report import RegionReport


@dataclass
class MatrixWatch:
    """Who watches the next feasibility matrix fill in (the TUI): the regions about to be checked,
    then each region as its checks return. ``all_regions`` widens it beyond the config's region."""

    on_listed: Callable[[list[str]], None] | None = None
    on_region: Callable[[RegionReport], None] | None = None
    all_regions: bool = False


class AwsLayer(Layer):
    name = LAYER
    title = "AWS infrastructure"
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
        self.preflight_checks = [*first_reasons(report, config.region), *report.to_check_results()]
        notes, topology = await settle_azs(ctx, report, spot=self.buys_spot(ctx), disk_gb=disk_gb,
                                           disk_why=f"{disk_why} ({image.reason})")
        self._notes.extend(notes)
        return topology

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
        self._planned_prices = prices = self.prices(config)
        self._planned_nat = not config.vpc_id
        resources, self._idle_note = desired_resources(ctx, topo, prices, spot=self.buys_spot(ctx),
                                                       api_cidrs=self.api_cidr_list(ctx))
        return resources

    # --- discovery ---------------------------------------------------------------------------
    async def discover(self, ctx: Context) -> list[Observed]:
        api = aws_api(ctx)
        found = await all_or_none(*(h.observe(api, ctx) for h in self._handlers.values()
                                    if isinstance(h, AwsHandler)))
        observed = [o for per_kind in found for o in per_kind]
        return with_teardown_order(sorted(observed, key=lambda o: rank(o.address)))

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
        roles = self._handlers["aws-iam-role"]
        assert isinstance(roles, RoleHandler)
        results.extend(await names_taken(ctx, roles))
        if config.vpc_id and self.topology is not None:
            results.extend(await given_vpc(ctx, self.topology))
        return results

    async def sweep(self, ctx: Context) -> list[Leftover]:
        config = aws_config(ctx)

        async def prices(types: tuple[str, ...]) -> RegionPrices:
            return await asyncio.to_thread(self.price_book(ctx).region, config.region, types)

        return await sweep(aws_api(ctx), ctx, prices)

