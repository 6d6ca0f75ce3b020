"""Turn a byte stream into complete lines with bounded memory, counting bytes consumed.

Byte offsets matter for the run's log spool: a resumed session continues exactly where
the replay stopped, so a partial last line (still being written) is held back until its
newline arrives. A stream with no newline at all (binary garbage, a 2 GB blob) must not
grow memory: past ``max_line_bytes`` the line is dropped and skipped to its end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO

MAX_LINE_BYTES = 1 << 20
READ_SIZE = 1 << 16


class LineSplitter:
    """Feed bytes with ``push``; get back the complete lines they finish, decoded."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self.consumed = 0  # bytes handed out as lines or deliberately dropped
        self.dropped_lines = 0
        self._pending = bytearray()
        self._skipping = False

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    def push(self, chunk: bytes) -> list[str]:
        block = self.push_block(chunk)
        if not block:
            return []
        lines = block.decode("utf-8", "replace").split("\n")
        lines.pop()  # the empty string after the final newline
        return lines

    def push_block(self, chunk: bytes) -> bytes:
        """Like ``push`` but undecoded: the complete lines finished by ``chunk``, ending in \\n."""
        if self._skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                self.consumed += len(chunk)
                return b""
            self.consumed += nl + 1
            chunk = chunk[nl + 1 :]
            self._skipping = False
        last = chunk.rfind(b"\n")
        if last < 0:
            self._pending += chunk
            self._check_overflow()
            return b""
        if self._pending:
            self._pending += chunk[: last + 1]
            head = bytes(self._pending)
            self._pending.clear()
        else:
            head = chunk[: last + 1]
        self._pending += chunk[last + 1 :]
        self._check_overflow()
        self.consumed += len(head)
        return head

    def flush(self) -> list[str]:
        """At the end of a finished stream, the unterminated last line counts too."""
        if not self._pending:
            return []
        self.consumed += len(self._pending)
        line = self._pending.decode("utf-8", "replace")
        self._pending.clear()
        return [line]

    def discard_pending(self) -> int:
        """Forget a partial last line (it will be read again once complete); returns its size."""
        size = len(self._pending)
        self._pending.clear()
        return size

    def _check_overflow(self) -> None:
        if len(self._pending) > self.max_line_bytes:
            self.consumed += len(self._pending)
            self._pending.clear()
            self._skipping = True
            self.dropped_lines += 1


def marked_lines(block: bytes, markers: tuple[bytes, ...]) -> list[str]:
    """The lines of ``block`` that contain any of ``markers``, decoded, in order.

    Searching the block for each marker, rather than testing it line by line, keeps
    ``rtui logs classify`` close to the speed of reading the file: 0.12 s instead of 0.6 s
    for 1M lines (146 MiB), where NCCL lines are rare.
    """
    spans: set[tuple[int, int]] = set()
    for marker in markers:
        at = block.find(marker)
        while at >= 0:
            start = block.rfind(b"\n", 0, at) + 1
            end = block.find(b"\n", at)
            if end < 0:
                end = len(block)
            spans.add((start, end))
            at = block.find(marker, end)  # the next line that holds it
    return [block[start:end].decode("utf-8", "replace") for start, end in sorted(spans)]


def read_chunks(stream: BinaryIO, size: int = READ_SIZE) -> Iterator[bytes]:
    """``stream`` read ``size`` bytes at a time, to its end."""
    while chunk := stream.read(size):
        yield chunk


def iter_stream_marked(stream: BinaryIO, markers: tuple[bytes, ...], *,
                       splitter: LineSplitter | None = None) -> Iterator[str]:
    """Only the lines of a finished binary stream that contain one of ``markers``."""
    splitter = splitter or LineSplitter()
    for chunk in read_chunks(stream):
        block = splitter.push_block(chunk)
        if block:
            yield from marked_lines(block, markers)
    for line in splitter.flush():
        if any(m.decode() in line for m in markers):
            yield line


def iter_stream_lines(stream: BinaryIO, *, final: bool = True,
                      splitter: LineSplitter | None = None) -> Iterator[str]:
    """Every line of a binary stream; ``final=False`` leaves a partial last line unread."""
    splitter = splitter or LineSplitter()
    for chunk in read_chunks(stream):
        yield from splitter.push(chunk)
    if final:
        yield from splitter.flush()


def iter_file_lines(path: str | os.PathLike[str]) -> Iterator[str]:
    with open(path, "rb") as stream:
        yield from iter_stream_lines(stream)
