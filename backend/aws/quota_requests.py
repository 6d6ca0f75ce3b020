"""Asking AWS for the vCPU quota a plan is short of: only ever on an explicit user action."""

from __future__ import annotations

import asyncio

from backend.aws.preflight import run_preflight
from backend.aws.quota import QuotaIncreaseRequest, request_quota_increase
from backend.aws.report import PreflightRequest, QuotaStatus


def short_quotas(report_regions: list, *, include_system: bool = True) -> list[tuple[str, QuotaStatus]]:  # type: ignore[type-arg]
    """(region, quota) for every enabled, reachable region whose readable quota is short."""
    out: list[tuple[str, QuotaStatus]] = []
    for region in report_regions:
        if not region.enabled or not region.reachable:
            continue
        for quota in (region.quota, region.system_quota if include_system else None):
            if quota is not None and quota.ok is False and quota.code and quota.request_value:
                out.append((region.region, quota))
    return out


async def request_missing_quota(request: PreflightRequest) -> list[QuotaIncreaseRequest]:
    """Run the preflight, then file one increase request per short quota (to what running + plan need)."""
    report = await run_preflight(request)
    filed: list[QuotaIncreaseRequest] = []
    for region, quota in short_quotas(report.regions):
        assert quota.code is not None and quota.request_value is not None
        filed.append(await asyncio.to_thread(
            request_quota_increase, region, quota.code, float(quota.request_value), profile=request.profile))
    return filed
