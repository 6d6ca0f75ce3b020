"""The type of pytest-textual-snapshot's `snap_compare` fixture (the plugin's fixture returns an untyped
callable), so snapshot tests are checked by mypy like the rest."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from pathlib import PurePath
from typing import Any, Protocol

from textual.app import App
from textual.pilot import Pilot


class SnapCompare(Protocol):
    def __call__(self, app: str | PurePath | App[Any], press: Iterable[str] = ...,
                 terminal_size: tuple[int, int] = ...,
                 run_before: Callable[[Pilot[Any]], Awaitable[None] | None] | None = ...) -> bool: ...
