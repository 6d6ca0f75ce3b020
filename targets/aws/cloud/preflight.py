"""The AWS preflight feasibility matrix: which regions and AZs can run the plan, and why not.

Read-only by construction: only Describe/Get calls. Regions are scanned concurrently; inside
a region the independent calls run at once too, so a region costs about one round trip.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from backend.config import clip, shown
from backend.errors import OperationError, UserError
from targets.aws.calls import CallPool
from targets.aws.cloud.catalog import EKS_REJECTED_ZONE_IDS, InstanceFacts, quota_code_for
from targets.aws.cloud.pricing import PlanShape, PriceBook, RegionPrices, price_plan, spot_nodes_cost, spot_prices
from targets.aws.cloud.quota import headroom, read_quota_limit, running_instances, vcpus_in_use
from targets.aws.cloud.report import (
    InterruptionRate,
    PreflightReport,
    PreflightRequest,
    QuotaStatus,
    RegionReport,
    Reservation,
)
from targets.aws.cloud.spot_advisor import SpotAdvisor
from targets.aws.cloud.verdict import ZoneInputs, assess_zone, expected_cost, recommend
from targets.aws.session import AwsSession, describe_aws_error, error_code

T = TypeVar("T")
ENABLED_OPT_IN = ("opt-in-not-required", "opted-in")


class _Scan:
    """The state one preflight run shares between its region scans."""

    def __init__(self, request: PreflightRequest, aws: AwsSession, prices: PriceBook | None = None,
                 advisor: SpotAdvisor | None = None) -> None:
        self.request = request
        self.aws = aws
        self.pool = CallPool(aws.workers, request.max_concurrency)
        self.prices = prices or PriceBook(aws)
        self._price_gate = asyncio.Lock()
        self.gpu: InstanceFacts
        self.system: InstanceFacts
        # A Spot plan's GPU types: the GPU type first, then --spot-types (the nodegroup may launch any).
        self.spot_types: list[str] = [request.gpu_node_type]
        self.spot_facts: dict[str, InstanceFacts] = {}
        # The Spot Instance Advisor's data, read once per preflight (a Spot plan's only), shared by regions.
        self.advisor = advisor or SpotAdvisor(aws)
        self.advisor_read: asyncio.Future[Any] | None = None

    async def region_prices(self, region: str) -> RegionPrices:
        """Everything a plan in ``region`` bills, from the session's PriceBook (the plan and the sweep
        price from the same answer)."""
        types = (self.request.gpu_node_type, self.request.system_node_type)
        if not self.prices.api_answered:
            # Until the Pricing API has answered once the PriceBook lets one caller ask it at a
            # time; wait here rather than in a worker, where the wait would hold a pool slot.
            async with self._price_gate:
                if not self.prices.api_answered:
                    return await self.pool.run(self.prices.region, region, types)
        return await self.pool.run(self.prices.region, region, types)

    async def call(self, service: str, region: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(client, *args)`` in a worker thread. The client is made there too: creating
        one costs ~10 ms of CPU, which would otherwise stall the loop once per region."""
        return await self.pool.run(lambda: fn(self.aws.client(service, region), *args, **kwargs))


async def run_preflight(
    request: PreflightRequest,
    *,
    on_region: Callable[[RegionReport], None] | None = None,
    on_listed: Callable[[list[str]], None] | None = None,
    session: AwsSession | None = None,
    prices: PriceBook | None = None,
    advisor: SpotAdvisor | None = None,
) -> PreflightReport:
    """Build the matrix. Raises ``UserError`` for bad input and ``OperationError`` for AWS failures
    that stop the whole check (credentials, permissions, an endpoint that does not answer);
    per-region trouble lands in the report. ``on_listed`` gets the regions about to be checked,
    ``on_region`` each region as it completes (progress). ``prices``: a session's PriceBook, so a
    plan asks the Pricing API once per region and type however often it re-plans; ``advisor``: a
    session's SpotAdvisor, so a Spot plan reads the Spot Instance Advisor's object once."""
    started = time.perf_counter()
    aws = session or AwsSession(request.profile)
    try:
        # asyncio.timeout, not wait_for: wait_for runs the scan in a task of its own, and one cancelled
        # by the caller just as it failed ended with the failure nobody read (a traceback under the CLI's
        # one line; tests/aws/test_preflight_cancel.py). Here the scan runs in the caller's task.
        async with asyncio.timeout(request.deadline_s):
            return await _matrix(_Scan(request, aws, prices, advisor), on_region, on_listed, started)
    except TimeoutError:
        raise OperationError(
            f"the AWS check did not finish within {request.deadline_s:g} s "
            f"(AWS at {aws.endpoint('ec2', request.default_region)})",
            remedy="check the network, the proxy or AWS_ENDPOINT_URL, or check fewer regions",
        ) from None
    finally:
        if session is None:
            aws.close()  # nobody else can reuse its worker threads


async def _matrix(
    scan: _Scan,
    on_region: Callable[[RegionReport], None] | None,
    on_listed: Callable[[list[str]], None] | None,
    started: float,
) -> PreflightReport:
    request, aws = scan.request, scan.aws
    home = request.default_region
    extras = [t for t in dict.fromkeys(request.spot_types) if t != request.gpu_node_type] if request.spot else []
    types = sorted({request.gpu_node_type, request.system_node_type, *extras})
    regions_task = asyncio.ensure_future(
        scan.call("ec2", home, lambda c: c.describe_regions(AllRegions=True))
    )
    types_task = asyncio.ensure_future(
        scan.call("ec2", home, lambda c: c.describe_instance_types(InstanceTypes=types))
    )
    try:
        # Outside any region's limit, and botocore retries a read timeout: without a deadline
        # a dead endpoint held the check silent for attempts × read timeout (141 s measured).
        # asyncio.timeout, not wait_for: Python 3.11's wait_for, cancelled, leaves the gather's
        # CancelledError unretrieved, printed as a traceback under the CLI's one-line error.
        async with asyncio.timeout(request.listing_timeout_s):
            regions_resp, types_resp = await asyncio.gather(regions_task, types_task)
    except TimeoutError:
        raise OperationError(
            f"no answer from AWS at {aws.endpoint('ec2', home)} within {request.listing_timeout_s:g} s "
            f"while listing regions and instance types in {home}",
            remedy="check the network, the proxy or AWS_ENDPOINT_URL",
        ) from None
    except Exception as exc:
        for task in (regions_task, types_task):
            task.cancel()
        if error_code(exc) in ("InvalidInstanceType", "InvalidParameterValue") and "nstance" in str(exc):
            raise UserError(
                f"instance type does not exist in {home}: {clip(_aws_message(exc), 200)}",
                remedy="check the GPU and system node types",
            ) from exc
        raise describe_aws_error(
            exc, action=f"listing regions and instance types in {home}", profile=request.profile
        ) from exc

    facts = {t["InstanceType"]: InstanceFacts.from_api(t) for t in types_resp.get("InstanceTypes", [])}
    for name in types:
        if name not in facts:
            raise UserError(f"instance type {shown(name)} does not exist", remedy="check the node types")
    scan.gpu, scan.system = facts[request.gpu_node_type], facts[request.system_node_type]
    if scan.gpu.gpus == 0:
        raise UserError(
            f"{clip(request.gpu_node_type)} has no GPUs", remedy="choose a GPU instance type (g6, g5, p4d, p5)"
        )
    if request.require_efa and not scan.gpu.efa_supported:
        raise UserError(
            f"{clip(request.gpu_node_type)} does not support EFA, which this plan requires",
            remedy="choose an EFA-capable type such as g6.12xlarge or train over TCP with --require-transport any",
        )

    raw = {t["InstanceType"]: t for t in types_resp.get("InstanceTypes", [])}
    for extra in extras:
        _check_spot_type(request, scan.gpu, raw[request.gpu_node_type], facts[extra], raw[extra])
    scan.spot_types = [request.gpu_node_type, *extras]
    scan.spot_facts = {name: facts[name] for name in scan.spot_types}
    if request.spot:  # read once, beside the regions' scans, which wait for it only at their end
        scan.advisor_read = asyncio.ensure_future(scan.pool.run(scan.advisor.document))

    opt_in = {r["RegionName"]: r.get("OptInStatus", "opt-in-not-required") for r in regions_resp["Regions"]}
    partition = aws.partition_of(home)
    targets = _target_regions(request, opt_in, partition, aws)
    if on_listed is not None:
        on_listed(targets)

    async def one(region: str) -> RegionReport:
        report = await _scan_region_bounded(scan, region, opt_in[region])
        if on_region is not None:
            on_region(report)
        return report

    try:
        reports = await asyncio.gather(*(one(r) for r in targets))
    finally:
        if scan.advisor_read is not None:
            scan.advisor_read.cancel()  # a no-op once read; else nobody waits for it any more
    recommendation = recommend(list(reports), spot=request.spot)
    if recommendation is not None and request.spot and len(scan.spot_types) < SCORED_TYPES:
        recommendation.why += (f"; Spot placement scores of fewer than {SCORED_TYPES} instance types are low "
                               "whatever the capacity (EC2), so they are shown, not weighed: --spot-types widens "
                               "the pool")
    return PreflightReport(
        gpu_node_type=request.gpu_node_type,
        gpu_node_count=request.gpu_node_count,
        system_node_type=request.system_node_type,
        system_node_count=request.system_node_count,
        gpu_instance=scan.gpu,
        spot_instances=list(scan.spot_facts.values()),
        system_instance=scan.system,
        regions=list(reports),
        recommendation=recommendation,
        elapsed_s=round(time.perf_counter() - started, 3),
    )


def _gpus(data: dict[str, Any]) -> tuple[tuple[str, str, int, int], ...]:
    """An instance type's GPUs as describe_instance_types gives them: (manufacturer, model, count, MiB each)."""
    gpus = (data.get("GpuInfo") or {}).get("Gpus") or []
    return tuple(sorted((str(g.get("Manufacturer", "")), str(g.get("Name", "")), int(g.get("Count", 0)),
                         int((g.get("MemoryInfo") or {}).get("SizeInMiB", 0))) for g in gpus))


def _gpus_text(gpus: tuple[tuple[str, str, int, int], ...]) -> str:
    return " + ".join(f"{count}× {maker} {model} {mib / 1024:g} GiB" for maker, model, count, mib in gpus) or "none"


def _check_spot_type(request: PreflightRequest, gpu: InstanceFacts, gpu_raw: dict[str, Any], extra: InstanceFacts,
                     extra_raw: dict[str, Any]) -> None:
    """Refuse a --spot-types type the GPU nodegroup cannot mix with the GPU type: the group launches any of
    its types, so each must give the job the same GPUs (model and maker, count, memory each), the EFA the
    plan's transport needs on as many network cards (the launch template asks for one EFA interface per card
    of the GPU type), and count against the same Spot vCPU quota."""
    name, remedy = clip(extra.instance_type), f"leave {clip(extra.instance_type)} out of --spot-types"
    mine, theirs = _gpus(gpu_raw), _gpus(extra_raw)
    if mine != theirs:
        raise UserError(f"--spot-types {name} has {_gpus_text(theirs)}, not {clip(gpu.instance_type)}'s "
                        f"{_gpus_text(mine)}: every type of the GPU nodegroup must have the same GPUs",
                        remedy=f"{remedy}, or choose a type with {_gpus_text(mine)}")
    if request.require_efa and not extra.efa_supported:
        raise UserError(f"--spot-types {name} does not support EFA, which this plan requires",
                        remedy=f"{remedy}, or train over TCP with --require-transport any")
    if request.require_efa and extra.efa_per_node < gpu.efa_per_node:
        raise UserError(f"--spot-types {name} has {extra.efa_per_node} EFA network card(s), fewer than "
                        f"{clip(gpu.instance_type)}'s {gpu.efa_per_node}",
                        remedy=f"{remedy}, or choose a type with as many network cards")
    code, theirs_code = quota_code_for(gpu.instance_type, spot=True), quota_code_for(extra.instance_type, spot=True)
    if code != theirs_code:
        raise UserError(f"--spot-types {name} counts against Spot vCPU quota {theirs_code or 'unknown'}, not "
                        f"{clip(gpu.instance_type)}'s {code or 'unknown'}",
                        remedy=f"{remedy}, or choose a type of the same family class")


def _target_regions(
    request: PreflightRequest, opt_in: dict[str, str], partition: str | None, aws: AwsSession
) -> list[str]:
    if request.all_regions:
        # describe_regions may list other partitions' regions (moto does); they need other credentials.
        return sorted(r for r in opt_in if partition is None or aws.partition_of(r) == partition)
    wanted = list(dict.fromkeys(request.regions or [request.default_region]))
    unknown = [r for r in wanted if r not in opt_in]
    if unknown:
        raise UserError(f"unknown region {clip(', '.join(unknown))}", remedy="use a region name such as us-east-1")
    return wanted


async def _scan_region_bounded(scan: _Scan, region: str, opt_in_status: str) -> RegionReport:
    started = time.perf_counter()
    if opt_in_status not in ENABLED_OPT_IN:
        return RegionReport(
            region=region,
            enabled=False,
            opt_in_status=opt_in_status,
            reasons=[f"{region} is not enabled for this account ({opt_in_status})"],
        )
    try:
        async with asyncio.timeout(scan.request.region_timeout_s):  # not wait_for: see run_preflight
            report = await _scan_region(scan, region)
    except TimeoutError:
        report = RegionReport(
            region=region,
            enabled=True,
            reachable=False,
            error=f"no answer within {scan.request.region_timeout_s:g} s",
            reasons=[f"{region} did not answer within {scan.request.region_timeout_s:g} s (unreachable)"],
        )
    except Exception as exc:
        line = str(describe_aws_error(exc, action=f"checking {region}", profile=scan.request.profile))
        report = RegionReport(region=region, enabled=True, error=line, reasons=[line])
    report.opt_in_status = opt_in_status
    report.elapsed_s = round(time.perf_counter() - started, 3)
    return report


async def _optional(coro: Any) -> tuple[Any, BaseException | None]:
    """Await a call whose failure degrades the verdict (a warning) instead of failing the region."""
    try:
        return await coro, None
    except Exception as exc:
        return None, exc


async def _scan_region(scan: _Scan, region: str) -> RegionReport:
    req = scan.request
    types = sorted({req.gpu_node_type, req.system_node_type, *scan.spot_types})
    gpu_code = quota_code_for(req.gpu_node_type, spot=True) if req.spot else scan.gpu.quota_code
    codes = sorted({c for c in (gpu_code, scan.system.quota_code if req.system_node_count else None) if c})

    # A quota read can take a second round trip (no applied value: ask for the AWS default),
    # so quota reads go out first, in every region, before any region's other calls: the
    # second trips then overlap the rest instead of trailing the whole scan.
    quota_reads = [
        asyncio.ensure_future(_optional(scan.call("service-quotas", region, read_quota_limit, code)))
        for code in codes
    ]
    try:
        await asyncio.sleep(0)
        zones_call = scan.call(
            "ec2", region, _zones, Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}]
        )
        offers_call = scan.call("ec2", region, _offerings, types)
        results: list[Any] = await asyncio.gather(
            zones_call,
            offers_call,
            _optional(scan.call("ec2", region, running_instances)),
            _optional(scan.call("ec2", region, _reservations, req.gpu_node_type, req.gpu_node_count)),
            _optional(scan.call("ec2", region, _spot_prices, scan.spot_types) if req.spot else _nothing()),
            _optional(scan.call("ec2", region, spot_scores, scan.spot_types, req.gpu_node_count, region)
                      if req.spot else _nothing()),
            *quota_reads,
            scan.region_prices(region),
        )
    finally:
        for task in quota_reads:
            task.cancel()  # a no-op once done; else the region was abandoned (timeout)
    zones_resp, offered, (instances, inst_err), (reservations, res_err), (spot, spot_err) = results[:5]
    scores, scores_err = results[5]
    limits = dict(zip(codes, results[6 : 6 + len(codes)], strict=True))
    prices: RegionPrices = results[-1]

    vcpus_by_type = {scan.gpu.instance_type: scan.gpu.vcpus, scan.system.instance_type: scan.system.vcpus,
                     **{name: facts.vcpus for name, facts in scan.spot_facts.items()}}
    if instances:
        missing = sorted({i["InstanceType"] for i in instances if i["vcpus"] is None} - set(vcpus_by_type))
        if missing:
            vcpus_by_type.update(await scan.call("ec2", region, _vcpus_of, missing))
    used = vcpus_in_use(instances or [], vcpus_by_type)

    def quota_for(code: str | None, needed: int) -> QuotaStatus:
        if code is None:
            return headroom(None, needed=needed, limit=None, used=None)
        (limit_source, err) = limits[code]
        problem = err or inst_err
        if problem is not None:
            return headroom(code, needed=needed, limit=None, used=None, error=_short_error(problem))
        return headroom(
            code, needed=needed, limit=limit_source[0], used=used.get(code, 0), source=limit_source[1]
        )

    # A Spot nodegroup of several types may launch the largest: the quota must hold that many vCPUs.
    gpu_needed = req.gpu_node_count * max([scan.gpu.vcpus, *(f.vcpus for f in scan.spot_facts.values())])
    system_needed = req.system_node_count * scan.system.vcpus
    same_code = gpu_code is not None and gpu_code == scan.system.quota_code
    quota = quota_for(gpu_code, gpu_needed + (system_needed if same_code else 0))
    system_quota = (
        None if same_code or not req.system_node_count else quota_for(scan.system.quota_code, system_needed)
    )

    zones = [
        (z["ZoneName"], z["ZoneId"])
        for z in zones_resp["AvailabilityZones"]
        if z.get("State", "available") == "available"
    ]
    eks_ids = {zid for _, zid in zones if zid not in EKS_REJECTED_ZONE_IDS}
    system_anywhere = any(req.system_node_type in offered.get(name, ()) for name, _ in zones)
    by_zone: dict[str, list[Reservation]] = {}
    for r in reservations or []:
        by_zone.setdefault(r.zone, []).append(r)

    zone_reports = [
        assess_zone(
            ZoneInputs(
                region=region,
                zone=name,
                zone_id=zid,
                offered=frozenset(offered.get(name, ())),
                other_eks_zone_ids=frozenset(eks_ids - {zid}),
                system_offered_in_region=system_anywhere,
                reservations=tuple(by_zone.get(name, [])),
            ),
            gpu=scan.gpu,
            gpu_count=req.gpu_node_count,
            system=scan.system,
            system_count=req.system_node_count,
            require_efa=req.require_efa,
            quota=quota,
            system_quota=system_quota,
        )
        for name, zid in sorted(zones)
    ]
    cost = price_plan(prices, PlanShape(
        gpu_node_type=req.gpu_node_type, gpu_node_count=req.gpu_node_count, gpu_disk_gb=req.gpu_disk_gb,
        system_node_type=req.system_node_type, system_node_count=req.system_node_count,
        system_disk_gb=req.system_disk_gb))
    reasons = []
    if not any(z.gpu_offered for z in zone_reports):
        reasons.append(f"{req.gpu_node_type} is not offered in {region}")
    if res_err is not None:
        for z in zone_reports:
            z.warnings.append(f"could not list capacity reservations: {_short_error(res_err)}")
    gpu_part = cost.parts["gpu_nodes"].per_hour
    rate: InterruptionRate | None = None
    rate_notes: list[str] = []
    if req.spot and scan.advisor_read is not None:
        await asyncio.shield(scan.advisor_read)  # shared: one region's timeout must not cancel the read
        rate, rate_notes = scan.advisor.rates(region, scan.spot_types)
    for z in zone_reports:
        # The nodegroup may launch any of its types offered here: the dearest Spot price is what it may bill.
        here = [(spot or {}).get(t, {}).get(z.zone) for t in scan.spot_types if t in offered.get(z.zone, ())]
        z.spot_price = max((p for p in here if p is not None), default=None)
        if spot_err is not None:
            z.warnings.append(f"could not read Spot prices: {_short_error(spot_err)}")
        if req.spot:
            z.spot_score = (scores or {}).get(z.zone_id)
            if scores_err is not None:
                z.warnings.append(f"could not read Spot placement scores (ec2:GetSpotPlacementScores): "
                                  f"{_short_error(scores_err)}")
            z.warnings.extend(rate_notes)
        if req.spot and cost.total is not None and gpu_part is not None:
            at_spot = spot_nodes_cost(prices, req.gpu_node_type, req.gpu_node_count, req.gpu_disk_gb, z.zone,
                                      z.spot_price).per_hour
            z.price_per_hour = None if at_spot is None else round(cost.total - gpu_part + at_spot, 4)
            # A score of fewer than SCORED_TYPES types says nothing of capacity: not weighed (p = 1).
            weighed = z.spot_score if len(scan.spot_types) >= SCORED_TYPES else None
            z.expected_per_hour = expected_cost(z.price_per_hour, cost.total, weighed,
                                                rate.per_hour if rate is not None else None, req.gpu_node_count)
    return RegionReport(
        region=region,
        enabled=True,
        price_per_hour=cost.total,
        price_source=cost.source,
        price_breakdown=cost.breakdown(),
        spot_interruptions=rate,
        quota=quota,
        system_quota=system_quota,
        zones=zone_reports,
        feasible=any(z.feasible for z in zone_reports),
        reasons=reasons,
    )


async def _nothing() -> None:
    return None


# EC2 scores fewer than three different instance types low whatever the capacity (EC2 API reference,
# GetSpotPlacementScores, InstanceTypes; EC2 User Guide, "Spot placement score", Limitations).
SCORED_TYPES = 3


def spot_scores(ec2: Any, instance_types: list[str], count: int, region: str) -> dict[str, int]:
    """EC2's Spot placement score of each AZ of ``region`` (by zone ID) for ``count`` instances of any of
    ``instance_types``, all in one AZ.

    What EC2 says of it (EC2 User Guide, "Spot placement score" and "How Spot placement score works"; EC2 API
    reference, GetSpotPlacementScores and SpotPlacementScore): a score from 1 (a Spot request of this size is
    unlikely to succeed) to 10 (highly likely, not guaranteed) for the target capacity, the types and the
    moment asked, counting the account's own recent Spot use; a recommendation, no promise of capacity nor of
    how often it is taken back, to act on at once (so asked afresh by every check, never kept). With
    ``SingleAvailabilityZone`` the answer lists AZs by ``AvailabilityZoneId``, which zone names map to per
    account; only the top 10, paged (``MaxResults`` 10 to 1000, ``NextToken``; a page may hold fewer than
    asked). ``TargetCapacity`` (1 to 2,000,000,000, here in ``units``: instances) and ``InstanceTypes``
    (exclusive with ``InstanceRequirementsWithMetadata``) must be the request the nodegroup makes for the
    score to apply. Fewer than three different types always score low. EC2 may refuse new request
    configurations beyond a daily number (Limitations: ``MaxConfigLimitExceeded``); this asks one per region
    and plan. It needs ``ec2:GetSpotPlacementScores``. Blocking."""
    scores: dict[str, int] = {}
    pages = ec2.get_paginator("get_spot_placement_scores").paginate(
        InstanceTypes=list(dict.fromkeys(instance_types)), TargetCapacity=count, TargetCapacityUnitType="units",
        SingleAvailabilityZone=True, RegionNames=[region], PaginationConfig={"PageSize": 10})
    for page in pages:
        for item in page.get("SpotPlacementScores", []):
            zone_id, score = item.get("AvailabilityZoneId"), item.get("Score")
            if zone_id and score is not None and item.get("Region", region) == region:
                scores[str(zone_id)] = int(score)
    return scores


def _spot_prices(ec2: Any, instance_types: list[str]) -> dict[str, dict[str, float]]:
    """type -> AZ -> the Spot price in effect now (``spot_prices``), for each of a Spot plan's types."""
    return {name: spot_prices(ec2, name) for name in instance_types}


def _zones(ec2: Any, **kwargs: Any) -> dict[str, Any]:
    return dict(ec2.describe_availability_zones(**kwargs))


def _offerings(ec2: Any, types: list[str]) -> dict[str, set[str]]:
    """Instance types offered per AZ name, for the given types."""
    offered: dict[str, set[str]] = {}
    paginator = ec2.get_paginator("describe_instance_type_offerings")
    pages = paginator.paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": types}]
    )
    for page in pages:
        for offer in page.get("InstanceTypeOfferings", []):
            offered.setdefault(offer["Location"], set()).add(offer["InstanceType"])
    return offered


def _reservations(ec2: Any, instance_type: str, count: int) -> list[Reservation]:
    """The reservations of the GPU type, each marked usable when the launch would draw on it.

    What EC2 does (EC2 API reference, ``CapacityReservationSpecification``; EC2 User Guide, "On-Demand
    Capacity Reservations" and "Launch instances using Capacity Blocks"): an active reservation takes
    instances of its type, AZ, platform and tenancy. An *open* one takes them unnamed, as many as it has
    free, the rest runs On-Demand. A *targeted* ODCR or a Capacity Block takes only instances whose
    launch template names it: the GPU launch template names one, so it serves the plan only when it
    holds every GPU node (a launch beyond its free slots fails, and a Capacity Block nodegroup cannot
    spill to On-Demand). Per-AZ matching is the caller's (reports are grouped by the reservation's AZ).

    Placement ("Use Capacity Reservations with cluster placement groups", EC2 User Guide): a reservation
    made in a cluster placement group holds its capacity in that group, so only instances launched into
    it draw on it. The launch template puts the GPU nodes into a named reservation's own group (or none),
    but into rtui's own cluster group otherwise: an *open* ODCR made in some placement group takes none
    of them and is not counted."""
    found: list[Reservation] = []
    paginator = ec2.get_paginator("describe_capacity_reservations")
    filters = [
        {"Name": "instance-type", "Values": [instance_type]},
        {"Name": "state", "Values": ["active", "scheduled", "pending", "payment-pending"]},
    ]
    for page in paginator.paginate(Filters=filters):
        for cr in page.get("CapacityReservations", []):
            if cr.get("InstanceType") != instance_type:
                continue  # filters are advisory for us: trust only what matches
            kind: Literal["odcr", "capacity-block"] = (
                "capacity-block" if cr.get("ReservationType") == "capacity-block" else "odcr"
            )
            end = cr.get("EndDate")
            reservation = Reservation(
                id=cr["CapacityReservationId"],
                kind=kind,
                instance_type=cr["InstanceType"],
                platform=cr.get("InstancePlatform", ""),
                zone=cr.get("AvailabilityZone", ""),
                zone_id=cr.get("AvailabilityZoneId"),
                tenancy=cr.get("Tenancy", "default"),
                available=int(cr.get("AvailableInstanceCount", 0)),
                total=int(cr.get("TotalInstanceCount", 0)),
                state=cr.get("State", ""),
                end_date=end.isoformat() if hasattr(end, "isoformat") else end,
                match_criteria=cr.get("InstanceMatchCriteria", "open"),
            )
            reservation.placement_group = _group_name(cr.get("PlacementGroupArn"))
            reservation.why_unusable = _why_unusable(reservation, count)
            reservation.usable = not reservation.why_unusable
            found.append(reservation)
    return found


def _group_name(arn: object) -> str | None:
    return str(arn).rsplit("/", 1)[-1] if arn else None


def _why_unusable(reservation: Reservation, count: int) -> str:
    """Why the plan's GPU nodes would not land in ``reservation`` ("" when they would)."""
    if reservation.state != "active":
        return f"{reservation.state}, not active"
    if reservation.platform != "Linux/UNIX" or reservation.tenancy != "default":
        return f"for {reservation.platform} ({reservation.tenancy} tenancy), not Linux/UNIX (default tenancy)"
    if reservation.targeted and reservation.available < count:
        return f"{reservation.available} free, and a named reservation must hold all {count} GPU nodes"
    if reservation.available < 1:
        return "no free slot"
    if not reservation.targeted and reservation.placement_group:
        return (f"made in placement group {reservation.placement_group}: it takes only instances launched "
                "into that group, and the GPU nodes go into rtui's own")
    return ""


def _vcpus_of(ec2: Any, types: list[str]) -> dict[str, int]:
    response = ec2.describe_instance_types(InstanceTypes=types)
    return {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"]) for t in response.get("InstanceTypes", [])}


def _aws_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Message", exc))
    return str(exc)


def _short_error(exc: BaseException) -> str:
    return f"{error_code(exc)}: {_aws_message(exc)}"[:200]
