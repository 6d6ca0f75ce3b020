"""``backend.aio.until``: a source's items until a stop, the source closed either way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from backend.aio import until
from tests.eventually import eventually_async


class Source:
    """Yields what is put in ``queue``; records that it was closed (its ``finally`` ran)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.closed = False

    async def items(self) -> AsyncIterator[str]:
        try:
            while True:
                yield await self.queue.get()
        finally:
            self.closed = True


async def test_items_come_until_the_stop_then_the_waiting_source_is_closed() -> None:
    source, stop = Source(), asyncio.Event()
    got: list[str] = []

    async def read() -> None:
        async for item in until(source.items(), stop):
            got.append(item)
            if item == "b":
                stop.set()  # the source is now waiting for an item that never comes

    source.queue.put_nowait("a")
    source.queue.put_nowait("b")
    await asyncio.wait_for(read(), timeout=30)
    assert got == ["a", "b"] and source.closed


async def test_a_source_that_ends_ends_it() -> None:
    async def two() -> AsyncIterator[int]:
        yield 1
        yield 2

    assert [i async for i in until(two(), asyncio.Event())] == [1, 2]


async def test_cancelled_from_outside_while_a_read_waits_the_source_is_still_closed() -> None:
    source = Source()
    got: list[str] = []

    async def read() -> None:
        async for item in until(source.items(), asyncio.Event()):
            got.append(item)

    source.queue.put_nowait("a")
    task = asyncio.create_task(read())
    await eventually_async("the first item", lambda: got)  # the next read now waits on the source
    task.cancel()
    results = await asyncio.gather(task, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError), results
    assert source.closed
