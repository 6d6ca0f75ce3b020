"""Whether the KubeRay a cluster already has can carry the RayCluster rtui applies: refused at plan time.

rtui turns Ray's token auth on through ``spec.authOptions: {mode: token, secretName: <the run's Secret>}``
and leaves the Ray containers' ``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN`` to the operator, which adds them
to the Ray container, KubeRay's ``wait-gcs-ready`` init container and the autoscaler sidecar
(ray-project/kuberay v1.6.0+ ``ray-operator/controllers/ray/common/pod.go``, SetContainerTokenAuthEnvVars,
each variable only when the container has none). Older releases cannot do that (read at each tag):

- before v1.5.1 the CRD has no ``authOptions``: the API server prunes the field (a structural schema
  keeps only the fields it specifies; Kubernetes docs, CustomResourceDefinitions, "Field pruning"),
  the operator injects nothing, and Ray starts without auth;
- v1.5.x has ``authOptions.mode`` but no ``secretName`` (pruned too): the operator makes a Secret of
  its own, named after the cluster, and *appends* its ``RAY_AUTH_TOKEN`` after any the container has;
  the kubelet keeps the last of duplicate names, so Ray's token is not the one rtui holds (401).

So the served RayCluster schema is read (the CRD, or the API server's OpenAPI v3 for ``ray.io/v1``
when the user may not read CRDs; every authenticated user may read ``/openapi/*`` through the
``system:discovery`` ClusterRole), every field of rtui's RayCluster it would prune is named, and an
operator whose version is visible (image tag, else the chart's ``app.kubernetes.io/version`` label)
older than ``MINIMUM`` is refused too: CRDs upgraded without the operator still break the token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backend.errors import UserError
from backend.layers.base import Context
from targets.kube import addons, manifests
from targets.kube.cluster_api import ClusterNotReady, cluster_api
from targets.kube.config import KubeConfig, kube_config

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

Obj = dict[str, Any]

MINIMUM = "1.6.0"
RAYCLUSTER_CRD = "rayclusters.ray.io"
OPENAPI_PATH = "/openapi/v3/apis/ray.io/v1"
# The release whose RayCluster CRD first carries a field rtui may set (ray-operator/config/crd/bases/
# ray.io_rayclusters.yaml at each tag): the minimum named when that field is missing.
ADDED_IN: dict[str, str] = {
    "spec.authOptions": "1.5.1",
    "spec.authOptions.secretName": "1.6.0",
    "spec.autoscalerOptions.version": "1.4.0",
}
_WHY = "rtui's Ray token reaches Ray only through authOptions.secretName"


@dataclass(frozen=True)
class ServedSchema:
    schema: Obj
    source: str  # where it was read, for the message


def release(text: str) -> tuple[int, ...] | None:
    """``v1.5.1``/``1.6.2-rc.0`` -> (1, 5, 1)/(1, 6, 2); None for what is not a release (``latest``)."""
    parts = text.strip().removeprefix("v").split("-", 1)[0].split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def unknown_fields(value: Any, schema: Obj | None, path: str = "spec", *, root: bool = False) -> list[str]:
    """The dotted paths of ``value``'s fields a structural ``schema`` does not specify (what the API server
    would prune); ``root``: ``value`` is the whole object, its apiVersion, kind and metadata are never pruned."""
    if not schema or not isinstance(value, (dict, list)):
        return []
    if any(k in schema for k in ("$ref", "allOf", "anyOf", "oneOf")) and "properties" not in schema:
        return []  # a reference this module does not follow: nothing said about it rather than a guess
    if isinstance(value, list):
        items = schema.get("items")
        return [p for v in value for p in unknown_fields(v, items if isinstance(items, dict) else None, path)]
    props: Obj = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    keeps = schema.get("x-kubernetes-preserve-unknown-fields") is True or extra is True
    out: list[str] = []
    for key, v in value.items():
        here = key if root else f"{path}.{key}"
        if root and key in ("apiVersion", "kind", "metadata"):
            continue
        if key in props:
            out += unknown_fields(v, props[key], here)
        elif isinstance(extra, dict):
            out += unknown_fields(v, extra, f"{path}.*")
        elif not keeps:
            out.append(here)
    return list(dict.fromkeys(out))


async def served_schema(api: KubeApi) -> ServedSchema | None:
    """The RayCluster ``ray.io/v1`` schema the API server validates with, None when no CRD serves it."""
    # lazy: the kubernetes client only when a cluster is reached (access imports it)
    from targets.kube.api import Forbidden, KindNotServed

    try:
        crd = await api.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", RAYCLUSTER_CRD)
    except Forbidden:
        try:
            doc = await api.get_path(OPENAPI_PATH, "openapi/v3 ray.io/v1")
        except (Forbidden, KindNotServed):
            return None  # nothing rtui may read about it: the operator handler and the apply speak then
        for body in ((doc.get("components") or {}).get("schemas") or {}).values():
            gvks = body.get("x-kubernetes-group-version-kind") or []
            if {"group": "ray.io", "version": "v1", "kind": "RayCluster"} in gvks:
                return ServedSchema(body, f"schema in the API server's OpenAPI ({OPENAPI_PATH})")
        return None
    if crd is None:
        return None
    for version in (crd.get("spec") or {}).get("versions") or []:
        if version.get("name") == "v1" and version.get("served"):
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            return ServedSchema(schema, f"CRD {RAYCLUSTER_CRD}") if isinstance(schema, dict) else None
    return None


def _containers(deployment: Obj) -> list[Obj]:
    containers: list[Obj] = ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") \
        or []
    return containers


def _is_operator(deployment: Obj) -> bool:
    """A KubeRay operator (``addons.is_kuberay_operator``: a mirrored image too), not one being deleted."""
    if (deployment.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return addons.is_kuberay_operator(deployment)


def operator_release(deployment: Obj) -> str | None:
    """The release a KubeRay operator Deployment runs, when its image tag or its chart's label says."""
    for container in _containers(deployment):
        image = str(container.get("image", "")).split("@", 1)[0]
        last = image.rsplit("/", 1)[-1]
        if ":" in last and release(last.rsplit(":", 1)[1]):
            return last.rsplit(":", 1)[1].removeprefix("v")
    label = str((deployment.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/version", ""))
    return label.removeprefix("v") if release(label) else None


def schema_refusal(config: KubeConfig, run_id: str, served: ServedSchema) -> UserError | None:
    """The one-line refusal when the served schema would prune a field of the RayCluster rtui applies."""
    missing = unknown_fields(manifests.raycluster(config, run_id), served.schema, root=True)
    if not missing:
        return None
    need = max((ADDED_IN.get(p, MINIMUM) for p in missing), key=lambda v: release(v) or ())
    need = max(need, MINIMUM, key=lambda v: release(v) or ())
    more = f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
    return UserError(f"the cluster's KubeRay is older than {need}: its RayCluster {served.source} has no "
                     f"{missing[0]}{more}, which the API server would drop ({_WHY})",
                     remedy=f"upgrade KubeRay's CRDs and operator to {MINIMUM} or later, or use a cluster "
                            "where rtui installs its own")


def operator_refusal(deployment: Obj) -> UserError | None:
    """The one-line refusal of a KubeRay operator whose visible release is older than ``MINIMUM``."""
    found = operator_release(deployment)
    if found is None or (release(found) or ()) >= (release(MINIMUM) or ()):
        return None
    meta = deployment.get("metadata") or {}
    what = "sets no Ray token" if (release(found) or ()) < (1, 5, 1) else \
        "ignores authOptions.secretName and appends a RAY_AUTH_TOKEN of its own after rtui's"
    return UserError(f"the KubeRay operator {meta.get('namespace')}/{meta.get('name')} is {found}, older than "
                     f"{MINIMUM}: it {what}",
                     remedy=f"upgrade KubeRay's operator and CRDs to {MINIMUM} or later")


async def refuse_unfit_kuberay(ctx: Context) -> None:
    """Raise the one-line refusal when the cluster's KubeRay cannot carry rtui's RayCluster; nothing when
    the cluster has none yet (rtui installs its own), is not made yet (aws), or rtui may see neither the
    schema nor the operator."""
    try:
        api = await cluster_api(ctx)
    except ClusterNotReady:
        return
    await check(api, kube_config(ctx), ctx.record.run_id)


async def check(api: KubeApi, config: KubeConfig, run_id: str) -> None:
    """``refuse_unfit_kuberay`` on a cluster's API."""
    # lazy: the kubernetes client only when a cluster is reached (access imports it)
    from targets.kube.api import Forbidden

    served = await served_schema(api)
    refusal = schema_refusal(config, run_id, served) if served is not None else None
    if refusal is None:
        try:
            deployments = await api.list("apps/v1", "Deployment")
        except Forbidden:
            deployments = []  # a namespace admin does not see the operator: the schema is what is known
        refusals = [r for d in deployments if _is_operator(d) and (r := operator_refusal(d)) is not None]
        refusal = refusals[0] if refusals else None
    if refusal is not None:
        raise refusal
