"""The Kubernetes objects rtui would apply: KubeRay's own schema, the seed's spec (DESIGN.md §4), `rtui manifest`."""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from targets.aws.config import AwsConfig
from targets.kube import manifests as m
from targets.kube.config import KubeConfig
from targets.kube.layer import every_object
from tests.conftest import run_rtui
from tests.kube.crds import load_yaml

CRD = Path(__file__).resolve().parents[2].parent / "shared" / "schemas" / "kuberay" / "ray.io_rayclusters.yaml"
RUN = "r20260101-120000-abcd"
DIGEST = "sha256:" + "0123456789abcdef" * 4
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?")


def _closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others.

    The API server drops (or, with strict field validation, rejects) unknown fields; plain
    jsonschema lets them through, so a misspelt field would otherwise pass without a word.
    """
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def _validator() -> jsonschema.Draft7Validator:
    if not CRD.is_file():
        pytest.skip(f"KubeRay's RayCluster CRD is not at {CRD} (the shared schemas are missing)")
    crd = load_yaml(CRD)
    assert crd["spec"]["group"] + "/v1" == m.RAYCLUSTER_API_VERSION
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _closed(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def schema_errors(obj: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in _validator().iter_errors(obj)]


def kube(**fields: Any) -> KubeConfig:
    return KubeConfig(target="kube", **fields)


def head(rc: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = rc["spec"]["headGroupSpec"]
    return found


def worker(rc: dict[str, Any]) -> dict[str, Any]:
    group: dict[str, Any]
    (group,) = rc["spec"]["workerGroupSpecs"]
    return group


def container(group: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any]
    (c,) = group["template"]["spec"]["containers"]
    return c


def env(c: dict[str, Any]) -> dict[str, str]:
    names = [e["name"] for e in c["env"]]
    assert len(names) == len(set(names)), names
    def value(e: dict[str, Any]) -> str:
        if "value" in e:
            return str(e["value"])
        if "fieldRef" in e["valueFrom"]:
            return f"<field {e['valueFrom']['fieldRef']['fieldPath']}>"
        ref = e["valueFrom"]["secretKeyRef"]
        return f"<secret {ref['name']}/{ref['key']}>"

    return {e["name"]: value(e) for e in c["env"]}


# --- KubeRay's schema ---

def test_the_raycluster_validates_against_kuberays_crd() -> None:
    rc = m.raycluster(kube(), RUN)
    assert rc["apiVersion"] == "ray.io/v1" and rc["kind"] == "RayCluster"
    assert schema_errors(rc) == []


def test_the_schema_check_catches_a_misspelt_field_and_a_number_where_a_string_belongs() -> None:
    rc = m.raycluster(kube(), RUN)
    misspelt = copy.deepcopy(rc)
    misspelt["spec"]["headGroupSpec"]["rayStartParam"] = misspelt["spec"]["headGroupSpec"].pop("rayStartParams")
    assert any("rayStartParam" in e for e in schema_errors(misspelt))
    number = copy.deepcopy(rc)
    worker(number)["rayStartParams"]["num-gpus"] = 4
    assert any("num-gpus" in e for e in schema_errors(number))


# --- the seed's worker (DESIGN.md §4) ---

def test_the_seed_worker() -> None:
    config = kube()
    assert (config.gpus_per_node, config.gpu_node_count) == (4, 2)  # the seed's shape
    group = worker(m.raycluster(config, RUN))
    c = container(group)
    seed = {"nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "1", "cpu": "40", "memory": "160Gi"}
    assert c["resources"] == {"requests": seed, "limits": seed}  # requests == limits: QoS Guaranteed
    assert group["rayStartParams"]["num-gpus"] == "4"
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 0, 2)  # idle workers go
    spec = group["template"]["spec"]
    # The GPU request places it (any node advertising GPUs), not the seed's GPU Feature Discovery label;
    # only the platform its image is pinned for (issue 35: a mixed cluster's arm64 nodes cannot pull it).
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    assert "affinity" not in spec
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    # RTUI_NODE_NAME: the node a restarted job goes on from a checkpoint on (issue 41).
    assert env(c) == {"FI_PROVIDER": "efa", "NCCL_NET_PLUGIN": "ofi", "NCCL_SOCKET_IFNAME": "eth0",
                      "NCCL_DEBUG": "INFO", "RTUI_NODE_NAME": "<field spec.nodeName>"}
    assert "FI_EFA_USE_DEVICE_RDMA" not in env(c)  # g6 has no GPUDirect RDMA


def test_ray_runs_in_token_mode_with_the_runs_secret() -> None:
    """KubeRay 1.7's ``authOptions`` (schema: ../shared/schemas/kuberay) naming the run's Secret; the env
    is the operator's to add (SetContainerTokenAuthEnvVars), never set a second time by rtui (issue 35)."""
    rc = m.raycluster(kube(), RUN)
    assert rc["spec"]["authOptions"] == {"mode": "token", "secretName": "rtui-ray-ray-token"}
    for c in (container(head(rc)), container(worker(rc))):
        assert not {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"} & set(env(c))
    secret = m.ray_token_secret(kube(), RUN, "t0ken")
    assert secret["metadata"]["name"] == "rtui-ray-ray-token" and secret["stringData"] == {"auth_token": "t0ken"}
    assert schema_errors(rc) == []


# --- idle workers go (issue 26) ---

def test_the_in_tree_autoscaler_removes_idle_gpu_workers_after_idle_minutes() -> None:
    rc = m.raycluster(kube(idle_minutes=10), RUN)
    assert schema_errors(rc) == []
    spec = rc["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"] == {"version": "v2", "upscalingMode": "Default", "idleTimeoutSeconds": 600,
                                         # the sidecar KubeRay adds to the head, hardened as the Ray containers
                                         "securityContext": m.container_security()}
    group = worker(rc)
    # Starts at full size (KubeRay clamps replicas into [min, max]); all may go; at most one per GPU node.
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 0, 2)


def test_a_fraction_of_a_minute_rounds_up_to_whole_seconds_as_kuberays_int32_field_wants() -> None:
    rc = m.raycluster(kube(idle_minutes=0.001), RUN)
    assert rc["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] == 1 and schema_errors(rc) == []
    assert m.raycluster(kube(idle_minutes=2.5), RUN)["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] == 150


def test_idle_minutes_0_keeps_todays_fixed_size_cluster_exactly() -> None:
    fixed = m.raycluster(kube(idle_minutes=0), RUN)
    assert "enableInTreeAutoscaling" not in fixed["spec"] and "autoscalerOptions" not in fixed["spec"]
    group = worker(fixed)
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    # The autoscaling cluster differs in those fields only: the pods are the seed's either way.
    scaled = m.raycluster(kube(idle_minutes=10), RUN)
    # But for the head's token, which only the autoscaler sidecar needs (issue 33).
    assert head(fixed)["template"]["spec"].pop("automountServiceAccountToken") is False
    assert head(scaled)["template"]["spec"].pop("automountServiceAccountToken") is True
    assert scaled["spec"]["headGroupSpec"] == fixed["spec"]["headGroupSpec"]
    assert worker(scaled)["template"] == group["template"]


def test_a_negative_idle_time_is_bad_input() -> None:
    with pytest.raises(ValueError):
        kube(idle_minutes=-1)


def test_the_seed_head() -> None:
    group = head(m.raycluster(kube(), RUN))
    c = container(group)
    assert group["rayStartParams"]["num-gpus"] == "0"
    assert env(c)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert c["resources"]["requests"] == c["resources"]["limits"]
    assert {"name": "dashboard", "containerPort": 8265} in c["ports"]
    spec = group["template"]["spec"]
    # On the system node: never on a GPU node, and no toleration of their taint.
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}]
    assert "tolerations" not in spec
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}


@pytest.mark.parametrize("group", [head, worker])
def test_ray_tmp_is_an_empty_dir_on_every_pod(group: Any) -> None:
    g = group(m.raycluster(kube(), RUN))
    mounts = {v["name"]: v["mountPath"] for v in container(g)["volumeMounts"]}
    (volume,) = [v for v in g["template"]["spec"]["volumes"] if mounts.get(v["name"]) == "/tmp/ray"]
    assert volume["emptyDir"] == {}


def test_the_head_service_is_kuberays_and_the_proxy_path_names_its_dashboard_port() -> None:
    config = kube(cluster_name="train", namespace="ml")
    assert m.head_service_name(config) == "train-head-svc"
    assert m.dashboard_proxy_path(config) == "/api/v1/namespaces/ml/services/train-head-svc:dashboard/proxy/"
    assert not [o for o in m.manifests(config, RUN) if o["kind"] == "Service"]


# --- names, labels, image ---

def test_every_object_and_pod_template_is_labelled_ours_and_this_runs() -> None:
    config = kube(cluster_name="train", namespace="ml")
    objects = m.manifests(config, RUN)
    assert [o["kind"] for o in objects] == ["Namespace", "RayCluster"]
    want = {"app.kubernetes.io/managed-by": "rtui", "rtui.dev/run": RUN}
    rc = objects[1]
    templates = [head(rc)["template"], worker(rc)["template"]]
    for meta in [o["metadata"] for o in objects] + [t["metadata"] for t in templates]:
        # The namespace also carries Pod Security's labels (issue 33; test_pod_security.py).
        assert {k: v for k, v in meta["labels"].items() if not k.startswith("pod-security.")} == want
    assert objects[0]["metadata"]["name"] == "ml"
    assert rc["metadata"] == {"name": "train", "namespace": "ml", "labels": want}
    assert rc["spec"]["rayVersion"] == config.ray_version


@pytest.mark.parametrize("run_id", ["", "bad id", "-r1", "r1-", "r" * 64, "r/1"])
def test_a_run_id_that_cannot_be_a_label_value_is_refused(run_id: str) -> None:
    from backend.errors import UserError

    with pytest.raises(UserError, match="label value"):
        m.manifests(kube(), run_id)


def test_the_image_comes_from_the_config_and_is_pinned_by_a_digest_when_given_one() -> None:
    config = kube(image="registry.example:5000/team/ray:2.58-cuda")
    rc = m.raycluster(config, RUN)
    assert {container(head(rc))["image"], container(worker(rc))["image"]} == {config.image}
    pinned = m.raycluster(config, RUN, image_digest=DIGEST)
    want = f"registry.example:5000/team/ray:2.58-cuda@{DIGEST}"
    assert {container(head(pinned))["image"], container(worker(pinned))["image"]} == {want}
    # A config image already pinned takes the new digest, not two.
    assert m.pinned_image(f"ray@sha256:{'f' * 64}", DIGEST) == f"ray@{DIGEST}"
    with pytest.raises(ValueError, match="digest"):
        m.pinned_image("ray:latest", "sha256:short")


# --- any config ---

NAMES = st.from_regex(r"[a-z]([a-z0-9-]{0,38}[a-z0-9])?", fullmatch=True)
NAMESPACES = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=st.integers(1, 16), nodes=st.integers(1, 64), cluster=NAMES, namespace=NAMESPACES)
def test_any_config_keeps_num_gpus_equal_to_the_gpu_request_requests_equal_to_limits_and_a_valid_schema(
        gpus: int, nodes: int, cluster: str, namespace: str) -> None:
    config = kube(gpus_per_node=gpus, gpu_node_count=nodes, cluster_name=cluster, namespace=namespace)
    rc = m.raycluster(config, RUN)
    assert schema_errors(rc) == []
    group = worker(rc)
    resources = container(group)["resources"]
    assert resources["requests"] == resources["limits"]
    assert group["rayStartParams"]["num-gpus"] == resources["limits"]["nvidia.com/gpu"] == str(gpus)
    assert resources["limits"]["cpu"] == str(10 * gpus) and resources["limits"]["memory"] == f"{40 * gpus}Gi"
    assert resources["limits"]["vpc.amazonaws.com/efa"] == "1"
    assert group["replicas"] == nodes
    assert head(rc)["rayStartParams"]["num-gpus"] == "0"
    assert rc["metadata"]["name"] == cluster and rc["metadata"]["namespace"] == namespace


# --- `rtui manifest` through the real binary ---

def test_rtui_manifest_prints_the_objects_as_a_yaml_stream_and_touches_no_state(isolated_env: Path) -> None:
    proc = run_rtui("manifest", "--target", "kube", "--run-id", RUN, "--gpus-per-node", "8", "--namespace", "ml",
                    timeout=60)
    assert proc.returncode == 0, proc.stderr
    printed = list(yaml.safe_load_all(proc.stdout))
    assert printed == every_object(kube(gpus_per_node=8, namespace="ml"), RUN)[0]
    assert proc.stdout.count("\n---\n") == len(printed)  # the notes, then one document each
    assert [o["kind"] for o in printed][0] == "Namespace" and printed[-1]["kind"] == "RayCluster"
    assert {"DaemonSet", "Deployment", "Role", "RoleBinding"} <= {o["kind"] for o in printed}
    assert "ClusterRole" not in {o["kind"] for o in printed}  # the operator acts on the run's namespace only
    assert proc.stdout.startswith("# the KubeRay 1.7.0 CRDs")  # what it cannot print, said first
    assert container(worker(printed[-1]))["resources"]["limits"]["cpu"] == "80"
    assert not isolated_env.exists()
    # Plain YAML a person reads and edits: no anchors or aliases where two objects share a value.
    assert not re.search(r"[&*]id\d+", proc.stdout), re.findall(r".*[&*]id\d+.*", proc.stdout)[:3]


def test_a_value_two_objects_share_is_written_out_twice() -> None:
    shared = {"path": "/metrics", "port": "http"}
    text = m.yaml_stream([{"livenessProbe": {"httpGet": shared}, "readinessProbe": {"httpGet": shared}}])
    assert "&" not in text and "*" not in text and text.count("path: /metrics") == 2


def test_rtui_manifest_for_aws_without_a_run_id_labels_everything_with_one_new_id(isolated_env: Path) -> None:
    proc = run_rtui("manifest", "--target", "aws", timeout=60)
    assert proc.returncode == 0, proc.stderr
    printed = list(yaml.safe_load_all(proc.stdout))
    ids = {o["metadata"]["labels"]["rtui.dev/run"] for o in printed}
    (run_id,) = ids
    assert re.fullmatch(r"r\d{8}-\d{6}-[0-9a-f]{4}", run_id) and LABEL_VALUE.fullmatch(run_id)
    assert printed == every_object(AwsConfig(target="aws"), run_id)[0]
    assert not isolated_env.exists()


@pytest.mark.parametrize("args", [("--target", "local"), ()])
def test_rtui_manifest_for_the_local_target_says_so_in_one_line(args: tuple[str, ...], isolated_env: Path) -> None:
    proc = run_rtui("manifest", *args, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "local target has no Kubernetes objects" in proc.stderr
    assert not isolated_env.exists()


def test_rtui_manifest_refuses_a_run_id_that_cannot_label_an_object(isolated_env: Path) -> None:
    proc = run_rtui("manifest", "--target", "kube", "--run-id", "not a label", timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "label value" in proc.stderr
