"""Ray's Jobs REST API over aiohttp, with no ``ray`` import.

The kube target reaches the dashboard through the Kubernetes API server's service proxy
(``https://<apiserver>/api/v1/namespaces/<ns>/services/<cluster>-head-svc:dashboard/proxy``),
with a bearer token that expires (EKS: ~15 min) and a TLS context from the kubeconfig, on a
machine that may not have Ray installed. So the base URL may carry a path prefix, the headers
come from a provider called for every request (a refreshed token is used by the next one),
and the wire format is read from Ray 2.58's ``dashboard/modules/job`` (sdk.py, job_head.py,
common.py), ``dashboard_sdk.py`` and ``_private/runtime_env/packaging.py`` (the package format itself is
``backend.raypackage``).

Sessions: a caller that opens the client (``async with JobsApi(...)``) shares one aiohttp
session until ``aclose()``; otherwise each call opens and closes its own. Most callers build a
client for a few calls and never close it, and an aiohttp session left to the garbage
collector prints "Unclosed client session" over the TUI.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import re
import secrets
import ssl as ssl_lib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aiohttp

from backend.errors import OperationError, TransientError
from backend.jsonstring import StringValueDecoder
from backend.raypackage import DEFAULT_EXCLUDES, package_uri, zip_package

HeaderProvider = Callable[[], Mapping[str, str]]

# Answers that say the server between us and the dashboard (the API server's proxy, a load
# balancer) could not reach it right now: worth another try, unlike a refusal of the request.
GATEWAY_STATUSES = (502, 503, 504)
# How Ray's ``GET /logs`` answer starts (json.dumps of JobLogsResponse, whose only field is logs).
LOGS_PREFIX = re.compile(r'\s*\{\s*"logs"\s*:\s*"')
LOGS_READ_BYTES = 64 * 1024
# A silent peer (a proxy that dropped the connection without a FIN) is noticed within this.
WS_HEARTBEAT_S = 30.0
SOCKS_SCHEMES = ("socks5", "socks5h", "socks4", "socks4a")
# A file of random bytes put in every package this client uploads. Ray skips the upload of a URI
# that exists (job_head ``get_package`` answers 200), and the URI is a hash of the content: without
# this, anyone who can reach the dashboard could plant a package under the hash of the public
# ``training/`` code before rtui submits, and the job would run it. With it the name is unknowable.
NONCE_FILE = "_rtui_package_nonce"
NONCE_BYTES = 16


def _no_headers() -> Mapping[str, str]:
    return {}


def first_line(body: str) -> str:
    """The line worth showing from an error body. Ray answers many failures with a Python
    traceback, whose first line says nothing: take its last line (the exception) instead."""
    lines = [ln.strip() for ln in body.strip().splitlines() if ln.strip()]
    if not lines:
        return "(empty answer)"
    return lines[-1] if lines[0].startswith("Traceback (most recent call last)") else lines[0]


@dataclass(frozen=True)
class Answer:
    status: int
    body: str

    def json(self) -> Any:
        return json.loads(self.body)


class JobsApi:
    """``proxy``: None (direct), ``http(s)://`` (a CONNECT tunnel) or ``socks5(h)://``/``socks4(a)://``;
    ``server_hostname``: the name TLS sends and checks instead of the URL's host (tls-server-name)."""

    def __init__(self, base_url: str, *, headers: HeaderProvider = _no_headers,
                 ssl: ssl_lib.SSLContext | None = None, proxy: str | None = None,
                 server_hostname: str | None = None, timeout_s: float = 30.0,
                 stream_idle_s: float = WS_HEARTBEAT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = headers
        # aiohttp's default (True) verifies against the system CAs; a context brings the kubeconfig's.
        self._ssl: ssl_lib.SSLContext | bool = ssl if ssl is not None else True
        self._proxy = proxy
        self._socks = proxy is not None and urlsplit(proxy).scheme.lower() in SOCKS_SCHEMES
        self._server_hostname = server_hostname
        self.timeout_s = timeout_s
        # A stream silent this long is checked: the tail's websocket pings (and gives up when no pong
        # comes within half of it), the full-log read gives up; both are resumed by the caller.
        self.stream_idle_s = stream_idle_s
        self._held: aiohttp.ClientSession | None = None
        self._held_loop: asyncio.AbstractEventLoop | None = None
        # One per client: its jobs share an unchanged package, no one else can name it in advance.
        self._nonce = {NONCE_FILE: secrets.token_bytes(NONCE_BYTES)}

    # --- session lifetime ------------------------------------------------------------------
    async def __aenter__(self) -> JobsApi:
        await self.aclose()
        # Created here, inside the running loop it belongs to (aiohttp binds a session to it).
        self._held = self._new_session()
        self._held_loop = asyncio.get_running_loop()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        held, self._held, self._held_loop = self._held, None, None
        if held is not None and not held.closed:
            await held.close()

    async def fresh_connections(self) -> None:
        """Open new connections from now on: after a silently dropped one, its pooled siblings (same
        route, same load balancer) likely were dropped too, and a request would wait out its deadline."""
        held = self._held
        if held is not None and self._held_loop is asyncio.get_running_loop():
            self._held = self._new_session()
            await held.close()

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[aiohttp.ClientSession]:
        held = self._held
        if held is not None and not held.closed and self._held_loop is asyncio.get_running_loop():
            yield held
            return
        async with self._new_session() as session:
            yield session

    def _new_session(self) -> aiohttp.ClientSession:
        """A session whose connections go the way the cluster's do: through a SOCKS proxy by its
        connector (aiohttp has none of its own); an HTTP proxy is named on each request instead."""
        if self._proxy is not None and self._socks:
            return aiohttp.ClientSession(connector=socks_connector(self._proxy))
        return aiohttp.ClientSession()

    def _route(self) -> dict[str, Any]:
        """The keyword arguments every request and websocket of this client carries."""
        route: dict[str, Any] = {"ssl": self._ssl}
        if self._proxy is not None and not self._socks:
            route["proxy"] = self._proxy
        if self._server_hostname:
            route["server_hostname"] = self._server_hostname
        return route

    # --- requests -----------------------------------------------------------------------
    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _refused(self, status: int, body: str) -> TokenRefused:
        return TokenRefused(f"the Ray Jobs API at {self.base_url} refused our token (HTTP {status}: "
                              f"{first_line(body)})",
                              remedy="check the cluster's token or your kubeconfig credentials")

    def _unreachable(self, exc: BaseException) -> OperationError:
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            return OperationError(f"TLS certificate of {self.base_url} not trusted: {exc.certificate_error}",
                                  remedy="check the CA data in your kubeconfig")
        reason = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
        return TransientError(f"the Ray Jobs API at {self.base_url} is not answering ({reason})")

    async def request(self, method: str, path: str, *, json_body: Any = None, data: bytes | None = None,
                      timeout_s: float | None = None) -> Answer:
        """One request; a dead or slow peer is a TransientError, a refused token an OperationError.
        Any other status is the caller's to judge."""
        timeout = aiohttp.ClientTimeout(total=timeout_s if timeout_s is not None else self.timeout_s)
        try:
            async with self._session() as session, session.request(
                method, self.url(path), json=json_body, data=data, headers=dict(self._headers()),
                timeout=timeout, **self._route(),
            ) as resp:
                answer = Answer(resp.status, await resp.text())
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise self._unreachable(exc) from None
        if answer.status in (401, 403):
            raise self._refused(answer.status, answer.body)
        return answer

    def _failed(self, what: str, answer: Answer) -> OperationError:
        err = TransientError if answer.status in GATEWAY_STATUSES else OperationError
        return err(f"{what} failed (HTTP {answer.status}): {first_line(answer.body)}")

    # --- the endpoints ------------------------------------------------------------------
    async def version(self, timeout_s: float | None = None) -> dict[str, Any]:
        """``GET /api/version``; any answer but 200 means "not up yet" (TransientError)."""
        answer = await self.request("GET", "/api/version", timeout_s=timeout_s)
        if answer.status != 200:
            raise TransientError(f"the Ray Jobs API at {self.base_url} is not ready "
                                 f"(HTTP {answer.status}: {first_line(answer.body)})")
        try:
            return dict(answer.json())
        except (ValueError, TypeError):
            raise TransientError(f"{self.url('/api/version')} answered something other than Ray's version "
                                 f"({first_line(answer.body)})") from None

    async def submit(self, *, entrypoint: str, submission_id: str, runtime_env: Mapping[str, Any],
                     metadata: Mapping[str, str]) -> str:
        """``POST /api/jobs/`` after uploading local working_dir/py_modules directories.

        Raises the server's answer as is (OperationError/TransientError); the caller decides
        what "already exists" means."""
        env = await self.upload_local_packages(runtime_env)
        body = {"entrypoint": entrypoint, "submission_id": submission_id, "runtime_env": env,
                "metadata": dict(metadata)}
        answer = await self.request("POST", "/api/jobs/", json_body=body)
        if answer.status != 200:
            raise SubmitRefused(answer, self._failed("job submission", answer))
        return str(answer.json().get("submission_id") or submission_id)

    async def job(self, submission_id: str) -> dict[str, Any]:
        """``GET /api/jobs/{id}``: Ray's JobDetails as a dict."""
        answer = await self.request("GET", f"/api/jobs/{_seg(submission_id)}")
        if answer.status != 200:
            raise self._failed(f"reading job {submission_id}", answer)
        return dict(answer.json())

    async def jobs(self) -> list[dict[str, Any]]:
        """``GET /api/jobs/``: every job, submitted ones and bare drivers."""
        answer = await self.request("GET", "/api/jobs/")
        if answer.status != 200:
            raise self._failed("listing jobs", answer)
        return [dict(j) for j in answer.json()]

    async def stop(self, submission_id: str) -> bool:
        """``POST /api/jobs/{id}/stop``: whether the job was running."""
        answer = await self.request("POST", f"/api/jobs/{_seg(submission_id)}/stop")
        if answer.status != 200:
            raise self._failed(f"stopping job {submission_id}", answer)
        return bool(answer.json().get("stopped"))

    async def logs(self, submission_id: str) -> str:
        """``GET /api/jobs/{id}/logs``: the whole log so far."""
        answer = await self.request("GET", f"/api/jobs/{_seg(submission_id)}/logs")
        if answer.status != 200:
            raise self._failed(f"reading the log of job {submission_id}", answer)
        return str(answer.json().get("logs") or "")

    async def logs_from(self, submission_id: str, start: int) -> AsyncIterator[str]:
        """``GET /api/jobs/{id}/logs`` from character ``start`` on, decoded as the body arrives.

        The endpoint always sends the whole log; this holds one read's worth of it at a time,
        where ``logs()`` holds the body, its text and the decoded log at once."""
        path = f"/api/jobs/{_seg(submission_id)}/logs"
        what = f"reading the log of job {submission_id}"
        # No total deadline: a long log takes as long as it takes; a silent peer does not.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=self.stream_idle_s)
        try:
            async with self._session() as session, session.get(
                self.url(path), headers=dict(self._headers()), timeout=timeout, **self._route(),
            ) as resp:
                if resp.status != 200:
                    answer = Answer(resp.status, await resp.text())
                    if answer.status in (401, 403):
                        raise self._refused(answer.status, answer.body)
                    raise self._failed(what, answer)
                value = StringValueDecoder(LOGS_PREFIX)
                utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
                skip = start
                async for data in resp.content.iter_chunked(LOGS_READ_BYTES):
                    for piece in value.feed(utf8.decode(data)):
                        if skip < len(piece):
                            yield piece[skip:]
                        skip = max(0, skip - len(piece))
                    if value.finished:
                        return
                value.check_started()
                raise TransientError(f"{what}: the answer ended before the log did")
        except ValueError as exc:  # PrefixMismatch, or a value that is not a JSON string
            raise OperationError(f"{what}: not a Jobs API answer ({first_line(str(exc))})") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise self._unreachable(exc) from None

    async def tail(self, submission_id: str) -> AsyncIterator[str]:
        """``GET /api/jobs/{id}/logs/tail`` (a websocket): the log from its beginning, chunk by chunk,
        until the server closes it (the job ended). A dropped connection is a TransientError."""
        path = f"/api/jobs/{_seg(submission_id)}/logs/tail"
        try:
            async with self._session() as session, session.ws_connect(
                self.url(path), headers=dict(self._headers()), heartbeat=self.stream_idle_s,
                timeout=aiohttp.ClientWSTimeout(ws_close=5.0), **self._route(),
            ) as ws:
                sent_close: int | None = None  # the code of the server's close frame, if one came
                while True:
                    msg = await ws.receive()
                    if msg.type is aiohttp.WSMsgType.TEXT:
                        yield str(msg.data)
                    elif msg.type is aiohttp.WSMsgType.ERROR:
                        raise TransientError(f"log tail of job {submission_id} broke: {ws.exception()}")
                    elif msg.type is aiohttp.WSMsgType.CLOSE:
                        sent_close = int(msg.data)
                    elif msg.type in (aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                        break
                # Ray's server returns from its handler when the job ends (a normal close);
                # 1006 is a connection that died under us. The server's own close frame decides:
                # a peer that drops the connection right after it (the emulated API server's proxy
                # does) fails our reply and leaves close_code at 1006 for a stream that was whole.
                code = sent_close if sent_close is not None else ws.close_code
                if code in (None, aiohttp.WSCloseCode.ABNORMAL_CLOSURE):
                    raise TransientError(f"log tail of job {submission_id} dropped (code {code})")
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (401, 403):
                raise self._refused(exc.status, exc.message) from None
            err = TransientError if exc.status in GATEWAY_STATUSES else OperationError
            raise err(f"log tail of job {submission_id} refused (HTTP {exc.status}: {exc.message})") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise self._unreachable(exc) from None

    # --- packages (runtime_env working_dir / py_modules) ----------------------------------
    async def upload_local_packages(self, runtime_env: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``runtime_env`` whose local directories are uploaded packages' URIs.

        Like Ray's SDK: ``working_dir`` is zipped without its own folder name, each
        ``py_modules`` directory with it (so ``import <name>`` works on the cluster)."""
        env = dict(runtime_env)
        excludes = [*DEFAULT_EXCLUDES, *(env.get("excludes") or [])]
        working_dir = env.get("working_dir")
        if working_dir is not None and _is_local(working_dir):
            env["working_dir"] = await self._upload_dir(Path(working_dir), excludes, include_parent_dir=False)
        modules = env.get("py_modules")
        if modules is not None:
            # Ray's SDK leaves its default excludes out here and ships __pycache__, whose churn
            # makes a new package (and upload) whenever the local Python recompiles: we don't.
            env["py_modules"] = [await self._upload_dir(Path(m), excludes, include_parent_dir=True)
                                 if _is_local(m) else str(m) for m in modules]
        return env

    async def _upload_dir(self, path: Path, excludes: Sequence[str], *, include_parent_dir: bool) -> str:
        if not path.is_dir():
            raise OperationError(f"{path} is not a directory",
                                 remedy="runtime_env takes a local directory or a package URI here")
        uri = await asyncio.to_thread(package_uri, path, excludes, self._nonce)
        protocol, name = uri.split("://", 1)
        where = f"/api/packages/{protocol}/{name}"
        # Ask first, every time: the GET also pins the package for a while in Ray's store, so it
        # is not collected between here and the job's start.
        known = await self.request("GET", where)
        if known.status == 200:
            return uri
        if known.status != 404:
            raise self._failed(f"checking package {uri}", known)
        data = await asyncio.to_thread(zip_package, path, excludes, include_parent_dir, self._nonce)
        sent = await self.request("PUT", where, data=data, timeout_s=max(self.timeout_s, 300.0))
        if sent.status != 200:
            raise self._failed(f"uploading package {uri} ({len(data)} bytes)", sent)
        return uri


def socks_connector(proxy: str) -> aiohttp.TCPConnector:
    """An aiohttp connector through a SOCKS proxy. ``socks5``/``socks4`` resolve the target's name at
    the proxy, as kubectl does (Go's net/http hands its SOCKS5 dialer the unresolved host), so a
    name only the far side knows works; the ``h``/``a`` spellings mean the same here.

    aiohttp-socks 0.12 makes the TLS connection to the target itself, naming the URL's host and
    dropping aiohttp's ``server_hostname`` (a kubeconfig's tls-server-name): with one, the tunnel is
    opened without TLS and TLS is started over it here, with that name.
    """
    # lazy: aiohttp-socks (~40 ms) only behind a SOCKS proxy
    from aiohttp_socks import ProxyConnector, ProxyType

    class Connector(ProxyConnector):
        async def _wrap_create_connection(self, *args: Any, **kwargs: Any) -> Any:
            ssl, name = kwargs.get("ssl"), kwargs.get("server_hostname")
            if not isinstance(ssl, ssl_lib.SSLContext) or not name:
                return await super()._wrap_create_connection(*args, **kwargs)
            transport, protocol = await super()._wrap_create_connection(*args, **{**kwargs, "ssl": None})
            timeout = kwargs.get("timeout")
            tls = await asyncio.get_running_loop().start_tls(
                transport, protocol, ssl, server_hostname=name,
                ssl_handshake_timeout=getattr(timeout, "sock_connect", None) or None)
            if tls is None:
                raise aiohttp.ClientConnectionError(f"TLS to {name} through {proxy} did not start")
            protocol.connection_made(tls)
            return tls, protocol

    parts = urlsplit(proxy)
    kind = ProxyType.SOCKS5 if parts.scheme.lower().startswith("socks5") else ProxyType.SOCKS4
    if not parts.hostname or not parts.port:
        raise OperationError(f"the proxy {proxy} names no host and port", remedy="fix proxy-url in the kubeconfig")
    return Connector(proxy_type=kind, host=parts.hostname, port=parts.port,
                          username=unquote(parts.username) if parts.username else None,
                          password=unquote(parts.password) if parts.password else None, rdns=True)


class TokenRefused(OperationError):
    """HTTP 401/403: the token (or kubeconfig credentials) was not accepted; retrying will not help."""


class SubmitRefused(OperationError):
    """The Jobs API answered a submission with an error; ``answer`` holds its full body."""

    def __init__(self, answer: Answer, error: OperationError) -> None:
        super().__init__(error.message, remedy=error.remedy)
        self.answer = answer
        self.transient = isinstance(error, TransientError)


def _seg(value: str) -> str:
    """One path segment: an ID never changes the path's shape."""
    return quote(value, safe="")


def _is_local(value: Any) -> bool:
    return isinstance(value, Path) or (isinstance(value, str) and "://" not in value)
