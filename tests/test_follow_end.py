"""A job's follow ends when the job does, not when Ray gets round to closing its log tail.

Real HTTP to the fake Ray head (tests/kube/fake_ray.py), whose tail of an ended job stays open
as Ray's agent keeps it (``TAIL_CLOSES_AFTER_S``); here it stays open for ten minutes, so a follow
that waited for it would hang, and the deadline turns that into a failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend import follow
from backend.follow import JobFollower, JobUpdate
from backend.rayjobs import RayJobs
from backend.store import JobState
from tests.eventually import eventually_async
from tests.kube.fake_ray import FakeRayHead, session_following

HANG_S = 600.0  # longer than any test may take: a follow that waits for the tail fails on the deadline


@pytest.fixture
def head() -> Iterator[FakeRayHead]:
    fake = FakeRayHead(steps=3, tail_closes_after_s=HANG_S).start()
    try:
        yield fake
    finally:
        fake.stop()


async def follow_to_the_end(follower: JobFollower) -> list[JobUpdate]:
    async def run() -> list[JobUpdate]:
        return [u async for u in follower.updates()]
    return await asyncio.wait_for(run(), timeout=60)


async def test_a_short_log_is_whole_once_the_job_ended_without_waiting_for_the_tail(
        head: FakeRayHead, tmp_path: Path) -> None:
    async with RayJobs(head.url, stream_idle_s=HANG_S) as jobs:  # no heartbeat drop ends it either
        await jobs.submit(entrypoint="python train.py", submission_id="j1", runtime_env={}, metadata={})
        follower = JobFollower(session_following(tmp_path, "j1"), jobs)
        updates = await follow_to_the_end(follower)
    log = head.jobs["j1"].log
    assert follower.spool.path.read_text() == log  # every line once, the last ones from the full log
    assert [line for u in updates for line in u.lines] == log.splitlines()
    assert follower.last_status is not None and follower.last_status.state is JobState.SUCCEEDED


async def test_a_job_that_had_ended_is_read_whole_without_opening_a_tail_that_stays(
        head: FakeRayHead, tmp_path: Path) -> None:
    async with RayJobs(head.url, stream_idle_s=HANG_S) as jobs:  # no heartbeat drop ends it either
        await jobs.submit(entrypoint="python train.py", submission_id="j1", runtime_env={}, metadata={})
        job = head.jobs["j1"]
        await eventually_async("the fake job to succeed", lambda: job.status == "SUCCEEDED")
        follower = JobFollower(session_following(tmp_path, "j1"), jobs)
        await follow_to_the_end(follower)
    assert follower.spool.path.read_text() == job.log


async def test_a_long_log_waits_for_the_tail_rather_than_download_it_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past LET_GO_MAX_BYTES the follow keeps the tail to its close (here 1 s after the end)."""
    monkeypatch.setattr(follow, "LET_GO_MAX_BYTES", 10)
    fake = FakeRayHead(steps=3, tail_closes_after_s=1.0).start()
    try:
        async with RayJobs(fake.url) as jobs:
            await jobs.submit(entrypoint="python train.py", submission_id="j1", runtime_env={}, metadata={})
            follower = JobFollower(session_following(tmp_path, "j1"), jobs)
            await follow_to_the_end(follower)
        assert follower.spool.path.read_text() == fake.jobs["j1"].log
        assert "/api/jobs/j1/logs/tail" in fake.paths_seen
        assert "/api/jobs/j1/logs" not in fake.paths_seen
    finally:
        fake.stop()
