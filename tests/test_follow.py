"""Following a job without a cluster: a fake Jobs API drives the follow step's outcomes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from backend.config import resolve_config
from backend.errors import OperationError
from backend.rayjobs import JobStatus
from backend.store import JobRecord, RunStore
from backend.targets.follow import follow_job_step
from backend.targets.local import LocalTarget


class FakeJobs:
    def __init__(self, chunks: list[str], final: str, message: str = "") -> None:
        self.chunks, self.final, self.message = chunks, final, message
        self.address = "http://fake"

    async def status(self, submission_id: str) -> JobStatus:
        return JobStatus(submission_id, self.final, self.message)

    async def logs(self, submission_id: str) -> str:
        return "".join(self.chunks)

    async def follow(self, submission_id: str, *, skip_chars: int = 0,
                     on_status: Callable[[JobStatus], None] | None = None) -> AsyncIterator[str]:
        text = "".join(self.chunks)[skip_chars:]
        for i in range(0, len(text), 7):  # chunks that split lines, as Ray's tail does
            yield text[i:i + 7]
        if on_status:
            on_status(JobStatus(submission_id, self.final, self.message))


def make_target(tmp_path: Path, jobs: FakeJobs) -> LocalTarget:
    config = resolve_config({"steps": "2"}, environ={}).config
    store = RunStore(tmp_path / "state")
    record = store.create(target="local", cluster_name="c", config=config.model_dump(mode="json"))
    record.jobs.append(JobRecord(submission_id="j1", submitted_at=0.0, spec_hash="h"))
    target = LocalTarget(config, record, store)
    target.jobs = lambda: jobs  # type: ignore[method-assign]
    return target


METRICS = ('(RayTrainWorker pid=1) RTUI_METRIC {"step":1,"loss":7.0,"tokens_per_s":100.0,"step_time_s":0.1,'
           '"world_size":2,"ts":1.0}\n'
           '(RayTrainWorker pid=1) RTUI_METRIC {"step":2,"loss":6.5,"tokens_per_s":110.0,"step_time_s":0.1,'
           '"world_size":2,"ts":2.0}\n')


async def test_a_failed_job_fails_the_step_with_its_message(tmp_path: Path) -> None:
    target = make_target(tmp_path, FakeJobs([METRICS, "Traceback...\n"], "FAILED", "Job entrypoint failed\nmore"))
    with pytest.raises(OperationError, match="job failed: Job entrypoint failed"):
        async for _ in follow_job_step(target)():
            pass
    assert target.record.current_job is not None and target.record.current_job.status == "FAILED"
    assert Path(target.record.spool_path).read_text() == METRICS + "Traceback...\n"


async def test_a_succeeded_job_reports_progress_and_keeps_telemetry(tmp_path: Path) -> None:
    target = make_target(tmp_path, FakeJobs([METRICS], "SUCCEEDED"))
    updates = [u async for u in follow_job_step(target)()]
    assert updates[-1].fraction == 1.0 and "step 2/2" in updates[-1].message
    snapshot = RunStore(tmp_path / "state").load(target.record.run_id).telemetry
    assert snapshot is not None and snapshot["metrics"]["latest"]["step"] == 2


async def test_reattaching_never_duplicates_the_spool(tmp_path: Path) -> None:
    target = make_target(tmp_path, FakeJobs([METRICS], "SUCCEEDED"))
    [u async for u in follow_job_step(target)()]
    [u async for u in follow_job_step(target)()]
    assert Path(target.record.spool_path).read_text() == METRICS


def test_apply_steps_follow_the_plan_for_worker_nodes(tmp_path: Path) -> None:
    from backend.model import Action, Change, Plan
    from backend.targets import local

    config = resolve_config({"local_worker_nodes": "2"}, environ={}).config
    store = RunStore(tmp_path / "state")
    target = LocalTarget(config, store.new(target="local", cluster_name="c", config={}), store)
    plan = Plan(target="local", changes=[
        Change(action=Action.NOOP, kind="ray-head", name="c"),
        Change(action=Action.NOOP, kind="ray-worker-node", name="c-worker-0"),
        Change(action=Action.CREATE, kind="ray-worker-node", name="c-worker-1"),
        Change(action=Action.NOOP, kind="ray-job", name="j"),
    ])
    steps = {s.id: s for s in target.apply_steps(plan)}
    assert steps["head"].action is local._noop and steps["worker-0"].action is local._noop
    assert steps["worker-1"].action is not local._noop, "a missing worker node must be started"
    assert steps["job"].action is local._noop


async def test_submission_waits_for_the_job_agent_and_tolerates_a_lost_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    from backend import rayjobs
    from backend.errors import TransientError

    class Client:
        calls = 0

        def submit_job(self, **kwargs: object) -> str:
            Client.calls += 1
            if Client.calls < 3:
                raise RuntimeError("Request failed with status code 500: No available agent to submit job, "
                                   "please try again later..")
            if Client.calls == 3:
                raise RuntimeError("Job with submission_id j1 already exists. Please use a different id.")
            return "j1"

    async def no_sleep(_s: float) -> None:
        return None

    jobs = rayjobs.RayJobs("http://fake")
    jobs._client = Client()
    monkeypatch.setattr(rayjobs.asyncio, "sleep", no_sleep)
    waits = [w async for w in rayjobs.submit_when_ready(jobs, entrypoint="x", submission_id="j1",
                                                         runtime_env={}, metadata={})]
    assert len(waits) == 2 and Client.calls == 3 and "waiting for the job agent" in waits[0]

    class Broken:
        def submit_job(self, **kwargs: object) -> str:
            raise RuntimeError("Request failed with status code 400: bad runtime_env")

    jobs._client = Broken()
    with pytest.raises(OperationError, match="bad runtime_env") as info:
        [w async for w in rayjobs.submit_when_ready(jobs, entrypoint="x", submission_id="j2", runtime_env={},
                                                     metadata={})]
    assert not isinstance(info.value, TransientError)
