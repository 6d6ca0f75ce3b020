"""EKS's authorization of Kubernetes API requests, for the Kubernetes emulator every EKS cluster of the
double answers at: what the caller's access entry allows, by its access policies and their scopes and by
Kubernetes RBAC for its ``kubernetesGroups``.

What EKS documents (EKS User Guide, "Associate access policies with access entries",
https://docs.aws.amazon.com/eks/latest/userguide/access-policies.html, and "Review access policy
permissions", access-policy-permissions.html; EKS API reference, ``AccessScope``):
- an access policy grants its rules at its scope: ``cluster`` (every namespace and the cluster-scoped
  objects) or ``namespace`` (only requests in the listed namespaces; never a cluster-scoped object);
- AmazonEKSClusterAdminPolicy is every verb on every resource; AmazonEKSAdminPolicy is most of
  Kubernetes' own namespaced resources (the user-facing ``admin`` role: the core group, apps, batch,
  autoscaling, networking.k8s.io, policy, roles and role bindings), namespaces only to get, list and
  watch, and no custom resources (no ``ray.io``) and no CustomResourceDefinitions;
- beside the policies, Kubernetes RBAC authorizes the entry's ``kubernetesGroups`` (a ``Group`` subject
  of a RoleBinding or ClusterRoleBinding): either allowing is enough.

Simplifications, each kinder only where no test depends on it: the caller is the one access entry of the
cluster (rtui makes exactly one; the token's signer is not decoded), and AmazonEKSAdminPolicy is modelled
by API group (every resource of those groups but namespaces) rather than its resource list row by row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moto.eks.models import eks_backends

from tests.aws.moto_provision_api import _access
from tests.kubernetes.kmock_ext import Access, RtuiKube

CLUSTER_ADMIN = "AmazonEKSClusterAdminPolicy"
ADMIN = "AmazonEKSAdminPolicy"
ADMIN_GROUPS = frozenset({"", "apps", "batch", "autoscaling", "networking.k8s.io", "policy",
                          "rbac.authorization.k8s.io", "authorization.k8s.io", "extensions"})
READ = frozenset({"get", "list", "watch"})
RBAC = "rbac.authorization.k8s.io"


def _policy_allows(name: str, scope: dict[str, Any], want: Access) -> bool:
    if scope.get("type") == "namespace" and (want.namespace is None or want.namespace not in scope["namespaces"]):
        return False
    if name == CLUSTER_ADMIN:
        return True
    if name == ADMIN:
        if want.resource == "namespaces":
            return want.verb in READ
        return want.group in ADMIN_GROUPS and want.namespace is not None
    return False


def _rule_allows(rule: dict[str, Any], want: Access) -> bool:
    def has(values: list[str] | None, value: str) -> bool:
        return bool(values) and ("*" in (values or []) or value in (values or []))

    names = rule.get("resourceNames")
    return (has(rule.get("apiGroups"), want.group) and has(rule.get("resources"), want.resource)
            and has(rule.get("verbs"), want.verb) and (not names or want.name in names))


def _rbac_allows(kube: RtuiKube, groups: set[str], want: Access) -> bool:
    """Kubernetes RBAC (its rbac authorizer): a ClusterRoleBinding grants its ClusterRole everywhere, a
    RoleBinding grants its Role or ClusterRole in its own namespace only."""
    def bound(binding: dict[str, Any]) -> bool:
        return any(s.get("kind") == "Group" and s.get("name") in groups for s in binding.get("subjects") or [])

    def rules(ref: dict[str, Any], namespace: str | None) -> list[dict[str, Any]]:
        kind = ref.get("kind")
        key = (RBAC, "v1", "clusterroles" if kind == "ClusterRole" else "roles")
        role = kube.find(key, None if kind == "ClusterRole" else namespace, str(ref.get("name")))
        return list((role or {}).get("rules") or [])

    for binding in kube.items((RBAC, "v1", "clusterrolebindings")):
        if bound(binding) and any(_rule_allows(r, want) for r in rules(binding["roleRef"], None)):
            return True
    if want.namespace is None:
        return False
    for binding in kube.items((RBAC, "v1", "rolebindings"), want.namespace):
        if bound(binding) and any(_rule_allows(r, want) for r in rules(binding["roleRef"], want.namespace)):
            return True
    return False


def eks_authorizer(kube: RtuiKube) -> Callable[[Access], str | None]:
    """The emulator's authorizer for the clusters of the double (every account and region of it)."""
    def authorize(want: Access) -> str | None:
        entries = [entry for backends in eks_backends.values() for backend in backends.values()
                   for cluster in backend.clusters.values() for entry in _access(cluster).values()]
        if not entries:
            return "anonymous"
        (entry,) = entries  # one cluster, one caller (see the module's docstring)
        for policy in entry["rtui_policies"].values():
            if _policy_allows(policy["policyArn"].rsplit("/", 1)[-1], policy["accessScope"], want):
                return None
        if _rbac_allows(kube, set(entry.get("kubernetesGroups") or []), want):
            return None
        return str(entry["principalArn"])

    return authorize
