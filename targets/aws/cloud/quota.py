"""vCPU quota headroom, and the quota-increase request (only ever on an explicit user action).

The blocking functions here take a boto3 client and run in a worker thread; ``headroom``
is pure so the verdict logic can be tested without AWS.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel

from targets.aws.cloud.catalog import QUOTA_NAMES, QUOTA_SERVICE_CODE, quota_code_for
from targets.aws.cloud.report import QuotaStatus
from targets.aws.session import AwsSession, describe_aws_error, error_code

# Instances in these states hold vCPUs of the running-instances quota.
COUNTED_STATES = ("pending", "running", "stopping", "shutting-down")


def read_quota_limit(service_quotas: Any, code: str) -> tuple[float, str]:
    """The account's applied limit, else the AWS default. Raises the ClientError of the last try."""
    try:
        quota = service_quotas.get_service_quota(ServiceCode=QUOTA_SERVICE_CODE, QuotaCode=code)
        return float(quota["Quota"]["Value"]), "applied"
    except ClientError as exc:
        # Accounts that never changed a quota may have no applied value: the default applies.
        if error_code(exc) != "NoSuchResourceException":
            raise
    quota = service_quotas.get_aws_default_service_quota(ServiceCode=QUOTA_SERVICE_CODE, QuotaCode=code)
    return float(quota["Quota"]["Value"]), "default"


def running_instances(ec2: Any) -> list[dict[str, Any]]:
    """Instances that count against running-instance quotas, with their type and vCPUs if known."""
    found: list[dict[str, Any]] = []
    paginator = ec2.get_paginator("describe_instances")
    filters = [{"Name": "instance-state-name", "Values": list(COUNTED_STATES)}]
    for page in paginator.paginate(Filters=filters):
        for reservation in page.get("Reservations", []):
            for inst in reservation.get("Instances", []):
                cpu = inst.get("CpuOptions") or {}
                vcpus = None
                if cpu.get("CoreCount") and cpu.get("ThreadsPerCore"):
                    vcpus = int(cpu["CoreCount"]) * int(cpu["ThreadsPerCore"])
                found.append({"InstanceType": inst["InstanceType"], "vcpus": vcpus,
                              "spot": inst.get("InstanceLifecycle") == "spot"})
    return found


def vcpus_in_use(instances: Iterable[dict[str, Any]], vcpus_by_type: dict[str, int]) -> dict[str, int]:
    """vCPUs per quota code. ``vcpus_by_type`` fills in instances that carry no CpuOptions. A Spot
    instance (``InstanceLifecycle`` "spot"; On-Demand ones carry none) counts against its class's Spot
    quota, never the On-Demand one (EC2 User Guide, "Spot Instance quotas")."""
    used: dict[str, int] = {}
    for inst in instances:
        code = quota_code_for(inst["InstanceType"], spot=bool(inst.get("spot")))
        if code is None:
            continue
        vcpus = inst["vcpus"] if inst["vcpus"] is not None else vcpus_by_type.get(inst["InstanceType"], 0)
        used[code] = used.get(code, 0) + vcpus
    return used


def headroom(
    code: str | None,
    *,
    needed: int,
    limit: float | None,
    used: int | None,
    source: str = "applied",
    error: str | None = None,
) -> QuotaStatus:
    name = QUOTA_NAMES.get(code or "", "")
    if code is None or limit is None or used is None:
        return QuotaStatus(
            code=code,
            name=name,
            needed=needed,
            limit=limit,
            used=used,
            source="unavailable",
            error=error or ("no vCPU quota is known for this instance family" if code is None else None),
        )
    room = limit - used
    ok = room >= needed
    shortfall = 0 if ok else int(needed - room + 0.999)
    return QuotaStatus(
        code=code,
        name=name,
        limit=limit,
        used=used,
        needed=needed,
        headroom=room,
        ok=ok,
        source="applied" if source == "applied" else "default",
        shortfall=shortfall,
        request_value=None if ok else used + needed,
        error=error,
    )


def increase_command(region: str, quota: QuotaStatus) -> str:
    """The AWS CLI line that asks for what the plan needs (shown, never run by itself)."""
    return (
        f"aws service-quotas request-service-quota-increase --region {region} "
        f"--service-code {QUOTA_SERVICE_CODE} --quota-code {quota.code} --desired-value {quota.request_value}"
    )


class QuotaIncreaseRequest(BaseModel):
    id: str
    status: str
    region: str
    quota_code: str
    desired_value: float
    case_id: str | None = None


def request_quota_increase(
    region: str,
    quota_code: str,
    desired_value: float,
    *,
    profile: str | None = None,
    session: AwsSession | None = None,
) -> QuotaIncreaseRequest:
    """Ask AWS to raise a quota. Creates a support request: call only on an explicit user action.

    Blocking; from async code run it in a thread. Raises ``RtuiError`` with a one-line cause.
    """
    aws = session or AwsSession(profile)
    client = aws.client("service-quotas", region)
    try:
        response = client.request_service_quota_increase(
            ServiceCode=QUOTA_SERVICE_CODE, QuotaCode=quota_code, DesiredValue=float(desired_value)
        )
    except Exception as exc:
        raise describe_aws_error(
            exc, action=f"requesting quota {quota_code} in {region}", profile=profile
        ) from exc
    change = response["RequestedQuota"]
    return QuotaIncreaseRequest(
        id=str(change.get("Id", "")),
        status=str(change.get("Status", "PENDING")),
        region=region,
        quota_code=quota_code,
        desired_value=float(change.get("DesiredValue", desired_value)),
        case_id=change.get("CaseId"),
    )
