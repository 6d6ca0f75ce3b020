"""How long the GPU nodes really ran, from what AWS itself records: the Auto Scaling group's activities.

cluster-autoscaler takes idle GPU nodes away and brings them back (issue 26), so "the nodegroup
since it was made, at full size" overstates what a run cost. The group's scaling activities
(``autoscaling:DescribeScalingActivities``, Auto Scaling API reference) hold one activity per
instance launched ("Launching a new EC2 instance: i-…") and one per instance terminated
("Terminating EC2 instance: i-…"; the User Guide's "Verify a scaling activity for an Auto Scaling
group" shows both), each with its ``StartTime``, ``EndTime`` and ``StatusCode``. An instance runs
from its launch's start to its termination's end, or to now while no termination has ended.

Limits, said rather than guessed: AWS keeps activities for six weeks ("all activities for the past
six weeks are described"), so an older group's history may lack launches; a termination whose launch
is not listed means the history is incomplete. In both cases there is no figure (None), and the
caller says its full-size figure is an upper bound. A launch counts from its activity's start, a
little before EC2 starts billing the instance: the figure errs high by seconds per launch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from backend.errors import RtuiError
from backend.resources import NodeLoss
from targets.aws.cloud.pricing import SPOT_PRODUCT
from targets.aws.config import aws_config
from targets.aws.infra.common import Names, aws_api

if TYPE_CHECKING:
    from backend.layers.base import Context

RETENTION_S = 6 * 7 * 24 * 3600  # "the past six weeks"
_LAUNCH = re.compile(r"^Launching a new EC2 instance: (i-[0-9a-f]+)")
_TERMINATE = re.compile(r"^Terminating EC2 instance: (i-[0-9a-f]+)")
_NOT_RUN = ("Failed", "Cancelled")  # a launch that failed started no instance


def _epoch(value: object) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    return None


def node_hours(activities: Iterable[Mapping[str, Any]], *, since: float, now: float) -> float | None:
    """Instance-hours of the group between ``since`` (when the run made it) and ``now``, or None when
    the activities cannot tell (the history may have aged out, or a termination has no launch)."""
    found = runs(activities, since=since, now=now)
    return None if found is None else sum(end - start for start, end in found) / 3600


def runs(activities: Iterable[Mapping[str, Any]], *, since: float, now: float) -> list[tuple[float, float]] | None:
    """When each instance of the group ran between ``since`` and ``now`` (start, end), or None when the
    activities cannot tell (``node_hours``)."""
    if now - since > RETENTION_S:
        return None
    launched: dict[str, float] = {}
    ended: dict[str, float] = {}
    for activity in activities:
        description, status = str(activity.get("Description") or ""), activity.get("StatusCode")
        start, end = _epoch(activity.get("StartTime")), _epoch(activity.get("EndTime"))
        if (found := _LAUNCH.match(description)) and status not in _NOT_RUN and start is not None:
            launched[found[1]] = min(start, launched.get(found[1], start))
        elif found := _TERMINATE.match(description):
            # Billing stops once the instance is terminated: the activity's end; until then, now.
            ended[found[1]] = end if status == "Successful" and end is not None else now
    if set(ended) - set(launched):
        return None
    spans = [(max(start, since), min(ended.get(i, now), now)) for i, start in launched.items()]
    return [(start, end) for start, end in spans if end > start]


def billed(spans: Iterable[tuple[float, float]], prices: list[tuple[float, float]]) -> float | None:
    """Dollars of instances that ran ``spans`` (start, end; epoch seconds) at a price per hour that
    changed at the times ``prices`` gives ((when, USD per hour), each in effect until the next); None
    when a span starts before the first price known."""
    prices = sorted(prices)
    total = 0.0
    for start, end in spans:
        if not prices or start < prices[0][0]:
            return None
        for (at, usd), (upto, _) in zip(prices, [*prices[1:], (float("inf"), 0.0)], strict=True):
            overlap = min(end, upto) - max(start, at)
            if overlap > 0:
                total += usd * overlap / 3600
    return total


# How an Auto Scaling group words a termination it did not choose (the activity's ``Cause``). An instance
# EC2 took away (a Spot interruption, among others) is noticed by the group's EC2 health check: "an
# instance was taken out of service in response to an EC2 health check indicating it has been terminated
# or stopped", after which the group launches a replacement (the User Guide's "Capacity Rebalancing": without
# it, the group replaces a Spot Instance only after EC2 interrupts it and its health check fails; public
# post-mortems of Spot node groups quote this wording, with the instance's state reason
# ``Server.SpotInstanceTermination``). With Capacity Rebalancing (on for EKS managed node groups' Spot
# capacity), the group replaces an instance on its rebalance recommendation and names that.
_TERMINATED_OUTSIDE = "health check indicating it has been terminated or stopped"
_REBALANCE = "rebalance"
_UNHEALTHY = "health check"


def node_losses(activities: Iterable[Mapping[str, Any]], *, spot: bool, since: float, now: float) -> list[NodeLoss]:
    """The instances the group lost between ``since`` and ``now`` without choosing to (a scale-in, a
    deleted group, a scheduled action are choices), oldest first; on Spot capacity an instance EC2
    terminated or stopped is a Spot interruption."""
    out: list[NodeLoss] = []
    for activity in activities:
        found = _TERMINATE.match(str(activity.get("Description") or ""))
        at = _epoch(activity.get("StartTime"))
        if found is None or at is None or not since <= at <= now or activity.get("StatusCode") in _NOT_RUN:
            continue
        cause = str(activity.get("Cause") or "").lower()
        if _REBALANCE in cause:
            out.append(NodeLoss(at, found[1], "Spot rebalance recommendation", spot=True))
        elif _TERMINATED_OUTSIDE in cause:
            out.append(NodeLoss(at, found[1], "Spot interruption" if spot else "instance terminated or stopped",
                                spot=spot))
        elif _UNHEALTHY in cause:
            out.append(NodeLoss(at, found[1], "failed its health check"))
    return sorted(out, key=lambda loss: loss.at)


GpuGroup = tuple[Mapping[str, Any], list[Mapping[str, Any]]]  # the GPU nodegroup, its groups' activities


async def gpu_group(ctx: Context) -> GpuGroup | None:
    """The run's GPU nodegroup and its Auto Scaling groups' activities; None when they cannot be read
    (no group yet, the call refused): the caller says so."""
    api = aws_api(ctx)
    cluster = aws_config(ctx).cluster_name
    try:
        group = (await api.call("eks", "describe_nodegroup", clusterName=cluster,
                                nodegroupName=Names(cluster).gpu_nodegroup,
                                ok=("ResourceNotFoundException",)) or {}).get("nodegroup") or {}
        names = [g["name"] for g in (group.get("resources") or {}).get("autoScalingGroups") or [] if g.get("name")]
        if not names:
            return None
        return group, [a for name in names for a in await api.pages(
            "autoscaling", "describe_scaling_activities", "Activities", AutoScalingGroupName=name)]
    except RtuiError:
        return None


async def spot_price_history(ctx: Context, instance_type: str, az: str, *, since: float,
                             now: float) -> list[tuple[float, float]]:
    """The Linux Spot price of ``instance_type`` in ``az`` from ``since`` to ``now``: (when, USD per
    hour) of each change, the first the one in effect at ``since`` (``DescribeSpotPriceHistory`` with
    ``StartTime`` answers that one too; EC2 API reference)."""
    found = await aws_api(ctx).pages(
        "ec2", "describe_spot_price_history", "SpotPriceHistory", InstanceTypes=[instance_type],
        ProductDescriptions=[SPOT_PRODUCT], AvailabilityZone=az, StartTime=datetime.fromtimestamp(since, UTC),
        EndTime=datetime.fromtimestamp(now, UTC))
    out = {}
    for line in found:
        at = _epoch(line.get("Timestamp"))
        if at is not None and line.get("InstanceType") == instance_type and line.get("AvailabilityZone") == az:
            out[at] = float(line["SpotPrice"])
    in_effect = [t for t in out if t <= since]
    # The line in effect at ``since`` counts from then: earlier lines say nothing of this run.
    first = max(in_effect) if in_effect else None
    return sorted(((since, usd) if at == first else (at, usd)) for at, usd in out.items()
                  if first is None or at >= first)


async def gpu_spot_cost(ctx: Context, found: GpuGroup | None, *, since: float, now: float, az: str,
                        disk_per_node_hour: float) -> float | None:
    """What the Spot GPU nodes cost between ``since`` and ``now``: each instance from its launch to its end
    (the group's activities, ``found``) at the Spot price in effect each moment in ``az`` (its price
    history), and its root volume at ``disk_per_node_hour``; None when either cannot be read."""
    spans = None if found is None else runs(found[1], since=since, now=now)
    if not spans:
        return None if spans is None else 0.0
    try:
        prices = await spot_price_history(ctx, aws_config(ctx).gpu_node_type, az, since=min(s for s, _ in spans),
                                          now=now)
    except RtuiError:
        return None
    cost = billed(spans, prices)
    return None if cost is None else cost + disk_per_node_hour * sum(e - s for s, e in spans) / 3600


def gpu_node_hours(found: GpuGroup | None, *, since: float, now: float) -> float | None:
    """The run's GPU node-hours from its nodegroup's Auto Scaling group's activities (None: unknown)."""
    return None if found is None else node_hours(found[1], since=since, now=now)


def gpu_node_losses(found: GpuGroup | None, *, since: float, now: float) -> list[NodeLoss]:
    """The GPU nodes the run lost from its nodegroup's activities (empty: none, or they cannot be read)."""
    if found is None:
        return []
    group, activities = found
    return node_losses(activities, spot=group.get("capacityType") == "SPOT", since=since, now=now)
