"""rtui's way to the Ray head's dashboard: the API server's ``pods/portforward``, the service proxy as fallback.

The service proxy (``/api/v1/namespaces/NS/services/SVC:dashboard/proxy``) dials the head over the
pod network from wherever the API server's traffic enters it: the address in Endpoints
``default/kubernetes`` only where the control plane sits on a routed pod network (EKS's VPC CNI).
With Calico IPIP/VXLAN or Canal it is the node's tunnel address; on GKE and AKS a Konnectivity agent
pod makes the dial. A NetworkPolicy admitting the Endpoints addresses drops both, and the proxy times out.

Two ways out were weighed:
- a policy that admits the proxy's real source: Konnectivity agents by label, the tunnel addresses
  from each CNI's node annotations (``projectcalico.org/IPv4IPIPTunnelAddr``, VXLAN, flannel...). It
  needs one discovery per CNI, reading nodes and kube-system (rights a namespace admin lacks), and
  it opens the dashboard to every pod behind those addresses (all Konnectivity traffic).
- ``pods/portforward``: the API server hands the stream to the kubelet, whose runtime dials the port
  on localhost inside the pod's own network namespace (containerd ``sandbox_portforward_linux.go``;
  its fallback dials the pod IP from the node, which policies always admit). No NetworkPolicy sees
  it, whatever the CNI or the control plane's network. It needs ``create pods/portforward`` in the
  namespace, which the ``admin`` and ``edit`` roles hold.

rtui takes the port-forward, over a WebSocket with the kubelet's ``v4.channel.k8s.io`` protocol
(staging k8s.io/kubelet/pkg/cri/streaming/portforward/websocket.go: a data and an error channel per
port, each starting with the port as two little-endian bytes; the API server passes a WebSocket that
is not SPDY tunnelling straight to the kubelet). A loopback listener of its own (like ``kubectl
port-forward``) turns each local connection into one such stream, so the Jobs API client and its log
tail run unchanged. The listener is on 127.0.0.1 of this machine only, and Ray's token still guards
the dashboard behind it. Without the right (403) rtui falls back to the service proxy, which the
policy admits from the Endpoints addresses; when that path is dropped too it says so at once, naming
both ways to fix it, instead of waiting out the submission deadline.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp

from backend.errors import OperationError, TransientError
from backend.jobsapi import SOCKS_SCHEMES, socks_connector

if TYPE_CHECKING:
    import ssl


PROTOCOL = "v4.channel.k8s.io"
DATA, ERROR = 0, 1
PORT_HEADER_BYTES = 2
# One request through a fresh stream: the kubelet's runtime gives its dial 5 s (containerd dialTimeout).
CHECK_TIMEOUT_S = 10.0


class PortForwardForbidden(OperationError):
    """403 on the upgrade: these credentials may not create pods/portforward in the namespace."""


class PortForward:
    """A loopback listener whose every connection is a stream to ``port`` of a pod, through the API
    server's ``pods/portforward``. It runs on a thread and event loop of its own, so it serves whichever
    loop its callers run on (the CLI's, the TUI's), and ``close`` works from any thread."""

    def __init__(self, server: str, namespace: str, pod: str, port: int, *,
                 headers: Callable[[], Mapping[str, str]], ssl: ssl.SSLContext | None = None,
                 proxy: str | None = None, server_hostname: str | None = None) -> None:
        self.target = f"{namespace}/{pod}:{port}"
        self._ws_url = f"{server}/api/v1/namespaces/{namespace}/pods/{pod}/portforward?ports={port}"
        self._headers = headers
        self._proxy = proxy
        self._socks = proxy is not None and proxy.split("://", 1)[0].lower() in SOCKS_SCHEMES
        self._route: dict[str, Any] = {"ssl": ssl if ssl is not None else True}
        if proxy is not None and not self._socks:
            self._route["proxy"] = proxy
        if server_hostname:
            self._route["server_hostname"] = server_hostname
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"port-forward-{pod}", daemon=True)
        self._session: aiohttp.ClientSession | None = None
        self._server: asyncio.Server | None = None
        self.url = ""  # http://127.0.0.1:PORT once started
        self.checked = False  # one request got through once: the path works

    # ---- lifetime ------------------------------------------------------------------------------

    def start(self) -> PortForward:
        self._thread.start()
        if not self._ready.wait(10):
            raise OperationError(f"rtui's port-forward to {self.target} did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._listen())
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._shutdown())
            self._loop.close()

    async def _listen(self) -> None:
        # Created on this loop: aiohttp binds a session (and aiohttp-socks its connector) to it.
        self._session = aiohttp.ClientSession(connector=socks_connector(self._proxy)) if self._socks and \
            self._proxy is not None else aiohttp.ClientSession()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks(self._loop) if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    # ---- streams --------------------------------------------------------------------------------

    async def _open(self) -> aiohttp.ClientWebSocketResponse:
        assert self._session is not None
        try:
            ws: aiohttp.ClientWebSocketResponse = await self._session.ws_connect(
                self._ws_url, protocols=(PROTOCOL,), headers=dict(self._headers()), max_msg_size=0, autoping=True,
                **self._route)
            return ws
        except aiohttp.WSServerHandshakeError as err:
            if err.status == 403:
                raise PortForwardForbidden(f"forbidden: cannot create pods/portforward to {self.target}") from None
            raise OperationError(f"the API server refused a port-forward to {self.target} "
                                 f"(HTTP {err.status} {err.message})") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise TransientError(f"cannot reach the API server for a port-forward to {self.target} "
                                 f"({err or type(err).__name__})") from None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One local connection, one stream: bytes both ways until either side ends."""
        try:
            ws = await self._open()
        except OperationError:
            writer.close()  # the caller sees a dropped connection, as on any broken path
            return
        channels = _Channels()

        async def to_pod() -> None:
            while chunk := await reader.read(64 * 1024):
                await ws.send_bytes(bytes([DATA]) + chunk)

        async def from_pod() -> None:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.BINARY:
                    return
                channel, data = channels.payload(msg.data)
                if channel == DATA and data:
                    writer.write(data)
                    await writer.drain()
                elif channel == ERROR and data:
                    return  # the kubelet could not dial the port: the stream ends

        tasks = [asyncio.ensure_future(to_pod()), asyncio.ensure_future(from_pod())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await ws.close()
            writer.close()

    async def _check(self, path: str, headers: Mapping[str, str]) -> None:
        ws = await self._open()
        channels = _Channels()
        request = "".join([f"GET {path} HTTP/1.0\r\nHost: localhost\r\n",
                           *(f"{k}: {v}\r\n" for k, v in headers.items()), "\r\n"])
        try:
            await ws.send_bytes(bytes([DATA]) + request.encode())
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                async for msg in ws:
                    if msg.type != aiohttp.WSMsgType.BINARY:
                        break
                    channel, data = channels.payload(msg.data)
                    if channel == DATA and data:
                        return  # any answer (Ray's 401 too): the path works
                    if channel == ERROR and data:
                        raise OperationError(f"the port-forward to {self.target} failed: "
                                             f"{' '.join(data.decode('utf-8', 'replace').split())[:300]}")
        except TimeoutError:
            raise OperationError(f"no answer through the port-forward to {self.target} "
                                 f"within {CHECK_TIMEOUT_S:g}s") from None
        finally:
            await ws.close()
        raise OperationError(f"the port-forward to {self.target} closed without an answer")

    async def check(self, path: str = "/", headers: Mapping[str, str] | None = None) -> None:
        """Send one GET of ``path`` (with ``headers``: the service's own auth) through a fresh stream; raises
        PortForwardForbidden on 403, OperationError when the stream carries no answer. Once passed, it is
        not asked again."""
        if self.checked:
            return
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._check(path, headers or {}), self._loop))
        self.checked = True


class _Channels:
    """Strips the port number each channel starts with (two little-endian bytes, possibly split)."""

    def __init__(self) -> None:
        self._header = {DATA: PORT_HEADER_BYTES, ERROR: PORT_HEADER_BYTES}

    def payload(self, frame: bytes) -> tuple[int, bytes]:
        if not frame:
            return -1, b""
        channel, data = frame[0], frame[1:]
        skip = min(self._header.get(channel, 0), len(data))
        if skip:
            self._header[channel] -= skip
            data = data[skip:]
        return channel, data
