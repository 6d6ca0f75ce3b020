"""Following a job: its log into the spool, its lines and its live status to the caller.

Shared by every target: the Jobs API looks the same on a local head and a KubeRay head.
On reattach the spool already holds part of the log, and only the rest is taken. The
status is polled beside the log stream, so a caller sees PENDING turn RUNNING even while
the job prints nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backend.errors import OperationError
from backend.rayjobs import JobStatus, RayJobs

if TYPE_CHECKING:
    from backend.session import RunSession

STATUS_EVERY_S = 1.0  # also how soon after its end a job's follow lets go of Ray's slow-closing tail
# Letting go of the tail costs a download of the whole log again (Ray's log endpoint has no range):
# worth the seconds it saves only while the log is short. Most runs' logs are well under this (a
# 1,000-step run prints ~0.5 MB); a long one waits for Ray to close its tail, as does a tail still
# delivering (a follow behind a fast printer: what it holds says nothing of the log's length).
LET_GO_MAX_BYTES = 2 * 2**20
# A tail with nothing for this long has caught up with the log; one still working off a backlog sends
# its next piece sooner (Ray's agent reads the file in a loop and sleeps only at its end).
QUIET_S = 0.25


@dataclass(frozen=True)
class JobUpdate:
    """New complete log lines and/or the job's latest status."""

    lines: list[str] = field(default_factory=list)
    status: JobStatus | None = None


class JobFollower:
    """Streams the current job's log into the run's spool and hands out complete lines."""

    def __init__(self, session: RunSession, jobs: RayJobs) -> None:
        self.session = session
        self.jobs = jobs
        self.job = session.record.current_job  # the job followed, fixed now: a later submission has its own
        self.spool = session.spool(self.job)
        self.last_status: JobStatus | None = None
        self._partial = ""

    def _on_status(self, status: JobStatus) -> bool:
        """Keep the record's job in step with the live one; True when the status changed."""
        changed = self.last_status is None or (status.state, status.message) != (
            self.last_status.state, self.last_status.message)
        self.last_status = status
        job = self.job
        if job is not None and (job.status is not status.state or job.message != status.message):
            job.status, job.message, job.ended_at = status.state, status.message, status.end_time
            self.session.store.save(self.session.record)
        return changed

    def _split(self, chunk: str) -> list[str]:
        self.spool.append(chunk)
        parts = (self._partial + chunk).split("\n")
        self._partial = parts.pop()
        return [p.rstrip("\r") for p in parts]

    async def catch_up(self) -> list[str]:
        """Spool whatever the job logged since we last looked (one request), return it as lines."""
        job = self.job
        if job is None:
            return []
        self._on_status(await self.jobs.status(job.submission_id))
        text = await self.jobs.logs(job.submission_id)
        new = text[self.spool.char_count():]
        self.spool.append(new)
        return new.splitlines()

    async def updates(self) -> AsyncIterator[JobUpdate]:
        """Lines and status changes of the current job until it reaches a terminal state."""
        job = self.job
        if job is None:
            raise OperationError("no job to follow", remedy="submit one with `rtui up --yes`")
        sid = job.submission_id
        queue: asyncio.Queue[JobUpdate | None] = asyncio.Queue()
        first = await self.jobs.status(sid)
        self._on_status(first)
        yield JobUpdate(status=first)
        already = self.spool.char_count()
        # Ray closes an ended job's tail seconds late (RayJobs.follow): once the job has ended, the
        # tail has gone quiet and the log is short, the rest is read whole from the full log instead.
        # A job that had ended before we came is read that way at once: its tail would replay it all.
        ended = asyncio.Event()
        if first.terminal:
            ended.set()
        last_text = time.monotonic()  # when log text last came

        async def stream() -> None:
            nonlocal last_text
            try:
                async for chunk in self.jobs.follow(sid, skip_chars=already, ended=ended):
                    last_text = time.monotonic()
                    lines = self._split(chunk)
                    if lines:
                        queue.put_nowait(JobUpdate(lines=lines))
                if self._partial:
                    queue.put_nowait(JobUpdate(lines=[self._partial]))
                    self._partial = ""
            finally:
                queue.put_nowait(None)

        async def poll() -> None:
            while not ended.is_set():
                await asyncio.sleep(STATUS_EVERY_S)
                with contextlib.suppress(OperationError):
                    status = await self.jobs.status(sid)
                    if self._on_status(status):
                        queue.put_nowait(JobUpdate(status=status))
                    quiet = time.monotonic() - last_text >= QUIET_S
                    if status.terminal and quiet and self.spool.size() <= LET_GO_MAX_BYTES:
                        ended.set()

        streamer = asyncio.create_task(stream())
        poller = asyncio.create_task(poll())
        try:
            while (update := await queue.get()) is not None:
                yield update
            await streamer  # re-raises what stopped the stream
        finally:
            for task in (streamer, poller):
                task.cancel()
            await asyncio.gather(streamer, poller, return_exceptions=True)
        final = await self.jobs.status(sid)
        if self._on_status(final):
            yield JobUpdate(status=final)
