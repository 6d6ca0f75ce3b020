"""How ``AwsApi.call`` retries one call: which AWS answers are worth another try, and what it does
with them (backoff, budgets, what the step is told). botocore's Stubber answers, as AWS would, with
the error codes and statuses of the AWS docs ("Common Errors", EC2 and EKS API references): a
throttled caller gets 400 Throttling/RequestLimitExceeded (EC2 sends RequestLimitExceeded with 503),
a server fault 500/503. The clock is a test clock: no test here waits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    ParamValidationError,
    ReadTimeoutError,
)
from botocore.stub import Stubber

from backend.errors import OperationError
from backend.retry import Retry, set_step_retry_sink
from targets.aws.infra.api import CALL_ATTEMPTS, IAM_SETTLE_S, AwsApi, retry_cause, transient
from tests.clock import TestClock

ROLE_ARN = "arn:aws:iam::123456789012:role/rtui/rtui-rtui-ray-cluster"
CLUSTER: dict[str, Any] = {"name": "rtui-ray", "roleArn": ROLE_ARN, "resourcesVpcConfig": {"subnetIds": []}}


def client_error(code: str, status: int, message: str = "") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "DescribeVpcs")


@pytest.mark.parametrize(("error", "cause"), [
    (client_error("Throttling", 400), "Throttling"),
    (client_error("RequestLimitExceeded", 503), "RequestLimitExceeded"),
    (client_error("ThrottlingException", 400), "ThrottlingException"),
    (client_error("InternalError", 500), "InternalError"),
    (client_error("ServiceUnavailable", 503), "ServiceUnavailable"),
    (client_error("BadGateway", 502), "BadGateway"),  # any 5xx
    (EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com"), "EndpointConnectionError"),
    (ReadTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com"), "ReadTimeoutError"),
    (client_error("AccessDenied", 403), None),
    (client_error("UnauthorizedOperation", 403), None),
    (client_error("InvalidParameterValue", 400), None),
    (client_error("ResourceInUseException", 409), None),
    (ParamValidationError(report="bad"), None),
    (ValueError("not AWS"), None),
])
def test_which_answers_are_worth_another_try(error: Exception, cause: str | None) -> None:
    assert retry_cause(error) == cause
    assert transient(error) is (cause is not None)


@pytest.fixture
def clock() -> TestClock:
    return TestClock()


@pytest.fixture
def api(clock: TestClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsApi]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")  # the Stubber answers before a request is signed,
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")  # but a client looks for credentials when made
    made = AwsApi("us-east-1", clock=clock)
    yield made
    made.close()


def stub(api: AwsApi, service: str) -> Stubber:
    stubber = Stubber(api.client(service))
    stubber.activate()
    return stubber


async def in_a_step(seen: list[Retry], call: Any) -> Any:
    """Run ``call`` as the runner runs a step: its retries go to ``seen``."""
    import asyncio

    async def step() -> Any:
        set_step_retry_sink(seen.append)
        return await call

    return await asyncio.create_task(step())


async def test_throttling_and_5xx_are_retried_with_full_jitter_and_each_retry_is_told(
        api: AwsApi, clock: TestClock) -> None:
    ec2 = stub(api, "ec2")
    ec2.add_client_error("describe_vpcs", "RequestLimitExceeded", "Request limit exceeded.", 503)
    ec2.add_client_error("describe_vpcs", "InternalError", "An internal error has occurred", 500)
    ec2.add_client_error("describe_vpcs", "Unavailable", "Service unavailable", 503)
    ec2.add_response("describe_vpcs", {"Vpcs": [{"VpcId": "vpc-1"}]})
    seen: list[Retry] = []
    answer = await in_a_step(seen, api.call("ec2", "describe_vpcs"))
    assert answer["Vpcs"][0]["VpcId"] == "vpc-1"
    ec2.assert_no_pending_responses()
    assert [r.cause for r in seen] == ["RequestLimitExceeded", "InternalError", "Unavailable"]
    assert seen[0].message.startswith("ec2:DescribeVpcs answered RequestLimitExceeded: trying again in ")
    assert [r.attempt for r in seen] == [2, 3, 4] and api.counts["ec2:DescribeVpcs"] == 4
    assert [r.delay_s for r in seen] == clock.slept
    assert all(0 <= d <= cap for d, cap in zip(clock.slept, (0.5, 1.0, 2.0), strict=True))


async def test_a_call_throttled_every_time_gives_up_after_its_tries_in_one_line(
        api: AwsApi, clock: TestClock) -> None:
    ec2 = stub(api, "ec2")
    for _ in range(CALL_ATTEMPTS):
        ec2.add_client_error("describe_vpcs", "RequestLimitExceeded", "Request limit exceeded.", 503)
    with pytest.raises(OperationError, match="throttled") as info:
        await api.call("ec2", "describe_vpcs")
    ec2.assert_no_pending_responses()
    assert len(clock.slept) == CALL_ATTEMPTS - 1 and max(clock.slept) <= 20.0
    assert "\n" not in info.value.message and info.value.remedy


async def test_what_no_retry_can_fix_fails_at_once_and_ok_codes_answer_none(api: AwsApi, clock: TestClock) -> None:
    ec2 = stub(api, "ec2")
    ec2.add_client_error("describe_vpcs", "UnauthorizedOperation",
                         "You are not authorized to perform this operation. User: arn:aws:iam::1:user/u is not "
                         "authorized to perform: ec2:DescribeVpcs on resource: *", 403)
    with pytest.raises(OperationError, match="ec2:DescribeVpcs"):
        await api.call("ec2", "describe_vpcs")
    ec2.add_client_error("delete_vpc", "InvalidVpcID.NotFound", "The vpc ID 'vpc-1' does not exist", 400)
    assert await api.call("ec2", "delete_vpc", ok=("InvalidVpcID.NotFound",), VpcId="vpc-1") is None
    assert clock.slept == []


async def test_a_new_role_iam_has_not_settled_is_waited_for_without_using_up_the_tries(
        api: AwsApi, clock: TestClock) -> None:
    eks = stub(api, "eks")
    # EKS's answer while IAM settles a new role (terraform-provider-aws retries CreateCluster on it).
    for _ in range(CALL_ATTEMPTS + 2):
        eks.add_client_error("create_cluster", "InvalidParameterException",
                             f"Role with arn: {ROLE_ARN}, does not exist", 400)
    eks.add_response("create_cluster", {"cluster": {"name": "rtui-ray", "status": "CREATING"}})
    seen: list[Retry] = []
    made = await in_a_step(seen, api.call("eks", "create_cluster", new_role=True, **CLUSTER))
    assert made["cluster"]["status"] == "CREATING"
    assert {r.cause for r in seen} == {"IAM propagation"} and len(seen) == CALL_ATTEMPTS + 2
    assert all("IAM has not settled the new role yet" in r.message for r in seen)
    assert clock.slept[:3] == pytest.approx([0.4, 0.64, 1.024]) and max(clock.slept) == 10.0


async def test_iam_settling_ends_at_its_deadline_and_only_for_a_new_role(api: AwsApi, clock: TestClock) -> None:
    eks = stub(api, "eks")
    for _ in range(40):
        eks.add_client_error("create_cluster", "InvalidParameterException",
                             f"Role with arn: {ROLE_ARN}, does not exist", 400)
    with pytest.raises(OperationError, match="does not exist"):
        await api.call("eks", "create_cluster", new_role=True, **CLUSTER)
    assert IAM_SETTLE_S < sum(clock.slept) <= IAM_SETTLE_S + 10.0  # the try after the deadline is the last
    tries = api.counts["eks:CreateCluster"]
    with pytest.raises(OperationError, match="does not exist"):
        await api.call("eks", "create_cluster", **CLUSTER)  # an old role: a real refusal
    assert api.counts["eks:CreateCluster"] == tries + 1
