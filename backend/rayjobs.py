"""The Ray Jobs API, the same way for every target (local head or a KubeRay head).

Ray is imported lazily: the TUI process must reach its first frame without it.
Blocking SDK calls run in ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from backend.errors import OperationError, TransientError
from backend.store import JobState


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
    def from_info(cls, submission_id: str, info: Any) -> JobStatus:
        raw = str(getattr(info.status, "value", info.status))
        try:
            state = JobState(raw)
        except ValueError:
            state = JobState.PENDING
        return cls(submission_id, state, info.message or "",
                   info.start_time / 1000 if info.start_time else None,
                   info.end_time / 1000 if info.end_time else None,
                   dict(getattr(info, "metadata", None) or {}), str(getattr(info, "entrypoint", "") or ""))


class RayJobs:
    def __init__(self, address: str, *, headers: dict[str, str] | None = None) -> None:
        self.address = address.rstrip("/")
        self.headers = headers or {}
        self._client: Any = None

    async def version(self, timeout_s: float = 2.0) -> dict[str, Any]:
        def fetch() -> dict[str, Any]:
            req = urllib.request.Request(f"{self.address}/api/version", headers=self.headers)
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - our own dashboard
                return dict(json.loads(resp.read()))

        try:
            return await asyncio.to_thread(fetch)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise TransientError(f"Ray dashboard at {self.address} not answering ({exc})") from None

    async def answers(self, timeout_s: float = 2.0) -> bool:
        """Whether the dashboard answers now (a cluster that is up)."""
        try:
            await self.version(timeout_s=timeout_s)
        except TransientError:
            return False
        return True

    async def _sdk(self) -> Any:
        if self._client is None:
            def make() -> Any:
                from ray.job_submission import JobSubmissionClient

                # The SDK logs uploads and websocket closes at INFO to stderr, which would
                # tear through the TUI's screen and the CLI's JSON stream.
                for name in ("ray", "ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk"):
                    logging.getLogger(name).setLevel(logging.WARNING)
                return JobSubmissionClient(self.address, headers=self.headers)

            try:
                self._client = await asyncio.to_thread(make)
            except (ConnectionError, RuntimeError) as exc:
                raise TransientError(f"cannot reach the Ray Jobs API at {self.address}: {exc}") from None
        return self._client

    async def submit(self, *, entrypoint: str, submission_id: str, runtime_env: dict[str, Any],
                     metadata: dict[str, str]) -> str:
        client = await self._sdk()
        try:
            return str(await asyncio.to_thread(
                client.submit_job, entrypoint=entrypoint, submission_id=submission_id,
                runtime_env=runtime_env, metadata=metadata,
            ))
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            if "already exists" in first:
                return submission_id  # an earlier attempt got through before its answer was lost
            # Right after the dashboard answers, the head's job agent may not have registered yet.
            err = TransientError if "try again" in first or "No available agent" in first else OperationError
            raise err(f"job submission failed: {first}") from None

    async def status(self, submission_id: str) -> JobStatus:
        client = await self._sdk()
        try:
            info = await asyncio.to_thread(client.get_job_info, submission_id)
        except RuntimeError as exc:
            raise OperationError(f"cannot read job {submission_id}: {str(exc).splitlines()[0]}") from None
        return JobStatus.from_info(submission_id, info)

    async def list(self) -> list[JobStatus]:
        """Every job the cluster knows (submitted through the Jobs API), with its metadata."""
        client = await self._sdk()
        try:
            infos = await asyncio.to_thread(client.list_jobs)
        except RuntimeError as exc:
            raise OperationError(f"cannot list jobs: {str(exc).splitlines()[0]}") from None
        return [JobStatus.from_info(str(i.submission_id), i) for i in infos if i.submission_id]

    async def stop(self, submission_id: str) -> bool:
        client = await self._sdk()
        try:
            return bool(await asyncio.to_thread(client.stop_job, submission_id))
        except RuntimeError:
            return False

    async def logs(self, submission_id: str) -> str:
        client = await self._sdk()
        return str(await asyncio.to_thread(client.get_job_logs, submission_id))

    async def follow(
        self, submission_id: str, *, skip_chars: int = 0
    ) -> AsyncIterator[str]:
        """Yield new log text until the job ends; reconnects, never yields a character twice.

        Ray's tail replays the log from its beginning, so ``skip_chars`` (what we
        already hold in the spool) is dropped from the front of the stream.
        """
        seen = 0
        while True:
            client = await self._sdk()
            try:
                async for chunk in client.tail_job_logs(submission_id):
                    start = max(0, skip_chars - seen)
                    seen += len(chunk)
                    if start < len(chunk):
                        yield chunk[start:]
            except (TimeoutError, RuntimeError, OSError):
                pass  # connection dropped: decide from the job's status below
            status = await self.status(submission_id)
            if status.terminal:
                # The tail ends when the job ends; fetch the full log once to catch a lost tail.
                text = await self.logs(submission_id)
                if len(text) > max(seen, skip_chars):
                    yield text[max(seen, skip_chars):]
                return
            skip_chars = max(skip_chars, seen)
            seen = 0
            await asyncio.sleep(1.0)


async def submit_when_ready(jobs: RayJobs, *, timeout_s: float = 90.0, **kwargs: Any) -> AsyncIterator[str]:
    """Submit, waiting out a job agent that is not registered yet; yields progress messages."""
    started = time.monotonic()
    delay = 0.5
    while True:
        try:
            await jobs.submit(**kwargs)
            return
        except TransientError as exc:
            waited = time.monotonic() - started
            if waited > timeout_s:
                raise OperationError(f"{exc.message} (still after {waited:.0f}s)",
                                     remedy="see the head log in the run's temp dir") from None
            yield f"waiting for the job agent ({waited:.0f}s)"
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
