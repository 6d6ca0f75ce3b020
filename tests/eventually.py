"""One way for a test to wait: on a condition, with a deadline and a message saying what it waited for.

A test never sleeps a fixed time to let something happen; it polls a condition until it holds (or the
deadline passes, and then fails naming what it waited for). A negative check ("nothing happened")
first waits on a positive signal that the moment has passed, then asserts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(what: str, cond: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.02) -> T:
    """The first truthy value of ``cond()``; AssertionError naming ``what`` once ``timeout`` s pass."""
    deadline = time.monotonic() + timeout
    last = cond()
    while not last:
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
        time.sleep(interval)  # the polling interval, not a wait for something to happen
        last = cond()
    return last  # truthy, so not None


async def eventually_async(what: str | Callable[[], str], cond: Callable[[], T | Awaitable[T]],
                           timeout: float = 30.0, interval: float = 0.02,
                           pause: Callable[[float], Awaitable[object]] = asyncio.sleep) -> T:
    """``eventually`` for a test running on an event loop; ``cond`` may be a coroutine function.
    ``what`` may be built when the wait fails (it can describe the state then); ``pause`` is how the
    test yields between polls (``pilot.pause`` lets a Textual app process its messages)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"timed out after {timeout:g} s waiting for {said} (last: {value!r})")
        await pause(interval)  # the polling interval
