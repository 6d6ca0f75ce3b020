"""What an idle aws cluster costs (issue 26): the cost meter's own figures, at full size and with
the GPU nodes scaled to zero, for the seed's 2x g6.12xlarge made against the aws double."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from backend.resources import CostMeter, GpuFleet
from backend.session import cost_meter
from tests.aws.conftest import World
from tests.aws.provision_world import REGION, down, eks, session_for, tagged, up

pytestmark = pytest.mark.usefixtures("fast_backoff")


@pytest.mark.slow
async def test_the_meter_bills_the_gpu_nodes_that_exist_and_says_what_full_size_costs(world: World,
                                                                                     kube_file: Path) -> None:
    session = session_for()
    planned = await session.plan()
    assert (await up(session)).ok
    full = cost_meter(session.record)
    assert full is not None
    gpu_full = full.resources["aws.nodegroup.gpu"].per_hour
    assert gpu_full == pytest.approx(2 * 4.6016, rel=0.05)  # two g6.12xlarge (their EBS disks may add a little)

    fleet = GpuFleet(workers=0, nodes=0, full=2, autoscaling=True, priced="aws.nodegroup.gpu")
    idle = cost_meter(session.record, gpu=fleet)
    assert idle is not None
    assert idle.resources["aws.nodegroup.gpu"].per_hour == 0.0
    assert idle.per_hour_full == full.per_hour
    assert idle.per_hour == pytest.approx(full.per_hour - gpu_full, abs=1e-3)
    # What still bills while idle: the system node, EKS, the NAT (about $0.35/h).
    assert 0.3 < idle.per_hour < 0.5, idle
    # The plan said so beforehand, in the meter's own figures.
    (note,) = [n for n in planned.notes if n.startswith("idle after")]
    assert "the system node, EKS and the NAT gateway keep billing" in note
    assert f"${idle.per_hour:.2f}/h instead of ${full.per_hour:.2f}/h" in note, (note, idle, full)
    half = cost_meter(session.record, gpu=replace(fleet, nodes=1))
    assert half is not None and half.resources["aws.nodegroup.gpu"].per_hour == pytest.approx(gpu_full / 2)
    print(f"\nidle cost per hour, 2x g6.12xlarge: before ${full.per_hour:.4f}, after ${idle.per_hour:.4f}")
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


@pytest.mark.slow
async def test_with_idle_minutes_0_the_plan_promises_no_idle_cost(world: World) -> None:
    plan = await session_for(idle_minutes="0").plan()
    assert not [n for n in plan.notes if n.startswith("idle after")]


# --- what was accrued: from the GPU group's scaling activities (tests/aws/moto_activities.py) ----------

def _gpu_group() -> str:
    group = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    return str(group["resources"]["autoScalingGroups"][0]["name"])


def _autoscaling() -> Any:
    return boto3.client("autoscaling", region_name=REGION)


@pytest.mark.slow
async def test_the_gpu_groups_activities_record_each_launch_and_termination_as_aws_does(
        world: World, kube_file: Path) -> None:
    session = session_for()
    assert (await up(session)).ok
    group = _gpu_group()
    launches = _autoscaling().describe_scaling_activities(AutoScalingGroupName=group)["Activities"]
    assert sorted(a["Description"].split(": ")[0] for a in launches) == ["Launching a new EC2 instance"] * 2
    assert all(a["StatusCode"] == "Successful" and a["StartTime"] <= a["EndTime"] for a in launches)
    # cluster-autoscaler takes both idle nodes away.
    _autoscaling().set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=0)
    # Latest first, at most MaxRecords a page, the rest behind NextToken.
    first = _autoscaling().describe_scaling_activities(AutoScalingGroupName=group, MaxRecords=3)
    assert [a["Description"].split(": ")[0] for a in first["Activities"]] == [
        "Terminating EC2 instance", "Terminating EC2 instance", "Launching a new EC2 instance"]
    rest = _autoscaling().describe_scaling_activities(AutoScalingGroupName=group, NextToken=first["NextToken"])
    assert len(rest["Activities"]) == 1 and "NextToken" not in rest
    stopped = {a["Description"].rsplit(" ", 1)[1] for a in first["Activities"][:2]}
    assert stopped == {a["Description"].rsplit(" ", 1)[1] for a in launches}
    with pytest.raises(ClientError, match="ValidationError"):
        _autoscaling().describe_scaling_activities(AutoScalingGroupName=group, MaxRecords=101)
    assert (await down(session)).ok


@pytest.mark.slow
async def test_so_far_counts_the_gpu_nodes_only_while_they_ran(world: World, kube_file: Path) -> None:
    session = session_for()
    assert (await up(session)).ok
    gpu = session.record.resources["aws.nodegroup.gpu"]
    launched = time.time()
    # The nodes ran for a moment; then cluster-autoscaler took them, and the cluster sat idle.
    _autoscaling().set_desired_capacity(AutoScalingGroupName=_gpu_group(), DesiredCapacity=0)
    emptied = time.time()
    hours = await session.node_hours(emptied)
    ran = hours["aws.nodegroup.gpu"]
    assert 0 < ran <= 2 * (emptied - gpu.created_at) / 3600 + 1e-6
    assert ran >= 2 * (emptied - launched) / 3600 - 1e-6

    def meters(later_h: float) -> tuple[CostMeter, CostMeter]:
        at = emptied + later_h * 3600
        upper, known = cost_meter(session.record, at), cost_meter(session.record, at, node_hours=hours)
        assert upper is not None and known is not None
        return upper, known

    upper, known = meters(0)
    assert known.accrued_exact and not upper.accrued_exact
    assert upper.resources["aws.nodegroup.gpu"].accrued_at_most is True
    per_node = known.resources["aws.nodegroup.gpu"].per_hour / 2
    assert known.resources["aws.nodegroup.gpu"].accrued == pytest.approx(per_node * ran, abs=1e-3)
    (upper_1h, known_1h) = meters(1)
    before = upper_1h.accrued - upper.accrued  # each idle hour at full size: the meter before
    after = known_1h.accrued - known.accrued  # each idle hour from what AWS recorded
    assert before == pytest.approx(upper.per_hour, abs=0.01)
    assert 0.3 < after < 0.5, after  # the system node, EKS, the NAT
    print(f"\nso far per idle hour, 2x g6.12xlarge: full-size count ${before:.4f}, "
          f"from the scaling activities ${after:.4f}")
    # The status report asks AWS itself.
    report = await session.status_report()
    assert report.cost is not None and report.cost.accrued_exact, report.cost
    assert report.cost.resources["aws.nodegroup.gpu"].node_hours == pytest.approx(ran, abs=1e-3)
    assert (await down(session)).ok


@pytest.mark.slow
async def test_without_the_groups_history_so_far_is_an_upper_bound(world: World, kube_file: Path) -> None:
    session = session_for()
    assert (await up(session)).ok
    world.script.errors[("autoscaling", "DescribeScalingActivities")] = "AccessDenied"
    assert await session.node_hours() == {}
    report = await session.status_report()
    assert report.cost is not None and report.cost.accrued_exact is False
    from tui.render import accrued_text

    assert accrued_text(report.cost.to_dict()).startswith("at most $")
    world.script.errors.clear()
    assert (await down(session)).ok
