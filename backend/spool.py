"""LogSpool: the raw job log of a run, appended to disk as it arrives.

The spool is the history that ``--resume`` replays; the UI keeps only a bounded
ring buffer. Chunks may end mid-line (Ray's log tail does that), so readers split
lines themselves and hold back a trailing partial line.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterator
from pathlib import Path


class LogSpool:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, text: str) -> None:
        if not text:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = text.encode("utf-8", errors="replace")
        # One write per chunk on an O_APPEND fd: a kill leaves whole chunks only.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        finally:
            os.close(fd)

    def exists(self) -> bool:
        return self.path.is_file()

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def char_count(self) -> int:
        """Characters spooled so far: how much of a replayed live stream to skip."""
        if not self.exists():
            return 0
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        total = 0
        with self.path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                total += len(decoder.decode(chunk))
        return total + len(decoder.decode(b"", final=True))

    def read_from(self, offset: int) -> tuple[list[str], int]:
        """Complete lines after byte ``offset`` and the offset just past the last one."""
        if not self.exists():
            return [], offset
        with self.path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
        end = data.rfind(b"\n")
        if end < 0:
            return [], offset
        text = data[: end + 1].decode("utf-8", errors="replace")
        return text.splitlines(), offset + end + 1

    def iter_from(self, offset: int = 0) -> Iterator[tuple[str, int]]:
        """Complete lines after byte ``offset``, streamed, each with the offset just past it."""
        if not self.exists():
            return
        with self.path.open("rb") as fh:
            fh.seek(offset)
            for raw in fh:
                if not raw.endswith(b"\n"):
                    return  # a line still being written
                offset += len(raw)
                yield raw.decode("utf-8", errors="replace").rstrip("\r\n"), offset

    def iter_lines(self) -> Iterator[str]:
        if not self.exists():
            return
        with self.path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
            for line in fh:
                yield line.rstrip("\r\n")
