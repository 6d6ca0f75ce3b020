"""The one retry helper (backend.retry): its delays, its budgets, its deadline, what it reports."""

from __future__ import annotations

import random

import pytest

from backend.retry import Backoff, Jitter, Retry, Retrying, report_retry, set_step_retry_sink
from tests.clock import TestClock


def test_backoff_grows_by_its_factor_up_to_its_cap() -> None:
    assert [Backoff(0.5, cap_s=3.0).delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert [Backoff(1.0, factor=1.0).delay(n) for n in range(3)] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(("jitter", "low", "high"), [("full", 0.0, 4.0), ("spread", 3.2, 4.8), ("none", 4.0, 4.0)])
def test_jitter_stays_within_its_bounds_and_spreads(jitter: Jitter, low: float, high: float) -> None:
    backoff = Backoff(1.0, cap_s=4.0, jitter=jitter)
    rng = random.Random(7)
    delays = [backoff.delay(5, rng) for _ in range(200)]
    assert all(low <= d <= high for d in delays)
    assert (len(set(delays)) > 100) is (jitter != "none")


async def test_attempts_count_every_try_and_each_retry_is_reported_with_its_cause() -> None:
    clock, seen = TestClock(), list[Retry]()
    tries = Retrying(Backoff(0.5, cap_s=20.0), attempts=4, clock=clock, report=seen.append)
    assert [await tries.again("Throttling", "ec2:DescribeVpcs answered Throttling") for _ in range(4)] == [
        True, True, True, False]
    assert clock.slept == [0.5, 1.0, 2.0]
    assert [(r.cause, r.attempt, r.delay_s) for r in seen] == [("Throttling", 2, 0.5), ("Throttling", 3, 1.0),
                                                              ("Throttling", 4, 2.0)]
    assert seen[0].message == "ec2:DescribeVpcs answered Throttling: trying again in 0.5s (attempt 2)"


async def test_the_deadline_reads_the_given_clock() -> None:
    clock = TestClock()
    polls = Retrying(Backoff(0.05, 1.5, 2.0), deadline_s=60.0, clock=clock)
    looks = 1
    while await polls.again():
        looks += 1
    assert 60.0 < polls.elapsed <= 62.0 and sum(clock.slept) == pytest.approx(polls.elapsed)
    assert max(clock.slept) == 2.0 and clock.slept[:3] == pytest.approx([0.05, 0.075, 0.1125])
    assert looks == len(clock.slept) + 1 < 45  # slow things cost few looks


async def test_a_poll_reports_nothing_and_reset_starts_over() -> None:
    clock, seen = TestClock(), list[Retry]()
    tries = Retrying(Backoff(0.2, 2.0, 2.0), attempts=3, clock=clock, report=seen.append)
    assert await tries.again()  # no cause: a poll, not a retry
    assert tries.failed("log stream broke")
    tries.reset()
    assert tries.failed("log stream broke") and tries.failed("log stream broke")
    assert not tries.failed("log stream broke")  # three in a row
    await tries.pause()
    assert clock.slept == [0.2, 0.4] and [r.cause for r in seen] == ["log stream broke"] * 3


async def test_reports_go_to_the_running_step_and_nowhere_outside_one() -> None:
    report_retry(Retry("x", "y", 1.0, 2))  # outside a step: nothing happens
    seen: list[Retry] = []

    async def in_a_step() -> None:
        set_step_retry_sink(seen.append)
        await Retrying(Backoff(1.0), attempts=2, clock=TestClock()).again("InternalError", "eks:CreateCluster")

    import asyncio

    await asyncio.create_task(in_a_step())
    assert [r.cause for r in seen] == ["InternalError"]
    report_retry(Retry("x", "y", 1.0, 2))
    assert len(seen) == 1  # the step's sink stayed in the step's task
