"""One way to try again: the backoff, the budgets and the clock behind every retry and poll loop.

Every loop that waits between tries (the runner's step retries, one AWS call, the polls of a wait,
the Jobs API reconnects, a pod log's reconnects) keeps a ``Retrying`` and asks it, after each
failure or each look, whether to go on: ``await tries.again(cause=...)`` sleeps the next delay and
says True, or says False when the tries or the deadline are spent (the caller then raises its own
one-line error). A retry given a ``cause`` is reported to the running step (``report_retry``: a
RETRYING event, shown as a retry in the step's pane); a poll gives none and stays quiet.

Why a module of ours and not tenacity (9.2.1, which installs fine here):

- the polls are async generators that yield progress between looks (``wait_until``, ``wait_for``,
  ``RayJobs.follow``, ``read_pod_log``); tenacity retries one call, so each would stay a hand-written
  loop around it;
- one AWS call keeps two budgets: ten tries for throttling and 5xx, and a deadline for IAM settling
  a new role that uses none of those tries;
- the deadline reads the clock it is given, so tests run with no real sleep and patch nothing:
  tenacity takes a ``sleep`` but its ``stop_after_delay`` reads ``time.monotonic()`` itself
  (``RetryCallState.start_time``);
- it is a hundred lines, and no new dependency.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol


class Clock(Protocol):
    """What a retry reads and waits on. ``REAL_CLOCK`` in production; tests give their own."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class _RealClock:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


REAL_CLOCK: Clock = _RealClock()

# full: uniform(0, d), AWS's "full jitter" (spreads a burst of throttled callers the most);
# spread: d × uniform(0.8, 1.2); none: d.
Jitter = Literal["none", "full", "spread"]


@dataclass(frozen=True)
class Backoff:
    """The delays: ``first_s``, then × ``factor`` each time, at most ``cap_s``, then the jitter."""

    first_s: float
    factor: float = 2.0
    cap_s: float = math.inf
    jitter: Jitter = "none"

    def delay(self, n: int, rng: random.Random | None = None) -> float:
        """The ``n``-th delay, from 0."""
        base = min(self.cap_s, self.first_s * self.factor ** max(0, n))
        if self.jitter == "none":
            return base
        r = (rng or _RNG).random()
        return base * r if self.jitter == "full" else base * (0.8 + 0.4 * r)


_RNG = random.Random()


@dataclass(frozen=True)
class Retry:
    """One retry as its step's watchers see it."""

    message: str  # what failed and when it is tried again
    cause: str  # short: an error code, an exception's name, "IAM propagation"
    delay_s: float
    attempt: int  # the try that comes next, from 2


RetrySink = Callable[[Retry], None]

# Set by the runner inside each running step's task: how code deep in a step (an SDK call that
# retries) reports what the step's own progress cannot, such as one throttled call tried again.
_step_retry_sink: contextvars.ContextVar[RetrySink | None] = contextvars.ContextVar(
    "rtui_step_retry_sink", default=None)


def report_retry(retry: Retry) -> None:
    """Tell the running step's watchers that something inside it is tried again (no-op outside a step)."""
    sink = _step_retry_sink.get()
    if sink is not None:
        sink(retry)


def set_step_retry_sink(sink: RetrySink) -> None:
    """The runner calls it at the start of a step's task (the task's own context only)."""
    _step_retry_sink.set(sink)


class Retrying:
    """The state of one retry or poll loop: how many tries failed, the next delay, the deadline.

    ``attempts``: the most tries in all (None: no limit); ``deadline_s``: no retry once this long has
    passed since it was made (None: none); ``report``: where a retry with a cause goes.
    """

    def __init__(self, backoff: Backoff, *, attempts: int | None = None, deadline_s: float | None = None,
                 clock: Clock = REAL_CLOCK, report: RetrySink | None = report_retry,
                 rng: random.Random | None = None) -> None:
        self.backoff = backoff
        self.attempts = attempts
        self.deadline_s = deadline_s
        self.clock = clock
        self._report = report
        self._rng = rng
        self.started = clock.monotonic()
        self.failures = 0  # failed tries (or looks) since the start or the last reset
        self.next_delay_s = backoff.delay(0, rng)

    @property
    def elapsed(self) -> float:
        return self.clock.monotonic() - self.started

    @property
    def expired(self) -> bool:
        return self.deadline_s is not None and self.elapsed > self.deadline_s

    def failed(self, cause: str | None = None, message: str = "") -> bool:
        """Count a failed try; False when no try is left (attempts or deadline). With a ``cause``,
        the retry to come is reported: ``message`` (what failed) and when it is tried again."""
        self.failures += 1
        if (self.attempts is not None and self.failures >= self.attempts) or self.expired:
            return False
        self.next_delay_s = self.backoff.delay(self.failures - 1, self._rng)
        if cause is not None and self._report is not None:
            attempt = self.failures + 1
            text = f"{message or cause}: trying again in {self.next_delay_s:.1f}s (attempt {attempt})"
            self._report(Retry(text, cause, self.next_delay_s, attempt))
        return True

    async def pause(self) -> None:
        """Wait the delay the last failure (or none yet: the first delay) called for."""
        await self.clock.sleep(self.next_delay_s)

    async def again(self, cause: str | None = None, message: str = "") -> bool:
        """``failed`` then, when a try is left, ``pause``: True to go on, False to give up."""
        if not self.failed(cause, message):
            return False
        await self.pause()
        return True

    def reset(self) -> None:
        """A try got through: the next failure starts from the first delay and a full budget."""
        if not self.failures:
            return  # cheap enough to call for every line a stream yields
        self.failures = 0
        self.next_delay_s = self.backoff.delay(0, self._rng)
