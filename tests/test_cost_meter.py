"""The cost meter's "so far" (issue 26): a nodegroup that may scale to zero is counted from what AWS
recorded of its instances (``targets.aws.infra.node_hours``), else as an upper bound."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from backend.ledger import ResourceStatus
from backend.resources import Action, Change, Plan
from backend.session import RunSession, cost_meter
from targets.aws.infra.node_hours import RETENTION_S, node_hours
from tests.test_tui import fixed_session
from tui.render import accrued_text

H = 3600.0
NOW = 1_800_000_000.0
GPU, SYSTEM, EKS, NAT = "aws.nodegroup.gpu", "aws.nodegroup.system", "aws.eks-cluster", "aws.nat-gateway"
# The seed: 2x g6.12xlarge (4.6016 each), one m7i.xlarge, EKS and one NAT gateway (DESIGN.md §4).
PRICES = {GPU: 2 * 4.6016, SYSTEM: 0.2016, EKS: 0.10, NAT: 0.045}


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def launch(instance: str, start: float, status: str = "Successful") -> dict[str, Any]:
    return {"Description": f"Launching a new EC2 instance: {instance}", "StatusCode": status,
            "StartTime": _at(start), "EndTime": _at(start + 60)}


def terminate(instance: str, start: float, end: float | None = None, status: str = "Successful") -> dict[str, Any]:
    out = {"Description": f"Terminating EC2 instance: {instance}", "StatusCode": status, "StartTime": _at(start)}
    return out if end is None else {**out, "EndTime": _at(end)}


def seed_run(made_hours_ago: float, *, scales: bool = True) -> RunSession:
    session = fixed_session()
    ledger = session.ctx.ledger
    for address in PRICES:
        ledger.set(address, "aws-thing", ResourceStatus.READY, layer="aws", id=address)
    for entry in session.record.resources.values():
        entry.created_at = NOW - made_hours_ago * H
    gpu_spec = {"size": 2, "min_size": 0 if scales else 2, "max_size": 2}
    session.record.plan = Plan(target="aws", changes=[
        Change(address=a, layer="aws", kind="aws-thing", action=Action.CREATE, cost_per_hour=p,
               after=gpu_spec if a == GPU else {}) for a, p in PRICES.items()])
    return session


# --- node_hours: what the activities say ---------------------------------------------------------

def test_each_instance_counts_from_its_launch_to_its_termination_or_now() -> None:
    since = NOW - 10 * H
    activities = [
        terminate("i-0a", NOW - 9 * H, NOW - 9 * H + 30),  # latest first, as AWS answers
        launch("i-0b", NOW - 2 * H),  # running still
        launch("i-0a", NOW - 10 * H),
        launch("i-0c", NOW - 3 * H, status="Failed"),  # no instance, no bill
        terminate("i-0d", NOW - H, status="InProgress"),  # still billing until it ends
        launch("i-0d", NOW - 4 * H),
    ]
    assert node_hours(activities, since=since, now=NOW) == pytest.approx((H + 30) / H + 2 + 4)


def test_a_launch_before_the_run_counts_from_the_run_and_missing_history_gives_no_figure() -> None:
    assert node_hours([launch("i-0a", NOW - 5 * H)], since=NOW - 2 * H, now=NOW) == pytest.approx(2)
    # A termination whose launch the history no longer holds: the history is incomplete.
    assert node_hours([terminate("i-0a", NOW - H, NOW - H)], since=NOW - 2 * H, now=NOW) is None
    # AWS keeps six weeks of activities: an older group's first launches may be gone.
    assert node_hours([launch("i-0a", NOW - H)], since=NOW - RETENTION_S - H, now=NOW) is None
    assert node_hours([], since=NOW - H, now=NOW) == 0.0


# --- cost_meter ---------------------------------------------------------------------------------

def test_so_far_for_the_seed_idle_nine_of_ten_hours(isolated_env: Path) -> None:
    """The GPU nodes ran the first hour, then cluster-autoscaler took them: 2 node-hours."""
    session = seed_run(10)
    record = session.record
    upper = cost_meter(record, NOW)
    exact = cost_meter(record, NOW, node_hours={GPU: 2.0})
    assert upper is not None and exact is not None
    full = sum(PRICES.values())
    assert upper.accrued == pytest.approx(10 * full, abs=1e-3)
    assert upper.accrued_exact is False and upper.resources[GPU].accrued_at_most is True
    assert accrued_text(upper.to_dict()) == f"at most ${10 * full:.2f} so far"
    others = sum(p for a, p in PRICES.items() if a != GPU)
    assert exact.accrued == pytest.approx(PRICES[GPU] / 2 * 2 + 10 * others, abs=1e-3)
    assert exact.accrued_exact is True and exact.resources[GPU].node_hours == 2.0
    assert accrued_text(exact.to_dict()) == f"${exact.accrued:.2f} so far"
    # One more idle hour: what each meter adds.
    later_upper = cost_meter(record, NOW + H)
    later_exact = cost_meter(record, NOW + H, node_hours={GPU: 2.0})
    assert later_upper is not None and later_exact is not None
    before, after = later_upper.accrued - upper.accrued, later_exact.accrued - exact.accrued
    assert before == pytest.approx(full, abs=1e-3) and after == pytest.approx(others, abs=1e-3)
    print(f"\nper idle hour, seed 2x g6.12xlarge: before ${before:.4f}, after ${after:.4f}; "
          f"10 h (1 h busy): at most ${upper.accrued:.2f}, from activities ${exact.accrued:.2f}")


def test_a_fixed_size_run_is_exact_without_any_history(isolated_env: Path) -> None:
    meter = cost_meter(seed_run(3, scales=False).record, NOW)
    assert meter is not None and meter.accrued_exact is True
    assert not meter.resources[GPU].accrued_at_most
    assert meter.accrued == pytest.approx(3 * sum(PRICES.values()), abs=1e-3)

