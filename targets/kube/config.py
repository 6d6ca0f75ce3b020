"""The kube target's settings, and the settings of every GPU cluster rtui drives through Kubernetes (the
aws target's config builds on them): the GPU nodes, the namespace, the image, KubeRay and the device
plugins, how rtui reaches the cluster, and the run's own volume."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from backend.config import DNS_SUBDOMAIN, SESSION, STORAGE_SIZE, RunConfig, matches, storage_bytes

if TYPE_CHECKING:
    from backend.layers.base import Context

INSTANCE_TYPE = (r"[a-z][a-z0-9-]*\.[a-z0-9]+", "an EC2 instance type such as g6.12xlarge")
# field -> (full-match pattern, what is accepted: the second half of the error line)
PATTERNS: dict[str, tuple[str, str]] = {
    "namespace": (r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
                  "a DNS label: lowercase letters, digits and '-', at most 63 characters"),
    "gpu_node_type": INSTANCE_TYPE,
    "addon_registry": (r"([a-z0-9]([a-z0-9.-]*[a-z0-9])?(:\d{1,5})?(/[a-z0-9._-]+)*)?",
                       "a registry host with an optional port and path, such as 123456789012.dkr.ecr.us-east-1."
                       "amazonaws.com/mirror (no scheme, no tag)"),
}


class KubeConfig(RunConfig):
    """A run on a Kubernetes cluster: the kube target's config (and the base of the aws target's)."""

    # backend.trust: what a checkout's rtui.toml may set without a confirmation (free), and why each other
    # field waits for one (held), one line each: `rtui config show` and the wizard's modal print it.
    free_fields: ClassVar[frozenset[str]] = frozenset({
        "gpus_per_node", "kube_timeout_s", "kube_stream_idle_s",
    })
    held_fields: ClassVar[Mapping[str, str]] = MappingProxyType({
        "gpu_node_type": "chooses the machines created and billed by the hour",
        "gpu_node_count": "chooses how many machines are created and billed by the hour",
        "namespace": "chooses the existing namespace whose objects rtui creates, changes and deletes",
        "image": "chooses the container image every Ray pod runs",
        "kuberay_version": "chooses the KubeRay operator release installed and run",
        "ray_version": "chooses the Ray release the cluster runs",
        "nvidia_device_plugin_version": "chooses the NVIDIA device plugin release run on every GPU node",
        "efa_device_plugin_version": "chooses the EFA device plugin release run on every GPU node",
        "allow_unpinned": "runs images whose digest nobody checked",
        "addon_registry": "chooses where the add-on images (run with node rights) are pulled from",
        "operator_scope": "cluster lets the operator read secrets and pods of every namespace",
        "kuberay_crds": "chooses where the CRDs installed into the cluster come from",
        "kubeconfig": "chooses the kubeconfig read, and the exec plugins in it that rtui runs",
        "context": "chooses which cluster and credentials of the kubeconfig are used",
        "storage_size": "creates a volume in the cluster (billed) and sends the results there",
        "service_account": "chooses the credentials the Ray pods get",
    })

    gpu_node_type: str = Field(default="g6.12xlarge", description="Instance type of the GPU worker nodes")
    gpu_node_count: int = Field(default=2, ge=1, le=64, description="Number of GPU worker nodes")
    gpus_per_node: int = Field(default=4, ge=1, le=16, description="GPUs per GPU node")
    namespace: str = Field(default="rtui", description="Kubernetes namespace")
    image: str = Field(
        default="public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1",
        description="Container image of the Ray head and workers",
    )
    kuberay_version: str = Field(default="1.7.0", description="KubeRay operator version")
    ray_version: str = Field(default="2.58.0", description="Ray version in the image")
    nvidia_device_plugin_version: str = Field(default="0.18.0", description="NVIDIA device plugin version")
    efa_device_plugin_version: str = Field(default="0.5.6", description="EFA device plugin version")
    allow_unpinned: bool = Field(default=False,
        description="Go on when an image's digest cannot be resolved at plan time "
                                                    "(the plan then flags the tags it pulls)")
    addon_registry: str = Field(default="",
        description="A registry (HOST[/PATH]) mirroring the add-on images under their "
                                                "upstream paths (nvidia/k8s-device-plugin, eks/aws-efa-k8s-device-"
                                                "plugin, kuberay/operator); default: nvcr.io, public.ecr.aws, quay.io")
    operator_scope: Literal["namespace", "cluster"] = Field(
        default="namespace", description="What the KubeRay operator rtui installs may act on: the run's namespace only "
                                 "(a Role there, --watch-namespace), or every namespace (a ClusterRole: secrets and "
                                 "pods of all namespaces)")
    kuberay_crds: str = Field(default="",
        description="Where the KubeRay CRDs come from: a dir of ray.io_*.yaml or an https "
                                              "URL prefix (default: the KubeRay release; set a dir when offline)")
    kubeconfig: str | None = Field(default=None, description="kubeconfig file: the kube target reads its "
        "cluster from it, the aws target writes its new cluster's context into it (default: KUBECONFIG, else "
        "~/.kube/config)")
    context: str | None = Field(default=None, description="kubeconfig context (default: the current one)")
    kube_timeout_s: float = Field(default=10.0, gt=0, le=600, json_schema_extra=SESSION,
        description="Deadline of each Kubernetes API request: a server that does not "
                    "answer by then is reported unreachable")
    kube_stream_idle_s: float = Field(default=60.0, gt=0, le=3600, json_schema_extra=SESSION,
        description="A cluster log stream silent this long is asked again from its last line (a load balancer "
                    "may drop it without a word)")
    storage_size: str = Field(default="", description="A PersistentVolumeClaim of this size (e.g. 50Gi) in the "
                                        "run's namespace, of the cluster's default StorageClass, mounted by the Ray "
                                        "head and workers: checkpoints and the model go there (instead of "
                                        "--storage-path); kept by `rtui down` unless --delete-data")
    service_account: str = Field(default="", description="The Ray pods run as this ServiceAccount, which rtui "
                                           "makes in the run's namespace, so the cluster's own mechanism gives them "
                                           "credentials (an EKS Pod Identity association for NAMESPACE/NAME made "
                                           "beforehand) to write --storage-path s3://…")

    @field_validator("namespace", "gpu_node_type", "addon_registry")
    @classmethod
    def _kube_patterns(cls, v: str, info: ValidationInfo) -> str:
        return matches(PATTERNS, v, info)

    @field_validator("storage_size")
    @classmethod
    def _quantity(cls, v: str) -> str:
        if v and not STORAGE_SIZE.fullmatch(v):
            raise ValueError("a size such as 50Gi, 500Gi or 1Ti (a whole number and Mi, Gi or Ti; G and T are "
                             "powers of ten)")
        if v and storage_bytes(v) < 2**30:
            raise ValueError("at least 1Gi: a checkpoint of the smallest hub model is larger")
        return v

    @field_validator("service_account")
    @classmethod
    def _service_account_name(cls, v: str) -> str:
        if v and (len(v) > 253 or not DNS_SUBDOMAIN.fullmatch(v)):
            raise ValueError("a Kubernetes name: lowercase letters, digits, '-' and '.', starting and ending with a "
                             "letter or digit")
        if v == "default":
            raise ValueError("not 'default': every pod of the namespace runs as it; name one for the Ray pods")
        return v


def kube_config(ctx: Context) -> KubeConfig:
    """The run's config, as the kube layer reads it (a kube or aws run's)."""
    return KubeConfig.of(ctx.config)
