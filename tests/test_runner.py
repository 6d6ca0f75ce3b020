from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import pytest

from backend.errors import OperationError, TransientError, UserError
from backend.resources import EventKind, StepEvent
from backend.runner import Progress, Runner, Step
from backend.store import StepState, StepStatus
from tests.clock import TestClock
from tests.eventually import eventually_async


def sleeper(log: list[str], name: str, seconds: float = 0.0,
            fail: Exception | None = None) -> Callable[[], AsyncIterator[Progress]]:
    async def action() -> AsyncIterator[Progress]:
        log.append(f"start:{name}")
        yield Progress(f"{name} working", 0.5)
        await asyncio.sleep(seconds)  # models time: how long the step works (30 s: one still running when cancelled)
        if fail is not None:
            raise fail
        log.append(f"end:{name}")

    return action


async def collect(runner: Runner) -> list[StepEvent]:
    return [event async for event in runner.events()]


def meets(log: list[str], name: str, other: str) -> Callable[[], AsyncIterator[Progress]]:
    """A step that ends only once ``other`` has started: two of them finish only if they overlap."""
    async def action() -> AsyncIterator[Progress]:
        log.append(f"start:{name}")
        yield Progress(f"{name} working", 0.5)
        await eventually_async(f"{other} to start while {name} runs", lambda: f"start:{other}" in log, timeout=10)
        log.append(f"end:{name}")

    return action


async def test_dependencies_order_steps_and_independent_steps_overlap() -> None:
    log: list[str] = []
    steps = [
        Step("a", "A", meets(log, "a", "b")),
        Step("b", "B", meets(log, "b", "a")),
        Step("c", "C", sleeper(log, "c"), deps=("a", "b")),
    ]
    events = await collect(Runner(steps))  # a and b run concurrently, or neither ends
    assert {e.step for e in events if e.kind is EventKind.FAILED} == set(), events
    assert log.index("start:c") > log.index("end:a") and log.index("start:c") > log.index("end:b")
    assert {e.step for e in events if e.kind is EventKind.DONE} == {"a", "b", "c"}


async def test_transient_errors_are_retried_with_backoff_then_succeed() -> None:
    attempts = []

    async def flaky() -> AsyncIterator[Progress]:
        attempts.append(1)
        if len(attempts) < 3:
            raise TransientError("throttled")
        yield Progress("ok")

    clock = TestClock()
    runner = Runner([Step("s", "S", flaky, retries=3, backoff_s=1.0)], clock=clock)
    events = await collect(runner)
    delays = clock.slept
    assert len(attempts) == 3
    retries = [e for e in events if e.kind is EventKind.RETRYING]
    assert len(retries) == 2 and all(e.cause == "throttled" and e.data["scope"] == "step" for e in retries)
    assert 0.8 <= delays[0] <= 1.2 and 1.6 <= delays[1] <= 2.4  # exponential, with jitter
    assert runner.states["s"].status is StepStatus.DONE and runner.states["s"].attempts == 3


async def test_retries_exhausted_and_permanent_errors_fail_without_retry() -> None:
    calls = {"t": 0, "p": 0}

    async def transient() -> AsyncIterator[Progress]:
        calls["t"] += 1
        raise TransientError("still throttled")
        yield Progress()  # pragma: no cover

    async def permanent() -> AsyncIterator[Progress]:
        calls["p"] += 1
        raise OperationError("quota exceeded", remedy="ask for more")
        yield Progress()  # pragma: no cover

    runner = Runner([Step("t", "T", transient, retries=2), Step("p", "P", permanent, retries=5)], clock=TestClock())
    events = await collect(runner)
    assert calls == {"t": 3, "p": 1}
    failed = {e.step: e for e in events if e.kind is EventKind.FAILED}
    assert failed["p"].remedy == "ask for more" and failed["t"].cause == "still throttled"
    assert runner.failed


async def test_failure_cancels_dependents_but_not_independent_steps() -> None:
    log: list[str] = []
    steps = [
        Step("bad", "Bad", sleeper(log, "bad", fail=UserError("nope"))),
        Step("after", "After", sleeper(log, "after"), deps=("bad",)),
        Step("other", "Other", sleeper(log, "other", 0.05)),
    ]
    runner = Runner(steps)
    await collect(runner)
    assert runner.states["after"].status is StepStatus.CANCELLED
    assert "needs bad" in (runner.states["after"].error or "")
    assert runner.states["other"].status is StepStatus.DONE
    assert "start:after" not in log


async def test_unexpected_exceptions_become_failed_steps() -> None:
    runner = Runner([Step("x", "X", sleeper([], "x", fail=KeyError("boom")))])
    events = await collect(runner)
    assert events[-1].kind is EventKind.FAILED and "KeyError" in events[-1].message


async def test_closing_the_event_stream_cancels_running_steps_and_persists() -> None:
    saved: list[tuple[str, StepStatus]] = []
    runner = Runner(
        [Step("long", "Long", sleeper([], "long", 30)), Step("next", "Next", sleeper([], "n"), deps=("long",))],
        on_state=lambda sid, st: saved.append((sid, st.status)),
    )
    stream = runner.events()
    assert isinstance(stream, AsyncGenerator)
    async for event in stream:
        if event.kind is EventKind.PROGRESS:
            break
    await stream.aclose()
    assert runner.states["long"].status is StepStatus.CANCELLED
    assert runner.states["next"].status is StepStatus.CANCELLED
    assert ("long", StepStatus.CANCELLED) in saved


async def test_state_is_persisted_after_every_transition() -> None:
    snapshots: list[tuple[str, StepState]] = []
    runner = Runner([Step("a", "A", sleeper([], "a"))], on_state=lambda sid, st: snapshots.append((sid, st)))
    await collect(runner)
    statuses = [st.status for _, st in snapshots]
    assert statuses[0] is StepStatus.RUNNING and statuses[-1] is StepStatus.DONE
    assert any(st.message == "a working" for _, st in snapshots)
    final = snapshots[-1][1]
    assert final.started_at is not None and final.ended_at is not None and final.duration_s is not None


async def test_skip_if_marks_step_skipped_and_dependents_still_run() -> None:
    log: list[str] = []
    runner = Runner([Step("a", "A", sleeper(log, "a"), skip_if=lambda: True),
                     Step("b", "B", sleeper(log, "b"), deps=("a",))])
    await collect(runner)
    assert runner.states["a"].status is StepStatus.SKIPPED and log == ["start:b", "end:b"]


def test_invalid_graphs_are_rejected() -> None:
    with pytest.raises(ValueError, match="cycle"):
        Runner([Step("a", "A", sleeper([], "a"), deps=("b",)), Step("b", "B", sleeper([], "b"), deps=("a",))])
    with pytest.raises(ValueError, match="unknown"):
        Runner([Step("a", "A", sleeper([], "a"), deps=("zz",))])
    with pytest.raises(ValueError, match="duplicate"):
        Runner([Step("a", "A", sleeper([], "a")), Step("a", "A2", sleeper([], "a"))])
