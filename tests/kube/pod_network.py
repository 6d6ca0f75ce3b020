"""The pod network as a NetworkPolicy-enforcing CNI sees it: which connections reach a pod.

Semantics from the Kubernetes docs, "Network Policies" (kubernetes.io/docs/concepts/services-networking/
network-policies) and the networking.k8s.io/v1 API reference (NetworkPolicySpec, NetworkPolicyIngressRule,
NetworkPolicyPeer, NetworkPolicyPort):
- a pod is isolated for ingress once any policy of its namespace selects it (``podSelector``; ``{}``
  selects every pod) with ``Ingress`` in ``policyTypes`` (absent: Ingress, plus Egress when the policy
  has egress rules); an isolated pod takes only what some rule of some selecting policy allows (the
  union); a pod that no policy selects takes everything;
- a rule allows a connection when one of its ``from`` peers matches the source (no ``from``: any
  source) and one of its ``ports`` matches the destination port and protocol (no ``ports``: any port;
  a port by name is the destination container's port of that name; ``endPort`` makes a range;
  ``protocol`` defaults to TCP);
- a peer with ``podSelector`` only: pods of the policy's own namespace; ``namespaceSelector`` only:
  every pod of the namespaces it selects; both: pods it selects in the namespaces it selects;
  ``ipBlock``: sources whose address is in ``cidr`` and in none of ``except``;
- always allowed whatever the policies: a pod to itself, and traffic from the pod's own node.
A cluster whose CNI enforces nothing admits everything (the objects are accepted and do nothing).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Source:
    """Where a connection comes from: a pod (namespace, labels, IP) or a bare address (a node, the API server)."""

    ip: str
    namespace: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)
    pod: str | None = None
    node: str | None = None  # set for traffic from a node itself (host network)


def selector_matches(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (``matchLabels`` and ``matchExpressions``); the empty selector matches everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def policy_types(policy: Obj) -> list[str]:
    spec = policy.get("spec") or {}
    return list(spec.get("policyTypes") or (["Ingress"] + (["Egress"] if spec.get("egress") else [])))


def _peer_matches(peer: Obj, policy_namespace: str, src: Source) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        address = ipaddress.ip_address(src.ip)
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(e) for e in block.get("except") or [])
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if src.pod is None or (pods is None and namespaces is None):
        return False  # selectors name pods: a bare address is none of them
    in_namespace = src.namespace == policy_namespace if namespaces is None else \
        selector_matches(namespaces, src.namespace_labels)
    return in_namespace and (pods is None or selector_matches(pods, src.labels))


def _port_matches(ports: list[Obj], dst_pod: Obj, port: int, protocol: str) -> bool:
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        want = p.get("port")
        if want is None:
            return True
        if isinstance(want, int):
            if want == port or (p.get("endPort") is not None and want <= port <= int(p["endPort"])):
                return True
            continue
        named = [cp.get("containerPort") for c in dst_pod["spec"].get("containers") or []
                 for cp in c.get("ports") or [] if cp.get("name") == want and cp.get("protocol", "TCP") == protocol]
        if port in named:
            return True
    return False


def admitted(policies: list[Obj], dst_pod: Obj, src: Source, port: int, protocol: str = "TCP") -> bool:
    """Whether a connection from ``src`` to ``port`` of ``dst_pod`` gets through ``policies`` (all of the cluster's)."""
    meta = dst_pod["metadata"]
    if src.pod is not None and (src.namespace, src.pod) == (meta["namespace"], meta["name"]):
        return True
    if src.node is not None and src.node == dst_pod["spec"].get("nodeName"):
        return True
    selecting = [p for p in policies if p["metadata"].get("namespace") == meta["namespace"]
                 and "Ingress" in policy_types(p)
                 and selector_matches((p.get("spec") or {}).get("podSelector", {}), meta.get("labels") or {})]
    if not selecting:
        return True
    for policy in selecting:
        for rule in (policy.get("spec") or {}).get("ingress") or []:
            peers = rule.get("from") or []
            if (not peers or any(_peer_matches(peer, meta["namespace"], src) for peer in peers)) \
                    and _port_matches(rule.get("ports") or [], dst_pod, port, protocol):
                return True
    return False


# ---- where the API server's service proxy enters the pod network ------------------------------------
# The service proxy (``/api/v1/namespaces/NS/services/SVC:PORT/proxy``) dials the pod from the API
# server's network path, which is the address in Endpoints ``default/kubernetes`` only where the
# control plane sits on a routed pod network (EKS's VPC CNI). Elsewhere:
KONNECTIVITY_LABELS = {"k8s-app": "konnectivity-agent"}


def konnectivity_agent(ip: str = "10.244.3.7", node: str = "system-0") -> Source:
    """GKE and AKS send the API server's traffic to the cluster through the apiserver-network-proxy:
    the API server's egress selector ``cluster`` hands each dial to the Konnectivity server, which
    has an agent pod in the cluster make it (kubernetes.io/docs/tasks/extend-kubernetes/setup-konnectivity;
    its agent is a DaemonSet ``konnectivity-agent`` in kube-system labelled ``k8s-app: konnectivity-agent``,
    pod network, not host network). The pod sees the agent pod's address, from another namespace."""
    return Source(ip=ip, namespace="kube-system", labels=dict(KONNECTIVITY_LABELS), pod="konnectivity-agent-x1",
                  namespace_labels={"kubernetes.io/metadata.name": "kube-system"})


def calico_tunnel(ip: str = "10.244.7.1") -> Source:
    """Calico with IPIP (or VXLAN; Canal likewise with flannel's VXLAN) gives every node a tunnel device
    with an address from the pod IP pool (``tunl0``; the node annotation
    ``projectcalico.org/IPv4IPIPTunnelAddr``) so that the host can originate traffic to workloads on
    other nodes (projectcalico/calicoctl#721): a control-plane node's connection to a pod elsewhere
    leaves with that address as its source (projectcalico/calico#3665 shows policy judging it). It is
    no pod, and not the API server's Endpoints address."""
    return Source(ip=ip)
