"""Concurrency helpers shared by the layers (no Textual, no cloud SDK)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def all_or_none(*calls: Awaitable[Any]) -> list[Any]:
    """``asyncio.gather``, except that the first failure cancels the others and waits for them.

    Plain gather hands on the first error and leaves its other awaitables running behind it: one that
    fails later (or ends with its own error when cancelled) has nobody to hear it, and when the CLI's
    loop ends Python prints "unhandled exception during asyncio.run() shutdown" or "exception was never
    retrieved" and a traceback under rtui's one-line message.
    """
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def until(source: AsyncIterator[T], stop: asyncio.Event) -> AsyncIterator[T]:
    """``source``'s items until it ends or ``stop`` is set, whichever comes first; then ``source`` is closed.

    An item that was still on its way when ``stop`` came is dropped with the source: a caller that stops
    early must know what it was given (it counts what it received) and take the rest from elsewhere."""
    stopped = asyncio.ensure_future(stop.wait())
    item: asyncio.Future[T] | None = None
    try:
        while True:
            item = asyncio.ensure_future(anext(source))
            await asyncio.wait({item, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not item.done():
                return
            try:
                value = item.result()
            except StopAsyncIteration:
                return
            yield value
    finally:
        # Stopped, or cancelled from outside: the pending read goes first, or the source cannot be closed.
        stopped.cancel()
        if item is not None and not item.done():
            item.cancel()
            await asyncio.gather(item, return_exceptions=True)
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
