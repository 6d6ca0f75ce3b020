"""Issue 23 item 3: the EKS API is not open to the world by default. `--api-cidrs` defaults to the
caller's public address as AWS sees it (the checkip double: tests/aws/checkip.py), CIDRs are real
ones, and 0.0.0.0/0 is allowed but flagged in the plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.errors import ApiUnreachable
from tests.aws.checkip import CHECKIP
from tests.aws.conftest import World
from tests.aws.provision_world import down, eks, session_for, up
from tests.conftest import run_rtui

pytestmark = pytest.mark.usefixtures("fast_backoff")
AWS = ["--target", "aws", "--region", "us-east-1"]


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize(("cidrs", "needle"), [
    ("999.1.1.1/99", "999.1.1.1/99 is not an IPv4 CIDR"),
    ("203.0.113.7/24", "did you mean 203.0.113.0/24"),
    ("10.0.0.0/8", "private or reserved"),
])
def test_a_bad_cidr_is_one_line_and_exit_2(world: World, cidrs: str, needle: str) -> None:
    proc = run_rtui("plan", *AWS, "--api-cidrs", cidrs)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in _one_line(proc.stderr)


@pytest.mark.slow
def test_the_default_is_the_callers_public_address_and_world_open_is_flagged(world: World) -> None:
    proc = run_rtui("plan", *AWS, "--json")
    assert proc.returncode == 0, proc.stderr
    cluster = next(c for c in json.loads(proc.stdout)["changes"] if c["address"] == "aws.eks-cluster")
    assert cluster["after"]["public_cidrs"] == ["52.94.76.10/32"] and CHECKIP.asked >= 1
    assert "0.0.0.0/0" not in proc.stdout
    opened = run_rtui("plan", *AWS, "--api-cidrs", "0.0.0.0/0")
    assert opened.returncode == 0, opened.stderr
    assert "OPEN TO THE WHOLE INTERNET" in opened.stdout


def test_no_public_address_to_be_learned_is_one_line(world: World) -> None:
    CHECKIP.answer = None
    proc = run_rtui("plan", *AWS)
    assert proc.returncode == 1
    line = _one_line(proc.stderr)
    assert "could not learn your public address" in line and "--api-cidrs" in line


@pytest.mark.slow
async def test_up_limits_the_endpoint_to_the_callers_address(world: World, kube_file: Path) -> None:
    session = session_for(kube_timeout_s="5")
    made = await up(session, until="aws.eks-cluster")
    assert made.ok, made.failures()
    vpc = eks().describe_cluster(name="rtui-ray")["cluster"]["resourcesVpcConfig"]
    assert vpc["publicAccessCidrs"] == ["52.94.76.10/32"]
    CHECKIP.answer = "52.94.76.99"  # the caller moved: the run keeps the address it learned
    # ... so the endpoint no longer answers (EKS drops what its CIDRs exclude): the plan says why, in one
    # line, with the way back in, instead of a bare timeout naming the context.
    with pytest.raises(ApiUnreachable) as silent:
        await session.plan()
    assert "admits only 52.94.76.10/32 and your address is now 52.94.76.99" in silent.value.message
    assert "--api-cidrs 52.94.76.99/32" in str(silent.value.remedy)
    assert (await down(session)).ok  # and `down` still takes everything (tests/aws/test_moved_caller.py)
