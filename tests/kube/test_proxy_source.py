"""rtui reaches Ray wherever the API server reaches pods from (issue 35, item 3).

The API server's service proxy dials the head from the API server's network path, which is the address
in Endpoints ``default/kubernetes`` only where the control plane sits on a routed pod network. With
Calico IPIP/VXLAN or Canal it is the node's tunnel address, on GKE/AKS a Konnectivity agent pod
(``pod_network.calico_tunnel`` / ``konnectivity_agent`` say where that comes from). A NetworkPolicy
admitting the Endpoints addresses drops those, and the proxy times out. The API server's
``pods/portforward`` goes kubelet -> the pod's own network namespace instead, which no NetworkPolicy
filters (``kubelet_portforward``): rtui takes that path, and the policy stays as tight as before.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from targets.kube.api import KubeApi
from tests.kube.conftest import KubeCluster
from tests.kube.fake_ray import FakeRayHead
from tests.kube.kube_world import KubeWorld, events, failure, gpu_cluster, world
from tests.kube.pod_network import Source, calico_tunnel, konnectivity_agent

__all__ = ["world"]  # the fixture, imported for pytest

NAMESPACE, CLUSTER = "rtui", "rtui-ray"
SOURCES: dict[str, Callable[[], Source]] = {"konnectivity agent (GKE, AKS)": konnectivity_agent,
                                            "calico IPIP tunnel address": calico_tunnel}


def dial_from(cluster: KubeCluster, source: Source | None) -> None:
    """The API server's service proxy connects to pods from ``source`` from now on (None: its own address)."""
    cluster._on_loop(lambda: setattr(cluster.kube, "proxy_source", source))


def through_service_proxy(cluster: KubeCluster, path: str) -> tuple[int, str]:
    request = urllib.request.Request(f"{cluster.url}/api/v1/namespaces/{NAMESPACE}/services/"
                                     f"{CLUSTER}-head-svc:dashboard/proxy{path}",
                                     headers={"Authorization": f"Bearer {cluster.token}"})
    try:
        context = ssl.create_default_context(cadata=cluster.ca_pem.decode())
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.parametrize("name", list(SOURCES))
def test_the_emulated_service_proxy_is_dropped_from_a_source_the_policy_does_not_admit(
        world: KubeWorld, name: str) -> None:
    """The double first: with rtui's NetworkPolicy in place, the proxy dialing from the Endpoints address
    gets in (and meets Ray's token), from a tunnel or Konnectivity address it times out."""
    gpu_cluster(world.cluster)
    world.cluster.enforce_network_policies()
    world.rtui("up", "--yes", "--until", "kube.raycluster", timeout=180)
    status, _ = through_service_proxy(world.cluster, "/api/version")
    assert status == 401  # through the policy, then Ray's token
    dial_from(world.cluster, SOURCES[name]())
    status, body = through_service_proxy(world.cluster, "/api/version")
    assert status == 503 and "i/o timeout" in body, (status, body)


async def test_port_forward_reaches_the_head_whatever_the_policies(kube_cluster: KubeCluster) -> None:
    """``pods/portforward`` dials inside the pod: a policy admitting nothing does not stop it."""
    head = FakeRayHead(steps=2).start()
    try:
        kube_cluster.add_namespace(NAMESPACE)
        kube_cluster.add_pod(NAMESPACE, f"{CLUSTER}-head-0", labels={"ray.io/cluster": CLUSTER,
                                                                     "ray.io/node-type": "head"},
                             phase="Running", node="system-0")
        kube_cluster.create({"apiVersion": "v1", "kind": "Service",
                             "metadata": {"name": f"{CLUSTER}-head-svc", "namespace": NAMESPACE},
                             "spec": {"selector": {"ray.io/cluster": CLUSTER, "ray.io/node-type": "head"},
                                      "ports": [{"name": "dashboard", "port": 8265}]}})
        kube_cluster.proxy_to(NAMESPACE, f"{CLUSTER}-head-svc", "dashboard", head.url)
        kube_cluster.enforce_network_policies()
        kube_cluster.create({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                             "metadata": {"name": "deny-all", "namespace": NAMESPACE},
                             "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}})
        api = KubeApi.from_kubeconfig(str(kube_cluster.kubeconfig))
        try:
            forward = api.port_forward(NAMESPACE, f"{CLUSTER}-head-0", 8265)
            await forward.check()
            from backend.rayjobs import RayJobs

            async with RayJobs(forward.url) as jobs:
                assert "version" in await jobs.version()
        finally:
            api.close()
        assert kube_cluster.requests("GET", f"/pods/{CLUSTER}-head-0/portforward")
    finally:
        head.stop()


async def test_a_port_nothing_listens_on_is_the_kubelets_error_at_once(kube_cluster: KubeCluster) -> None:
    """The kubelet writes a failed dial on the error channel: the check says it, it does not wait it out."""
    from backend.errors import OperationError

    kube_cluster.add_namespace(NAMESPACE)
    kube_cluster.add_pod(NAMESPACE, f"{CLUSTER}-head-0", phase="Running", node="system-0")
    api = KubeApi.from_kubeconfig(str(kube_cluster.kubeconfig))
    try:
        with pytest.raises(OperationError, match="error forwarding port 8265 to pod rtui-ray-head-0"):
            await api.port_forward(NAMESPACE, f"{CLUSTER}-head-0", 8265).check()
    finally:
        api.close()


@pytest.mark.parametrize("name", list(SOURCES))
def test_a_job_runs_end_to_end_when_the_api_server_reaches_pods_from_elsewhere(world: KubeWorld, name: str) -> None:
    gpu_cluster(world.cluster)
    world.cluster.enforce_network_policies()
    dial_from(world.cluster, SOURCES[name]())
    up = world.rtui("up", "--yes", "--json", timeout=180)
    last = events(up.stdout)[-1]
    assert last["kind"] == "done" and last["data"]["job_status"] == "SUCCEEDED", last
    assert world.cluster.requests("GET", f"/pods/{CLUSTER}-head-0/portforward")
    world.rtui("down", "--yes", timeout=180)
    assert world.labelled() == []


def test_without_the_port_forward_right_a_blocked_proxy_is_said_in_seconds_with_what_to_check(
        world: KubeWorld) -> None:
    """No ``pods/portforward`` in the namespace: rtui falls back to the service proxy, and when the
    policy drops the proxy's source the step fails at once naming the kube-side causes, not after 90 s
    with a remedy about a local temp dir."""
    gpu_cluster(world.cluster)
    world.cluster.enforce_network_policies()
    world.cluster.forbid("create", "pods/portforward", NAMESPACE)
    world.rtui("up", "--yes", "--until", "kube.raycluster", timeout=180)
    dial_from(world.cluster, konnectivity_agent())
    up = world.rtui("up", "--yes", "--json", timeout=180, check=False)
    assert up.returncode != 0
    said = failure(up.stdout)
    assert "pods/portforward" in said and "NetworkPolicy" in said and "temp dir" not in said, said
    assert "still after" not in said, said  # not the submission's deadline (90 s) running out
