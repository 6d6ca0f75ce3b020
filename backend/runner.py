"""The step runner: a dependency DAG of async steps, run as concurrently as allowed.

The runner owns ordering, retries with backoff for transient errors (``backend.retry``), cancellation
and persistence: it calls ``on_state`` after every transition, so a crash at any
moment leaves an accurate record behind. Steps know nothing about any of that;
they yield progress and raise on failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field

from backend.errors import RtuiError, TransientError
from backend.resources import EventKind, StepEvent
from backend.retry import REAL_CLOCK, Backoff, Clock, Retry, Retrying, set_step_retry_sink
from backend.store import StepState, StepStatus


@dataclass(frozen=True)
class Progress:
    """What a step yields: a message, an optional completed fraction, or a log line."""

    message: str = ""
    fraction: float | None = None
    log: str | None = None


StepAction = Callable[[], AsyncIterator[Progress]]


@dataclass
class Step:
    id: str
    title: str
    action: StepAction
    deps: tuple[str, ...] = ()
    expected_s: float = 1.0
    retries: int = 0
    backoff_s: float = 1.0
    skip_if: Callable[[], bool] | None = field(default=None, repr=False)
    # What this step's duration is kept under (RunStore.record_duration), for the next ETA; "" keeps none.
    timing_key: str = ""
    layer: str = ""  # the layer whose resource it works on ("" for none): its StepState carries it


StateCallback = Callable[[str, StepState], None]

class StepFailed(RtuiError):
    """Raised by ``run_to_completion`` when at least one step failed."""


class Runner:
    def __init__(
        self,
        steps: Iterable[Step],
        *,
        on_state: StateCallback | None = None,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.steps = list(steps)
        ids = [s.id for s in self.steps]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate step ids in {ids}")
        known = set(ids)
        for s in self.steps:
            missing = [d for d in s.deps if d not in known]
            if missing:
                raise ValueError(f"step {s.id} depends on unknown {missing}")
        self._check_acyclic()
        self.states: dict[str, StepState] = {s.id: StepState(title=s.title, layer=s.layer) for s in self.steps}
        self._on_state = on_state or (lambda _sid, _st: None)
        self._clock = clock
        self._queue: asyncio.Queue[StepEvent | None] = asyncio.Queue()

    def _check_acyclic(self) -> None:
        by_id = {s.id: s for s in self.steps}
        done: set[str] = set()
        visiting: set[str] = set()

        def visit(sid: str) -> None:
            if sid in done:
                return
            if sid in visiting:
                raise ValueError(f"dependency cycle through {sid}")
            visiting.add(sid)
            for dep in by_id[sid].deps:
                visit(dep)
            visiting.discard(sid)
            done.add(sid)

        for s in self.steps:
            visit(s.id)

    @property
    def failed(self) -> bool:
        return any(st.status in (StepStatus.FAILED, StepStatus.CANCELLED) for st in self.states.values())

    def _transition(self, sid: str, **changes: object) -> None:
        state = self.states[sid].model_copy(update=changes)
        self.states[sid] = state
        self._on_state(sid, state)

    def _emit(self, event: StepEvent) -> None:
        self._queue.put_nowait(event)

    async def _run_step(self, step: Step) -> None:
        if step.skip_if is not None and step.skip_if():
            self._transition(step.id, status=StepStatus.SKIPPED, message="already in place",
                             started_at=time.time(), ended_at=time.time())
            self._emit(StepEvent(step=step.id, kind=EventKind.SKIPPED, message="already in place"))
            return
        attempt = 0

        def call_retried(retry: Retry) -> None:
            self._emit(StepEvent(step=step.id, kind=EventKind.RETRYING, message=retry.message, cause=retry.cause,
                                 attempt=attempt, data={"delay_s": retry.delay_s, "scope": "call"}))

        def step_retried(retry: Retry) -> None:
            self._transition(step.id, message=retry.message)
            self._emit(StepEvent(step=step.id, kind=EventKind.RETRYING, message=retry.message, cause=retry.cause,
                                 attempt=attempt, data={"delay_s": retry.delay_s, "scope": "step"}))

        set_step_retry_sink(call_retried)  # this task's context only
        tries = Retrying(Backoff(step.backoff_s, jitter="spread"), attempts=step.retries + 1, clock=self._clock,
                         report=step_retried)
        while True:
            attempt += 1
            self._transition(step.id, status=StepStatus.RUNNING, attempts=attempt,
                             started_at=self.states[step.id].started_at or time.time(), error=None)
            # Its typical duration rides along: a view that did not build the step from the plan
            # (teardown panes, `up --json`) still has its ETA.
            self._emit(StepEvent(step=step.id, kind=EventKind.STARTED, message=step.title, attempt=attempt,
                                 data={"expected_s": step.expected_s}))
            try:
                async for update in step.action():
                    if update.log is not None:
                        self._emit(StepEvent(step=step.id, kind=EventKind.LOG, message=update.log, attempt=attempt))
                    if update.message or update.fraction is not None:
                        if update.message:
                            self._transition(step.id, message=update.message)
                        self._emit(StepEvent(step=step.id, kind=EventKind.PROGRESS, message=update.message,
                                             fraction=update.fraction, attempt=attempt))
            except asyncio.CancelledError:
                self._transition(step.id, status=StepStatus.CANCELLED, ended_at=time.time(), error="cancelled")
                self._emit(StepEvent(step=step.id, kind=EventKind.CANCELLED, message="cancelled", attempt=attempt))
                raise
            except TransientError as exc:
                if await tries.again(cause=exc.message, message=str(exc)):
                    continue
                self._fail(step, exc.message, exc.remedy, attempt, exc)
                return
            except RtuiError as exc:
                self._fail(step, exc.message, exc.remedy, attempt, exc)
                return
            except Exception as exc:  # a bug or an unexpected SDK error: keep it, don't crash the run
                self._fail(step, f"{type(exc).__name__}: {exc}", None, attempt)
                return
            self._transition(step.id, status=StepStatus.DONE, ended_at=time.time())
            self._emit(StepEvent(step=step.id, kind=EventKind.DONE, message=self.states[step.id].message,
                                 attempt=attempt))
            return

    def _fail(self, step: Step, cause: str, remedy: str | None, attempt: int, error: RtuiError | None = None) -> None:
        self._transition(step.id, status=StepStatus.FAILED, ended_at=time.time(), error=cause, remedy=remedy)
        self._emit(StepEvent(step=step.id, kind=EventKind.FAILED, message=cause, cause=cause, remedy=remedy,
                             attempt=attempt, error=error))

    async def _schedule(self) -> None:
        pending = {s.id: s for s in self.steps}
        running: dict[asyncio.Task[None], str] = {}
        try:
            while pending or running:
                for sid, step in list(pending.items()):
                    dep_states = [self.states[d].status for d in step.deps]
                    bad = [d for d in step.deps if self.states[d].status in (StepStatus.FAILED, StepStatus.CANCELLED)]
                    if bad:
                        del pending[sid]
                        cause = f"needs {bad[0]}, which did not finish"
                        self._transition(sid, status=StepStatus.CANCELLED, error=cause)
                        self._emit(StepEvent(step=sid, kind=EventKind.CANCELLED, message=cause, cause=cause))
                    elif all(st in (StepStatus.DONE, StepStatus.SKIPPED) for st in dep_states):
                        del pending[sid]
                        running[asyncio.create_task(self._run_step(step), name=f"step:{sid}")] = sid
                if not running:
                    break
                finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    running.pop(task)
                    task.result()
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            for sid in pending:
                self._transition(sid, status=StepStatus.CANCELLED, error="run stopped before this step")
            self._queue.put_nowait(None)

    async def events(self) -> AsyncIterator[StepEvent]:
        """Run every step; yield events as they happen. Closing the iterator cancels the run."""
        scheduler = asyncio.create_task(self._schedule(), name="runner")
        try:
            while True:
                event = await self._queue.get()
                if event is None:
                    break
                yield event
            await scheduler
        finally:
            if not scheduler.done():
                scheduler.cancel()
                await asyncio.gather(scheduler, return_exceptions=True)
