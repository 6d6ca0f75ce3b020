"""KubeRay as another team installed it, at release 1.4, 1.5, 1.6 or 1.7: its RayCluster CRD and its env.

What differs between releases, read in ray-project/kuberay at each tag:

- The RayCluster CRD (``ray-operator/config/crd/bases/ray.io_rayclusters.yaml``): ``spec.authOptions``
  (``mode``) first appears in v1.5.1; ``authOptions.secretName`` and ``enableK8sTokenAuth`` and
  ``spec.upgradeStrategy`` in v1.6.0; v1.7.0 adds ``autoscalerOptions.args/command``,
  ``gcsFaultToleranceOptions.backend/storage``, ``headGroupSpec.ingressOptions``,
  ``historyServerOptions``, ``networkPolicy``, ``tlsOptions`` and ``workerGroupSpecs[].priority``.
  An older release's CRD is v1.7.0's (``/work/shared/schemas/kuberay``) without those fields.
- What the API server does with a field the served schema lacks: it drops it. Every
  ``apiextensions.k8s.io/v1`` CRD has a structural schema and its objects are pruned of unknown
  fields on create and update, except under ``x-kubernetes-preserve-unknown-fields: true``, and for
  ``apiVersion``, ``kind`` and ``metadata`` at the root (Kubernetes docs, "Extend the Kubernetes API
  with CustomResourceDefinitions", section "Field pruning"; KEP-2332; k8s.io/apiextensions-apiserver
  pkg/apiserver/schema/pruning ``PruneWithOptions``). ``prune`` does that.
- The env the operator puts in the Ray container (``ray-operator/controllers/ray/common/pod.go``):
  v1.5.1's ``SetContainerTokenAuthEnvVars`` *appends* ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN``
  from the Secret named after the cluster (``reconcileAuthSecret`` creates it with a random token;
  there is no ``secretName``), whatever env the container already has; v1.6.0 and later add each only
  when the container has none, from ``authOptions.secretName`` when set (else the cluster-named
  Secret). With two entries of one name the kubelet keeps the last (``_container_env``), so under
  v1.5.1 Ray starts with the operator's token, not the one in rtui's Secret. Before v1.5.1 there is
  no token auth at all: the field is pruned and nothing is injected.
- The published OpenAPI v3 (``/openapi/v3``, KEP-2896, GA in 1.27): the root document lists each
  group-version's path; ``/openapi/v3/apis/<group>/<version>`` holds a component schema per kind,
  named with the group reversed (``io.ray.v1.RayCluster``) and tagged ``x-kubernetes-group-version-kind``,
  its body the CRD's ``openAPIV3Schema`` (k8s.io/apiextensions-apiserver pkg/controller/openapi/builder
  ``BuildOpenAPIV3``). Any authenticated user may read it (the ``system:discovery`` ClusterRole grants
  ``/openapi/*``), so a namespace admin who may not read CRDs still sees what the cluster serves.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.kube.crds import SHARED, load_yaml

Obj = dict[str, Any]

VERSIONS = ("1.4.2", "1.5.1", "1.6.2", "1.7.0")

# Fields of v1.7.0's RayCluster spec an older release's CRD lacks (dotted; ``[]`` is an array's items).
_NEW_IN_1_7 = ("spec.autoscalerOptions.args", "spec.autoscalerOptions.command",
               "spec.gcsFaultToleranceOptions.backend", "spec.gcsFaultToleranceOptions.storage",
               "spec.headGroupSpec.ingressOptions", "spec.historyServerOptions", "spec.networkPolicy",
               "spec.tlsOptions", "spec.workerGroupSpecs[].priority")
_NEW_IN_1_6 = ("spec.authOptions.secretName", "spec.authOptions.enableK8sTokenAuth", "spec.upgradeStrategy")
_NEW_IN_1_5_1 = ("spec.authOptions",)
_LACKS: dict[str, tuple[str, ...]] = {
    "1.7.0": (),
    "1.6.2": _NEW_IN_1_7,
    "1.5.1": _NEW_IN_1_7 + _NEW_IN_1_6,
    "1.4.2": _NEW_IN_1_7 + _NEW_IN_1_6 + _NEW_IN_1_5_1,
}


def release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.removeprefix("v").split("."))


def _drop(schema: Obj, path: str) -> None:
    node: Obj | None = schema
    *parents, leaf = path.split(".")
    for part in parents:
        node = ((node or {}).get("properties") or {}).get(part.removesuffix("[]"))
        if part.endswith("[]"):
            node = (node or {}).get("items")
    ((node or {}).get("properties") or {}).pop(leaf, None)  # a version the CRD holds without it already


def raycluster_crd(version: str) -> Obj:
    """The RayCluster CRD of KubeRay ``version`` (one of ``VERSIONS``), as its release ships it (no rtui labels)."""
    crd: Obj = load_yaml(SHARED / "ray.io_rayclusters.yaml")
    for served in crd["spec"]["versions"]:
        for path in _LACKS[version]:
            _drop(served["schema"]["openAPIV3Schema"], path)
    crd.setdefault("metadata", {}).setdefault("annotations", {})["rtui.test/kuberay-version"] = version
    return crd


def served_schema(crd: Obj, version: str) -> Obj | None:
    """The ``openAPIV3Schema`` of a served ``version`` of the CRD, None when it serves none such."""
    for v in (crd.get("spec") or {}).get("versions") or []:
        if v.get("name") == version and v.get("served"):
            schema: Obj | None = (v.get("schema") or {}).get("openAPIV3Schema")
            return schema
    return None


def prune(value: Any, schema: Obj | None, root: bool = False) -> Any:
    """``value`` without the fields ``schema`` does not specify, as the API server stores a custom resource."""
    if schema is None or not isinstance(value, (dict, list)):
        return value
    if isinstance(value, list):
        items = schema.get("items")
        return [prune(v, items if isinstance(items, dict) else None) for v in value]
    props: Obj = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") is True or extra is True
    embedded = root or schema.get("x-kubernetes-embedded-resource") is True
    out: Obj = {}
    for key, v in value.items():
        if embedded and key in ("apiVersion", "kind", "metadata"):
            out[key] = v  # ObjectMeta and TypeMeta are the API server's, never pruned by the CRD's schema
        elif key in props:
            out[key] = prune(v, props[key])
        elif isinstance(extra, dict):
            out[key] = prune(v, extra)
        elif keep_unknown:
            out[key] = v
    return out


def missing_required(value: Any, schema: Obj | None, path: str = "") -> list[str]:
    """The paths of the fields ``schema`` requires that ``value`` lacks (``spec.headGroupSpec.template``),
    as the API server's structural-schema validation names them ("Required value", 422 Invalid)."""
    if schema is None:
        return []
    if isinstance(value, list):
        items = schema.get("items")
        return [m for i, v in enumerate(value)
                for m in missing_required(v, items if isinstance(items, dict) else None, f"{path}[{i}]")]
    if not isinstance(value, dict):
        return []
    props: Obj = schema.get("properties") or {}
    missing = [f"{path}.{name}".lstrip(".") for name in schema.get("required") or [] if name not in value]
    for key, v in value.items():
        if key in props and not (not path and key in ("apiVersion", "kind", "metadata")):
            missing += missing_required(v, props[key], f"{path}.{key}")
    return missing


def openapi_root(crds: list[Obj]) -> Obj:
    """``/openapi/v3``: the group-versions the served CRDs add (the built-in ones are left out)."""
    paths = {f"apis/{c['spec']['group']}/{v['name']}": {"serverRelativeURL": f"/openapi/v3/apis/"
                                                                              f"{c['spec']['group']}/{v['name']}"}
             for c in crds for v in c["spec"].get("versions") or [] if v.get("served")}
    return {"paths": paths}


def openapi_group_version(crds: list[Obj], group: str, version: str) -> Obj | None:
    """``/openapi/v3/apis/<group>/<version>``, None (a 404) when no served CRD defines a kind there."""
    schemas: Obj = {}
    reversed_group = ".".join(reversed(group.split(".")))
    for crd in crds:
        spec = crd["spec"]
        body = served_schema(crd, version) if spec.get("group") == group else None
        if body is None:
            continue
        kind = spec["names"]["kind"]
        schemas[f"{reversed_group}.{version}.{kind}"] = {
            **copy.deepcopy(body),
            "x-kubernetes-group-version-kind": [{"group": group, "kind": kind, "version": version}]}
    if not schemas:
        return None
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
            "paths": {}, "components": {"schemas": schemas}}


def operator_env(version: str, env: list[Obj], cluster: str, auth: Obj | None) -> list[Obj]:
    """The Ray container's env once the operator of ``version`` has added its auth variables to ``env``."""
    if not auth or auth.get("mode") != "token" or release(version) < (1, 5, 1):
        return env
    old = release(version) < (1, 6)
    secret = cluster if old or not auth.get("secretName") else str(auth["secretName"])
    names = {v["name"] for v in env}
    added = [v for v in ({"name": "RAY_AUTH_MODE", "value": "token"},
                         {"name": "RAY_AUTH_TOKEN",
                          "valueFrom": {"secretKeyRef": {"name": secret, "key": "auth_token"}}})
             if old or v["name"] not in names]
    return [*env, *added]


def operator_secret(version: str, auth: Obj | None, cluster: str) -> str | None:
    """The Secret the operator reads the token from (and creates when it is its own), None without auth."""
    if not auth or auth.get("mode") != "token" or release(version) < (1, 5, 1):
        return None
    if release(version) >= (1, 6) and auth.get("secretName"):
        return str(auth["secretName"])
    return cluster
