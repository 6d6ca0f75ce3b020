"""A preflight cancelled by its caller as it fails leaves no exception for nobody (CI, issue 37).

`rtui plan --target aws` without credentials printed "Task exception was never retrieved" and a
traceback under its one-line error, now and then. The preflight ran in a task of its own
(``asyncio.wait_for``); its first call failed, and the caller, failing the same way elsewhere,
cancelled it before it woke. ``gather``'s future was done already, but cancelling it cancels the
children still running and counts as a cancel (CPython ``_GatheringFuture.cancel``), so the preflight
woke to the failure, turned it into rtui's error and ended with it; ``wait_for`` had already given
up on that task (Python 3.11 ``_cancel_and_wait``), and nobody read its error. The preflight now runs
in its caller's task under ``asyncio.timeout``: there is no task of its own to leave behind.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import NoCredentialsError

from backend.errors import RtuiError
from targets.aws.cloud import preflight
from targets.aws.cloud.report import PreflightRequest


class _Aws:
    """Enough of an AwsSession for the listing calls, which this test replaces."""

    workers = None

    def endpoint(self, service: str, region: str) -> str:
        return "http://aws.invalid"


async def _run(cancel_after: int, unretrieved: list[str]) -> None:
    never = asyncio.Event()

    async def call(self: Any, service: str, region: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if "describe_regions" in fn.__code__.co_names:
            raise NoCredentialsError()  # the first listing call fails at once
        await never.wait()  # the other is still out when the caller gives up

    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(str(context.get("message"))))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(preflight._Scan, "call", call)
        patch.setattr(preflight, "CallPool", lambda workers, n: None)
        check = asyncio.ensure_future(preflight.run_preflight(PreflightRequest(), session=_Aws(),  # type: ignore[arg-type]
                                                              prices=object()))  # type: ignore[arg-type]
        for _ in range(cancel_after):
            await asyncio.sleep(0)  # models time in event-loop turns (not a wait): the cancel lands at turn k
        check.cancel()  # as all_or_none does when the plan's other half failed first
        await asyncio.gather(check, return_exceptions=True)
    gc.collect()


@pytest.mark.parametrize("cancel_after", range(8))
def test_a_preflight_cancelled_as_it_fails_leaves_no_unretrieved_exception(cancel_after: int) -> None:
    unretrieved: list[str] = []
    asyncio.run(_run(cancel_after, unretrieved))
    gc.collect()
    assert not unretrieved, unretrieved


def test_a_preflight_that_fails_says_it_in_one_error() -> None:
    async def failing() -> None:
        never = asyncio.Event()

        async def call(self: Any, service: str, region: str, fn: Callable[..., Any], *a: Any, **k: Any) -> Any:
            if "describe_regions" in fn.__code__.co_names:
                raise NoCredentialsError()
            await never.wait()

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(preflight._Scan, "call", call)
            patch.setattr(preflight, "CallPool", lambda workers, n: None)
            await preflight.run_preflight(PreflightRequest(), session=_Aws(), prices=object())  # type: ignore[arg-type]

    with pytest.raises(RtuiError, match="no AWS credentials found"):
        asyncio.run(failing())
