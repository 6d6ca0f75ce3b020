"""The clients of one session: made when first needed, closed together when the session ends.

A client here is whatever holds connections or threads (an ``AwsApi`` with its boto3 session and
worker threads, a ``KubeApi`` with its request pool). Each layer asks the session's ``Clients`` for
the one it needs by a key that says what makes two the same (the region and profile; the kubeconfig,
context and timeouts; the EKS endpoint and CA); the same key gives the same client for the rest of the
session. Nothing is kept at module level: a second session (the TUI's new config, a test's new world)
starts with none, and ``close``/``async with`` ends every one the session made, threads included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Protocol, TypeVar, cast


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


class ClientsClosed(RuntimeError):
    """A client was asked of a session that has ended (a bug: the session's owner closed it too early)."""


class Clients:
    """The session's clients by key; ``close`` (or leaving ``async with``) closes each once."""

    def __init__(self) -> None:
        self._made: dict[Hashable, Closable] = {}
        self._aliases: dict[Hashable, Hashable] = {}  # e.g. "the EKS cluster of this run" -> its API's key
        self._closed = False

    def get(self, key: Hashable, make: Callable[[], C]) -> C:
        """The client of ``key``, made by ``make`` the first time it is asked for."""
        if self._closed:
            raise ClientsClosed(f"the session's clients are closed (asked for {key!r})")
        if key not in self._made:
            self._made[key] = make()
        return cast(C, self._made[key])  # the same key always holds what its ``make`` made

    def alias(self, name: Hashable, key: Hashable) -> None:
        """Let ``name`` find the client of ``key`` (``aliased``) until ``forget(name)``."""
        self._aliases[name] = key

    def aliased(self, name: Hashable) -> Closable | None:
        key = self._aliases.get(name)
        return None if key is None else self._made.get(key)

    def forget(self, name: Hashable) -> None:
        self._aliases.pop(name, None)

    def __len__(self) -> int:
        return len(self._made)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close every client made (each once, even when two keys hold the same); idempotent."""
        self._closed = True
        made = list({id(c): c for c in self._made.values()}.values())
        self._made.clear()
        self._aliases.clear()
        errors: list[BaseException] = []
        for client in made:
            try:
                client.close()
            except Exception as exc:  # noqa: BLE001 - the others still close; the first is raised after
                errors.append(exc)
        if errors:
            raise errors[0]

    async def aclose(self) -> None:
        # Closing joins worker threads (a call may still be finishing): never on the event loop.
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> Clients:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
