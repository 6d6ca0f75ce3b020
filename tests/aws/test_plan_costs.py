"""Issue 20 item 11: the plan's costs are the region's prices from the Pricing API (tests/aws/moto_pricing.py
serves GetProducts as AWS does), the built-in table only as a labelled estimate, and the plan bills the
EBS root volumes, the NAT gateway's Elastic IP, and shows NAT data processing per GB."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.aws.conftest import World
from tests.aws.provision_world import session_for
from tests.conftest import run_rtui

HOURS_PER_MONTH = 730
# The system disk: 100 GB, sized from the registry double (tests/aws/conftest.py: a 14 GB image).
GPU_DISK_GB, SYSTEM_DISK_GB = 200, 100

# eu-west-2 as a test scripts it: dearer than us-east-1 in every part a plan bills.
LONDON = {"eks": 0.10, "nat_hour": 0.05, "nat_gb": 0.05, "ebs_gp3": 0.0928, "ipv4": 0.005}
LONDON_GPU, LONDON_SYSTEM = 5.6976, 0.2352

# The control plane's audit and authenticator logs bill per GB in CloudWatch Logs (issue 23).
LOGS = "+ $0.50/GB (+ $0.03/GB-month) CloudWatch Logs: control-plane audit, authenticator logs"


def _quote_london(world: World) -> None:
    world.script.pricing_denied = False
    world.script.prices.update({("eu-west-2", "g6.12xlarge"): LONDON_GPU, ("eu-west-2", "m7i.xlarge"): LONDON_SYSTEM,
                                # us-east-1's, so a client that asks for the wrong region is seen
                                ("us-east-1", "g6.12xlarge"): 4.6016, ("us-east-1", "m7i.xlarge"): 0.2016})
    world.script.region_prices.update({"eu-west-2": LONDON,
                                       "us-east-1": {"eks": 0.10, "nat_hour": 0.045, "nat_gb": 0.045,
                                                     "ebs_gp3": 0.08, "ipv4": 0.005}})


def _plan_json(*args: str) -> dict[str, Any]:
    proc = run_rtui("plan", "--target", "aws", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    plan: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return plan


def _costs(plan: dict[str, Any]) -> dict[str, float]:
    return {c["address"]: c["cost_per_hour"] for c in plan["changes"] if c.get("cost_per_hour")}


def test_the_plan_prices_every_part_at_the_regions_pricing_api_quote(world: World, kube_file: Path) -> None:
    _quote_london(world)
    plan = _plan_json("--region", "eu-west-2")
    gb_hour = LONDON["ebs_gp3"] / HOURS_PER_MONTH
    assert _costs(plan) == {
        "aws.nat-gateway": pytest.approx(LONDON["nat_hour"] + LONDON["ipv4"]),  # the gateway and its Elastic IP
        "aws.eks-cluster": pytest.approx(LONDON["eks"]),
        "aws.nodegroup.system": pytest.approx(LONDON_SYSTEM + SYSTEM_DISK_GB * gb_hour, abs=1e-4),
        "aws.nodegroup.gpu": pytest.approx(2 * LONDON_GPU + 2 * GPU_DISK_GB * gb_hour, abs=1e-4),
    }
    assert plan["price_source"] == "AWS Pricing API, eu-west-2 on-demand"
    assert plan["usage_costs"] == ["+ $0.050/GB NAT data processing", LOGS]
    nat = next(c for c in plan["changes"] if c["address"] == "aws.nat-gateway")
    assert "Elastic IP $0.005/h" in nat["cost_note"] and "+ $0.050/GB" in nat["cost_note"]
    # Every question went to an endpoint the Pricing API has, never to the run's region.
    asked = {region for service, region, _ in world.script.calls if service == "pricing"}
    assert asked == {"us-east-1"}


@pytest.mark.slow
def test_without_the_pricing_api_the_plan_is_a_labelled_us_east_1_estimate(world: World, kube_file: Path) -> None:
    assert world.script.pricing_denied
    plan = _plan_json("--region", "us-east-1")
    disks = (2 * GPU_DISK_GB + SYSTEM_DISK_GB) * 0.08 / HOURS_PER_MONTH
    assert plan["cost_per_hour"] == pytest.approx(2 * 4.6016 + 0.2016 + 0.10 + 0.045 + 0.005 + disks, abs=1e-3)
    assert plan["price_source"] == "estimate, us-east-1 prices"
    assert plan["usage_costs"] == ["+ $0.045/GB NAT data processing", LOGS]

    text = run_rtui("plan", "--target", "aws", "--region", "us-east-1")
    assert text.returncode == 0, text.stderr
    cost_line = next(line for line in text.stdout.splitlines() if line.startswith("Plan:"))
    assert cost_line.endswith(f"Cost: ${plan['cost_per_hour']:.2f}/hour, + $0.045/GB NAT data processing, "
                              f"{LOGS} (estimate, us-east-1 prices).")
    assert "200 GB gp3" in text.stdout and "Elastic IP $0.005/h" in text.stdout


async def test_a_second_plan_in_the_session_asks_the_pricing_api_nothing(world: World, kube_file: Path) -> None:
    _quote_london(world)
    session = session_for(region="eu-west-2")
    first = await session.plan()
    asked = sum(1 for service, _, _ in world.script.calls if service == "pricing")
    assert asked >= 6  # two instance types, EKS, NAT hours, NAT bytes, gp3, public IPv4
    again = await session.plan()
    assert sum(1 for service, _, _ in world.script.calls if service == "pricing") == asked
    assert again.cost_per_hour == pytest.approx(first.cost_per_hour)
    assert again.price_source == "AWS Pricing API, eu-west-2 on-demand"


# What the whole default plan costs in eu-west-2 at the quotes above, and at the built-in table.
LONDON_TOTAL = (2 * LONDON_GPU + LONDON_SYSTEM + LONDON["eks"] + LONDON["nat_hour"] + LONDON["ipv4"]
                + (2 * GPU_DISK_GB + SYSTEM_DISK_GB) * LONDON["ebs_gp3"] / HOURS_PER_MONTH)
TABLE_TOTAL = 2 * 4.6016 + 0.2016 + 0.10 + 0.045 + 0.005 + (2 * GPU_DISK_GB + SYSTEM_DISK_GB) * 0.08 / HOURS_PER_MONTH


def _check(region: str) -> tuple[str, dict[str, Any]]:
    text = run_rtui("check", "--target", "aws", "--region", region)
    assert text.returncode == 0, text.stderr
    doc = run_rtui("check", "--target", "aws", "--region", region, "--json")
    assert doc.returncode == 0, doc.stderr
    return text.stdout, json.loads(doc.stdout)


@pytest.mark.slow
def test_check_recommendation_and_plan_quote_the_pricing_apis_figure(world: World, kube_file: Path) -> None:
    _quote_london(world)
    assert f"{LONDON_TOTAL:.2f}" != f"{TABLE_TOTAL:.2f}"  # the table would show another figure
    text, doc = _check("eu-west-2")
    figure = f"${LONDON_TOTAL:.2f}/h (AWS Pricing API, eu-west-2 on-demand)"
    assert f"eu-west-2: feasible, {figure}" in text
    recommendation = next(line for line in text.splitlines() if line.startswith("Recommendation:"))
    assert f"in eu-west-2, {figure}" in recommendation
    (region,) = doc["regions"]
    assert region["price_per_hour"] == pytest.approx(LONDON_TOTAL, abs=1e-4)
    assert region["price_source"] == doc["recommendation"]["price_source"] == "AWS Pricing API, eu-west-2 on-demand"
    plan = _plan_json("--region", "eu-west-2")
    assert plan["cost_per_hour"] == pytest.approx(region["price_per_hour"], abs=1e-3)


@pytest.mark.slow
def test_where_the_pricing_api_cannot_answer_every_figure_is_a_labelled_estimate(world: World,
                                                                                 kube_file: Path) -> None:
    assert world.script.pricing_denied
    text, doc = _check("eu-west-2")
    figure = f"${TABLE_TOTAL:.2f}/h (estimate, us-east-1 prices)"
    assert f"eu-west-2: feasible, {figure}" in text
    recommendation = next(line for line in text.splitlines() if line.startswith("Recommendation:"))
    assert f"in eu-west-2, {figure}" in recommendation
    assert doc["regions"][0]["price_per_hour"] == pytest.approx(TABLE_TOTAL, abs=1e-4)
    plan = _plan_json("--region", "eu-west-2")
    assert plan["cost_per_hour"] == pytest.approx(TABLE_TOTAL, abs=1e-3)
    assert plan["price_source"] == "estimate, us-east-1 prices"
