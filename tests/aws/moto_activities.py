"""A nodegroup's Auto Scaling activities as AWS records them, where moto 5.2 answers none.

moto's ``DescribeScalingActivities`` returns an empty list whatever the group did. AWS records one
activity per instance it launches or terminates (Amazon EC2 Auto Scaling User Guide, "Verify a
scaling activity for an Auto Scaling group": ``Description`` "Launching a new EC2 instance:
i-…" / "Terminating EC2 instance: i-…", ``StatusCode`` ``Successful``, ``Progress`` 100, a
``Cause`` in words), and answers them (API reference, DescribeScalingActivities) sorted by start
time, latest first, activities still in progress first; at most ``MaxRecords`` a page (default
100, at most 100, else ``ValidationError``) with a ``NextToken`` for the rest; only activities of
the past six weeks.

Here a nodegroup's group records a launch per instance when the nodegroup turns ACTIVE (from its
creation to then), a launch or a termination per instance ``SetDesiredCapacity`` adds or takes
away, and a termination per instance left when the nodegroup is deleted.

A launch that finds no capacity is recorded as AWS records it, **while the nodegroup is still
CREATING**: the group tries to launch as soon as EKS makes it, and each failed try is a ``Failed``
activity ("Launching a new EC2 instance.  Status Reason: ... InsufficientInstanceCapacity ...";
Amazon EC2 Auto Scaling User Guide, "Troubleshoot Amazon EC2 Auto Scaling: EC2 instance launch
failures", and "Verify a scaling activity"). EKS reports the nodegroup's health issue
``AsgInstanceLaunchFailures`` ("Your Auto Scaling group is experiencing failures while attempting to
launch instances": EKS API reference, Issue; EKS User Guide, "Troubleshoot problems with Amazon EKS
managed node groups") and keeps it CREATING while the group retries; CREATE_FAILED comes last
(``Timings.capacity_verdict`` after ``nodegroup_create``). ``failed_launch`` writes that activity.
"""

from __future__ import annotations

import base64
import uuid
from datetime import datetime, timedelta
from typing import Any

from moto.autoscaling.exceptions import ValidationError
from moto.autoscaling.models import autoscaling_backends
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.common_types import TYPE_RESPONSE
from moto.core.responses import ActionResult
from moto.core.utils import utcnow

RETENTION = timedelta(weeks=6)


def _log(account: str, region: str, asg: str) -> list[dict[str, Any]]:
    scaling = autoscaling_backends[account][region]
    activities: dict[str, list[dict[str, Any]]] = scaling.__dict__.setdefault("rtui_activities", {})
    return activities.setdefault(asg, [])


def launched(account: str, region: str, asg: str, instance_ids: list[str], *, started: datetime,
             before: int, cause: str = "a difference between desired and actual capacity") -> None:
    """One Successful launch activity per instance, from ``started`` to now."""
    for n, instance in enumerate(instance_ids):
        _log(account, region, asg).append({
            "ActivityId": str(uuid.uuid4()), "AutoScalingGroupName": asg,
            "Description": f"Launching a new EC2 instance: {instance}",
            "Cause": f"At {started.isoformat()}Z an instance was started in response to {cause}, increasing the "
                     f"capacity from {before + n} to {before + n + 1}.",
            "StartTime": started, "EndTime": utcnow(), "StatusCode": "Successful", "Progress": 100,
            "Details": "{}"})


def terminated(account: str, region: str, asg: str, instance_ids: list[str], *, before: int,
               cause: str = "a difference between desired and actual capacity") -> None:
    """One Successful termination activity per instance, now."""
    now = utcnow()
    for n, instance in enumerate(instance_ids):
        _log(account, region, asg).append({
            "ActivityId": str(uuid.uuid4()), "AutoScalingGroupName": asg,
            "Description": f"Terminating EC2 instance: {instance}",
            "Cause": f"At {now.isoformat()}Z an instance was taken out of service in response to {cause}, "
                     f"shrinking the capacity from {before - n} to {before - n - 1}.",
            "StartTime": now, "EndTime": now, "StatusCode": "Successful", "Progress": 100, "Details": "{}"})


def interrupted(account: str, region: str, asg: str, instance: str, replacement: str) -> None:
    """EC2 took ``instance`` away (a Spot interruption) and the group replaced it, as AWS records it:
    its EC2 health check finds the instance terminated, the group takes it out of service ("an instance
    was taken out of service in response to an EC2 health check indicating it has been terminated or
    stopped"), then launches another ("an instance was launched in response to an unhealthy instance
    needing to be replaced"). Without Capacity Rebalancing a group replaces a Spot Instance only after EC2
    interrupted it and its health check failed (Amazon EC2 Auto Scaling User Guide, "Capacity
    Rebalancing"); the two causes are as public post-mortems of Spot Auto Scaling groups quote them. No
    capacity change is said: the group's desired capacity stays."""
    now = utcnow()
    log = _log(account, region, asg)
    log.append({"ActivityId": str(uuid.uuid4()), "AutoScalingGroupName": asg,
                "Description": f"Terminating EC2 instance: {instance}",
                "Cause": f"At {now.isoformat()}Z an instance was taken out of service in response to an EC2 health "
                         "check indicating it has been terminated or stopped.",
                "StartTime": now, "EndTime": now, "StatusCode": "Successful", "Progress": 100, "Details": "{}"})
    log.append({"ActivityId": str(uuid.uuid4()), "AutoScalingGroupName": asg,
                "Description": f"Launching a new EC2 instance: {replacement}",
                "Cause": f"At {now.isoformat()}Z an instance was launched in response to an unhealthy instance "
                         "needing to be replaced.",
                "StartTime": now, "EndTime": now, "StatusCode": "Successful", "Progress": 100, "Details": "{}"})


def failed_launch(account: str, region: str, asg: str, message: str) -> None:
    """One Failed launch activity, now: the group tried and EC2 said ``message``."""
    now = utcnow()
    _log(account, region, asg).insert(0, {
        "ActivityId": str(uuid.uuid4()), "AutoScalingGroupName": asg,
        "Description": f"Launching a new EC2 instance.  Status Reason: {message}",
        "Cause": f"At {now.isoformat()}Z an instance was started in response to a difference between desired "
                 "and actual capacity, increasing the capacity from 0 to 1.",
        "StartTime": now, "EndTime": now, "StatusCode": "Failed", "StatusMessage": message, "Progress": 100,
        "Details": "{}"})


def activities(account: str, region: str, asg: str) -> list[dict[str, Any]]:
    """What the group recorded, as recorded (the test's own look)."""
    return list(_log(account, region, asg))


def describe_scaling_activities(self: AutoScalingResponse) -> TYPE_RESPONSE | ActionResult:
    name = self._get_param("AutoScalingGroupName")
    size = int(self._get_param("MaxRecords") or 100)
    if not 1 <= size <= 100:
        raise ValidationError(f"1 validation error detected: Value '{size}' at 'maxRecords' failed to satisfy "
                              "constraint: Member must have value less than or equal to 100")
    logs: dict[str, list[dict[str, Any]]] = self.autoscaling_backend.__dict__.get("rtui_activities", {})
    found = list(logs.get(name, [])) if name else [a for acts in logs.values() for a in acts]
    oldest = utcnow() - RETENTION
    found = [a for a in found if a["StartTime"] >= oldest]
    found.sort(key=lambda a: (a["StatusCode"] not in ("Successful", "Failed", "Cancelled"), a["StartTime"]),
               reverse=True)
    token = self._get_param("NextToken")
    start = int(base64.b64decode(token).decode()) if token else 0
    page: dict[str, Any] = {"Activities": found[start:start + size]}
    if start + size < len(found):
        page["NextToken"] = base64.b64encode(str(start + size).encode()).decode()
    return ActionResult(page)


def started_at(age_s: float) -> datetime:
    """The wall-clock time ``age_s`` seconds ago, in moto's clock (naive UTC)."""
    return utcnow() - timedelta(seconds=age_s)
