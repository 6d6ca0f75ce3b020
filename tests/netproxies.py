"""Small real proxies on loopback: an HTTP CONNECT proxy and a SOCKS5 proxy, for the networks users have.

Both run on an event loop of their own in a background thread (like the emulated API server), so
sync tests, async tests and ``rtui`` subprocesses reach them over real TCP. What they copy:

- HTTP CONNECT (RFC 9110 §9.3.6): the client sends ``CONNECT host:port HTTP/1.1`` and headers; the
  proxy opens a TCP connection to ``host:port`` and answers ``200``, then relays bytes both ways (TLS
  goes end to end through the tunnel, the proxy never sees inside it). A target it cannot reach is
  ``502``.
- SOCKS5 (RFC 1928, no authentication): greeting ``05 n methods`` answered ``05 00``; request
  ``05 01 00 ATYP addr port`` with ATYP 1 (IPv4), 3 (a domain name the *proxy* resolves) or 4 (IPv6);
  reply ``05 00 00 01 <bound addr> <port>`` on success, ``05 04`` (host unreachable) otherwise.

``names`` maps host names only the proxy can resolve (as on a bastion or a corporate proxy that sees
a private DNS zone) to loopback: a client that bypasses the proxy cannot even find the server.

``stall()`` is a load balancer that forgets the connections it holds without telling either end (no
FIN, no RST): every tunnel open at that moment stops forwarding in both directions, its sockets stay
open; tunnels opened afterwards work. That is what a client's keepalive or read deadline must notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
import threading
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self


@dataclass
class Tunnel:
    target: str  # "host:port" as the client asked for it
    local_port: int  # the proxy's own port on its connection to the target: the server sees this peer
    stalled: bool = False
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)


class _Proxy:
    kind = "proxy"

    def __init__(self, names: dict[str, str] | None = None) -> None:
        self.names = dict(names or {})
        self.tunnels: list[Tunnel] = []
        self.refused: list[str] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),),
                                        name=f"{self.kind}-proxy", daemon=True)

    # ---- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the {self.kind} proxy did not start")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def url(self) -> str:
        raise NotImplementedError

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        for tunnel in self.snapshot():
            for task in tunnel._tasks:
                task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)

    # ---- what tests read and do ------------------------------------------------------------------------

    def snapshot(self) -> list[Tunnel]:
        with self._lock:
            return list(self.tunnels)

    def targets(self) -> list[str]:
        return [t.target for t in self.snapshot()]

    def local_ports(self) -> set[int]:
        return {t.local_port for t in self.snapshot()}

    def stall(self) -> int:
        """Every open tunnel stops forwarding, silently; new ones work. How many were stalled."""
        count = 0
        for tunnel in self.snapshot():
            if not tunnel.stalled:
                tunnel.stalled, count = True, count + 1
        return count

    # ---- the relay -----------------------------------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def _open(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        address = self.names.get(host.lower(), host)
        try:
            return await asyncio.wait_for(asyncio.open_connection(address, port), 5)
        except (OSError, TimeoutError):
            self.refused.append(f"{host}:{port}")
            return None

    async def _relay(self, target: str, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                     upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        local_port = upstream[1].get_extra_info("sockname")[1]
        tunnel = Tunnel(target, local_port)
        with self._lock:
            self.tunnels.append(tunnel)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    if tunnel.stalled:
                        await asyncio.Event().wait()  # swallow it and hold both sockets open forever
                    dst.write(data)
                    await dst.drain()
            except (OSError, ConnectionError):
                pass
            finally:
                if not tunnel.stalled:
                    with contextlib.suppress(OSError):
                        dst.write_eof()

        tasks = [asyncio.ensure_future(pump(client[0], upstream[1])),
                 asyncio.ensure_future(pump(upstream[0], client[1]))]
        tunnel._tasks = tasks
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks)
        upstream[1].close()


class ConnectProxy(_Proxy):
    """An HTTP proxy that only tunnels (CONNECT), as the proxies in front of API servers do."""

    kind = "http-connect"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        if method.upper() != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        host, _, port = target.rpartition(":")
        upstream = await self._open(host.strip("[]"), int(port))
        if upstream is None:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await self._relay(target, (reader, writer), upstream)


class Socks5Proxy(_Proxy):
    """A SOCKS5 proxy without authentication (what ``ssh -D`` offers)."""

    kind = "socks5"

    @property
    def url(self) -> str:
        return f"socks5://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        version, count = await reader.readexactly(2)
        methods = await reader.readexactly(count)
        if version != 5 or 0 not in methods:
            writer.write(b"\x05\xff")
            return
        writer.write(b"\x05\x00")
        await writer.drain()
        version, command, _, atyp = await reader.readexactly(4)
        if atyp == 1:
            host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
        elif atyp == 3:
            host = (await reader.readexactly((await reader.readexactly(1))[0])).decode("idna")
        elif atyp == 4:
            host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
        else:
            writer.write(b"\x05\x08\x00\x01" + bytes(6))  # address type not supported
            return
        (port,) = struct.unpack("!H", await reader.readexactly(2))
        if version != 5 or command != 1:
            writer.write(b"\x05\x07\x00\x01" + bytes(6))  # command not supported
            return
        upstream = await self._open(host, port)
        if upstream is None:
            writer.write(b"\x05\x04\x00\x01" + bytes(6))  # host unreachable
            return
        bound_host, bound_port = upstream[1].get_extra_info("sockname")[:2]
        writer.write(b"\x05\x00\x00\x01" + socket.inet_aton(bound_host) + struct.pack("!H", bound_port))
        await writer.drain()
        await self._relay(f"{host}:{port}", (reader, writer), upstream)
