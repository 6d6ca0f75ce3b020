"""The matrix against moto over real HTTP: offerings, quotas, reservations, EKS zones, prices."""

from __future__ import annotations

import pytest

from targets.aws.cloud import PreflightRequest, run_preflight
from targets.aws.cloud.report import RegionReport, ZoneReport
from tests.aws.conftest import STANDARD, G, World


def zone(region: RegionReport, name: str) -> ZoneReport:
    return next(z for z in region.zones if z.zone == name)


async def test_default_plan_in_us_east_1(world: World) -> None:
    report = await run_preflight(PreflightRequest())
    (region,) = report.regions
    assert region.region == "us-east-1" and region.enabled and region.feasible
    assert report.gpu_instance is not None and report.gpu_instance.gpus == 4
    assert report.gpu_instance.vcpus == 48 and not report.gpu_instance.gdr
    feasible = sorted(z.zone for z in region.zones if z.feasible)
    assert feasible == ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"]
    a = zone(region, "us-east-1a")
    assert (a.zone_id, a.gpu_offered, a.system_offered, a.efa, a.efa_interfaces, a.gdr, a.eks_supported) == (
        "use1-az6",
        True,
        True,
        True,
        1,
        False,
        True,
    )
    assert region.quota is not None
    assert (region.quota.code, region.quota.limit, region.quota.used, region.quota.needed) == (G, 192, 0, 96)
    assert region.system_quota is not None and region.system_quota.code == STANDARD
    # 2 × 4.6016 + 0.2016 + EKS 0.10 + NAT 0.045 + its Elastic IP 0.005 + 500 GB gp3 at 0.08/GB-month, from
    # the built-in table, labelled (the Pricing API is denied).
    assert region.price_per_hour == pytest.approx(9.6096, abs=1e-4)
    assert region.price_source == "estimate, us-east-1 prices"
    assert report.recommendation is not None
    assert (report.recommendation.region, report.recommendation.zone) == ("us-east-1", "us-east-1a")


async def test_an_az_without_the_gpu_type_is_blocked(world: World) -> None:
    (region,) = (await run_preflight(PreflightRequest())).regions
    e = zone(region, "us-east-1e")  # moto's data: no g6.12xlarge in us-east-1e
    assert not e.gpu_offered and not e.feasible and e.verdict == "blocked"
    assert "g6.12xlarge is not offered in us-east-1e" in e.reasons


async def test_region_without_the_gpu_type(world: World) -> None:
    report = await run_preflight(PreflightRequest(regions=["us-west-1"]))
    (region,) = report.regions
    assert region.enabled and not region.feasible and region.zones
    assert all(not z.gpu_offered and not z.feasible for z in region.zones)
    assert "g6.12xlarge is not offered in us-west-1" in region.reasons
    assert report.recommendation is None
    assert region.price_source == "estimate, us-east-1 prices"


async def test_eks_rejected_zone_id_holds_gpu_nodes_only(world: World) -> None:
    # EKS refuses use1-az3 for control-plane subnets, not for nodes: the AZ can hold the GPU nodes.
    world.offer("us-east-1", "us-east-1e", "g6.12xlarge")
    world.offer("us-east-1", "us-east-1e", "m7i.xlarge")
    (region,) = (await run_preflight(PreflightRequest())).regions
    e = zone(region, "us-east-1e")
    assert e.gpu_offered and e.system_offered and not e.eks_supported
    assert e.feasible and e.verdict == "warning" and not e.reasons
    assert e.warnings[0].startswith("EKS rejects zone ID use1-az3 (us-east-1e) for its control plane: GPU nodes only")
    assert zone(region, "us-east-1a").eks_supported


@pytest.mark.slow
@pytest.mark.parametrize(
    ("limit", "ok", "headroom", "shortfall"),
    [(0, False, -4, 100), (48, False, 44, 52), (96, False, 92, 4), (192, True, 188, 0)],
)
async def test_quota_headroom_with_running_instances(
    world: World, limit: int, ok: bool, headroom: int, shortfall: int
) -> None:
    world.quota("us-east-1", G, limit)
    world.run_instances("us-east-1", "g6.xlarge")  # 4 vCPUs of the G quota already in use
    world.run_instances("eu-west-1", "g6.12xlarge")  # another region: must not count
    (region,) = (await run_preflight(PreflightRequest())).regions
    quota = region.quota
    assert quota is not None and quota.source == "applied"
    assert (quota.limit, quota.used, quota.needed, quota.headroom, quota.ok) == (limit, 4, 96, headroom, ok)
    assert quota.shortfall == shortfall
    assert quota.request_value == (None if ok else 100)
    assert region.feasible is ok
    a = zone(region, "us-east-1a")
    if not ok:
        assert any(f"quota short by {shortfall} vCPUs" in r for r in a.reasons)
        assert any("--desired-value 100" in (c.remedy or "") for c in a.checks)


async def test_exact_quota_without_running_instances_is_enough(world: World) -> None:
    world.quota("us-east-1", G, 96)
    (region,) = (await run_preflight(PreflightRequest())).regions
    assert region.quota is not None and region.quota.ok and region.quota.headroom == 96
    assert region.feasible


async def test_reservation_rescues_a_short_quota(world: World) -> None:
    world.quota("us-east-1", G, 48)
    cr = world.reserve("us-east-1", "us-east-1c", count=2)
    world.reserve("us-east-1", "us-east-1d", count=2, platform="Windows")  # wrong platform: no rescue
    world.reserve("us-east-1", "us-east-1b", count=4, instance_type="g6.48xlarge")  # another type does not count
    report = await run_preflight(PreflightRequest())
    (region,) = report.regions
    c, d = zone(region, "us-east-1c"), zone(region, "us-east-1d")
    assert c.feasible and c.verdict == "warning"
    assert [r.id for r in c.reservations] == [cr["CapacityReservationId"]]
    assert c.reservations[0].usable and c.reservations[0].available == 2
    assert not d.feasible and not d.reservations[0].usable
    assert zone(region, "us-east-1b").reservations == []
    assert not zone(region, "us-east-1a").feasible
    assert report.recommendation is not None
    assert report.recommendation.zone == "us-east-1c"
    assert report.recommendation.reservation == cr["CapacityReservationId"]


@pytest.mark.slow
async def test_a_named_reservation_counts_only_when_it_holds_every_gpu_node(world: World) -> None:
    """A Capacity Block or a targeted ODCR takes only the instances the launch template names it for,
    and that template is the GPU nodegroup's: a block of one cannot share the plan's two nodes with
    On-Demand headroom (a CAPACITY_BLOCK nodegroup never spills over). Open ODCRs do add up."""
    world.quota("us-east-1", G, 48)  # room for one node
    world.reserve("us-east-1", "us-east-1f", count=1, kind="capacity-block")
    world.reserve("us-east-1", "us-east-1e", count=1, match="targeted")
    world.reserve("us-east-1", "us-east-1d", count=2, kind="capacity-block", state="scheduled")  # not yet
    block = world.reserve("us-east-1", "us-east-1c", count=2, kind="capacity-block")
    open_one = world.reserve("us-east-1", "us-east-1b", count=1)
    report = await run_preflight(PreflightRequest())
    (region,) = report.regions
    f, e, d = zone(region, "us-east-1f"), zone(region, "us-east-1e"), zone(region, "us-east-1d")
    assert f.reservations[0].kind == "capacity-block" and f.reservations[0].end_date is not None
    assert not f.reservations[0].usable and not f.feasible
    assert not e.reservations[0].usable and not e.feasible
    assert not d.reservations[0].usable and not d.feasible
    c, b = zone(region, "us-east-1c"), zone(region, "us-east-1b")
    assert c.reservations[0].usable and c.feasible
    assert b.reservations[0].id == open_one["CapacityReservationId"] and b.feasible  # 1 open + 1 on headroom
    assert report.recommendation is not None and report.recommendation.zone == "us-east-1c"
    assert report.recommendation.reservation == block["CapacityReservationId"]


async def test_recommendation_prefers_a_reservation_over_a_cheaper_region(world: World) -> None:
    world.reserve("eu-west-2", "eu-west-2b", count=2)
    world.script.pricing_denied = False
    world.script.prices.update(
        {
            ("us-east-1", "g6.12xlarge"): 4.6016,
            ("us-east-1", "m7i.xlarge"): 0.2016,
            ("eu-west-2", "g6.12xlarge"): 5.5,
            ("eu-west-2", "m7i.xlarge"): 0.25,
        }
    )
    world.script.region_prices.update({
        "us-east-1": {"eks": 0.10, "nat_hour": 0.045, "nat_gb": 0.045, "ebs_gp3": 0.08, "ipv4": 0.005},
        "eu-west-2": {"eks": 0.10, "nat_hour": 0.05, "nat_gb": 0.05, "ebs_gp3": 0.0928, "ipv4": 0.005}})
    report = await run_preflight(PreflightRequest(regions=["us-east-1", "eu-west-2"]))
    prices = {r.region: (r.price_per_hour, r.price_source) for r in report.regions}
    assert prices["us-east-1"][0] == pytest.approx(9.6096, abs=1e-4)
    assert prices["us-east-1"][1] == "AWS Pricing API, us-east-1 on-demand"
    assert prices["eu-west-2"][0] == pytest.approx(11.25 + 0.155 + 500 * 0.0928 / 730, abs=1e-4)
    assert prices["eu-west-2"][1] == "AWS Pricing API, eu-west-2 on-demand"
    assert report.recommendation is not None
    assert (report.recommendation.region, report.recommendation.zone) == ("eu-west-2", "eu-west-2b")


async def test_cheapest_region_wins_without_reservations(world: World) -> None:
    world.script.pricing_denied = False
    world.script.prices.update(
        {
            ("us-east-1", "g6.12xlarge"): 4.6016,
            ("us-east-1", "m7i.xlarge"): 0.2016,
            ("us-east-2", "g6.12xlarge"): 4.0,
            ("us-east-2", "m7i.xlarge"): 0.2,
        }
    )
    report = await run_preflight(PreflightRequest(regions=["us-east-1", "us-east-2"]))
    assert report.recommendation is not None and report.recommendation.region == "us-east-2"


async def test_disabled_region_is_reported_not_scanned(world: World) -> None:
    report = await run_preflight(PreflightRequest(regions=["ap-east-1", "us-east-1"]))
    disabled = report.regions[0]
    assert (disabled.region, disabled.enabled, disabled.zones) == ("ap-east-1", False, [])
    assert "not enabled" in disabled.reasons[0]
    assert not any(region == "ap-east-1" for _, region, _ in world.script.calls)


@pytest.mark.slow
async def test_all_regions_stays_in_the_partition_and_creates_nothing(world: World) -> None:
    report = await run_preflight(PreflightRequest(all_regions=True))
    names = {r.region for r in report.regions}
    assert {"us-east-1", "eu-west-1", "ap-east-1"} <= names
    assert not any(n.startswith(("cn-", "us-gov-")) for n in names)
    assert report.recommendation is not None
    # Preflight is read-only: every call it made is a Describe/Get.
    assert world.actions() and all(a.startswith(("Describe", "Get")) for a in world.actions())


async def test_quota_unreadable_is_a_warning(world: World) -> None:
    world.script.default_quotas.clear()  # neither an applied nor a default value
    (region,) = (await run_preflight(PreflightRequest())).regions
    assert region.quota is not None and region.quota.ok is None and region.quota.source == "unavailable"
    a = zone(region, "us-east-1a")
    assert a.feasible and a.verdict == "warning"
    assert any("could not read the vCPU quota" in w for w in a.warnings)
