"""The cluster add-ons rtui installs, as plain data: the two device plugins and the KubeRay operator.

Pure like manifests.py: objects in, objects out, no cluster calls. The handlers first ask
``find_*`` whether the cluster already runs one (whoever installed it) and adopt it; only one
installer each, or two plugins fight over the same devices (DESIGN.md §4). Sources followed:
- NVIDIA device plugin: NVIDIA/k8s-device-plugin v0.18.0, ``deployments/static/nvidia-device-plugin.yml``
  (pod spec) and ``deployments/helm/nvidia-device-plugin/values.yaml`` (node affinity, tolerations).
- EFA device plugin: aws/eks-charts ``stable/aws-efa-k8s-device-plugin`` (values + daemonset template),
  the chart of v0.5.6 and the one after v0.5.9 (which turned the container privileged).
- KubeRay: ray-project/kuberay v1.7.0, ``helm-chart/kuberay-operator`` (templates, values.yaml) and
  ``ray-operator/config/rbac/role.yaml`` (the chart's ClusterRole rules are the same 24 rules).
"""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Literal

import yaml

from backend.errors import OperationError, UserError
from backend.paths import config_dir
from targets.kube.config import KubeConfig
from targets.kube.manifests import (
    GPU_NODE_LABEL,
    GPU_RESOURCE,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    Manifest,
    labels,
)
from targets.kube.pods import unschedulable_reason

INSTALLED_BY = "rtui.dev/installed-by-run"
NAME_LABEL = "app.kubernetes.io/name"
SYSTEM_NAMESPACE = "kube-system"
NVIDIA_PLUGIN_NAME = "rtui-nvidia-device-plugin"
EFA_PLUGIN_NAME = "rtui-efa-device-plugin"
KUBERAY_NAMESPACE = "rtui-kuberay"
KUBERAY_NAME = "kuberay-operator"
_COMPONENT_LABEL, _OPERATOR_COMPONENT = "app.kubernetes.io/component", "kuberay-operator"  # KubeRay's manifests
# Cluster-scoped: prefixed so a user's own Helm release "kuberay-operator" keeps its ClusterRole.
KUBERAY_CLUSTER_ROLE = "rtui-kuberay-operator"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"

# The EFA-capable instance types with accelerators, from the chart's supportedInstanceLabels list
# (itself from https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types).
# Only accelerated ones: rtui's workers are the only pods asking for EFA, and they run on GPUs.
# The run's own gpu_node_type is always added, so a type newer than this list is still covered.
EFA_GPU_INSTANCE_TYPES: tuple[str, ...] = (
    "g4dn.8xlarge", "g4dn.12xlarge", "g4dn.16xlarge", "g4dn.metal",
    "g5.8xlarge", "g5.12xlarge", "g5.16xlarge", "g5.24xlarge", "g5.48xlarge",
    "g6.8xlarge", "g6.12xlarge", "g6.16xlarge", "g6.24xlarge", "g6.48xlarge",
    "g6e.8xlarge", "g6e.12xlarge", "g6e.16xlarge", "g6e.24xlarge", "g6e.48xlarge",
    "g7.8xlarge", "g7.12xlarge", "g7.24xlarge", "g7.48xlarge",
    "g7e.8xlarge", "g7e.12xlarge", "g7e.24xlarge", "g7e.48xlarge", "gr6.8xlarge",
    "p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.4xlarge", "p5.48xlarge", "p5e.48xlarge",
    "p5en.48xlarge", "p6-b200.48xlarge", "p6-b300.48xlarge", "p6e-gb200.36xlarge", "p6e-gb300.36xlarge",
)

# KubeRay v1.7.0's ClusterRole (ray-operator/config/rbac/role.yaml), as (apiGroups, resources, verbs).
_ALL = ("create", "delete", "get", "list", "patch", "update", "watch")
_NO_PATCH = ("create", "delete", "get", "list", "update", "watch")
_KUBERAY_RULES: tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    (("",), ("persistentvolumeclaims", "pods/status", "services"), _ALL),
    (("",), ("pods",), ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")),
    (("",), ("pods/proxy", "services/status"), ("get", "patch", "update")),
    (("",), ("pods/resize",), ("patch",)),
    (("",), ("secrets",), _NO_PATCH),
    (("",), ("serviceaccounts",), ("create", "delete", "get", "list", "watch")),
    (("",), ("services/proxy",), ("create", "get", "patch", "update")),
    (("batch",), ("jobs",), _ALL),
    (("cert-manager.io",), ("certificates",), ("create", "get", "list", "update", "watch")),
    (("cert-manager.io",), ("certificates/status",), ("get",)),
    (("cert-manager.io",), ("issuers",), ("create", "get", "list", "watch")),
    (("coordination.k8s.io",), ("leases",), ("create", "get", "list", "update")),
    (("discovery.k8s.io",), ("endpointslices",), ("get", "list", "watch")),
    (("events.k8s.io",), ("events",), ("create", "patch")),
    (("extensions", "networking.k8s.io"), ("ingresses",), _ALL),
    (("gateway.networking.k8s.io",), ("gateways", "httproutes"), _NO_PATCH),
    (("networking.k8s.io",), ("ingressclasses",), ("get", "list", "watch")),
    (("networking.k8s.io",), ("networkpolicies",), _NO_PATCH),
    (("ray.io",), ("rayclusters", "raycronjobs", "rayjobs", "rayservices"), _ALL),
    (("ray.io",), ("rayclusters/finalizers", "raycronjobs/finalizers", "rayjobs/finalizers",
                   "rayservices/finalizers"), ("update",)),
    (("ray.io",), ("rayclusters/status", "raycronjobs/status", "rayjobs/status", "rayservices/status"),
     ("get", "patch", "update")),
    (("rbac.authorization.k8s.io",), ("rolebindings",), ("create", "delete", "get", "list", "watch")),
    (("rbac.authorization.k8s.io",), ("roles",), _NO_PATCH),
    (("route.openshift.io",), ("routes",), _ALL),
)
# helm-chart/kuberay-operator/templates/leader_election_role.yaml (v1.7.0).
_LEADER_RULES = (
    (("",), ("configmaps",), ("get", "list", "watch", "create", "update", "patch", "delete")),
    (("",), ("events",), ("create",)),
    (("coordination.k8s.io",), ("leases",), ("create", "get", "list", "update")),
)
# Tolerations the DaemonSet controller adds to every pod it makes (pkg/controller/daemon/util):
# a plugin on a node under pressure or cordoned still runs.
_DAEMONSET_AUTO_TOLERATIONS = tuple(
    {"key": f"node.kubernetes.io/{key}", "operator": "Exists", "effect": effect} for key, effect in (
        ("not-ready", "NoExecute"), ("unreachable", "NoExecute"), ("disk-pressure", "NoSchedule"),
        ("memory-pressure", "NoSchedule"), ("pid-pressure", "NoSchedule"), ("unschedulable", "NoSchedule")))


def _metadata(name: str, run_id: str, namespace: str | None = None) -> Manifest:
    meta: Manifest = {"name": name, "labels": {**labels(run_id), NAME_LABEL: name},
                      "annotations": {INSTALLED_BY: run_id}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.removeprefix("v").split("-", 1)[0].split("."))
    except ValueError:
        raise UserError(f"version {text!r} is not a release number such as 1.7.0",
                        remedy="set it to the version of the upstream release, without a leading 'v'") from None


def _tag(version: str) -> str:
    _version(version)
    return "v" + version.removeprefix("v")


def _daemonset(name: str, run_id: str, pod_spec: Manifest) -> Manifest:
    # The selector is immutable: only the name in it, so a later run can update the spec in place.
    selector = {NAME_LABEL: name}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": _metadata(name, run_id, SYSTEM_NAMESPACE),
        "spec": {
            "selector": {"matchLabels": selector},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {"metadata": {"labels": {**labels(run_id), **selector}}, "spec": pod_spec},
        },
    }


# The add-on images' upstream registries; ``addon_registry`` replaces them (a mirror keeps the paths).
NVIDIA_PLUGIN_IMAGE = ("nvcr.io", "nvidia/k8s-device-plugin")
EFA_PLUGIN_IMAGE = ("public.ecr.aws", "eks/aws-efa-k8s-device-plugin")
OPERATOR_IMAGE = ("quay.io", "kuberay/operator")


def addon_image(config: KubeConfig, upstream: tuple[str, str], version: str, digest: str | None = None) -> str:
    """``registry/path:vX.Y.Z``, from the mirror when one is set, and ``@digest`` when one is known."""
    registry, path = upstream
    image = f"{config.addon_registry or registry}/{path}:{_tag(version)}"
    return f"{image}@{digest}" if digest else image


def addon_images(config: KubeConfig) -> dict[str, str]:
    """{"nvidia" | "efa" | "operator": image by tag} of the add-ons this run installs."""
    images = {"nvidia": addon_image(config, NVIDIA_PLUGIN_IMAGE, config.nvidia_device_plugin_version)}
    if config.wants_efa():
        images["efa"] = addon_image(config, EFA_PLUGIN_IMAGE, config.efa_device_plugin_version)
    images["operator"] = addon_image(config, OPERATOR_IMAGE, config.kuberay_version)
    return images


def nvidia_device_plugin(config: KubeConfig, run_id: str, digest: str | None = None) -> list[Manifest]:
    """NVIDIA's device plugin, on GPU nodes only: it makes ``nvidia.com/gpu`` allocatable.

    Which nodes: the chart's three labels (any one), NFD's PCI vendor 10de, NFD's Tegra CPU vendor,
    or ``nvidia.com/gpu.present=true`` (rtui's nodegroup sets it), and also the run's GPU instance
    type, which every EKS node carries. A cluster with none of these (no NFD, unlabelled nodes)
    gets no plugin pod: its GPU nodes need ``kubectl label node NAME nvidia.com/gpu.present=true``,
    and allocatable_problems says so. (The workers themselves select no label: their GPU request
    places them.) Running on every node instead (the static manifest)
    would put a pod that finds no GPU on every CPU node.
    """
    terms = [{"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]} for key, value in (
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("feature.node.kubernetes.io/cpu-model.vendor_id", "NVIDIA"),
        (GPU_NODE_LABEL, "true"),
        (INSTANCE_TYPE_LABEL, config.gpu_node_type),
    )]
    spec: Manifest = {
        "priorityClassName": "system-node-critical",
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
        "containers": [{
            "name": "nvidia-device-plugin-ctr",
            "image": addon_image(config, NVIDIA_PLUGIN_IMAGE, config.nvidia_device_plugin_version, digest),
            # It only talks to the kubelet over a socket in the mounted dir: no privileges needed.
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "device-plugins", "mountPath": DEVICE_PLUGIN_DIR}],
        }],
        "volumes": [{"name": "device-plugins", "hostPath": {"path": DEVICE_PLUGIN_DIR, "type": "Directory"}}],
    }
    return [_daemonset(NVIDIA_PLUGIN_NAME, run_id, spec)]


def efa_device_plugin(config: KubeConfig, run_id: str, digest: str | None = None) -> list[Manifest]:
    """AWS's EFA device plugin on EFA-capable GPU instance types: it makes ``vpc.amazonaws.com/efa`` allocatable.

    Placed like the chart (node affinity on the instance-type label, never on EKS Auto Mode nodes,
    which bring their own), but with the accelerated types only plus the run's ``gpu_node_type``.
    The image comes from ECR Public (the chart's default is a regional private ECR that needs the
    node role's cross-account pull and is missing in some regions); the tag scheme is the same.
    """
    version = _version(config.efa_device_plugin_version)
    types = list(dict.fromkeys((*EFA_GPU_INSTANCE_TYPES, config.gpu_node_type)))
    mounts = [{"name": "device-plugins", "mountPath": DEVICE_PLUGIN_DIR},
              {"name": "infiniband", "mountPath": "/dev/infiniband/"}]
    volumes: list[Manifest] = [{"name": "device-plugins", "hostPath": {"path": DEVICE_PLUGIN_DIR}},
                               {"name": "infiniband", "hostPath": {"path": "/dev/infiniband/"}}]
    security: Manifest = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": False}
    if version >= (0, 5, 9):
        # From v0.5.9 the plugin also reads Neuron devices' tools, and the chart runs it privileged as root.
        security = {"allowPrivilegeEscalation": True, "privileged": True, "runAsNonRoot": False, "runAsUser": 0}
        mounts.append({"name": "neuron-tools", "mountPath": "/opt/aws/neuron/"})
        volumes.append({"name": "neuron-tools", "hostPath": {"path": "/opt/aws/neuron/", "type": "DirectoryOrCreate"}})
    spec: Manifest = {
        "priorityClassName": "system-node-critical",
        "hostNetwork": True,  # it finds the EFA interfaces in the host's network namespace
        "automountServiceAccountToken": False,
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "aws.amazon.com/efa", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": types},
                                  {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["auto"]}]},
        ]}}},
        "containers": [{
            "name": "aws-efa-k8s-device-plugin",
            "image": addon_image(config, EFA_PLUGIN_IMAGE, config.efa_device_plugin_version, digest),
            "securityContext": security,
            "resources": {"requests": {"cpu": "10m", "memory": "20Mi"}},
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    }
    return [_daemonset(EFA_PLUGIN_NAME, run_id, spec)]


def _rules(rules: tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...]) -> list[Manifest]:
    return [{"apiGroups": list(g), "resources": list(r), "verbs": list(v)} for g, r, v in rules]


def kuberay_operator(config: KubeConfig, run_id: str, crds: list[Manifest],
                     digest: str | None = None) -> list[Manifest]:
    """KubeRay's CRDs and operator as the ``kuberay-operator`` chart installs them, in ``rtui-kuberay``.

    The chart's defaults, minus its metrics Service (nothing scrapes it) and feature-gate flags
    (v1.7.0's defaults are the chart's values; naming gates an older operator lacks would stop it).
    The operator stays off the GPU nodes, like the Ray head.
    """
    tag = _tag(config.kuberay_version)
    ns = KUBERAY_NAMESPACE
    leader = f"{KUBERAY_NAME}-leader-election"
    owned_crds = []
    for crd in crds:
        # A new metadata dict, the 1 MB schema shared: the caller's CRDs stay as loaded.
        meta = dict(crd.get("metadata") or {})
        meta["labels"] = {**(meta.get("labels") or {}), **labels(run_id)}
        meta["annotations"] = {**(meta.get("annotations") or {}), INSTALLED_BY: run_id}
        owned_crds.append({**crd, "metadata": meta})
    account = {"kind": "ServiceAccount", "name": KUBERAY_NAME, "namespace": ns}
    selector = {NAME_LABEL: KUBERAY_NAME, "app.kubernetes.io/instance": "rtui"}
    resources = {"cpu": "100m", "memory": "512Mi"}  # the chart's limits; requests equal them
    probe = {"httpGet": {"path": "/metrics", "port": "http"},
             "initialDelaySeconds": 10, "periodSeconds": 5, "failureThreshold": 5}
    off_gpu_nodes = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": GPU_NODE_LABEL, "operator": "NotIn", "values": ["true"]}]}]}
    deployment_meta = _metadata(KUBERAY_NAME, run_id, ns)
    deployment_meta["labels"]["app.kubernetes.io/version"] = tag
    args = ["--enable-leader-election=true"]
    if config.operator_scope == "namespace":
        # The chart's singleNamespaceInstall with watchNamespace = the run's namespace (v1.7.0
        # templates multiple_namespaces_role(binding).yaml, deployment.yaml): the same rules in a Role
        # there, bound to the operator's account, and the operator told to watch only that namespace.
        args += ["--watch-namespace", config.namespace]
        access = [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": _metadata(KUBERAY_CLUSTER_ROLE, run_id, config.namespace), "rules": _rules(_KUBERAY_RULES)},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": _metadata(KUBERAY_CLUSTER_ROLE, run_id, config.namespace),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": KUBERAY_CLUSTER_ROLE},
             "subjects": [account]}]
    else:
        access = [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": _metadata(KUBERAY_CLUSTER_ROLE, run_id), "rules": _rules(_KUBERAY_RULES)},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": _metadata(KUBERAY_CLUSTER_ROLE, run_id),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": KUBERAY_CLUSTER_ROLE},
             "subjects": [account]}]
    return [
        *owned_crds,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _metadata(ns, run_id)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(KUBERAY_NAME, run_id, ns)},
        *access,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": _metadata(leader, run_id, ns), "rules": _rules(_LEADER_RULES)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _metadata(leader, run_id, ns),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": leader},
         "subjects": [account]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": deployment_meta, "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two operators reconciling the same RayCluster
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**labels(run_id), **selector, "app.kubernetes.io/component": KUBERAY_NAME}},
                "spec": {
                    "serviceAccountName": KUBERAY_NAME,
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": off_gpu_nodes}},
                    "containers": [{
                        "name": KUBERAY_NAME,
                        "image": addon_image(config, OPERATOR_IMAGE, config.kuberay_version, digest),
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["/manager"],
                        "args": args,
                        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                        "livenessProbe": copy.deepcopy(probe),
                        "readinessProbe": copy.deepcopy(probe),
                        "resources": {"requests": dict(resources), "limits": dict(resources)},
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                    }],
                },
            },
        }},
    ]


# ----- KubeRay's CRDs: versioned, about 1 MB each, not shipped with rtui -----

KUBERAY_CRDS_ENV = "RTUI_KUBERAY_CRDS"
KUBERAY_CRD_URL = "https://raw.githubusercontent.com/ray-project/kuberay/v{version}/ray-operator/config/crd/bases/"
# The operator (v1.7.0 main.go) starts the RayCluster, RayJob and RayService controllers whatever
# its feature gates say, and exits when one of their CRDs is missing. RayCronJob's is optional.
KUBERAY_CRD_FILES = ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")
REQUIRED_CRD_KINDS = frozenset({"RayCluster", "RayJob", "RayService"})
_CRD_MAX_BYTES = 16 << 20  # the largest (rayjobs) is 1.4 MB in v1.7.0
_OFFLINE = f"for an offline cluster set {KUBERAY_CRDS_ENV} to a directory holding KubeRay's ray.io_*.yaml CRDs"
# The sha256 of each CRD file as the release tag holds it (the bytes raw.githubusercontent.com serves:
# ``git show v1.7.0:ray-operator/config/crd/bases/<file> | sha256sum`` in ray-project/kuberay). A tag
# can be moved and a mirror or a cache can serve anything: only these bytes are applied.
KUBERAY_CRD_SHA256: dict[str, dict[str, str]] = {
    "1.7.0": {
        "ray.io_rayclusters.yaml": "c44704442eef0c6721ad40c1d66782c8bd3fdab9d3344306a5820910a679baa1",
        "ray.io_rayjobs.yaml": "01a5cf3b17c1769fda44af7e82debcd98722f0c27b9ab84d084681c6649121f5",
        "ray.io_rayservices.yaml": "0a8fc325e6e22b9231c1f282b309555e2ecf94227ca20a03df3d1d9a403907ab",
        "ray.io_raycronjobs.yaml": "31c2c753bba01f7e8e89cb8e8c504131b58ee42090ca536d87f5ac27605a568e",
    },
    "1.6.2": {
        "ray.io_rayclusters.yaml": "1d51d8c4ce065b22c2069af0ebd72ae25f4a6968e5c5f93a3106ba6fc35bcc1d",
        "ray.io_rayjobs.yaml": "ecae45d9a5dc1be68f1074ba784c495ef9d439d295253b61e1bd51f7b08522f5",
        "ray.io_rayservices.yaml": "95c639acc20ecc3cfa425d5ad0f8a7c152a336bc16d2e0deec17b62005e67fda",
        "ray.io_raycronjobs.yaml": "6d0ae6c24a2b2a6c0796c6775cd72f3e894831ff3b89379613e93c4d55965cd5",
    },
}
# CRD files the user vouches for beyond the shipped ones (a patched build, a release newer than rtui):
# ``sha256sum`` lines in rtui's own config dir, never in the working directory.
TRUSTED_CRDS_FILE = "kuberay-crds.sha256"


def trusted_crd_hashes(config_dir: Path) -> frozenset[str]:
    """The sha256 sums listed in ``config_dir/kuberay-crds.sha256`` (none when there is no such file)."""
    try:
        text = (config_dir / TRUSTED_CRDS_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return frozenset()
    return frozenset(w[0].lower() for w in (line.split() for line in text.splitlines())
                     if w and len(w[0]) == 64 and all(c in "0123456789abcdefABCDEF" for c in w[0]))


def _verify(body: bytes, name: str, version: str, trusted: frozenset[str], where: str) -> None:
    """Refuse bytes that are not the KubeRay ``version`` release's ``name`` (nor vouched for by the user)."""
    found = hashlib.sha256(body).hexdigest()
    release = KUBERAY_CRD_SHA256.get(version.removeprefix("v"), {})
    if found == release.get(name) or found in trusted:
        return
    vouch = f"or, to use your own, add `{found}  {name}` to {TRUSTED_CRDS_FILE} in rtui's config dir"
    if not release:
        raise UserError(f"rtui ships no sha256 of KubeRay {version}'s CRDs, so {where} cannot be verified",
                        remedy=f"use --kuberay-version {' or '.join(sorted(KUBERAY_CRD_SHA256))}, {vouch}")
    expected = release.get(name)
    detail = f"is not a file of KubeRay {version}" if expected is None else \
        f"has sha256 {found[:16]}…, not KubeRay {version}'s {expected[:16]}…"
    raise UserError(f"{where} {detail}: refused",
                    remedy=f"check --kuberay-crds (a mirror, a moved tag or a cache served other bytes), {vouch}")


def _refuse_conversion_webhook(crd: Manifest, where: str) -> None:
    """A CRD whose conversion strategy is Webhook makes the API server send every object of its kinds
    (ray.io: each RayCluster, its pod specs and env) to that webhook (apiextensions.k8s.io/v1
    ``CustomResourceConversion``). KubeRay's CRDs have none: one that does is refused."""
    conversion = (crd.get("spec") or {}).get("conversion") or {}
    if not isinstance(conversion, dict):
        return
    legacy = conversion.get("webhookClientConfig")  # apiextensions.k8s.io/v1beta1's place for it
    if conversion.get("strategy", "None") != "None" or conversion.get("webhook") or legacy:
        client = (conversion.get("webhook") or {}).get("clientConfig") or legacy or {}
        target = client.get("url") or "/".join(str((client.get("service") or {}).get(k, "?"))
                                                for k in ("namespace", "name"))
        raise UserError(f"{where} converts objects through a webhook ({target}): refused, the API server would send "
                        "every ray.io object there", remedy=f"use KubeRay's own CRDs; {_OFFLINE}")


# CRDs this process has parsed and checked, by the sha256 of their text, as JSON: a megabyte of YAML takes
# 0.25-0.4 s to parse even with libyaml (its constructor is Python), reading it back from JSON ~10 ms.
# Each caller gets its own copy to change. Only this process's own parses are kept: nothing on disk.
_PARSED: dict[str, str] = {}
_PARSED_LOCK = threading.Lock()


def _parse_crd(text: str, where: str) -> Manifest:
    key = hashlib.sha256(text.encode()).hexdigest()
    with _PARSED_LOCK:
        parsed = _PARSED.get(key)
    if parsed is not None:
        crd: Manifest = json.loads(parsed)
        return crd
    crd = _parse_crd_text(text, where)
    try:
        as_json = json.dumps(crd)
    except TypeError:  # a YAML timestamp or binary value has no JSON form: such a text is parsed each time
        return crd
    if json.loads(as_json) != crd:  # e.g. a YAML integer key, which JSON makes a string: parsed each time
        return crd
    with _PARSED_LOCK:
        _PARSED[key] = as_json
    return crd


def _parse_crd_text(text: str, where: str) -> Manifest:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # 10x faster on a megabyte of YAML
    try:
        docs = [d for d in yaml.load_all(text, Loader=loader) if d is not None]
    except yaml.YAMLError as exc:
        raise UserError(f"{where} is not YAML: {str(exc).splitlines()[0]}", remedy=_OFFLINE) from None
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise UserError(f"{where} holds {len(docs)} YAML documents, expected one CRD", remedy=_OFFLINE)
    crd: Manifest = docs[0]
    if crd.get("kind") != "CustomResourceDefinition" or crd.get("apiVersion") != "apiextensions.k8s.io/v1":
        raise UserError(f"{where} is a {crd.get('kind')!r} ({crd.get('apiVersion')}), not an apiextensions.k8s.io/v1 "
                        "CustomResourceDefinition", remedy=_OFFLINE)
    if (crd.get("spec") or {}).get("group") != "ray.io":
        raise UserError(f"{where} defines group {(crd.get('spec') or {}).get('group')!r}, not ray.io", remedy=_OFFLINE)
    _refuse_conversion_webhook(crd, where)
    return crd


def _check_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        return
    # Plain HTTP only from this machine (a test server, a local mirror): CRDs are cluster-wide objects.
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme != "http" or not loopback:
        raise UserError(f"KubeRay CRD source {url!r} is not an https:// URL or a directory", remedy=_OFFLINE)


def _download(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (scheme checked)
            body: bytes = response.read(_CRD_MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise UserError(f"no KubeRay CRD at {url} (HTTP 404)",
                            remedy=f"check --kuberay-version; {_OFFLINE}") from None
        raise OperationError(f"downloading {url} failed: HTTP {exc.code} {exc.reason}", remedy=_OFFLINE) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise OperationError(f"cannot download {url}: {reason}", remedy=_OFFLINE) from None
    if len(body) > _CRD_MAX_BYTES:
        raise OperationError(f"{url} is larger than {_CRD_MAX_BYTES >> 20} MB: not a KubeRay CRD", remedy=_OFFLINE)
    return body


def _decode(body: bytes, where: str) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{where} is not UTF-8 text", remedy=_OFFLINE) from None


def _fetch_cached(url: str, cache: Path | None, timeout: float, version: str, trusted: frozenset[str]) -> Manifest:
    name = url.rsplit("/", 1)[-1]
    if cache is not None and cache.is_file():
        try:
            body = cache.read_bytes()
            _verify(body, name, version, trusted, str(cache))
            return _parse_crd(_decode(body, str(cache)), str(cache))
        except (UserError, OSError):
            pass  # torn, stale or tampered with: downloaded again, and checked again
    body = _download(url, timeout)
    _verify(body, name, version, trusted, url)
    crd = _parse_crd(_decode(body, url), url)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_name(f".{cache.name}.{os.getpid()}")
        partial.write_bytes(body)
        os.replace(partial, cache)  # never a half-written file under the final name
    return crd


def load_kuberay_crds(source: str, version: str, *, cache_dir: Path | None = None,
                      timeout: float = 30.0, trusted: frozenset[str] | None = None) -> list[Manifest]:
    """KubeRay's CRDs, RayCluster first: from a directory of ``ray.io_*.yaml`` files, or downloaded
    from an http(s) URL prefix (``""``: the release ``v{version}`` on GitHub) and cached under
    ``cache_dir/kuberay-crds/`` by URL.

    Every file, downloaded, cached or in the directory, must hash to the sha256 rtui ships for that
    file of KubeRay ``version`` (``KUBERAY_CRD_SHA256``), or to one the user vouched for in rtui's
    config dir (``trusted``; None: read from there); a cache entry that does not is downloaded again.
    Each must be a ray.io CustomResourceDefinition without a conversion webhook, and RayCluster,
    RayJob and RayService must be there.
    """
    _tag(version)
    if trusted is None:
        trusted = trusted_crd_hashes(config_dir())
    crds: list[Manifest] = []
    if source == "" or source.startswith(("http://", "https://")):
        prefix = source or KUBERAY_CRD_URL.format(version=version.removeprefix("v"))
        prefix = prefix if prefix.endswith("/") else prefix + "/"
        _check_url(prefix)
        folder = None if cache_dir is None else (
            cache_dir / "kuberay-crds" / hashlib.sha256(prefix.encode()).hexdigest()[:16])
        for file in KUBERAY_CRD_FILES:
            crds.append(_fetch_cached(prefix + file, None if folder is None else folder / file, timeout,
                                      version, trusted))
    else:
        directory = Path(source).expanduser()
        if not directory.is_dir():
            raise UserError(f"KubeRay CRD directory {source!r} does not exist or is not a directory", remedy=_OFFLINE)
        files = sorted(directory.glob("ray.io_*.yaml"))
        if not files:
            raise UserError(f"no ray.io_*.yaml files in {directory}", remedy=_OFFLINE)
        for path in files:
            try:
                body = path.read_bytes()
            except OSError as exc:
                raise UserError(f"cannot read {path}: {exc}", remedy=_OFFLINE) from None
            _verify(body, path.name, version, trusted, str(path))
            crds.append(_parse_crd(_decode(body, str(path)), str(path)))
    kinds = {crd["spec"].get("names", {}).get("kind") for crd in crds}
    missing = sorted(REQUIRED_CRD_KINDS - kinds)
    if missing:
        raise UserError(f"KubeRay's CRDs from {source or 'GitHub'} lack {', '.join(missing)} "
                        f"(the operator stops without them)", remedy=_OFFLINE)
    crds.sort(key=lambda c: (c["spec"]["names"]["kind"] != "RayCluster", c["spec"]["names"]["kind"]))
    return crds


# ----- detection: adopt what the cluster already runs -----

def image_repository(image: str) -> tuple[str, ...]:
    """The path of an image's repository without registry host, tag or digest:
    ``nvcr.io/nvidia/k8s-device-plugin:v0.18.0`` -> ``("nvidia", "k8s-device-plugin")``."""
    name = image.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    return tuple(parts)


def _provides(kind: Literal["nvidia", "efa"], image: str) -> bool:
    repo = image_repository(image)
    if kind == "efa":
        return repo[-1:] == ("aws-efa-k8s-device-plugin",)
    # AMD's is rocm/k8s-device-plugin: NVIDIA's must have "nvidia" in its path (a mirror such as an
    # ECR pull-through cache adds components before it, never drops it).
    return repo[-1:] == ("k8s-device-plugin",) and "nvidia" in repo[:-1]


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    # Init containers only validate or wait (the GPU Operator's): the plugin is a main container.
    containers: list[dict[str, Any]] = obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
    return containers


def _ours(obj: dict[str, Any]) -> bool:
    return bool((obj.get("metadata", {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY)


def _pick(found: list[dict[str, Any]]) -> dict[str, Any] | None:
    # Someone else's install first: it is the one the cluster's owner maintains.
    found = [o for o in found if not o.get("metadata", {}).get("deletionTimestamp")]
    found.sort(key=lambda o: (_ours(o), o["metadata"].get("namespace", ""), o["metadata"].get("name", "")))
    return found[0] if found else None


def find_device_plugin(kind: Literal["nvidia", "efa"], daemonsets: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The DaemonSet (any namespace) that already provides the NVIDIA or EFA device plugin, or None.

    Decided by the main containers' image repository, not by object names: the Helm chart's
    ``nvidia-device-plugin``, the GPU Operator's ``nvidia-device-plugin-daemonset``, the EKS charts'
    ``aws-efa-k8s-device-plugin-daemonset`` and a renamed copy all run the same image, while a DS
    named "nvidia-something" may run anything. One another rtui run installed counts too (it is
    adopted, not installed twice); one being deleted does not.
    """
    return _pick([ds for ds in daemonsets if any(_provides(kind, c.get("image", "")) for c in _containers(ds))])


def watched_namespaces(deployment: dict[str, Any]) -> list[str] | None:
    """The namespaces a KubeRay operator Deployment watches (its ``--watch-namespace``), None: all."""
    for container in _containers(deployment):
        words = [*(container.get("command") or []), *(container.get("args") or [])]
        for i, word in enumerate(words):
            value = words[i + 1] if word == "--watch-namespace" and i + 1 < len(words) else \
                word.split("=", 1)[1] if word.startswith("--watch-namespace=") else None
            if value is not None:
                return [n for n in value.split(",") if n]
    return None


def find_kuberay_operator(deployments: list[dict[str, Any]], crds: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Deployment of a KubeRay operator already in the cluster (``is_kuberay_operator``, any namespace),
    or None when rtui should install one.

    Raises UserError when one runs but the RayCluster CRD is missing or does not serve ``ray.io/v1``:
    installing a second operator beside it would have two controllers reconcile every RayCluster.
    """
    found = _pick([d for d in deployments if is_kuberay_operator(d)])
    if found is None:
        return None
    where = f"{found['metadata'].get('namespace', '')}/{found['metadata'].get('name', '')}"
    crd = next((c for c in crds if c.get("metadata", {}).get("name") == "rayclusters.ray.io"), None)
    if crd is None:
        raise UserError(f"a KubeRay operator runs ({where}) but the CRD rayclusters.ray.io is missing",
                        remedy="reinstall KubeRay with its CRDs, or remove that operator so rtui installs its own")
    if not any(v.get("name") == "v1" and v.get("served") for v in crd.get("spec", {}).get("versions") or []):
        raise UserError(f"the KubeRay operator {where} is too old: its RayCluster CRD does not serve ray.io/v1",
                        remedy="upgrade KubeRay to 1.0 or later")
    return found


def kuberay_operators(deployments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every Deployment that runs a KubeRay operator (``is_kuberay_operator``), not being deleted."""
    return [d for d in deployments if not d.get("metadata", {}).get("deletionTimestamp") and is_kuberay_operator(d)]


def is_kuberay_operator(deployment: dict[str, Any]) -> bool:
    """Whether a Deployment runs KubeRay's operator, known by what KubeRay's own manifests put on it: the image
    ``kuberay/operator`` on any registry, else (a mirrored or renamed image) the component label both its Helm
    chart (v1.7.0 ``helm-chart/kuberay-operator/templates/deployment.yaml``) and its kustomize manifest
    (``ray-operator/config/manager/manager.yaml``) set, or their container ``kuberay-operator`` running
    ``/manager``. The container's name alone is not enough: any chart may name a container so."""
    meta_labels = deployment.get("metadata", {}).get("labels") or {}
    pod_labels = deployment.get("spec", {}).get("template", {}).get("metadata", {}).get("labels") or {}
    if _OPERATOR_COMPONENT in (meta_labels.get(_COMPONENT_LABEL), pod_labels.get(_COMPONENT_LABEL)):
        return True
    return any(image_repository(c.get("image", ""))[-2:] == ("kuberay", "operator")
               or (c.get("name") == KUBERAY_NAME and (c.get("command") or [""])[0] == "/manager")
               for c in _containers(deployment))


def pods_requesting(resource: str, pods: list[dict[str, Any]]) -> list[str]:
    """``team-b/infer`` for each pod not made by rtui, not finished, that requests ``resource`` (a device a
    plugin advertises): the kubelet admits it only while that plugin runs on its node."""
    out = []
    for pod in pods:
        if _ours(pod) or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        spec = pod.get("spec") or {}
        resources = [c.get("resources") or {} for c in [*(spec.get("containers") or []),
                                                        *(spec.get("initContainers") or [])]]
        wants = [{**(r.get("limits") or {}), **(r.get("requests") or {})} for r in resources]
        if any(str(w.get(resource, "0")) not in ("0", "") for w in wants):
            out.append(f"{pod['metadata'].get('namespace')}/{pod['metadata'].get('name')}")
    return out


# ----- readiness -----

def daemonset_blocked(ds: dict[str, Any], gpu_nodes: list[dict[str, Any]]) -> str | None:
    """Why the DaemonSet will never place a pod on one of the GPU nodes (labels, taints), or None.

    Waiting does not fix this: the node or the DaemonSet must change.
    """
    meta = ds.get("metadata", {})
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    spec = copy.deepcopy(ds.get("spec", {}).get("template", {}).get("spec") or {})
    spec["tolerations"] = [*(spec.get("tolerations") or []), *_DAEMONSET_AUTO_TOLERATIONS]
    for node in gpu_nodes:
        reason = unschedulable_reason(spec, node)
        if reason:
            return f"{name} will not run on GPU node {node.get('metadata', {}).get('name')}: {reason}"
    return None


def daemonset_ready(ds: dict[str, Any], gpu_nodes: list[dict[str, Any]]) -> tuple[bool, str]:
    """Whether the plugin is ready on every GPU node, and what it waits for.

    The status counts are the controller's over the nodes it placed a pod on; they speak of the
    current spec only once ``observedGeneration`` caught up with ``generation``. Ready when it
    places a pod on every GPU node (checked from the nodes' labels and taints, so an adopted DS
    whose selector misses our nodes is named, not waited on), ``numberReady`` reaches
    ``desiredNumberScheduled`` and, with RollingUpdate, every pod runs the latest template
    (``updatedNumberScheduled``; with OnDelete old pods are meant to stay and still serve).
    """
    meta, status = ds.get("metadata", {}), ds.get("status") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    if not gpu_nodes:
        return False, f"{name}: no GPU nodes to run on yet"
    if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
        return False, f"{name}: the DaemonSet controller has not seen its latest spec yet"
    blocked = daemonset_blocked(ds, gpu_nodes)
    if blocked:
        return False, blocked
    desired, ready = int(status.get("desiredNumberScheduled") or 0), int(status.get("numberReady") or 0)
    updated = int(status.get("updatedNumberScheduled") or 0)
    if desired < len(gpu_nodes):
        return False, f"{name}: scheduled on {desired} nodes, the cluster has {len(gpu_nodes)} GPU nodes"
    if ready < desired:
        return False, f"{name}: {ready} of {desired} pods ready"
    rolling = (ds.get("spec", {}).get("updateStrategy") or {}).get("type", "RollingUpdate") == "RollingUpdate"
    if rolling and updated < desired:
        return False, f"{name}: rolling out, {updated} of {desired} pods run the latest spec"
    return True, f"{name}: ready on {ready} nodes"


def deployment_available(dep: dict[str, Any]) -> tuple[bool, str]:
    """Available (its minimum of ready pods) on the latest spec, and what it waits for otherwise."""
    meta, status = dep.get("metadata", {}), dep.get("status") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
        return False, f"{name}: the Deployment controller has not seen its latest spec yet"
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    progressing = conditions.get("Progressing") or {}
    if progressing.get("reason") == "ProgressDeadlineExceeded":
        return False, f"{name}: rollout stuck: {progressing.get('message', 'ProgressDeadlineExceeded')}"
    replicas = int(dep.get("spec", {}).get("replicas", 1))
    if int(status.get("updatedReplicas") or 0) < replicas:
        return False, f"{name}: rolling out, {status.get('updatedReplicas') or 0} of {replicas} pods on the latest spec"
    available = conditions.get("Available") or {}
    if available.get("status") != "True":
        return False, f"{name}: not available yet ({available.get('message') or 'no Available condition'})"
    return True, f"{name}: available"
