"""The Kubernetes objects rtui applies, as plain data: pure functions of ``RunConfig`` and a run id.

Nothing here talks to a cluster, so ``rtui manifest`` can print them and tests can check them
against KubeRay's CRD schema. The RayCluster follows the seed's spec (DESIGN.md §4).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import yaml

from backend.errors import UserError
from targets.kube.config import KubeConfig
from training.protocol import NODE_ENV

Manifest = dict[str, Any]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "rtui"
RUN_LABEL = "rtui.dev/run"

RAYCLUSTER_API_VERSION = "ray.io/v1"
RAYCLUSTER_CRD = "rayclusters.ray.io"
WORKER_GROUP = "gpu"
DASHBOARD_PORT_NAME = "dashboard"
DASHBOARD_PORT = 8265
# KubeRay builds the head service's ports from the head container's: named here so the name the
# service-proxy path uses (DESIGN.md §4) is ours, not a default that could change.
HEAD_PORTS = (("gcs-server", 6379), (DASHBOARD_PORT_NAME, DASHBOARD_PORT), ("client", 10001))

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
GPU_NODE_LABEL = "nvidia.com/gpu.present"
# The seed's worker (4 GPUs on a g6.12xlarge: 48 vCPU, 192 GiB) asks for 40 CPU and 160Gi,
# leaving 8 vCPU and 32 GiB for the kubelet and the device-plugin daemonsets. RunConfig has
# no CPU or memory fields, so the worker keeps that share per GPU: every EFA-capable g6 size
# has at least 12 vCPU and 48 GiB per GPU, so the same ratio fits them too.
CPU_PER_GPU = 10
MEMORY_GIB_PER_GPU = 40
# The head runs the GCS, the dashboard and the job's driver, never a training worker. Sized to
# share an m7i.xlarge (4 vCPU, 16 GiB) with the KubeRay operator and the cluster's add-ons.
HEAD_CPU = "2"
HEAD_MEMORY = "8Gi"
# Ray's session dir: logs and spilled objects outlive a container restart inside the pod.
RAY_TMP_VOLUME = "ray-tmp"
RAY_TMP_PATH = "/tmp/ray"
WORKER_ENV = {
    "FI_PROVIDER": "efa",
    "NCCL_NET_PLUGIN": "ofi",
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_DEBUG": "INFO",
    # No FI_EFA_USE_DEVICE_RDMA: g6 has no GPUDirect RDMA (DESIGN.md §4).
}

# A label value: what a run id must be to mark objects (Kubernetes' rule, at most 63 characters).
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def labels(run_id: str) -> dict[str, str]:
    """The labels that make an object ours and this run's (DESIGN.md §1)."""
    if not run_id or not _LABEL_VALUE.fullmatch(run_id):
        raise UserError(f"run id {run_id!r} cannot be a Kubernetes label value",
                        remedy="use letters, digits, '-', '_' or '.', starting and ending with a letter or digit, "
                               "at most 63 characters")
    return {MANAGED_BY_LABEL: MANAGED_BY, RUN_LABEL: run_id}


def head_service_name(config: KubeConfig) -> str:
    """KubeRay names the head service after the RayCluster; rtui creates no Service of its own."""
    return f"{config.cluster_name}-head-svc"


def dashboard_proxy_path(config: KubeConfig) -> str:
    """The Jobs API through the API server's service proxy: no port opened outside the cluster."""
    return (f"/api/v1/namespaces/{config.namespace}/services/"
            f"{head_service_name(config)}:{DASHBOARD_PORT_NAME}/proxy/")


def pinned_image(image: str, digest: str | None) -> str:
    """``image`` pulled by ``digest`` when one is known; the tag stays in the name for the reader."""
    if digest is None:
        return image
    if not _DIGEST.fullmatch(digest):
        raise ValueError(f"not an image digest: {digest!r}")
    return f"{image.split('@', 1)[0]}@{digest}"


def worker_resources(config: KubeConfig, efa_interfaces: int = 1) -> dict[str, str]:
    """Requests and limits of a GPU worker; the same dict for both keeps the pod Guaranteed.
    ``efa_interfaces``: the node's EFA interfaces (one per network card), all for its one worker."""
    gpus = config.gpus_per_node
    out = {
        "cpu": str(CPU_PER_GPU * gpus),
        "memory": f"{MEMORY_GIB_PER_GPU * gpus}Gi",
        GPU_RESOURCE: str(gpus),
    }
    if config.wants_efa():
        # g6.8xlarge and larger have one EFA interface, p4d 4, p5 32; the pod holds them all.
        out[EFA_RESOURCE] = str(max(1, efa_interfaces))
    return out


def worker_env(config: KubeConfig) -> dict[str, str]:
    if config.wants_efa():
        return dict(WORKER_ENV)
    return {k: v for k, v in WORKER_ENV.items() if k not in ("FI_PROVIDER", "NCCL_NET_PLUGIN")}


HF_TOKEN_KEY = "HF_TOKEN"


def hf_token_secret_name(config: KubeConfig) -> str:
    return f"{config.cluster_name}-hf-token"


def secret(config: KubeConfig, run_id: str, name: str, key: str, value: str) -> Manifest:
    """A Secret of the run in its namespace holding ``value`` under ``key``: built in memory when it is
    applied, never written anywhere else."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": config.namespace, "labels": labels(run_id)},
            "stringData": {key: value}}


def hf_token_secret(config: KubeConfig, run_id: str, token: str) -> Manifest:
    """The Secret the pods read the Hugging Face token from."""
    return secret(config, run_id, hf_token_secret_name(config), HF_TOKEN_KEY, token)


def _token_env(config: KubeConfig) -> list[Manifest]:
    if not config.hf_token:
        return []
    return [{"name": HF_TOKEN_KEY, "valueFrom": {"secretKeyRef": {"name": hf_token_secret_name(config),
                                                                  "key": HF_TOKEN_KEY}}}]


# Ray token auth (Ray >= 2.52, KubeRay >= 1.5): KubeRay reads the token from this key of the Secret
# ``authOptions.secretName`` names (ray-operator/controllers/ray/utils/constant.go RAY_AUTH_TOKEN_SECRET_KEY).
RAY_TOKEN_KEY = "auth_token"
# Ray's dashboard reads the token from ``Authorization``, then from this header, "for proxies and
# KubeRay" (ray/_private/authentication/http_token_authentication.py). The API server's service
# proxy drops the ``Authorization`` it authenticated, so the token to Ray goes in this one.
RAY_TOKEN_HEADER = "X-Ray-Authorization"


def ray_token_secret_name(config: KubeConfig) -> str:
    return f"{config.cluster_name}-ray-token"


def ray_token_secret(config: KubeConfig, run_id: str, token: str) -> Manifest:
    """The Secret holding the Ray cluster's auth token."""
    return secret(config, run_id, ray_token_secret_name(config), RAY_TOKEN_KEY, token)


def with_token_auth(config: KubeConfig, cluster: Manifest) -> Manifest:
    """The RayCluster with Ray's token auth on: ``authOptions`` naming our Secret (KubeRay then creates
    none of its own), so the dashboard, the Jobs API and the GCS take no request without the token.

    No ``RAY_AUTH_*`` env of rtui's: KubeRay 1.6+ adds ``RAY_AUTH_MODE`` and ``RAY_AUTH_TOKEN`` (from this
    Secret) to the Ray container, its ``wait-gcs-ready`` init container and the autoscaler sidecar
    (common/pod.go SetContainerTokenAuthEnvVars); set here too it would be set twice, and an operator
    that appends its own (1.5.x) would win. Older KubeRay is refused at plan time (kuberay_version.py)."""
    cluster["spec"]["authOptions"] = {"mode": "token", "secretName": ray_token_secret_name(config)}
    return cluster


# The user's --job-env values: a Secret of the run, mounted read-only in every Ray container; the job
# gets only the file's path (training/passed_env.py reads it), never the values in its runtime_env.
JOB_ENV_KEY = "job-env.json"
JOB_ENV_VOLUME = "rtui-job-env"
JOB_ENV_MOUNT = "/var/run/rtui/job-env"


def job_env_secret_name(config: KubeConfig) -> str:
    return f"{config.cluster_name}-job-env"


def job_env_file() -> str:
    return f"{JOB_ENV_MOUNT}/{JOB_ENV_KEY}"


def job_env_secret(config: KubeConfig, run_id: str, values: dict[str, str]) -> Manifest:
    """The Secret holding the ``--job-env`` values (JSON, as training.passed_env reads it)."""
    return secret(config, run_id, job_env_secret_name(config), JOB_ENV_KEY, json.dumps(values, sort_keys=True))


def with_job_env_mount(config: KubeConfig, cluster: Manifest) -> Manifest:
    """The RayCluster with the job-env Secret mounted read-only in every Ray container (``optional``:
    a pod starts before or without it; the kubelet fills the volume once it exists)."""
    spec = cluster["spec"]
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        pod["volumes"] = [*pod.get("volumes", []), {"name": JOB_ENV_VOLUME, "secret": {
            "secretName": job_env_secret_name(config), "optional": True}}]
        container = pod["containers"][0]
        container["volumeMounts"] = [*container.get("volumeMounts", []),
                                     {"name": JOB_ENV_VOLUME, "mountPath": JOB_ENV_MOUNT, "readOnly": True}]
    return cluster


# ---- the run's volume (--storage-size) -------------------------------------------------------------
DATA_VOLUME = "rtui-data"
DATA_MOUNT = "/var/lib/rtui-data"
READ_WRITE_MANY = "ReadWriteMany"
READ_WRITE_ONCE = "ReadWriteOnce"


def data_claim_name(config: KubeConfig) -> str:
    return f"{config.cluster_name}-data"


def job_storage_path(run_id: str) -> str:
    """The job's --storage-path on the run's volume: its own directory, named for the run."""
    return f"{DATA_MOUNT}/{run_id}"


def data_claim(config: KubeConfig, run_id: str, access_mode: str = READ_WRITE_MANY) -> Manifest:
    """The run's PersistentVolumeClaim: no ``storageClassName``, so the cluster's default StorageClass
    provisions it (the DefaultStorageClass admission plugin fills the field in; kubernetes.io/docs/
    concepts/storage/persistent-volumes/ "Class"). ReadWriteMany: the head (Ray Train's controller
    writes the run's state) and the workers on other nodes all mount it read-write."""
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": data_claim_name(config), "namespace": config.namespace, "labels": labels(run_id)},
            "spec": {"accessModes": [access_mode], "resources": {"requests": {"storage": config.storage_size}}}}


def with_data_volume(config: KubeConfig, cluster: Manifest) -> Manifest:
    """The RayCluster with the run's claim mounted at ``DATA_MOUNT`` in every Ray container."""
    spec = cluster["spec"]
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        pod["volumes"] = [*pod.get("volumes", []), {"name": DATA_VOLUME, "persistentVolumeClaim": {
            "claimName": data_claim_name(config)}}]
        container = pod["containers"][0]
        container["volumeMounts"] = [*container.get("volumeMounts", []),
                                     {"name": DATA_VOLUME, "mountPath": DATA_MOUNT}]
    return cluster


# Which of the run's ServiceAccounts in the namespace is which (the KubeRay operator's carries the run's
# labels too, when it is scoped to the run's namespace).
PURPOSE_LABEL = "rtui.dev/purpose"
RAY_PODS = "ray-pods"
RAY_WORKERS = "ray-workers"


def worker_service_account_name(config: KubeConfig) -> str:
    """The workers' own account, when the run has no storage identity for them to share."""
    return f"{config.cluster_name}-ray-worker"


def service_account(namespace: str, name: str, run_id: str, purpose: str = RAY_PODS) -> Manifest:
    """A ServiceAccount of the run's Ray pods, in the run's namespace, with no API token mounted by default.

    It carries no credential itself: the cluster's mechanism attaches one to its name (an EKS Pod Identity
    association for namespace/name; its agent's webhook injects the credentials into the pods through a
    projected volume of its own, whatever ``automountServiceAccountToken`` says). Only the head, and only
    for KubeRay's autoscaler sidecar, asks for a token, on its pod spec (which takes precedence).
    """
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {**labels(run_id), PURPOSE_LABEL: purpose}},
            "automountServiceAccountToken": False}


def with_service_account(name: str | None, cluster: Manifest, worker: str) -> Manifest:
    """The head runs as ``name`` (None: KubeRay's choice, an account named after the cluster with the
    autoscaler on, else the namespace's default), the workers as ``worker``, never holding a token.

    With idle scaling KubeRay binds its autoscaler Role (pods patch, rayclusters patch) to the head's
    account (ray-operator common/rbac.go BuildRoleBinding, utils.GetHeadGroupServiceAccountName), and its
    sidecar in the head reads that account's token: the head mounts one then, and only then. KubeRay
    leaves the workers' ``serviceAccountName`` as the template says (common/pod.go DefaultWorkerPodTemplate).
    """
    spec = cluster["spec"]
    head = spec["headGroupSpec"]["template"]["spec"]
    if name:
        head["serviceAccountName"] = name
    head["automountServiceAccountToken"] = bool(spec.get("enableInTreeAutoscaling"))
    for group in spec["workerGroupSpecs"]:
        group["template"]["spec"]["serviceAccountName"] = worker
        group["template"]["spec"]["automountServiceAccountToken"] = False
    return cluster


# ---- Pod Security (https://kubernetes.io/docs/concepts/security/pod-security-standards/) --------------
# The run's namespace refuses what Baseline forbids and warns and audits what Restricted would. Pinned to
# a version, as the docs advise, so a cluster upgrade never changes what is refused under a running job;
# a version newer than the cluster's is evaluated as its latest.
POD_SECURITY_LABEL = "pod-security.kubernetes.io/"
POD_SECURITY_VERSION = "v1.33"
POD_SECURITY = {"enforce": "baseline", "warn": "restricted", "audit": "restricted"}


def pod_security_labels() -> dict[str, str]:
    out = {}
    for mode, level in POD_SECURITY.items():
        out[f"{POD_SECURITY_LABEL}{mode}"] = level
        out[f"{POD_SECURITY_LABEL}{mode}-version"] = POD_SECURITY_VERSION
    return out


# The user an image runs as, where rtui knows it: (uid, gid). Ray's own images run as ``ray``, uid 1000,
# gid 100 (ray-project/ray docker/base-deps/Dockerfile: RAY_UID/RAY_GID, ``USER $RAY_UID``). The AWS DLC Ray
# images have no USER (aws/deep-learning-containers docker/ray/Dockerfile.cuda): root, so not listed.
NON_ROOT_IMAGES = {"rayproject/ray": (1000, 100), "docker.io/rayproject/ray": (1000, 100),
                   "rayproject/ray-ml": (1000, 100), "docker.io/rayproject/ray-ml": (1000, 100)}
# A pod that only sleeps (the pre-pull) needs no user of the image: it runs as nobody, whatever the image.
NOBODY = (65534, 65534)


def image_user(image: str) -> tuple[int, int] | None:
    """The non-root (uid, gid) ``image`` runs as, or None: root, or an image rtui does not know."""
    name = image.split("@", 1)[0]
    repository = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    return NON_ROOT_IMAGES.get(repository)


def container_security(user: tuple[int, int] | None = None) -> Manifest:
    """Every container rtui runs in the run's namespace: Restricted's settings, and running as ``user``
    when there is one (Restricted's runAsNonRoot, which an image built to run as root, like the default
    AWS Deep Learning Container, does not allow). No capability is added: EFA's memory registration relies
    on the node's memlock limit (unlimited for containerd on the EKS AMIs), as IPC_LOCK is not among the
    capabilities Baseline admits."""
    out: Manifest = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                     "seccompProfile": {"type": "RuntimeDefault"}}
    if user is not None:
        out.update(runAsNonRoot=True, runAsUser=user[0], runAsGroup=user[1])
    return out


# Where rtui's pods may run: Linux nodes of the architecture rtui pins images for. rtui resolves an image's
# digest and size for linux/amd64 (registry.py), the default image is built for x86_64 alone, and a node of
# another architecture fails the pull ("no match for platform in manifest"). Every kubelet labels its node
# with both (kubernetes.io/docs/reference/labels-annotations-taints/#kubernetes-io-arch).
IMAGE_ARCH = "amd64"


def node_platform() -> dict[str, str]:
    return {"kubernetes.io/os": "linux", "kubernetes.io/arch": IMAGE_ARCH}


def pod_security() -> Manifest:
    """A pod's own securityContext: the runtime's default seccomp profile for every container."""
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def with_pod_security(cluster: Manifest, image: str) -> Manifest:
    """Every Ray container hardened, as the image's own non-root user where it has one (then the pods pass
    Restricted), and KubeRay's autoscaler sidecar too (the same image; its securityContext is
    ``autoscalerOptions.securityContext``, none otherwise); KubeRay's ``wait-gcs-ready`` init container
    copies the Ray container's (common/pod.go DefaultWorkerPodTemplate)."""
    spec, user = cluster["spec"], image_user(image)
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        pod["securityContext"] = pod_security()
        for container in pod["containers"]:
            container["securityContext"] = container_security(user)
    if spec.get("enableInTreeAutoscaling"):
        spec["autoscalerOptions"] = {**spec.get("autoscalerOptions", {}), "securityContext": container_security(user)}
    return cluster


def namespace(config: KubeConfig, run_id: str) -> Manifest:
    """The run's namespace, which rtui creates (it never adopts one): ours, and Pod Security's labels."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": config.namespace, "labels": {**labels(run_id), **pod_security_labels()}}}


def _ray_tmp_volume() -> tuple[Manifest, Manifest]:
    return {"name": RAY_TMP_VOLUME, "emptyDir": {}}, {"name": RAY_TMP_VOLUME, "mountPath": RAY_TMP_PATH}


def _env(values: dict[str, str]) -> list[Manifest]:
    return [{"name": k, "value": v} for k, v in values.items()]


def _node_name_env() -> Manifest:
    """The Kubernetes node the pod runs on (the downward API's ``spec.nodeName``): the training program
    names it when it goes on from a checkpoint after a restart (a replacement node after a Spot
    interruption), where the pod's own name would say nothing of the machine."""
    return {"name": NODE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


def _head_group(config: KubeConfig, run_id: str, image: str) -> Manifest:
    volume, mount = _ray_tmp_volume()
    resources = {"cpu": HEAD_CPU, "memory": HEAD_MEMORY}
    # "The system node" is any node without GPUs: a kube cluster's CPU nodes carry no label
    # of ours, but GPU nodes carry GPU_NODE_LABEL=true (and are tainted), so keep off those.
    off_gpu_nodes = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": GPU_NODE_LABEL, "operator": "NotIn", "values": ["true"]}]}]}
    return {
        "rayStartParams": {"num-gpus": "0"},
        "template": {
            "metadata": {"labels": labels(run_id)},
            "spec": {
                "nodeSelector": node_platform(),
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": off_gpu_nodes}},
                "containers": [{
                    "name": "ray-head",
                    "image": image,
                    "ports": [{"name": name, "containerPort": port} for name, port in HEAD_PORTS],
                    # CUDA images set NVIDIA_VISIBLE_DEVICES=all: a GPU-less pod would still see every GPU
                    # of a node where the NVIDIA runtime is the default.
                    "env": [*_env({"NVIDIA_VISIBLE_DEVICES": "void"}), *_token_env(config)],
                    "resources": {"requests": dict(resources), "limits": dict(resources)},
                    "volumeMounts": [mount],
                }],
                "volumes": [volume],
            },
        },
    }


def _worker_group(config: KubeConfig, run_id: str, image: str, efa_interfaces: int = 1) -> Manifest:
    volume, mount = _ray_tmp_volume()
    resources = worker_resources(config, efa_interfaces)
    count = config.gpu_node_count
    return {
        "groupName": WORKER_GROUP,
        # A fixed size: a training job's world size does not change under it.
        "replicas": count,
        "minReplicas": count,
        "maxReplicas": count,
        # Ray would otherwise count the node's GPUs, not the ones this pod was given.
        "rayStartParams": {"num-gpus": resources[GPU_RESOURCE]},
        "template": {
            "metadata": {"labels": labels(run_id)},
            "spec": {
                # No node selector: the GPU (and EFA) request alone places a worker on a node that
                # advertises them, and the toleration lets it onto a tainted GPU node. The seed's
                # nvidia.com/gpu.present=true is set only by GPU Feature Discovery or the GPU
                # Operator: EKS nodes with NVIDIA's static plugin, GKE nodes and many others lack it,
                # and a selector on it left the workers Pending there (issue 19). Only the platform, which
                # every kubelet labels.
                "nodeSelector": node_platform(),
                "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{
                    "name": "ray-worker",
                    "image": image,
                    "env": [*_env(worker_env(config)), _node_name_env(), *_token_env(config)],
                    "resources": {"requests": dict(resources), "limits": dict(resources)},
                    "volumeMounts": [mount],
                }],
                "volumes": [volume],
            },
        },
    }


# Ray's autoscaler v2 (KubeRay >= 1.4 sets RAY_enable_autoscaler_v2 and the pods' restartPolicy for it).
AUTOSCALER_VERSION = "v2"


def idle_scaling(config: KubeConfig, spec: Manifest) -> Manifest:
    """``spec`` with KubeRay's in-tree autoscaler on when ``--idle-minutes`` is not 0 (issue 26).

    The operator then adds the autoscaler as a sidecar of the head pod and makes its ServiceAccount,
    Role and RoleBinding (pods get/list/watch/patch, rayclusters get/patch), which the operator's
    ClusterRole may create (addons._KUBERAY_RULES). The autoscaler removes a worker only once it has
    been idle, no task, actor or placement-group bundle on it, for ``idleTimeoutSeconds``: a running
    Ray Train job's placement group holds every worker, so a job is never scaled down. It scales
    down by lowering ``replicas`` and naming the pods in ``scaleStrategy.workersToDelete``; with the
    autoscaler on, KubeRay deletes no other pod (raycluster_controller.go, reconcilePods).
    ``replicas`` starts at the full size (KubeRay clamps it into [minReplicas, maxReplicas],
    utils.GetWorkerGroupDesiredReplicas), so the first job finds its workers ready; ``minReplicas: 0``
    lets them all go. ``0`` keeps today's fixed-size cluster, field for field.
    """
    idle_s = config.idle_timeout_s()
    if idle_s is None:
        return spec
    count = config.gpu_node_count
    groups = [{**g, "replicas": count, "minReplicas": 0, "maxReplicas": count} for g in spec["workerGroupSpecs"]]
    return {**spec, "enableInTreeAutoscaling": True,
            "autoscalerOptions": {"version": AUTOSCALER_VERSION, "upscalingMode": "Default",
                                  "idleTimeoutSeconds": idle_s},
            "workerGroupSpecs": groups}


def raycluster(config: KubeConfig, run_id: str, *, image_digest: str | None = None,
               efa_interfaces: int = 1, service_account: str | None = None) -> Manifest:
    """The RayCluster for KubeRay (``ray.io/v1``): one head, ``gpu_node_count`` GPU workers, each asking
    for its node's ``efa_interfaces``; idle workers go when ``--idle-minutes`` says so. With
    ``service_account`` every Ray pod runs as it (its AWS role for the run's data, on aws: the one name
    the credentials are keyed on), the workers without its token; else the workers run as their own.
    Every Ray container passes Pod Security's Baseline, and Restricted too when the image runs as non-root."""
    image = pinned_image(config.image, image_digest)
    account = service_account or config.service_account or None
    cluster = with_service_account(account, with_pod_security(with_job_env_mount(config, with_token_auth(config, {
        "apiVersion": RAYCLUSTER_API_VERSION,
        "kind": "RayCluster",
        "metadata": {"name": config.cluster_name, "namespace": config.namespace, "labels": labels(run_id)},
        "spec": idle_scaling(config, {
            "rayVersion": config.ray_version,
            "headGroupSpec": _head_group(config, run_id, image),
            "workerGroupSpecs": [_worker_group(config, run_id, image, efa_interfaces)],
        }),
    })), image), worker=account or worker_service_account_name(config))
    return with_data_volume(config, cluster) if config.storage_size else cluster


def manifests(config: KubeConfig, run_id: str, *, image_digest: str | None = None) -> list[Manifest]:
    """Every object rtui applies for a run, in the order they can be created."""
    return [namespace(config, run_id), raycluster(config, run_id, image_digest=image_digest)]


def yaml_stream(objects: list[Manifest]) -> str:
    """A YAML stream of ``objects`` (``---`` between them), as ``kubectl apply -f -`` reads it."""
    # Every value written out where it is used: a value two objects share (a probe's httpGet)
    # would otherwise print as an ``&id001`` anchor and ``*id001`` aliases.
    plain_dumper = type("PlainDumper", (yaml.SafeDumper,), {"ignore_aliases": lambda self, data: True})
    text: str = yaml.dump_all(objects, Dumper=plain_dumper, sort_keys=False, default_flow_style=False,
                              explicit_start=True)
    return text


PREPULL_NAME_SUFFIX = "image-prepull"


def image_prepull(config: KubeConfig, run_id: str, *, image_digest: str | None = None,
                  gpu_nodes: Sequence[str] = ()) -> Manifest:
    """A DaemonSet that only pulls the Ray image, on the nodes the GPU workers can use.

    The image is several GB: pulling it while the device plugins and the operator install takes
    the longest wait off the critical path (KubeRay's pods then start from the node's cache). Only
    GPU nodes (labelled ``GPU_NODE_LABEL``, or ``gpu_nodes``: the ones found advertising GPUs when it is
    applied; a node selector cannot match an allocatable resource), of the workers' platform, tolerating
    the GPU taint as the workers do: never every untainted CPU node of a shared cluster (issue 35).
    It only sleeps, so it runs as nobody and passes Pod Security's Restricted with any image.
    """
    image = pinned_image(config.image, image_digest)
    name = f"{config.cluster_name}-{PREPULL_NAME_SUFFIX}"
    selector = {"app.kubernetes.io/name": name}
    tiny = {"cpu": "1m", "memory": "16Mi"}
    # Terms are ORed: a labelled GPU node, or one of the GPU nodes seen by name.
    terms: list[Manifest] = [{"matchExpressions": [{"key": GPU_NODE_LABEL, "operator": "In", "values": ["true"]}]}]
    if gpu_nodes:
        terms.append({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                            "values": sorted(gpu_nodes)}]})
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": config.namespace, "labels": {**labels(run_id), **selector}},
        "spec": {
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**labels(run_id), **selector}},
                "spec": {
                    "nodeSelector": node_platform(),
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": terms}}},
                    "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 1,
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security(),
                    "containers": [{"name": "pulled", "image": image, "command": ["sleep", "infinity"],
                                    "resources": {"requests": dict(tiny), "limits": dict(tiny)},
                                    "securityContext": container_security(NOBODY)}],
                },
            },
        },
    }
