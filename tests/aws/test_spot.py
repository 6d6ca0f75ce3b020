"""Issue 41, first part: `--spot` puts the GPU nodes on Spot capacity, priced at the GPU AZ's Spot price
in effect now (EC2's price history, served as AWS does by tests/aws/moto_spot.py), with the On-Demand price
beside it, and checked against the Spot vCPU quota."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from backend.session import cost_meter
from targets.aws.cloud.catalog import QUOTA_G_VT, SPOT_QUOTA_G_VT, quota_code_for
from targets.aws.cloud.pricing import SPOT_PRODUCT, spot_prices
from targets.aws.cloud.quota import vcpus_in_use
from targets.aws.facts import AwsFacts
from tests.aws.conftest import World
from tests.aws.moto_spot import PRODUCTS
from tests.aws.provision_world import down, eks, session_for, tagged, up
from tests.aws.test_plan_costs import GPU_DISK_GB, HOURS_PER_MONTH
from tests.conftest import run_rtui

GPU = "g6.12xlarge"
# What a test scripts for us-east-1 now: each AZ its own price, all well below On-Demand's $4.6016.
NOW = {"us-east-1a": 1.7311, "us-east-1b": 1.2544, "us-east-1c": 1.9802, "us-east-1d": 1.5003}


def _plan(*args: str) -> dict[str, Any]:
    proc = run_rtui("plan", "--target", "aws", "--region", "us-east-1", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    plan: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return plan


def _change(plan: dict[str, Any], address: str) -> dict[str, Any]:
    return next(c for c in plan["changes"] if c["address"] == address)


def test_the_price_in_effect_now_is_read_per_az_for_linux_only(world: World) -> None:
    """The double answers history, older lines first, other platforms beside: only the newest Linux/UNIX
    line of each AZ is the price."""
    world.script.spot_prices[("us-east-1", GPU)] = NOW
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=world.endpoint)
    everything = ec2.describe_spot_price_history(InstanceTypes=[GPU])["SpotPriceHistory"]
    assert {line["ProductDescription"] for line in everything} == set(PRODUCTS)
    assert len({line["Timestamp"] for line in everything}) > 1  # history, not one price
    first: dict[str, float] = {}
    for line in everything:
        if line["ProductDescription"] == SPOT_PRODUCT:
            first.setdefault(line["AvailabilityZone"], float(line["SpotPrice"]))
    assert first and first != {z: p for z, p in NOW.items() if z in first}  # the first line per AZ is stale

    offered = spot_prices(ec2, GPU)
    assert offered and offered == {z: NOW[z] for z in offered}


def test_a_spot_plan_prices_the_gpu_nodes_at_the_gpu_azs_spot_price(world: World, kube_file: Path) -> None:
    world.script.spot_prices[("us-east-1", GPU)] = NOW
    on_demand = _plan()
    spot = _plan("--spot")
    nodes = _change(spot, "aws.nodegroup.gpu")
    az = nodes["after"]["azs"][0]
    disks = 2 * GPU_DISK_GB * 0.08 / HOURS_PER_MONTH
    assert nodes["after"]["capacity_type"] == "SPOT"
    assert nodes["cost_per_hour"] == pytest.approx(2 * NOW[az] + disks, abs=1e-3)
    assert f"Spot in {az} ${NOW[az]:.4f}/h (On-Demand $4.6016/h)" in nodes["cost_note"]
    assert nodes["quota"].keys() == {SPOT_QUOTA_G_VT}
    od_nodes = _change(on_demand, "aws.nodegroup.gpu")
    assert od_nodes["after"]["capacity_type"] == "ON_DEMAND" and od_nodes["quota"].keys() == {QUOTA_G_VT}
    assert spot["cost_per_hour"] < on_demand["cost_per_hour"]
    # The trade-off is said: interruptions, and the placement group EFA wants making Spot scarcer.
    (said,) = [n for n in spot["notes"] if n.startswith("Spot GPU nodes")]
    assert "two minutes' notice" in said and "placement group" in said and "without --spot" in said
    assert "Capacity Rebalancing" in said and "drains" in said  # who handles the notice: EKS, not rtui
    assert not [n for n in on_demand["notes"] if "Spot" in n]
    # Without restarts the first interruption ends the job: said, and not once restarts are allowed.
    (restarts,) = [n for n in spot["notes"] if n.startswith("Spot with --max-failures 0")]
    assert "replacement node" in restarts and "newest complete checkpoint" in restarts
    assert not [n for n in _plan("--spot", "--max-failures", "3")["notes"] if "--max-failures" in n]
    # What an idle cluster still bills is said beside the full size at the Spot price, the plan's total.
    (idle,) = [n for n in spot["notes"] if n.startswith("idle after")]
    assert idle.endswith(f"instead of ${spot['cost_per_hour']:.2f}/h"), (idle, spot["cost_per_hour"])


def test_an_az_without_a_spot_price_is_priced_at_most_on_demand_and_says_so(world: World, kube_file: Path) -> None:
    world.script.spot_prices[("us-east-1", GPU)] = {}  # EC2 has no Spot price for it anywhere
    nodes = _change(_plan("--spot"), "aws.nodegroup.gpu")
    assert nodes["after"]["capacity_type"] == "SPOT"
    assert nodes["cost_note"].startswith(f"no Spot price known for {GPU} in ")
    assert nodes["cost_per_hour"] == pytest.approx(2 * 4.6016 + 2 * GPU_DISK_GB * 0.08 / HOURS_PER_MONTH, abs=1e-3)


def test_spot_instances_count_against_the_spot_quota_never_the_on_demand_one() -> None:
    assert quota_code_for(GPU, spot=True) == SPOT_QUOTA_G_VT and quota_code_for(GPU) == QUOTA_G_VT
    # Families whose Spot quota AWS splits or names apart (P5 and P4-P2; Trn) are not guessed.
    assert quota_code_for("p5.48xlarge", spot=True) is None and quota_code_for("trn1.32xlarge", spot=True) is None
    running = [{"InstanceType": GPU, "vcpus": 48, "spot": True}, {"InstanceType": GPU, "vcpus": 48, "spot": False},
               {"InstanceType": "g6.xlarge", "vcpus": 4, "spot": True}]
    assert vcpus_in_use(running, {}) == {SPOT_QUOTA_G_VT: 52, QUOTA_G_VT: 48}


async def test_up_with_spot_makes_a_spot_gpu_nodegroup_and_down_leaves_nothing(world: World, kube_file: Path) -> None:
    world.script.spot_prices[("us-east-1", GPU)] = NOW
    session = session_for(spot=True)
    done = await up(session)
    assert done.ok, done.failures()
    group = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    assert group["capacityType"] == "SPOT"
    system = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-system")["nodegroup"]
    assert system.get("capacityType", "ON_DEMAND") == "ON_DEMAND"  # the head's node is never taken back
    # The plan after `up` changes nothing: what EKS says of the group is what was asked.
    plan = await session.plan()
    assert [c.address for c in plan.changes if c.layer == "aws" and c.action != "noop"] == []
    gone = await down(session)
    assert gone.ok, gone.failures()
    assert tagged(session.run_id) == {}


def test_check_prices_each_az_at_its_spot_price_and_recommends_the_cheapest(world: World) -> None:
    world.script.spot_prices[("us-east-1", GPU)] = NOW
    proc = run_rtui("check", "--target", "aws", "--region", "us-east-1", "--spot", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    (region,) = report["regions"]
    zones = {z["zone"]: z for z in region["zones"] if z["feasible"]}
    assert {z: zones[z]["spot_price"] for z in zones} == {z: NOW.get(z) for z in zones}
    assert set(zones) - set(NOW), "an offered AZ without a Spot price, as EC2 may have"
    # Each AZ's total differs from the region's On-Demand one by the GPU nodes' price only; one without a
    # Spot price costs at most the On-Demand total.
    for name, zone in zones.items():
        gpu = 2 * NOW.get(name, 4.6016)
        assert zone["price_per_hour"] == pytest.approx(region["price_per_hour"] - 2 * 4.6016 + gpu, abs=1e-3)
    cheapest = min(NOW, key=lambda z: NOW[z])
    assert report["recommendation"]["zone"] == cheapest
    # One type: EC2 scores every AZ alike (low), so the lowest expected cost to finish is the cheapest Spot AZ's
    # (tests/aws/test_spot_placement.py for where they differ).
    assert report["recommendation"]["why"].startswith("lowest expected cost to finish"), report["recommendation"]
    text = run_rtui("check", "--target", "aws", "--region", "us-east-1", "--spot")
    row = next(line for line in text.stdout.splitlines() if line.strip().startswith(cheapest))
    assert f"{NOW[cheapest]:.4f}" in row
    # The plan puts the GPU nodes where the check recommends.
    assert _change(_plan("--spot"), "aws.nodegroup.gpu")["after"]["azs"] == [cheapest]


def test_a_spot_plan_is_held_to_the_spot_quota_an_on_demand_one_is_not(world: World, kube_file: Path) -> None:
    """The trap of two near-named GPU quotas: On-Demand G has room, Spot G (0 by default) has none."""
    world.script.spot_prices[("us-east-1", GPU)] = NOW
    world.quota("us-east-1", SPOT_QUOTA_G_VT, 0)
    assert run_rtui("plan", "--target", "aws", "--region", "us-east-1").returncode == 0
    refused = run_rtui("plan", "--target", "aws", "--region", "us-east-1", "--spot")
    assert refused.returncode == 2, refused.stdout
    assert SPOT_QUOTA_G_VT in refused.stderr and "Spot" in refused.stderr, refused.stderr


def _gpu_az(session: Any) -> str:
    return str(session.stack.layer("aws").topology.gpu_az)


@pytest.mark.slow
async def test_without_spot_capacity_the_fallback_puts_the_gpu_nodes_on_demand_there_for_good(
        world: World, kube_file: Path) -> None:
    world.script.spot_prices[("us-east-1", GPU)] = NOW
    planned = session_for(spot=True, gpu_node_count=1)
    await planned.plan()
    az = _gpu_az(planned)
    world.script.spot_ice_zones[GPU] = {az}  # no Spot capacity there; On-Demand capacity there is fine

    # Without the fallback `up` stops and says what would go on.
    stuck = session_for(spot=True, gpu_node_count=1)
    failed = await up(stuck)
    assert not failed.ok
    fault = next(e for e in failed.events if e.step == "aws.nodegroup.gpu" and e.kind.value == "failed")
    assert "InsufficientInstanceCapacity for Spot" in fault.message and az in fault.message
    assert "--spot-fallback on-demand" in (fault.remedy or "")
    assert stuck.target.fail_over_hint(stuck.config, stuck.record.facts) is not None
    assert "m moves them to On-Demand" in str(stuck.target.fail_over_hint(stuck.config, stuck.record.facts))
    assert (await down(stuck)).ok

    # With it, the same `up` goes on: the group is made again On-Demand in the same AZ, and stays so.
    session = session_for(spot=True, spot_fallback="on-demand", gpu_node_count=1)
    made = await up(session)
    assert made.ok, made.failures()
    (moved,) = [e.message for e in made.events if e.step == "run" and e.data.get("failover")]
    assert moved.startswith("InsufficientInstanceCapacity for Spot in " + az) and "On-Demand" in moved, moved
    group = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    assert group["capacityType"] == "ON_DEMAND" and group["status"] == "ACTIVE"
    fallback = AwsFacts.of(session.record.facts).spot_fallback
    assert fallback is not None and fallback.az == az and "InsufficientInstanceCapacity" in fallback.why
    again = await session.plan()
    assert [c.address for c in again.changes if c.layer == "aws" and c.action != "noop"] == []
    assert any(n.startswith(f"Spot GPU nodes went On-Demand in {az}") for n in again.notes), again.notes
    gpu = again.change("aws.nodegroup.gpu")
    assert gpu is not None and gpu.cost_per_hour is not None and gpu.cost_per_hour > 4.6  # On-Demand, its disk beside
    assert session.target.fail_over_hint(session.config, session.record.facts) != \
        stuck.target.fail_over_hint(stuck.config, stuck.record.facts)  # `m` would now move the AZ
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


async def test_the_meter_bills_spot_nodes_at_the_price_in_effect_each_moment_they_ran(
        world: World, kube_file: Path) -> None:
    world.script.spot_prices[("us-east-1", GPU)] = NOW
    session = session_for(spot=True)
    assert (await up(session)).ok
    az = AwsFacts.of(session.record.facts).gpu_az
    assert az is not None
    # The price moves while the nodes run: ten times what it was, from now on.
    moved = datetime.now(UTC).replace(microsecond=0)  # as EC2 times its lines: to the second
    world.script.spot_changes.append((moved, "us-east-1", GPU, az, NOW[az] * 10))
    later = moved.timestamp() + 3600  # the meter read an hour on
    gpu = "aws.nodegroup.gpu"
    costs, hours = await session.node_costs(later), await session.node_hours(later)

    # The test's own sum: each instance from its launch (the group's activities) to then, at the price
    # in effect each moment, with its root volume.
    group = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    launches = [a["StartTime"].timestamp() for a in boto3.client("autoscaling", region_name="us-east-1")
                .describe_scaling_activities(AutoScalingGroupName=group["resources"]["autoScalingGroups"][0]["name"])
                ["Activities"] if a["Description"].startswith("Launching")]
    assert len(launches) == 2
    since = session.record.resources[gpu].created_at
    disk = GPU_DISK_GB * 0.08 / HOURS_PER_MONTH
    # EC2 times the change to the second: an instance may have launched in that second, after the change.
    change = moved.timestamp()
    expected = sum(NOW[az] * max(0.0, change - max(t, since)) / 3600
                   + NOW[az] * 10 * (later - max(change, t, since)) / 3600
                   + disk * (later - max(t, since)) / 3600 for t in launches)
    assert costs[gpu] == pytest.approx(expected, rel=1e-3)
    meter = cost_meter(session.record, later, node_hours=hours, node_costs=costs)
    assert meter is not None
    item = meter.resources[gpu]
    assert item.accrued_from == "the Spot price history" and item.accrued == pytest.approx(expected, abs=1e-3)
    # At the plan's price (the one in effect when it was made) the hour would have cost a tenth as much.
    planned = cost_meter(session.record, later, node_hours=hours)
    assert planned is not None and planned.resources[gpu].accrued < item.accrued / 5
    assert (await down(session)).ok


def test_checkpoint_every_auto_on_spot_takes_the_advisors_rate_on_demand_the_failure_rate(
        world: World, kube_file: Path) -> None:
    """--checkpoint-every auto checkpoints by the expected interruption rate: Spot's, as the Spot Instance
    Advisor gives it for the GPU type in the region, on top of the failures any GPU node has."""
    world.script.spot_prices[("us-east-1", GPU)] = NOW

    def checkpoint_line(*args: str) -> str:
        job = _change(_plan("--checkpoint-every", "auto", "--storage-path", "s3://rtui-ckpt/runs", *args),
                      "ray.job.train")
        return str(job["after"]["checkpoint"])

    spot, on_demand = checkpoint_line("--spot"), checkpoint_line()
    assert "Spot Instance Advisor" in spot and "Llama 3" in spot, spot
    assert "Spot Instance Advisor" not in on_demand and "Llama 3" in on_demand, on_demand

    def rate(line: str) -> float:
        return float(line.split(" interruptions/h")[0].rsplit(" ", 1)[1])

    # g6.12xlarge in us-east-1 is in the double's "5-10%" bucket: 10% of nodes a month, per node-hour.
    spot_per_node = -math.log(1 - 0.10) / 730
    assert rate(spot) == pytest.approx(rate(on_demand) + 2 * spot_per_node, rel=2e-3), (spot, on_demand)
    world.script.spot_advisor = None  # the advisor cannot be read: its worst bucket, said so
    assert "no advisor data" in checkpoint_line("--spot")
