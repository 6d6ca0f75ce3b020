"""Reading a checkpoint without running anything it holds.

A resumed checkpoint may come from anywhere (``--resume-from`` names a path or bucket), and every
Ray worker loads it. Three steps of a resume would run a pickle's code (torch 2.13):
``FileSystemReader.read_metadata`` unpickles ``.metadata`` with a bare ``pickle.load``;
``DefaultLoadPlanner.load_bytes`` reads non-tensor items with ``torch.load`` in its unsafe mode;
and our own ``rank<r>_state.pt`` was read the same way. This module closes all three:

* ``.metadata`` goes through an unpickler that resolves only the globals DCP itself writes there
  (recorded from a real checkpoint of the tiny model; ``tests/test_checkpoint_safety.py`` fails
  when a torch upgrade writes one more);
* byte items and the rank state go through ``torch.load(weights_only=True)``, which builds only
  tensors, primitive types and containers;
* every shard file the metadata names must be a plain name inside the checkpoint directory.

Anything else is refused with ``UnsafeCheckpoint``: one line naming the checkpoint and the thing
refused, before any of it is built.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from typing import IO, Any, cast

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

DCP_METADATA_NAME = ".metadata"  # DCP's file name for it (filesystem.py ``_metadata_fn``)
_DCP = "torch.distributed.checkpoint"
# The dtypes a tensor in a checkpoint may have; a dtype pickles as the global ``torch.<name>``.
_DTYPES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
           "float8_e5m2fnuz", "complex128", "complex64", "int64", "int32", "int16", "int8", "uint64", "uint32",
           "uint16", "uint8", "bool")
DCP_METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    (f"{_DCP}.metadata", "Metadata"),
    (f"{_DCP}.metadata", "StorageMeta"),
    (f"{_DCP}.metadata", "MetadataIndex"),
    (f"{_DCP}.metadata", "TensorStorageMetadata"),
    (f"{_DCP}.metadata", "BytesStorageMetadata"),
    (f"{_DCP}.metadata", "ChunkStorageMetadata"),
    (f"{_DCP}.metadata", "TensorProperties"),
    (f"{_DCP}.metadata", "_MEM_FORMAT_ENCODING"),  # an Enum built from its int value
    (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # looks a layout up by name in a dict; nothing else
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id as the saver saw it; only a value
    *(("torch", name) for name in _DTYPES),
})


class UnsafeCheckpoint(ValueError):
    """A checkpoint holds something a checkpoint this program saves never holds; nothing of it ran."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"checkpoint {where}: {what}; refusing to load it (nothing in it was run). Resume "
                         "from a checkpoint this program saved, or start without --resume-from")
        self.where, self.what = where, what

    def __reduce__(self) -> tuple[type[UnsafeCheckpoint], tuple[str, str]]:
        # DCP gathers a rank's exception to every rank and Ray ships it to the driver, both by pickle.
        return type(self), (self.where, self.what)


def unwrap_refusal(exc: BaseException) -> UnsafeCheckpoint | None:
    """The refusal inside DCP's ``CheckpointException`` (api.py: ``failures`` maps a rank to its
    (exception, traceback) pair), if one rank refused."""
    for failure in getattr(exc, "failures", {}).values():
        if isinstance(failure, tuple) and failure and isinstance(failure[0], UnsafeCheckpoint):
            return failure[0]
    return None


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only ``DCP_METADATA_GLOBALS``: an unpickler can call nothing it cannot name."""

    def __init__(self, stream: IO[bytes], where: str, file: str) -> None:
        super().__init__(stream)
        self.where, self.file = where, file

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in DCP_METADATA_GLOBALS:
            raise UnsafeCheckpoint(self.where, f"{self.file} names {module}.{name}, which DCP never writes")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpoint(self.where, f"{self.file} holds a persistent id, which DCP never writes")


def read_dcp_metadata(stream: IO[bytes], where: str, file: str = DCP_METADATA_NAME) -> Metadata:
    try:
        metadata = _MetadataUnpickler(stream, where, file).load()
    except UnsafeCheckpoint:
        raise
    except Exception as exc:  # truncated or not a pickle at all: still one line, still nothing run
        raise UnsafeCheckpoint(where, f"{file} is not DCP metadata ({type(exc).__name__})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(where, f"{file} holds a {type(metadata).__name__}, not DCP metadata")
    check_shard_names(metadata, where, file)
    return metadata


def check_shard_names(metadata: Metadata, where: str, file: str) -> None:
    """Every file the metadata sends the reader to is a plain name in the checkpoint dir (DCP's
    reader joins it to the dir as given, so ``../x`` or ``/x`` would read elsewhere)."""
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise UnsafeCheckpoint(where, f"{file} has no shard table")
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
                or "\0" in name):
            raise UnsafeCheckpoint(where, f"{file} names the shard file {name!r} outside the checkpoint")


def check_listed_name(relative: str, where: str) -> None:
    """A name under a remote checkpoint, relative to it, stays under the dir it is downloaded to.

    Ray's ``Checkpoint.as_directory`` copies a remote checkpoint with ``pyarrow.fs.copy_files``,
    which joins each listed key to the local temp dir as is: an S3 key ``ck/sub/../../x`` (S3 keys
    may hold ``..``) lands two levels above it (tests/test_checkpoint_safety.py reproduced it)."""
    parts = relative.split("/")
    if (not relative or relative.startswith("/") or "\\" in relative or "\0" in relative
            or any(part in ("", ".", "..") for part in parts)):
        raise UnsafeCheckpoint(where, f"its listing holds {relative!r}, which a download would write outside "
                                      "the checkpoint's own dir")


_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def load_weights_only(stream: IO[bytes] | str, where: str, what: str) -> Any:
    """``torch.load(weights_only=True)``, its refusal turned into one line naming the global."""
    try:
        return torch.load(stream, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = _REFUSED_GLOBAL.search(str(exc))
        refused = found.group(1) if found else "something other than tensors and plain values"
        raise UnsafeCheckpoint(where, f"{what} holds {refused}, which a checkpoint never holds") from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise UnsafeCheckpoint(where, f"{what} is not a torch file ({type(exc).__name__})") from None


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with ``.metadata`` read by the allowlisting unpickler; it reads each item
    this rank's load plan names as one byte range of its shard file (and counts them), never a whole
    file it does not need."""

    def __init__(self, path: str, where: str) -> None:
        super().__init__(path)
        self.where = where
        self.bytes_read = 0

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        # As the parent does (filesystem.py), with rank-suffixed metadata when DCP asks for it.
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            # Whole into memory: a remote file need not offer readline, which the unpickler calls.
            data = cast(IO[bytes], stream).read()
        self.bytes_read += len(data)
        metadata = read_dcp_metadata(io.BytesIO(data), self.where, os.path.basename(str(path)))
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _slice_file(self, file: Any, sinfo: Any) -> IO[bytes]:
        # The parent hands back a view that reads through to the file as torch.load asks: from S3
        # each small read would be a request. One ranged read of exactly the item instead.
        file.seek(sinfo.offset)
        data = file.read(sinfo.length)
        self.bytes_read += len(data)
        return io.BytesIO(data)


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, reading non-tensor items with torch's safe unpickler."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        loaded = load_weights_only(value, self.where, f"the item {fqn}")
        # The parent's placement (default_planner.py), without its unpickling torch.load.
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded
