"""Waiting on a cluster: poll a check, say what changed, give up at a deadline with the reason.

Polls start fast and slow down (a DaemonSet is often ready in a second; an image pull takes
minutes), so quick things are seen quickly and slow ones cost few requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from backend.errors import OperationError
from backend.runner import Progress

FIRST_POLL_S = 0.05
MAX_POLL_S = 2.0


@dataclass(frozen=True)
class Check:
    done: bool
    message: str
    fraction: float | None = None
    fatal: str | None = None  # set: stop waiting, this will not resolve by itself


async def wait_for(check: Callable[[], Awaitable[Check]], *, what: str, timeout_s: float,
                   remedy: str | None = None) -> AsyncIterator[Progress]:
    """Yield progress each time the check's message changes; raise on a fatal answer or the deadline."""
    started = time.monotonic()
    delay = FIRST_POLL_S
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
        waited = time.monotonic() - started
        if waited > timeout_s:
            raise OperationError(f"{what}: not done after {waited:.0f}s ({state.message})", remedy=remedy)
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, MAX_POLL_S)
