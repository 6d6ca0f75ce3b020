"""Networks between the user and the cluster: proxies, tls-server-name, silent drops (issue 19, items 5 and 6).

Every connection rtui makes to a cluster (the Kubernetes client, the pod-log stream, the Ray Jobs
API and its websocket through the API server's service proxy) goes the way the kubeconfig and the
environment say, as kubectl's would. The proxies are real ones on loopback (``tests/netproxies.py``);
the server's certificate names ``SERVER_NAME``, which only the proxies resolve, so a connection that
skips the proxy cannot even find the server, and one that ignores tls-server-name cannot trust it.

What the doubles copy of the real path, and where it is defined:
- routing as kubectl's: a kubeconfig ``proxy-url`` is used as is, NO_PROXY applies only to the
  environment's proxy (client-go ``transport/cache.go``: ``Config.Proxy``, else
  ``utilnet.NewProxierWithNoProxyCIDR(http.ProxyFromEnvironment)``); SOCKS5 gets the unresolved
  host (Go ``net/http/transport.go``); ``tls-server-name`` is the TLS ServerName
  (client-go ``rest.TLSClientConfig.ServerName``). The real kubectl checks the socks5 kubeconfig below.
- a followed pod log sends nothing while the container is quiet (the kubelet follows the log file,
  ``pkg/kubelet/kuberuntime/logs/logs.go``, and writes only what is logged): the emulator's log
  stream (``kmock_ext._serve_log``) is as silent, so only a read deadline can tell a quiet pod from
  a dead connection. The API server passes an upgraded (websocket) connection through byte for byte
  (apimachinery ``pkg/util/proxy/upgradeaware.go``) and Ray's aiohttp dashboard answers pings, so
  the tail's heartbeat reaches the head and back, as through the emulator's proxy.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import pytest

from targets.kube.api import KubeApi
from tests.eventually import eventually_async
from tests.kube.conftest import SERVER_NAME, KubeCluster
from tests.kube.fake_ray import FakeRayHead
from tests.kube.kube_world import KubeWorld, events, gpu_cluster, world  # noqa: F401 - a fixture
from tests.netproxies import ConnectProxy, Socks5Proxy, _Proxy

NS, SVC, POD = "default", "rtui-ray-head-svc", "rtui-ray-head-x"
NAMES = {SERVER_NAME: "127.0.0.1"}


@dataclass
class Proxies:
    http: ConnectProxy
    socks: Socks5Proxy


@pytest.fixture
def proxies() -> Iterator[Proxies]:
    with ConnectProxy(NAMES) as http, Socks5Proxy(NAMES) as socks:
        yield Proxies(http, socks)


@pytest.fixture
def head(kube_cluster: KubeCluster) -> Iterator[FakeRayHead]:
    fake = FakeRayHead(steps=3).start()
    kube_cluster.proxy_to(NS, SVC, "dashboard", fake.url)
    try:
        yield fake
    finally:
        fake.stop()


def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
                "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)


async def wait_for(what: str, cond: Callable[[], object], timeout: float = 20.0) -> None:
    """``eventually_async`` with this file's default deadline (the one polling implementation)."""
    await eventually_async(what, cond, timeout)


class KubeconfigRoute(TypedDict, total=False):
    """What ``KubeCluster.write_kubeconfig`` is given to route the client."""

    host: str
    proxy_url: str
    tls_server_name: str


@dataclass(frozen=True)
class Route:
    kubeconfig: Callable[[Proxies], KubeconfigRoute]
    env: Callable[[Proxies], dict[str, str]]
    via: Callable[[Proxies], _Proxy | None]  # the proxy every connection must pass; None: none may


ROUTES = {
    "kubeconfig proxy-url http (CONNECT)": Route(
        lambda p: {"host": SERVER_NAME, "proxy_url": p.http.url}, lambda p: {}, lambda p: p.http),
    "kubeconfig proxy-url socks5": Route(
        lambda p: {"host": SERVER_NAME, "proxy_url": p.socks.url}, lambda p: {}, lambda p: p.socks),
    "kubeconfig proxy-url socks5 with tls-server-name": Route(
        lambda p: {"host": "localhost", "proxy_url": p.socks.url, "tls_server_name": SERVER_NAME}, lambda p: {},
        lambda p: p.socks),
    # client-go applies NO_PROXY to the environment's proxy only, never to the kubeconfig's.
    "kubeconfig proxy-url despite NO_PROXY": Route(
        lambda p: {"host": SERVER_NAME, "proxy_url": p.http.url}, lambda p: {"NO_PROXY": SERVER_NAME},
        lambda p: p.http),
    "HTTPS_PROXY with tls-server-name": Route(
        lambda p: {"host": "localhost", "tls_server_name": SERVER_NAME}, lambda p: {"HTTPS_PROXY": p.http.url},
        lambda p: p.http),
    "NO_PROXY bypasses HTTPS_PROXY": Route(
        lambda p: {"host": "localhost", "tls_server_name": SERVER_NAME},
        lambda p: {"HTTPS_PROXY": p.http.url, "NO_PROXY": "localhost"}, lambda p: None),
}


@pytest.mark.parametrize("name", list(ROUTES))
async def test_every_connection_to_the_cluster_goes_the_kubeconfigs_way(
        name: str, kube_cluster: KubeCluster, head: FakeRayHead, proxies: Proxies, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    route = ROUTES[name]
    no_proxy_env(monkeypatch)
    for var, value in route.env(proxies).items():
        monkeypatch.setenv(var, value)
    path = kube_cluster.write_kubeconfig(tmp_path / "routed", **route.kubeconfig(proxies))
    kube_cluster.add_pod(NS, POD, phase="Running")
    kube_cluster.feed_log(NS, POD, ["head started", "dashboard up"])

    api = KubeApi.from_kubeconfig(str(path), timeout_s=5.0)
    try:
        assert await api.get("v1", "Namespace", "default") is not None
        log = [line async for line in api.read_pod_log(NS, POD, timestamps=False)]
        assert log == ["head started", "dashboard up"]
        async with api.ray_jobs(NS, SVC, "dashboard") as jobs:
            await jobs.submit(entrypoint="python train.py", submission_id="j1", runtime_env={}, metadata={})
            text = "".join([chunk async for chunk in jobs.follow("j1")])
        assert "RTUI_METRIC" in text and (await jobs.status("j1")).state.value == "SUCCEEDED"
    finally:
        api.close()

    served = kube_cluster.requests()
    assert any(s.path.endswith("/logs/tail") for s in served) and any("/log" in s.path for s in served)
    via = route.via(proxies)
    if via is None:
        assert proxies.http.tunnels == [] and proxies.socks.tunnels == []
    else:
        direct = [(s.method, s.path) for s in served if s.peer_port not in via.local_ports()]
        assert direct == [], f"went around the {via.kind} proxy: {direct[:5]}"
        assert {t.target.rsplit(":", 1)[0] for t in via.tunnels} == {route.kubeconfig(proxies)["host"]}


def test_kubectl_agrees_with_the_socks5_kubeconfig(kube_cluster: KubeCluster, proxies: Proxies,
                                                   tmp_path: Path) -> None:
    """The same kubeconfig works for the real kubectl: the routes above are kubectl's, not ours."""
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    path = kube_cluster.write_kubeconfig(tmp_path / "socks", host=SERVER_NAME, proxy_url=proxies.socks.url)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    done = subprocess.run([kubectl, "--kubeconfig", str(path), "get", "namespace", "default", "-o", "name"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "namespace/default", done.stderr
    assert proxies.socks.targets()


def test_up_and_down_through_a_connect_proxy(world: KubeWorld, proxies: Proxies) -> None:  # noqa: F811
    """The whole kube flow (plan, up with the job and its log, down) with the API server behind a proxy."""
    gpu_cluster(world.cluster)
    world.cluster.write_kubeconfig(world.cluster.kubeconfig, host=SERVER_NAME, proxy_url=proxies.http.url)
    up = world.rtui("up", "--yes", "--json", timeout=180)
    last = events(up.stdout)[-1]
    assert last["kind"] == "done" and last["data"]["job_status"] == "SUCCEEDED", last
    world.rtui("down", "--yes", timeout=180)
    assert world.labelled() == []
    served = world.cluster.requests()
    assert any("/pods/rtui-ray-head-0/portforward" in s.path for s in served)  # the Jobs API's way (portforward.py)
    direct = [(s.method, s.path) for s in served if s.peer_port not in proxies.http.local_ports()]
    assert direct == [], direct[:5]



# ---- item 6: a connection a load balancer forgot (no FIN, no RST) is noticed and resumed ----------------


async def test_a_pod_log_follow_notices_a_silent_drop_and_resumes_after_the_last_line(
        kube_cluster: KubeCluster, proxies: Proxies, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_proxy_env(monkeypatch)
    path = kube_cluster.write_kubeconfig(tmp_path / "via-lb", host=SERVER_NAME, proxy_url=proxies.http.url)
    kube_cluster.add_pod(NS, POD, phase="Running")
    kube_cluster.feed_log(NS, POD, [f"line {i}" for i in range(3)])
    api = KubeApi.from_kubeconfig(str(path), stream_idle_s=1.0)
    got: list[str] = []

    async def follow() -> None:
        async for line in api.read_pod_log(NS, POD, follow=True, timestamps=False):
            got.append(line)

    task = asyncio.create_task(follow())
    try:
        await wait_for("the first lines", lambda: len(got) >= 3)
        assert proxies.http.stall() >= 1  # the stream's tunnel and every pooled one
        kube_cluster.feed_log(NS, POD, [f"line {i}" for i in range(3, 6)])  # swallowed by the dead tunnel
        await wait_for("the lines logged after the drop", lambda: len(got) >= 6, timeout=15)
        kube_cluster.set_pod_phase(NS, POD, "Succeeded")
        kube_cluster.drop_log_streams()
        await asyncio.wait_for(task, 15)
    finally:
        task.cancel()
        api.close()
    assert got == [f"line {i}" for i in range(6)]  # no duplicate, no gap
    assert any("sinceTime" in s.query for s in kube_cluster.requests("GET", f"/pods/{POD}/log"))


async def test_a_job_log_follow_notices_a_silent_drop_and_resumes_after_the_last_character(
        kube_cluster: KubeCluster, proxies: Proxies, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_proxy_env(monkeypatch)
    fake = FakeRayHead(steps=80, line_every_s=0.05).start()
    kube_cluster.proxy_to(NS, SVC, "dashboard", fake.url)
    path = kube_cluster.write_kubeconfig(tmp_path / "via-lb", host=SERVER_NAME, proxy_url=proxies.http.url)
    api = KubeApi.from_kubeconfig(str(path), stream_idle_s=1.0)
    chunks: list[str] = []
    try:
        async with api.ray_jobs(NS, SVC, "dashboard") as jobs:
            await jobs.submit(entrypoint="python train.py", submission_id="j1", runtime_env={}, metadata={})

            async def follow() -> None:
                async for chunk in jobs.follow("j1"):
                    chunks.append(chunk)

            task = asyncio.create_task(follow())
            try:
                await wait_for("the first metric lines", lambda: "RTUI_METRIC" in "".join(chunks))
                before = len(proxies.http.tunnels)
                assert proxies.http.stall() >= 1
                await asyncio.wait_for(task, 30)
            finally:
                task.cancel()
            assert (await jobs.status("j1")).state.value == "SUCCEEDED"
        log = fake.on_loop(lambda: fake.jobs["j1"].log)
    finally:
        api.close()
        fake.stop()
    assert len(proxies.http.tunnels) > before  # it came back on new connections
    assert "".join(chunks) == log  # no duplicate, no gap


def test_rtui_logs_follow_of_the_head_resumes_after_a_silent_drop(world: KubeWorld, proxies: Proxies) -> None:  # noqa: F811
    """The same through the CLI: `rtui logs --source head -f` behind a proxy that forgets the stream."""
    from tests.kube.kube_world import wait_until
    from tests.kube.test_kube_failures_access import _reader

    gpu_cluster(world.cluster)
    world.rtui("up", "--yes", "--until", "kube.raycluster", timeout=120)
    world.cluster.write_kubeconfig(world.cluster.kubeconfig, host=SERVER_NAME, proxy_url=proxies.http.url)
    world.env["RTUI_KUBE_STREAM_IDLE_S"] = "1"
    ns, pod = "rtui", "rtui-ray-head-0"
    fed = [f"before {i}" for i in range(3)]
    world.cluster.feed_log(ns, pod, fed)
    proc = world.start("logs", "--source", "head", "-f")
    try:
        out = _reader(proc)
        wait_until("the first lines", lambda: len(out) >= len(fed))
        assert proxies.http.stall() >= 1
        later = [f"after {i}" for i in range(3)]
        world.cluster.feed_log(ns, pod, later)
        fed += later
        wait_until("the lines logged after the drop", lambda: len(out) >= len(fed), timeout=20)
        # A late duplicate would come before a line logged after these: wait for one (the positive
        # signal that the stream has moved past), then compare.
        world.cluster.feed_log(ns, pod, ["sentinel"])
        fed.append("sentinel")
        wait_until("the line logged after the last one", lambda: "sentinel" in out, timeout=20)
        assert proc.poll() is None, proc.communicate()
    finally:
        proc.terminate()
        proc.wait(10)
    assert out == fed
