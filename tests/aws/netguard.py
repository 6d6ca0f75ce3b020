"""A guard that fails an aws test which reaches for a non-loopback address.

The aws tests run against doubles on 127.0.0.1 only (moto's server, the Kubernetes emulator, the
registry double): a connection anywhere else is a test that depends on the real Internet (slow,
flaky, offline-different). Python's own ``socket`` is wrapped, in this process and, through
``netguard_site/sitecustomize.py`` on ``PYTHONPATH``, in every ``rtui`` subprocess a test starts.
The attempt is refused (an ``OSError``, as an unreachable network gives) *and* recorded: product
code is right to swallow a network error, so the fixture fails the test on the record, not on the
exception.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from unittest.mock import patch

SITE_DIR = Path(__file__).parent / "netguard_site"
LOG_ENV = "NETGUARD_TEST_LOG"
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


class NonLoopbackConnection(OSError):
    pass


def is_loopback(host: object) -> bool:
    if not isinstance(host, str | bytes):
        return True  # AF_UNIX paths and the like
    name = host.decode() if isinstance(host, bytes) else host
    if name in _LOOPBACK_NAMES or name == "":
        return True
    try:
        return ipaddress.ip_address(name.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def install(log: list[str]) -> Any:
    """Wrap the socket module; returns a function that restores it."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def refuse(what: str) -> NonLoopbackConnection:
        log.append(what)
        path = os.environ.get(LOG_ENV)
        if path:
            with open(path, "a") as out:
                out.write(what + "\n")
        return NonLoopbackConnection(f"test network guard: {what} is not loopback")

    def connect(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not is_loopback(address[0]):
            raise refuse(f"connect {address[0]}:{address[1]}")
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not is_loopback(address[0]):
            raise refuse(f"connect {address[0]}:{address[1]}")
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not is_loopback(host):
            raise refuse(f"resolve {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    patches = ExitStack()
    patches.enter_context(patch.object(socket.socket, "connect", connect))
    patches.enter_context(patch.object(socket.socket, "connect_ex", connect_ex))
    patches.enter_context(patch.object(socket, "getaddrinfo", getaddrinfo))
    return patches.close
