"""Issue 41: a Spot GPU node reclaimed mid-job, end to end on the doubles.

The GPU nodegroup is Spot capacity (``--spot``). Mid-job EC2 reclaims one of its instances: the Auto
Scaling group's health check finds it gone, takes it out of service and launches a replacement
(``moto_activities.interrupted``, worded as AWS words them), the lost node leaves the cluster and the
replacement's joins (``eks_nodes.replace_node``), and Ray Train's restart goes on from the last complete
checkpoint on the new node (``fake_ray.RestartingRayHead`` prints what training/loop.py prints then; the
real restart from a checkpoint is tests/training/test_worker_restart.py's, on a real Ray). rtui follows
the job as `up` does, and `rtui status` and the run screen must say where it stopped, that Spot took the
node, where and when it went on, and what that cost.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backend import flows
from backend.session import RunSession
from screens.run import RunScreen
from targets.aws.infra.common import Names
from tests.aws import moto_spot
from tests.aws.conftest import EksKube, World
from tests.aws.provision_world import REGION, down, session_for, tagged, up
from tests.eventually import eventually_async
from tests.kube.crds import crd_dir
from tests.kube.fake_ray import RestartingRayHead
from tests.pilot_wait import wait_for
from tests.test_tui_dashboard import DashboardApp
from tui.render import format_status

pytestmark = pytest.mark.usefixtures("fast_backoff")

STEPS, STOP_AT, CHECKPOINT = 20, 12, 10


async def _follow_to_the_end(session: RunSession) -> None:
    """What `up` does after submitting: follow the job, its lines into the run's spool."""
    async for _update in flows.attach(session):
        pass


@pytest.mark.slow
async def test_a_spot_node_reclaimed_mid_job_is_shown_with_the_step_it_went_on_from_and_the_time_lost(
        world: World, eks_kube: EksKube, kube_file: Path, tmp_path: Path) -> None:
    head = RestartingRayHead(steps=STEPS, stop_at=STOP_AT, checkpoint=CHECKPOINT).start()
    eks_kube.control.jobs_url = head.url
    try:
        session = session_for(spot=True, steps=str(STEPS), kuberay_crds=str(crd_dir(tmp_path)))
        made = await up(session, until=None)
        assert made.ok, made.failures()
        follower = asyncio.create_task(_follow_to_the_end(session))
        await eventually_async(f"the job at step {STOP_AT}", head.stopped.is_set, timeout=60)
        cluster = session.config.cluster_name
        old, new, gone, joined = moto_spot.interrupt(eks_kube.cluster, REGION, cluster, Names(cluster).gpu_nodegroup)
        head.go_on(joined)
        await asyncio.wait_for(follower, 60)

        report = await session.status_report()
        assert report.job_status == "SUCCEEDED"
        (found,) = report.interruptions
        assert (found.restart.at_step, found.restart.resumed_step, found.restart.node) == (STOP_AT, CHECKPOINT, joined)
        assert found.cause == "Spot" and found.loss is not None and found.loss.node == old
        assert found.loss.cause == "Spot interruption"
        down_s, lost_s = found.restart.down_s, found.restart.lost_s
        assert down_s is not None and lost_s is not None and lost_s >= down_s > 0
        data = report.to_dict()["interruptions"]
        assert data["count"] == 1 and data["lost_s"] == pytest.approx(lost_s, abs=0.1)
        text = format_status(report.to_dict())
        assert "restarts  1 interruption (1 Spot), " in text and " lost" in text, text
        assert f"interrupted at step {STOP_AT} (Spot), resumed at step {CHECKPOINT} on {joined} after " in text
        assert gone != joined and new != old

        # The run screen, opened on the finished run, says the same.
        app = DashboardApp(session, resume=True)
        async with app.run_test(size=(160, 40)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), 10, "the run screen")
            status = app.screen.query_one("#job-status")
            await wait_for(pilot, lambda: "(Spot)" in str(status.render()), 20, "the interruption on the run screen")
            shown = " ".join(str(status.render()).split())
            assert f"interrupted at step {STOP_AT} (Spot), resumed at step {CHECKPOINT} on {joined}" in shown, shown
            assert "1 interruption (1 Spot)" in shown and " lost" in shown, shown
    finally:
        head.stop()
    # Textual cancels the run screen's workers as the app ends and does not wait for them: its follow lets
    # go of the run (its lock) a loop turn or two later, and `down` must find the run free.
    await eventually_async("the run screen's follow to let go of the run",
                           lambda: not session.store.is_locked(session.run_id))
    again = RunSession.resume(session.run_id)  # the app closed the session it was given
    assert (await down(again)).ok
    assert tagged(session.run_id) == {}
    again.close()
