"""Asking AWS for the vCPU quota a plan is short of: only ever on an explicit user action."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from backend.errors import OperationError
from targets.aws.calls import CallPool
from targets.aws.cloud.preflight import run_preflight
from targets.aws.cloud.quota import QuotaIncreaseRequest, request_quota_increase
from targets.aws.cloud.report import PreflightRequest, QuotaStatus
from targets.aws.session import AwsSession

# One request is one small call; the standard retries run inside this limit.
REQUEST_TIMEOUT_S = 20.0


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


async def request_missing_quota(
    request: PreflightRequest,
    *,
    session: AwsSession | None = None,
    on_request: Callable[[str, str], None] | None = None,
) -> list[QuotaIncreaseRequest]:
    """Run the preflight, then file one increase request per short quota (to what running + plan need).

    ``on_request(region, quota_code)`` is called before each request goes out (progress)."""
    aws = session or AwsSession(request.profile)
    try:
        report = await run_preflight(request, session=aws)
        # The session's daemon workers, not asyncio.to_thread: its executor is joined when
        # asyncio.run ends, so a request that never gets an answer would hold the CLI open.
        pool = CallPool(aws.workers, 1)
        filed: list[QuotaIncreaseRequest] = []
        for region, quota in short_quotas(report.regions):
            assert quota.code is not None and quota.request_value is not None
            if on_request is not None:
                on_request(region, quota.code)
            call = pool.run(request_quota_increase, region, quota.code, float(quota.request_value),
                            profile=request.profile, session=aws)
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):  # not wait_for: see preflight.run_preflight
                    filed.append(await call)
            except TimeoutError:
                raise OperationError(
                    f"no answer from AWS at {aws.endpoint('service-quotas', region)} within "
                    f"{REQUEST_TIMEOUT_S:g} s while requesting quota {quota.code} in {region}",
                    remedy="the request may have been filed: see the Service Quotas console "
                    "(request history) before asking again",
                ) from None
        return filed
    finally:
        if session is None:
            aws.close()
