"""Resumable checkpoints: torch.distributed.checkpoint (DCP) shards, persisted through Ray Train.

Every rank saves its DCP shard (``__<rank>_0.distcp``; rank 0 also writes ``.metadata``) plus its
own RNG/data position (``rank<r>_state.pt``) into a local temp dir and reports it with
``ray.train.report(checkpoint=..., checkpoint_upload_mode=ASYNC)``: the save is the step's, the upload
is not. Ray Train v2 (``v2/_internal/execution/context.py``) runs each rank's upload on one background
thread of that rank, in report order, and waits for it when the training function returns; the step
goes on meanwhile. Each rank's upload (``Uploader``) copies its files into one directory per
checkpoint under ``<storage_path>/<run name>/``, then writes ``rank<r>_done``; rank 0 then writes
``rtui_checkpoint.json`` (step, world size, tokens seen). No rank waits for another: a checkpoint is
complete when the marker and every rank's done file are there.

A checkpoint is resumable only when the marker, every rank's done file (markers that say
``rank_markers``; an earlier rtui wrote its marker after a barrier instead), every file its
``.metadata`` names (at its full length) and every rank's state file are there (``scan``). Why not
Ray's own registered list (the run's ``checkpoint_manager_snapshot.json``): it is written by Ray's
controller in a format that warns across Ray versions, it knows only the runs Ray Train itself
started under that name, and ``--resume-from`` also takes a checkpoint copied elsewhere; the markers
travel with the files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from training.safe_load import (
    DCP_METADATA_GLOBALS,
    DCP_METADATA_NAME,
    SafeFileSystemReader,
    SafeLoadPlanner,
    UnsafeCheckpoint,
    check_listed_name,
    load_weights_only,
    read_dcp_metadata,
    unwrap_refusal,
)

__all__ = ["DCP_METADATA_GLOBALS", "UnsafeCheckpoint"]  # re-exported: callers meet them here

MARKER = "rtui_checkpoint.json"
DCP_METADATA = DCP_METADATA_NAME


@dataclass(frozen=True)
class CheckpointMeta:
    """What rank 0 writes beside the shards (``MARKER``): enough to find, validate and resume."""

    step: int
    world_size: int
    tokens_seen: int = 0
    data: str = ""
    ts: float = 0.0
    rank_markers: bool = False  # complete only with every rank's ``rank<r>_done`` (async uploads)

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
                       ts=float(raw.get("ts", 0.0)), rank_markers=raw.get("rank_markers") is True)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"checkpoint marker lacks a valid field: {exc}") from None


def checkpoint_dir_name(step: int) -> str:
    return f"checkpoint_step_{step:08d}"


def rank_state_file(rank: int) -> str:
    return f"rank{rank}_state.pt"


def rank_done_file(rank: int) -> str:
    """Written by rank ``rank`` after its upload: the last of its files."""
    return f"rank{rank}_done"


def save_local(model: Any, optimizer: Any, rank: int, rank_state: dict[str, Any], meta: CheckpointMeta) -> str:
    """Write this rank's part of the checkpoint to a fresh local dir and return it (the caller reports
    it with an ``Uploader``, which removes it). A failed save leaves no dir behind."""
    import torch
    from torch.distributed.checkpoint import state_dict_saver
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    directory = tempfile.mkdtemp(prefix=f"rtui-ckpt-{meta.step}-r{rank}-")
    try:
        # Sharded save: each rank writes only its own shards; no rank gathers the full model.
        state_dict_saver.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=directory)
        # Tensors, ints and dicts only (the RNG states are uint8 tensors): ``load`` reads this file with
        # torch.load(weights_only=True) and refuses anything else, so keep new entries plain data.
        torch.save(rank_state, os.path.join(directory, rank_state_file(rank)))
    except BaseException:
        discard_local(directory)  # a full disk or a failed collective must not leak shards in /tmp
        raise
    return directory


class Uploader:
    """Ray Train's ``checkpoint_upload_fn`` for one rank's part of one checkpoint, run on the rank's
    upload thread: Ray's own copy to storage, then this rank's done file, then (rank 0) the marker; the
    local dir goes whatever happens (a failed upload raises, and Ray ends the run with it)."""

    def __init__(self, storage: Any, rank: int, meta: CheckpointMeta, local: str) -> None:
        self.storage, self.rank, self.meta, self.local = storage, rank, meta, local

    def __call__(self, checkpoint: Any, dir_name: str) -> Any:
        try:
            persisted = self.storage.persist_current_checkpoint(checkpoint, dir_name)
            fs, where = persisted.filesystem, str(persisted.path).rstrip("/")
            with fs.open_output_stream(f"{where}/{rank_done_file(self.rank)}") as stream:
                stream.write(self.meta.to_json().encode())
            if self.rank == 0:
                mark_complete(where, dataclasses.replace(self.meta, ts=time.time(), rank_markers=True), fs=fs)
            return persisted
        finally:
            discard_local(self.local)


def mark_complete(where: str, meta: CheckpointMeta, fs: Any = None) -> None:
    """Rank 0, after its own files and done file: the marker that, with every rank's done file, makes
    the checkpoint resumable.

    ``where`` is the checkpoint's dir on ``fs`` (a pyarrow filesystem, Ray's storage filesystem in a
    job), or a local path / URI when ``fs`` is None."""
    if fs is None:
        fs, where = _fs(where)
    with fs.open_output_stream(f"{where.rstrip('/')}/{MARKER}") as stream:
        stream.write(meta.to_json().encode())


def discard_local(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class Restored:
    meta: CheckpointMeta
    rank_state: dict[str, Any] | None  # None when this rank's file is absent (a smaller world saved it)
    bytes_read: int = 0  # what this rank read of the checkpoint: its own shards, not everyone's


def load(checkpoint: Any, model: Any, optimizer: Any, rank: int) -> Restored:
    """Load model + optimizer shards (DCP reshards if the world changed) and this rank's state.

    ``checkpoint`` is a path/URI string or a ``ray.train.Checkpoint``. It is read where it lies:
    each rank reads only the byte ranges its load plan names (``training.shard_reader``), nothing is
    downloaded whole. It may come from anyone (``--resume-from``): nothing in it is unpickled beyond
    tensors, plain values and the classes DCP writes into ``.metadata`` (``training.safe_load``);
    anything else raises ``UnsafeCheckpoint`` before the model is touched.
    """
    import io

    import pyarrow.fs as pafs
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    from training.shard_reader import RemoteShardReader

    if isinstance(checkpoint, str):
        where = checkpoint
        fs, directory = _fs(checkpoint)
    else:
        fs, directory = checkpoint.filesystem, str(checkpoint.path)
        where = storage_uri(fs, directory)
    local = isinstance(fs, pafs.LocalFileSystem)
    if not local:
        check_listing(fs, directory, where)  # a name that would escape a dir is refused here too

    def read(name: str) -> bytes:
        with fs.open_input_stream(f"{directory}/{name}") as stream:
            data: bytes = stream.read()
        return data

    meta = CheckpointMeta.from_json(read(MARKER))
    rank_state = None
    if fs.get_file_info(f"{directory}/{rank_state_file(rank)}").type == pafs.FileType.File:
        # Read first: a refused file leaves the model untouched.
        raw = read(rank_state_file(rank))
        rank_state = _rank_state(load_weights_only(io.BytesIO(raw), where, rank_state_file(rank)), where, rank)
    # DCP would fold a refusal of its metadata read into a text; read it here first to say it plainly.
    read_dcp_metadata(io.BytesIO(read(DCP_METADATA)), where)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    # dcp.load fills these dicts in place, each rank reading only the items it owns. The reader and
    # planner are DCP's own with their two unpickling steps made safe.
    reader = SafeFileSystemReader(directory, where) if local else RemoteShardReader(fs, directory, where)
    try:
        dcp_load({"model": model_sd, "optim": optim_sd}, storage_reader=reader, planner=SafeLoadPlanner(where))
    except CheckpointException as exc:
        refusal = unwrap_refusal(exc)
        if refusal is None:
            raise
        raise refusal from None
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    return Restored(meta, rank_state, reader.bytes_read)


def _rank_state(loaded: Any, where: str, rank: int) -> dict[str, Any]:
    """The shape ``save_local`` gives it (``{"data": {...}, "torch_rng": uint8 tensor}``), else refused."""
    import torch

    if (not isinstance(loaded, dict) or not isinstance(loaded.get("data"), dict)
            or not isinstance(loaded.get("torch_rng"), torch.Tensor) or loaded["torch_rng"].dtype != torch.uint8):
        raise UnsafeCheckpoint(where, f"{rank_state_file(rank)} is not the rank state this program saves")
    return loaded


# -- finding checkpoints (driver side, and a worker after a restart) -----------------------------

def _fs(uri: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    if "://" in uri:
        fs, root = pafs.FileSystem.from_uri(uri)
        return fs, root
    return pafs.LocalFileSystem(), os.path.abspath(uri)


@dataclass(frozen=True)
class Candidate:
    """A directory that holds a checkpoint or part of one; ``missing`` is empty when it is complete."""

    uri: str
    run: str  # the dir holding it: Ray Train's run (experiment) dir
    meta: CheckpointMeta | None
    missing: str

    @property
    def step(self) -> int:
        return self.meta.step if self.meta else -1


def _examine(fs: Any, directory: str, sizes: dict[str, int], where: str) -> tuple[CheckpointMeta | None, str]:
    """(marker, what is missing) of one checkpoint dir whose files have ``sizes``."""
    import io

    if MARKER not in sizes:
        return None, f"no {MARKER} (the save did not finish: rank 0 writes it after its upload)"
    try:
        with fs.open_input_stream(f"{directory}/{MARKER}") as stream:
            meta = CheckpointMeta.from_json(stream.read())
    except (OSError, ValueError) as exc:
        return None, f"an unreadable {MARKER} ({exc})"
    if DCP_METADATA not in sizes:
        return meta, f"no {DCP_METADATA}"
    with fs.open_input_stream(f"{directory}/{DCP_METADATA}") as stream:
        metadata = read_dcp_metadata(io.BytesIO(stream.read()), where)  # the safe unpickler; refusal raises
    needed: dict[str, int] = {}  # every shard file .metadata names, and how long it must be
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for rank in range(meta.world_size):
        needed.setdefault(rank_state_file(rank), 1)
        if meta.rank_markers:
            needed.setdefault(rank_done_file(rank), 1)
    for name, length in sorted(needed.items()):
        if name not in sizes:
            return meta, f"no {name}"
        if sizes[name] < length:
            return meta, f"{name} cut short ({sizes[name]} of {length} bytes)"
    return meta, ""


def scan(uri: str) -> list[Candidate]:
    """Every checkpoint dir at or under ``uri`` (one holding a marker or DCP's ``.metadata``), complete
    or not, oldest step first."""
    import pyarrow.fs as pafs

    fs, root = _fs(uri)
    scheme = uri.split("://", 1)[0] + "://" if "://" in uri else ""
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        return []
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    except (OSError, ValueError):
        return []
    by_dir: dict[str, dict[str, int]] = {}
    for info in infos:
        if info.type == pafs.FileType.File:
            by_dir.setdefault(os.path.dirname(info.path), {})[os.path.basename(info.path)] = info.size or 0
    for info in fs.get_file_info([f"{root}/{MARKER}", f"{root}/{DCP_METADATA}"]):  # ``uri`` itself a checkpoint
        if info.type == pafs.FileType.File:
            by_dir.setdefault(root, {})[os.path.basename(info.path)] = info.size or 0
    found = []
    for directory, sizes in by_dir.items():
        if MARKER in sizes or DCP_METADATA in sizes:
            meta, missing = _examine(fs, directory, sizes, scheme + directory)
            found.append(Candidate(scheme + directory, scheme + os.path.dirname(directory), meta, missing))
    return sorted(found, key=lambda c: (c.step, c.uri))


def find_checkpoints(uri: str) -> list[tuple[int, str]]:
    """(step, uri) of every complete rtui checkpoint at or under ``uri``, oldest step first."""
    return [(c.step, c.uri) for c in scan(uri) if not c.missing]


def newest(candidates: list[Candidate], say: Callable[[str], object] = print) -> Candidate | None:
    """The checkpoint completed last (its marker's time; the step breaks ties): the last job's newest,
    not the highest step of any job that ever wrote there. Each partial checkpoint of that run newer
    than it is skipped with a line saying what it lacks."""
    complete = [c for c in candidates if not c.missing and c.meta is not None]
    chosen = max(complete, key=lambda c: (c.meta.ts if c.meta else 0.0, c.step), default=None)
    for c in candidates:
        # A dir without a marker has no known step: in the chosen run it may be newer, so say it.
        if c.missing and (chosen is None or (c.run == chosen.run and (c.meta is None or c.step > chosen.step))):
            say(f"rtui-train: skipping the partial checkpoint {c.uri}: {c.missing}")
    return chosen


def check_listing(fs: Any, directory: str, where: str) -> None:
    """Every name under ``directory`` stays under it (``check_listed_name``)."""
    import pyarrow.fs as pafs

    base = directory.rstrip("/") + "/"
    for info in fs.get_file_info(pafs.FileSelector(directory, recursive=True)):
        check_listed_name(info.path[len(base):] if info.path.startswith(base) else info.path, where)


def verify(uri: str) -> None:
    """Read what a load would unpickle (``.metadata`` and every rank's state) the safe way, on the
    driver: a hostile checkpoint is refused in one line before any worker starts on it."""
    import io

    fs, directory = _fs(uri)
    check_listing(fs, directory, uri)
    with fs.open_input_stream(os.path.join(directory, MARKER)) as stream:
        meta = CheckpointMeta.from_json(stream.read())
    with fs.open_input_stream(os.path.join(directory, DCP_METADATA)) as stream:
        read_dcp_metadata(io.BytesIO(stream.read()), uri)
    for rank in range(meta.world_size):
        with fs.open_input_stream(os.path.join(directory, rank_state_file(rank))) as stream:
            loaded = load_weights_only(io.BytesIO(stream.read()), uri, rank_state_file(rank))
        _rank_state(loaded, uri, rank)


def resolve_resume(resume_from: str | None, storage: str, run_name: str | None = None,
                   say: Callable[[str], object] = print) -> str | None:
    """The checkpoint to start from: ``latest`` is the newest complete checkpoint of the run named
    ``run_name`` under the storage path when it has one, else the one completed last there (None when
    there is none yet, so ``--resume-from latest`` also starts a fresh run); a path may be a
    checkpoint dir or a dir holding checkpoints (the one completed last is taken). Partial
    checkpoints are passed over with a line. Raises FileNotFoundError with the reason, and
    UnsafeCheckpoint for one that holds more than data."""
    if not resume_from:
        return None
    candidates = scan(storage if resume_from == "latest" else resume_from)
    if resume_from == "latest" and run_name:
        own = [c for c in candidates if os.path.basename(c.run.rstrip("/")) == run_name]
        if any(not c.missing for c in own):
            candidates = own
    chosen = newest(candidates, say)
    if chosen is None:
        if resume_from == "latest":
            return None
        raise FileNotFoundError(f"--resume-from {resume_from}: no complete rtui checkpoint there "
                                f"(looked for {MARKER} with every file its {DCP_METADATA} names beside it)")
    verify(chosen.uri)
    return chosen.uri


def restart_point(run_dir: str, given: str | None, say: Callable[[str], object] = print) -> str | None:
    """Where a worker group starts: the newest complete checkpoint in this run's own dir (Ray Train's
    experiment dir) when it has one, else ``--resume-from``'s (``given``), else None (fresh).

    After a worker died (``--max-failures``) Ray Train restarts the group and offers the checkpoint it
    registered last (``ray.train.get_checkpoint()``), but that is not the run's last complete one: the
    controller registers a report only once it has polled every worker's result, so a worker killed
    just after a save leaves a complete checkpoint Ray never registered (tests/training/
    test_worker_restart.py saw the group start over from step 0), and it registers before rank 0 writes
    the marker. The run's dir holds the truth; on a first start it is empty. A run started again under
    a name that has checkpoints continues them, as Ray Train's own restore from its snapshot would."""
    chosen = newest(scan(run_dir), say)
    return chosen.uri if chosen is not None else given


def storage_uri(fs: Any, path: str) -> str:
    """A path on a pyarrow filesystem as the URI ``_fs`` reads back (local paths stay plain)."""
    import pyarrow.fs as pafs

    return path if isinstance(fs, pafs.LocalFileSystem) else f"{fs.type_name}://{path}"
