"""``pods/portforward`` over a WebSocket, as the API server and the kubelet serve it.

What is copied, and from where:
- the API server authorizes a WebSocket GET of ``pods/portforward`` as ``create`` (KEP-4006,
  ``AuthorizePodWebsocketUpgradeCreatePermission``; pkg/registry/core/pod/rest/subresources.go
  ``PortForwardREST.Connect``), and hands a request that is not SPDY-over-WebSocket tunnelling to its
  upgrade-aware proxy, straight to the kubelet (``NewTranslatingHandler``, keyed on
  ``IsWebSocketRequestWithTunnelingProtocol``);
- the kubelet (staging k8s.io/kubelet/pkg/cri/streaming/portforward/websocket.go) takes ``?ports=N``
  and the subprotocol ``v4.channel.k8s.io``; per port it opens a data channel (0) and an error channel
  (1), writes the port as two little-endian bytes first on each, then copies bytes both ways; every
  frame starts with its channel's number. A failed dial is written on the error channel as
  ``error forwarding port N to pod NAME, uid UID: ...`` and the connection ends;
- the runtime dials the port from inside the pod's own network namespace, on localhost (containerd
  internal/cri/server/sandbox_portforward_linux.go ``dialLocalhost``; its fallback to the pod IP comes
  from the node, which policies always admit): so **no NetworkPolicy applies**, unlike the service
  proxy, which dials the pod over the pod network from wherever the API server's traffic comes from
  (``RtuiKube.proxy_source``).

The pod's port is found where the emulator's service proxy sends it (``RtuiKube.proxies``): a Service
selecting the pod with that port behind the proxied port name.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import aiohttp.web

if TYPE_CHECKING:
    from tests.kube.kmock_ext import RtuiKube

Obj = dict[str, Any]
PROTOCOL = "v4.channel.k8s.io"
DATA, ERROR = 0, 1


def backend_address(kube: RtuiKube, namespace: str, pod: Obj, port: int) -> tuple[str, int] | None:
    """Where the pod's ``port`` answers in the emulator: the target of a proxied Service port that
    selects the pod and sends to that port (by number or by the container port's name)."""
    labels = pod["metadata"].get("labels") or {}
    for (ns, service, port_name), target in list(kube.proxies.items()):
        if ns != namespace:
            continue
        svc = kube.find(("", "v1", "services"), namespace, service) or {}
        spec = svc.get("spec") or {}
        selector = spec.get("selector") or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            continue
        for p in spec.get("ports") or []:
            if port_name in (p.get("name"), str(p.get("port"))) and int(p.get("targetPort") or p["port"]) == port:
                split = urlsplit(target)
                return split.hostname or "127.0.0.1", int(split.port or 80)
    return None


async def serve(kube: RtuiKube, raw: aiohttp.web.BaseRequest, namespace: str, name: str) -> aiohttp.web.StreamResponse:
    from tests.kube.kmock_ext import ApiError

    pod = kube.find(("", "v1", "pods"), namespace, name)
    if pod is None:
        raise ApiError(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
    if not (pod.get("spec") or {}).get("nodeName"):
        raise ApiError(400, "BadRequest", f"pod {name} does not have a host assigned")
    if raw.headers.get("Upgrade", "").lower() != "websocket":
        raise ApiError(400, "BadRequest", "Upgrade request required")
    try:
        ports = [int(p) for v in raw.query.getall("ports", []) for p in v.split(",")]
    except ValueError:
        raise ApiError(400, "BadRequest", f"unable to parse {raw.query.get('ports')!r} as a port") from None
    if len(ports) != 1:  # rtui forwards one port per connection; more is not emulated
        raise ApiError(400, "BadRequest", 'query parameter "ports" is required')
    port = ports[0]
    offered = [p.strip() for p in raw.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    ws = aiohttp.web.WebSocketResponse(protocols=(PROTOCOL,) if PROTOCOL in offered else (), max_msg_size=0)
    await ws.prepare(raw)
    header = struct.pack("<H", port)
    await ws.send_bytes(bytes([DATA]) + header)
    await ws.send_bytes(bytes([ERROR]) + header)
    uid = pod["metadata"].get("uid", "")
    running = (pod.get("status") or {}).get("phase") == "Running"
    address = backend_address(kube, namespace, pod, port) if running else None
    try:
        if address is None:
            raise ConnectionRefusedError(f"dial tcp4 127.0.0.1:{port}: connect: connection refused")
        reader, writer = await asyncio.open_connection(*address)
    except OSError as err:
        await ws.send_bytes(bytes([ERROR]) + f"error forwarding port {port} to pod {name}, uid {uid}: "
                            f"failed to execute portforward in network namespace: {err}".encode())
        await ws.close()
        return ws

    async def upstream() -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.BINARY or not msg.data:
                break
            if msg.data[0] == DATA:
                writer.write(msg.data[1:])
                await writer.drain()
        writer.close()

    async def downstream() -> None:
        while chunk := await reader.read(64 * 1024):
            await ws.send_bytes(bytes([DATA]) + chunk)
        await ws.close()

    tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        writer.close()
        await ws.close()
    return ws
