"""A layer's concurrent work stops whole when one part fails: nothing is left running behind the error.

A stress run of the suite caught `rtui plan --target aws` without credentials printing 73 lines:
"unhandled exception during asyncio.run() shutdown" and the traceback of AwsLayer._topology. The layer's
preparation ran the preflight, the prices and the endpoint checks with a plain ``asyncio.gather``; the
prices failed first (no credentials), the gather returned that error at once and left the preflight
running; it failed too a moment later, with nobody left to hear it, and asyncio.run's shutdown printed
it under rtui's one-line message. Which part fails first depends on the machine's load: here it is
made certain.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backend.errors import UserError
from targets.aws.infra import layer as aws_layer
from targets.aws.infra.layer import AwsLayer


def run_collecting_loop_errors(main: Any) -> tuple[BaseException | None, list[str]]:
    """Run ``main()`` as the CLI does (asyncio.run) and return its error and what the loop reported."""
    reported: list[str] = []
    error: BaseException | None = None

    async def wrapped() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context["message"]))
        await main()

    try:
        asyncio.run(wrapped())
    except BaseException as exc:  # noqa: BLE001 - the test reads it
        error = exc
    return error, reported


def test_a_failed_part_of_the_aws_preparation_stops_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    state: dict[str, Any] = {}

    async def topology_failing_later(self: AwsLayer, ctx: Any) -> Any:
        """The preflight, still waiting on its AWS calls when the prices fail. Cancelled, it ends with its
        own error all the same, as the real one did: its inner gather had its calls' NoCredentialsError
        by then, and a gather hands on a child's error even to a cancelled caller."""
        state["topology"] = "running"
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            state["topology"] = "stopped"
            raise UserError("no AWS credentials found (from the preflight)") from None

    async def prices_failing_at_once(self: AwsLayer, ctx: Any) -> Any:
        # Started after the preflight (the gather starts its parts in order), it fails on its first step.
        raise UserError("no AWS credentials found (from the prices)")

    async def nothing(*args: Any) -> None:
        return None

    monkeypatch.setattr(AwsLayer, "_topology", topology_failing_later)
    monkeypatch.setattr(AwsLayer, "_region_prices", prices_failing_at_once)
    monkeypatch.setattr(AwsLayer, "_api_cidrs", nothing)
    monkeypatch.setattr(AwsLayer, "_data_bucket", nothing)
    monkeypatch.setattr(aws_layer, "missing_endpoint_note", nothing)
    monkeypatch.setattr(aws_layer, "aws_api", lambda ctx: None)

    async def main() -> None:
        try:
            await AwsLayer().prepare(ctx=None)  # type: ignore[arg-type]  # every part that reads it is replaced
        finally:
            state["when_prepare_ended"] = state["topology"]
    error, reported = run_collecting_loop_errors(main)
    assert isinstance(error, UserError) and "from the prices" in error.message
    assert state["when_prepare_ended"] == "stopped"  # by the preparation, not later by asyncio.run's shutdown
    assert reported == []
