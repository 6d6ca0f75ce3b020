"""Issue 41: where a job stopped and went on from a checkpoint, read from its own log lines
(``backend.restarts``), and what took its node, read from the provider's records
(``targets.aws.infra.node_hours.node_losses``, ``backend.resources.attribute``)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from backend.resources import NodeLoss, attribute
from backend.telemetry import Telemetry
from targets.aws.infra.node_hours import node_losses
from training.protocol import METRIC_TAG, RESUME_TAG, format_record
from tui.render import interruption_line, interruptions_words

T0 = 1_800_000_000.0
STEP_S = 2.0


def metric(step: int, ts: float) -> str:
    return "(RayTrainWorker pid=1) " + format_record(METRIC_TAG, {"step": step, "loss": 1.0, "tokens_per_s": 10.0,
                                                                  "step_time_s": STEP_S, "world_size": 2, "ts": ts})


def resume(step: int, node: str, ts: float) -> str:
    return format_record(RESUME_TAG, {"step": step, "from": f"/c/checkpoint_{step:06d}", "node": node, "ts": ts})


def fed(lines: list[str]) -> Telemetry:
    telemetry = Telemetry()
    telemetry.feed_lines(lines)
    return telemetry


def test_a_restart_gives_where_it_stopped_where_it_went_on_the_wait_and_the_time_lost() -> None:
    before = [metric(s, T0 + s * STEP_S) for s in range(1, 13)]  # step 12 at T0+24
    # 100 s without a step, then steps 11.. again from the checkpoint at 10, on another node.
    after = [metric(s, T0 + 24 + 100 + (s - 10) * STEP_S) for s in range(11, 16)]
    (restart,) = fed([*before, resume(10, "node-b", T0 + 120), *after]).series.restarts.found
    assert (restart.at_step, restart.resumed_step, restart.node, restart.redone_steps) == (12, 10, "node-b", 2)
    assert restart.down_s == pytest.approx(100 + STEP_S)  # to step 11's report
    # Back past step 12 at step 13 (T0+130): less the one step it would have made anyway.
    assert restart.lost_s == pytest.approx(130 - 24 - STEP_S)
    line = interruption_line(restart.to_dict())
    assert line == "interrupted at step 12, resumed at step 10 on node-b after 1m42s"


def test_before_it_is_back_past_its_step_the_time_lost_is_not_yet_known() -> None:
    lines = [*(metric(s, T0 + s) for s in range(1, 6)), resume(3, "n", T0 + 50)]
    (restart,) = fed(lines).series.restarts.found
    assert restart.resumed_ts is None and restart.lost_s is None
    assert interruption_line(restart.to_dict()) == "interrupted at step 5, going on from step 3 on n"
    (restart,) = fed([*lines, metric(4, T0 + 60)]).series.restarts.found
    assert restart.down_s == pytest.approx(55) and restart.lost_s is None
    words = interruptions_words({"count": 1, "lost_s": None, "items": [restart.to_dict()]})
    assert words == "1 interruption, 55s lost so far (the job has not yet caught up)"


def test_a_resume_record_ray_printed_twice_is_one_restart() -> None:
    # Seen on a real local drill (tests/test_local_e2e.py): Ray printed the worker's lines twice.
    lines = [*(metric(s, T0 + s) for s in range(1, 7)), resume(5, "w", T0 + 30), resume(5, "w", T0 + 30),
             *(metric(s, T0 + 30 + s) for s in range(6, 9))]
    (restart,) = fed(lines).series.restarts.found
    assert (restart.at_step, restart.resumed_step, restart.back_step) == (6, 5, 7)


def test_a_resume_before_the_first_step_is_the_users_own_resume_from() -> None:
    lines = [resume(40, "n", T0), *(metric(s, T0 + s) for s in range(41, 45))]
    assert fed(lines).series.restarts.found == []


def test_steps_that_start_over_without_a_checkpoint_are_a_restart_from_the_start() -> None:
    lines = [*(metric(s, T0 + s) for s in range(1, 4)), *(metric(s, T0 + 20 + s) for s in range(1, 6))]
    (restart,) = fed(lines).series.restarts.found
    assert (restart.at_step, restart.resumed_step, restart.node) == (3, 0, None)
    assert restart.down_s == pytest.approx(18) and restart.lost_s == pytest.approx((20 + 4) - 3 - STEP_S)


def test_two_restarts_are_two() -> None:
    lines = [*(metric(s, T0 + s) for s in range(1, 9)), resume(5, "a", T0 + 20),
             *(metric(s, T0 + 20 + s) for s in range(6, 12)), resume(10, "b", T0 + 60),
             *(metric(s, T0 + 60 + s) for s in range(11, 15))]
    found = fed(lines).series.restarts.found
    assert [(r.at_step, r.resumed_step, r.node) for r in found] == [(8, 5, "a"), (11, 10, "b")]
    assert all(r.lost_s is not None for r in found)


def _activity(description: str, cause: str, at: float, status: str = "Successful") -> dict[str, Any]:
    when = datetime.fromtimestamp(at, UTC)
    return {"Description": description, "Cause": f"At {when.isoformat()} {cause}", "StartTime": when,
            "EndTime": when, "StatusCode": status}


HEALTH = "an instance was taken out of service in response to an EC2 health check indicating it has been " \
         "terminated or stopped."


def test_only_the_instances_a_group_did_not_choose_to_end_are_losses() -> None:
    activities = [
        _activity("Launching a new EC2 instance: i-0a", "an instance was started in response to a difference "
                  "between desired and actual capacity, increasing the capacity from 0 to 1.", T0),
        _activity("Terminating EC2 instance: i-0a", HEALTH, T0 + 100),
        _activity("Launching a new EC2 instance: i-0b", "an instance was launched in response to an unhealthy "
                  "instance needing to be replaced.", T0 + 101),
        _activity("Terminating EC2 instance: i-0b", "an instance was taken out of service in response to a "
                  "difference between desired and actual capacity, shrinking the capacity from 2 to 1.", T0 + 200),
        _activity("Terminating EC2 instance: i-0c", "an instance was taken out of service in response to a user "
                  "request to delete the group", T0 + 300),
        _activity("Terminating EC2 instance: i-0d", "an instance was taken out of service in response to an EC2 "
                  "instance rebalance recommendation.", T0 + 400),
        _activity("Terminating EC2 instance: i-0e", HEALTH, T0 - 50),  # before the job
    ]
    spot = node_losses(activities, spot=True, since=T0, now=T0 + 1000)
    assert [(x.node, x.cause, x.spot) for x in spot] == [("i-0a", "Spot interruption", True),
                                                         ("i-0d", "Spot rebalance recommendation", True)]
    on_demand = node_losses(activities[:2], spot=False, since=T0, now=T0 + 1000)
    assert [(x.node, x.cause, x.spot) for x in on_demand] == [("i-0a", "instance terminated or stopped", False)]


def test_a_loss_is_the_cause_of_the_restart_whose_moment_it_falls_in() -> None:
    before = [metric(s, T0 + s) for s in range(1, 11)]
    after = [metric(s, T0 + 200 + s) for s in range(9, 13)]
    (restart,) = fed([*before, resume(8, "n", T0 + 150), *after]).series.restarts.found
    early = NodeLoss(T0 - 3600, "i-old", "Spot interruption", spot=True)  # an hour before: another story
    late = NodeLoss(T0 + 500, "i-late", "Spot interruption", spot=True)  # after it went on
    right = NodeLoss(T0 + 40, "i-1", "Spot interruption", spot=True)
    (found,) = attribute([restart], [late, early, right], now=T0 + 600)
    assert found.loss == right and found.cause == "Spot"
    (unknown,) = attribute([restart], [early, late], now=T0 + 600)
    assert unknown.loss is None and unknown.cause is None


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_run_screen_says_where_the_job_stopped_and_went_on(isolated_env: Path,
                                                                    size: tuple[int, int]) -> None:
    """A restart seen in the job's log, on a run whose target cannot say what took the node: the line
    names no cause, and stays whole in the status panel at 80 columns as at 120."""
    from screens.run import RunScreen
    from tests.pilot_wait import wait_for
    from tests.test_tui_dashboard import T0 as DT0
    from tests.test_tui_dashboard import DashboardApp, dashboard_session, feed, metric_lines, settle

    app = DashboardApp(dashboard_session(), resume=True)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), 5, "run screen")
        await settle(pilot)
        await feed(pilot, [*metric_lines(1, 12), resume(10, "node-b", DT0 + 200),
                           *(line.replace(f'"ts":{DT0 + 60 + s * 2.0}', f'"ts":{DT0 + 300 + s * 2.0}')
                             for s, line in zip(range(11, 16), metric_lines(11, 15), strict=True))])
        status = app.screen.query_one("#job-status")
        await wait_for(pilot, lambda: "interrupted at step" in str(status.render()), 5, "the interruption line")
        shown = " ".join(str(status.render()).split())
        # Step 12 at +84 s, step 11 again at +322 s, back past 12 at +326 s (less one step of 2 s).
        assert "interrupted at step 12, resumed at step 10 on node-b after 3m58s" in shown, shown
        assert "1 interruption, 4m00s lost" in shown, shown
        region = status.content_region
        assert region.width <= size[0] and status.size.height >= 2  # the panel grew to hold it, not cut it
