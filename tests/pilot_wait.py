"""Waiting for the app under Pilot. A deadline only matters when the wait fails, so it has a floor:
on a loaded 2-core CI box a screen that takes 6 s instead of 1 s is slow, not wrong."""

from __future__ import annotations

from collections.abc import Callable

from textual.pilot import Pilot

from tests.eventually import eventually_async

FLOOR_S = 20.0


async def wait_for(pilot: Pilot[None], predicate: Callable[[], object], timeout: float,
                   what: str | Callable[[], str], poll: float = 0.1) -> None:
    """``eventually_async`` with the floor, yielding to the app through ``pilot.pause`` between polls."""
    await eventually_async(what, predicate, max(timeout, FLOOR_S), interval=poll, pause=pilot.pause)


def screen_text(pilot: Pilot[None]) -> list[str]:
    """The terminal's text, line by line, as a user sees it (the top screen over the ones below)."""
    return [strip.text for strip in pilot.app.screen._compositor.render_strips()][:pilot.app.size.height]
