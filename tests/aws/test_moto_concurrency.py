"""The AWS double answers requests made at the same moment as AWS does: each on its own, whole.

Real IAM is one service behind an API: a ``GetRole`` sent while another caller creates a role answers
(the role or NoSuchEntity), never an internal error. moto's in-memory backends iterate plain dicts
(``IAMBackend.get_role`` walks ``self.roles``), and its threaded server runs each request on its own
thread, so a role created mid-walk fails the reader with "dictionary changed size during iteration" —
a CI run of ``test_the_sweep_reports_what_is_left_in_the_vpc_tagged_or_not`` failed its ``up`` on
exactly that. The double serialises what reaches moto's backends; the latency it models stays
concurrent.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.aws.conftest import World

TRUST = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]})


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """moto's server runs in this process: switching threads every microsecond makes, in every run,
    the overlap that a loaded machine makes by chance."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_roles_read_while_others_are_created_answer_as_iam_does(world: World, busy_switching: None) -> None:
    # No retries: an InternalError must reach the test, as it reached the product's up in CI.
    iam = boto3.client("iam", region_name="us-east-1", config=Config(retries={"max_attempts": 1}))
    writers, readers, per_writer = 4, 4, 60

    def create(w: int) -> None:
        for i in range(per_writer):
            iam.create_role(RoleName=f"w{w}-{i}", AssumeRolePolicyDocument=TRUST)

    def read(_: int) -> list[str]:
        faults = []
        for _ in range(per_writer):
            try:
                iam.get_role(RoleName="nobody")  # walks every role moto holds
            except ClientError as err:
                if err.response["Error"]["Code"] != "NoSuchEntity":
                    faults.append(err.response["Error"]["Code"])
        return faults

    with ThreadPoolExecutor(writers + readers) as pool:
        made = [pool.submit(create, w) for w in range(writers)]
        asked = [pool.submit(read, r) for r in range(readers)]
        for future in made:
            future.result()
        faults = [code for future in asked for code in future.result()]
    assert faults == []
    assert len(iam.list_roles(MaxItems=1000)["Roles"]) == writers * per_writer
