"""Issue 35 item 8: the ``pods/exec`` WebSocket goes the kubeconfig's way, as every other request does.

kubectl's exec is client-go's (its SPDY/WebSocket dialer uses the same ``rest.Config.Proxy`` as REST, SOCKS5
with the unresolved host: Go ``net/http/transport.go``). The Python client hands websocket-client only the
proxy's host and port (kubernetes ``stream/ws_client.py`` ``websocket_proxycare``), and websocket-client then
speaks HTTP CONNECT (its ``proxy_type`` defaults to ``http``: ``websocket/_http.py``): to a SOCKS5 proxy that
is garbage, and the exec (rtui's volume reader, ``rtui model``) fails on a kubeconfig whose REST works.
The proxies are real ones on loopback (``tests/netproxies.py``); the server's name resolves only through them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from targets.kube.api import KubeApi, Unreachable
from tests.kube.conftest import KubeCluster
from tests.kube.test_kube_networks import ROUTES, Proxies, no_proxy_env
from tests.netproxies import ConnectProxy, Socks5Proxy

NAMES = {"apiserver.rtui.test": "127.0.0.1"}


@pytest.fixture
def proxies() -> Iterator[Proxies]:
    with ConnectProxy(NAMES) as http, Socks5Proxy(NAMES) as socks:
        yield Proxies(http, socks)


def exec_output(api: KubeApi, command: list[str]) -> tuple[bytes, dict[str, Any]]:
    out, status = bytearray(), {}
    for channel, data in api.exec_frames("team", "p", "main", command):
        if channel == 1:
            out.extend(data)
        elif channel == 3 and data:
            status = json.loads(data)
    return bytes(out), status


@pytest.mark.timeout(60)  # websocket-client speaking HTTP to a SOCKS proxy waits for an answer forever
@pytest.mark.parametrize("name", list(ROUTES))
def test_exec_goes_the_kubeconfigs_way(name: str, kube_cluster: KubeCluster, proxies: Proxies, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    route = ROUTES[name]
    no_proxy_env(monkeypatch)
    for var, value in route.env(proxies).items():
        monkeypatch.setenv(var, value)
    blob = bytes(range(256)) * 64
    (tmp_path / "blob").write_bytes(blob)
    kube_cluster.add_namespace("team")
    kube_cluster.add_pod("team", "p", node="n0")
    kube_cluster.set_status("Pod", "p", "team", {"phase": "Running", "containerStatuses": [
        {"name": "main", "ready": True, "restartCount": 0, "state": {"running": {"startedAt": "now"}}}]})
    kube_cluster.kube.exec_dirs[("team", "p")] = tmp_path
    path = kube_cluster.write_kubeconfig(tmp_path / "routed", **route.kubeconfig(proxies))

    api = KubeApi.from_kubeconfig(str(path), timeout_s=5.0)
    try:
        out, status = exec_output(api, ["cat", "blob"])
    finally:
        api.close()
    assert out == blob and status.get("status") == "Success", status
    via = route.via(proxies)
    if via is None:
        assert proxies.http.tunnels == [] and proxies.socks.tunnels == []
    else:
        assert via.tunnels, f"the exec went around the {via.kind} proxy"
        assert {t.target.rsplit(":", 1)[0] for t in via.tunnels} == {route.kubeconfig(proxies)["host"]}


@pytest.mark.timeout(60)
def test_a_server_the_socks_proxy_cannot_reach_is_one_line(kube_cluster: KubeCluster, proxies: Proxies,
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_proxy_env(monkeypatch)
    path = kube_cluster.write_kubeconfig(tmp_path / "routed", host="unknown.rtui.test", proxy_url=proxies.socks.url)
    api = KubeApi.from_kubeconfig(str(path), timeout_s=5.0)
    try:
        with pytest.raises(Unreachable, match="cannot open an exec stream to team/p") as err:
            exec_output(api, ["true"])
    finally:
        api.close()
    assert "\n" not in str(err.value) and "unknown.rtui.test" in str(err.value)
