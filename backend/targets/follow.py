"""Following a job: its log into the spool, its lines to the caller, its end into the record.

Shared by every target: the Jobs API looks the same on a local head and a KubeRay head.
On reattach the spool already holds part of the log, and only the rest is taken.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from backend.errors import OperationError
from backend.rayjobs import JobStatus
from backend.runner import Progress
from backend.spool import LogSpool
from backend.telemetry import Telemetry

if TYPE_CHECKING:
    from backend.targets.base import Target


class JobFollower:
    """Streams the current job's log into the run's spool and hands out complete lines."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.spool = LogSpool(target.record.spool_path)
        self.last_status: JobStatus | None = None
        self._partial = ""

    def _on_status(self, status: JobStatus) -> None:
        self.last_status = status
        job = self.target.record.current_job
        if job is not None and job.status != status.status:
            job.status = status.status
            job.message = status.message
            job.ended_at = status.end_time
            self.target.save()

    async def chunks_to_lines(self, chunks: AsyncIterator[str]) -> AsyncIterator[list[str]]:
        async for chunk in chunks:
            self.spool.append(chunk)
            text = self._partial + chunk
            parts = text.split("\n")
            self._partial = parts.pop()
            if parts:
                yield [p.rstrip("\r") for p in parts]
        if self._partial:
            yield [self._partial]
            self._partial = ""

    async def catch_up(self) -> list[str]:
        """Spool whatever the job logged since we last looked (one request), return it as lines."""
        job = self.target.record.current_job
        jobs = self.target.jobs()
        if job is None or jobs is None:
            return []
        self._on_status(await jobs.status(job.submission_id))
        text = await jobs.logs(job.submission_id)
        new = text[self.spool.char_count():]
        self.spool.append(new)
        return new.splitlines()

    async def lines(self) -> AsyncIterator[list[str]]:
        """New complete log lines of the current job until it reaches a terminal state."""
        job = self.target.record.current_job
        jobs = self.target.jobs()
        if job is None or jobs is None:
            raise OperationError("no job to follow", remedy="submit one with `rtui up --yes`")
        already = self.spool.char_count()
        self._on_status(await jobs.status(job.submission_id))
        stream = jobs.follow(job.submission_id, skip_chars=already, on_status=self._on_status)
        async for batch in self.chunks_to_lines(stream):
            yield batch
        self._on_status(await jobs.status(job.submission_id))


def follow_job_step(target: Target) -> Callable[[], AsyncIterator[Progress]]:
    """A runner step that lasts as long as the job and reports training progress."""

    async def follow() -> AsyncIterator[Progress]:
        follower = JobFollower(target)
        # The spool is parsed once, by telemetry, continuing where any earlier session stopped.
        telemetry = Telemetry()
        if follower.spool.exists():
            telemetry.replay_file(follower.spool.path)
        steps_total = target.config.steps
        last_emit = last_saved = 0.0
        shown: tuple[str, int | None] = ("", None)
        latest = ""
        async for _lines in follower.lines():  # they are in the spool, which telemetry reads
            telemetry.feed_from(follower.spool.path)
            point = telemetry.series.latest
            if point is not None and point.step is not None:
                latest = (f"step {point.step}/{steps_total} loss {point.loss or float('nan'):.4f} "
                          f"{point.tokens_per_s or 0:,.0f} tok/s")
                now = time.monotonic()
                if now - last_emit >= 0.5 and (latest, point.step) != shown:
                    last_emit = now
                    shown = (latest, point.step)
                    yield Progress(latest, min(1.0, point.step / steps_total))
                if now - last_saved >= 10:
                    last_saved = now
                    target.record.telemetry = telemetry.snapshot(tail=0)
                    target.save()
        target.record.telemetry = telemetry.snapshot(tail=0)
        target.save()
        status = follower.last_status
        if status is None or status.status != "SUCCEEDED":
            state = status.status if status else "UNKNOWN"
            detail = (status.message if status else "") or "see `rtui logs`"
            raise OperationError(f"job {state.lower()}: {detail.splitlines()[0][:200]}",
                                 remedy=f"see `rtui logs {target.record.run_id}`")
        yield Progress(latest or "job succeeded", 1.0)

    return follow
