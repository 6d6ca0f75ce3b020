"""The local target: a real Ray cluster of our own child processes on this machine (DESIGN.md §3).

Layers: ``targets.local.layer`` (head and worker processes), then the ray-job layer.
It trains a tiny random Qwen2 on CPUs with gloo, offline, for free.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from backend.config import shown
from backend.delivery import LocalDirStore, local_data_dir
from backend.errors import UserError
from backend.planner import Stack
from backend.targets import Defaults, FoundCluster, Target, TinyModel
from targets.local.config import LocalConfig

if TYPE_CHECKING:
    from backend.delivery import DataStore
    from backend.layers.base import Context


class LocalTarget(Target[LocalConfig]):
    name = "local"
    label = "Local — a real Ray cluster on this machine: tiny model, no cloud"
    on_gpus = False
    offline = True
    shared_disk = True
    bench_variants = ("gloo",)
    bench_ab_steps = 12
    config_model = LocalConfig
    unpriced = "free (local)"

    def stack(self, config: LocalConfig) -> Stack:
        # lazy: the layers (aiohttp, boto3, kubernetes) load when the stack is made; listing targets does without
        from backend.layers.ray_job import RayJobLayer
        from targets.local.layer import LocalRay

        return Stack(self.name, [LocalRay(), RayJobLayer()])

    def defaults(self, config: LocalConfig) -> Defaults:
        workers = config.num_workers or 2
        # Locally a tiny model's step is dominated by per-step collective overheads: a bigger
        # per-worker batch keeps the CPU busy computing. bench/local_throughput.py measured FSDP2 vs a
        # plain loop at 0.62x with batch 8, 0.71x with 16 and 0.97x with 32.
        # fp32: bf16 matmuls on CPUs without bf16 units are several times slower.
        # 1e-3: the model starts from random weights, and at 1e-5 AdamW moves its logits too little in
        # 100 steps for any data to lower the loss by even 15 % (measured: a constant token, 6.77 -> 6.01).
        return Defaults(batch_size=32, precision="fp32", learning_rate=1e-3, model_id=None, workers=2,
                        shard_size=workers, require_transport="any",
                        tiny=TinyModel(config.local_hidden_size, config.local_layers, config.local_heads,
                                       config.local_vocab_size))

    def check(self, config: LocalConfig, cwd: Path) -> LocalConfig:
        if config.local_hidden_size % config.local_heads:
            raise UserError(f"--local-hidden-size={config.local_hidden_size} is not a multiple of "
                            f"--local-heads={config.local_heads}", remedy="pick sizes that divide evenly")
        if config.effective_require_transport() != "any":
            raise UserError(f"--require-transport={config.require_transport} needs NCCL on GPUs",
                            remedy="the local target trains on CPU with gloo; use --target aws or kube")
        if config.data_is_file() and not (config.tokenizer or config.model_id):  # the model dir's own by default
            raise UserError("--data with a file needs --tokenizer on the local target (or --model-id DIR with its "
                            "tokenizer)", remedy="pass a local tokenizer dir (the local target works offline)")
        if config.model_id:
            model_dir = (cwd / Path(config.model_id).expanduser()).resolve()
            if not (model_dir / "config.json").is_file():
                raise UserError(f"--model-id {shown(config.model_id)}: not a Hugging Face model directory here "
                                "(no config.json); the local target works offline",
                                remedy="pass a directory saved with save_pretrained (or downloaded with `hf "
                                       "download MODEL --local-dir DIR`), or leave --model-id out for the tiny model")
            config = config.model_copy(update={"model_id": str(model_dir)})
        return config

    def job_nodes(self, config: LocalConfig) -> int | None:
        """One: the head and any extra worker nodes (--local-worker-nodes) are processes of this machine."""
        return 1

    def live_clusters(self, cluster_name: str | None = None) -> list[FoundCluster]:
        # lazy: psutil (~30 ms) only when live clusters are looked for
        from targets.local.cluster import cluster_family, find_clusters

        found = []
        for c in find_clusters(cluster_name=cluster_name):
            state_dir = c.facts.get("state_dir")
            found.append(FoundCluster(c.run_id, c.cluster_name, str(c.path),
                                      state_dir if isinstance(state_dir, str) else None,
                                      running=bool(cluster_family(c.path))))
        return found

    def data_store(self, state_root: Path, run_id: str, config: LocalConfig, *,
                   ctx: Context | None = None) -> DataStore | None:
        return LocalDirStore(local_data_dir(state_root, run_id))
