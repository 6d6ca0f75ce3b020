"""Issue 34 item 4: the EKS control plane's CloudWatch log group goes with the run.

EKS sends the control-plane logs rtui enables (audit, authenticator) to ``/aws/eks/<cluster>/cluster``
and leaves the group when the cluster is deleted (EKS User Guide, "Send control plane logs to
CloudWatch Logs"); its stored logs bill $0.03/GB-month. The double makes the group as EKS does
(tests/aws/moto_leftovers.py): `down` deletes it, the sweep reports it when it is still there, and a
group of that name rtui did not make is never deleted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from backend.resources import EventKind
from tests.aws.conftest import World
from tests.aws.provision_world import REGION, RUN_TAG, down, session_for, up

pytestmark = pytest.mark.usefixtures("fast_backoff")

GROUP = "/aws/eks/rtui-ray/cluster"


def logs() -> Any:
    return boto3.client("logs", region_name=REGION)


def groups() -> list[str]:
    return [g["logGroupName"] for g in logs().describe_log_groups(logGroupNamePrefix="/aws/eks/")["logGroups"]]


@pytest.mark.slow
async def test_down_deletes_the_control_plane_log_group(world: World, kube_file: Path) -> None:
    session = session_for()
    made = await up(session)
    assert made.ok, made.failures()
    assert groups() == [GROUP]
    gone = await down(session)
    assert gone.ok, gone.failures()
    assert groups() == []


@pytest.mark.slow
async def test_the_sweep_reports_the_log_group_left_with_its_storage_price(world: World, kube_file: Path) -> None:
    session = session_for()
    assert (await up(session)).ok
    arn = logs().describe_log_groups(logGroupNamePrefix=GROUP)["logGroups"][0]["logGroupArn"]
    assert logs().list_tags_for_resource(resourceArn=arn)["tags"][RUN_TAG] == session.run_id  # findable by tag
    world.script.errors[("logs", "DeleteLogGroup")] = "AccessDeniedException"
    gone = await down(session)
    assert not gone.ok
    sweep = next(e for e in gone.events if e.step == "sweep" and e.kind is EventKind.FAILED)
    left = {item.id: item for item in session.record.facts.sweep or []}
    assert GROUP in left, sweep.message
    assert left[GROUP].kind == "CloudWatch log group" and "$0.03/GB-month" in left[GROUP].state
    world.script.errors.clear()
    again = await down(session)
    assert again.ok, again.failures()
    assert groups() == []


@pytest.mark.slow
async def test_a_log_group_of_the_clusters_name_made_by_someone_else_is_kept(world: World,
                                                                           kube_file: Path) -> None:
    logs().create_log_group(logGroupName=GROUP)  # left by an earlier cluster of this name, not rtui's
    session = session_for()
    plan = await session.plan()
    change = next(c for c in plan.changes if c.address == "aws.log-group.cluster")
    assert change.action.value == "noop" and "not made by" in change.reason
    assert (await up(session)).ok
    gone = await down(session)
    assert gone.ok, gone.failures()
    assert groups() == [GROUP]
