"""What an `up` sent to the emulated API server, beside what `rtui manifest` prints for the same run
(issue 38: the plan carries the object that is applied). Both sides are read from the outside: the
objects that reached the server, labelled as the run's, and the YAML the real binary prints."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from targets.kube.raycluster import SPEC_ANNOTATION
from tests.kube.conftest import KubeCluster

RUN_LABEL = "rtui.dev/run"
# Every kind rtui applies itself (what KubeRay's and the test's controllers make from them, such as pods,
# is theirs). CRDs come from their source and are named in a note of `rtui manifest`, not printed.
APPLIED_KINDS = ("Namespace", "Secret", "ServiceAccount", "NetworkPolicy", "PersistentVolumeClaim", "DaemonSet",
                 "Deployment", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "RayCluster")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}")
Obj = dict[str, Any]


def key(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{obj['kind']} {meta.get('namespace') or '-'}/{meta['name']}"


def applied(cluster: KubeCluster, run_id: str) -> dict[str, Obj]:
    """The objects of ``run_id`` on the server, by kind, namespace and name."""
    return {key(o): o for kind in APPLIED_KINDS for o in cluster.objects(kind)
            if (o["metadata"].get("labels") or {}).get(RUN_LABEL) == run_id}


def printed(text: str) -> dict[str, Obj]:
    return {key(o): o for o in yaml.safe_load_all(text) if o}


def comparable(obj: Obj) -> Obj:
    """``obj`` without what only the server or the moment of applying fills in: the server's metadata
    and status, a Secret's value (read when applied; the manifest says where from), an image's digest
    (resolved at plan time), the GPU nodes a pre-pull finds by name and the API server's addresses a
    NetworkPolicy admits (both read when applied)."""
    meta = obj["metadata"]
    out: Obj = {k: v for k, v in obj.items() if k not in ("metadata", "status", "data", "stringData")}
    out["metadata"] = {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if meta.get(k)}
    # The API server labels every namespace with its name (NamespaceDefaultLabelName).
    if obj["kind"] == "Namespace":
        out["metadata"]["labels"] = {k: v for k, v in meta.get("labels", {}).items()
                                     if k != "kubernetes.io/metadata.name"}
    if SPEC_ANNOTATION in out["metadata"].get("annotations", {}):  # the plan's spec: its digest, as above
        spec = json.loads(out["metadata"]["annotations"][SPEC_ANNOTATION])
        out["metadata"]["annotations"] = {**out["metadata"]["annotations"], SPEC_ANNOTATION: {
            k: v for k, v in spec.items() if k not in ("digest", "pinning")}}
    if obj["kind"] == "Secret":
        out["keys"] = sorted({*(obj.get("data") or {}), *(obj.get("stringData") or {})})
    elif obj["kind"] == "NetworkPolicy":
        out["spec"] = {**obj["spec"], "ingress": [r for r in obj["spec"].get("ingress", [])
                                                  if not any("ipBlock" in p for p in r.get("from", []))]}
    elif obj["kind"] == "DaemonSet" and obj["metadata"]["name"].endswith("-image-prepull"):
        terms = obj["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        terms[:] = [t for t in terms if t["matchExpressions"][0]["key"] != "kubernetes.io/hostname"]
    plain: Obj = yaml.safe_load(_DIGEST.sub("", yaml.safe_dump(out)))
    return plain


def differences(manifest: dict[str, Obj], live: dict[str, Obj]) -> list[str]:
    """One line per object printed but not applied, applied but not printed, or applied otherwise."""
    out = [f"applied, not printed: {k}" for k in sorted(live.keys() - manifest.keys())]
    out += [f"printed, not applied: {k}" for k in sorted(manifest.keys() - live.keys())]
    for k in sorted(manifest.keys() & live.keys()):
        want, have = comparable(manifest[k]), comparable(live[k])
        if want != have:
            out.append(f"applied otherwise: {k}: {_first_difference(want, have)}")
    return out


def _first_difference(want: Any, have: Any, path: str = "") -> str:
    if isinstance(want, dict) and isinstance(have, dict):
        for k in sorted(want.keys() | have.keys(), key=str):
            if want.get(k) != have.get(k):
                return _first_difference(want.get(k), have.get(k), f"{path}.{k}")
    if isinstance(want, list) and isinstance(have, list) and len(want) == len(have):
        for i, (a, b) in enumerate(zip(want, have, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    return f"{path or '.'}: printed {want!r}, applied {have!r}"
