"""The preflight's input and its report: plain pydantic data, printed as JSON by ``rtui check``.

``PreflightReport.model_dump()`` is the ``--json`` contract: ``regions[*]`` carry ``region,
enabled, price_per_hour, quota{code, limit, used, needed, headroom, ok}, zones[*]{zone, zone_id,
gpu_offered, system_offered, efa, efa_interfaces, gdr, eks_supported, reservations, feasible,
reasons}, feasible`` and the report carries ``recommendation: {region, zone} | null``. Extra
fields only ever get added. A Spot plan's zones add ``spot_price``, ``price_per_hour``, ``spot_score``
and ``expected_per_hour``, its regions ``spot_interruptions: {instance_type, label, share_per_month,
per_hour, at_least} | null``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from backend.resources import CheckResult, CheckStatus
from targets.aws.cloud.catalog import InstanceFacts


class PreflightRequest(BaseModel):
    """What to check. Field names match ``RunConfig`` where they overlap."""

    regions: list[str] | None = None
    all_regions: bool = False
    gpu_node_type: str = "g6.12xlarge"
    gpu_node_count: int = Field(default=2, ge=1)
    system_node_type: str = "m7i.xlarge"
    system_node_count: int = Field(default=1, ge=0)
    require_efa: bool = True
    # The GPU nodes on Spot capacity: their quota is the Spot one, and each AZ is priced at its Spot price.
    spot: bool = False
    # More types the Spot GPU nodegroup may launch (``--spot-types``), each with the GPU type's GPUs.
    spot_types: list[str] = Field(default_factory=list)
    # The root volumes the plan gives its nodes (gp3, billed per GB-month): priced with the nodes.
    gpu_disk_gb: int = Field(default=200, ge=1)
    system_disk_gb: int = Field(default=100, ge=1)
    profile: str | None = None
    default_region: str = "us-east-1"
    # One slow region must not hold the matrix hostage; it is reported unreachable instead.
    region_timeout_s: float = Field(default=30.0, gt=0)
    # Listing the regions and instance types comes before any region: when it gets no answer
    # the endpoint is dead (or unreachable) and the whole check stops, naming it.
    listing_timeout_s: float = Field(default=12.0, gt=0)
    # A backstop over the whole check, for whatever the two limits above do not cover.
    deadline_s: float = Field(default=60.0, gt=0)
    # AWS calls in flight at once, across all regions.
    max_concurrency: int = Field(default=64, ge=1)


class QuotaStatus(BaseModel):
    """A regional vCPU quota against what the plan needs."""

    code: str | None
    name: str = ""
    limit: float | None = None
    used: int | None = None
    needed: int
    headroom: float | None = None
    ok: bool | None = None
    # "applied" (the account's value), "default" (AWS default; no applied value found) or
    # "unavailable" (could not be read: see ``error``).
    source: Literal["applied", "default", "unavailable"] = "unavailable"
    shortfall: int = 0
    # The limit to ask for when short: what is running now plus what the plan needs.
    request_value: int | None = None
    error: str | None = None


class Reservation(BaseModel):
    """An On-Demand Capacity Reservation or a capacity block that matches the GPU type."""

    id: str
    kind: Literal["odcr", "capacity-block"]
    instance_type: str
    platform: str
    zone: str
    zone_id: str | None = None
    tenancy: str
    available: int
    total: int
    state: str
    end_date: str | None = None
    match_criteria: str = "open"
    # The cluster placement group it was made in (from PlacementGroupArn): its capacity is held there.
    placement_group: str | None = None
    # Active, Linux/UNIX, default tenancy, with room: instances of the plan can land in it (a targeted
    # ODCR or a Capacity Block: only when it holds every GPU node, since the launch template names it).
    usable: bool = False
    why_unusable: str = ""

    @property
    def targeted(self) -> bool:
        """Used only by instances whose launch template names it (Capacity Blocks always are)."""
        return self.kind == "capacity-block" or self.match_criteria == "targeted"


def reserved_nodes(reservations: list[Reservation] | tuple[Reservation, ...]) -> tuple[int, Reservation | None]:
    """How many GPU nodes of one AZ land in reservations, and the one the launch template must name.

    Open ODCRs fill up unnamed, together. A launch template names at most one reservation, so a named
    one (a Capacity Block first: paid for and time-boxed; then a targeted ODCR) is used alone."""
    named = sorted((r for r in reservations if r.usable and r.targeted),
                   key=lambda r: (r.kind != "capacity-block", -r.available, r.id))
    if named:
        return named[0].available, named[0]
    return sum(r.available for r in reservations if r.usable), None


ZoneVerdict = Literal["feasible", "warning", "blocked"]


class InterruptionRate(BaseModel):
    """The Spot Instance Advisor's bucket for one type in one region (targets/aws/cloud/spot_advisor.py)."""

    instance_type: str
    label: str  # the advisor's bucket: "<5%", "5-10%", ... ">20%" of instances taken back in a month
    share_per_month: float  # the bucket's upper edge as a share (">20%": its lower one, see ``at_least``)
    per_hour: float  # that share as a constant rate per instance-hour
    at_least: bool = False  # ">20%": no upper edge; the rate is a lower bound

    def text(self) -> str:
        """"5-10%/month (0.00014/h)", "at least >20%/month (...)"."""
        return ("at least " if self.at_least else "") + f"{self.label}/month ({self.per_hour:.5f}/node-h)"


class ZoneReport(BaseModel):
    zone: str
    zone_id: str
    gpu_offered: bool
    system_offered: bool
    efa: bool
    efa_interfaces: int
    gdr: bool
    eks_supported: bool
    reservations: list[Reservation] = Field(default_factory=list)
    # The GPU type's Spot price here, USD per instance-hour (Linux/UNIX, in effect now); asked for Spot
    # plans only, None where EC2 has none.
    spot_price: float | None = None
    # The plan's cost per hour in this AZ where it differs by AZ (a Spot plan's, at this AZ's Spot price);
    # None: the region's price_per_hour.
    price_per_hour: float | None = None
    # EC2's Spot placement score for the plan's GPU nodes here (1-10: how likely a Spot request of that size
    # is to be fulfilled now, a recommendation); None: not asked (On-Demand) or not known.
    spot_score: int | None = None
    # A Spot plan's expected cost per hour of training here (verdict.expected_cost): Spot at this AZ's price,
    # stretched by the time interruptions cost, weighed by the score against On-Demand.
    expected_per_hour: float | None = None
    feasible: bool
    reasons: list[str] = Field(default_factory=list)
    verdict: ZoneVerdict = "blocked"
    warnings: list[str] = Field(default_factory=list)
    checks: list[CheckResult] = Field(default_factory=list)


class RegionReport(BaseModel):
    region: str
    enabled: bool
    opt_in_status: str = ""
    # False when the region did not answer within the per-region timeout.
    reachable: bool = True
    error: str | None = None
    price_per_hour: float | None = None
    price_source: str | None = None
    price_breakdown: dict[str, float] = Field(default_factory=dict)
    # A Spot plan's interruption rate here, the highest of its types (None: not a Spot plan, or not known).
    spot_interruptions: InterruptionRate | None = None
    quota: QuotaStatus | None = None
    system_quota: QuotaStatus | None = None
    zones: list[ZoneReport] = Field(default_factory=list)
    feasible: bool = False
    reasons: list[str] = Field(default_factory=list)
    elapsed_s: float = 0.0


class Recommendation(BaseModel):
    region: str
    zone: str
    zone_id: str = ""
    price_per_hour: float | None = None
    price_source: str | None = None
    reservation: str | None = None
    why: str = ""


    def price_text(self) -> str:
        """"$9.55/h (estimate, us-east-1 prices)": the figure with where it comes from."""
        if self.price_per_hour is None:
            return "price unknown"
        return f"${self.price_per_hour:.2f}/h" + (f" ({self.price_source})" if self.price_source else "")


class PreflightReport(BaseModel):
    gpu_node_type: str
    gpu_node_count: int
    system_node_type: str
    system_node_count: int
    gpu_instance: InstanceFacts | None = None
    spot_instances: list[InstanceFacts] = Field(default_factory=list)  # the --spot-types, as EC2 describes them
    system_instance: InstanceFacts | None = None
    regions: list[RegionReport] = Field(default_factory=list)
    recommendation: Recommendation | None = None
    elapsed_s: float = 0.0

    @property
    def feasible(self) -> bool:
        return any(r.feasible for r in self.regions)

    def to_check_results(self) -> list[CheckResult]:
        """One finding per region, then the recommendation: the shape a target's ``preflight()`` returns."""
        results: list[CheckResult] = []
        for region in self.regions:
            results.append(_region_check(region))
        if self.recommendation is not None:
            rec = self.recommendation
            price = f" at {rec.price_text()}" if rec.price_per_hour is not None else ""
            results.append(
                CheckResult(
                    id="aws.recommendation",
                    title="Recommended placement",
                    status=CheckStatus.OK,
                    detail=f"{rec.zone} ({rec.zone_id}) in {rec.region}{price}. {rec.why}".strip(),
                    data=rec.model_dump(),
                )
            )
        else:
            results.append(
                CheckResult(
                    id="aws.recommendation",
                    title="Recommended placement",
                    status=CheckStatus.FAIL,
                    detail="No checked availability zone can run this plan.",
                    remedy="check more regions (--all-regions), ask for more quota, or change the GPU type",
                )
            )
        return results


def _region_check(region: RegionReport) -> CheckResult:
    feasible_zones = [z.zone for z in region.zones if z.feasible]
    if feasible_zones:
        status = (
            CheckStatus.WARN
            if all(z.verdict == "warning" for z in region.zones if z.feasible)
            else CheckStatus.OK
        )
        detail = f"feasible in {', '.join(feasible_zones)}"
    else:
        status = CheckStatus.FAIL
        reasons = region.reasons or sorted({r for z in region.zones for r in z.reasons})
        detail = "; ".join(reasons) or "no feasible zone"
    return CheckResult(
        id=f"aws.region.{region.region}",
        title=f"Region {region.region}",
        status=status,
        detail=detail,
        remedy=region.quota.error if region.quota and region.quota.error else None,
        data={"region": region.region, "feasible": region.feasible},
    )
