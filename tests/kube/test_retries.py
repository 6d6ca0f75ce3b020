"""The Kubernetes client tries again where the API server says to (issue 35, item 8).

kube-apiserver's API Priority and Fairness rejects a request it has no seat for with 429 and
``Retry-After`` before any handler runs (kubernetes.io/docs/concepts/cluster-administration/flow-control/):
any verb may be sent again after that delay. A 500/502/503/504 may come after the change was made, so only
requests that are safe to repeat (reads, a delete, a server-side apply) are sent again; a create is not.
client-go does the same (rest/request.go: a 429, or a 5xx with Retry-After, waits and retries up to
``maxRetries``). The emulator answers as APF does (kmock_ext.too_many_requests).
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp.web
import pytest

from backend.errors import OperationError
from targets.kube.api import KubeApi
from tests.kube.conftest import KubeCluster
from tests.kube.kmock_ext import too_many_requests, unavailable


class RecordingClock:
    """The retries' clock: records each wait and returns at once (no real sleep in the test)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def _first(n: int, method: str, path: str, answer: Callable[[], aiohttp.web.Response]
           ) -> Callable[[str, str], aiohttp.web.Response | None]:
    left = [n]

    def fault(m: str, p: str) -> aiohttp.web.Response | None:
        if m == method and p == path and left[0] > 0:
            left[0] -= 1
            return answer()
        return None
    return fault


def _api(cluster: KubeCluster, fault: Callable[[str, str], aiohttp.web.Response | None]) -> tuple[KubeApi,
                                                                                                   RecordingClock]:
    cluster._on_loop(lambda: setattr(cluster.kube, "fault", fault))
    api = KubeApi.from_kubeconfig(str(cluster.kubeconfig))
    clock = RecordingClock()
    api.clock = clock
    return api, clock


async def test_a_429_is_tried_again_after_its_retry_after(kube_cluster: KubeCluster) -> None:
    api, clock = _api(kube_cluster, _first(2, "GET", "/api/v1/namespaces/default", lambda: too_many_requests(3)))
    try:
        found = await api.get("v1", "Namespace", "default")
    finally:
        api.close()
    assert found is not None and found["metadata"]["name"] == "default"
    assert len(kube_cluster.requests("GET", "/api/v1/namespaces/default")) == 3
    assert len(clock.waits) == 2 and min(clock.waits) >= 3, clock.waits  # Retry-After honoured


async def test_a_429_on_an_apply_is_tried_again(kube_cluster: KubeCluster) -> None:
    """APF refused it before any handler: nothing was written, so a write is safe to send again."""
    api, clock = _api(kube_cluster, _first(1, "PATCH", "/api/v1/namespaces/team-a", lambda: too_many_requests(1)))
    try:
        await api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    finally:
        api.close()
    assert kube_cluster.get("Namespace", "team-a") is not None


async def test_a_503_on_a_read_is_tried_again(kube_cluster: KubeCluster) -> None:
    api, clock = _api(kube_cluster, _first(2, "GET", "/api/v1/nodes", unavailable))
    try:
        assert await api.list("v1", "Node") == []
    finally:
        api.close()
    assert len(clock.waits) == 2


async def test_throttling_that_does_not_end_fails_in_one_line(kube_cluster: KubeCluster) -> None:
    api, clock = _api(kube_cluster, _first(1000, "GET", "/api/v1/nodes", lambda: too_many_requests(1)))
    try:
        with pytest.raises(OperationError) as raised:
            await api.list("v1", "Node")
    finally:
        api.close()
    assert "HTTP 429" in raised.value.message and "\n" not in raised.value.message
    assert 2 <= len(clock.waits) <= 10  # bounded
    assert sum(clock.waits) <= 60
