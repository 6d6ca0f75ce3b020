"""The emulator's NetworkPolicy semantics (pod_network.py) against the cases the Kubernetes docs spell out."""

from __future__ import annotations

from typing import Any

from targets.kube.config import KubeConfig
from targets.kube.security import network_policy
from tests.kube.pod_network import Source, admitted

RUN = "r20260101-120000-abcd"


def pod(ns: str, name: str, labels: dict[str, str], node: str = "n1") -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [{"name": "dashboard",
                                                                               "containerPort": 8265}]}]}}


def src(ns: str, name: str, labels: dict[str, str], ip: str = "10.244.0.9") -> Source:
    return Source(ip=ip, namespace=ns, labels=labels, pod=name, namespace_labels={"kubernetes.io/metadata.name": ns})


HEAD = pod("rtui", "head", {"ray.io/cluster": "rtui-ray"})
WORKER = src("rtui", "worker", {"ray.io/cluster": "rtui-ray"})
OUTSIDER = src("team-b", "nb", {"ray.io/cluster": "rtui-ray"})  # the same labels, another namespace


def test_rtuis_policy_admits_the_ray_pods_on_any_port_and_the_api_server_on_the_dashboard_only() -> None:
    policy = network_policy(KubeConfig(target="kube"), RUN, ["10.0.0.2/32"])
    assert admitted([], HEAD, OUTSIDER, 8265)  # no policy selects it: open
    assert admitted([policy], HEAD, WORKER, 6379) and admitted([policy], HEAD, WORKER, 8265)
    assert not admitted([policy], HEAD, OUTSIDER, 8265)  # podSelector alone: the policy's namespace only
    assert not admitted([policy], HEAD, src("rtui", "other", {"app": "x"}), 8265)
    apiserver = Source(ip="10.0.0.2")
    assert admitted([policy], HEAD, apiserver, 8265) and not admitted([policy], HEAD, apiserver, 6379)
    assert not admitted([policy], HEAD, Source(ip="10.0.0.3"), 8265)
    assert admitted([policy], HEAD, Source(ip="10.1.1.1", node="n1"), 6379)  # its own node: always
    without_apiserver = network_policy(KubeConfig(target="kube"), RUN, [])
    assert not admitted([without_apiserver], HEAD, apiserver, 8265)


def test_peer_kinds_named_ports_and_except() -> None:
    base = {"metadata": {"namespace": "rtui"}, "spec": {"podSelector": {}}}
    by_ns = {**base, "spec": {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "team-b"}}}], "ports": [{"port": "dashboard"}]}]}}
    assert admitted([by_ns], HEAD, OUTSIDER, 8265) and not admitted([by_ns], HEAD, OUTSIDER, 6379)
    assert not admitted([by_ns], HEAD, WORKER, 8265)  # selected pods take only what a rule allows
    both = {**base, "spec": {"podSelector": {}, "ingress": [{"from": [{
        "namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "x"}}}]}]}}
    assert admitted([both], HEAD, src("team-b", "x", {"app": "x"}), 1) and not admitted([both], HEAD, OUTSIDER, 1)
    block = {**base, "spec": {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {
        "cidr": "10.244.0.0/16", "except": ["10.244.0.0/24"]}}]}]}}
    assert admitted([block], HEAD, Source(ip="10.244.1.1"), 1)
    assert not admitted([block], HEAD, Source(ip="10.244.0.9"), 1)
    deny_all = {**base, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    assert not admitted([deny_all], HEAD, WORKER, 8265)
    egress_only = {**base, "spec": {"podSelector": {}, "policyTypes": ["Egress"]}}
    assert admitted([egress_only], HEAD, OUTSIDER, 8265)


def test_rtuis_policy_is_a_valid_networking_v1_object() -> None:
    """Through the official client's V1NetworkPolicy model (as test_addons checks the add-ons): a misspelt or
    unknown field would be dropped, a missing required one (an ipBlock's cidr) refused."""
    import json

    from kubernetes.client import ApiClient

    client = ApiClient()
    for cidrs in ([], ["10.0.0.2/32", "10.0.1.7/32"]):
        policy = network_policy(KubeConfig(target="kube", namespace="ml"), RUN, cidrs)
        model = client.deserialize(json.dumps(policy), "V1NetworkPolicy", "application/json")
        assert client.sanitize_for_serialization(model) == policy
        assert policy["metadata"]["namespace"] == "ml" and policy["spec"]["policyTypes"] == ["Ingress"]
