"""Kubernetes RBAC per bearer token, for the emulator (``RtuiKube.authorizer`` and its access reviews).

What kube-apiserver does, and this double copies (Kubernetes docs, "Using RBAC Authorization",
https://kubernetes.io/docs/reference/access-authn-authz/rbac/, and the rbac authorizer in
kubernetes/kubernetes plugin/pkg/auth/authorizer/rbac/rbac.go):
- a token authenticates as a user with groups; ``system:masters`` is allowed everything before any
  authorizer is asked (the API server's privileged-group short circuit);
- a ClusterRoleBinding grants its ClusterRole's rules everywhere; a RoleBinding grants its Role's, or
  a ClusterRole's, rules **only in its own namespace**: a cluster-scoped request (nodes, CRDs, a list
  across all namespaces) is never allowed by a RoleBinding;
- the user-facing ``admin`` ClusterRole ("User-facing roles" in the page above; its rules in
  plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go) is edit + view + Roles and RoleBindings
  of the namespace; it holds no custom resources (no ``ray.io``) unless a ClusterRole labelled
  ``rbac.authorization.k8s.io/aggregate-to-admin: "true"`` adds them (ClusterRole aggregation, same
  page, "Aggregated ClusterRoles"), which is how a platform team running KubeRay lets namespace
  admins use RayClusters;
- every authenticated user may create SelfSubjectAccessReview and SelfSubjectRulesReview
  (``system:basic-user``, bound to ``system:authenticated``): the first answers ``status.allowed``
  by the same authorizer that judges real requests; the second lists the rules that apply in one
  namespace (``RulesFor``: cluster bindings plus that namespace's RoleBindings).

Simplified, never kinder where a test depends on it: ``admin``'s rules are listed by resource for the
groups rtui touches (the core group, apps, networking.k8s.io, batch, policy, coordination is absent as
upstream), and aggregation is evaluated at request time instead of by the aggregation controller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.kube.kmock_ext import Access, RtuiKube

Obj = dict[str, Any]
RBAC = "rbac.authorization.k8s.io"
READ = ["get", "list", "watch"]
WRITE = ["create", "delete", "deletecollection", "patch", "update"]
AGGREGATE_TO_ADMIN = "rbac.authorization.k8s.io/aggregate-to-admin"
MASTERS = "system:masters"


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> Obj:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


# bootstrappolicy's "view", "edit" and the "admin" additions, for the groups rtui and its tests touch.
ADMIN_RULES: list[Obj] = [
    _rule([""], ["pods", "pods/log", "pods/status", "services", "services/status", "endpoints",
                 "persistentvolumeclaims", "persistentvolumeclaims/status", "configmaps", "serviceaccounts",
                 "events", "namespaces", "namespaces/status", "resourcequotas", "limitranges",
                 "replicationcontrollers"], READ),
    _rule([""], ["secrets"], READ),
    _rule([""], ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"], WRITE),
    _rule([""], ["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "services/proxy"], ["get"]),
    _rule([""], ["configmaps", "events", "persistentvolumeclaims", "replicationcontrollers", "secrets",
                 "serviceaccounts", "services", "services/proxy"], WRITE),
    _rule([""], ["pods/eviction", "serviceaccounts/token"], ["create"]),
    _rule(["apps"], ["daemonsets", "deployments", "replicasets", "statefulsets", "controllerrevisions",
                     "daemonsets/status", "deployments/status", "deployments/scale"], READ),
    _rule(["apps"], ["daemonsets", "deployments", "deployments/scale", "replicasets", "statefulsets"], WRITE),
    _rule(["batch"], ["jobs", "cronjobs"], [*READ, *WRITE]),
    _rule(["networking.k8s.io"], ["networkpolicies", "ingresses"], [*READ, *WRITE]),
    _rule(["policy"], ["poddisruptionbudgets"], [*READ, *WRITE]),
    _rule(["discovery.k8s.io"], ["endpointslices"], READ),
    _rule(["authorization.k8s.io"], ["localsubjectaccessreviews"], ["create"]),
    _rule([RBAC], ["roles", "rolebindings"], [*READ, *WRITE]),
]


@dataclass(frozen=True)
class Subject:
    """Who a token authenticates as (``user.Info``)."""

    user: str
    groups: frozenset[str] = frozenset()


def allows(rule: Obj, want: Access) -> bool:
    """One PolicyRule against a request (rbac/v1 helpers ``RuleAllows``: ``*`` matches any)."""
    def has(values: list[str] | None, value: str) -> bool:
        return bool(values) and ("*" in (values or []) or value in (values or []))

    names = rule.get("resourceNames")
    return (has(rule.get("apiGroups"), want.group) and has(rule.get("resources"), want.resource)
            and has(rule.get("verbs"), want.verb) and (not names or want.name in names))


@dataclass
class Rbac:
    """The cluster's RBAC, read from its Role/ClusterRole/…Binding objects on every request."""

    kube: RtuiKube
    tokens: dict[str, Subject] = field(default_factory=dict)

    def _role_rules(self, ref: Obj, namespace: str | None) -> list[Obj]:
        if ref.get("kind") == "ClusterRole":
            if ref.get("name") == "admin":  # the bootstrap role and what is aggregated into it
                return [*ADMIN_RULES, *self._aggregated_to_admin()]
            role = self.kube.find((RBAC, "v1", "clusterroles"), None, str(ref.get("name")))
        else:
            role = self.kube.find((RBAC, "v1", "roles"), namespace, str(ref.get("name")))
        return list((role or {}).get("rules") or [])

    def _aggregated_to_admin(self) -> list[Obj]:
        return [r for role in self.kube.items((RBAC, "v1", "clusterroles"))
                if (role["metadata"].get("labels") or {}).get(AGGREGATE_TO_ADMIN) == "true"
                for r in role.get("rules") or []]

    @staticmethod
    def _names(subject: Subject, entry: Obj) -> bool:
        kind, name = entry.get("kind"), entry.get("name")
        return (kind == "User" and name == subject.user) or (kind == "Group" and name in subject.groups)

    def rules_for(self, subject: Subject, namespace: str | None) -> list[Obj]:
        """Every rule that applies to ``subject`` in ``namespace`` (None: at the cluster scope only)."""
        def bound(binding: Obj) -> bool:
            return any(self._names(subject, s) for s in binding.get("subjects") or [])

        out = [r for b in self.kube.items((RBAC, "v1", "clusterrolebindings")) if bound(b)
               for r in self._role_rules(b["roleRef"], None)]
        if namespace is not None:
            out += [r for b in self.kube.items((RBAC, "v1", "rolebindings"), namespace) if bound(b)
                    for r in self._role_rules(b["roleRef"], namespace)]
        return out

    def subject(self, token: str) -> Subject | None:
        return self.tokens.get(token)

    def authorize(self, want: Access) -> str | None:
        """None when allowed, else the user's name for the Forbidden message."""
        subject = self.subject(want.token)
        if subject is None:
            return "system:anonymous"
        if MASTERS in subject.groups:
            return None
        if any(allows(r, want) for r in self.rules_for(subject, want.namespace)):
            return None
        return subject.user

    def rules_review(self, token: str, namespace: str) -> Obj:
        """SelfSubjectRulesReview's status for ``namespace``: resource rules, as RulesFor lists them."""
        subject = self.subject(token)
        if subject is not None and MASTERS in subject.groups:
            rules = [_rule(["*"], ["*"], ["*"])]
        else:
            rules = self.rules_for(subject, namespace) if subject else []
        basic = _rule(["authorization.k8s.io"], ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                      ["create"])
        return {"resourceRules": [{k: v for k, v in r.items() if k in ("verbs", "apiGroups", "resources",
                                                                       "resourceNames")}
                                  for r in [basic, *rules]],
                "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis",
                                                                            "/apis/*", "/version"]}],
                "incomplete": False}


def namespace_admin_binding(namespace: str, user: str) -> Obj:
    """What a platform team applies to make ``user`` admin of one namespace (the RBAC page's example)."""
    return {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
            "metadata": {"name": f"{user}-admin", "namespace": namespace},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "admin"},
            "subjects": [{"apiGroup": RBAC, "kind": "User", "name": user}]}


def ray_user_aggregate() -> Obj:
    """The ClusterRole a platform team running KubeRay adds so that namespace admins may use its kinds."""
    return {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole",
            "metadata": {"name": "kuberay-user", "labels": {AGGREGATE_TO_ADMIN: "true"}},
            "rules": [_rule(["ray.io"], ["rayclusters", "rayjobs", "rayservices", "rayclusters/status"],
                            [*READ, *WRITE])]}


def install(kube: RtuiKube, tokens: dict[str, Subject]) -> Rbac:
    """Turn RBAC on: each token is its subject; any other token is anonymous (and denied)."""
    rbac = Rbac(kube, dict(tokens))
    kube.authorizer = rbac.authorize
    kube.rules_reviewer = rbac.rules_review
    return rbac

