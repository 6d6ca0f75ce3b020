"""Concurrency helpers shared by the layers (no Textual, no cloud SDK)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


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
