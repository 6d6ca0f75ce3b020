"""One JSON string value decoded as its body arrives, so a large one is never held whole.

Ray's ``GET /api/jobs/{id}/logs`` answers ``{"logs": "<the whole log>"}``: a job that printed
1M lines makes a 70 MB body, and ``json.loads`` of it holds the body, its text and the decoded
string at once. A follower that lost the end of a log tail needs only the part after what it
already holds, so it decodes the value piece by piece and drops what it does not need.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

# Whole tokens of a JSON string body: plain characters and complete escapes. A match stops at
# the closing quote, at the end of what has arrived, or before an escape cut in two.
_TOKENS = re.compile(r'[^"\\]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\]*)*')
_HIGH_SURROGATE = ("\ud800", "\udbff")
_ESCAPE_LEN = len("\\uXXXX")


class PrefixMismatch(ValueError):
    """The body does not start the way the decoder was told it would."""


class StringValueDecoder:
    """Feed text of a body that starts with ``prefix`` (up to and including the value's opening
    quote); get the value's decoded characters back in pieces. ``finished`` once the closing
    quote has arrived; what follows it is ignored."""

    def __init__(self, prefix: re.Pattern[str]) -> None:
        self._prefix: re.Pattern[str] | None = prefix
        self._pending = ""
        self.finished = False

    def check_started(self) -> None:
        """At the end of the body: raise PrefixMismatch when the value never began."""
        if self._prefix is not None:
            raise PrefixMismatch(self._pending[:80])

    def feed(self, text: str) -> Iterator[str]:
        if self.finished:
            return
        self._pending += text
        if self._prefix is not None:
            found = self._prefix.match(self._pending)
            if found is None:
                # Too short to tell yet, or not the shape we expect.
                if len(self._pending) > 256 or self._pending.lstrip()[:1] not in ("", "{"):
                    raise PrefixMismatch(self._pending[:80])
                return
            self._pending = self._pending[found.end():]
            self._prefix = None
        end = _TOKENS.match(self._pending).end()  # type: ignore[union-attr]  # matches the empty string
        rest = self._pending[end:]
        self.finished = rest[:1] == '"'
        if not self.finished and len(rest) >= _ESCAPE_LEN:
            raise ValueError(f"not a JSON string: {rest[:20]!r}")  # an escape that never completes
        piece, self._pending = self._pending[:end], self._pending[end:]
        if not piece:
            return
        value: str = json.loads(f'"{piece}"', strict=False)  # a raw control character is no reason to fail
        if not self.finished and _HIGH_SURROGATE[0] <= value[-1] <= _HIGH_SURROGATE[1]:
            # The first half of a surrogate pair (a character outside the BMP, escaped by an ASCII
            # encoder as two \u escapes): keep its escape until the second half arrives, or the
            # pair would decode as two lone surrogates instead of one character.
            value = value[:-1]
            self._pending = piece[-_ESCAPE_LEN:] + self._pending
        if value:
            yield value
