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

A pod's service account token is authorized by Kubernetes RBAC alone (EKS access entries are for IAM
principals): the API server authenticates it as the user ``system:serviceaccount:<namespace>:<name>``
in the groups ``system:serviceaccounts``, ``system:serviceaccounts:<namespace>`` and
``system:authenticated``, and only while that ServiceAccount exists (Kubernetes docs, "Authenticating",
service account tokens; "Using RBAC Authorization", referring to subjects). The double signs its own
tokens (``service_account_token``) with a key of its own instead of the cluster's OIDC issuer's.

Simplifications, each kinder only where no test depends on it: the caller is the one access entry of the
cluster (rtui makes exactly one; the token's signer is not decoded), and AmazonEKSAdminPolicy is modelled
by API group (every resource of those groups but namespaces) rather than its resource list row by row.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moto.eks.models import eks_backends

from tests.aws.moto_provision_api import _access
from tests.kube.kmock_ext import Access, RtuiKube

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


@dataclass(frozen=True)
class Subject:
    """Who the API server authenticated: a user name and its groups (``user.Info``)."""

    user: str
    groups: frozenset[str]


_SIGNING_KEY = secrets.token_bytes(32)
SA_PREFIX = "system:serviceaccount:"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def service_account_token(namespace: str, name: str) -> str:
    """A token of the ServiceAccount ``namespace/name``, as the kubelet mounts one into its pods (a JWT
    whose ``sub`` names the account), signed by the double."""
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = _b64(json.dumps({"sub": f"{SA_PREFIX}{namespace}:{name}", "aud": ["https://kubernetes.default.svc"],
                              "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name}}}).encode())
    signature = _b64(hmac.new(_SIGNING_KEY, f"{head}.{claims}".encode(), hashlib.sha256).digest())
    return f"{head}.{claims}.{signature}"


def service_account_of(token: str) -> tuple[str, str] | None:
    """(namespace, name) of a token ``service_account_token`` signed, else None."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    want = _b64(hmac.new(_SIGNING_KEY, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(want, parts[2]):
        return None
    claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    namespace, name = str(claims["sub"]).removeprefix(SA_PREFIX).split(":", 1)
    return namespace, name


def _service_account_subject(kube: RtuiKube, token: str) -> Subject | None:
    """The user a service account token authenticates as, while its ServiceAccount exists."""
    account = service_account_of(token)
    if account is None or kube.find(("", "v1", "serviceaccounts"), *account) is None:
        return None
    namespace, name = account
    return Subject(f"{SA_PREFIX}{namespace}:{name}", frozenset(
        {"system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"}))


def _names(subject: Subject, entry: dict[str, Any]) -> bool:
    """Whether a binding's subject entry names this user: by group, by user name, or (a
    ServiceAccount entry) by the account's namespace and name."""
    kind, name = entry.get("kind"), entry.get("name")
    if kind == "Group":
        return name in subject.groups
    if kind == "User":
        return name == subject.user
    if kind == "ServiceAccount":
        return subject.user == f"{SA_PREFIX}{entry.get('namespace')}:{name}"
    return False


def _rbac_allows(kube: RtuiKube, subject: Subject, want: Access) -> bool:
    """Kubernetes RBAC (its rbac authorizer): a ClusterRoleBinding grants its ClusterRole everywhere, a
    RoleBinding grants its Role or ClusterRole in its own namespace only."""
    def bound(binding: dict[str, Any]) -> bool:
        return any(_names(subject, s) for s in binding.get("subjects") or [])

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
        if service_account_of(want.token) is not None:  # a pod's own identity: RBAC only
            subject = _service_account_subject(kube, want.token)
            if subject is not None and _rbac_allows(kube, subject, want):
                return None
            return subject.user if subject else "system:anonymous"
        # Read on the emulator's loop while a moto request may change these dicts: each level is copied
        # whole first (``list`` of a dict view is one step under the GIL), never walked while it changes.
        entries = [entry for backends in list(eks_backends.values()) for backend in list(backends.values())
                   for cluster in list(backend.clusters.values()) for entry in list(_access(cluster).values())]
        if not entries:
            return "anonymous"
        (entry,) = entries  # one cluster, one caller (see the module's docstring)
        for policy in entry["rtui_policies"].values():
            if _policy_allows(policy["policyArn"].rsplit("/", 1)[-1], policy["accessScope"], want):
                return None
        caller = Subject(str(entry["principalArn"]), frozenset(entry.get("kubernetesGroups") or []))
        if _rbac_allows(kube, caller, want):
            return None
        return str(entry["principalArn"])

    return authorize
