"""The aws target's preflight() and the real `rtui check` binary, against moto over real HTTP."""

from __future__ import annotations

import json
import os

import pytest

from backend.resolve import resolve_config
from backend.resources import CheckStatus
from backend.session import RunSession
from tests.aws.conftest import World, image_env
from tests.conftest import run_rtui


@pytest.mark.slow
async def test_aws_target_preflight_returns_the_matrix_as_checks(world: World) -> None:
    session = RunSession.for_config(resolve_config({"target": "aws", "region": "us-east-1"}, environ=image_env()))
    results = await session.preflight()
    recommendation = [r for r in results if r.id == "aws.recommendation"]
    assert len(recommendation) == 1 and recommendation[0].status is CheckStatus.OK
    assert recommendation[0].data["region"] == "us-east-1"
    # (EKS speaks REST: its calls are recorded by method; a GET reads.)
    assert world.actions() and all(a.startswith(("Describe", "Get", "List")) for a in world.actions() if a)


@pytest.mark.slow
def test_rtui_check_binary_feasible_and_infeasible(world: World) -> None:
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    ok = run_rtui("check", "--target", "aws", "--region", "us-east-1", "--json", env=env)
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["recommendation"]["region"] == "us-east-1"
    assert {z["zone"] for z in report["regions"][0]["zones"] if z["feasible"]}
    world.quota("us-east-1", "L-DB2E81BA", 48)  # half of what 2× g6.12xlarge need
    short = run_rtui("check", "--target", "aws", "--region", "us-east-1", "--json", env=env)
    assert short.returncode == 3, short.stderr
    assert json.loads(short.stdout)["recommendation"] is None


@pytest.mark.slow
def test_quota_increase_only_on_explicit_request(world: World) -> None:
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    args = ["check", "--target", "aws", "--region", "us-east-1"]
    plenty = run_rtui(*args, "--request-quota-increase", "--yes", env=env)
    assert plenty.returncode == 0 and "nothing was requested" in plenty.stdout
    world.quota("us-east-1", "L-DB2E81BA", 48)
    run_rtui(*args, "--json", env=env)  # a plain check never asks
    assert "RequestServiceQuotaIncrease" not in world.actions()
    refused = run_rtui(*args, "--request-quota-increase", env=env)
    assert refused.returncode == 2 and "needs --yes" in refused.stderr
    assert "RequestServiceQuotaIncrease" not in world.actions()
    filed = run_rtui(*args, "--request-quota-increase", "--yes", "--json", env=env)
    assert filed.returncode == 0, filed.stderr
    requests = json.loads(filed.stdout)["requests"]
    assert [(r["region"], r["quota_code"], r["desired_value"]) for r in requests] == [("us-east-1", "L-DB2E81BA", 96.0)]
    assert "RequestServiceQuotaIncrease" in world.actions()
