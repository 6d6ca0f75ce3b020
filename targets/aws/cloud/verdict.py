"""Per-AZ verdicts and the recommendation: pure functions over what the scan found."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backend.resources import CheckResult, CheckStatus
from targets.aws.cloud.catalog import EKS_REJECTED_ZONE_IDS, InstanceFacts
from targets.aws.cloud.quota import increase_command
from targets.aws.cloud.report import (
    QuotaStatus,
    Recommendation,
    RegionReport,
    Reservation,
    ZoneReport,
    ZoneVerdict,
    reserved_nodes,
)
from targets.aws.cloud.spot_advisor import time_stretch  # light: boto3 only inside read_advisor

_Add = Callable[..., None]


@dataclass(frozen=True)
class ZoneInputs:
    region: str
    zone: str
    zone_id: str
    offered: frozenset[str]
    # Zone IDs of the region's other AZs that EKS accepts for control-plane subnets.
    other_eks_zone_ids: frozenset[str]
    system_offered_in_region: bool
    reservations: tuple[Reservation, ...]


def assess_zone(
    inputs: ZoneInputs,
    *,
    gpu: InstanceFacts,
    gpu_count: int,
    system: InstanceFacts,
    system_count: int,
    require_efa: bool,
    quota: QuotaStatus,
    system_quota: QuotaStatus | None,
) -> ZoneReport:
    checks: list[CheckResult] = []

    def add(check_id: str, title: str, status: CheckStatus, detail: str, remedy: str | None = None) -> None:
        checks.append(
            CheckResult(
                id=f"aws.{inputs.zone}.{check_id}", title=title, status=status, detail=detail, remedy=remedy
            )
        )

    gpu_offered = gpu.instance_type in inputs.offered
    system_offered = system.instance_type in inputs.offered
    if gpu_offered:
        add("gpu", "GPU type offered", CheckStatus.OK, f"{gpu.instance_type} is offered in {inputs.zone}")
    else:
        add(
            "gpu",
            "GPU type offered",
            CheckStatus.FAIL,
            f"{gpu.instance_type} is not offered in {inputs.zone}",
            "choose another AZ or region",
        )

    if system_count == 0 or system_offered:
        add(
            "system",
            "System type offered",
            CheckStatus.OK,
            f"{system.instance_type} is offered in {inputs.zone}",
        )
    elif inputs.system_offered_in_region:
        add(
            "system",
            "System type offered",
            CheckStatus.WARN,
            f"{system.instance_type} is not offered in {inputs.zone}; the system node goes to another AZ",
        )
    else:
        add(
            "system",
            "System type offered",
            CheckStatus.FAIL,
            f"{system.instance_type} is not offered anywhere in {inputs.region}",
            "choose another system node type",
        )

    if gpu.efa_supported:
        rdma = "GPUDirect RDMA possible" if gpu.gdr else "no GPUDirect RDMA"
        add("efa", "EFA", CheckStatus.OK, f"EFA ×{gpu.efa_interfaces} per node, {rdma}")
    elif require_efa:
        add(
            "efa",
            "EFA",
            CheckStatus.FAIL,
            f"{gpu.instance_type} does not support EFA",
            "choose an EFA-capable type",
        )
    else:
        add("efa", "EFA", CheckStatus.WARN, f"{gpu.instance_type} has no EFA: NCCL will use TCP sockets")

    # EKS refuses control-plane subnets in a few zone IDs; nodes may still run there (EKS User
    # Guide, subnet requirements). Such an AZ can hold the GPU nodes, with the control plane's
    # two subnets in two other AZs.
    eks_zone_ok = inputs.zone_id not in EKS_REJECTED_ZONE_IDS
    others = ", ".join(sorted(inputs.other_eks_zone_ids))
    if not eks_zone_ok and len(inputs.other_eks_zone_ids) >= 2:
        add(
            "eks",
            "EKS control plane",
            CheckStatus.WARN,
            f"EKS rejects zone ID {inputs.zone_id} ({inputs.zone}) for its control plane: GPU nodes only "
            f"here, the control plane in two of {others}",
        )
    elif not eks_zone_ok:
        add(
            "eks",
            "EKS control plane",
            CheckStatus.FAIL,
            f"EKS rejects zone ID {inputs.zone_id} ({inputs.zone}) and {inputs.region} has not two other AZs "
            "it accepts for the control plane",
            "choose another region",
        )
    elif not inputs.other_eks_zone_ids:
        add(
            "eks",
            "EKS control plane",
            CheckStatus.FAIL,
            f"{inputs.region} has no second EKS-supported AZ for the control-plane subnets",
            "choose another region",
        )
    else:
        add("eks", "EKS control plane", CheckStatus.OK, f"{inputs.zone_id} accepted; second AZ: {others}")

    reserved, _ = reserved_nodes(inputs.reservations)
    if inputs.reservations:
        listing = ", ".join(
            f"{r.id} ({r.kind}, {r.match_criteria}, {r.available}/{r.total} free, {r.state}"
            + ("" if r.usable else ", not usable")
            + (f", until {r.end_date}" if r.end_date else "")
            + ")"
            for r in inputs.reservations
        )
        add("reservations", "Capacity reservations", CheckStatus.INFO, listing)

    _assess_quota(add, "quota", quota, gpu, gpu_count, reserved, inputs.region)
    if system_quota is not None and system_count:
        _assess_quota(add, "system-quota", system_quota, system, system_count, 0, inputs.region)

    reasons = [c.detail for c in checks if c.status is CheckStatus.FAIL]
    warnings = [c.detail for c in checks if c.status is CheckStatus.WARN]
    verdict: ZoneVerdict = "blocked" if reasons else ("warning" if warnings else "feasible")
    return ZoneReport(
        zone=inputs.zone,
        zone_id=inputs.zone_id,
        gpu_offered=gpu_offered,
        system_offered=system_offered,
        efa=gpu.efa_supported,
        efa_interfaces=gpu.efa_interfaces,
        gdr=gpu.gdr,
        eks_supported=eks_zone_ok,
        reservations=list(inputs.reservations),
        feasible=not reasons,
        reasons=reasons,
        verdict=verdict,
        warnings=warnings,
        checks=checks,
    )


def _assess_quota(
    add: _Add, check_id: str, quota: QuotaStatus, facts: InstanceFacts, count: int, reserved: int, region: str
) -> None:
    title = f"vCPU quota {quota.code or '?'}"
    if quota.ok is None or quota.headroom is None:
        add(
            check_id,
            title,
            CheckStatus.WARN,
            f"could not read the vCPU quota for {facts.instance_type}: {quota.error or 'unknown'}",
            "check it in the Service Quotas console",
        )
        return
    numbers = f"limit {quota.limit:g}, used {quota.used}, needed {quota.needed}, headroom {quota.headroom:g}"
    if quota.ok:
        add(check_id, title, CheckStatus.OK, numbers)
        return
    # Instances that land in a reservation are capacity we already hold (issue 5): they
    # rescue a short quota when reserved slots plus what the headroom fits cover the plan.
    fits = max(0, math.floor(quota.headroom / facts.vcpus)) if facts.vcpus else 0
    remedy = f"ask for a limit of {quota.request_value}: {increase_command(region, quota)}"
    if reserved and reserved + fits >= count:
        add(
            check_id,
            title,
            CheckStatus.WARN,
            f"quota short by {quota.shortfall} vCPUs ({numbers}), but a reservation holds {reserved} node(s)",
            remedy,
        )
    else:
        add(check_id, title, CheckStatus.FAIL, f"quota short by {quota.shortfall} vCPUs ({numbers})", remedy)


def _why_this_zone(best: tuple[Any, ...], candidates: list[tuple[Any, ...]]) -> str:
    """Why ``best`` (no reservation) came first: "cheapest" only when another zone costs more."""
    others = [c for c in candidates if c is not best]
    if not others:
        return "the only feasible zone"
    price = best[0][1]
    if any(price < other[0][1] for other in others):
        return "cheapest feasible zone"
    same = "no price is known to choose by" if math.isinf(price) else "the feasible zones have the same price"
    if not best[0][2] and any(other[0][2] for other in others):  # the rest carry warnings
        return f"a feasible zone without warnings ({same})"
    return f"first feasible zone by name ({same})"


def expected_cost(spot_per_hour: float | None, on_demand_per_hour: float | None, score: int | None,
                  rate_per_hour: float | None, gpu_nodes: int) -> float | None:
    """A Spot plan's expected cost per hour of training in one AZ: p × (Spot $/h × stretch) + (1 − p) ×
    On-Demand $/h.

    p = score / 10. EC2 says a Spot placement score tells how likely a Spot request of that size is to
    succeed there now, 1 (unlikely) to 10 (highly likely, never guaranteed), a recommendation for the account
    and not a promise of capacity or of interruptions (EC2 User Guide, "Spot placement score", "How Spot
    placement score works"). Reading it as the probability that the GPU nodes get Spot capacity, and the
    rest of the time run On-Demand (``--spot-fallback on-demand``), is our assumption. Unknown: p = 1.

    stretch = 1 / (1 − λ·n·L): each of the n GPU nodes is taken at λ per node-hour (the Spot Instance
    Advisor's bucket, spot_advisor.py) and each loss costs L (``LOST_MINUTES_PER_INTERRUPTION``: a
    replacement node, half a checkpoint interval redone) while the whole plan bills. Unknown: λ = 0.
    None when a price is unknown; inf when interruptions outrun the job."""
    if spot_per_hour is None or on_demand_per_hour is None:
        return None
    p = 1.0 if score is None else min(max(score, 0), 10) / 10
    stretch = time_stretch(rate_per_hour or 0.0, gpu_nodes)
    if math.isinf(stretch):
        return math.inf if p > 0 else round(on_demand_per_hour, 4)
    return round(p * spot_per_hour * stretch + (1 - p) * on_demand_per_hour, 4)


def _why_expected(best: tuple[Any, ...], candidates: list[tuple[Any, ...]], region: RegionReport,
                  zone: ZoneReport) -> str:
    """Why a Spot plan's ``best`` came first: "lowest expected cost" only when another zone's is higher."""
    expected = best[0][1]
    spot = zone_price(region, zone)
    known = spot is not None and not math.isinf(expected)
    at = f"${expected:.2f}/h of training (${spot:.2f}/h with Spot GPU nodes)" if known else None
    score = f"Spot placement score {zone.spot_score}" if zone.spot_score is not None \
        else "no Spot placement score (taken as 10)"
    others = [c for c in candidates if c is not best]
    if at is None:
        head = "no expected cost is known to choose by"
    elif not others:
        head = f"the only feasible zone: expected {at}"
    elif any(expected < other[0][1] for other in others):
        head = f"lowest expected cost to finish: {at}"
    elif not best[0][2] and any(other[0][2] for other in others):
        head = f"a feasible zone without warnings (the feasible zones' expected costs are the same: {at})"
    else:
        head = f"first feasible zone by name (the feasible zones' expected costs are the same: {at})"
    rate = region.spot_interruptions
    risk = (f"interruptions {rate.text()} for {rate.instance_type}" if rate is not None
            else "no interruption rate known (taken as none)")
    return f"{head}, {score}, {risk}"


def zone_price(region: RegionReport, zone: ZoneReport) -> float | None:
    """The plan's $/h in this AZ: its own where prices differ by AZ (Spot), else the region's."""
    return zone.price_per_hour if zone.price_per_hour is not None else region.price_per_hour


def recommend(regions: list[RegionReport], *, spot: bool = False) -> Recommendation | None:
    """The cheapest feasible AZ, preferring one with a usable matching reservation (On-Demand capacity:
    never for ``spot``, whose nodes do not draw on one). A Spot plan's cheapest is by its expected cost per
    hour of training (``ZoneReport.expected_per_hour``, see ``expected_cost``), not by the Spot price alone:
    a cheap AZ where Spot capacity is unlikely (a low placement score) mostly runs On-Demand."""
    if spot:
        return _recommend_spot(regions)
    candidates = []
    for region in regions:
        for zone in region.zones:
            if not zone.feasible:
                continue
            reserved, named = (0, None) if spot else reserved_nodes(zone.reservations)
            reservation = None if spot else (
                named.id if named else next((r.id for r in zone.reservations if r.usable), None))
            price = zone_price(region, zone)
            price = price if price is not None else math.inf
            # The most GPU nodes already reserved first (a reservation is capacity held and paid for).
            key = (-reserved, price, zone.verdict != "feasible", region.region, zone.zone)
            candidates.append((key, region, zone, reservation))
    if not candidates:
        return None
    best = min(candidates, key=lambda c: c[0])
    _, region, zone, reservation = best
    why = "holds a matching capacity reservation" if reservation else _why_this_zone(best, candidates)
    if zone.warnings:
        why += f"; note: {zone.warnings[0]}"
    return Recommendation(
        region=region.region,
        zone=zone.zone,
        zone_id=zone.zone_id,
        price_per_hour=zone_price(region, zone),
        price_source=region.price_source,
        reservation=reservation,
        why=why,
    )


def _recommend_spot(regions: list[RegionReport]) -> Recommendation | None:
    candidates = []
    for region in regions:
        for zone in region.zones:
            if not zone.feasible:
                continue
            expected = zone.expected_per_hour if zone.expected_per_hour is not None else math.inf
            key = (0, expected, zone.verdict != "feasible", region.region, zone.zone)
            candidates.append((key, region, zone))
    if not candidates:
        return None
    best = min(candidates, key=lambda c: c[0])
    _, region, zone = best
    why = _why_expected(best, candidates, region, zone)
    if zone.warnings:
        why += f"; note: {zone.warnings[0]}"
    return Recommendation(region=region.region, zone=zone.zone, zone_id=zone.zone_id,
                          price_per_hour=zone_price(region, zone), price_source=region.price_source, why=why)
