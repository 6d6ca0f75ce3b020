"""What the analysers are handed, against a plain line-by-line definition, however the bytes arrive.

Live chunks can be cut anywhere (inside a line, inside a UTF-8 character) and a spool can be
read while it is half written: none of that may change which lines the NCCL analyser and the
metric series see, in which order, or the byte offset a resumed session continues from.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from backend.telemetry import Telemetry
from tests.telemetry.nccl_synth import run_log, training_log

ODD_LINES = [
    "x:1:2 [0] NCCL WARN NET/OFI aws-ofi-nccl initialization failed",
    "NCCL_DEBUG=INFO NCCL_NET=ofi",
    "a:1:2 [0] NCCL INFO Setting affinity NCCL INFO Channel 00/0 : 0[0] -> 1[0] via NET/Socket/0",
    "a:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via NET/Socket/0 NCCL again",
    "N-C-C-L is not NCCL? R.T.U.I._ THR OUGHPUT",
    "NxCCL RxTUI_ TxHROUGHPUT",
    "a:1:2 [0] NCCL INFO plugin/net.cc:118 -> 2",
    "a:1:2 [0] NCCL INFO Connected",
    "a:1:2 [0] NCCL INFO ",
    "a:1:2 [0] NCCL INFO Channel\r",
    "RTUI_METRIC {\"step\": 1} and NCCL",
    "THROUGHPUT steps_per_sec=1 RTUI_ RTUI_",
    "THROUGHPUT steps_per_sec=2.5 tokens_per_sec=900 step=4",
    "bad \udcff\udcfe utf8 NCCL INFO NET/OFI Selected provider is efa",  # raw 0xff 0xfe once encoded
    "multibyte ✓ 한국어 RTUI_METRIC {\"step\": 9, \"loss\": 1.5}",
    "",
]


def reference(data: bytes) -> tuple[int, list[str], list[str]]:
    """The definition: every complete line, decoded; NCCL lines to the analyser, else metric lines to the series."""
    nccl, series = [], []
    lines = data.split(b"\n")[:-1]  # what follows the last newline is not a line yet
    for raw in lines:
        line = raw.decode("utf-8", "replace")
        if "NCCL" in line:
            nccl.append(line)
        elif "RTUI_" in line or "THROUGHPUT" in line:
            series.append(line)
    return len(lines), nccl, series


def spied(monkeypatch: pytest.MonkeyPatch) -> tuple[Telemetry, list[str], list[str]]:
    """A Telemetry that also records every line it hands to each analyser (which still gets it)."""
    telemetry = Telemetry()
    nccl: list[str] = []
    series: list[str] = []
    nccl_feed, series_feed = telemetry.nccl.feed, telemetry.series.feed

    def to_nccl(line: str) -> None:
        nccl.append(line)
        nccl_feed(line)

    def to_series(line: str) -> bool:
        series.append(line)
        return series_feed(line)

    monkeypatch.setattr(telemetry.nccl, "feed", to_nccl)
    monkeypatch.setattr(telemetry.series, "feed", to_series)
    return telemetry, nccl, series


def a_log(rng: random.Random, seed: int) -> bytes:
    if rng.random() < 0.5:
        lines = list(run_log(rng.randrange(200, 4000), metric_every=rng.choice((3, 50, 400)), seed=seed))
    else:
        lines = list(training_log(rng.randrange(50, 3000), nccl_share=rng.choice((0.0, 0.05, 0.5)),
                                  metric_share=rng.choice((0.0, 0.005, 0.1)), seed=seed))
    for _ in range(rng.randrange(0, 12)):
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(ODD_LINES))
    if rng.random() < 0.3:
        lines.insert(rng.randrange(len(lines) + 1), "z" * rng.randrange(60_000, 300_000) + " NCCL long but kept")
    tail = rng.choice(("\n", "", "a:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via NET/Socket/0"))
    return ("\n".join(lines) + tail).encode("utf-8", "surrogateescape")


def cuts(rng: random.Random, size: int) -> list[int]:
    """Random chunk boundaries: single bytes, odd sizes, whole reads."""
    points, at = [], 0
    while at < size:
        points.append(at)
        at += rng.choice((1, 3, 113, 4096, 65_536, 300_000))
    return [*points, size]


@pytest.mark.parametrize("seed", range(30))
def test_live_bytes_cut_anywhere_hand_over_what_the_definition_gives(seed: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    data = a_log(rng, seed)
    telemetry, nccl, series = spied(monkeypatch)
    bounds = cuts(rng, len(data))
    for start, stop in zip(bounds, bounds[1:], strict=False):
        telemetry.feed_bytes(data[start:stop])
    assert (telemetry.lines, nccl, series) == reference(data)
    if not data.endswith(b"\n"):
        telemetry.end_of_stream()  # a finished stream's unterminated line counts after all
        assert (telemetry.lines, nccl, series) == reference(data + b"\n")


@pytest.mark.parametrize("seed", range(15))
def test_a_spool_read_while_it_grows_resumes_at_line_ends(seed: int, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(100 + seed)
    data = a_log(rng, seed)
    spool = tmp_path / "spool.log"
    spool.write_bytes(b"")
    telemetry, nccl, series = spied(monkeypatch)
    telemetry.replay_file(spool)
    bounds = cuts(rng, len(data))
    for start, stop in zip(bounds, bounds[1:], strict=False):
        with open(spool, "ab") as out:
            out.write(data[start:stop])
        telemetry.feed_from()
        # A resumed session starts here: right after the last complete line written so far.
        assert telemetry.spool_offset == data.rfind(b"\n", 0, stop) + 1
    assert (telemetry.lines, nccl, series) == reference(data)
    whole, whole_nccl, whole_series = spied(monkeypatch)
    assert whole.replay_file(spool) == telemetry.spool_offset
    assert (whole.lines, whole_nccl, whole_series) == reference(data)
    assert whole.transport == telemetry.transport and whole.series.points == telemetry.series.points


def test_lines_in_hand_are_routed_by_the_same_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    data = ("\n".join(ODD_LINES) + "\n").encode("utf-8", "surrogateescape")
    by_lines, nccl, series = spied(monkeypatch)
    assert by_lines.feed_lines(data.decode("utf-8", "replace").split("\n")[:-1]) == len(ODD_LINES)
    assert (by_lines.lines, nccl, series) == reference(data)
    one_by_one, nccl, series = spied(monkeypatch)
    for line in data.decode("utf-8", "replace").split("\n")[:-1]:
        one_by_one.feed(line)
    assert (one_by_one.lines, nccl, series) == reference(data)


def test_a_line_too_long_to_keep_is_skipped_and_its_bytes_consumed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    socket = "a:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0"
    metric = "RTUI_METRIC {\"step\": 1, \"tokens_per_s\": 5.0}"
    huge = "y" * (3 << 20) + " " + socket  # 3 MiB: far over the 1 MiB a line may hold
    spool = tmp_path / "spool.log"
    spool.write_text("\n".join([metric, huge, socket]) + "\n")
    telemetry, nccl, series = spied(monkeypatch)
    assert telemetry.replay_file(spool) == spool.stat().st_size == telemetry.spool_offset
    assert (telemetry.lines, nccl, series) == (2, [socket], [metric])
    assert telemetry._spool_splitter.dropped_lines == 1
