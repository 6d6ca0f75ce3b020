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

from training.logparse.scan import find_all, lines_at

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

    def push_split(self, chunk: bytes) -> tuple[bytes, bytes, bool]:
        """Like ``push_block`` without copying ``chunk``: ``(first, rest, skip_head)``.

        ``first`` is the line a pending partial line completes (b"" if none). ``rest`` is
        ``chunk`` itself when more complete lines end in it (b"" if not); its lines are
        those a newline ends, and with ``skip_head`` not the one up to its first newline
        (that one is ``first``, or the end of a line too long to keep).
        """
        head_end = -1  # chunk[:head_end + 1] is taken care of here
        first = b""
        if self._skipping or self._pending:
            head_end = chunk.find(b"\n")
            if head_end < 0:
                if self._skipping:
                    self.consumed += len(chunk)
                else:
                    self._pending += chunk
                    self._check_overflow()
                return b"", b"", False
            if self._skipping:
                self._skipping = False
                self.consumed += head_end + 1
            else:
                self._pending += chunk[: head_end + 1]
                first = bytes(self._pending)
                self._pending.clear()
                self.consumed += len(first)
        last = chunk.rfind(b"\n")
        rest = b""
        if last > head_end:
            rest = chunk
            self.consumed += last - head_end
        if last + 1 < len(chunk):
            self._pending += chunk[last + 1 :]
            self._check_overflow()
        return first, rest, head_end >= 0

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
    """The lines of ``block`` (complete lines) that contain any marker, decoded, in order.

    Finding markers with ``bytes.find`` over the whole block and decoding only the lines
    around the hits is what lets a parser outrun a plain ``for line in f`` loop: most log
    lines never become Python strings at all.
    """
    spans: set[tuple[int, int]] = set()
    for marker in markers:
        spans.update(lines_at(block, find_all(block, marker), len(marker)))
    return [block[start:end].decode("utf-8", "replace") for start, end in sorted(spans)]


def read_chunks(stream: BinaryIO, size: int = READ_SIZE) -> Iterator[bytes]:
    """``stream`` read ``size`` bytes at a time, to its end."""
    read = stream.read
    while chunk := read(size):
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
