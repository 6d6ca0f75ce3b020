"""Where Ray Train's workers meet to form torch's process group: over TCP, or through a file.

Ray Train's ``TorchConfig`` knows two rendezvous, ``env`` and ``tcp`` (ray/train/torch/config.py,
Ray 2.58): either way rank 0 hosts torch's TCPStore, and that store's server binds every interface
(``::``, else ``0.0.0.0``) whatever host it is given and asks nobody for a token (c10d's
TCPStoreLibUvBackend.cpp ``UvTcpServer::makeWithPort``, and the older TCPStore.cpp server alike,
torch 2.13). Across pods of a cluster that is what a rendezvous needs. On one machine it is a door
open to the host's network for as long as the job runs, so a target whose workers all share one
filesystem names a private directory (the local target: its 0700 cluster dir, through
``training.raytrain.RENDEZVOUS_DIR_ENV``) and the workers meet through torch's FileStore there: no socket at all.
The choice is the target's; this program only follows it.

Imports Ray and torch: import it where the trainer is built, never at the program's start.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any

import ray
from ray.train._internal.base_worker_group import BaseWorkerGroup
from ray.train._internal.worker_group import WorkerGroup as V1WorkerGroup
from ray.train.backend import BackendConfig
from ray.train.torch import TorchConfig
from ray.train.torch.config import _set_torch_distributed_env_vars, _setup_torch_process_group, _TorchBackend


@dataclass
class FileRendezvousConfig(TorchConfig):
    """``TorchConfig`` whose workers meet through a FileStore under ``directory``."""

    directory: str = ""

    @property
    def backend_cls(self) -> type[_FileRendezvousBackend]:
        return _FileRendezvousBackend


class _FileRendezvousBackend(_TorchBackend):
    """Ray Train's torch backend with a ``file://`` init_method in place of ``env://``.

    What Ray's ``on_start`` does besides the rendezvous is kept: the backend chosen from the
    workers' resources, the torch env vars (RANK, LOCAL_RANK, ...) set before the group forms, the
    group formed on every worker at once. Ray's ``on_shutdown`` destroys the group unchanged."""

    def on_start(self, worker_group: BaseWorkerGroup, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, FileRendezvousConfig)
        backend = backend_config.backend or (
            "nccl" if worker_group.get_resources_per_worker().get("GPU", 0) > 0 else "gloo")
        # A fresh file per group: torch's FileStore expects a file that is new or empty, and Ray
        # Train forms a new group after every restart.
        store = os.path.join(backend_config.directory, f"torch-store-{uuid.uuid4().hex}")
        if not isinstance(worker_group, V1WorkerGroup):  # Ray's V1 groups set them in on_training_start
            worker_group.execute(_set_torch_distributed_env_vars)
        # Any: the worker group's refs (ray.types.ObjectRef) are not the class ray.get is annotated with.
        forming: list[Any] = [
            worker_group.execute_single_async(rank, _setup_torch_process_group, backend=backend, world_rank=rank,
                                              world_size=len(worker_group), init_method=f"file://{store}",
                                              timeout_s=backend_config.timeout_s)
            for rank in range(len(worker_group))]
        ray.get(forming)


def torch_config(rendezvous_dir: str | None) -> TorchConfig:
    """Ray's default (a TCP rendezvous) unless the target named a directory for a FileStore."""
    if not rendezvous_dir:
        return TorchConfig()
    os.makedirs(rendezvous_dir, mode=0o700, exist_ok=True)
    return FileRendezvousConfig(directory=rendezvous_dir)
