"""KubeApi against the emulated API server, over real HTTP through the official client."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import pytest

from backend.errors import OperationError, UserError
from targets.kube.api import KubeApi, split_timestamp
from tests.eventually import eventually, eventually_async
from tests.kube.conftest import KubeCluster
from tests.kube.crds import install_shared_crds

RAYCLUSTER: dict[str, Any] = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
              "metadata": {"name": "rtui-ray", "namespace": "rtui", "labels": {"app.kubernetes.io/managed-by": "rtui"}},
              "spec": {"rayVersion": "2.58.0", "headGroupSpec": {
                  "rayStartParams": {"num-gpus": "0"},
                  # The CRD requires it: the API server refuses a RayCluster without (422 Invalid).
                  "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.58.0"}]}}}}}


async def test_apply_creates_then_merges_without_a_change(kube_cluster: KubeCluster) -> None:
    install_shared_crds(kube_cluster)  # a fresh server serves no ray.io
    api = KubeApi.from_kubeconfig()
    await api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rtui"}})
    first = await api.apply(RAYCLUSTER)
    again = await api.apply(RAYCLUSTER)
    statuses = [s.status for s in kube_cluster.requests("PATCH", "/rayclusters/rtui-ray")]
    assert statuses == [201, 200]
    assert {s.content_type for s in kube_cluster.requests("PATCH")} == {"application/apply-patch+yaml"}
    assert kube_cluster.requests("PATCH")[0].query == {"fieldManager": "rtui", "force": "true"}
    assert first["metadata"]["uid"] and again["metadata"]["uid"] == first["metadata"]["uid"]
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]  # a no-op
    changed = {**RAYCLUSTER, "spec": {**RAYCLUSTER["spec"], "rayVersion": "2.59.0"}}
    third = await api.apply(changed)
    assert third["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]
    assert third["spec"]["headGroupSpec"] == RAYCLUSTER["spec"]["headGroupSpec"]
    assert [m["manager"] for m in third["metadata"]["managedFields"]] == ["rtui"]
    stored = kube_cluster.get("RayCluster", "rtui-ray", "rtui")
    assert stored is not None and stored["spec"]["rayVersion"] == "2.59.0"


async def test_get_delete_and_status(kube_cluster: KubeCluster) -> None:
    install_shared_crds(kube_cluster)  # a fresh server serves no ray.io
    api = KubeApi.from_kubeconfig()
    assert await api.get("v1", "Namespace", "rtui") is None
    await api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rtui"}})
    assert kube_cluster.get("Namespace", "rtui") is not None
    await api.apply(RAYCLUSTER)
    patched = await api.patch_status("ray.io/v1", "RayCluster", "rtui-ray", "rtui", {"state": "ready"})
    assert patched["status"] == {"state": "ready"}
    got = await api.get("ray.io/v1", "RayCluster", "rtui-ray", "rtui")
    assert got is not None and got["status"]["state"] == "ready"
    assert await api.delete("ray.io/v1", "RayCluster", "rtui-ray", "rtui") is True
    assert await api.delete("ray.io/v1", "RayCluster", "rtui-ray", "rtui") is False
    assert kube_cluster.objects("RayCluster") == []


async def test_creating_in_a_missing_namespace_fails_like_a_cluster(kube_cluster: KubeCluster) -> None:
    install_shared_crds(kube_cluster)
    api = KubeApi.from_kubeconfig()
    with pytest.raises(Exception, match="namespaces"):
        await api.apply(RAYCLUSTER)


async def test_label_selectors_filter(kube_cluster: KubeCluster) -> None:
    kube_cluster.add_namespace("rtui")
    kube_cluster.add_pod("rtui", "head", {"ray.io/node-type": "head", "run": "a"})
    kube_cluster.add_pod("rtui", "w0", {"ray.io/node-type": "worker", "run": "a"})
    kube_cluster.add_pod("rtui", "w1", {"ray.io/node-type": "worker", "run": "b"})
    kube_cluster.add_pod("default", "other", {})
    api = KubeApi.from_kubeconfig()

    async def names(selector: str | None, namespace: str | None = "rtui") -> list[str]:
        return sorted(p["metadata"]["name"] for p in await api.list("v1", "Pod", namespace, selector))

    assert await names(None) == ["head", "w0", "w1"]
    assert await names(None, namespace=None) == ["head", "other", "w0", "w1"]
    assert await names("ray.io/node-type=worker") == ["w0", "w1"]
    assert await names("ray.io/node-type=worker,run!=b") == ["w0"]
    assert await names("run in (a, c)") == ["head", "w0"]
    assert await names("run notin (a)") == ["w1"]
    assert await names("run") == ["head", "w0", "w1"]
    assert await names("!run", namespace=None) == ["other"]


async def test_events_of_an_object(kube_cluster: KubeCluster) -> None:
    kube_cluster.add_namespace("rtui")
    kube_cluster.add_event("rtui", "Pod", "w0", "FailedScheduling", "0/2 nodes: Insufficient nvidia.com/gpu")
    kube_cluster.add_event("rtui", "Pod", "head", "Scheduled", "assigned")
    api = KubeApi.from_kubeconfig()
    events = await api.events("rtui", "w0")
    assert [e["reason"] for e in events] == ["FailedScheduling"]


async def test_forbidden_names_the_verb_and_the_resource(kube_cluster: KubeCluster) -> None:
    kube_cluster.add_namespace("rtui")
    kube_cluster.forbid("patch", "rayclusters", "rtui")
    api = KubeApi.from_kubeconfig()
    with pytest.raises(UserError) as err:
        await api.apply(RAYCLUSTER)
    assert "forbidden: cannot patch rayclusters.ray.io in namespace rtui" in str(err.value)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


async def test_expired_credentials_say_how_to_refresh(kube_cluster: KubeCluster) -> None:
    kube_cluster.require_token(lambda token: False)
    api = KubeApi.from_kubeconfig()
    with pytest.raises(UserError, match="refused the credentials.*aws sso login"):
        await api.list("v1", "Node")


async def test_a_kind_the_server_lacks_is_a_clear_error(kube_cluster: KubeCluster) -> None:
    kube_cluster.kube.token_check = None
    api = KubeApi.from_kubeconfig()
    api_path = api.path
    api.path = lambda *a, **k: api_path(*a, **k).replace("/ray.io/", "/nope.io/")
    with pytest.raises(UserError, match="does not serve rayclusters.ray.io.*CustomResourceDefinition"):
        await api.get("ray.io/v1", "RayCluster", "x", "rtui")


async def test_a_token_refreshed_mid_run_is_used_by_the_next_request(kube_cluster: KubeCluster) -> None:
    issued: list[str] = []

    def provider() -> str:  # a new token each time it is asked, like a renewing EKS token
        issued.append(f"token-{len(issued)}")
        return issued[-1]

    kube_cluster.require_token(lambda token: token == issued[-1])
    api = KubeApi.from_kubeconfig(token_provider=provider)
    await api.list("v1", "Node")
    await api.list("v1", "Node")
    assert len(issued) >= 3  # one at setup, then one per request
    seen = [s for s in kube_cluster.requests("GET", "/api/v1/nodes")]
    assert [s.status for s in seen] == [200, 200]
    assert api.headers() == {"Authorization": f"Bearer {issued[-1]}"}


async def test_unknown_context_lists_the_known_ones(kube_cluster: KubeCluster) -> None:
    with pytest.raises(UserError, match="no context 'prod'.*known contexts: kmock"):
        KubeApi.from_kubeconfig(context="prod")


def test_no_kubeconfig_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope"
    monkeypatch.setenv("KUBECONFIG", f"{missing}:{tmp_path / 'nope2'}")
    with pytest.raises(UserError, match=f"looked in {missing}.*--kubeconfig.*update-kubeconfig.*--target local"):
        KubeApi.from_kubeconfig()


def test_a_malformed_kubeconfig(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("clusters: [unclosed\n")
    with pytest.raises(UserError, match="malformed"):
        KubeApi.from_kubeconfig(str(bad))


def test_kubeconfig_list_is_merged_like_kubectl(kube_cluster: KubeCluster, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    other = kube_cluster.write_kubeconfig(tmp_path / "other", context="second", namespace="team")
    monkeypatch.setenv("KUBECONFIG", f"{kube_cluster.kubeconfig}:{other}")
    api = KubeApi.from_kubeconfig(context="second")
    assert (api.context, api.namespace_default, api.server) == ("second", "team", kube_cluster.url)
    assert KubeApi.from_kubeconfig().context == "kmock"  # the first file's current-context wins
    assert api.ssl_context() is not None  # the kubeconfig's CA: the fixture serves https
    assert api.proxy_url("rtui", "rtui-ray-head-svc", "dashboard") == (
        f"{kube_cluster.url}/api/v1/namespaces/rtui/services/rtui-ray-head-svc:dashboard/proxy")


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(sock.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    sock.close()


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


@pytest.mark.parametrize("kind", ["closed port", "silent listener"])
async def test_an_unreachable_server_fails_within_the_deadline(kube_cluster: KubeCluster, tmp_path: Path,
                                                                silent_listener: int, kind: str) -> None:
    port = closed_port() if kind == "closed port" else silent_listener
    kube_cluster.url = f"http://127.0.0.1:{port}"
    config = kube_cluster.write_kubeconfig(tmp_path / "dead")
    api = KubeApi.from_kubeconfig(str(config), timeout_s=1.5)
    # The error names the deadline it met (no elapsed-time figure asserted: that is a benchmark's).
    with pytest.raises(OperationError, match=f"cannot reach the Kubernetes API server at http://127.0.0.1:{port} "
                                             r"within 1.5s") as err:
        await api.list("v1", "Node")
    assert err.value.exit_code == 1


async def test_pod_log_follow_gets_fed_lines_and_survives_dropped_streams(kube_cluster: KubeCluster) -> None:
    kube_cluster.add_namespace("rtui")
    kube_cluster.add_pod("rtui", "head", phase="Running")
    kube_cluster.feed_log("rtui", "head", ["one", "two"])
    api = KubeApi.from_kubeconfig()
    received: list[str] = []

    async def follow() -> None:
        async for line in api.read_pod_log("rtui", "head", follow=True, timestamps=False):
            received.append(line)

    async def until(count: int) -> None:
        await eventually_async(f"{count} lines (got {received})", lambda: len(received) >= count, timeout=30)

    task = asyncio.create_task(follow())
    await until(2)
    await asyncio.to_thread(kube_cluster.feed_log, "rtui", "head", ["three"])
    await until(3)
    await asyncio.to_thread(kube_cluster.drop_log_streams)  # the server ends the stream cleanly
    await asyncio.to_thread(kube_cluster.feed_log, "rtui", "head", ["four"])
    await until(4)
    await asyncio.to_thread(kube_cluster.drop_log_streams, True)  # the connection breaks mid-stream
    await asyncio.to_thread(kube_cluster.feed_log, "rtui", "head", ["five"])
    await until(5)
    await asyncio.to_thread(kube_cluster.set_pod_phase, "rtui", "head", "Succeeded")
    await asyncio.to_thread(kube_cluster.drop_log_streams)  # a finished pod ends the follow
    await asyncio.wait_for(task, 5)
    assert received == ["one", "two", "three", "four", "five"]  # none lost, none repeated
    reconnects = kube_cluster.requests("GET", "/pods/head/log")
    assert len(reconnects) >= 3 and "sinceTime" in reconnects[-1].query


async def test_pod_log_without_follow_keeps_timestamps(kube_cluster: KubeCluster) -> None:
    kube_cluster.add_namespace("rtui")
    kube_cluster.add_pod("rtui", "w0", phase="Running")
    kube_cluster.feed_log("rtui", "w0", ["NCCL INFO Using network AWS Libfabric"])
    api = KubeApi.from_kubeconfig()
    lines = [line async for line in api.read_pod_log("rtui", "w0")]
    assert len(lines) == 1
    ts, text = split_timestamp(lines[0])
    assert ts is not None and ts.endswith("Z") and text == "NCCL INFO Using network AWS Libfabric"


@contextlib.asynccontextmanager
async def serving(app: aiohttp.web.Application) -> AsyncIterator[int]:
    """``app`` served on a free loopback port (yielded) until the block ends."""
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def test_service_proxy_carries_our_auth_headers(kube_cluster: KubeCluster) -> None:
    """The Ray Jobs client's path: aiohttp with KubeApi's headers, through the API server's proxy."""
    seen: list[dict[str, str]] = []

    async def dashboard(request: aiohttp.web.Request) -> aiohttp.web.Response:
        seen.append(dict(request.headers))
        return aiohttp.web.json_response({"path": request.path, "q": dict(request.query)})

    app = aiohttp.web.Application()
    app.router.add_get("/{tail:.*}", dashboard)
    async with serving(app) as port:
        api = KubeApi.from_kubeconfig()
        url = api.proxy_url("rtui", "rtui-ray-head-svc", "dashboard")
        connector = aiohttp.TCPConnector(ssl=api.ssl_context() or True)
        async with aiohttp.ClientSession(headers={**api.headers(), "X-Ray": "1"}, connector=connector) as http:
            async with http.get(f"{url}/api/jobs/") as resp:
                assert resp.status == 503  # no endpoints yet
            kube_cluster.proxy_to("rtui", "rtui-ray-head-svc", "dashboard", f"http://127.0.0.1:{port}")
            async with http.get(f"{url}/api/jobs/", params={"limit": "1"}) as resp:
                assert resp.status == 200
                assert await resp.json() == {"path": "/api/jobs/", "q": {"limit": "1"}}
            async with aiohttp.ClientSession() as anonymous, \
                    anonymous.get(f"{url}/api/jobs/", ssl=api.ssl_context() or True) as resp:
                assert resp.status == 401
        assert seen[0]["X-Ray"] == "1" and "Authorization" not in seen[0]


async def test_service_proxy_forwards_websockets(kube_cluster: KubeCluster) -> None:
    """Ray's dashboard streams job logs over a websocket: the proxy must upgrade too."""

    async def echo(request: aiohttp.web.Request) -> aiohttp.web.WebSocketResponse:
        ws = aiohttp.web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            await ws.send_str(f"echo {msg.data}")
        return ws

    app = aiohttp.web.Application()
    app.router.add_get("/logs/tail", echo)
    async with serving(app) as port:
        api = KubeApi.from_kubeconfig()
        kube_cluster.proxy_to("rtui", "head-svc", "dashboard", f"http://127.0.0.1:{port}")
        url = api.proxy_url("rtui", "head-svc", "dashboard") + "/logs/tail"
        async with aiohttp.ClientSession(headers=api.headers()) as http, \
                http.ws_connect(url, ssl=api.ssl_context() or True) as ws:
            await ws.send_str("hello")
            reply = await asyncio.wait_for(ws.receive(), 5)
            assert reply.data == "echo hello"


async def test_log_of_a_missing_pod_is_empty(kube_cluster: KubeCluster) -> None:
    kube_cluster.add_namespace("rtui")
    api = KubeApi.from_kubeconfig()
    assert [line async for line in api.read_pod_log("rtui", "gone", follow=True)] == []


# ---- pods/exec: the emulator refuses what the API server and the kubelet refuse --------------------

def _exec_pod(cluster: KubeCluster, tmp_path: Path, *, node: str | None = "n0", phase: str = "Running",
              running: bool = True) -> None:
    """A pod whose exec sees ``tmp_path`` (the fake kubelet's ``exec_dirs``)."""
    cluster.add_namespace("team")
    cluster.add_pod("team", "p", node=node)
    state = {"running": {"startedAt": "now"}} if running else {"waiting": {"reason": "ContainerCreating"}}
    cluster.set_status("Pod", "p", "team", {"phase": phase, "containerStatuses": [
        {"name": "main", "ready": running, "restartCount": 0, "state": state}]})
    cluster.kube.exec_dirs[("team", "p")] = tmp_path


def _exec(command: list[str], container: str = "main") -> tuple[bytes, bytes, dict[str, Any]]:
    api = KubeApi.from_kubeconfig()
    out, err, status = bytearray(), bytearray(), {}
    try:
        for channel, data in api.exec_frames("team", "p", container, command):
            if channel == 1:
                out.extend(data)
            elif channel == 2:
                err.extend(data)
            elif channel == 3 and data:
                import json

                status = json.loads(data)
    finally:
        api.close()
    return bytes(out), bytes(err), status


def test_exec_streams_binary_stdout_and_the_success_status(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    blob = bytes(range(256)) * 1000
    (tmp_path / "blob").write_bytes(blob)
    _exec_pod(kube_cluster, tmp_path)
    out, err, status = _exec(["cat", "blob"])
    assert out == blob and err == b""
    assert status == {"metadata": {}, "status": "Success"}
    eventually("the exec request to be recorded (once its handler returns)",
               lambda: kube_cluster.requests(path_contains="/exec"), timeout=30)
    [served] = kube_cluster.requests(path_contains="/exec")
    assert served.status == 101 and served.query["stdout"] == "true" and served.query["command"] == "cat"


def test_exec_of_a_failing_command_ends_with_a_failure_status_and_its_exit_code(
        kube_cluster: KubeCluster, tmp_path: Path) -> None:
    _exec_pod(kube_cluster, tmp_path)
    out, err, status = _exec(["cat", "missing"])
    assert out == b"" and b"missing" in err
    assert status["status"] == "Failure" and status["reason"] == "NonZeroExitCode"
    assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "1"}]
    assert status["message"].startswith("command terminated with non-zero exit code")


@pytest.mark.parametrize(("pod", "says"), [
    ({"node": None, "phase": "Pending", "running": False}, "pod p does not have a host assigned"),
    ({"phase": "Succeeded", "running": False},
     "cannot exec into a container in a completed pod; current phase is Succeeded"),
    ({"phase": "Pending", "running": False}, 'container not found ("main")'),
])
def test_exec_into_a_pod_that_is_not_running_is_refused(
        kube_cluster: KubeCluster, tmp_path: Path, pod: dict[str, Any], says: str) -> None:
    _exec_pod(kube_cluster, tmp_path, **pod)
    with pytest.raises(OperationError, match=re.escape(says)):
        _exec(["true"])


def test_exec_into_a_container_the_pod_lacks_is_refused(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    _exec_pod(kube_cluster, tmp_path)
    with pytest.raises(OperationError, match="container other is not valid for pod p"):
        _exec(["true"], container="other")


def test_exec_forbidden_by_rbac_is_a_403_naming_the_permission(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    from targets.kube.api import Forbidden

    _exec_pod(kube_cluster, tmp_path)
    kube_cluster.forbid("create", "pods/exec", "team")
    with pytest.raises(Forbidden, match="cannot create pods/exec in namespace team"):
        _exec(["true"])
