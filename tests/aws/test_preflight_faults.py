"""Throttling, a hung region, bad credentials and bad input, over real HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from backend.errors import OperationError, UserError
from targets.aws.cloud import PreflightReport, PreflightRequest, run_preflight
from tests.aws.conftest import World

REGIONS = ["us-east-1", "eu-west-2", "us-west-1"]


def matrix(report: PreflightReport) -> list[dict[str, Any]]:
    return [r.model_dump(exclude={"elapsed_s"}) for r in report.regions]


async def test_throttling_on_30_percent_of_calls_is_retried_to_the_same_matrix(
    world: World, fast_backoff: None
) -> None:
    baseline = await run_preflight(PreflightRequest(regions=REGIONS))
    world.script.calls.clear()
    world.script.throttle_rate = 0.3
    throttled = await run_preflight(PreflightRequest(regions=REGIONS))
    calls = len(world.script.calls)
    assert world.script.throttled >= 0.15 * calls, (world.script.throttled, calls)
    assert matrix(throttled) == matrix(baseline)
    assert throttled.recommendation == baseline.recommendation


@pytest.mark.slow
async def test_throttling_that_outlasts_retries_marks_the_region_not_the_run(
    world: World, fast_backoff: None
) -> None:
    world.script.errors[("ec2", "DescribeAvailabilityZones")] = "RequestLimitExceeded"
    report = await run_preflight(PreflightRequest(regions=["us-east-1"]))
    (region,) = report.regions
    assert region.error is not None and "RequestLimitExceeded" in region.error
    assert not region.feasible and report.recommendation is None


@pytest.mark.slow
async def test_a_region_that_hangs_is_marked_unreachable_and_the_rest_arrive(world: World) -> None:
    world.script.hang_regions.add("eu-west-2")
    # The deadline leaves the healthy regions room on a loaded 2-core CI machine (1.5 s did not:
    # moto builds a region's backend on its first call); the hung one ends at it, as its reason says
    # (no elapsed-time figure asserted).
    report = await run_preflight(PreflightRequest(regions=REGIONS, region_timeout_s=5))
    by_name = {r.region: r for r in report.regions}
    hung = by_name["eu-west-2"]
    assert hung.enabled and not hung.reachable and not hung.feasible
    assert "did not answer within 5 s (unreachable)" in hung.reasons[0], hung.reasons
    assert by_name["us-east-1"].reachable and by_name["us-east-1"].feasible
    assert report.recommendation is not None and report.recommendation.region == "us-east-1"


async def test_expired_credentials_stop_the_check_with_a_login_hint(world: World) -> None:
    world.script.errors[("ec2", "*")] = "ExpiredToken"
    with pytest.raises(OperationError) as caught:
        await run_preflight(PreflightRequest(profile=None))
    assert "ExpiredToken" in str(caught.value) and "aws sso login" in str(caught.value)


async def test_missing_permission_on_optional_calls_degrades_to_warnings(world: World) -> None:
    world.script.errors[("ec2", "DescribeCapacityReservations")] = "UnauthorizedOperation"
    (region,) = (await run_preflight(PreflightRequest())).regions
    a = next(z for z in region.zones if z.zone == "us-east-1a")
    assert a.feasible and any("capacity reservations" in w for w in a.warnings)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("request_kwargs", "message"),
    [
        ({"regions": ["mars-north-1"]}, "unknown region mars-north-1"),
        ({"gpu_node_type": "g6.13xlarge"}, "does not exist"),
        ({"gpu_node_type": "g5.xlarge"}, "g5.xlarge does not support EFA"),
        ({"gpu_node_type": "m7i.xlarge"}, "m7i.xlarge has no GPUs"),
    ],
)
async def test_bad_input_is_a_user_error(world: World, request_kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError) as caught:
        await run_preflight(PreflightRequest(**request_kwargs))
    assert message in str(caught.value)


async def test_non_efa_type_is_allowed_when_efa_is_not_required(world: World) -> None:
    report = await run_preflight(PreflightRequest(gpu_node_type="g5.xlarge", require_efa=False))
    (region,) = report.regions
    feasible = [z for z in region.zones if z.feasible]
    assert feasible and all(z.verdict == "warning" and not z.efa for z in feasible)
    assert any("no EFA" in w for w in feasible[0].warnings)
