"""The add-ons rtui installs (device plugins, KubeRay), finding ones already installed, and their readiness."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient

from backend.errors import OperationError, UserError
from targets.aws.config import AwsConfig
from targets.kube import addons as a
from targets.kube.manifests import labels
from targets.kube.pods import unschedulable_reason
from tests.kube.crds import RAYSERVICE_CRD, SHARED, STANDIN_SHA256
from tests.kube.crds import crd_dir as _crd_dir
from tests.serving import serve_in_thread

RUN = "r20260101-120000-abcd"
CONFIG = AwsConfig(target="aws")


@pytest.fixture
def crd_dir(tmp_path: Path) -> Path:
    return _crd_dir(tmp_path)


@pytest.fixture(scope="module")
def crds(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    # Module-wide: parsing 2.3 MB of YAML takes seconds.
    return a.load_kuberay_crds(str(_crd_dir(tmp_path_factory.mktemp("shared"), vouch=False)), "1.7.0",
                               trusted=frozenset({STANDIN_SHA256}))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _serving(folder: Path) -> Iterator[str]:
    """A loopback HTTP server holding ``folder``: the URL path without the network."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    serve_in_thread(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def served(crd_dir: Path) -> Iterator[str]:
    with _serving(crd_dir) as url:
        yield url


# ----- CRDs -----

def test_the_shared_crds_load_as_ray_io_crds_raycluster_first(crds: list[dict[str, Any]]) -> None:
    kinds = [c["spec"]["names"]["kind"] for c in crds]
    assert kinds[0] == "RayCluster" and {"RayCluster", "RayJob", "RayService"} == set(kinds)
    for crd in crds:
        assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["group"] == "ray.io"
    (rc,) = [c for c in crds if c["spec"]["names"]["kind"] == "RayCluster"]
    assert any(v["name"] == "v1" and v["served"] and v["storage"] for v in rc["spec"]["versions"])


def test_a_crd_text_is_parsed_once_per_process_and_each_caller_gets_its_own_copy(
        crd_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs' cache dirs holding the same verified bytes: the second load is the first one's parse
    (libyaml takes ~0.65 s for KubeRay's 2.3 MB), and what one caller changes the next never sees."""
    other = tmp_path / "other"
    other.mkdir()
    for path in crd_dir.glob("ray.io_*.yaml"):
        (other / path.name).write_bytes(path.read_bytes())
    first = a.load_kuberay_crds(str(crd_dir), "1.7.0", trusted=frozenset({STANDIN_SHA256}))
    parses: list[str] = []
    real = a._parse_crd_text

    def counted(text: str, where: str) -> dict[str, Any]:
        parses.append(where)
        return real(text, where)

    monkeypatch.setattr(a, "_parse_crd_text", counted)
    first[0]["spec"]["names"]["kind"] = "Changed"
    again = a.load_kuberay_crds(str(other), "1.7.0", trusted=frozenset({STANDIN_SHA256}))
    assert parses == []
    assert again[0]["spec"]["names"]["kind"] == "RayCluster" and again[0] is not first[0]
    (other / "ray.io_rayclusters.yaml").write_text((other / "ray.io_rayclusters.yaml").read_text() + "\n")
    with pytest.raises(UserError):  # other bytes are another text: checked (and refused) anew
        a.load_kuberay_crds(str(other), "1.7.0", trusted=frozenset({STANDIN_SHA256}))


def test_crds_without_rayservice_are_refused_since_the_operator_would_exit() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"KubeRay's CRDs are not at {SHARED}")
    with pytest.raises(UserError, match="lack RayService") as err:
        a.load_kuberay_crds(str(SHARED), "1.7.0")
    assert a.KUBERAY_CRDS_ENV in str(err.value) and "\n" not in str(err.value)


def test_a_directory_with_something_else_than_a_ray_crd_is_refused(tmp_path: Path) -> None:
    # Even a file the user vouched for (its sha256 trusted) must be a ray.io CRD.
    def vouched() -> frozenset[str]:
        return frozenset({hashlib.sha256((tmp_path / "ray.io_rayclusters.yaml").read_bytes()).hexdigest()})

    (tmp_path / "ray.io_rayclusters.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(UserError, match="ConfigMap"):
        a.load_kuberay_crds(str(tmp_path), "1.7.0", trusted=vouched())
    (tmp_path / "ray.io_rayclusters.yaml").write_text(RAYSERVICE_CRD.replace("group: ray.io", "group: example.com"))
    with pytest.raises(UserError, match="example.com"):
        a.load_kuberay_crds(str(tmp_path), "1.7.0", trusted=vouched())
    with pytest.raises(UserError, match="does not exist"):
        a.load_kuberay_crds(str(tmp_path / "nope"), "1.7.0")


def test_crds_download_from_a_url_prefix_and_come_from_the_cache_after(crd_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with _serving(crd_dir) as url:
        first = a.load_kuberay_crds(url, "1.7.0", cache_dir=cache, timeout=10)
    assert [c["spec"]["names"]["kind"] for c in first] == ["RayCluster", "RayJob", "RayService"]
    assert sorted(p.name for p in cache.rglob("*.yaml")) == sorted(a.KUBERAY_CRD_FILES)
    # The server is gone: without the cache the load fails, with it the same CRDs come back.
    with pytest.raises(OperationError, match="cannot download"):
        a.load_kuberay_crds(url, "1.7.0", timeout=2)
    assert a.load_kuberay_crds(url, "1.7.0", cache_dir=cache) == first


def test_a_missing_crd_file_is_a_404_user_error(crd_dir: Path, served: str) -> None:
    (crd_dir / "ray.io_rayjobs.yaml").unlink()
    with pytest.raises(UserError, match=r"HTTP 404") as err:
        a.load_kuberay_crds(served, "1.7.0", timeout=10)
    assert "ray.io_rayjobs.yaml" in str(err.value) and "--kuberay-version" in str(err.value)


def test_the_default_source_is_the_release_tag_on_github() -> None:
    assert a.KUBERAY_CRD_URL.format(version="1.7.0") == (
        "https://raw.githubusercontent.com/ray-project/kuberay/v1.7.0/ray-operator/config/crd/bases/")


def test_plain_http_only_from_loopback_and_unreachable_hosts_are_operation_errors() -> None:
    with pytest.raises(UserError, match="not an https"):
        a.load_kuberay_crds("http://mirror.example.com/crds/", "1.7.0")
    with pytest.raises(UserError, match="release number"):
        a.load_kuberay_crds("", "latest")
    # A closed loopback port: refused at once, no network needed.
    with pytest.raises(OperationError, match="cannot download"):
        a.load_kuberay_crds("http://127.0.0.1:9/", "1.7.0", timeout=2)


# ----- manifests -----

def _roundtrip(obj: dict[str, Any]) -> dict[str, Any]:
    """The object through the kubernetes client's model: unknown or misspelt fields are dropped."""
    client = ApiClient()
    model = client.deserialize(json.dumps(obj), f"V1{obj['kind']}", "application/json")
    out: dict[str, Any] = client.sanitize_for_serialization(model)
    return out


def _operator(crds: list[dict[str, Any]], scope: str = "cluster") -> list[dict[str, Any]]:
    return a.kuberay_operator(CONFIG.model_copy(update={"operator_scope": scope}), RUN, crds)


def test_every_object_is_ours_and_names_the_run_that_installed_it(crds: list[dict[str, Any]]) -> None:
    objects = _operator(crds) + a.nvidia_device_plugin(CONFIG, RUN) + a.efa_device_plugin(CONFIG, RUN)
    for obj in objects:
        meta = obj["metadata"]
        assert labels(RUN).items() <= meta["labels"].items(), meta["name"]
        assert meta["annotations"][a.INSTALLED_BY] == RUN
    # The caller's CRDs are not changed by labelling the copies.
    assert all(a.INSTALLED_BY not in (c["metadata"].get("annotations") or {}) for c in crds)


def test_the_operator_objects_validate_against_the_client_models(crds: list[dict[str, Any]]) -> None:
    objects = _operator(crds)
    assert [o["kind"] for o in objects[:3]] == ["CustomResourceDefinition"] * 3
    kinds = [o["kind"] for o in objects[3:]]
    assert kinds == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                     "Deployment"]
    for obj in objects[3:] + a.nvidia_device_plugin(CONFIG, RUN) + a.efa_device_plugin(CONFIG, RUN):
        assert _roundtrip(obj) == obj, obj["kind"]


def _allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def test_the_cluster_role_covers_what_kuberay_reconciles(crds: list[dict[str, Any]]) -> None:
    (role,) = [o for o in _operator(crds) if o["kind"] == "ClusterRole"]
    rules = role["rules"]
    for group, resource, verb in [
        ("ray.io", "rayclusters", "watch"), ("ray.io", "rayclusters/status", "update"),
        ("ray.io", "rayclusters/finalizers", "update"), ("ray.io", "rayjobs", "patch"),
        ("", "pods", "create"), ("", "pods", "deletecollection"), ("", "services", "create"),
        ("", "serviceaccounts", "create"), ("events.k8s.io", "events", "create"),
        ("rbac.authorization.k8s.io", "roles", "create"), ("rbac.authorization.k8s.io", "rolebindings", "create"),
        ("batch", "jobs", "create"), ("coordination.k8s.io", "leases", "update"),
    ]:
        assert _allows(rules, group, resource, verb), (group, resource, verb)
    assert not _allows(rules, "", "nodes", "delete")
    (binding,) = [o for o in _operator(crds) if o["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == "rtui-kuberay-operator"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberay-operator", "namespace": "rtui-kuberay"}]


def _node(name: str, labels: dict[str, str], taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
            "spec": {"taints": taints or []}}


GPU_NODE = _node("ip-10-0-1-5.ec2.internal", {"nvidia.com/gpu.present": "true",
                                              "node.kubernetes.io/instance-type": "g6.12xlarge"},
                 [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}])
SYSTEM_NODE = _node("ip-10-0-0-7.ec2.internal", {"node.kubernetes.io/instance-type": "m7i.xlarge"})


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def test_the_operator_runs_on_the_system_node_and_never_on_a_gpu_node(crds: list[dict[str, Any]]) -> None:
    (dep,) = [o for o in _operator(crds) if o["kind"] == "Deployment"]
    spec = _pod_spec(dep)
    (c,) = spec["containers"]
    assert c["image"] == "quay.io/kuberay/operator:v1.7.0" and dep["spec"]["replicas"] == 1
    assert c["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "http"}
    assert c["resources"]["requests"] == c["resources"]["limits"]
    assert "tolerations" not in spec
    assert unschedulable_reason(spec, SYSTEM_NODE) is None
    untainted_gpu = _node("gpu", {"nvidia.com/gpu.present": "true"})
    assert unschedulable_reason(spec, untainted_gpu) == "its node affinity does not match the node's labels"


def test_the_nvidia_plugin_runs_on_gpu_nodes_labelled_or_not_but_not_on_cpu_nodes() -> None:
    (ds,) = a.nvidia_device_plugin(CONFIG.model_copy(update={"nvidia_device_plugin_version": "0.18.0"}), RUN)
    assert (ds["metadata"]["namespace"], ds["metadata"]["name"]) == ("kube-system", "rtui-nvidia-device-plugin")
    spec = _pod_spec(ds)
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["containers"][0]["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.18.0"
    assert spec["volumes"][0]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    assert unschedulable_reason(spec, GPU_NODE) is None
    # An EKS GPU node nobody labelled: its instance type still places the plugin.
    assert unschedulable_reason(spec, _node("g", {"node.kubernetes.io/instance-type": "g6.12xlarge"})) is None
    assert unschedulable_reason(spec, _node("nfd", {"feature.node.kubernetes.io/pci-10de.present": "true"})) is None
    assert unschedulable_reason(spec, SYSTEM_NODE) is not None


@pytest.mark.parametrize("instance", ["g6.12xlarge", "g6.8xlarge", "p4d.24xlarge", "p5.48xlarge", "g5.48xlarge"])
def test_the_efa_plugin_runs_on_efa_capable_gpu_types(instance: str) -> None:
    (ds,) = a.efa_device_plugin(CONFIG, RUN)
    node = _node("n", {"node.kubernetes.io/instance-type": instance},
                 [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}])
    assert unschedulable_reason(_pod_spec(ds), node) is None


def test_the_efa_plugin_keeps_off_other_nodes_and_follows_the_chart_of_its_version() -> None:
    (ds,) = a.efa_device_plugin(CONFIG, RUN)
    spec = _pod_spec(ds)
    (c,) = spec["containers"]
    assert c["image"] == "public.ecr.aws/eks/aws-efa-k8s-device-plugin:v0.5.6"
    assert {v["hostPath"]["path"] for v in spec["volumes"]} == {"/var/lib/kubelet/device-plugins", "/dev/infiniband/"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and spec["hostNetwork"] is True
    assert unschedulable_reason(spec, SYSTEM_NODE) is not None
    auto = _node("a", {"node.kubernetes.io/instance-type": "p5.48xlarge", "eks.amazonaws.com/compute-type": "auto"})
    assert unschedulable_reason(spec, auto) is not None
    odd = CONFIG.model_copy(update={"gpu_node_type": "g9.12xlarge", "efa_device_plugin_version": "0.5.20"})
    (newer,) = a.efa_device_plugin(odd, RUN)
    g9 = _node("n", {"node.kubernetes.io/instance-type": "g9.12xlarge"})
    assert unschedulable_reason(_pod_spec(newer), g9) is None
    assert _pod_spec(newer)["containers"][0]["securityContext"]["privileged"] is True


# ----- detection -----

def _ds(namespace: str, name: str, image: str, *, ours: bool = False, **meta: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"namespace": namespace, "name": name, "labels": labels("r-other") if ours else {},
                                **meta}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": metadata,
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}}


GPU_OPERATOR_DS = _ds("gpu-operator", "nvidia-device-plugin-daemonset", "nvcr.io/nvidia/k8s-device-plugin:v0.17.0")
GPU_OPERATOR_DS["spec"]["template"]["spec"]["initContainers"] = [
    {"name": "toolkit-validation", "image": "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.3.0"}]
HELM_DS = _ds("nvidia-device-plugin", "nvdp-nvidia-device-plugin", "nvcr.io/nvidia/k8s-device-plugin:v0.18.0")
LOOKALIKE = _ds("monitoring", "nvidia-dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04")
AMD = _ds("kube-system", "amdgpu-device-plugin-daemonset", "rocm/k8s-device-plugin:1.31.0.6")
EFA_DS = _ds("kube-system", "aws-efa-k8s-device-plugin-daemonset",
             "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.6")


def test_the_gpu_operators_and_the_charts_nvidia_plugins_are_found_by_image() -> None:
    assert a.find_device_plugin("nvidia", [LOOKALIKE, AMD, GPU_OPERATOR_DS]) is GPU_OPERATOR_DS
    assert a.find_device_plugin("nvidia", [LOOKALIKE, HELM_DS, EFA_DS]) is HELM_DS
    assert a.find_device_plugin("nvidia", [LOOKALIKE, AMD, EFA_DS]) is None
    assert a.find_device_plugin("efa", [HELM_DS, EFA_DS]) is EFA_DS
    assert a.find_device_plugin("efa", [HELM_DS, LOOKALIKE]) is None
    mirrored = _ds("kube-system", "gpu", "123456789012.dkr.ecr.us-east-1.amazonaws.com/nvcr/nvidia/k8s-device-plugin"
                   "@sha256:" + "ab" * 32)
    assert a.find_device_plugin("nvidia", [mirrored]) is mirrored


def test_a_plugin_another_run_installed_is_adopted_but_someone_elses_is_preferred() -> None:
    ours = _ds("kube-system", "rtui-nvidia-device-plugin", "nvcr.io/nvidia/k8s-device-plugin:v0.18.0", ours=True)
    assert a.find_device_plugin("nvidia", [ours]) is ours
    assert a.find_device_plugin("nvidia", [ours, HELM_DS]) is HELM_DS
    leaving = _ds("x", "y", "nvcr.io/nvidia/k8s-device-plugin:v0.18.0", deletionTimestamp="2026-01-01T00:00:00Z")
    assert a.find_device_plugin("nvidia", [leaving]) is None


def test_image_repository_drops_registry_tag_and_digest() -> None:
    assert a.image_repository("nvcr.io/nvidia/k8s-device-plugin:v0.18.0") == ("nvidia", "k8s-device-plugin")
    assert a.image_repository("localhost:5000/kuberay/operator@sha256:" + "0" * 64) == ("kuberay", "operator")
    assert a.image_repository("kuberay/operator") == ("kuberay", "operator")


def _deployment(image: str, namespace: str = "kuberay", name: str = "kuberay-operator") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"namespace": namespace, "name": name},
            "spec": {"template": {"spec": {"containers": [{"name": "kuberay-operator", "image": image}]}}}}


def test_an_installed_kuberay_operator_is_found_and_one_without_its_crd_refused(crds: list[dict[str, Any]]) -> None:
    helm = _deployment("quay.io/kuberay/operator:v1.4.2")
    other = _deployment("quay.io/prometheus/prometheus:v3.0.0", "monitoring", "prometheus")
    assert a.find_kuberay_operator([other, helm], crds) is helm
    assert a.find_kuberay_operator([other], crds) is None
    with pytest.raises(UserError, match="rayclusters.ray.io is missing"):
        a.find_kuberay_operator([helm], [])
    old = {"metadata": {"name": "rayclusters.ray.io"},
           "spec": {"versions": [{"name": "v1alpha1", "served": True, "storage": True}]}}
    with pytest.raises(UserError, match="too old"):
        a.find_kuberay_operator([helm], [old])


# ----- readiness -----

def _ds_status(generation: int = 2, observed: int = 2, desired: int = 2, ready: int = 2,
               updated: int = 2) -> dict[str, Any]:
    (ds,) = a.nvidia_device_plugin(CONFIG, RUN)
    ds["metadata"]["generation"] = generation
    ds["status"] = {"observedGeneration": observed, "desiredNumberScheduled": desired,
                    "currentNumberScheduled": desired,
                    "numberReady": ready, "numberAvailable": ready, "updatedNumberScheduled": updated,
                    "numberMisscheduled": 0}
    return ds


def test_daemonset_ready_needs_every_gpu_node_covered_ready_and_updated() -> None:
    gpus = [GPU_NODE, {**GPU_NODE, "metadata": {**GPU_NODE["metadata"], "name": "ip-10-0-1-6.ec2.internal"}}]
    assert a.daemonset_ready(_ds_status(), gpus)[0]
    assert a.daemonset_ready(_ds_status(ready=1), gpus) == (False, "kube-system/rtui-nvidia-device-plugin: "
                                                                    "1 of 2 pods ready")
    assert "latest spec yet" in a.daemonset_ready(_ds_status(generation=3), gpus)[1]
    assert "rolling out" in a.daemonset_ready(_ds_status(updated=1), gpus)[1]
    assert "scheduled on 1 nodes" in a.daemonset_ready(_ds_status(desired=1, ready=1, updated=1), gpus)[1]
    assert not a.daemonset_ready(_ds_status(), [])[0]
    tainted = _node("ip-10-0-1-9", {"nvidia.com/gpu.present": "true"},
                    [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}])
    ok, why = a.daemonset_ready(_ds_status(), [tainted])
    assert not ok and "ip-10-0-1-9" in why and "dedicated=training:NoSchedule" in why
    # Cordoned or not-ready nodes: the DaemonSet controller's own tolerations still place the plugin.
    cordoned = _node("c", {"nvidia.com/gpu.present": "true"},
                     [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])
    assert a.daemonset_ready(_ds_status(desired=1, ready=1, updated=1), [cordoned])[0]


def _dep_status(**status: Any) -> dict[str, Any]:
    dep = _deployment("quay.io/kuberay/operator:v1.7.0")
    dep["metadata"]["generation"] = 1
    dep["spec"]["replicas"] = 1
    dep["status"] = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
                     "availableReplicas": 1, "conditions": [
                         {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                          "message": "Deployment has minimum availability."},
                         {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                          "message": 'ReplicaSet "kuberay-operator-7d9f8b6c5" has successfully progressed.'}]}
    dep["status"].update(status)
    return dep


def test_deployment_available_needs_the_available_condition_on_the_latest_spec() -> None:
    assert a.deployment_available(_dep_status()) == (True, "kuberay/kuberay-operator: available")
    assert not a.deployment_available(_dep_status(observedGeneration=0))[0]
    unavailable = _dep_status(conditions=[{"type": "Available", "status": "False",
                                           "reason": "MinimumReplicasUnavailable",
                                           "message": "Deployment does not have minimum availability."}])
    assert a.deployment_available(unavailable) == (
        False, "kuberay/kuberay-operator: not available yet (Deployment does not have minimum availability.)")
    stuck = _dep_status(conditions=[{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                                     "message": 'ReplicaSet "kuberay-operator-7d9f8b6c5" has timed out progressing.'}])
    assert "timed out progressing" in a.deployment_available(stuck)[1]
    assert "rolling out" in a.deployment_available(_dep_status(updatedReplicas=0))[1]


# ----- issue 23 item 6: the CRDs applied are the release's, byte for byte, and send nothing out -----

WEBHOOK_CONVERSION = """\
  conversion:
    strategy: Webhook
    webhook:
      conversionReviewVersions: [v1]
      clientConfig:
        url: https://convert.example.net/ray
"""


def test_a_crd_with_a_conversion_webhook_is_refused_even_when_its_hash_is_trusted(tmp_path: Path) -> None:
    folder = _crd_dir(tmp_path, vouch=False)
    hooked = RAYSERVICE_CRD.replace("  scope: Namespaced\n", "  scope: Namespaced\n" + WEBHOOK_CONVERSION)
    (folder / "ray.io_rayservices.yaml").write_text(hooked)
    trusted = frozenset({hashlib.sha256(hooked.encode()).hexdigest()})
    with pytest.raises(UserError, match="webhook") as err:
        a.load_kuberay_crds(str(folder), "1.7.0", trusted=trusted)
    assert "convert.example.net" in str(err.value) and "\n" not in str(err.value)
    # A service-backed webhook (the other clientConfig) is refused as well.
    by_service = hooked.replace("url: https://convert.example.net/ray", "service: {namespace: evil, name: conv}")
    (folder / "ray.io_rayservices.yaml").write_text(by_service)
    with pytest.raises(UserError, match="evil/conv"):
        a.load_kuberay_crds(str(folder), "1.7.0", trusted=frozenset({hashlib.sha256(by_service.encode()).hexdigest()}))


def test_a_crd_whose_bytes_are_not_the_release_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = _crd_dir(tmp_path, vouch=False)
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for file in folder.iterdir():
        (tampered / file.name).write_bytes(file.read_bytes())
    with (tampered / "ray.io_rayjobs.yaml").open("a") as out:
        out.write("# one more line\n")
    refused = r"ray.io_rayjobs.yaml has sha256 [0-9a-f]{16}…, not KubeRay 1.7.0's 01a5cf3b"
    with pytest.raises(UserError, match=refused) as err:
        a.load_kuberay_crds(str(tampered), "1.7.0", trusted=frozenset({STANDIN_SHA256}))
    assert "\n" not in str(err.value) and "kuberay-crds.sha256" in str(err.value)
    # Downloaded the same: a mirror or a moved tag serving other bytes is refused, and nothing is cached.
    cache = tmp_path / "cache"
    with _serving(tampered) as url, pytest.raises(UserError, match="rayjobs.yaml has sha256"):
        a.load_kuberay_crds(url, "1.7.0", cache_dir=cache, timeout=10, trusted=frozenset({STANDIN_SHA256}))
    assert not [p for p in cache.rglob("ray.io_rayjobs.yaml")]
    # A release rtui ships no sums for cannot be verified: refused, naming the ones it knows.
    with pytest.raises(UserError, match="ships no sha256 of KubeRay 1.5.0") as err:
        a.load_kuberay_crds(str(folder), "1.5.0", trusted=frozenset({STANDIN_SHA256}))
    assert "1.7.0" in str(err.value)


def test_a_cached_crd_with_a_wrong_hash_is_downloaded_again(crd_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with _serving(crd_dir) as url:
        first = a.load_kuberay_crds(url, "1.7.0", cache_dir=cache, timeout=10)
        (cached,) = cache.rglob("ray.io_rayclusters.yaml")
        cached.write_bytes(cached.read_bytes().replace(b"description:", b"description: planted", 1))
        again = a.load_kuberay_crds(url, "1.7.0", cache_dir=cache, timeout=10)
    assert again == first
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == a.KUBERAY_CRD_SHA256["1.7.0"][cached.name]
    # Tampered with again while the source is gone: refused rather than used.
    cached.write_bytes(cached.read_bytes() + b"\n")
    with pytest.raises(OperationError, match="cannot download"):
        a.load_kuberay_crds(url, "1.7.0", cache_dir=cache, timeout=2)


def test_the_shipped_sums_match_the_shared_release_files() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"KubeRay's CRDs are not at {SHARED}")
    for name in ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml"):
        assert hashlib.sha256((SHARED / name).read_bytes()).hexdigest() == a.KUBERAY_CRD_SHA256["1.7.0"][name]


# ----- issue 23 item 7: the operator rtui installs acts on the run's namespace only, unless asked -----

def test_by_default_the_operator_watches_only_the_run_namespace_with_a_role_there(crds: list[dict[str, Any]]) -> None:
    assert CONFIG.operator_scope == "namespace"
    objects = a.kuberay_operator(CONFIG, RUN, crds)
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    roles = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects
             if o["kind"] in ("Role", "RoleBinding")}
    # As KubeRay's chart with singleNamespaceInstall and watchNamespace: the ClusterRole's rules in a
    # Role of the watched namespace, bound to the operator's account in its own namespace.
    role = roles[("Role", CONFIG.namespace, "rtui-kuberay-operator")]
    assert role["rules"] == next(o for o in _operator(crds) if o["kind"] == "ClusterRole")["rules"]
    binding = roles[("RoleBinding", CONFIG.namespace, "rtui-kuberay-operator")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "rtui-kuberay-operator"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberay-operator", "namespace": "rtui-kuberay"}]
    assert ("Role", "rtui-kuberay", "kuberay-operator-leader-election") in roles  # leader election stays
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "--enable-leader-election=true", "--watch-namespace", CONFIG.namespace]
    assert a.watched_namespaces(deployment) == [CONFIG.namespace]
    for obj in objects[3:]:
        assert _roundtrip(obj) == obj, obj["kind"]
    wide = [o for o in _operator(crds) if o["kind"] == "Deployment"][0]
    assert a.watched_namespaces(wide) is None
