"""kmock's Kubernetes emulator, extended with what rtui's Kubernetes layer needs (DESIGN.md §5).

kmock 0.8 lacks Namespace objects (its path parser fails on ``/api/v1/namespaces``), label and
field selectors, PUT, server-side apply, uids and resourceVersions, and answers a create with 200.
``RtuiKube`` routes every object request itself, on kmock's own object store and watch buses, and
hands kmock what it already does well: discovery it cannot parse is ours too, watches are kmock's.
Everything runs on the server's event loop; the test thread reaches it through ``conftest``.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import re
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import attrs
import yaml
from kmock._internal import references
from kmock._internal.k8s import KubernetesEmulator

from tests.kube import kubelet_portforward, pod_security
from tests.kube.kube_lifecycle import held, refuse_in_terminating
from tests.kube.kuberay_double import (
    missing_required,
    openapi_group_version,
    openapi_root,
    prune,
    served_schema,
)
from tests.kube.pod_network import Source, admitted

Obj = dict[str, Any]

# (group, version, plural) -> (kind, namespaced, has a status subresource)
KINDS: dict[tuple[str, str, str], tuple[str, bool, bool]] = {
    ("", "v1", "namespaces"): ("Namespace", False, True),
    ("", "v1", "nodes"): ("Node", False, True),
    ("", "v1", "pods"): ("Pod", True, True),
    ("", "v1", "services"): ("Service", True, True),
    ("", "v1", "secrets"): ("Secret", True, False),
    ("", "v1", "serviceaccounts"): ("ServiceAccount", True, False),
    ("", "v1", "events"): ("Event", True, False),
    ("", "v1", "configmaps"): ("ConfigMap", True, False),
    ("apps", "v1", "daemonsets"): ("DaemonSet", True, True),
    ("apps", "v1", "deployments"): ("Deployment", True, True),
    ("rbac.authorization.k8s.io", "v1", "clusterroles"): ("ClusterRole", False, False),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings"): ("ClusterRoleBinding", False, False),
    ("rbac.authorization.k8s.io", "v1", "roles"): ("Role", True, False),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"): ("RoleBinding", True, False),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions"): ("CustomResourceDefinition", False, True),
    ("coordination.k8s.io", "v1", "leases"): ("Lease", True, False),
    ("", "v1", "endpoints"): ("Endpoints", True, False),
    ("networking.k8s.io", "v1", "networkpolicies"): ("NetworkPolicy", True, False),
    ("", "v1", "persistentvolumeclaims"): ("PersistentVolumeClaim", True, True),
    ("storage.k8s.io", "v1", "storageclasses"): ("StorageClass", False, False),
}
PVC_KEY = ("", "v1", "persistentvolumeclaims")
STORAGE_CLASS_KEY = ("storage.k8s.io", "v1", "storageclasses")
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
CRD_KEY = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
# KubeRay's kinds: served only while an Established CRD defines them (``RtuiKube._kind``); named
# here so the test's helpers can find their objects by kind.
CUSTOM_KINDS: dict[tuple[str, str, str], tuple[str, bool, bool]] = {
    ("ray.io", "v1", "rayclusters"): ("RayCluster", True, True),
    ("ray.io", "v1", "rayjobs"): ("RayJob", True, True),
    ("ray.io", "v1", "rayservices"): ("RayService", True, True),
    ("ray.io", "v1", "raycronjobs"): ("RayCronJob", True, True),
}
PLURAL_OF = {(f"{g}/{v}" if g else v, kind): plural
             for (g, v, plural), (kind, _, _) in {**KINDS, **CUSTOM_KINDS}.items()}
# kube-apiserver's answer for a path no handler serves (a group with no Established CRD among
# them): the NotFound handler's Status, with no details at all.
NOT_SERVED = "the server could not find the requested resource"
REVIEWS = {"selfsubjectaccessreviews": "SelfSubjectAccessReview", "selfsubjectrulesreviews": "SelfSubjectRulesReview"}
VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
PROXY_RE = re.compile(r"^/api/v1/namespaces/([^/]+)/services/([^/:]+):([^/]+)/proxy(/.*)?$")
RESOURCE_RE = re.compile(r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))(?P<rest>(?:/[^/]+)*)/?$")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def response(self) -> aiohttp.web.Response:
        body: Obj = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                     "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:  # metav1.Status.Details is omitempty: a Status without details has no key
            body["details"] = self.details
        return aiohttp.web.json_response(body, status=self.code)


def too_many_requests(retry_after_s: int = 1) -> aiohttp.web.Response:
    """What kube-apiserver's API Priority and Fairness filter (and max-in-flight before it) answers a request it
    rejects: 429 with ``Retry-After`` (a constant 1 s upstream, kubernetes/kubernetes#117734) and a plain-text
    body, not a Status (apiserver/pkg/server/filters/maxinflight.go ``tooManyRequests``: ``http.Error``;
    kubernetes.io/docs/concepts/cluster-administration/flow-control/). Nothing of the request was done."""
    return aiohttp.web.Response(status=429, text="Too many requests, please try again later.\n",
                                headers={"Retry-After": str(retry_after_s)})


def unavailable() -> aiohttp.web.Response:
    """A 503 as an API server behind a load balancer gives while it restarts or loses etcd (a Status)."""
    return ApiError(503, "ServiceUnavailable", "the server is currently unable to handle the request").response()


def not_served() -> ApiError:
    """What ``notfoundhandler.Handler`` (kubernetes/kubernetes, staging/src/k8s.io/apiserver/pkg/util/
    notfoundhandler/not_found_handler.go) writes at the end of the delegation chain."""
    return ApiError(404, "NotFound", NOT_SERVED)


@dataclass(frozen=True)
class Served:
    """One answered request, for assertions (kmock's own record skips the requests we route)."""

    method: str
    path: str
    query: dict[str, str]
    status: int
    content_type: str
    authorization: str = ""  # the bearer token it came with, to tell which credential a client used
    message: str = ""  # an error's Status message (NOT_SERVED: nothing serves the resource)
    peer_port: int = 0  # the client's TCP port: a request through a test proxy comes from the proxy's port


@dataclass(frozen=True)
class Access:
    """What the API server's authorizer is asked for one request (its ``authorizer.Attributes``:
    user, verb, API group, resource with subresource, namespace, name)."""

    token: str
    verb: str
    resource: str
    group: str
    namespace: str | None
    name: str | None


def _peer_port(raw: aiohttp.web.BaseRequest) -> int:
    peer = raw.transport.get_extra_info("peername") if raw.transport is not None else None
    return int(peer[1]) if peer else 0


def _negated(rfc3339: str) -> float:
    """A timestamp as a key that sorts the newest first (RFC 3339 UTC, whole seconds)."""
    return -dt.datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp() if rfc3339 else 0.0


def now_rfc3339(nano: bool = False, at: dt.datetime | None = None) -> str:
    t = at or dt.datetime.now(dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{t.microsecond:06d}000Z" if nano else "Z")


def deep_merge(base: Obj, patch: Obj) -> Obj:
    """JSON merge patch (RFC 7386): dicts merge, None removes, lists and scalars replace."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def fold_string_data(key: tuple[str, str, str], obj: Obj) -> None:
    """A Secret's ``stringData`` goes into ``data`` (base64) on write and is never read back: the
    v1 Secret API reference ("stringData ... is merged into the data field on write, overwriting any
    existing values. The stringData field is never output when reading from the API";
    kubernetes/kubernetes pkg/apis/core/v1/conversion.go ``Convert_v1_Secret_To_core_Secret``)."""
    if key != ("", "v1", "secrets") or "stringData" not in obj:
        return
    import base64

    data = dict(obj.get("data") or {})
    data.update({k: base64.b64encode(str(v).encode()).decode() for k, v in (obj.pop("stringData") or {}).items()})
    obj["data"] = data


def crd_condition(crd: Obj, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


_REQ = re.compile(r"^\s*(!?)([\w./-]+)\s*(?:(=|==|!=)\s*([\w.-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """``a=b,c!=d,e in (x,y),f notin (z),key,!key`` — the label selector grammar kubectl speaks."""
    for req in re.split(r",(?![^()]*\))", selector):
        if not req.strip():
            continue
        m = _REQ.match(req)
        if not m:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {req!r}")
        neg, key, op, value, set_op, values = m.groups()
        if op in ("=", "=="):
            ok = labels.get(key) == value
        elif op == "!=":
            ok = labels.get(key) != value
        elif set_op:
            choices = {v.strip() for v in values.split(",") if v.strip()}
            ok = labels.get(key) in choices if set_op == "in" else labels.get(key) not in choices
        else:
            ok = key in labels
        if ok == bool(neg):
            return False
    return True


def field_matches(selector: str, obj: Obj) -> bool:
    for req in selector.split(","):
        m = re.match(r"^\s*([\w.]+)\s*(==|=|!=)\s*(.*?)\s*$", req)
        if not m:
            raise ApiError(400, "BadRequest", f"unable to parse field selector: {req!r}")
        path, op, value = m.groups()
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if (str(node) == value if node is not None else value == "") == (op == "!="):
            return False
    return True


@attrs.define(kw_only=True)
class RtuiKube(KubernetesEmulator):
    """An in-memory Kubernetes API server good enough for the layer, kubectl and the Ray proxy."""

    served: list[Served] = attrs.field(factory=list, init=False)
    token_check: Callable[[str], bool] | None = attrs.field(default=None, init=False)
    forbidden: set[tuple[str, str, str | None]] = attrs.field(factory=set, init=False)
    # Who may do what beside ``forbidden``: the denial's message, or None to allow (e.g. EKS's
    # access policies, tests/aws/eks_authz.py). None: everyone authenticated may do everything.
    authorizer: Callable[[Access], str | None] | None = attrs.field(default=None, init=False)
    # SelfSubjectRulesReview's status for (token, namespace) (``kube_rbac``); None: every rule ("*").
    rules_reviewer: Callable[[str, str], Obj] | None = attrs.field(default=None, init=False)
    proxies: dict[tuple[str, str, str], str] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=1, init=False)
    # Every write the store publishes (an add, a change, a delete): how the fake controllers know that
    # nothing changed since their last pass (tests/kube/fake_control.py).
    changes: int = attrs.field(default=0, init=False)
    _logs: dict[tuple[str, str], list[tuple[str, str]]] = attrs.field(factory=dict, init=False)
    _log_changed: asyncio.Condition = attrs.field(factory=asyncio.Condition, init=False)
    _log_generation: int = attrs.field(default=0, init=False)
    _abrupt_drop: bool = attrs.field(default=False, init=False)
    # How long a new CRD waits for NamesAccepted/Established (a real cluster: milliseconds to seconds).
    establish_after_s: float = attrs.field(default=0.2, init=False)
    # Whether the cluster's CNI enforces NetworkPolicies (``pod_network``); without, they do nothing.
    enforce_policies: bool = attrs.field(default=False, init=False)
    # Where the service proxy's connections to pods come from (``pod_network.konnectivity_agent``…); None:
    # the API server's own address, as on a cluster whose API server sits on a routed pod network.
    proxy_source: Source | None = attrs.field(default=None, init=False)
    # The filesystem a running pod's exec sees: its working directory here (the fake kubelet sets it).
    exec_dirs: dict[tuple[str, str], Path] = attrs.field(factory=dict, init=False)
    # Whether the client may reach the endpoint at all (an EKS endpoint's publicAccessCidrs): when it
    # answers False the request is never answered, as a dropped packet is not (tests/aws/conftest.py).
    reachable: Callable[[], bool] | None = attrs.field(default=None, init=False)
    # An answer given before routing (``too_many_requests``, ``unavailable``) for (method, path), or None:
    # API Priority and Fairness rejects a request before any handler sees it.
    fault: Callable[[str, str], aiohttp.web.Response | None] | None = attrs.field(default=None, init=False)
    # The time this server stamps as an object's creationTimestamp (whole seconds, as the real one
    # writes it), or None: the wall clock. A test stops and moves it (KubeCluster.advance_clock) instead
    # of sleeping past a second boundary.
    frozen_at: dt.datetime | None = attrs.field(default=None, init=False)

    # ---- entry point ---------------------------------------------------------------------------

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        peer = _peer_port(raw)  # before the answer: a stream's transport may be gone after it
        if self.reachable is not None and not self.reachable():
            return await self._never_answer(raw)
        await raw.read()
        message = ""
        try:
            response = (self.fault and self.fault(raw.method, raw.path)) or await self._route(raw)
        except ApiError as err:
            response, message = err.response(), err.message
        if response is None:  # discovery and watches: kmock's own
            response = await super().__call__(raw)
        self.served.append(Served(raw.method, raw.path, dict(raw.query), response.status,
                                  raw.headers.get("Content-Type", ""),
                                  raw.headers.get("Authorization", "").removeprefix("Bearer "), message,
                                  peer))
        return response

    @staticmethod
    async def _never_answer(raw: aiohttp.web.BaseRequest, limit_s: float = 120.0) -> aiohttp.web.StreamResponse:
        """Hold the request without a byte until the client gives up (or ``limit_s``), as a client outside
        an endpoint's allowed CIDRs sees it: no refusal, no answer, only its own timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while loop.time() < deadline and raw.transport is not None and not raw.transport.is_closing():
            await asyncio.sleep(0.05)  # models time: the emulator's own pace while it ignores the client
        return aiohttp.web.Response(status=504)

    async def _route(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse | None:
        if self.token_check is not None and raw.path != "/version":
            auth = raw.headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or not self.token_check(auth[len("Bearer "):]):
                raise ApiError(401, "Unauthorized", "Unauthorized")
        token = raw.headers.get("Authorization", "").removeprefix("Bearer ")
        if m := PROXY_RE.match(raw.path):
            self._authorize(VERBS.get(raw.method, raw.method.lower()), "services/proxy", "", m[1], token, m[2])
            return await self._proxy(raw, *m.groups())
        if raw.path in ("/api", "/apis", "/api/v1") or raw.path.startswith("/apis/") and raw.path.count("/") == 3:
            return self._discovery(raw.path)
        if raw.path == "/openapi/v3" or raw.path.startswith("/openapi/v3/apis/"):
            return self._openapi_v3(raw.path)
        m = RESOURCE_RE.match(raw.path)
        if m is None:
            return None
        group, version = ("", "v1") if m["cv"] else (m["g"], m["v"])
        segs = [s for s in m["rest"].split("/") if s]
        namespace = None
        if len(segs) >= 3 and segs[0] == "namespaces":
            namespace, segs = segs[1], segs[2:]
        if not segs:
            return None
        plural, name, sub = segs[0], (segs[1] if len(segs) > 1 else None), "/".join(segs[2:]) or None
        verb = VERBS.get(raw.method, raw.method.lower()) if name or raw.method != "GET" else "list"
        if sub in ("exec", "portforward"):
            # A WebSocket GET of pods/exec or pods/portforward is authorized as ``create`` like SPDY's
            # POST (KEP-4006, AuthorizePodWebsocketUpgradeCreatePermission, on by default since 1.30).
            verb = "create"
        if raw.query.get("watch") in ("true", "1"):
            verb = "watch"
        if group == "authorization.k8s.io" and plural in REVIEWS and raw.method == "POST":
            return await self._review(raw, plural, token)
        # Authorization is a filter before any handler (server/config.go's handler chain): 403 comes first.
        self._authorize(verb, plural if not sub else f"{plural}/{sub}", group, namespace, token, name)
        self._kind((group, version, plural))  # a resource nothing serves: the NotFound handler's 404
        if verb == "watch":
            return None
        key = (group, version, plural)
        if plural == "pods" and sub == "log" and name and namespace:
            return await self._serve_log(raw, namespace, name)
        if plural == "pods" and sub == "exec" and name and namespace:
            return await self._serve_exec(raw, namespace, name)
        if plural == "pods" and sub == "portforward" and name and namespace:
            return await kubelet_portforward.serve(self, raw, namespace, name)
        data = await raw.read()
        body: Obj = (json.loads(data) if data.lstrip()[:1] in (b"{", b"[") else yaml.safe_load(data)) if data else {}
        if raw.method == "GET":
            if name is None:
                return aiohttp.web.json_response(self._list(key, namespace, raw.query))
            return aiohttp.web.json_response(self._get(key, namespace, name))
        if raw.method == "POST" and name is None:
            return aiohttp.web.json_response(await self._create(key, namespace, body), status=201)
        if raw.method == "DELETE" and name:
            return aiohttp.web.json_response(await self._delete(key, namespace, name))
        if raw.method in ("PATCH", "PUT") and name:
            ctype = raw.headers.get("Content-Type", "")
            if ctype.startswith("application/apply-patch"):
                obj, created = await self._apply(key, namespace, name, body, raw.query.get("fieldManager", ""))
                return aiohttp.web.json_response(obj, status=201 if created else 200)
            if ctype.startswith("application/json-patch"):
                raise ApiError(415, "UnsupportedMediaType", "json-patch is not emulated")
            return aiohttp.web.json_response(await self._update(key, namespace, name, body, sub,
                                                                replace=raw.method == "PUT"))
        raise ApiError(405, "MethodNotAllowed", f"{raw.method} {raw.path} is not emulated")

    def _authorize(self, verb: str, resource: str, group: str, namespace: str | None, token: str = "",
                   name: str | None = None) -> None:
        # A namespace object is namespaced to itself (k8s.io/apiserver requestinfo.go: the name of
        # /api/v1/namespaces/<name> is also the request's namespace), so a grant in a namespace reaches it.
        if resource == "namespaces" and name and namespace is None:
            namespace = name
        why = self._denial(verb, resource, group, namespace, token, name)
        if why is not None:
            # errors.NewForbidden: the qualified resource, the authorizer's words, details naming it.
            where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
            qualified = f"{resource}.{group}" if group else resource
            subject = f'{qualified} "{name}"' if name else qualified
            details = {"kind": resource, **({"group": group} if group else {}), **({"name": name} if name else {})}
            raise ApiError(403, "Forbidden", f'{subject} is forbidden: User "{why}" cannot {verb} resource '
                                             f'"{resource}" in API group "{group}"{where}', details)

    def _denial(self, verb: str, resource: str, group: str, namespace: str | None, token: str,
                name: str | None) -> str | None:
        """None when the request is allowed, else the user name the refusal names."""
        denied = (verb, resource, namespace) in self.forbidden or (verb, resource, None) in self.forbidden
        why = self.authorizer(Access(token, verb, resource, group, namespace, name)) if self.authorizer else None
        return (why or "test") if denied or why is not None else None

    async def _review(self, raw: aiohttp.web.BaseRequest, plural: str, token: str) -> aiohttp.web.Response:
        """SelfSubjectAccessReview / SelfSubjectRulesReview (authorization.k8s.io/v1), which every
        authenticated user may create (``system:basic-user``): the first is answered by the same decision
        a real request gets (pkg/registry/authorization/selfsubjectaccessreview/rest.go), the second by
        the rules reviewer (selfsubjectrulesreview/rest.go; ``kube_rbac``). Both return the object with
        its status, 201 Created."""
        data = await raw.read()
        body: Obj = json.loads(data) if data else {}
        spec = body.get("spec") or {}
        kind = REVIEWS[plural]
        if plural == "selfsubjectrulesreviews":
            namespace = str(spec.get("namespace") or "")
            if not namespace:
                raise ApiError(400, "BadRequest", "no namespace on request")
            status: Obj = self.rules_reviewer(token, namespace) if self.rules_reviewer else {
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                "nonResourceRules": [], "incomplete": False}
        else:
            attrs_ = spec.get("resourceAttributes") or {}
            resource = str(attrs_.get("resource") or "") + (f"/{attrs_['subresource']}"
                                                            if attrs_.get("subresource") else "")
            why = self._denial(str(attrs_.get("verb") or ""), resource, str(attrs_.get("group") or ""),
                               attrs_.get("namespace") or None, token, attrs_.get("name") or None)
            # The RBAC authorizer gives no reason for a denial: it has no opinion, and nothing else allows.
            status = {"allowed": why is None, **({"reason": "allowed by RBAC"} if why is None else {})}
        return aiohttp.web.json_response({"apiVersion": "authorization.k8s.io/v1", "kind": kind,
                                          "metadata": {"creationTimestamp": None}, "spec": spec,
                                          "status": status}, status=201)

    # ---- custom resources: served only once their CRD is Established --------------------------------

    def _kind(self, key: tuple[str, str, str]) -> tuple[str, bool, bool]:
        """(kind, namespaced, has status) of a built-in resource or of one an accepted CRD defines.

        apiextensions-apiserver's ``crdHandler.ServeHTTP`` (kubernetes/kubernetes, staging/src/
        k8s.io/apiextensions-apiserver/pkg/apiserver/customresource_handler.go) hands a request to
        the NotFound handler when no CRD defines the resource, when the CRD does not serve that
        version, or while it has neither ``NamesAccepted`` nor ``Established``: a 404 with no details.
        """
        if key in KINDS:
            return KINDS[key]
        group, version, plural = key
        for crd in self._stored(CRD_KEY):
            spec = crd.get("spec") or {}
            names = spec.get("names") or {}
            if spec.get("group") != group or names.get("plural") != plural:
                continue
            served = [v for v in spec.get("versions") or [] if v.get("name") == version and v.get("served")]
            if not served or not (crd_condition(crd, "NamesAccepted") or crd_condition(crd, "Established")):
                break
            return names.get("kind", ""), spec.get("scope") == "Namespaced", \
                "status" in (served[0].get("subresources") or {})
        raise not_served()

    def _pruned(self, key: tuple[str, str, str], obj: Obj) -> Obj:
        """A custom resource as stored: without the fields its CRD's schema lacks (kuberay_double.prune),
        and refused, 422 Invalid, when it lacks a field the schema requires, as the API server's
        structural-schema validation does (apiextensions-apiserver: "<Kind>.<group> "<name>" is invalid:
        spec.headGroupSpec.template: Required value"; KubeRay's RayCluster CRD requires that one)."""
        group, version, plural = key
        for crd in self._stored(CRD_KEY) if key not in KINDS else []:
            spec = crd.get("spec") or {}
            if spec.get("group") == group and (spec.get("names") or {}).get("plural") == plural:
                schema = served_schema(crd, version)
                missing = missing_required(obj, schema)
                if missing:
                    kind, name = (spec.get("names") or {}).get("kind", ""), (obj.get("metadata") or {}).get("name")
                    raise ApiError(422, "Invalid", f'{kind}.{group} "{name}" is invalid: '
                                   + ", ".join(f"{m}: Required value" for m in missing),
                                   {"name": name, "group": group, "kind": kind,
                                    "causes": [{"reason": "FieldValueRequired", "message": "Required value",
                                                "field": m} for m in missing]})
                pruned: Obj = prune(obj, schema, root=True)
                return pruned
        return obj

    def _openapi_v3(self, path: str) -> aiohttp.web.Response:
        """The published OpenAPI v3 of the Established CRDs (kuberay_double's docstring says what it holds)."""
        crds = [c for c in self.items(CRD_KEY) if crd_condition(c, "Established")]
        if path == "/openapi/v3":
            return aiohttp.web.json_response(openapi_root(crds))
        group, _, version = path.removeprefix("/openapi/v3/apis/").rpartition("/")
        doc = openapi_group_version(crds, group, version)
        if doc is None:
            raise not_served()
        return aiohttp.web.json_response(doc)

    def _established(self) -> dict[tuple[str, str, str], tuple[str, bool, bool]]:
        """What discovery lists of the CRDs: only Established ones (discovery_controller.go, same package)."""
        out = {}
        for crd in self._stored(CRD_KEY):
            if not crd_condition(crd, "Established"):
                continue
            spec = crd["spec"]
            for v in spec.get("versions") or []:
                if v.get("served"):
                    out[(spec["group"], v["name"], spec["names"]["plural"])] = (
                        spec["names"]["kind"], spec.get("scope") == "Namespaced",
                        "status" in (v.get("subresources") or {}))
        return out

    def _schedule_establishing(self, name: str) -> None:
        """The naming and establishing controllers mark a new CRD ``NamesAccepted`` and ``Established``
        a moment after it is created (establishing_controller.go, same package: queued, then a status
        update); until then nothing of it is served. Both come together here after ``establish_after_s``
        (the real naming controller may accept the names a little earlier: this double never serves sooner)."""
        async def establish() -> None:
            crd = self.find(CRD_KEY, None, name)
            if crd is None or crd_condition(crd, "Established"):
                return
            spec = crd.get("spec") or {}
            now = now_rfc3339()
            conditions = [{"type": t, "status": "True", "reason": r, "message": msg, "lastTransitionTime": now}
                          for t, r, msg in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                                            ("Established", "InitialNamesAccepted",
                                             "the initial names have been accepted"))]
            await self._update(CRD_KEY, None, name, {"status": {
                "conditions": conditions, "acceptedNames": spec.get("names") or {},
                "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")]}}, "status")

        asyncio.get_running_loop().call_later(self.establish_after_s, lambda: asyncio.ensure_future(establish()))

    # ---- the object store (kmock's), with uids, resourceVersions and namespaces ---------------------

    def _objkey(self, key: tuple[str, str, str], namespace: str | None, name: str) -> Any:
        namespaced = (KINDS.get(key) or CUSTOM_KINDS.get(key) or ("", True, False))[1]
        return (references.resource(*key), namespace if namespaced else None, name)

    def find(self, key: tuple[str, str, str], namespace: str | None, name: str) -> Obj | None:
        k = self._objkey(key, namespace, name)
        if k not in self._objects or self._objects[k].deleted:
            return None
        found: Obj = copy.deepcopy(self._objects[k].raw)
        return found

    def items(self, key: tuple[str, str, str], namespace: str | None = None) -> list[Obj]:
        return [copy.deepcopy(o) for o in self._stored(key, namespace)]

    def _stored(self, key: tuple[str, str, str], namespace: str | None = None) -> list[Obj]:
        """The stored objects themselves, for the server's own reads only: never changed, never handed
        out. Routing a ray.io request reads every CRD, and KubeRay's are megabytes: deep-copying them for
        each request was most of a kube test's CPU (py-spy)."""
        res = references.resource(*key)
        return [o.raw for (r, ns, _), o in self._objects.items()
                if r == res and not o.deleted and (namespace is None or ns == namespace)]

    def _get(self, key: tuple[str, str, str], namespace: str | None, name: str) -> Obj:
        obj = self.find(key, namespace, name)
        if obj is None:
            raise ApiError(404, "NotFound", f'{key[2]} "{name}" not found', {"name": name, "kind": key[2]})
        return obj

    def _list(self, key: tuple[str, str, str], namespace: str | None, query: Any) -> Obj:
        items = self.items(key, namespace)
        if query.get("labelSelector"):
            items = [o for o in items if selector_matches(query["labelSelector"], o["metadata"].get("labels") or {})]
        if query.get("fieldSelector"):
            items = [o for o in items if field_matches(query["fieldSelector"], o)]
        group, version, _ = key
        return {"apiVersion": f"{group}/{version}" if group else version, "kind": f"{self._kind(key)[0]}List",
                "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    async def _publish(self, key: tuple[str, str, str], event: str, obj: Obj) -> None:
        await self._publish_to(references.resource(*key), event, obj)

    async def _publish_to(self, resource: references.resource, event: str, obj: Obj) -> None:
        self.changes += 1
        await self._buses[resource].put({"type": event, "object": copy.deepcopy(obj)})

    def _require_namespace(self, key: tuple[str, str, str], namespace: str | None) -> None:
        if self._kind(key)[1] and self.find(("", "v1", "namespaces"), None, namespace or "") is None:
            raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                           {"name": namespace, "kind": "namespaces"})

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    async def _create(self, key: tuple[str, str, str], namespace: str | None, body: Obj,
                      manager: str = "", keep_status: bool = False) -> Obj:
        meta = body.setdefault("metadata", {})
        name = meta.get("name") or (meta.get("generateName", "") + uuid.uuid4().hex[:5])
        namespace = namespace or meta.get("namespace") or ("default" if self._kind(key)[1] else None)
        self._require_namespace(key, namespace)
        refuse_in_terminating(self, key, namespace, name)
        async with self._lock:
            if self.find(key, namespace, name) is not None:
                raise ApiError(409, "AlreadyExists", f'{key[2]} "{name}" already exists', {"name": name})
            obj = copy.deepcopy(body)
            if self._kind(key)[2] and not keep_status:
                obj.pop("status", None)  # the status subresource is the only way to write it
            group, version, _ = key
            obj["apiVersion"], obj["kind"] = (f"{group}/{version}" if group else version), self._kind(key)[0]
            obj["metadata"].update(name=name, uid=str(uuid.uuid4()), resourceVersion=self._next_rv(),
                                   creationTimestamp=now_rfc3339(at=self.frozen_at), generation=1)
            if namespace and self._kind(key)[1]:
                obj["metadata"]["namespace"] = namespace  # kmock's watches need it (DESIGN.md §5)
            if manager:
                obj["metadata"]["managedFields"] = [self._managed(manager, obj["apiVersion"])]
            if key == ("", "v1", "namespaces"):
                obj.setdefault("status", {"phase": "Active"})
                # Set by the API server on every namespace since 1.21 (what namespaceSelectors match by name).
                obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            fold_string_data(key, obj)
            obj = self._pruned(key, obj)
            if key == PVC_KEY:
                self._admit_claim(obj)
            if key == ("", "v1", "pods"):
                self._admit_service_account(obj, namespace, name)
                self._admit_pod_security(obj, namespace, name)
            self._objects[self._objkey(key, namespace, name)] = obj
            await self._publish(key, "ADDED", obj)
        if key == CRD_KEY and not crd_condition(obj, "Established"):
            self._schedule_establishing(name)
        return copy.deepcopy(obj)

    def _admit_service_account(self, pod: Obj, namespace: str | None, name: str) -> None:
        """The ServiceAccount admission plugin: a pod whose service account does not exist is refused
        (plugin/pkg/admission/serviceaccount/admission.go: "error looking up service account")."""
        account = (pod.get("spec") or {}).get("serviceAccountName")
        if account and account != "default" and self.find(("", "v1", "serviceaccounts"), namespace, account) is None:
            raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: error looking up service account '
                                             f'{namespace}/{account}: serviceaccount "{account}" not found')

    def _admit_pod_security(self, pod: Obj, namespace: str | None, name: str) -> None:
        """PodSecurity admission: a pod breaking its namespace's ``enforce`` level is refused, 403 Forbidden,
        every broken control named (k8s.io/pod-security-admission, admission.go; levels as
        https://kubernetes.io/docs/concepts/security/pod-security-standards/). Controllers' pods too: the
        test playing KubeRay or a DaemonSet creates through here, as they create through the API server."""
        level, version = pod_security.enforced(self.find(("", "v1", "namespaces"), None, namespace or ""))
        found = pod_security.violations(level, pod.get("metadata") or {}, pod.get("spec") or {})
        if found:
            raise ApiError(403, "Forbidden", pod_security.refusal(name, level, version, found))

    def _admit_claim(self, claim: Obj) -> None:
        """The DefaultStorageClass admission plugin: a claim that names no class (the field absent, not
        ``""``) gets the cluster's default StorageClass, the newest one when several are marked default;
        with no default it stays without a class, and only a PV of no class can ever bind it, so a
        dynamically provisioned claim stays Pending. (kubernetes.io/docs/concepts/storage/persistent-volumes/
        "Class" and /storage-classes/ "Default StorageClass"; plugin/pkg/admission/storage/storageclass/
        setdefault/admission.go.) Two defaults made in the same second (creationTimestamp has whole
        seconds) go by name, ascending: pkg/volume/util/storageclass.go GetDefaultClass sorts newest
        first, then by class name -- not by which was made last."""
        spec = claim.setdefault("spec", {})
        if spec.get("storageClassName") is not None:
            return
        defaults = [c for c in self.items(STORAGE_CLASS_KEY)
                    if ((c.get("metadata") or {}).get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true"]
        if defaults:
            newest = min(defaults, key=lambda c: (_negated(c["metadata"].get("creationTimestamp", "")),
                                                  c["metadata"]["name"]))
            spec["storageClassName"] = newest["metadata"]["name"]
        claim["status"] = {"phase": "Pending"}

    async def _update(self, key: tuple[str, str, str], namespace: str | None, name: str, patch: Obj,
                      sub: str | None, *, replace: bool = False, manager: str = "") -> Obj:
        async with self._lock:
            old = self._get(key, namespace, name)
            if sub == "status":
                new = deep_merge(old, {"status": patch.get("status")} if "status" in patch else {})
            else:
                patch = {k: v for k, v in patch.items() if not (k == "status" and self._kind(key)[2])}
                if replace:
                    new = {**copy.deepcopy(patch), "metadata": {**patch.get("metadata", {}),
                                                                **{k: old["metadata"][k] for k in
                                                                   ("uid", "creationTimestamp", "namespace")
                                                                   if k in old["metadata"]}}}
                    if "status" in old:
                        new["status"] = old["status"]
                else:
                    new = deep_merge(old, patch)
                fold_string_data(key, new)
            for k in ("apiVersion", "kind"):
                new[k] = old[k]
            new = self._pruned(key, new)
            new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            new["metadata"]["managedFields"] = old["metadata"].get("managedFields", [])
            if new == old:
                return old  # a no-op write keeps its resourceVersion, as a real server does
            if manager:
                new["metadata"]["managedFields"] = [m for m in new["metadata"]["managedFields"]
                                                    if m.get("manager") != manager]
                new["metadata"]["managedFields"].append(self._managed(manager, old["apiVersion"]))
            if new.get("spec") != old.get("spec"):
                new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._objects[self._objkey(key, namespace, name)].create(new)
            await self._publish(key, "MODIFIED", new)
            return copy.deepcopy(new)

    async def _apply(self, key: tuple[str, str, str], namespace: str | None, name: str, body: Obj,
                     manager: str) -> tuple[Obj, bool]:
        """Server-side apply, approximated: create when missing, else merge the applied fields in."""
        if not manager:
            raise ApiError(400, "BadRequest", "PATCH with apply-patch requires fieldManager")
        if (body.get("metadata") or {}).get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name in the body does not match the URL")
        if self.find(key, namespace, name) is None:
            body.setdefault("metadata", {})["name"] = name
            return await self._create(key, namespace, body, manager), True
        return await self._update(key, namespace, name, body, None, manager=manager), False

    async def _delete(self, key: tuple[str, str, str], namespace: str | None, name: str, *,
                      now: bool = False) -> Obj:
        """Removed at once with ``now``; else a pod in its grace period or a namespace with content left
        stays, Terminating (``kube_lifecycle``), and that is what the DELETE answers."""
        obj = self._get(key, namespace, name)
        if not now and (kept := await held(self, key, namespace, obj)) is not None:
            return kept
        async with self._lock:
            self._objects[self._objkey(key, namespace, name)].delete()
            await self._publish(key, "DELETED", obj)
        if key == ("", "v1", "namespaces"):  # a namespace takes its objects with it
            for (r, ns, _name), o in list(self._objects.items()):
                if ns == name and not o.deleted:
                    o.delete()
                    await self._publish_to(r, "DELETED", o.last.raw)
        if key == CRD_KEY:
            # A CRD takes every object of its kind with it, in every namespace: the finalizer
            # customresourcecleanup.apiextensions.k8s.io (finalizer/crd_finalizer.go, same package)
            # deletes them before the CRD goes.
            spec = obj.get("spec") or {}
            for (r, _ns, _name), o in list(self._objects.items()):
                if r.group == spec.get("group") and r.plural == (spec.get("names") or {}).get("plural") \
                        and not o.deleted:
                    o.delete()
                    await self._publish_to(r, "DELETED", o.last.raw)
        return obj

    @staticmethod
    def _managed(manager: str, api_version: str) -> Obj:
        return {"manager": manager, "operation": "Apply", "apiVersion": api_version, "time": now_rfc3339(),
                "fieldsType": "FieldsV1", "fieldsV1": {}}

    # ---- discovery: enough for kubectl -----------------------------------------------------------

    def _discovery(self, path: str) -> aiohttp.web.Response:
        kinds = {**KINDS, **self._established()}
        groups = sorted({(g, v) for g, v, _ in kinds if g})
        if path == "/api":
            doc: Obj = {"kind": "APIVersions", "versions": ["v1"],
                        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        elif path == "/apis":
            doc = {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                 "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in groups]}
        else:
            gv = path.removeprefix("/api/").removeprefix("/apis/")
            group, _, version = gv.rpartition("/")
            resources = [{"name": p + sub, "singularName": "" if sub else kind.lower(), "namespaced": ns,
                          "kind": kind, "verbs": ["get", "patch", "update"] if sub else
                          ["create", "delete", "get", "list", "patch", "update", "watch"]}
                         for (g, v, p), (kind, ns, status) in kinds.items() if (g, v) == (group, version)
                         for sub in (["", "/status"] if status else [""])]
            if not resources:
                raise not_served()
            doc = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
        return aiohttp.web.json_response(doc)

    # ---- pod logs ---------------------------------------------------------------------------------

    async def feed_log(self, namespace: str, pod: str, lines: list[str]) -> None:
        async with self._log_changed:
            self._logs.setdefault((namespace, pod), []).extend((now_rfc3339(nano=True), ln) for ln in lines)
            self._log_changed.notify_all()

    async def drop_log_streams(self, abrupt: bool = False) -> None:
        async with self._log_changed:
            self._log_generation += 1
            self._abrupt_drop = abrupt
            self._log_changed.notify_all()

    async def _serve_log(self, raw: aiohttp.web.BaseRequest, namespace: str, pod: str) -> aiohttp.web.StreamResponse:
        self._get(("", "v1", "pods"), namespace, pod)
        since = raw.query.get("sinceTime")
        stamps = raw.query.get("timestamps") == "true"
        follow = raw.query.get("follow") == "true"
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(raw)
        sent, generation = 0, self._log_generation
        while True:
            lines = self._logs.get((namespace, pod), [])
            for ts, text in lines[sent:]:
                if since is None or ts[:19] >= since.rstrip("Z")[:19]:
                    await response.write(((ts + " ") if stamps else "").encode() + text.encode() + b"\n")
            sent = len(lines)
            if not follow:
                break
            def more(seen: int = sent) -> bool:
                return len(self._logs.get((namespace, pod), [])) > seen or self._log_generation != generation

            async with self._log_changed:
                await self._log_changed.wait_for(more)
            if self._log_generation != generation:
                if self._abrupt_drop and raw.transport is not None:
                    raw.transport.close()  # the client sees a broken chunked stream
                    return response
                break
        await response.write_eof()
        return response

    # ---- pods/exec over WebSocket (what ``kubectl exec``/``kubectl cp`` and the python client use) -----

    async def _serve_exec(self, raw: aiohttp.web.BaseRequest, namespace: str, pod: str) -> aiohttp.web.StreamResponse:
        """``GET|POST .../pods/NAME/exec?command=..&stdout=true&stderr=true`` upgraded to a WebSocket.

        As the API server and the kubelet answer (kubernetes pkg/registry/core/pod/strategy.go
        ``streamLocation``; kubelet server.go ``getExec``; staging client-go tools/remotecommand and
        apiserver pkg/util/wsstream):
        - the checks before the upgrade: no such pod 404; no command 400 "you must specify at least 1
          command"; no stdout/stderr/stdin 400; a pod not scheduled 400 "pod NAME does not have a host
          assigned"; a completed pod 400 "cannot exec into a container in a completed pod; current phase
          is Succeeded"; a container the pod lacks 400 "container X is not valid for pod NAME"; a
          container that is not running: the kubelet's 404, "container not found ("X")";
        - the subprotocols ``v4.channel.k8s.io`` (and ``v5``, the same frames server to client) from
          the client's list; a client offering none is refused (400);
        - every frame binary, its first byte the channel: an empty frame opens each channel, then 1 is
          stdout, 2 stderr, and 3 carries one JSON ``Status``: ``{"metadata":{},"status":"Success"}``, or
          on a non-zero exit ``Failure`` with reason ``NonZeroExitCode`` and the code as the message of a
          cause of type ``ExitCode`` (kubelet cri/streaming/remotecommand/exec.go ``ServeExec``); then
          the server closes the socket.
        The "container" is this machine: the command runs in the directory the test gave the pod
        (``exec_dirs``), ``python`` being this interpreter."""
        found = self._get(("", "v1", "pods"), namespace, pod)
        query = raw.query
        command = query.getall("command", [])
        if not command:
            raise ApiError(400, "BadRequest", "you must specify at least 1 command")
        if not any(query.get(s) in ("true", "1") for s in ("stdout", "stderr", "stdin")):
            raise ApiError(400, "BadRequest", "you must specify at least one of stdin, stdout, stderr")
        spec, status = found.get("spec") or {}, found.get("status") or {}
        if not spec.get("nodeName"):
            raise ApiError(400, "BadRequest", f"pod {pod} does not have a host assigned")
        if status.get("phase") in ("Succeeded", "Failed"):
            raise ApiError(400, "BadRequest", "cannot exec into a container in a completed pod; current phase is "
                                              f"{status['phase']}")
        names = [c["name"] for c in spec.get("containers") or []]
        container = query.get("container") or (names[0] if len(names) == 1 else "")
        if container not in names:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {pod}" if container else
                           f"a container name must be specified for pod {pod}, choose one of: {names}")
        running = [s for s in status.get("containerStatuses") or []
                   if s.get("name") == container and "running" in (s.get("state") or {})]
        if not running:
            raise ApiError(404, "NotFound", f'container not found ("{container}")')
        if raw.headers.get("Upgrade", "").lower() != "websocket":
            raise ApiError(400, "BadRequest", "Upgrade request required")
        offered = [p.strip() for p in raw.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        protocol = next((p for p in offered if p in ("v5.channel.k8s.io", "v4.channel.k8s.io")), None)
        if protocol is None:
            raise ApiError(400, "BadRequest", "websocket: the client did not offer a supported subprotocol")
        cwd = self.exec_dirs.get((namespace, pod))
        if cwd is None:
            raise ApiError(500, "InternalError", f"exec into {namespace}/{pod} is not emulated (no directory)")
        ws = aiohttp.web.WebSocketResponse(protocols=(protocol,), max_msg_size=0)
        await ws.prepare(raw)
        for channel in (1, 2, 3):
            await ws.send_bytes(bytes([channel]))
        argv = [sys.executable if c == "python" else c for c in command]
        try:
            proc = await asyncio.create_subprocess_exec(*argv, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
        except OSError as exc:  # runc: the executable is not in the container
            await ws.send_bytes(b"\x03" + json.dumps({
                "metadata": {}, "status": "Failure", "reason": "InternalError",
                "message": f"Internal error occurred: error executing command in container: {exc}"}).encode())
            await ws.close()
            return ws

        async def pump(stream: asyncio.StreamReader | None, channel: int) -> None:
            assert stream is not None
            while chunk := await stream.read(32 * 1024):
                await ws.send_bytes(bytes([channel]) + chunk)

        await asyncio.gather(pump(proc.stdout, 1), pump(proc.stderr, 2))
        code = await proc.wait()
        if code == 0:
            result: Obj = {"metadata": {}, "status": "Success"}
        else:
            result = {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                      "message": f"command terminated with non-zero exit code: error executing command {command}, "
                                 f"exit code {code}",
                      "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}
        await ws.send_bytes(b"\x03" + json.dumps(result).encode())
        await ws.close()
        return ws

    # ---- the API server's service proxy (DESIGN.md §4) ------------------------------------------------

    def apiserver_ips(self) -> list[str]:
        """The API server's own addresses: the ``kubernetes`` Service's Endpoints, which it maintains."""
        endpoints = self.find(("", "v1", "endpoints"), "default", "kubernetes") or {}
        return [a["ip"] for s in endpoints.get("subsets") or [] for a in s.get("addresses") or []]

    def reach(self, src: Source, namespace: str, service: str, port: str) -> tuple[Obj, int] | None:
        """The pod behind ``service`` a connection from ``src`` gets to, and its port; None when the
        NetworkPolicies drop it (the client then times out: a dropped SYN gets no answer)."""
        svc = self.find(("", "v1", "services"), namespace, service) or {}
        ports = [p for p in (svc.get("spec") or {}).get("ports") or []
                 if p.get("name") == port or str(p.get("port")) == port]
        number = int(ports[0].get("targetPort") or ports[0]["port"]) if ports else int(port) if port.isdigit() else 0
        selector = (svc.get("spec") or {}).get("selector") or {}
        backends = [p for p in self.items(("", "v1", "pods"), namespace)
                    if selector and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
                    and (p.get("status") or {}).get("phase") == "Running"]
        if not backends:
            return None
        pod = backends[0]
        if self.enforce_policies and not admitted(
                self.items(("networking.k8s.io", "v1", "networkpolicies")), pod, src, number):
            return None
        return pod, number

    async def _proxy(self, raw: aiohttp.web.BaseRequest, namespace: str, service: str, port: str,
                     rest: str | None) -> aiohttp.web.StreamResponse:
        target = self.proxies.get((namespace, service, port))
        if target is None:
            raise ApiError(503, "ServiceUnavailable", f'no endpoints available for service "{service}"')
        # The proxy dials the pod from wherever the API server's traffic enters the pod network (its own
        # address, a tunnel address, a Konnectivity agent: ``proxy_source``): a policy that does not admit
        # that source drops the SYN, and the API server answers what its proxy handler does on a dial timeout.
        source = self.proxy_source or Source(ip=(self.apiserver_ips() or ["0.0.0.0"])[0])
        if self.enforce_policies and self.reach(source, namespace, service, port) is None:
            raise ApiError(503, "ServiceUnavailable",
                           f"error trying to reach service: dial tcp {service}.{namespace}:{port}: i/o timeout")
        url = target.rstrip("/") + (rest or "/")
        headers = {k: v for k, v in raw.headers.items()
                   if k.lower() not in ("authorization", "host", "content-length", "transfer-encoding")}
        async with aiohttp.ClientSession() as session:
            if raw.headers.get("Upgrade", "").lower() == "websocket":
                return await self._proxy_ws(raw, session, url, headers)
            async with session.request(raw.method, url, params=raw.query, headers=headers,
                                       data=(await raw.read()) or None, allow_redirects=False) as upstream:
                body = await upstream.read()
                out = {k: v for k, v in upstream.headers.items()
                       if k.lower() not in ("content-length", "transfer-encoding", "content-encoding", "connection")}
                return aiohttp.web.Response(status=upstream.status, body=body, headers=out)

    async def _proxy_ws(self, raw: aiohttp.web.BaseRequest, session: aiohttp.ClientSession, url: str,
                        headers: dict[str, str]) -> aiohttp.web.StreamResponse:
        for h in ("Upgrade", "Connection", "Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Extensions"):
            headers.pop(h, None)
        downstream = aiohttp.web.WebSocketResponse()
        await downstream.prepare(raw)  # a BaseRequest is enough for aiohttp
        async with session.ws_connect(url.replace("http", "ws", 1), headers=headers) as upstream:

            async def pump(src: Any, dst: Any) -> None:
                async for msg in src:
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        await dst.send_str(msg.data)
                    elif msg.type == aiohttp.WSMsgType.BINARY:
                        await dst.send_bytes(msg.data)
                    else:
                        break
                await dst.close()

            await asyncio.gather(pump(downstream, upstream), pump(upstream, downstream), return_exceptions=True)
        return downstream
