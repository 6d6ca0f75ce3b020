"""The waits on AWS and on a cluster are one loop (backend/waiting.py) polling through backend.retry: fast
first, slower later, and a deadline read on the clock they are given (no test here waits for real)."""

from __future__ import annotations

import pytest

from backend.errors import OperationError
from backend.waiting import MAX_POLL_S, UNTIMED_MAX_POLL_S, Look, WaitTimedOut, polling, wait_done, wait_until
from tests.clock import TestClock


async def test_an_aws_wait_says_its_phase_and_ends_at_its_deadline_with_it() -> None:
    clock, looks = TestClock(), []

    async def look() -> Look:
        looks.append((clock.now, polling.get()))
        return Look(False, "control plane creating")

    seen = []
    with pytest.raises(OperationError, match="still control plane creating after 30 min"):
        async for p in wait_until(look, what="EKS cluster c", expected_s=600.0, timeout_s=1800.0, clock=clock):
            seen.append(p.message)
    assert seen[0] == "control plane creating (about 10 min left)"
    assert any("taking longer than the usual 10 min" in m for m in seen)
    assert clock.slept[0] == 0.05 and max(clock.slept) == MAX_POLL_S
    assert len(looks) < 160  # half an hour, asked about every 15 s once it settled
    assert all(asked for _, asked in looks)  # what a look calls counts as a poll (AwsApi.counts)


async def test_a_cluster_wait_ends_when_done_and_a_fatal_answer_ends_it_at_once() -> None:
    clock, answers = TestClock(), iter([Look(False, "pulling"), Look(False, "pulling"), Look(True, "ready")])

    async def check() -> Look:
        return next(answers)

    assert [p.message async for p in wait_until(check, what="the Ray head", timeout_s=60.0, clock=clock)] == [
        "pulling", "ready"]
    assert clock.slept == pytest.approx([0.05, 0.075])

    async def fatal() -> Look:
        return Look(False, "pulling", fatal="ErrImagePull")

    with pytest.raises(OperationError, match="the Ray head: ErrImagePull"):
        [p async for p in wait_until(fatal, what="the Ray head", timeout_s=60.0, clock=clock)]

    async def never() -> Look:
        return Look(False, "pending")

    with pytest.raises(OperationError, match=r"the Ray head: still pending after 6\ds"):
        [p async for p in wait_until(never, what="the Ray head", timeout_s=60.0, clock=clock)]
    assert max(clock.slept) == UNTIMED_MAX_POLL_S  # no typical duration: a cluster's pace


async def test_a_short_lived_thing_is_polled_no_slower_than_asked_and_its_deadline_is_its_own_error() -> None:
    """``poll_s`` caps the polls where a caller reads the thing the moment it is done (a volume reader
    pod); the deadline raises ``WaitTimedOut``, which a caller that goes on past it catches alone (an API
    error while looking is not a timeout)."""
    clock = TestClock()

    async def pending() -> Look:
        return Look(False, "phase Pending")

    with pytest.raises(WaitTimedOut) as raised:
        await wait_done(pending, what="the reader pod", timeout_s=30.0, poll_s=0.2, clock=clock)
    assert max(clock.slept) == pytest.approx(0.2)
    assert raised.value.message.startswith("the reader pod: still phase Pending after")

    async def broken() -> Look:
        raise OperationError("the API answered 500")

    with pytest.raises(OperationError) as failed:
        await wait_done(broken, what="the reader pod", timeout_s=30.0, clock=clock)
    assert not isinstance(failed.value, WaitTimedOut)
