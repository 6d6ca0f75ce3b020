"""The streamed decoding of Ray's ``{"logs": "..."}`` answer, cut anywhere."""

from __future__ import annotations

import json

import pytest

from backend.jobsapi import LOGS_PREFIX
from backend.jsonstring import PrefixMismatch, StringValueDecoder

LOG = "".join(f"r\u00e9sum\u00e9 {i} \N{GRINNING FACE} \"q\" \\ \t\x1b[36m\r\n" for i in range(40)) + "\ud800 lone"


def decode(body: str, size: int) -> str:
    value = StringValueDecoder(LOGS_PREFIX)
    out = [piece for i in range(0, len(body), size) for piece in value.feed(body[i:i + size])]
    assert value.finished
    return "".join(out)


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_every_cut_decodes_to_the_same_text(ensure_ascii: bool) -> None:
    body = json.dumps({"logs": LOG}, ensure_ascii=ensure_ascii)
    for size in [1, 2, 3, 5, 6, 7, 11, 12, 13, 64, len(body)]:
        assert decode(body, size) == LOG, size


def test_a_surrogate_pair_is_one_character_even_when_cut_between_its_halves() -> None:
    body = json.dumps({"logs": "\N{GRINNING FACE}"})  # {"logs": "\ud83d\ude00"}
    value = StringValueDecoder(LOGS_PREFIX)
    cut = body.index("\\ude00")
    assert list(value.feed(body[:cut])) == []
    assert list(value.feed(body[cut:])) == ["\N{GRINNING FACE}"]


def test_what_follows_the_value_is_ignored_and_other_shapes_are_refused() -> None:
    assert decode('{"logs": "a\\nb", "more": 1}', 4) == "a\nb"
    value = StringValueDecoder(LOGS_PREFIX)
    assert list(value.feed('{"logs": null}')) == []
    with pytest.raises(PrefixMismatch):
        value.check_started()
    with pytest.raises(PrefixMismatch):
        list(StringValueDecoder(LOGS_PREFIX).feed("Traceback (most recent call last):"))
    with pytest.raises(ValueError, match="not a JSON string"):
        list(StringValueDecoder(LOGS_PREFIX).feed('{"logs": "a\\x41 and more"}'))
