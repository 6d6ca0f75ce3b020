"""Find the few lines of a log block that telemetry acts on, touching every byte as little as possible.

A bare ``for line in f`` loop costs about two CPU cycles per byte; each ``bytes.find`` or
``bytes.count`` pass over a block costs about one. Counting newlines and looking for three
markers pass by pass would cost twice the bare loop before a single line is parsed. So:

1. One ``bytes.translate`` pass deletes every byte that is neither a newline nor a letter
   of a marker. The *squeezed* block is ~6% of the original and still holds every marker
   (a marker's letters are all kept, contiguous) and every newline, so counting lines and
   asking which markers occur, and on which line, costs next to nothing there. It may show
   a marker the original lacks (letters joined across deleted bytes): that only ever sends
   the scan down the exact, slower path, never yields a wrong line.
2. NCCL lines are located in the original with the long needle ``NCCL INFO `` searched in
   windows shorter than 30,000 bytes, where CPython's search skips ~10 bytes per step. If
   the lines found hold fewer ``NCCL`` than the squeezed block, some line carries ``NCCL``
   another way (``NCCL WARN``, an env dump) and the block is searched for plain ``NCCL``.
   An ``NCCL INFO`` line whose first word the analyser ignores is skipped undecoded.
3. Metric lines are rare: the squeezed block says on which line each one is, and the scan
   walks there from the nearest NCCL line already located (a few ``memchr`` hops).
"""

from __future__ import annotations

from typing import NamedTuple

NCCL = b"NCCL"
NCCL_INFO = b"NCCL INFO "
SERIES_MARKERS = (b"RTUI_", b"THROUGHPUT")
_KEEP = frozenset(b"\n" + NCCL + b"".join(SERIES_MARKERS))
_DELETE = bytes(c for c in range(256) if c not in _KEEP)
# From 30,000 bytes on CPython's search switches to two-way, about a byte per step.
_WINDOW = 28_000
# A metric line farther than this from a located NCCL line is found by plain search.
_MAX_HOPS = 48
_MAX_WORD = 48



class InfoWords(NamedTuple):
    """The first words after ``NCCL INFO `` that the NCCL analyser acts on (it ignores the rest)."""

    words: frozenset[bytes]
    prefixes: tuple[bytes, ...] = ()

    def matter(self, block: bytes, start: int) -> bool:
        """False only when the word at ``start`` is certainly ignored; unusual shapes matter."""
        space = block.find(b" ", start, start + _MAX_WORD)
        if space < 0:
            return True
        word = block[start:space]
        return word in self.words or word.startswith(self.prefixes) or b"\n" in word


def squeeze(block: bytes) -> bytes:
    """``block`` with only its newlines and the letters of the markers left."""
    return block.translate(None, _DELETE)


def lines_with(block: bytes, marker: bytes) -> list[tuple[int, int]]:
    """(start, end) of every line of ``block`` that contains ``marker``, in order, end exclusive of \\n."""
    out = []
    find, rfind = block.find, block.rfind
    pos = find(marker)
    while pos >= 0:
        start = rfind(b"\n", 0, pos) + 1
        end = find(b"\n", pos)
        if end < 0:
            out.append((start, len(block)))
            break
        out.append((start, end))
        pos = find(marker, end)
    return out


def scan_block(block: bytes, info: InfoWords) -> tuple[int, list[str], list[str]]:
    """Lines in ``block`` (complete lines), its NCCL lines and its metric lines, decoded.

    NCCL lines are those holding ``NCCL`` except ``NCCL INFO`` lines whose first word
    is not in ``info``; metric lines hold ``RTUI_`` or ``THROUGHPUT``
    and no ``NCCL`` (an NCCL line is the analyser's alone).
    """
    squeezed = block.translate(None, _DELETE)
    expected = squeezed.count(NCCL)
    located: list[int] | None = []
    nccl: list[tuple[int, int]] = []
    if expected:
        located = _nccl_fast(block, expected, info, nccl)
        if located is None:
            nccl = _nccl_exact(block, info)
    series = _series(block, squeezed, located) if b"RTUI_" in squeezed or b"THROUGHPUT" in squeezed else []
    return (squeezed.count(b"\n"), [block[s:e].decode("utf-8", "replace") for s, e in nccl],
            [block[s:e].decode("utf-8", "replace") for s, e in series])


def _nccl_fast(block: bytes, expected: int, info: InfoWords,
               out: list[tuple[int, int]]) -> list[int] | None:
    """Fill ``out`` from ``NCCL INFO`` hits; the position of every NCCL in order, or None
    when that does not account for all ``expected`` of them (then nothing is certain)."""
    find, rfind, count = block.find, block.rfind, block.count
    words, prefixes = info
    size = len(block)
    located: list[int] = []
    touched = -1  # end of the last NCCL INFO skipped: a later hit on that line is not its first
    start = 0
    while start < size:
        stop = min(start + _WINDOW, size)
        limit = stop + len(NCCL_INFO) - 1  # exactly the hits starting in [start, stop)
        pos = find(NCCL_INFO, start, limit)
        while pos >= 0:
            word = pos + len(NCCL_INFO)
            space = find(b" ", word, word + _MAX_WORD)
            if space < 0 or (w := block[word:space]) in words or w.startswith(prefixes) or b"\n" in w:
                line_end = find(b"\n", pos)
                if line_end < 0:
                    line_end = size
                line_start = rfind(b"\n", 0, pos) + 1
                if line_start > touched:
                    out.append((line_start, line_end))
                located += [pos] * count(NCCL, pos, line_end)
                start = line_end + 1
            else:
                located.append(pos)
                start = touched = pos + len(NCCL)
            if start >= stop:
                break
            pos = find(NCCL_INFO, start, limit)
        else:
            start = stop
    return located if len(located) == expected else None


def _nccl_exact(block: bytes, info: InfoWords) -> list[tuple[int, int]]:
    out = []
    for start, end in lines_with(block, NCCL):
        pos = block.find(NCCL_INFO, start, end)
        if pos < 0 or info.matter(block, pos + len(NCCL_INFO)):
            out.append((start, end))
    return out


def _series(block: bytes, squeezed: bytes, located: list[int] | None) -> list[tuple[int, int]]:
    if located is None:
        return _series_exact(block)
    hits = sorted((at, marker) for marker in SERIES_MARKERS for at in _all(squeezed, marker))
    find, rfind = block.find, block.rfind
    sq_count, sq_rfind = squeezed.count, squeezed.rfind
    found = []
    line = line_mark = 0  # newlines in squeezed[:line_mark]
    ordinal = anchor_mark = 0  # NCCL in squeezed[:anchor_mark]
    for at, marker in hits:
        line += sq_count(b"\n", line_mark, at)
        line_mark = at
        anchor = sq_rfind(NCCL, 0, at)
        if anchor >= 0:  # walk from the line of the nearest NCCL before, located already
            ordinal += sq_count(NCCL, anchor_mark, anchor)
            anchor_mark = anchor
            pos = rfind(b"\n", 0, located[ordinal]) + 1
            hops = sq_count(b"\n", anchor, at)
        else:
            pos, hops = 0, line
        if hops > _MAX_HOPS:
            return _series_exact(block)
        for _ in range(hops):
            pos = find(b"\n", pos) + 1
        end = find(b"\n", pos)
        end = end if end >= 0 else len(block)
        if find(marker, pos, end) < 0:
            return _series_exact(block)  # a marker only the squeeze made up
        found.append((pos, end))
    return [(s, e) for s, e in sorted(set(found)) if find(NCCL, s, e) < 0]


def _all(data: bytes, needle: bytes) -> list[int]:
    out = []
    at = data.find(needle)
    while at >= 0:
        out.append(at)
        at = data.find(needle, at + len(needle))
    return out


def _series_exact(block: bytes) -> list[tuple[int, int]]:
    found: set[tuple[int, int]] = set()
    for marker in SERIES_MARKERS:
        found.update(lines_with(block, marker))
    find = block.find
    return [(s, e) for s, e in sorted(found) if find(NCCL, s, e) < 0]
