"""Where an aws run's nodes go: its GPU AZ, the two AZs of its network and control plane, the AZs it may
fail over to, and the capacity reservation its GPU nodes fill (DESIGN.md §3: what ``AwsLayer.prepare``
settles once per run, from the preflight's matrix and what the run record kept).

The GPU AZ is ``--availability-zone``, else the one this run chose before, else the preflight's
recommendation; the record keeps them, so a later plan never moves them by itself.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from backend.errors import OperationError, UserError
from backend.layers.base import Context
from backend.resources import CheckResult, CheckStatus
from targets.aws.cloud.catalog import quota_code_for
from targets.aws.cloud.report import reserved_nodes
from targets.aws.config import aws_config
from targets.aws.facts import SpotRisk, aws_facts
from targets.aws.infra.common import NamedReservation, Topology, aws_api
from targets.aws.infra.given_vpc import check_given_vpc, egress_note

if TYPE_CHECKING:
    from targets.aws.cloud import PreflightReport
    from targets.aws.cloud.report import ZoneReport


async def settle_azs(ctx: Context, report: PreflightReport, *, spot: bool, disk_gb: int,
                     disk_why: str) -> tuple[list[str], Topology]:
    """The run's AZs and reservation from the preflight's ``report``, with a line for each thing settled
    otherwise than a user would guess (a reservation Spot does not use, one that ended, a given VPC's
    way out). ``spot``: the GPU nodes are bought on Spot now. Raises UserError where no AZ can serve."""
    config, facts = aws_config(ctx), aws_facts(ctx)
    notes: list[str] = []
    region = next((r for r in report.regions if r.region == config.region), None)
    if region is None or not region.zones:
        why = region.error or "; ".join(region.reasons) if region else "not checked"
        raise UserError(f"cannot plan in {config.region}: {why}",
                        remedy="`rtui check --target aws --all-regions` shows where it can run")
    # A given VPC's private subnets fix the AZs: nothing is planned inside a VPC rtui did not make.
    given = await given_subnet_azs(ctx) if config.vpc_id else None
    in_reach = [z for z in region.zones if given is None or z.zone in given]
    zones = {z.zone: z for z in region.zones}
    feasible = [z.zone for z in in_reach if z.feasible]
    recommended = (report.recommendation.zone if report.recommendation
                   and report.recommendation.region == config.region else None)
    if given is not None and recommended not in given:
        recommended = next(iter(sorted(feasible, key=lambda a: zones[a].verdict != "feasible")), None)
    gpu_az = config.availability_zone or facts.gpu_az or recommended
    if gpu_az is None:
        blockers = first_reasons(report, config.region)
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
        notes.append(egress_note(vpc, await check_given_vpc(aws_api(ctx), vpc,
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
    if spot:
        # A reservation holds On-Demand capacity (a Capacity Block's too): Spot nodes never draw on it.
        if reservations.get(gpu_az) is not None:
            notes.append(f"capacity reservation {reservations[gpu_az].id} in {gpu_az} is On-Demand "
                               "capacity: the Spot GPU nodes do not use it (without --spot they would)")
        reservations = {}
        notes.append(
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
            notes.append(
                f"The Spot GPU nodes may be any of {', '.join([config.gpu_node_type, *config.spot_type_list()])}: "
                "a wider pool AWS is less often short of; priced at the dearest of them in the AZ, and "
                f"cluster-autoscaler sizes a node it adds as a {config.gpu_node_type}")
        if not config.max_failures:
            notes.append(
                "Spot with --max-failures 0: the first interruption ends the job; with --max-failures N Ray "
                "Train restarts the workers on the replacement node and goes on from the newest complete "
                "checkpoint (--checkpoint-every sets how many steps are done again)")
    elif config.spot and (fallback := facts.spot_fallback) is not None:
        notes.append(
            f"Spot GPU nodes went On-Demand in {fallback.az} at "
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(fallback.at))}: AWS had no Spot capacity for them "
            "(--spot-fallback on-demand); they stay On-Demand for this run")
    # The reservation this run's nodes already fill shows no free slot now: keep naming it, while it
    # lasts. One that expired or was cancelled is named no more, and the plan says what replaces it.
    kept = None if spot else facts.reservation
    if kept is not None and kept.az and kept.id:
        ended = await reservation_ended(ctx, kept.id, zones.get(kept.az))
        if ended is None:
            reservations[kept.az] = NamedReservation(kept.id, kept.kind or "odcr", kept.placement_group)
        elif kept.az == gpu_az:
            zone = zones.get(gpu_az)
            uses = _capacity_used(reservations.get(gpu_az), reserved_nodes(zone.reservations)[0] if zone else 0,
                                  config.gpu_node_count)
            notes.append(f"capacity reservation {kept.id} {ended}: the GPU nodes now use {uses}")
    return notes, Topology(
        reservations=reservations, system_disk_gb=disk_gb, system_disk_why=disk_why,
        network_azs=network_azs, gpu_az=gpu_az, az_index=index,
        failover_azs=[z for z in feasible if z != gpu_az and z not in facts.failed_azs],
        spot_prices={z.zone: z.spot_price for z in region.zones if z.spot_price is not None},
        gpu_quota_code=quota.code if quota else quota_code_for(config.gpu_node_type, spot=spot),
        gpu_headroom=quota.headroom if quota else None,
        system_quota_code=system_quota.code if system_quota else quota_code_for(config.system_node_type),
        system_headroom=system_quota.headroom if system_quota else None,
        # A GPU node may be any of the Spot types: its quota counts the largest.
        vcpus={config.gpu_node_type: max([report.gpu_instance.vcpus if report.gpu_instance else 0,
                                          *(i.vcpus for i in report.spot_instances)]),
               config.system_node_type: report.system_instance.vcpus if report.system_instance else 0},
        efa_interfaces=max(1, report.gpu_instance.efa_per_node) if report.gpu_instance else 1)



async def given_subnet_azs(ctx: Context) -> dict[str, str]:
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


async def reservation_ended(ctx: Context, reservation_id: str, zone: ZoneReport | None) -> str | None:
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


def first_reasons(report: PreflightReport, region_name: str) -> list[CheckResult]:
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



def _control_plane_azs(zones: Sequence[ZoneReport], gpu_az: str, where: str, remedy: str) -> list[str]:
    """The two AZs of the network and the control plane: the GPU AZ first when EKS takes its zone ID
    (else it holds only the GPU subnet), then AZs EKS takes, those offering the system type first."""
    accepted = [z for z in zones if z.eks_supported]
    ranked = sorted(accepted, key=lambda z: (z.zone != gpu_az, not z.system_offered, z.zone))
    picked = [z.zone for z in ranked[:2]]
    if len(picked) < 2:
        raise UserError(f"EKS needs subnets in two AZs and {where} has {len(picked)} it accepts", remedy=remedy)
    return picked



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
