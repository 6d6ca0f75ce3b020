"""Issue 41, "where the capacity is": a Spot plan's matrix reads EC2's Spot placement scores per AZ (by zone
ID), the Spot Instance Advisor's interruption bucket per region, takes --spot-types, and recommends the AZ
with the lowest expected cost to finish, against the AWS double over real HTTP (tests/aws/moto_spot.py)."""

from __future__ import annotations

import json
import math

import boto3
import pytest
from botocore.exceptions import ClientError
from rich.text import Text

from targets.aws.cloud import PreflightRequest, run_preflight
from targets.aws.cloud.report import RegionReport, ZoneReport
from targets.aws.cloud.spot_advisor import LOST_MINUTES_PER_INTERRUPTION
from targets.aws.matrix import header_line, zone_prompt
from tests.aws import moto_spot
from tests.aws.conftest import World
from tests.conftest import run_rtui

# Three types with the same GPU (1× NVIDIA L4, 22888 MiB) and one EFA network card each, all offered in
# us-east-1a-d: EC2 scores three or more types on their merits (fewer score low by construction).
GPU, WIDER = "g6.8xlarge", ["g6.16xlarge", "gr6.8xlarge"]
TYPES = [GPU, *WIDER]
ZONES = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"]


def _zone(region: RegionReport, name: str) -> ZoneReport:
    return next(z for z in region.zones if z.zone == name)


def _request(**kwargs: object) -> PreflightRequest:
    fields: dict[str, object] = {"regions": ["us-east-1"], "gpu_node_type": GPU, "spot": True, "spot_types": WIDER}
    return PreflightRequest.model_validate(fields | kwargs)


def _prices(world: World, by_zone: dict[str, float]) -> None:
    """Every type of the plan at the same Spot price per AZ (the dearest is what the plan is priced at)."""
    for name in TYPES:
        world.script.spot_prices[("us-east-1", name)] = dict(by_zone)


async def test_scores_reach_each_az_by_its_zone_id_over_every_page(world: World) -> None:
    """EC2 names scored AZs by zone ID only (use1-az6 is us-east-1a here), pages by two: every AZ's own score
    arrives, none by another's name. A product keying by zone name, or reading one page, fails here."""
    scripted = {"us-east-1a": 3, "us-east-1b": 9, "us-east-1c": 6, "us-east-1d": 10, "us-east-1f": 2}
    for name, score in scripted.items():
        world.script.spot_scores[("us-east-1", name)] = score
    report = await run_preflight(_request())
    (region,) = report.regions
    got = {z.zone: z.spot_score for z in region.zones if z.gpu_offered}
    assert got == scripted
    assert _zone(region, "us-east-1a").zone_id == "use1-az6"  # names and IDs do not line up
    asked = [r for r in world.script.requests if r[2] == "GetSpotPlacementScores"]
    assert len(asked) >= 3  # five AZs, two per page
    said = asked[0][3]
    for part in ("TargetCapacity=2", "TargetCapacityUnitType=units", "SingleAvailabilityZone=true",
                 "RegionName.1=us-east-1", *(f"={t}" for t in TYPES)):
        assert part in said, (part, said)


async def test_scores_of_fewer_than_three_types_are_low_and_the_check_says_so(world: World) -> None:
    for name in ZONES:
        world.script.spot_scores[("us-east-1", name)] = 10
    report = await run_preflight(_request(spot_types=[]))
    (region,) = report.regions
    assert {z.spot_score for z in region.zones if z.gpu_offered} == {moto_spot.FEW_TYPES_SCORE}
    assert report.recommendation is not None
    assert "fewer than 3 instance types are low" in report.recommendation.why
    assert "shown, not weighed" in report.recommendation.why
    # Not weighed: a low score of one type is no sign of scarce capacity, so the expected cost is Spot's
    # (stretched by interruptions), not pulled towards On-Demand's by it.
    for zone in (z for z in region.zones if z.feasible):
        assert zone.price_per_hour is not None and zone.expected_per_hour is not None
        assert zone.price_per_hour <= zone.expected_per_hour < zone.price_per_hour * 1.01, zone


def test_the_double_refuses_what_ec2_refuses(world: World) -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=world.endpoint)
    base = {"TargetCapacity": 2, "SingleAvailabilityZone": True, "RegionNames": ["us-east-1"]}
    cases = [
        ({**base, "InstanceTypes": TYPES, "InstanceRequirementsWithMetadata": {"ArchitectureTypes": ["x86_64"]}},
         "InvalidParameterCombination"),
        (base, "MissingParameter"),
        ({**base, "InstanceTypes": TYPES, "TargetCapacity": 2_000_000_001}, "InvalidParameterValue"),
        ({**base, "InstanceTypes": [*TYPES, "g9.nonexistent"]}, "InvalidParameterValue"),
        ({**base, "InstanceTypes": TYPES, "RegionNames": ["us-east-1"] * 11}, "InvalidParameterValue"),
        ({**base, "InstanceTypes": TYPES, "MaxResults": 1001}, "InvalidParameterValue"),
    ]
    for params, code in cases:
        with pytest.raises(ClientError) as caught:
            ec2.get_spot_placement_scores(**params)
        assert caught.value.response["Error"]["Code"] == code, params
    world.script.spot_score_config_limit = 1
    ec2.get_spot_placement_scores(**base, InstanceTypes=TYPES)
    ec2.get_spot_placement_scores(**base, InstanceTypes=TYPES)  # a configuration already asked still answers
    with pytest.raises(ClientError) as caught:
        ec2.get_spot_placement_scores(**{**base, "TargetCapacity": 3}, InstanceTypes=TYPES)
    assert caught.value.response["Error"]["Code"] == "MaxConfigLimitExceeded"


async def test_no_permission_for_scores_is_a_warning_on_the_zones_not_a_failed_region(world: World) -> None:
    world.script.errors[("ec2", "GetSpotPlacementScores")] = "UnauthorizedOperation"
    report = await run_preflight(_request())
    (region,) = report.regions
    assert region.feasible and region.error is None
    feasible = [z for z in region.zones if z.feasible]
    assert feasible and all(z.spot_score is None for z in feasible)
    for z in feasible:
        (said,) = [w for w in z.warnings if "Spot placement scores" in w]
        assert "UnauthorizedOperation" in said and "ec2:GetSpotPlacementScores" in said
    assert report.recommendation is not None
    assert "no Spot placement score (taken as 10)" in report.recommendation.why


async def test_the_interruption_rate_is_the_advisors_bucket_read_once_anonymously(world: World) -> None:
    """One read of the advisor's object for two regions; the rate is the riskiest type's bucket, its upper
    edge from the label (5-10% -> 10%, where the object's ``max`` says 11)."""
    moto_spot.advise(world.script, "us-east-1", "g6.16xlarge", 1)  # 5-10%: riskier than the others' <5%
    moto_spot.advise(world.script, "us-east-1", GPU, 0)
    moto_spot.advise(world.script, "us-east-1", "gr6.8xlarge", 0)
    moto_spot.advise(world.script, "us-west-2", GPU, 4)  # >20%: no upper edge
    report = await run_preflight(_request(regions=["us-east-1", "us-west-2"]))
    east, west = report.regions
    assert east.spot_interruptions is not None and west.spot_interruptions is not None
    rate = east.spot_interruptions
    assert (rate.instance_type, rate.label, rate.share_per_month, rate.at_least) == ("g6.16xlarge", "5-10%", 0.1, False)
    assert rate.per_hour == pytest.approx(-math.log(0.9) / 730, rel=1e-6)
    assert west.spot_interruptions.label == ">20%" and west.spot_interruptions.at_least
    assert west.spot_interruptions.per_hour == pytest.approx(-math.log(0.8) / 730, rel=1e-6)
    reads = [c for c in world.script.calls if c == ("s3", "us-east-1", "GetObject")]
    assert len(reads) == 1


async def test_the_recommendation_is_the_lowest_expected_cost_not_the_lowest_spot_price(world: World) -> None:
    """us-east-1a is the cheapest Spot but EC2 scores it 1: its GPU nodes would mostly run On-Demand.
    us-east-1b costs more on Spot, scores 10, and is the cheaper way to finish."""
    _prices(world, {"us-east-1a": 0.40, "us-east-1b": 0.70, "us-east-1c": 0.90, "us-east-1d": 1.10})
    for name, score in {"us-east-1a": 1, "us-east-1b": 10, "us-east-1c": 10, "us-east-1d": 10}.items():
        world.script.spot_scores[("us-east-1", name)] = score
    report = await run_preflight(_request())
    (region,) = report.regions
    a, b = _zone(region, "us-east-1a"), _zone(region, "us-east-1b")
    assert a.spot_price is not None and b.spot_price is not None and a.spot_price < b.spot_price
    assert region.price_per_hour is not None and region.spot_interruptions is not None
    # The test's own arithmetic: p x Spot x stretch + (1 - p) x On-Demand, 13 minutes lost per interruption.
    stretch = 1 / (1 - region.spot_interruptions.per_hour * 2 * LOST_MINUTES_PER_INTERRUPTION / 60)
    for zone, p in ((a, 0.1), (b, 1.0)):
        assert zone.price_per_hour is not None
        want = p * zone.price_per_hour * stretch + (1 - p) * region.price_per_hour
        assert zone.expected_per_hour == pytest.approx(want, abs=1e-3)
    assert b.expected_per_hour is not None and a.expected_per_hour is not None
    assert b.expected_per_hour < a.expected_per_hour
    rec = report.recommendation
    assert rec is not None and rec.zone == "us-east-1b", rec
    assert rec.why.startswith(f"lowest expected cost to finish: ${b.expected_per_hour:.2f}/h of training "
                              f"(${b.price_per_hour:.2f}/h with Spot GPU nodes)"), rec.why
    assert "score 10" in rec.why


async def test_equal_expected_costs_are_not_called_cheapest(world: World) -> None:
    _prices(world, dict.fromkeys(ZONES, 0.50))
    for name in [*ZONES, "us-east-1f"]:
        world.script.spot_scores[("us-east-1", name)] = 8
    world.script.spot_prices[("us-east-1", GPU)]["us-east-1f"] = 0.50
    world.script.spot_prices[("us-east-1", "g6.16xlarge")]["us-east-1f"] = 0.50
    report = await run_preflight(_request())
    rec = report.recommendation
    assert rec is not None and rec.zone == "us-east-1a"
    assert "lowest" not in rec.why and "expected costs are the same" in rec.why, rec.why


async def test_an_unreadable_advisor_is_a_warning_and_the_recommendation_still_comes(world: World) -> None:
    world.script.spot_advisor = None  # S3 answers 403 AccessDenied
    report = await run_preflight(_request())
    (region,) = report.regions
    assert region.feasible and region.spot_interruptions is None
    for z in (z for z in region.zones if z.feasible):
        assert any("Spot Instance Advisor" in w and "AccessDenied" in w for w in z.warnings), z.warnings
        assert z.expected_per_hour is not None  # priced without interruptions, and said so
    assert report.recommendation is not None
    assert "no interruption rate known" in report.recommendation.why


def test_a_spot_type_with_other_gpus_is_refused_with_exit_2(world: World) -> None:
    proc = run_rtui("check", "--target", "aws", "--region", "us-east-1", "--spot", "--gpu-node-type", GPU,
                    "--spot-types", "g6.16xlarge,g5.12xlarge")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    (line,) = proc.stderr.strip().splitlines()
    assert "g5.12xlarge" in line and "A10G" in line and "L4" in line and "--spot-types" in line, line
    # A type without the EFA the plan needs is refused too.
    proc = run_rtui("check", "--target", "aws", "--region", "us-east-1", "--spot", "--gpu-node-type", GPU,
                    "--spot-types", "gr6.4xlarge")
    assert proc.returncode == 2 and "EFA" in proc.stderr, proc.stderr


def test_check_json_and_text_show_scores_expected_costs_and_interruptions(world: World) -> None:
    _prices(world, {"us-east-1a": 0.40, "us-east-1b": 0.70, "us-east-1c": 0.90, "us-east-1d": 1.10})
    args = ("check", "--target", "aws", "--region", "us-east-1", "--spot", "--gpu-node-type", GPU,
            "--spot-types", ",".join(WIDER))
    proc = run_rtui(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    (region,) = json.loads(proc.stdout)["regions"]
    assert set(region["spot_interruptions"]) >= {"instance_type", "label", "per_hour", "at_least"}
    zones = {z["zone"]: z for z in region["zones"] if z["feasible"]}
    assert {z: zones[z]["spot_score"] for z in zones} == {z: moto_spot.default_score(z) for z in zones}
    assert all(isinstance(z["expected_per_hour"], float) for z in zones.values())
    text = run_rtui(*args).stdout
    row = next(line for line in text.splitlines() if line.strip().startswith("us-east-1b"))
    assert f"{zones['us-east-1b']['expected_per_hour']:.2f}" in row and " 7 " in row, row
    assert "Spot interruptions" in text


def test_a_spot_row_fits_80_columns_with_its_score_and_expected_cost() -> None:
    zone = ZoneReport(zone="ap-southeast-4a", zone_id="apse4-az1", gpu_offered=True, system_offered=True, efa=True,
                      efa_interfaces=1, gdr=False, eks_supported=True, feasible=True, verdict="feasible",
                      spot_price=1.2345, price_per_hour=3.21, spot_score=10, expected_per_hour=13.37)
    region = RegionReport(region="ap-southeast-4", enabled=True, price_per_hour=9.61, zones=[zone])
    line = zone_prompt(region, zone, recommended=True, chosen=False)
    head = header_line(spot=True)
    # The panel's border and padding and the list's scrollbar leave the rows 70 of 80 columns (measured).
    assert line.cell_len <= 70 and head.cell_len <= 70, (line.cell_len, head.cell_len)
    assert "10/10" in line.plain and "$13.37" in line.plain and "$3.21" in line.plain
    assert "ap-southeast-4a" in line.plain and "apse4-az1" in line.plain  # nothing cut
    for name in ("score", "EKS", "$/h", "exp $/h"):
        assert name in head.plain and "…" not in head.plain, head.plain
    assert "reserved" not in head.plain
    assert isinstance(header_line(), Text) and "reserved" in header_line().plain  # On-Demand keeps its columns
