"""The worker threads calls run on, and the calls a scan makes (how many, not what they say)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import pytest

from targets.aws.calls import Workers
from targets.aws.cloud import PreflightRequest, run_preflight
from targets.aws.session import AwsSession
from tests.aws.conftest import World
from tests.eventually import eventually


def wait_until(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    """True once ``predicate()`` holds (``eventually``'s error, naming the line, if it never does)."""
    eventually(f"the condition at line {predicate.__code__.co_firstlineno}", predicate, timeout)
    return True


def new_threads(before: set[threading.Thread]) -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "rtui-aws-call"} - before


def test_workers_start_one_thread_per_waiting_job_and_reuse_idle_ones() -> None:
    workers = Workers()
    gate = threading.Event()
    done: list[int] = []
    def after_gate(i: int) -> None:
        gate.wait(5)
        done.append(i)

    for i in range(3):
        workers.submit(functools.partial(after_gate, i))
    assert workers.started == 3  # three jobs waiting at once: three threads
    gate.set()
    assert wait_until(lambda: len(done) == 3)
    assert wait_until(lambda: workers._idle == 3)
    for i in range(3):
        workers.submit(functools.partial(done.append, i))
    assert wait_until(lambda: len(done) == 6)
    assert workers.started == 3  # the parked ones took them
    workers.close()


@pytest.mark.slow
def test_idle_workers_end_after_the_idle_timeout_and_on_close() -> None:
    before = set(threading.enumerate())
    workers = Workers(idle_exit_s=0.05)
    workers.submit(lambda: None)
    ours = new_threads(before)
    assert len(ours) == 1
    assert wait_until(lambda: not any(t.is_alive() for t in ours))  # timed out and ended
    ran = threading.Event()
    workers.submit(ran.set)  # a new thread picks up the next call
    assert ran.wait(5) and workers.started == 2

    before = set(threading.enumerate())
    patient = Workers(idle_exit_s=60)
    ran = threading.Event()
    patient.submit(ran.set)
    ours = new_threads(before)
    assert ran.wait(5) and wait_until(lambda: patient._idle == 1)
    patient.close()
    assert wait_until(lambda: not any(t.is_alive() for t in ours))


async def test_a_shared_session_reuses_its_worker_threads(world: World) -> None:
    aws = AwsSession()
    await run_preflight(PreflightRequest(all_regions=True), session=aws)
    started = aws.workers.started
    assert started > 20  # dozens of calls were in flight at once
    # A worker parks itself just after it hands its answer back: let the last ones park.
    assert wait_until(lambda: aws.workers._idle == started)
    await run_preflight(PreflightRequest(regions=["us-east-1", "eu-west-1"]), session=aws)
    assert aws.workers.started == started  # the re-check found enough parked threads
    aws.close()


@pytest.mark.slow
async def test_a_denied_pricing_api_costs_one_call_per_scan(world: World) -> None:
    report = await run_preflight(PreflightRequest(all_regions=True))
    pricing = [c for c in world.script.calls if c[0] == "pricing"]
    assert len(pricing) == 1
    assert {r.price_source for r in report.regions if r.enabled} == {"estimate, us-east-1 prices"}


@pytest.mark.slow
async def test_a_working_pricing_api_is_asked_for_every_region_and_type(world: World) -> None:
    world.script.pricing_denied = False
    world.script.prices.update({("us-east-1", "g6.12xlarge"): 4.6016, ("us-east-1", "m7i.xlarge"): 0.2016})
    report = await run_preflight(PreflightRequest(regions=["us-east-1", "us-east-2", "eu-west-1"]))
    pricing = [c for c in world.script.calls if c[0] == "pricing"]
    # It answered, so nobody gave up on it: per region two instance types and the five other parts
    # (EKS, NAT hours and bytes, gp3, public IPv4), none of them twice.
    assert len(pricing) == 3 * 7
    by_region = {r.region: r.price_source for r in report.regions}
    # Only us-east-1's instances are quoted (its other parts are not): every region's total is an estimate.
    assert set(by_region.values()) == {"estimate, us-east-1 prices"}
