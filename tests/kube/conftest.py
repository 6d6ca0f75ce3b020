"""``kube_cluster``: an emulated Kubernetes API server on loopback, and the test as its operator and kubelet.

The server runs on its own event loop in a background thread, so sync tests, async tests and
``rtui``/``kubectl`` subprocesses all reach it over real HTTP while the test mutates its state.
Every helper below runs on the server's loop (``_call``), so state changes never race a request.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import ssl
import tempfile
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.eventually import eventually
from tests.kube.kmock_ext import (
    CUSTOM_KINDS,
    KINDS,
    PLURAL_OF,
    Access,
    Obj,
    RtuiKube,
    Served,
    crd_condition,
    now_rfc3339,
)
from tests.kube.pod_network import Source

T = TypeVar("T")
KIND_KEYS = {kind: key for key, (kind, _, _) in {**KINDS, **CUSTOM_KINDS}.items()}
CONTEXT = "kmock"
TOKEN = "test-token-0"
# A name only the test proxies resolve (``tests/netproxies.py``), also in the server's certificate:
# a client that bypasses the proxy cannot find the server, one that ignores tls-server-name cannot trust it.
SERVER_NAME = "apiserver.rtui.test"
# The address the API server's proxy connects to pods from (a control-plane address in the node network).
APISERVER_IP = "10.0.0.2"


def _self_signed_for_loopback() -> tuple[bytes, bytes]:
    """A cert for 127.0.0.1 and ``SERVER_NAME`` that is its own CA: kubectl sends no credentials over plain http."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                       x509.DNSName(SERVER_NAME)]), critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


_TLS: tuple[bytes, bytes] | None = None


def _server_tls() -> tuple[ssl.SSLContext, bytes]:
    global _TLS
    _TLS = _TLS or _self_signed_for_loopback()
    cert, key = _TLS
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "cert").write_bytes(cert)
        (Path(tmp) / "key").write_bytes(key)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(Path(tmp) / "cert", Path(tmp) / "key")
    return context, cert


class KubeCluster:
    """A running ``RtuiKube`` and sync helpers to play the cluster's controllers."""

    def __init__(self) -> None:
        self.kube: RtuiKube
        self.url = ""
        self.kubeconfig = Path()
        self.token = TOKEN
        self._ssl, self.ca_pem = _server_tls()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),),
                                        name="kube-cluster", daemon=True)

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the emulated API server did not start")

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self.kube = RtuiKube()
        async with self.kube:
            server = aiohttp.web.Server(self.kube)
            listener = await asyncio.get_running_loop().create_server(server, "127.0.0.1", 0, ssl=self._ssl)
            self.url = f"https://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
            for ns in ("default", "kube-system"):
                await self.kube._create(("", "v1", "namespaces"), None, {"metadata": {"name": ns}})
            # The API server keeps its own addresses in the ``kubernetes`` Service's Endpoints.
            await self.kube._create(("", "v1", "endpoints"), "default", {
                "metadata": {"name": "kubernetes", "namespace": "default"},
                "subsets": [{"addresses": [{"ip": APISERVER_IP}], "ports": [{"name": "https", "port": 443,
                                                                              "protocol": "TCP"}]}]})
            self._ready.set()
            await self._stop.wait()
            await self.kube.drop_log_streams()
            listener.close()
            await server.shutdown(0.5)
            await listener.wait_closed()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def _on_loop(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()
        return self._call(run())

    # ---- auth and RBAC ------------------------------------------------------------------------------

    def require_token(self, check: Callable[[str], bool] | None) -> None:
        """Every request but /version must carry ``Bearer <t>`` with ``check(t)`` true, else 401."""
        self._on_loop(lambda: setattr(self.kube, "token_check", check))

    def reachable_when(self, check: Callable[[], bool] | None) -> None:
        """While ``check()`` is False no request gets any answer (the client times out)."""
        self._on_loop(lambda: setattr(self.kube, "reachable", check))

    def authorize_with(self, authorizer: Callable[[Access], str | None] | None) -> None:
        """Each request also asks ``authorizer`` (a denial's user name, or None to allow): 403 when it denies."""
        self._on_loop(lambda: setattr(self.kube, "authorizer", authorizer))

    def forbid(self, verb: str, resource: str, namespace: str | None = None) -> None:
        """403 for ``verb`` on ``resource`` (a plural, e.g. ``rayclusters``), in one namespace or all."""
        self._on_loop(lambda: self.kube.forbidden.add((verb, resource, namespace)))

    def requests(self, method: str | None = None, path_contains: str = "") -> list[Served]:
        return self._on_loop(lambda: [s for s in self.kube.served
                                      if (method is None or s.method == method) and path_contains in s.path])

    # ---- objects --------------------------------------------------------------------------------------

    def objects(self, kind: str, namespace: str | None = None) -> list[Obj]:
        return self._on_loop(lambda: self.kube.items(KIND_KEYS[kind], namespace))

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        return self._on_loop(lambda: self.kube.find(KIND_KEYS[kind], namespace, name))

    def read(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        """An object the test knows is there: its absence fails the test here, naming it."""
        found = self.get(kind, name, namespace)
        assert found is not None, f"no {kind} {namespace + '/' if namespace else ''}{name}"
        return found

    def create(self, obj: Obj) -> Obj:
        """As a controller would: the object as given, status included."""
        key = KIND_KEYS[obj["kind"]]
        return self._call(self.kube._create(key, obj["metadata"].get("namespace"), obj, keep_status=True))

    def patch(self, kind: str, name: str, namespace: str | None, patch: Obj) -> Obj:
        return self._call(self.kube._update(KIND_KEYS[kind], namespace, name, patch, None))

    def delete(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        """As a controller or the garbage collector would (a kubelet ending a pod, say)."""
        return self._call(self.kube._delete(KIND_KEYS[kind], namespace, name))

    def set_status(self, kind: str, name: str, namespace: str | None, status: Obj) -> Obj:
        return self._call(self.kube._update(KIND_KEYS[kind], namespace, name, {"status": status}, "status"))

    def advance_clock(self, seconds: float) -> None:
        """Stop the server's clock (the creationTimestamps it stamps) if it runs, then move it on by
        ``seconds``: in place of a real wait, and 0 to make the next objects of one second."""
        def move() -> None:
            self.kube.frozen_at = (self.kube.frozen_at or dt.datetime.now(dt.UTC)) + dt.timedelta(seconds=seconds)
        self._on_loop(move)

    def establish_after(self, seconds: float) -> None:
        """How long a new CRD takes to become Established (and its kinds served)."""
        self._on_loop(lambda: setattr(self.kube, "establish_after_s", seconds))

    def install_crd(self, crd: Obj, timeout: float = 10.0) -> Obj:
        """Create a CRD as someone else would, and wait until the server serves its kind."""
        self.create(crd)
        name = crd["metadata"]["name"]

        def established() -> Obj | None:
            live = self.get("CustomResourceDefinition", name)
            return live if live is not None and crd_condition(live, "Established") else None

        return eventually(f"CRD {name} to be Established", established, timeout)

    def add_namespace(self, name: str) -> Obj:
        return self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def add_node(self, name: str, gpus: int = 4, efa: int = 1, labels: dict[str, str] | None = None,
                 taints: list[Obj] | None = None, ready: bool = True, gpu_label: bool = True,
                 arch: str = "amd64") -> Obj:
        """A node; a GPU node carries ``nvidia.com/gpu.present=true`` unless ``gpu_label`` is False
        (only GPU Feature Discovery or the GPU Operator set it: EKS, GKE and many clusters lack it). Every
        node has the os and arch labels the kubelet sets on itself (kubernetes.io/docs/reference/labels-
        annotations-taints/: kubernetes.io/os, kubernetes.io/arch, from Go's runtime.GOOS/GOARCH)."""
        capacity = {"cpu": "48", "memory": "192Gi", "pods": "110"}
        if gpus:
            capacity["nvidia.com/gpu"] = str(gpus)
        if efa:
            capacity["vpc.amazonaws.com/efa"] = str(efa)
        node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": arch,
                       **({"nvidia.com/gpu.present": "true"} if gpus and gpu_label else {}), **(labels or {})}
        return self.create({"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "labels": node_labels},
                            "spec": {"taints": taints or []},
                            "status": {"capacity": capacity, "allocatable": dict(capacity),
                                       "conditions": [{"type": "Ready", "status": str(ready)}]}})

    def add_pod(self, namespace: str, name: str, labels: dict[str, str] | None = None, phase: str = "Pending",
                node: str | None = None) -> Obj:
        return self.create({"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
                            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]},
                            "status": {"phase": phase}})

    def set_pod_phase(self, namespace: str, name: str, phase: str, ready: bool | None = None,
                      reason: str | None = None) -> Obj:
        status: Obj = {"phase": phase}
        if ready is not None:
            status["conditions"] = [{"type": "Ready", "status": str(ready)}]
        if reason:
            status["reason"] = reason
        return self.set_status("Pod", name, namespace, status)

    def set_deployment_available(self, namespace: str, name: str, replicas: int = 1) -> Obj:
        return self.set_status("Deployment", name, namespace, {
            "replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
            "updatedReplicas": replicas, "conditions": [{"type": "Available", "status": "True"}]})

    def set_daemonset_ready(self, namespace: str, name: str, count: int = 1) -> Obj:
        return self.set_status("DaemonSet", name, namespace, {
            "desiredNumberScheduled": count, "currentNumberScheduled": count, "numberReady": count,
            "numberAvailable": count, "updatedNumberScheduled": count})

    def add_event(self, namespace: str, involved_kind: str, involved_name: str, reason: str, message: str,
                  type: str = "Normal") -> Obj:
        api_version = next(av for (av, kind) in PLURAL_OF if kind == involved_kind)
        return self.create({"apiVersion": "v1", "kind": "Event",
                            "metadata": {"generateName": f"{involved_name}.", "namespace": namespace},
                            "involvedObject": {"kind": involved_kind, "name": involved_name,
                                               "namespace": namespace, "apiVersion": api_version},
                            "reason": reason, "message": message, "type": type, "count": 1,
                            "lastTimestamp": now_rfc3339()})

    # ---- kubelet and service proxy -----------------------------------------------------------------

    def feed_log(self, namespace: str, pod: str, lines: list[str]) -> None:
        self._call(self.kube.feed_log(namespace, pod, lines))

    def drop_log_streams(self, abrupt: bool = False) -> None:
        """End every open log stream: cleanly (as an API server timeout does) or mid-chunk."""
        self._call(self.kube.drop_log_streams(abrupt))

    def enforce_network_policies(self, agent: str = "calico-node") -> Obj:
        """A CNI that enforces NetworkPolicies from now on, known by its agent's DaemonSet in kube-system."""
        self._on_loop(lambda: setattr(self.kube, "enforce_policies", True))
        return self.create({"apiVersion": "apps/v1", "kind": "DaemonSet",
                            "metadata": {"name": agent, "namespace": "kube-system", "labels": {"k8s-app": agent}},
                            "spec": {"selector": {"matchLabels": {"k8s-app": agent}}, "template": {
                                "metadata": {"labels": {"k8s-app": agent}},
                                "spec": {"nodeSelector": {"rtui.test/cni": "never-scheduled"},
                                         "containers": [{"name": agent, "image": f"docker.io/calico/{agent}:v3"}]}}}})

    def pod_request(self, src: Source, namespace: str, service: str, port: str, path: str,
                    headers: dict[str, str] | None = None) -> tuple[int, str] | None:
        """A request from ``src`` (a pod the test plays) to ``service:port`` over the pod network: the
        answer of the pod behind it, or None when the NetworkPolicies drop the connection."""
        reached = self._on_loop(lambda: self.kube.reach(src, namespace, service, port))
        if reached is None:
            return None
        target = self._on_loop(lambda: self.kube.proxies.get((namespace, service, port)))
        assert target is not None, f"nothing answers behind {namespace}/{service}:{port}"
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(urllib.request.Request(target + path, headers=headers or {}),
                                        timeout=10) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def proxy_to(self, namespace: str, service: str, port: str, target: str) -> None:
        """``/api/v1/namespaces/<ns>/services/<svc>:<port>/proxy/...`` forwards to ``target``."""
        self._on_loop(lambda: self.kube.proxies.__setitem__((namespace, service, port), target))

    def write_kubeconfig(self, path: Path, *, user: Obj | None = None, context: str = CONTEXT,
                         namespace: str = "default", host: str | None = None, proxy_url: str | None = None,
                         tls_server_name: str | None = None) -> Path:
        """A kubeconfig for this server; ``user`` defaults to the bearer token.

        ``host`` replaces 127.0.0.1 in the server URL (``SERVER_NAME`` through a proxy, ``localhost``
        with ``tls_server_name``); ``proxy_url`` and ``tls_server_name`` are the cluster entry's
        ``proxy-url`` and ``tls-server-name``.
        """
        server = self.url.replace("127.0.0.1", host) if host else self.url
        cluster: Obj = {"server": server, "certificate-authority-data": base64.b64encode(self.ca_pem).decode()}
        if proxy_url:
            cluster["proxy-url"] = proxy_url
        if tls_server_name:
            cluster["tls-server-name"] = tls_server_name
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": context, "cluster": cluster}],
            "users": [{"name": context, "user": user or {"token": self.token}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context, "namespace": namespace}}],
        }))
        path.chmod(0o600)
        return path


@pytest.fixture
def kube_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeCluster]:
    cluster = KubeCluster()
    cluster.start()
    try:
        cluster.require_token(lambda token: token == cluster.token)
        cluster.kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
        yield cluster
    finally:
        cluster.stop()
