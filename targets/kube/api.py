"""One cluster's API, reached the way the user's kubeconfig says, with errors in the user's words.

The official client loads the kubeconfig (merged like kubectl, exec plugins, CA files) into a
private ``Configuration`` + ``ApiClient`` so two clusters in one process never share state. Every
object operation is generic REST on plain dicts: the layer builds manifests as dicts anyway, and
the generated typed models would only add a conversion that drops fields they do not know.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlsplit

import urllib3
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.rest import should_bypass_proxies
from kubernetes.config import kube_config

from backend.errors import ApiUnreachable, OperationError, UserError
from backend.paths import private_cache_dir
from backend.rayjobs import RayJobs
from backend.retry import REAL_CLOCK, Backoff, Clock, Retry, Retrying, report_retry
from targets.kube.kubeconfig import (
    CONFIG_ERRORS,
    cluster_entry,
    first_current_context,
    kubeconfig_files,
    one_line,
    route_like_kubectl,
    user_entry,
)
from targets.kube.portforward import PortForward

Obj = dict[str, Any]
Objs = list[Obj]  # aliases: inside KubeApi, ``list`` names the method
Query = list[tuple[str, str]]
TokenProvider = Callable[[], str]
T = TypeVar("T")

FIELD_MANAGER = "rtui"
# What the client's loader raises on a broken file: its own errors, YAML's, and lookups of missing keys.
_LOG_QUEUE_BATCHES = 64  # a slow consumer stalls the reading thread, not memory
# A log stream silent this long is asked again from its last line: a quiet job costs one request a
# minute, a connection a load balancer dropped without a FIN (nothing ever arrives) costs a minute.
STREAM_IDLE_S = 60.0
LOG_RECONNECT = Backoff(first_s=0.2, factor=2.0, cap_s=2.0)
LOG_FAILURES = 3  # in a row
# Blocking requests run on the API's own threads, as many as one discovery sends at once (about a
# dozen): on asyncio's default executor (cpu_count + 4 threads, 6 on a 2-CPU machine) they would
# queue, and a server that never answers would take two or three request deadlines to report.
_REQUEST_THREADS = 16
# Answers worth sending a request again for: 429 from API Priority and Fairness (nothing was done; its
# Retry-After says when), and the 5xx of an API server restarting or behind a balancer losing it.
_TRANSIENT = frozenset({429, 500, 502, 503, 504})
# After a 5xx the change may have been made: only requests that may be repeated (a read, a delete by name,
# a server-side apply of the same object) are sent again; a 429 was refused before any handler, so any is.
_REPEATABLE = frozenset({"GET", "DELETE", "PUT"})
API_RETRY = Backoff(first_s=0.5, factor=2.0, cap_s=8.0, jitter="spread")
API_ATTEMPTS = 6  # the first try and five more (client-go's rest client allows 10 by default)
RETRY_AFTER_CAP_S = 10.0  # a server asking for longer gets it at most this long each time
API_RETRY_DEADLINE_S = 60.0


@dataclass(frozen=True)
class KindInfo:
    plural: str
    namespaced: bool


# The kinds rtui touches. A table, not discovery: one fewer round trip per call, and a kind the
# cluster lacks shows up as a clear 404 on use (e.g. the RayCluster CRD not installed).
KINDS: dict[tuple[str, str], KindInfo] = {
    ("v1", "Namespace"): KindInfo("namespaces", False),
    ("v1", "Node"): KindInfo("nodes", False),
    ("v1", "Pod"): KindInfo("pods", True),
    ("v1", "Service"): KindInfo("services", True),
    ("v1", "Secret"): KindInfo("secrets", True),
    ("v1", "ServiceAccount"): KindInfo("serviceaccounts", True),
    ("v1", "Event"): KindInfo("events", True),
    ("v1", "ConfigMap"): KindInfo("configmaps", True),
    ("apps/v1", "DaemonSet"): KindInfo("daemonsets", True),
    ("apps/v1", "Deployment"): KindInfo("deployments", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): KindInfo("clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): KindInfo("clusterrolebindings", False),
    ("rbac.authorization.k8s.io/v1", "Role"): KindInfo("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): KindInfo("rolebindings", True),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): KindInfo("customresourcedefinitions", False),
    ("ray.io/v1", "RayCluster"): KindInfo("rayclusters", True),
    ("ray.io/v1", "RayJob"): KindInfo("rayjobs", True),
    ("ray.io/v1", "RayService"): KindInfo("rayservices", True),
    ("ray.io/v1", "RayCronJob"): KindInfo("raycronjobs", True),
    ("coordination.k8s.io/v1", "Lease"): KindInfo("leases", True),
    ("v1", "Endpoints"): KindInfo("endpoints", True),
    ("networking.k8s.io/v1", "NetworkPolicy"): KindInfo("networkpolicies", True),
    ("v1", "PersistentVolumeClaim"): KindInfo("persistentvolumeclaims", True),
    ("storage.k8s.io/v1", "StorageClass"): KindInfo("storageclasses", False),
}


def kind_info(api_version: str, kind: str) -> KindInfo:
    try:
        return KINDS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"rtui does not know the kind {kind} ({api_version}): add it to access.KINDS") from None


def resource_name(api_version: str, kind: str) -> str:
    """``rayclusters.ray.io`` / ``pods``: how RBAC messages and kubectl name a resource."""
    group = api_version.rpartition("/")[0]
    plural = kind_info(api_version, kind).plural
    return f"{plural}.{group}" if group else plural


def split_timestamp(line: str) -> tuple[str | None, str]:
    """A ``timestamps=true`` log line is ``<RFC3339Nano> <text>``."""
    head, sep, rest = line.partition(" ")
    if sep and len(head) >= 20 and head[4:5] == "-" and head[10:11] == "T":
        return head, rest
    return None, line


def tls_files_dir() -> str:
    """Where the client writes a kubeconfig's certificate and key data (its TLS stack loads them by path):
    a 0700 dir of rtui's cache, not the system temp dir. The client removes them at exit (an atexit hook,
    kube_config._create_temp_file_with_content); an rtui killed before that leaves them here, private,
    rather than a private key in /tmp."""
    return str(private_cache_dir("kube-tls", what="kubeconfig TLS files"))


class KubeApi:
    """A cluster's API server as one kubeconfig context sees it."""

    def __init__(self, configuration: Configuration, *, context: str, namespace: str, timeout_s: float,
                 stream_idle_s: float = STREAM_IDLE_S, clock: Clock = REAL_CLOCK) -> None:
        # No urllib3 retries: a deadline is only a deadline if nothing silently tries again.
        configuration.retries = False
        # TCP keepalive with client-go's timings: the kernel notices a peer a load balancer forgot.
        configuration.keep_alive = True
        self._config = configuration
        self._client = ApiClient(configuration)
        self._context = context
        self._namespace = namespace
        self.timeout_s = timeout_s
        self.stream_idle_s = stream_idle_s
        self.clock = clock  # what a log's reconnects sleep on
        self._token_provider: TokenProvider | None = None
        self._reload_credentials: Callable[[], Configuration] | None = None  # an exec plugin's user: run it again
        self._credentials_lock = threading.Lock()
        self._threads = ThreadPoolExecutor(_REQUEST_THREADS, thread_name_prefix="kube-api")
        self._forwards: dict[tuple[str, str, int], PortForward] = {}

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None, *, timeout_s: float = 10.0,
                        stream_idle_s: float = STREAM_IDLE_S, token_provider: TokenProvider | None = None) -> KubeApi:
        source, files = kubeconfig_files(path)
        try:
            contexts, current = kube_config.list_kube_config_contexts(source)  # type: ignore[no-untyped-call]
        except CONFIG_ERRORS as err:
            raise UserError(f"the kubeconfig {source} is malformed: {one_line(err)}",
                            remedy="fix it or point --kubeconfig at another file") from err
        names = [c["name"] for c in contexts]
        chosen = context or first_current_context(files) or (current["name"] if current else None)
        if chosen is None:
            raise UserError(f"the kubeconfig {source} has no current-context",
                            remedy=f"pass --context (known: {', '.join(names) or 'none'})")
        if chosen not in names:
            raise UserError(f"no context {chosen!r} in the kubeconfig {source}",
                            remedy=f"known contexts: {', '.join(names) or 'none'}")
        configuration = Configuration()
        try:
            kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=source, context=chosen, client_configuration=configuration, persist_config=False,
                temp_file_path=tls_files_dir())
        except CONFIG_ERRORS as err:
            raise UserError(f"cannot use context {chosen!r} of {source}: {one_line(err)}",
                            remedy="fix the kubeconfig or refresh it (`aws eks update-kubeconfig`)") from err
        entry = next(c for c in contexts if c["name"] == chosen)
        namespace = (entry.get("context") or {}).get("namespace") or "default"
        route_like_kubectl(configuration, cluster_entry(files, str((entry.get("context") or {}).get("cluster"))))
        api = cls(configuration, context=chosen, namespace=namespace, timeout_s=timeout_s,
                  stream_idle_s=stream_idle_s)
        if token_provider is not None:
            api.set_token_provider(token_provider)
        elif user_entry(files, str((entry.get("context") or {}).get("user"))).get("exec"):
            def reload() -> Configuration:
                fresh = Configuration()
                kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=source, context=chosen, client_configuration=fresh, persist_config=False,
                    temp_file_path=tls_files_dir())
                return fresh
            api._reload_credentials = reload
        return api

    @classmethod
    def for_server(cls, server: str, ca_file: str, *, context: str, token_provider: TokenProvider,
                   timeout_s: float = 10.0, stream_idle_s: float = STREAM_IDLE_S) -> KubeApi:
        """A cluster known by its endpoint and CA (EKS): no kubeconfig, so no exec plugin is run."""
        configuration = Configuration()
        configuration.host = server
        configuration.ssl_ca_cert = ca_file
        configuration.verify_ssl = True
        api = cls(configuration, context=context, namespace="default", timeout_s=timeout_s,
                  stream_idle_s=stream_idle_s)
        api.set_token_provider(token_provider)
        return api

    def set_token_provider(self, provider: TokenProvider) -> None:
        """Every request asks ``provider`` for the bearer token: a token it refreshes is used at once.

        The client calls ``refresh_api_key_hook`` before building each request's headers, so the
        provider (which caches, e.g. ``eks.EksTokenProvider``) decides when a new token is due.
        """
        self._token_provider = provider

        def refresh(configuration: Configuration) -> None:
            configuration.api_key["BearerToken"] = f"Bearer {provider()}"

        self._config.refresh_api_key_hook = refresh  # type: ignore[assignment]  # declared as None
        refresh(self._config)

    # ---- what a non-kubernetes HTTP client needs ----------------------------------------------

    @property
    def context(self) -> str:
        return self._context

    @property
    def server(self) -> str:
        return str(self._config.host)

    @property
    def namespace_default(self) -> str:
        return self._namespace

    def headers(self) -> dict[str, str]:
        """The auth headers right now (the hook refreshes an expiring token first)."""
        value = self._config.get_api_key_with_prefix("BearerToken")
        return {"Authorization": value} if value else {}

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.server.startswith("https"):
            return None
        cfg = self._config
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    @property
    def proxy(self) -> str | None:
        """The proxy every connection to this server goes through (None: direct), as the client decides:
        the kubeconfig's ``proxy-url``, else HTTPS_PROXY/ALL_PROXY unless NO_PROXY names the server."""
        cfg = self._config
        if cfg.proxy and not should_bypass_proxies(self.server, cfg.no_proxy or ""):
            return str(cfg.proxy)
        return None

    @property
    def tls_server_name(self) -> str | None:
        """The kubeconfig's ``tls-server-name``: the name sent in SNI and checked in the certificate."""
        return str(self._config.tls_server_name) if self._config.tls_server_name else None

    def proxy_url(self, namespace: str, service: str, port_name: str) -> str:
        """The API server's proxy to a service port (DESIGN.md §4): no port exposed outside the cluster."""
        return f"{self.server}/api/v1/namespaces/{namespace}/services/{service}:{port_name}/proxy"

    def ray_jobs(self, namespace: str, service: str, port_name: str, *,
                 ray_auth: Mapping[str, str] | None = None) -> RayJobs:
        """The Ray Jobs API behind a service port, reached the way every request to this server goes:
        its token, its CA, its proxy and its TLS server name; ``ray_auth``: the headers Ray's own
        token auth wants, which the proxy passes on (it drops only the ``Authorization`` it used)."""
        extra = dict(ray_auth or {})

        def headers() -> dict[str, str]:
            return {**self.headers(), **extra}

        return RayJobs(self.proxy_url(namespace, service, port_name), header_provider=headers,
                       ssl=self.ssl_context(), proxy=self.proxy, server_hostname=self.tls_server_name,
                       stream_idle_s=self.stream_idle_s)

    def port_forward(self, namespace: str, pod: str, port: int) -> PortForward:
        """A loopback listener forwarding to ``port`` of ``pod`` through ``pods/portforward`` (portforward.py),
        routed like every request to this server; one per pod and port, closed with this API."""
        key = (namespace, pod, port)
        if key not in self._forwards:
            self._forwards[key] = PortForward(self.server, namespace, pod, port, headers=self.headers,
                                              ssl=self.ssl_context(), proxy=self.proxy,
                                              server_hostname=self.tls_server_name).start()
        return self._forwards[key]

    def fresh_connections(self) -> None:
        """Close the pooled idle connections: after one was dropped silently, the others (same route,
        same load balancer) likely were too, and a request on one would wait out its whole deadline."""
        self._client.rest_client.pool_manager.clear()

    def close(self) -> None:
        for forward in self._forwards.values():
            forward.close()
        self._forwards.clear()
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._client.close()  # type: ignore[no-untyped-call]

    # ---- object operations --------------------------------------------------------------------

    def path(self, api_version: str, kind: str, name: str | None = None, namespace: str | None = None) -> str:
        info = kind_info(api_version, kind)
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        if info.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{info.plural}"
        return base + (f"/{quote(name, safe='')}" if name else "")

    async def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        what = _What("get", resource_name(api_version, kind), namespace, name)
        try:
            return await self._json("GET", self.path(api_version, kind, name, namespace), what)
        except _ObjectGone:
            return None

    async def list(self, api_version: str, kind: str, namespace: str | None = None,
                   label_selector: str | None = None, field_selector: str | None = None) -> Objs:
        """Namespace None on a namespaced kind lists all namespaces."""
        query = [(k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v]
        what = _What("list", resource_name(api_version, kind), namespace)
        body = await self._json("GET", self.path(api_version, kind, None, namespace), what, query=query)
        items: Objs = body.get("items") or []
        for item in items:  # lists omit each item's apiVersion/kind; callers compare whole objects
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    async def apply(self, obj: Obj) -> Obj:
        """Server-side apply: creates or updates, we own the fields we set (fieldManager=rtui)."""
        api_version, kind, meta = obj["apiVersion"], obj["kind"], obj.get("metadata") or {}
        namespace = meta.get("namespace") or (self._namespace if kind_info(api_version, kind).namespaced else None)
        what = _What("patch", resource_name(api_version, kind), namespace, meta["name"])
        return await self._json("PATCH", self.path(api_version, kind, meta["name"], namespace), what,
                                query=[("fieldManager", FIELD_MANAGER), ("force", "true")], body=obj,
                                content_type="application/apply-patch+yaml")

    async def patch_status(self, api_version: str, kind: str, name: str, namespace: str | None,
                           status: Obj) -> Obj:
        what = _What("patch", resource_name(api_version, kind) + "/status", namespace, name)
        return await self._json("PATCH", self.path(api_version, kind, name, namespace) + "/status", what,
                                body={"status": status}, content_type="application/merge-patch+json")

    async def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        """False when it was already gone."""
        what = _What("delete", resource_name(api_version, kind), namespace, name)
        try:
            await self._json("DELETE", self.path(api_version, kind, name, namespace), what,
                             body={"propagationPolicy": "Background"})
        except _ObjectGone:
            return False
        return True

    async def events(self, namespace: str, involved_name: str) -> Objs:
        events = await self.list("v1", "Event", namespace, field_selector=f"involvedObject.name={involved_name}")
        return sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    async def can_i(self, verb: str, resource: str, group: str = "", namespace: str | None = None) -> bool:
        """What a SelfSubjectAccessReview (authorization.k8s.io/v1) says of one request these credentials
        would make: asked, not tried, so nothing is refused or written on the way (``kubectl auth can-i``)."""
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "group": group,
                                                  **({"namespace": namespace} if namespace else {})}}}
        answer = await self._json("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                                  _What("create", "selfsubjectaccessreviews.authorization.k8s.io", None), body=review)
        return bool((answer.get("status") or {}).get("allowed"))

    async def serves(self, group_version: str) -> bool:
        """Whether the server serves ``group/version`` (its discovery document; any authenticated user may
        read it): ``ray.io/v1`` is served once someone's KubeRay CRDs are Established."""
        try:
            await self._json("GET", f"/apis/{group_version}", _What("get", group_version, None))
        except KindNotServed:
            return False
        return True

    async def version(self) -> Obj:
        return await self._json("GET", "/version", _What("get", "version", None))

    async def get_path(self, path: str, what: str) -> Obj:
        """A GET outside the object API (``/openapi/v3/apis/ray.io/v1``); a 404 raises KindNotServed."""
        return await self._json("GET", path, _What("get", what, None))

    # ---- pod logs ------------------------------------------------------------------------------

    async def read_pod_log(self, namespace: str, pod: str, container: str | None = None, *,
                           since_time: str | None = None, since_seconds: int | None = None,
                           timestamps: bool = True, follow: bool = False) -> AsyncIterator[str]:
        """The pod's log lines. With ``follow`` it reconnects after a dropped stream until the pod ends.

        The server is always asked for timestamps so a reconnect resumes at ``sinceTime`` and skips
        the lines already yielded; they are stripped again unless the caller asked for them. A stream
        silent for ``stream_idle_s`` is taken for dropped (a load balancer that forgot it sends no FIN)
        and asked again the same way: a quiet pod only costs the request.
        """
        seen_ts: str | None = None
        seen_at_ts: set[str] = set()  # lines already yielded with the latest timestamp (sinceTime is coarse)
        # A stream that ends while the pod runs is asked again after 0.2 s; three failures in a row end it.
        failures = Retrying(LOG_RECONNECT, attempts=LOG_FAILURES, clock=self.clock)
        while True:
            query = [("timestamps", "true")]
            if container:
                query.append(("container", container))
            if seen_ts or since_time:
                query.append(("sinceTime", _seconds(seen_ts) if seen_ts else str(since_time)))
            elif since_seconds is not None:
                query.append(("sinceSeconds", str(since_seconds)))
            if follow:
                query.append(("follow", "true"))
            what = _What("get", "pods/log", namespace, pod)
            try:
                async for line in self._stream(f"/api/v1/namespaces/{namespace}/pods/{pod}/log", query, what):
                    ts, text = split_timestamp(line)
                    already = seen_ts is not None and ts is not None and (
                        ts < seen_ts or (ts == seen_ts and line in seen_at_ts))
                    if already:
                        continue
                    if ts is not None:
                        if ts != seen_ts:
                            seen_ts, seen_at_ts = ts, set()
                        seen_at_ts.add(line)
                    failures.reset()
                    yield line if timestamps else text
            except _ObjectGone:
                return  # the pod is gone: its log with it
            except _StreamSilent:
                self.fresh_connections()  # its idle siblings went the same way
                if not follow:
                    raise OperationError(f"the log of pod {namespace}/{pod} stopped coming for "
                                         f"{self.stream_idle_s:g}s", remedy="check the network to the cluster"
                                         ) from None
                continue  # not a failure: a quiet pod looks the same; ask again at once
            except OperationError as exc:
                self.fresh_connections()
                if not follow or not failures.failed("log stream broke", exc.message):
                    raise
            if not follow:
                return
            try:
                phase = ((await self.get("v1", "Pod", pod, namespace)) or {}).get("status", {}).get("phase")
            except OperationError as exc:
                self.fresh_connections()
                if not failures.failed("Kubernetes API unreachable", exc.message):
                    raise
                phase = "Unknown"
            if phase in (None, "Succeeded", "Failed"):
                return
            await failures.pause()

    def exec_frames(self, namespace: str, pod: str, container: str,
                    command: Sequence[str]) -> Iterator[tuple[int, bytes]]:
        """Run ``command`` in a running container (``pods/exec``, RBAC ``create``) and yield its output as
        it comes: ``(channel, bytes)``, 1 stdout, 2 stderr, 3 the final ``Status`` JSON. Blocking: call it
        in a thread.

        The WebSocket is opened here on a socket dialled the way every request to this server goes
        (``_dial``: the kubeconfig's proxy, SOCKS5 included, its TLS and tls-server-name). The client's own
        ``kubernetes.stream`` hands websocket-client only a proxy's host and port, which websocket-client
        then speaks HTTP CONNECT to (its ``proxy_type`` defaults to ``http``) and bypasses for the
        environment's NO_PROXY: a SOCKS5 ``proxy-url`` worked for REST and broke exec. Its frames are read
        here, one at a time: the client's reader keeps every stdout byte in a second buffer
        (``capture_all``) and appends to a channel's bytes frame by frame, which for gigabytes is memory
        and quadratic time."""
        # lazy: the exec transport (websocket-client) only where a volume is read
        from kubernetes.stream.ws_client import V4_CHANNEL_PROTOCOL, V5_CHANNEL_PROTOCOL, get_websocket_url
        from websocket import (
            ABNF,
            WebSocket,
            WebSocketBadStatusException,
            WebSocketConnectionClosedException,
            WebSocketException,
            WebSocketTimeoutException,
        )

        what = _What("create", "pods/exec", namespace, pod)
        query = [*(("command", word) for word in command), ("container", container), ("stderr", "true"),
                 ("stdin", "false"), ("stdout", "true"), ("tty", "false")]
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/exec"
        _, url, headers, _, _ = self._client.param_serialize("GET", path, query_params=query, header_params={},
                                                             auth_settings=["BearerToken"])
        header = [f"sec-websocket-protocol: {V5_CHANNEL_PROTOCOL},{V4_CHANNEL_PROTOCOL}",
                  *(f"authorization: {v}" for k, v in headers.items() if k.lower() == "authorization")]
        ws = WebSocket(skip_utf8_validation=True)
        try:
            ws.connect(get_websocket_url(url), socket=self._dial(url), header=header,  # type: ignore[no-untyped-call]
                       timeout=self.timeout_s)
        except WebSocketBadStatusException as err:
            body = err.resp_body if isinstance(err.resp_body, bytes) else str(err.resp_body or "").encode()
            if int(err.status_code) == 404:  # the pod gone, or the kubelet's "container not found": not a kind
                try:
                    message = str(json.loads(body).get("message") or "")
                except ValueError:
                    message = body.decode("utf-8", "replace")
                raise OperationError(f"cannot exec into {namespace}/{pod}: {one_line(message) or 'not found'}",
                                     remedy=f"see `kubectl -n {namespace} describe pod {pod}`") from None
            raise self._error(int(err.status_code), body, what) from None
        except (OSError, WebSocketException) as err:
            raise Unreachable(f"cannot open an exec stream to {namespace}/{pod} on {self.server}: "
                              f"{one_line(err)}", remedy=f"check the network and the context {self._context!r}"
                              ) from None
        ws.settimeout(self.stream_idle_s)
        try:
            while True:
                try:
                    opcode, frame = ws.recv_data_frame(True)
                except WebSocketConnectionClosedException:
                    return
                except (WebSocketTimeoutException, TimeoutError, OSError) as err:
                    why = one_line(err) or f"no data for {self.stream_idle_s:g}s"
                    raise OperationError(f"the exec stream from {namespace}/{pod} stalled or broke ({why})",
                                         remedy="run it again: what was copied is kept") from None
                if opcode == ABNF.OPCODE_CLOSE:
                    return
                if opcode in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) and frame.data:
                    data = frame.data if isinstance(frame.data, bytes) else frame.data.encode()
                    yield data[0], data[1:]
        finally:
            ws.close()

    def _dial(self, url: str) -> socket.socket:
        """A connection to the server of ``url`` as the REST client makes it: through ``self.proxy`` (HTTP
        CONNECT or SOCKS, the name resolved at a SOCKS proxy as kubectl does), TLS with this server's CA,
        client certificate and tls-server-name; within the request deadline."""
        target = urlsplit(url)
        host, port = target.hostname or "", target.port or (443 if target.scheme == "https" else 80)
        proxy = self.proxy
        if proxy is None:
            sock = socket.create_connection((host, port), timeout=self.timeout_s)
        else:
            # lazy: python-socks only behind a proxy; it speaks CONNECT and SOCKS alike
            from python_socks import ProxyError, ProxyType
            from python_socks.sync import Proxy

            via = urlsplit(proxy)
            kinds = {"http": ProxyType.HTTP, "socks5": ProxyType.SOCKS5, "socks5h": ProxyType.SOCKS5,
                     "socks4": ProxyType.SOCKS4, "socks4a": ProxyType.SOCKS4}
            if via.scheme not in kinds or not via.hostname:
                raise UserError(f"cannot open an exec stream through the proxy {via.scheme}://{via.hostname}",
                                remedy="use an http:// or socks5:// proxy-url for this cluster")
            try:
                sock = Proxy(kinds[via.scheme], via.hostname, via.port or 1080, unquote(via.username or "") or None,
                             unquote(via.password or "") or None, rdns=True).connect(host, port,
                                                                                     timeout=self.timeout_s)
            except ProxyError as err:  # the proxy answered, refusing: as unreachable as a refused connection
                raise ConnectionError(f"the proxy {via.hostname}:{via.port} could not reach {host}:{port}: "
                                      f"{one_line(err)}") from err
        context = self.ssl_context()
        if context is None:
            return sock
        try:
            return context.wrap_socket(sock, server_hostname=self.tls_server_name or host)
        except BaseException:
            sock.close()
            raise

    async def _stream(self, path: str, query: Query, what: _What) -> AsyncIterator[str]:
        """Lines of a streamed response: a thread reads, a bounded queue hands batches to the loop."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[list[str] | BaseException | None] = asyncio.Queue(_LOG_QUEUE_BATCHES)
        stop = threading.Event()
        # Connect within the deadline; once streaming, silence is normal (a quiet training job) up to
        # ``stream_idle_s``, after which the caller asks again (_StreamSilent).
        response = await self._in_thread(lambda: self._call("GET", path, what, query=query,
                                                            timeout=(self.timeout_s, self.stream_idle_s)))

        def hand_over(item: list[str] | BaseException | None) -> None:
            future = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
            while not stop.is_set():
                try:
                    future.result(timeout=0.5)
                    return
                except TimeoutError:
                    continue

        def pump() -> None:
            pending = b""
            try:
                for chunk in response.stream(64 * 1024, decode_content=True):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    if lines:
                        hand_over([line.decode("utf-8", "replace") for line in lines])
                    if stop.is_set():
                        return
                if pending:
                    hand_over([pending.decode("utf-8", "replace")])
                hand_over(None)
            except urllib3.exceptions.ReadTimeoutError:
                if not stop.is_set():
                    hand_over(_StreamSilent())
            except Exception as err:  # noqa: BLE001 - crosses the thread boundary to be raised there
                if not stop.is_set():
                    hand_over(OperationError(f"the log stream of pod {what.namespace}/{what.name} broke: "
                                             f"{one_line(err)}"))

        reader = threading.Thread(target=pump, name=f"log-{what.name}", daemon=True)
        reader.start()
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                for line in item:
                    yield line
        finally:
            stop.set()
            _abort(response)

    # ---- the one place requests are made and errors are translated ----------------------------

    async def _json(self, method: str, path: str, what: _What, *, query: Query | None = None,
                    body: Any = None, content_type: str = "application/json") -> Obj:
        def call() -> Obj:
            response = self._call(method, path, what, query=query, body=body, content_type=content_type,
                                  timeout=self.timeout_s)
            data = response.data
            result: Obj = json.loads(data) if data else {}
            return result

        repeatable = method in _REPEATABLE or content_type == "application/apply-patch+yaml"
        tries = Retrying(API_RETRY, attempts=API_ATTEMPTS, deadline_s=API_RETRY_DEADLINE_S, clock=self.clock,
                         report=None)
        while True:
            try:
                return await self._in_thread(call)
            except _Transient as err:
                if (err.status != 429 and not repeatable) or not tries.failed():
                    raise
                delay = min(RETRY_AFTER_CAP_S, max(tries.next_delay_s, err.retry_after_s))
                attempt = tries.failures + 1
                report_retry(Retry(f"{err.message}: trying again in {delay:.1f}s (attempt {attempt})",
                                   f"HTTP {err.status}", delay, attempt))
                await self.clock.sleep(delay)

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn)

    def _renew_exec_credentials(self, sent: Mapping[str, str]) -> bool:
        """After a 401, run the kubeconfig's exec plugin again as client-go does (``plugin/pkg/client/auth/exec/
        exec.go``: a credential without ``expirationTimestamp`` is used until the server answers 401, then
        ``maybeRefreshCreds`` runs the plugin unless another request already rotated it). The client's
        loader refreshes only on an expiry, so it would send the refused token for ever. True: send again."""
        if self._reload_credentials is None:
            return False
        used = next((v for k, v in sent.items() if k.lower() == "authorization"), None)
        with self._credentials_lock:
            if self._config.get_api_key_with_prefix("BearerToken") != used:
                return True  # rotated meanwhile by another request's 401
            try:
                fresh = self._reload_credentials()
            except CONFIG_ERRORS:
                return False  # the plugin failed: the 401 is the answer
            token = fresh.api_key.get("BearerToken")
            if not token or token == used:
                return False
            hook = fresh.refresh_api_key_hook

            def refresh(configuration: Configuration) -> None:
                # Only the token: the loader's own hook would also reset the proxy and CA file it loaded.
                if hook is not None:
                    hook(fresh)
                configuration.api_key["BearerToken"] = fresh.api_key["BearerToken"]

            self._config.refresh_api_key_hook = refresh  # type: ignore[assignment]  # declared as None
            self._config.api_key["BearerToken"] = token
        return True

    def _call(self, method: str, path: str, what: _What, *, query: Query | None = None,
              body: Any = None, content_type: str = "application/json",
              timeout: float | tuple[float, float | None], renewed: bool = False) -> urllib3.BaseHTTPResponse:
        """A blocking request; a non-2xx answer or no answer becomes our error (streamed bodies stay open).
        A 401 to an exec plugin's credential runs the plugin again and sends the request once more."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, body, post = self._client.param_serialize(
            method, path, query_params=query or None, header_params=headers, body=body, auth_settings=["BearerToken"])
        try:
            if isinstance(timeout, tuple):  # the generated client only accepts pairs of numbers
                raw = self._client.rest_client.pool_manager.request(
                    method, url, headers=headers, preload_content=False,
                    timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]))
            else:
                raw = self._client.call_api(method, url, headers, body, post, _request_timeout=timeout).response
        except urllib3.exceptions.HTTPError as err:
            raise Unreachable(f"cannot reach the Kubernetes API server at {self.server} within {self.timeout_s:g}s "
                                 f"({one_line(err)})", remedy=f"check the network and the context {self._context!r}",
                                 ) from err
        except Exception as err:
            if getattr(err, "status", None) == 0:  # the client turns TLS failures into status 0
                raise OperationError(f"TLS to {self.server} failed: {one_line(err)}",
                                     remedy="check the kubeconfig's certificate-authority") from err
            raise
        if 200 <= raw.status < 300:
            return raw
        payload = raw.read()
        raw.release_conn()
        if raw.status == 401 and not renewed and self._renew_exec_credentials(headers):
            # The authenticator refused it before any handler ran: nothing was done, any method may go again.
            return self._call(method, path, what, query=query, body=body, content_type=content_type,
                              timeout=timeout, renewed=True)
        error = self._error(raw.status, payload, what)
        if raw.status in _TRANSIENT:
            raise _Transient(error, raw.status, _retry_after(raw.headers.get("Retry-After")))
        raise error

    def _error(self, status: int, payload: bytes, what: _What) -> Exception:
        try:
            body = json.loads(payload)
            message = str(body.get("message") or "")
            details = body.get("details") or {}
        except ValueError:
            body, message, details = {}, payload.decode("utf-8", "replace").strip()[:200], {}
        where = f" in namespace {what.namespace}" if what.namespace else ""
        if status == 401:
            return UserError(f"the Kubernetes API server at {self.server} refused the credentials of context "
                             f"{self._context!r} (expired or invalid)",
                             remedy="run `aws sso login` / refresh the kubeconfig (`aws eks update-kubeconfig`)")
        if status == 403 and any(c.get("reason") == "NamespaceTerminating" for c in details.get("causes") or []):
            # NamespaceLifecycle admission, not RBAC: the namespace is going and takes nothing new meanwhile.
            return OperationError(f"namespace {what.namespace} is still being deleted: nothing can be created in it "
                                  "until it is gone",
                                  remedy=f"wait until `kubectl get namespace {what.namespace}` finds nothing, then "
                                         "run it again")
        if status == 403:
            return Forbidden(f"forbidden: cannot {what.verb} {what.resource}{where}",
                             remedy=f"ask the cluster's admin for that permission ({one_line(message)})")
        if status == 404:
            if details.get("name"):  # a known kind, a missing object (the server names it)
                return _ObjectGone(message)
            # kube-apiserver's NotFound handler: no CRD defines the kind, or it is not Established yet.
            return KindNotServed(f"the API server at {self.server} does not serve {what.resource}",
                                 remedy="is its CustomResourceDefinition installed (the KubeRay operator)?")
        if status == 409:
            return OperationError(f"conflict: {one_line(message) or what.resource}")
        return OperationError(f"the Kubernetes API refused to {what.verb} {what.resource}{where}: "
                              f"HTTP {status} {one_line(message)}")


@dataclass(frozen=True)
class _What:
    """What a request does, in RBAC's words, for error messages."""

    verb: str
    resource: str
    namespace: str | None
    name: str | None = None


class Forbidden(UserError):
    """A 403: RBAC does not allow the request (one line, with the verb and resource)."""


class KindNotServed(UserError):
    """A 404 without details: the server serves no such resource (a CRD missing or not Established)."""


class Unreachable(ApiUnreachable):
    """No answer from the Kubernetes API server (refused, unresolved, or silent past the deadline)."""


class _StreamSilent(Exception):
    """Nothing came on a stream for ``stream_idle_s``: a quiet source, or a connection dropped silently."""


class _Transient(OperationError):
    """A 429 or 5xx: the same one-line error, with what ``_json`` needs to try again."""

    def __init__(self, error: Exception, status: int, retry_after_s: float) -> None:
        super().__init__(getattr(error, "message", str(error)), remedy=getattr(error, "remedy", None))
        self.status = status
        self.retry_after_s = retry_after_s


def _retry_after(value: str | None) -> float:
    """Seconds from a Retry-After header (kube-apiserver sends whole seconds); 0 when absent or a date."""
    try:
        return max(0.0, float(value or 0))
    except ValueError:
        return 0.0


class _ObjectGone(Exception):
    """A 404 for an object of a kind the server knows: callers turn it into None/False."""


def _abort(response: urllib3.BaseHTTPResponse) -> None:
    """End a stream another thread may be blocked reading, without blocking the event loop.

    Closing the response here would wait for the reader's lock on the buffered socket file, and
    that reader waits for bytes a quiet log may never send: the loop would hang. Shutting the
    socket down wakes the reader at once; the close then happens on a thread of its own.
    """
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    threading.Thread(target=response.close, name="log-close", daemon=True).start()


def _seconds(ts: str) -> str:
    """``sinceTime`` takes whole seconds: round down, the skip-seen logic drops the overlap."""
    return ts.split(".")[0].rstrip("Z") + "Z"
