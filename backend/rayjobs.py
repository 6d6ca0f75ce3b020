"""The Ray Jobs API, the same way for every target (local head or a KubeRay head).

Built on ``backend.jobsapi`` (aiohttp, no ``ray`` import): the kube target reaches the
dashboard through the API server's proxy, with a refreshed token, from a machine that may
not have Ray installed.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_lib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from backend.aio import until
from backend.errors import OperationError, TransientError
from backend.jobsapi import WS_HEARTBEAT_S, HeaderProvider, JobsApi, SubmitRefused, TokenRefused
from backend.retry import REAL_CLOCK, Backoff, Clock, Retrying
from backend.store import JobState

RECONNECT = Backoff(first_s=1.0, factor=1.0)  # a tail again, or the job's status, every second
LOG_FETCH_ATTEMPTS = 3


@dataclass(frozen=True)
class JobStatus:
    submission_id: str
    state: JobState
    message: str = ""
    start_time: float | None = None
    end_time: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    entrypoint: str = ""

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def status(self) -> str:
        return self.state.value

    @classmethod
    def from_details(cls, submission_id: str, details: Mapping[str, Any]) -> JobStatus:
        """From Ray's JobDetails (JSON): times are in milliseconds, the status a JobStatus name."""
        try:
            state = JobState(str(details.get("status")))
        except ValueError:
            state = JobState.PENDING
        start, end = details.get("start_time"), details.get("end_time")
        return cls(submission_id, state, str(details.get("message") or ""),
                   start / 1000 if start else None, end / 1000 if end else None,
                   {str(k): str(v) for k, v in (details.get("metadata") or {}).items()},
                   str(details.get("entrypoint") or ""))


class RayJobs:
    """A cluster's jobs. ``headers`` is fixed (the local target's token); ``header_provider``
    is called for every request (a token that expires); ``ssl`` carries a kubeconfig's CA, ``proxy``
    and ``server_hostname`` its proxy and tls-server-name (``KubeApi.ray_jobs`` fills all three);
    ``clock`` is what its reconnects and waits read and sleep on."""

    def __init__(self, address: str, *, headers: Mapping[str, str] | None = None,
                 header_provider: HeaderProvider | None = None, ssl: ssl_lib.SSLContext | None = None,
                 proxy: str | None = None, server_hostname: str | None = None, timeout_s: float = 30.0,
                 stream_idle_s: float = WS_HEARTBEAT_S, clock: Clock = REAL_CLOCK) -> None:
        if headers and header_provider:
            raise ValueError("give either fixed headers or a header provider, not both")
        fixed = dict(headers or {})
        self.api = JobsApi(address, headers=header_provider or (lambda: fixed), ssl=ssl, proxy=proxy,
                           server_hostname=server_hostname, timeout_s=timeout_s, stream_idle_s=stream_idle_s)
        self.address = self.api.base_url
        self.clock = clock

    async def __aenter__(self) -> RayJobs:
        await self.api.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.api.aclose()

    async def version(self, timeout_s: float = 2.0) -> dict[str, Any]:
        return await self.api.version(timeout_s=timeout_s)

    async def answers(self, timeout_s: float = 2.0) -> bool:
        """Whether the dashboard answers now (a cluster that is up). A refused token raises."""
        try:
            await self.version(timeout_s=timeout_s)
        except TransientError:
            return False
        return True

    async def submit(self, *, entrypoint: str, submission_id: str, runtime_env: dict[str, Any],
                     metadata: dict[str, str]) -> str:
        try:
            return await self.api.submit(entrypoint=entrypoint, submission_id=submission_id,
                                         runtime_env=runtime_env, metadata=metadata)
        except SubmitRefused as exc:
            # Ray wraps the agent's refusal in a traceback: look through all of it.
            if f"{submission_id} already exists" in exc.answer.body:
                return submission_id  # an earlier attempt got through before its answer was lost
            # Right after the dashboard answers, the head's job agent may not have registered yet.
            body = exc.answer.body
            retry = exc.transient or "try again" in body or "No available agent" in body
            err = TransientError if retry else OperationError
            raise err(exc.message) from None

    async def status(self, submission_id: str) -> JobStatus:
        return JobStatus.from_details(submission_id, await self.api.job(submission_id))

    async def list(self) -> list[JobStatus]:
        """Every job the cluster knows (submitted through the Jobs API), with its metadata."""
        return [JobStatus.from_details(str(d["submission_id"]), d)
                for d in await self.api.jobs() if d.get("submission_id")]

    async def stop(self, submission_id: str) -> bool:
        """Whether the job was running; False also when it cannot be stopped (gone, ended)."""
        try:
            return await self.api.stop(submission_id)
        except (TransientError, TokenRefused):
            raise
        except OperationError:
            return False

    async def logs(self, submission_id: str) -> str:
        return await self.api.logs(submission_id)

    async def follow(self, submission_id: str, *, skip_chars: int = 0,
                     ended: asyncio.Event | None = None) -> AsyncIterator[str]:
        """Yield new log text until the job ends; reconnects, never yields a character twice.

        Ray's tail replays the log from its beginning, so ``skip_chars`` (what we already hold
        in the spool) is dropped from the front of the stream.

        Ray closes the tail normally only after its agent saw the job terminal and then read the
        log file to its end (``JobManager.tail_job_logs`` in dashboard/modules/job/job_manager.py),
        so such a tail is the whole log and nothing is fetched again. The head also closes it
        normally when its own connection to that agent dies (job_head.py ``tail_job_logs``), so a
        normal close before the job's end time, or a dropped tail, falls back to the full log —
        streamed, taking only what comes after what we hold (``JobsApi.logs_from``).

        That agent sleeps ``LOG_TAIL_SLEEP_S`` (1 s) at every end of the file and asks the job's status
        between reads, so its tail closes seconds after the job ended (3.4 s after the end time on a
        local head here). A caller that learns the job ended sets ``ended``: the tail is let go and
        the rest comes from the full log, which is whole once the job is terminal (the supervisor sets
        that status after the driver, the log's only writer, exited).
        """
        held = skip_chars  # characters from the log's start that the caller has
        reconnects = Retrying(RECONNECT, clock=self.clock)  # no limit: until the job ends
        stop = ended or asyncio.Event()
        while True:
            seen, clean, dropped = 0, False, ""
            try:
                async for chunk in until(self.api.tail(submission_id), stop):
                    start = max(0, held - seen)
                    seen += len(chunk)
                    if start < len(chunk):
                        yield chunk[start:]
                        held = seen
                clean = not stop.is_set()  # let go of: the full log has the rest
            except TransientError as exc:
                # Dropped (a silent peer is noticed by the heartbeat): the pooled connections beside it
                # likely went the same way; decide from the job's status below, on fresh ones.
                dropped = exc.message
                await self.api.fresh_connections()
            closed_at = time.time()
            status = await self._status_after_drop(submission_id)
            if status.terminal:
                if not (clean and _closed_after_end(status, closed_at)):
                    async for text in self._rest_of_log(submission_id, held):
                        yield text
                return
            if dropped:  # a retry, told to the step; a tail the head closed early is only asked again
                reconnects.failed("log tail dropped", f"the job's log tail dropped ({dropped})")
            await reconnects.pause()

    async def _status_after_drop(self, submission_id: str) -> JobStatus:
        """The job's status, asked again on fresh connections while the way to the head recovers."""
        tries = Retrying(RECONNECT, attempts=LOG_FETCH_ATTEMPTS, clock=self.clock)
        while True:
            try:
                return await self.status(submission_id)
            except TransientError as exc:
                if not tries.failed("Jobs API unreachable", f"the job's status: {exc.message}"):
                    raise
                await self.api.fresh_connections()
                await tries.pause()

    async def _rest_of_log(self, submission_id: str, held: int) -> AsyncIterator[str]:
        """The log after its first ``held`` characters, from the full-log endpoint; a read that
        breaks midway is taken up again after what it yielded."""
        tries = Retrying(RECONNECT, attempts=LOG_FETCH_ATTEMPTS, clock=self.clock)
        while True:
            try:
                async for text in self.api.logs_from(submission_id, held):
                    held += len(text)
                    yield text
                return
            except TransientError as exc:
                if not tries.failed("Jobs API unreachable", f"the job's log: {exc.message}"):
                    raise
                await self.api.fresh_connections()
                await tries.pause()


def _closed_after_end(status: JobStatus, closed_at: float) -> bool:
    """Whether a tail that closed at ``closed_at`` (our clock) closed after the job ended.

    Ray's agent closes a finished job's tail a second or two after the end (it sleeps between
    reads), which absorbs that much clock skew; a larger skew only costs a needless fetch.
    Without an end time there is nothing to compare: trust the close."""
    return status.end_time is None or closed_at >= status.end_time


async def submit_when_ready(jobs: RayJobs, *, timeout_s: float = 90.0, first_delay_s: float = 0.5,
                            **kwargs: Any) -> AsyncIterator[str]:
    """Submit, waiting out a job agent that is not registered yet (``first_delay_s``, doubling up to 5 s,
    between tries); yields progress messages."""
    tries = Retrying(Backoff(first_delay_s, 2.0, 5.0), deadline_s=timeout_s, clock=jobs.clock)
    while True:
        try:
            await jobs.submit(**kwargs)
            return
        except TransientError as exc:
            if not tries.failed("job agent not ready", f"submitting the job: {exc.message}"):
                raise OperationError(f"{exc.message} (still after {tries.elapsed:.0f}s)",
                                     remedy="see the head log in the run's temp dir") from None
            yield f"waiting for the job agent ({tries.elapsed:.0f}s)"
            await tries.pause()
