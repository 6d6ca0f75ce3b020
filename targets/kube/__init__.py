"""The kube target: an existing cluster from a kubeconfig (DESIGN.md §3).

Layers: the kube layer (``targets.kube.layer``: plugins, KubeRay, the RayCluster; shared with the aws
target, which hands it the addresses of the cluster it made) and the ray-job layer. Nothing outside the
namespace and the objects rtui labelled is ever deleted. The first screen's panel, the kubeconfig's
contexts, is ``targets.kube.panel``. One spelling: the target, its folder, its layer, its resources'
addresses (``kube.raycluster``) and kinds (``kube-namespace``) all say ``kube``. Records of rtui 4 said
``kubernetes`` and ``k8s.``: they are read in the new words (``backend.record``), and ``--until`` takes
the old ones too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend.config import DEFAULT_MODEL_ID
from backend.errors import UserError
from backend.planner import Stack
from backend.stepfit import fitting_micro_batch
from backend.targets import GPU_SEQ_LEN, Defaults, GpuNodes, Target
from targets.kube.config import KubeConfig

if TYPE_CHECKING:
    from pathlib import Path

    from backend.delivery import DataStore
    from backend.layers.base import Context

def gpu_cluster_defaults(config: KubeConfig) -> Defaults:
    """A GPU cluster's auto values: the hub model fine-tuned in bf16, one rank per GPU, EFA between nodes,
    conversations of up to GPU_SEQ_LEN tokens, as many per micro-batch as the GPU's memory fits.

    1e-5 fine-tunes a pretrained model. A kube cluster is used for what the seed does, EFA between GPU
    nodes; one without EFA (another cloud, a lab) says so with --require-transport any."""
    return Defaults(batch_size=0, precision="bf16", learning_rate=1e-5, model_id=DEFAULT_MODEL_ID,
                    workers=config.gpu_node_count * config.gpus_per_node, shard_size=config.gpus_per_node,
                    require_transport="efa", seq_len=GPU_SEQ_LEN, fit_batch=fitting_micro_batch)


def kubernetes_manifest(config: KubeConfig, run_id: str) -> str:
    """The objects of a GPU cluster run's plan as `rtui manifest` prints them (``Target.manifest``)."""
    # lazy: the kube layer only for `rtui manifest`
    from targets.kube.layer import every_object
    from targets.kube.manifests import yaml_stream

    objects, notes = every_object(config, run_id)
    return "".join(f"# {note}\n" for note in notes) + yaml_stream(objects)


# GPU memory a rank may use, by instance family (docs/perf-model.md: "the L4's ~22 GiB free" of 24 GB;
# g6 = NVIDIA L4 per the AWS G6 instance specifications). Other types: the job's own check decides.
GPU_FREE_GIB = {"g6.": ("L4", 22.0)}


def gpu_cluster_nodes(config: KubeConfig) -> GpuNodes:
    gpu = next((v for k, v in GPU_FREE_GIB.items() if config.gpu_node_type.startswith(k)), None)
    return GpuNodes(config.gpu_node_type, config.gpu_node_count, config.gpus_per_node, "gpu_node_count", gpu)


def gpu_cluster_job_nodes(config: KubeConfig) -> int:
    """The GPU nodes the job's workers take: one GPU per Ray Train worker, ``gpus_per_node`` of them per
    GPU node (each Ray worker pod asks for a whole node's GPUs), and Ray Train's default placement
    (PACK) fills a node before the next, so ``--num-workers 4`` on 4-GPU nodes is one machine."""
    return max(1, min(config.gpu_node_count, -(-config.effective_workers() // config.gpus_per_node)))


# A GPU node of a cluster scaled to zero while idle (issue 26) coming back, as the ETA of the job's first
# step counts it (AWS's typical durations; other providers' are alike): the node group launches the
# instance (~60 s), it boots and joins the cluster (~90 s), the device plugins start on it (~30 s), the
# Ray image (several GB) is pulled onto the fresh disk (~240 s), the Ray worker starts and joins (~20 s).
GPU_SCALE_UP_S = 60.0 + 90.0 + 30.0 + 240.0 + 20.0


class KubeTarget(Target[KubeConfig]):
    name = "kube"
    label = "Kubernetes — an existing cluster from kubeconfig"
    has_kubernetes = True
    config_model = KubeConfig
    panel = "targets.kube.panel:ContextPanel"
    scale_up_s = GPU_SCALE_UP_S

    def stack(self, config: KubeConfig) -> Stack:
        # lazy: the layers (aiohttp, boto3, kubernetes) load when the stack is made; listing targets does without
        from backend.layers.ray_job import RayJobLayer
        from targets.kube.layer import KubeLayer

        return Stack(self.name, [KubeLayer(), RayJobLayer()])

    def defaults(self, config: KubeConfig) -> Defaults:
        return gpu_cluster_defaults(config)

    def job_nodes(self, config: KubeConfig) -> int | None:
        return gpu_cluster_job_nodes(config)

    def gpu_nodes(self, config: KubeConfig) -> GpuNodes | None:
        return gpu_cluster_nodes(config)

    def manifest(self, config: KubeConfig, run_id: str) -> str | None:
        return kubernetes_manifest(config, run_id)

    def gives_storage(self, config: KubeConfig) -> bool:
        return bool(config.storage_size)

    def check(self, config: KubeConfig, cwd: Path) -> KubeConfig:
        if config.storage_size and config.storage_path:
            raise UserError(f"--storage-size {config.storage_size} and --storage-path {config.storage_path} both say "
                            "where the run's data goes", remedy="pass one of them")
        return config

    def data_store(self, state_root: Path, run_id: str, config: KubeConfig, *,
                   ctx: Context | None = None) -> DataStore | None:
        """With --storage-size: the run's directory on its volume, read through short-lived pods, with
        the session's client to the cluster."""
        if not config.storage_size:
            return None
        # lazy: the kube layer loads only when a run's data is read; listing targets does without
        from targets.kube.cluster_api import cluster_api
        from targets.kube.volume_store import VolumeStore

        # its record names the image its pods pinned
        return VolumeStore(config, run_id, state_root, api=(lambda: cluster_api(ctx)) if ctx is not None else None)

    def job_storage_path(self, config: KubeConfig, run_id: str) -> str | None:
        """With --storage-size: the run's own directory on its volume (``manifests.DATA_MOUNT``)."""
        # lazy: the kube layer loads only when a run's stack is made; listing targets does without
        from targets.kube.manifests import job_storage_path

        return job_storage_path(run_id) if config.storage_size else None

    def where(self, config: KubeConfig) -> str:
        return config.context or ""  # the kubeconfig's context when one is named (else its current one)
