"""What an idle aws cluster costs (issue 26): the cost meter's own figures, at full size and with
the GPU nodes scaled to zero, for the seed's 2x g6.12xlarge made against the aws double."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.session import cost_meter
from tests.aws.conftest import World
from tests.aws.provision_world import down, session_for, tagged, up

pytestmark = pytest.mark.usefixtures("fast_backoff")


async def test_the_meter_bills_the_gpu_nodes_that_exist_and_says_what_full_size_costs(world: World,
                                                                                     kube_file: Path) -> None:
    session = session_for()
    planned = await session.plan()
    assert (await up(session)).ok
    full = cost_meter(session.record)
    assert full is not None
    gpu_full = full["resources"]["aws.nodegroup.gpu"]["per_hour"]
    assert gpu_full == pytest.approx(2 * 4.6016, rel=0.05)  # two g6.12xlarge (their EBS disks may add a little)

    fleet = {"workers": 0, "nodes": 0, "full": 2, "priced": "aws.nodegroup.gpu"}
    idle = cost_meter(session.record, gpu=fleet)
    assert idle is not None
    assert idle["resources"]["aws.nodegroup.gpu"]["per_hour"] == 0.0
    assert idle["per_hour_full"] == full["per_hour"]
    assert idle["per_hour"] == pytest.approx(full["per_hour"] - gpu_full, abs=1e-3)
    # What still bills while idle: the system node, EKS, the NAT (about $0.35/h).
    assert 0.3 < idle["per_hour"] < 0.5, idle
    # The plan said so beforehand, in the meter's own figures.
    (note,) = [n for n in planned.notes if n.startswith("idle after")]
    assert "the system node, EKS and the NAT gateway keep billing" in note
    assert f"${idle['per_hour']:.2f}/h instead of ${full['per_hour']:.2f}/h" in note, (note, idle, full)
    half = cost_meter(session.record, gpu={**fleet, "nodes": 1})
    assert half is not None and half["resources"]["aws.nodegroup.gpu"]["per_hour"] == pytest.approx(gpu_full / 2)
    print(f"\nidle cost per hour, 2x g6.12xlarge: before ${full['per_hour']:.4f}, after ${idle['per_hour']:.4f}")
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


async def test_with_idle_minutes_0_the_plan_promises_no_idle_cost(world: World) -> None:
    plan = await session_for(idle_minutes="0").plan()
    assert not [n for n in plan.notes if n.startswith("idle after")]
