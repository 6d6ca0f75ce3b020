"""What each kind of resource of the kube layer is made with (DESIGN.md §3: a handler's
``spec_model``): what the plan shows and compares of it. The Kubernetes objects themselves are made from
the config when applied (``manifests``), pinned to what the spec names (an image's digest); ``rtui
manifest`` renders the same objects. Fields are in the order the plan shows them."""

from __future__ import annotations

from backend.resources import Spec


class NamespaceSpec(Spec):
    name: str
    pod_security: str  # the Pod Security level it enforces


class HfTokenSpec(Spec):
    source: str  # the file or variable read when applied: never the token


class RayTokenSpec(Spec):
    key: str  # made when applied, kept only in the cluster: the spec says where, never what


class JobEnvSpec(Spec):
    names: list[str]  # the values are read from rtui's environment when applied


class NetworkPolicySpec(Spec):
    admits: str
    enforced: str  # a guess until the probe has tried the policy


class ClaimSpec(Spec):
    name: str
    size: str
    storage_class: str  # in words: the cluster's default, which, or none
    access_mode: str
    mounted_at: str
    job_writes_to: str
    on_down: str


class ServiceAccountSpec(Spec):
    name: str


class PinnedImageSpec(Spec):
    """An add-on's image, pinned by digest where the registry answered."""

    image: str
    digest: str | None
    pinning: str  # how it was pinned, in words


class OperatorSpec(PinnedImageSpec):
    scope: str  # --operator-scope


class PrepullSpec(Spec):
    image: str
    digest: str | None


class RayClusterSpec(Spec):
    """What makes a RayCluster another one (any change is a new RayCluster)."""

    image: str
    digest: str | None
    pinning: str
    gpu_nodes: int
    gpus_per_node: int
    efa: bool
    ray_version: str
    hf_token: bool
    auth: str
    idle_timeout_s: int | None  # KubeRay's autoscaler on the head: only on a head pod it creates
    volume: str | None = None  # the claim the pods mount
    service_account: str | None = None
    worker_service_account: str
    pod_security: str
    efa_interfaces: int | None = None  # per worker, where a GPU node has more than one


class WorkersSpec(Spec):
    nodes: int
    gpus_per_node: int


class ProbeSpec(Spec):
    tries: str
    image: str
