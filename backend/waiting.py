"""Waiting on something a provider makes or removes (an EKS cluster, a NAT gateway, a pod, a CRD):
poll a look, say what changed, end at once on a failure that will not resolve, or at a deadline with
the last thing seen. One loop for every target.

Polls start fast and slow down: a DaemonSet is often ready in a second and an EKS cluster takes ten
minutes, so quick things are seen quickly and slow ones cost few requests. With a typical duration
(``expected_s``) the polls settle at a twentieth of it, at most every 15 s (an EKS cluster is asked
about 40 times), and the message says the time left against it; without one they settle at 2 s.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from backend.errors import OperationError
from backend.retry import REAL_CLOCK, Backoff, Clock, Retrying
from backend.runner import Progress

FIRST_POLL_S = 0.05
POLL_FACTOR = 1.5
MAX_POLL_S = 15.0  # with a typical duration: a twentieth of it, never slower than this
UNTIMED_MAX_POLL_S = 2.0  # without one

# Set while a wait looks: a client counts the calls made then as polls (targets/aws/infra/api.AwsApi.counts).
polling: contextvars.ContextVar[bool] = contextvars.ContextVar("rtui_polling", default=False)


@dataclass(frozen=True)
class Look:
    """One look: done yet, what it is doing now, how far along when that is known, or a failure."""

    done: bool
    message: str
    fraction: float | None = None
    fatal: str | None = None  # set: stop waiting, this will not resolve by itself
    remedy: str | None = None  # what to do about ``fatal`` (else the wait's own remedy)


def minutes(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 90 else f"{seconds / 60:.0f} min"


class WaitTimedOut(OperationError):
    """A wait's deadline passed before its look was done (the message says what it last saw)."""


def poll_backoff(expected_s: float | None, poll_s: float | None = None) -> Backoff:
    cap = UNTIMED_MAX_POLL_S if expected_s is None else min(MAX_POLL_S, max(FIRST_POLL_S, expected_s / 20))
    return Backoff(FIRST_POLL_S, POLL_FACTOR, cap if poll_s is None else max(FIRST_POLL_S, poll_s))


async def wait_until(look: Callable[[], Awaitable[Look]], *, what: str, timeout_s: float,
                     expected_s: float | None = None, remedy: str | None = None, poll_s: float | None = None,
                     clock: Clock = REAL_CLOCK) -> AsyncIterator[Progress]:
    """Poll ``look`` until done, yielding its message each time it changes (with ``expected_s``: the
    time left against it, and a fraction from the time). A fatal look ends the wait at once; the
    deadline ends it with the last message (``WaitTimedOut``). ``poll_s``: the slowest the polls
    get, where someone waits on each look (a short-lived pod read right after it ends)."""
    polls = Retrying(poll_backoff(expected_s, poll_s), deadline_s=timeout_s, clock=clock)
    last = ""
    while True:
        token = polling.set(True)
        try:
            state = await look()
        finally:
            polling.reset(token)
        if state.fatal:
            raise OperationError(f"{what}: {state.fatal}", remedy=state.remedy or remedy)
        elapsed = polls.elapsed
        if expected_s is None:
            message, fraction = state.message, state.fraction
        elif state.done:
            message, fraction = f"{state.message} after {minutes(elapsed)}", 1.0
        else:
            left = expected_s - elapsed
            eta = f"about {minutes(left)} left" if left > 0 else f"taking longer than the usual {minutes(expected_s)}"
            message, fraction = f"{state.message} ({eta})", min(0.95, elapsed / expected_s) if expected_s > 0 else None
        if message != last:
            last = message
            yield Progress(message, fraction)
        if state.done:
            return
        if not await polls.again():
            raise WaitTimedOut(f"{what}: still {state.message} after {minutes(polls.elapsed)}", remedy=remedy)


async def wait_done(look: Callable[[], Awaitable[Look]], *, what: str, timeout_s: float,
                    remedy: str | None = None, poll_s: float | None = None, clock: Clock = REAL_CLOCK) -> None:
    """``wait_until`` where nobody shows its progress: returns once done, raises as it does."""
    async for _ in wait_until(look, what=what, timeout_s=timeout_s, remedy=remedy, poll_s=poll_s, clock=clock):
        pass
