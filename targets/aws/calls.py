"""Blocking boto3 calls run off the event loop, on worker threads that outlive one scan.

Not ``asyncio.to_thread``: its executor is joined when ``asyncio.run`` ends and at
interpreter exit, so one hung region would hold the CLI until its socket timed out.
These workers are daemon threads, so a timed-out region is abandoned for real.

Workers belong to the ``AwsSession`` (see ``AwsSession.workers``), not to one scan: a
re-check from the TUI finds them parked. Starting a thread blocks its starter until the
new thread first gets the GIL, up to a switch interval (5 ms) on a busy machine; the
event loop paid that for every worker of every scan. Idle workers end on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# A worker that waited this long without a job ends; the next call starts a new one.
IDLE_EXIT_S = 60.0


class Workers:
    """Daemon threads taking jobs from one queue; as many as there are jobs waiting."""

    def __init__(self, idle_exit_s: float = IDLE_EXIT_S) -> None:
        self._idle_exit_s = idle_exit_s
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # workers waiting for a job
        self._queued = 0  # jobs put but not yet taken
        self._closed = False
        self.started = 0  # threads started over the pool's life (for tests and benchmarks)

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._queued += 1
            spawn = self._queued > self._idle
            if spawn:
                self.started += 1
        if spawn:
            threading.Thread(target=self._work, name="rtui-aws-call", daemon=True).start()
        self._jobs.put(job)

    def close(self) -> None:
        """Let the idle workers end now (the owner will submit nothing more); a worker busy
        with a hung call ends when that call returns, or after ``idle_exit_s``."""
        with self._lock:
            self._closed = True
            idle = self._idle
        for _ in range(idle):
            self._jobs.put(None)

    def _work(self) -> None:
        while True:
            with self._lock:
                # A worker that was finishing a job when the pool closed was not idle then: it ends
                # here, unless a job still waits (a call submitted just before the close).
                if self._closed and self._queued <= self._idle:
                    return
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self._idle_exit_s)
            except queue.Empty:
                job = None
            with self._lock:
                self._idle -= 1
                if job is None:
                    # A job may have been put in the moment we were told to go, counting on us.
                    if self._queued <= self._idle:
                        return
                    continue
                self._queued -= 1
            job()
            # A finished job's closure holds its scan (clients, event loop): do not keep it
            # alive while parked.
            del job


class CallPool:
    """One scan's view of the workers: at most ``limit`` of its calls in flight at once."""

    def __init__(self, workers: Workers, limit: int) -> None:
        self._workers = workers
        self._semaphore = asyncio.Semaphore(limit)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        async with self._semaphore:
            loop = asyncio.get_running_loop()
            future: asyncio.Future[T] = loop.create_future()

            def settle(ok: bool, value: Any) -> None:
                if not future.done():
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)

            def job() -> None:
                try:
                    outcome: tuple[bool, Any] = (True, fn(*args, **kwargs))
                except BaseException as exc:
                    outcome = (False, exc)
                # RuntimeError: the loop is gone, so nobody is waiting for this answer any more.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(settle, *outcome)

            self._workers.submit(job)
            return await future
