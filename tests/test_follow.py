"""Following a job without a cluster: a fake Jobs API behind a real RunSession drives the outcomes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from backend import flows, follow
from backend.errors import OperationError
from backend.layers.base import Context
from backend.ledger import ResourceStatus
from backend.rayjobs import JobStatus, RayJobs
from backend.resolve import resolve_config
from backend.session import RunSession
from backend.store import JobRecord, JobState, RunStore
from targets.local.config import LocalConfig


class FakeJobs(RayJobs):
    """States are handed out one per status call (the last repeats); the log comes in 7-char chunks."""

    def __init__(self, chunks: list[str], states: list[str], message: str = "", pause_s: float = 0.0) -> None:
        super().__init__("http://fake")
        self.chunks, self.states, self.message, self.pause_s = chunks, states, message, pause_s
        self.calls = 0

    async def version(self, timeout_s: float = 2.0) -> dict[str, Any]:
        return {"ray_version": "2.58.0"}

    async def answers(self, timeout_s: float = 2.0) -> bool:
        return True

    async def status(self, submission_id: str) -> JobStatus:
        state = self.states[min(self.calls, len(self.states) - 1)]
        self.calls += 1
        return JobStatus(submission_id, JobState(state), self.message)

    async def logs(self, submission_id: str) -> str:
        return "".join(self.chunks)

    async def follow(self, submission_id: str, *, skip_chars: int = 0,
                     ended: asyncio.Event | None = None) -> AsyncIterator[str]:
        await asyncio.sleep(self.pause_s)  # models time: a job that prints nothing for a while
        text = "".join(self.chunks)[skip_chars:]
        for i in range(0, len(text), 7):  # chunks that split lines, as Ray's tail does
            yield text[i:i + 7]


class FakeCluster:
    def __init__(self, jobs: FakeJobs) -> None:
        self._jobs = jobs

    async def jobs(self, ctx: Context) -> FakeJobs:
        return self._jobs

    def job_env(self, ctx: Context) -> dict[str, str]:
        return {}

    def job_finished(self, ctx: Context) -> None:
        self.finished = True


def make_session(tmp_path: Path, jobs: FakeJobs) -> RunSession:
    config = resolve_config({"steps": "2"}, environ={}).config
    store = RunStore(tmp_path / "state")
    record = store.create(config)
    record.jobs.append(JobRecord(submission_id="j1", submitted_at=0.0, spec_hash="h"))
    session = RunSession(store, record, config)
    session.ctx.cluster = FakeCluster(jobs)
    return session


METRICS = ('(RayTrainWorker pid=1) RTUI_METRIC {"step":1,"loss":7.0,"tokens_per_s":100.0,"step_time_s":0.1,'
           '"world_size":2,"ts":1.0}\n'
           '(RayTrainWorker pid=1) RTUI_METRIC {"step":2,"loss":6.5,"tokens_per_s":110.0,"step_time_s":0.1,'
           '"world_size":2,"ts":2.0}\n')


async def test_a_failed_job_fails_the_step_with_its_message(tmp_path: Path) -> None:
    session = make_session(tmp_path, FakeJobs([METRICS, "Traceback...\n"], ["FAILED"], "Job entrypoint failed\nmore"))
    with pytest.raises(OperationError, match="job failed: Job entrypoint failed"):
        async for _ in flows._train_progress(session):
            pass
    assert session.record.current_job is not None and session.record.current_job.status is JobState.FAILED
    assert Path(session.record.spool_path).read_text() == METRICS + "Traceback...\n"


async def test_a_succeeded_job_reports_progress_and_keeps_telemetry(tmp_path: Path) -> None:
    session = make_session(tmp_path, FakeJobs([METRICS], ["SUCCEEDED"]))
    updates = [u async for u in flows._train_progress(session)]
    assert updates[-1].fraction == 1.0 and "step 2/2" in updates[-1].message
    snapshot = RunStore(tmp_path / "state").load(session.run_id).telemetry
    assert snapshot is not None and snapshot.metrics.latest is not None and snapshot.metrics.latest.step == 2


async def test_reattaching_never_duplicates_the_spool(tmp_path: Path) -> None:
    session = make_session(tmp_path, FakeJobs([METRICS], ["SUCCEEDED"]))
    [u async for u in flows._train_progress(session)]
    [u async for u in flows._train_progress(session)]
    assert Path(session.record.spool_path).read_text() == METRICS


async def test_the_status_is_live_while_the_job_prints_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PENDING turns RUNNING on screen within the poll interval, not when the job ends."""
    monkeypatch.setattr(follow, "STATUS_EVERY_S", 0.05)
    jobs = FakeJobs([METRICS], ["PENDING", "PENDING", "RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"], pause_s=0.5)
    session = make_session(tmp_path, jobs)
    seen: list[tuple[str, int]] = []
    async for update in flows.attach(session):
        if isinstance(update, follow.JobUpdate) and update.status is not None:
            seen.append((update.status.status, len(update.lines)))
    states = [s for s, _ in seen]
    assert states[0] == "PENDING" and "RUNNING" in states and states[-1] == "SUCCEEDED"
    assert states.index("RUNNING") < len(states) - 1, "RUNNING must show before the end"
    assert session.record.current_job is not None and session.record.current_job.status is JobState.SUCCEEDED
    job = RunStore(tmp_path / "state").load(session.run_id).current_job
    assert job is not None and job.status is JobState.SUCCEEDED


async def test_submission_waits_for_the_job_agent_and_tolerates_a_lost_answer() -> None:
    from backend import rayjobs
    from backend.errors import TransientError
    from backend.jobsapi import Answer, JobsApi, SubmitRefused

    def refused(status: int, body: str) -> SubmitRefused:
        return SubmitRefused(Answer(status, body), OperationError(f"job submission failed: {body}"))

    class Client(JobsApi):
        calls = 0

        async def submit(self, *, entrypoint: str, submission_id: str, runtime_env: Mapping[str, Any],
                         metadata: Mapping[str, str]) -> str:
            Client.calls += 1
            if Client.calls < 3:
                raise refused(500, "No available agent to submit job, please try again later.")
            if Client.calls == 3:
                raise refused(500, "Job with submission_id j1 already exists. Please use a different id.")
            return "j1"

    jobs = rayjobs.RayJobs("http://fake")
    jobs.api = Client("http://fake")
    waits = [w async for w in rayjobs.submit_when_ready(jobs, first_delay_s=0.01, entrypoint="x", submission_id="j1",
                                                         runtime_env={}, metadata={})]
    assert len(waits) == 2 and Client.calls == 3 and "waiting for the job agent" in waits[0]

    class Broken(JobsApi):
        async def submit(self, *, entrypoint: str, submission_id: str, runtime_env: Mapping[str, Any],
                         metadata: Mapping[str, str]) -> str:
            raise refused(400, "bad runtime_env")

    jobs.api = Broken("http://fake")
    with pytest.raises(OperationError, match="bad runtime_env") as info:
        [w async for w in rayjobs.submit_when_ready(jobs, entrypoint="x", submission_id="j2", runtime_env={},
                                                     metadata={})]
    assert not isinstance(info.value, TransientError)


class TwoJobs(FakeJobs):
    """A cluster that ran one job per submission id: each has its own log, all SUCCEEDED."""

    def __init__(self, logs: dict[str, str]) -> None:
        super().__init__([], ["SUCCEEDED"])
        self.by_id = logs

    async def submit(self, *, entrypoint: str, submission_id: str, runtime_env: dict[str, Any],
                     metadata: dict[str, str]) -> str:
        return submission_id

    async def logs(self, submission_id: str) -> str:
        return self.by_id[submission_id]

    async def follow(self, submission_id: str, *, skip_chars: int = 0,
                     ended: asyncio.Event | None = None) -> AsyncIterator[str]:
        text = self.by_id[submission_id][skip_chars:]
        for i in range(0, len(text), 7):
            yield text[i:i + 7]


def metric_lines(steps: int) -> str:
    return "".join(f'(RayTrainWorker pid=1) RTUI_METRIC {{"step":{s},"loss":{7.0 - s / 10},"tokens_per_s":100.0,'
                   f'"step_time_s":0.1,"world_size":2,"ts":{float(s)}}}\n' for s in range(1, steps + 1)) \
        + f'RTUI_SUMMARY {{"steps": {steps}, "tokens_per_s_mean": 100.0}}\n'


async def test_each_job_of_a_run_has_its_own_spool_metrics_and_summary(tmp_path: Path) -> None:
    """A 20-step job, then a 5-step one on the same run: the second is followed, reported and
    summarised on its own; the first stays readable (issue 21, item 1)."""
    from backend.layers.ray_job import JOB, RayJobLayer

    store = RunStore(tmp_path / "state")
    record = store.create(LocalConfig(cluster_name="c"))
    jobs = TwoJobs({f"rtui-{record.run_id}-1": metric_lines(20), f"rtui-{record.run_id}-2": metric_lines(5)})

    async def submit_and_follow(steps: int) -> list[str]:
        config = resolve_config({"steps": str(steps)}, environ={}).config
        session = RunSession(store, store.load(record.run_id), config)
        session.ctx.cluster = FakeCluster(jobs)
        layer = RayJobLayer()
        want = next(r for r in layer.desired(session.ctx, []) if r.address == JOB)
        session.ctx.ledger.set(JOB, "ray-job", ResourceStatus.CREATING)
        [p async for p in layer.handlers["ray-job"].create(session.ctx, want)]
        return [p.message async for p in flows._train_progress(session)]

    first = await submit_and_follow(20)
    assert first[-1].startswith("step 20/20")
    second = await submit_and_follow(5)
    assert any(m.startswith("step 5/5") for m in second), second
    assert not any("step 20" in m for m in second), second

    session = RunSession.open(record.run_id, store)
    one, two = session.record.jobs
    assert one.spool_path != two.spool_path
    assert session.spool().path == Path(str(two.spool_path))
    assert session.spool(one).path.read_text() == metric_lines(20)
    assert session.spool().path.read_text() == metric_lines(5)
    report = (await session.status_report()).to_dict()
    assert report["job"]["submission_id"] == two.submission_id and report["job"]["number"] == 2
    assert report["last_metric"]["step"] == 5 and report["summary"]["steps"] == 5
    assert two.telemetry is not None and two.telemetry.metrics.latest is not None
    assert two.telemetry.metrics.latest.step == 5
    assert one.telemetry is not None and one.telemetry.metrics.latest is not None
    assert one.telemetry.metrics.latest.step == 20
    latest = session.telemetry(one).series.latest
    assert latest is not None and latest.step == 20


class StoppableJobs(FakeJobs):
    """Ray's Jobs API around a stop: RUNNING ("Job is currently running.") until stopped, then
    STOPPED with the message Ray's job manager gives a stopped job ("Job was intentionally
    stopped.", ray python/ray/dashboard/modules/job/common.py, JobInfo.__post_init__)."""

    def __init__(self) -> None:
        super().__init__([], ["RUNNING"], "Job is currently running.")
        self.stopped = False

    async def status(self, submission_id: str) -> JobStatus:
        if self.stopped:
            return JobStatus(submission_id, JobState.STOPPED, "Job was intentionally stopped.", end_time=5.0)
        return JobStatus(submission_id, JobState.RUNNING, "Job is currently running.")

    async def stop(self, submission_id: str) -> bool:
        self.stopped = True
        return True


async def test_stopping_a_running_job_records_its_stopped_message(tmp_path: Path) -> None:
    """`D` during a running job: status then says STOPPED with Ray's message for it, not the
    running one it had before (issue 21, item 4)."""
    from backend.layers.ray_job import JOB, JobHandler
    from backend.resources import Observed
    from tui.render import format_status

    jobs = StoppableJobs()
    session = make_session(tmp_path, jobs)
    await flows.catch_up(session)  # an attached rtui saw it running
    assert session.record.jobs[0].message == "Job is currently running."
    have = Observed(address=JOB, layer="ray-job", kind="ray-job", id="j1", state={"status": "RUNNING"})
    [p async for p in JobHandler().delete(session.ctx, have)]
    job = RunStore(tmp_path / "state").load(session.run_id).jobs[0]
    assert (job.status, job.message) == (JobState.STOPPED, "Job was intentionally stopped.")
    text = format_status((await session.status_report()).to_dict())
    assert "j1: STOPPED — Job was intentionally stopped." in text and "currently running" not in text


async def test_the_train_steps_eta_comes_from_earlier_jobs_on_this_machine(tmp_path: Path) -> None:
    """The first job's Train step guesses a minute; the next expects the seconds per step measured (item 8)."""
    from backend.resources import EventKind

    session = make_session(tmp_path, FakeJobs([METRICS], ["SUCCEEDED"]))
    first = [e async for e in flows.follow_steps(session) if e.kind is EventKind.STARTED]
    assert first[0].data["expected_s"] == 60.0
    per_step = session.store.durations()["local/train/per-step"]
    assert 0 < per_step < 30
    second = [e async for e in flows.follow_steps(session) if e.kind is EventKind.STARTED]
    assert second[0].data["expected_s"] == pytest.approx(per_step * session.config.steps)
