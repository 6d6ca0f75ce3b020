"""Resumable checkpoints: torch.distributed.checkpoint (DCP) shards, persisted through Ray Train.

Every rank saves its DCP shard (``__<rank>_0.distcp``; rank 0 also writes ``.metadata``) plus its
own RNG/data position (``rank<r>_state.pt``) into a local temp dir and reports it with
``ray.train.report(checkpoint=...)``; Ray Train v2 uploads each rank's files into one directory
per checkpoint under ``<storage_path>/<run name>/``. Rank 0 also writes ``rtui_checkpoint.json``
(step, world size, tokens seen), which is how ``--resume-from`` finds and validates checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

MARKER = "rtui_checkpoint.json"
DCP_METADATA = ".metadata"


@dataclass(frozen=True)
class CheckpointMeta:
    """What rank 0 writes beside the shards (``MARKER``): enough to find, validate and resume."""

    step: int
    world_size: int
    tokens_seen: int = 0
    data: str = ""
    ts: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> CheckpointMeta:
        """Raises ValueError when the file is not a marker this program wrote."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("checkpoint marker is not a JSON object")
        try:
            return cls(step=int(raw["step"]), world_size=int(raw.get("world_size", 1)),
                       tokens_seen=int(raw.get("tokens_seen", 0)), data=str(raw.get("data", "")),
                       ts=float(raw.get("ts", 0.0)))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"checkpoint marker lacks a valid field: {exc}") from None


def checkpoint_dir_name(step: int) -> str:
    return f"checkpoint_step_{step:08d}"


def rank_state_file(rank: int) -> str:
    return f"rank{rank}_state.pt"


def save_local(model: Any, optimizer: Any, rank: int, rank_state: dict[str, Any], meta: CheckpointMeta) -> str:
    """Write this rank's part of the checkpoint to a fresh local dir and return it (caller reports it)."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save

    model_sd, optim_sd = get_state_dict(model, optimizer)
    directory = tempfile.mkdtemp(prefix=f"rtui-ckpt-{meta.step}-r{rank}-")
    # Sharded save: each rank writes only its own shards; no rank gathers the full model.
    save({"model": model_sd, "optim": optim_sd}, checkpoint_id=directory)
    torch.save(rank_state, os.path.join(directory, rank_state_file(rank)))
    if rank == 0:
        with open(os.path.join(directory, MARKER), "w") as f:
            f.write(meta.to_json())
    return directory


def discard_local(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class Restored:
    meta: CheckpointMeta
    rank_state: dict[str, Any] | None  # None when this rank's file is absent (a smaller world saved it)


def load(checkpoint: Any, model: Any, optimizer: Any, rank: int) -> Restored:
    """Load model + optimizer shards (DCP reshards if the world changed) and this rank's state.

    ``checkpoint`` is a ``ray.train.Checkpoint`` or a path/URI string.
    """
    import torch
    from ray.train import Checkpoint
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    if isinstance(checkpoint, str):
        checkpoint = Checkpoint(checkpoint)
    with checkpoint.as_directory() as local:  # a local path as is; s3:// is downloaded
        with open(os.path.join(local, MARKER)) as f:
            meta = CheckpointMeta.from_json(f.read())
        model_sd, optim_sd = get_state_dict(model, optimizer)
        # dcp.load fills these dicts in place, each rank reading only the shards it owns.
        dcp_load({"model": model_sd, "optim": optim_sd}, checkpoint_id=local)
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        rank_file = os.path.join(local, rank_state_file(rank))
        rank_state = None
        if os.path.exists(rank_file):
            rank_state = torch.load(rank_file, weights_only=False)  # our own file: RNG states are tensors+ints
    return Restored(meta, rank_state)


# -- finding checkpoints (driver side) ----------------------------------------------------------

def _fs(uri: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    if "://" in uri:
        fs, root = pafs.FileSystem.from_uri(uri)
        return fs, root
    return pafs.LocalFileSystem(), os.path.abspath(uri)


def _complete(fs: Any, directory: str, meta: CheckpointMeta) -> bool:
    """All ranks' files arrived (each rank uploads its own part; a crash can leave a partial dir)."""
    import pyarrow.fs as pafs

    names = {os.path.basename(i.path) for i in fs.get_file_info(pafs.FileSelector(directory))}
    return DCP_METADATA in names and all(rank_state_file(r) in names for r in range(meta.world_size))


def find_checkpoints(uri: str) -> list[tuple[int, str]]:
    """(step, uri) of every complete rtui checkpoint at or under ``uri``, oldest step first."""
    import pyarrow.fs as pafs

    fs, root = _fs(uri)
    scheme = uri.split("://", 1)[0] + "://" if "://" in uri else ""
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        return []
    found: list[tuple[int, str]] = []
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    except (OSError, ValueError):
        return []
    markers = [i.path for i in infos if i.type == pafs.FileType.File and os.path.basename(i.path) == MARKER]
    if fs.get_file_info(os.path.join(root, MARKER)).type == pafs.FileType.File:
        markers.append(os.path.join(root, MARKER))
    for marker in set(markers):
        try:
            with fs.open_input_stream(marker) as stream:
                meta = CheckpointMeta.from_json(stream.read())
        except (OSError, ValueError):
            continue
        directory = os.path.dirname(marker)
        if _complete(fs, directory, meta):
            found.append((meta.step, scheme + directory))
    return sorted(found)


def resolve_resume(resume_from: str | None, storage: str) -> str | None:
    """The checkpoint to start from: ``latest`` searches the storage path (None when there is none
    yet, so ``--resume-from latest`` also starts a fresh run); a path may be a checkpoint dir or a
    dir holding checkpoints (its latest is taken). Raises FileNotFoundError with the reason."""
    if not resume_from:
        return None
    if resume_from == "latest":
        found = find_checkpoints(storage)
        return found[-1][1] if found else None
    found = find_checkpoints(resume_from)
    if not found:
        raise FileNotFoundError(f"--resume-from {resume_from}: no complete rtui checkpoint there "
                                f"(looked for {MARKER} with every rank's files beside it)")
    return found[-1][1]
