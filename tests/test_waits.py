"""The waits on AWS and on a cluster poll through backend.retry: fast first, slower later, and a
deadline read on the clock they are given (no test here waits for real)."""

from __future__ import annotations

import pytest

from backend.errors import OperationError
from targets.aws.infra.api import MAX_POLL_S, Phase, wait_until
from targets.kube.k8s.waiting import Check, wait_for
from tests.clock import TestClock


async def test_an_aws_wait_says_its_phase_and_ends_at_its_deadline_with_it() -> None:
    clock, looks = TestClock(), []

    async def look() -> Phase:
        looks.append(clock.now)
        return Phase(False, "control plane creating")

    seen = []
    with pytest.raises(OperationError, match="still control plane creating after 30 min"):
        async for p in wait_until(look, what="EKS cluster c", expected_s=600.0, timeout_s=1800.0, clock=clock):
            seen.append(p.message)
    assert seen[0] == "control plane creating (about 10 min left)"
    assert any("taking longer than the usual 10 min" in m for m in seen)
    assert clock.slept[0] == 0.05 and max(clock.slept) == MAX_POLL_S
    assert len(looks) < 160  # half an hour, asked about every 15 s once it settled


async def test_a_cluster_wait_ends_when_done_and_a_fatal_answer_ends_it_at_once() -> None:
    clock, answers = TestClock(), iter([Check(False, "pulling"), Check(False, "pulling"), Check(True, "ready")])

    async def check() -> Check:
        return next(answers)

    assert [p.message async for p in wait_for(check, what="the Ray head", timeout_s=60.0, clock=clock)] == [
        "pulling", "ready"]
    assert clock.slept == pytest.approx([0.05, 0.075])

    async def fatal() -> Check:
        return Check(False, "pulling", fatal="ErrImagePull")

    with pytest.raises(OperationError, match="the Ray head: ErrImagePull"):
        [p async for p in wait_for(fatal, what="the Ray head", timeout_s=60.0, clock=clock)]

    async def never() -> Check:
        return Check(False, "pending")

    with pytest.raises(OperationError, match=r"not done after 6\ds \(pending\)"):
        [p async for p in wait_for(never, what="the Ray head", timeout_s=60.0, clock=clock)]
