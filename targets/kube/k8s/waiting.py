"""Waiting on a cluster: poll a check, say what changed, give up at a deadline with the reason.

Polls start fast and slow down (a DaemonSet is often ready in a second; an image pull takes
minutes), so quick things are seen quickly and slow ones cost few requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from backend.errors import OperationError
from backend.retry import REAL_CLOCK, Backoff, Clock, Retrying
from backend.runner import Progress

FIRST_POLL_S = 0.05
MAX_POLL_S = 2.0
POLLS = Backoff(FIRST_POLL_S, 1.5, MAX_POLL_S)


@dataclass(frozen=True)
class Check:
    done: bool
    message: str
    fraction: float | None = None
    fatal: str | None = None  # set: stop waiting, this will not resolve by itself


async def wait_for(check: Callable[[], Awaitable[Check]], *, what: str, timeout_s: float,
                   remedy: str | None = None, clock: Clock = REAL_CLOCK) -> AsyncIterator[Progress]:
    """Yield progress each time the check's message changes; raise on a fatal answer or the deadline."""
    polls = Retrying(POLLS, deadline_s=timeout_s, clock=clock)
    last = ""
    while True:
        state = await check()
        if state.fatal:
            raise OperationError(f"{what}: {state.fatal}", remedy=remedy)
        if state.message != last:
            last = state.message
            yield Progress(state.message, state.fraction)
        if state.done:
            return
        if not await polls.again():
            raise OperationError(f"{what}: not done after {polls.elapsed:.0f}s ({state.message})", remedy=remedy)
