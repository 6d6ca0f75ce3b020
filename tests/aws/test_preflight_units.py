"""Pure pieces: instance-family facts, quota arithmetic, verdicts and the recommendation."""

from __future__ import annotations

import pytest

from targets.aws.cloud.catalog import InstanceFacts, gpudirect_rdma_possible, quota_code_for
from targets.aws.cloud.pricing import PlanShape, builtin_region_prices, price_plan
from targets.aws.cloud.quota import headroom, vcpus_in_use
from targets.aws.cloud.report import RegionReport, Reservation, ZoneReport
from targets.aws.cloud.verdict import ZoneInputs, assess_zone, recommend

GPU = InstanceFacts(
    instance_type="g6.12xlarge",
    vcpus=48,
    memory_gib=192,
    gpus=4,
    efa_supported=True,
    efa_interfaces=1,
    quota_code="L-DB2E81BA",
)
SYSTEM = InstanceFacts(instance_type="m7i.xlarge", vcpus=4, memory_gib=16, quota_code="L-1216C47A")


@pytest.mark.parametrize(
    ("instance_type", "code"),
    [
        ("g6.12xlarge", "L-DB2E81BA"),
        ("vt1.3xlarge", "L-DB2E81BA"),
        ("gr6.4xlarge", "L-DB2E81BA"),
        ("p4d.24xlarge", "L-417A185B"),
        ("p5.48xlarge", "L-417A185B"),
        ("m7i.xlarge", "L-1216C47A"),
        ("inf2.xlarge", "L-1945791B"),
        ("hpc7g.4xlarge", None),
        ("u-6tb1.metal", None),
    ],
)
def test_quota_code_per_family(instance_type: str, code: str | None) -> None:
    assert quota_code_for(instance_type) == code


@pytest.mark.parametrize(
    ("instance_type", "efa", "gdr"),
    [
        ("p4d.24xlarge", True, True),
        ("p5.48xlarge", True, True),
        ("p3dn.24xlarge", True, False),
        ("g6.12xlarge", True, False),
        ("p4d.24xlarge", False, False),
    ],
)
def test_gpudirect_rdma_only_from_p4d(instance_type: str, efa: bool, gdr: bool) -> None:
    assert gpudirect_rdma_possible(instance_type, efa) is gdr


def test_vcpus_in_use_counts_per_quota_and_fills_missing_cpu_options() -> None:
    used = vcpus_in_use(
        [
            {"InstanceType": "g6.xlarge", "vcpus": None},
            {"InstanceType": "g5.2xlarge", "vcpus": 8},
            {"InstanceType": "m7i.large", "vcpus": 2},
            {"InstanceType": "mac2.metal", "vcpus": 12},
        ],
        {"g6.xlarge": 4},
    )
    assert used == {"L-DB2E81BA": 12, "L-1216C47A": 2}


def _zone(
    zone_id: str = "use1-az6",
    others: frozenset[str] = frozenset({"use1-az1"}),
    reservations: tuple[Reservation, ...] = (),
    limit: float = 192,
) -> ZoneReport:
    return assess_zone(
        ZoneInputs(
            region="us-east-1",
            zone="us-east-1a",
            zone_id=zone_id,
            offered=frozenset({"g6.12xlarge", "m7i.xlarge"}),
            other_eks_zone_ids=others,
            system_offered_in_region=True,
            reservations=reservations,
        ),
        gpu=GPU,
        gpu_count=2,
        system=SYSTEM,
        system_count=1,
        require_efa=True,
        quota=headroom("L-DB2E81BA", needed=96, limit=limit, used=0),
        system_quota=headroom("L-1216C47A", needed=4, limit=32, used=0),
    )


def test_no_second_eks_az_blocks() -> None:
    zone = _zone(others=frozenset())
    assert not zone.feasible and "no second EKS-supported AZ" in zone.reasons[0]


def _reservation(cr_id: str, *, available: int) -> Reservation:
    """An active, usable Linux ODCR for g6.12xlarge in us-east-1a, fully available."""
    return Reservation(id=cr_id, kind="odcr", instance_type="g6.12xlarge", platform="Linux/UNIX",
                       zone="us-east-1a", tenancy="default", available=available, total=available,
                       state="active", usable=True)


def test_partial_reservation_does_not_rescue_a_zero_quota() -> None:
    cr = _reservation("cr-1", available=1)
    assert not _zone(reservations=(cr,), limit=0).feasible
    assert _zone(reservations=(cr,), limit=48).feasible


def test_recommend_prefers_reservation_then_price() -> None:
    cheap = RegionReport(region="us-east-2", enabled=True, price_per_hour=9.0, feasible=True, zones=[_zone()])
    reserved_zone = _zone(
        reservations=(
            _reservation("cr-2", available=2),
        )
    )
    dear = RegionReport(
        region="eu-west-2", enabled=True, price_per_hour=12.0, feasible=True, zones=[reserved_zone]
    )
    rec = recommend([cheap, dear])
    assert rec is not None and (rec.region, rec.reservation) == ("eu-west-2", "cr-2")
    rec = recommend([cheap, dear.model_copy(update={"zones": [_zone()]})])
    assert rec is not None and rec.region == "us-east-2"
    assert recommend([cheap.model_copy(update={"zones": [_zone(limit=0)]})]) is None


def test_one_function_prices_a_plan_from_its_region_prices() -> None:
    prices = builtin_region_prices("eu-west-1", ("g6.12xlarge", "m7i.xlarge"))
    shape = PlanShape("g6.12xlarge", 2, 200, "m7i.xlarge", 1, 100)
    cost = price_plan(prices, shape)
    disks = (2 * 200 + 100) * 0.08 / 730
    assert cost.total == pytest.approx(2 * 4.6016 + 0.2016 + 0.10 + 0.045 + 0.005 + disks, abs=1e-4)
    assert cost.source == "estimate, us-east-1 prices" and cost.nat_per_gb == pytest.approx(0.045)
    assert set(cost.breakdown()) == {"gpu_nodes", "system_nodes", "eks_control_plane", "nat_gateway"}
    adopted = price_plan(prices, PlanShape("g6.12xlarge", 2, 200, "m7i.xlarge", 1, 100, nat_gateway=False))
    assert "nat_gateway" not in adopted.parts and adopted.nat_per_gb is None
    assert price_plan(prices, PlanShape("x9.huge", 2, 200, "m7i.xlarge", 1, 100)).total is None


def test_the_recommendation_says_cheapest_only_when_it_is() -> None:
    """Issue 40 item 6: "the cheapest feasible zone" was said when every AZ showed the same price."""
    def region(name: str, price: float | None, zones: int = 1) -> RegionReport:
        return RegionReport(region=name, enabled=True, price_per_hour=price, feasible=True,
                            zones=[_zone().model_copy(update={"zone": f"{name}{'abc'[i]}"}) for i in range(zones)])

    rec = recommend([region("us-east-2", 9.0), region("eu-west-2", 12.0)])
    assert rec is not None and rec.why == "cheapest feasible zone"
    same = recommend([region("us-east-1", 9.0, zones=3)])  # one region: its zones cost the same
    assert same is not None and "cheapest" not in same.why and "same price" in same.why, same
    tie = recommend([region("us-east-2", 9.0), region("us-west-2", 9.0)])
    assert tie is not None and "cheapest" not in tie.why and "same price" in tie.why, tie
    unpriced = recommend([region("us-east-2", None), region("us-west-2", None)])
    assert unpriced is not None and "cheapest" not in unpriced.why and "no price" in unpriced.why, unpriced
    alone = recommend([region("us-east-2", 9.0)])
    assert alone is not None and alone.why == "the only feasible zone"
