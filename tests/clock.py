"""Clocks a test gives to ``backend.retry`` (and what takes one): retries and polls with no real wait.

Nothing is patched: the code under test is handed the clock, as production hands it ``REAL_CLOCK``.
"""

from __future__ import annotations

import asyncio
import time


class TestClock:
    """Time that moves only when slept on: ``sleep(d)`` adds ``d`` at once (and lets the loop run
    other tasks), so a backoff of minutes takes no time and its delays can be read back."""

    __test__ = False  # not a test class, for pytest

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)  # models time: none passes, but the loop runs the other tasks


class FastClock:
    """Real time run ``speedup`` times faster: for a whole flow against a double whose own timings
    are real seconds (a NAT gateway ready after 0.6 s), where a frozen clock would spin."""

    def __init__(self, speedup: float) -> None:
        self.speedup = speedup
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return time.monotonic() * self.speedup

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await asyncio.sleep(seconds / self.speedup)  # models time: the clock's seconds, sped up
