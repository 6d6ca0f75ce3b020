"""Reading a checkpoint where it lies: a remote one is read item by item from the store.

Ray's ``Checkpoint.as_directory()`` copies a remote checkpoint whole into a local dir
(``pyarrow.fs.copy_files``), so on a resume every rank downloaded every rank's shards (about
18.5 GB x 8 for a 1.5B model on 8 GPUs). DCP itself needs far less: its ``FileSystemReader.read_data``
(torch 2.13 filesystem.py) opens only the files this rank's load plan names and reads each item at
its offset and length. ``ArrowFileSystem`` gives DCP's reader a pyarrow filesystem (the one Ray
Train's storage uses, S3 included), whose input files are random access: each read is a ranged GET.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystemBase

from training.safe_load import SafeFileSystemReader


class ArrowFileSystem(FileSystemBase):
    """DCP's filesystem interface over a pyarrow filesystem, for reading only."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[Any, None, None]:
        if mode != "rb":
            raise ValueError(f"a checkpoint is read here, never written (mode {mode!r})")
        with self.fs.open_input_file(str(path)) as stream:  # random access: seek + ranged reads
            yield stream

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return f"{str(path).rstrip('/')}/{suffix}"

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        raise NotImplementedError("read only")

    def init_path(self, path: str | os.PathLike[str]) -> str:
        return str(path)

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        raise NotImplementedError("read only")

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never picked by DCP's own reader selection: only handed in explicitly

    def exists(self, path: str | os.PathLike[str]) -> bool:
        import pyarrow.fs as pafs

        return bool(self.fs.get_file_info(str(path)).type != pafs.FileType.NotFound)

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        raise NotImplementedError("read only")


class RemoteShardReader(SafeFileSystemReader):
    """``SafeFileSystemReader`` on a pyarrow filesystem: the same safe reads, straight from the store."""

    def __init__(self, fs: Any, directory: str, where: str) -> None:
        super().__init__(directory, where)
        # torch annotates the attribute as its local FileSystem, yet its reader calls only the
        # FileSystemBase methods (create_stream, concat_path) that ArrowFileSystem implements.
        self.fs = ArrowFileSystem(fs)  # type: ignore[assignment]
        self.path = directory
