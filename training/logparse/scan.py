"""Find the few lines of a log block that telemetry acts on, touching every byte as little as possible.

Measured here (CPython 3.11, 2 cores): a bare ``for line in f`` loop costs about 0.6 ns a
byte; ``bytes.translate`` about 0.45, ``bytes.count`` of one byte 0.35 and each
``bytes.find`` of a word 0.3 to 0.45 over a whole block; only a search for one byte
(``memchr``) is nearly free, and a Python-level step costs 50 to 150 ns. Three markers
searched for and newlines counted pass by pass would cost twice the bare loop before a
single line is parsed. So:

1. One ``bytes.translate`` pass deletes every byte but newlines and a few letters of the
   markers. The *squeezed* block is ~4% of the original and still holds every newline
   and, for every occurrence of a marker, its kept letters contiguous (its *form*), so
   counting lines and asking which markers occur, how often and on which line costs
   little there. It may show a form the original lacks (letters joined across deleted
   bytes), never fewer than the original holds.
2. A marker that is frequent in the block is searched for in the whole block, once.
3. A rare marker is searched for only near where it must be: its line number in the
   squeezed block times the mean line length, counted on from the last occurrence found,
   in a window that widens until it holds one. Finding as many distinct occurrences as
   the squeezed block counts proves none was missed (it never counts fewer than there
   are); anything else falls back to the whole-block search. So the answer is exact and
   a rare line costs a search of a few kilobytes instead of the block.

An ``NCCL INFO`` line whose first word the analyser ignores is skipped undecoded.
The whole design is measured by ``tests/telemetry/bench_parser.py``.
"""

from __future__ import annotations

from typing import NamedTuple

NCCL = b"NCCL"
NCCL_INFO = b"NCCL INFO "
SERIES_MARKERS = (b"RTUI_", b"THROUGHPUT")
# The squeeze keeps newlines and these letters: all of NCCL's, and enough of the others'
# to stay rare. R and T are left out: the Ray prefix puts them on every line.
_KEEP = frozenset(b"\nNCLUI_HOGP")
_DELETE = bytes(c for c in range(256) if c not in _KEEP)


def _form(marker: bytes) -> bytes:
    """What is left of ``marker`` in a squeezed block: its kept letters, contiguous."""
    return bytes(c for c in marker if c in _KEEP)


_FORMS = {marker: _form(marker) for marker in (NCCL, *SERIES_MARKERS)}
# From 30,000 bytes on, CPython searches for a needle of 6 bytes or more with the two-way
# algorithm, about a byte per step; below that it skips most of a needle's length per step.
_WINDOW = 28_000
# A marker with at least one occurrence per this many bytes is searched for in the whole block.
_DENSE_BYTES = 2048
# The first window around an estimated position, each side; it grows fourfold on a miss.
_FIRST_REACH = 1024
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
    """``block`` with only its newlines and the kept letters of the markers left."""
    return block.translate(None, _DELETE)


def scan_block(block: bytes, info: InfoWords, *, skip_head: bool = False) -> tuple[int, list[str], list[str]]:
    """Complete lines in ``block``, its NCCL lines and its metric lines, decoded.

    The complete lines are those a newline ends: an unterminated last line is left out,
    and with ``skip_head`` so is everything up to the first newline (a line the caller
    completes itself), so a chunk just read can be scanned without copying it.
    NCCL lines are those holding ``NCCL`` except ``NCCL INFO`` lines whose first word
    is not in ``info``; metric lines hold ``RTUI_`` or ``THROUGHPUT``
    and no ``NCCL`` (an NCCL line is the analyser's alone).
    """
    squeezed = block.translate(None, _DELETE)
    lo = block.find(b"\n") + 1 if skip_head else 0
    hi = block.rfind(b"\n") + 1
    if hi <= lo:
        return 0, [], []
    sq_lo = squeezed.find(b"\n") + 1 if skip_head else 0
    sq_hi = squeezed.rfind(b"\n") + 1
    if sq_lo or sq_hi < len(squeezed):
        squeezed = squeezed[sq_lo:sq_hi]
    n_lines = squeezed.count(b"\n")
    nccl: list[str] = []
    series: list[str] = []
    expected = _all(squeezed, _FORMS[NCCL])
    if expected:
        found = locate(block, squeezed, NCCL, expected, n_lines, lo, hi)
        nccl = _nccl_lines(block, lines_at(block, found, len(NCCL)), info)
    spans: list[tuple[int, int]] = []
    for marker in SERIES_MARKERS:
        expected = _all(squeezed, _FORMS[marker])
        if expected:
            spans += lines_at(block, locate(block, squeezed, marker, expected, n_lines, lo, hi), len(marker))
    if spans:
        if len(spans) > 1:
            spans = sorted(set(spans))
        find = block.find
        series = [block[s:e].decode("utf-8", "replace") for s, e in spans if find(NCCL, s, e) < 0]
    return n_lines, nccl, series


def locate(block: bytes, squeezed: bytes, marker: bytes, expected: list[int], n_lines: int,
           lo: int, hi: int) -> list[int]:
    """Every occurrence of ``marker`` in ``block[lo:hi]`` (non-overlapping, in order), exactly.

    ``squeezed`` is ``squeeze(block[lo:hi])``, ``expected`` the occurrences of ``marker``
    in it and ``n_lines`` its newline count.
    """
    size = hi - lo
    if len(expected) * _DENSE_BYTES > size:
        return find_all(block, marker, lo, hi)
    width = len(marker)
    mean_line = size / (n_lines or 1)
    find, sq_count = block.find, squeezed.count
    found: list[int] = []
    low = lo  # the next occurrence starts here or later
    anchor_pos, anchor_line = lo, 0  # where the last one found is, and its line number
    line = mark = 0  # newlines in squeezed[:mark]
    for at in expected:
        line += sq_count(b"\n", mark, at)
        mark = at
        guess = anchor_pos + int((line - anchor_line) * mean_line)
        reach = _FIRST_REACH
        while True:
            start = guess - reach
            if start < low:
                start = low
            stop = guess + reach + width
            if stop > hi:
                stop = hi
            pos = find(marker, start, stop)
            if pos >= 0 or (start == low and stop == hi):
                break
            reach *= 4
        if pos < 0:
            break  # the squeeze joined letters into a marker the block does not hold
        found.append(pos)
        low = pos + width
        anchor_pos, anchor_line = pos, line
    # Never more distinct occurrences than the squeeze counts: as many means all of them.
    return found if len(found) == len(expected) else find_all(block, marker, lo, hi)


def find_all(block: bytes, marker: bytes, lo: int = 0, hi: int | None = None) -> list[int]:
    """Every non-overlapping occurrence of ``marker`` in ``block[lo:hi]``, searched in windows."""
    size = len(block) if hi is None else hi
    find, width = block.find, len(marker)
    out = []
    if width < 6:
        pos = find(marker, lo, size)
        while pos >= 0:
            out.append(pos)
            pos = find(marker, pos + width, size)
        return out
    start = lo
    while start < size:
        stop = min(start + _WINDOW, size)
        limit = min(stop + width - 1, size)  # exactly the occurrences starting in [start, stop)
        pos = find(marker, start, limit)
        while pos >= 0:
            out.append(pos)
            start = pos + width
            pos = find(marker, start, limit)
        start = max(start, stop)
    return out


def _all(data: bytes, needle: bytes) -> list[int]:
    out = []
    find, width = data.find, len(needle)
    at = find(needle)
    while at >= 0:
        out.append(at)
        at = find(needle, at + width)
    return out


def lines_at(block: bytes, positions: list[int], width: int) -> list[tuple[int, int]]:
    """(start, end) of the lines holding ``positions`` (sorted), each line once."""
    out = []
    find, rfind = block.find, block.rfind
    end = -1
    for pos in positions:
        if pos < end:
            continue  # another occurrence on the line just taken
        start = rfind(b"\n", 0, pos) + 1
        end = find(b"\n", pos + width)
        if end < 0:
            end = len(block)
        out.append((start, end))
    return out


def _nccl_lines(block: bytes, spans: list[tuple[int, int]], info: InfoWords) -> list[str]:
    """Decode the NCCL lines the analyser acts on; an ``NCCL INFO`` line with an ignored first word is not."""
    find, matter = block.find, info.matter
    out = []
    for start, end in spans:
        at = find(NCCL_INFO, start, end)
        if at < 0 or matter(block, at + len(NCCL_INFO)):
            out.append(block[start:end].decode("utf-8", "replace"))
    return out
