"""The block scanner against the plain definition: every NCCL line and metric line, exactly."""

from __future__ import annotations

import random

import pytest

from tests.telemetry.nccl_synth import run_log, training_log
from training.logparse import scan
from training.logparse.nccl import INFO_WORDS
from training.logparse.scan import _WINDOW, scan_block


def reference(block: bytes) -> tuple[int, list[str], list[str]]:
    nccl, series = [], []
    for raw in block.split(b"\n")[:-1]:
        line = raw.decode("utf-8", "replace")
        if "NCCL" in line:
            at = raw.find(b"NCCL INFO ")
            if at < 0 or INFO_WORDS.matter(raw + b"\n", at + 10):
                nccl.append(line)
        elif "RTUI_" in line or "THROUGHPUT" in line:
            series.append(line)
    return block.count(b"\n"), nccl, series


ODD_LINES = [
    "x:1:2 [0] NCCL WARN NET/OFI aws-ofi-nccl initialization failed",
    "NCCL_DEBUG=INFO NCCL_NET=ofi",
    "a:1:2 [0] NCCL INFO Setting affinity NCCL INFO Channel 00/0 : 0[0] -> 1[0] via NET/Socket/0",
    "a:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via NET/Socket/0 NCCL again",
    "N-C-C-L is not NCCL? R.T.U.I._ THR OUGHPUT",  # letters the squeeze joins
    "NxCCL RxTUI_ TxHROUGHPUT",
    "a:1:2 [0] NCCL INFO plugin/net.cc:118 -> 2",
    "a:1:2 [0] NCCL INFO Connected",
    "a:1:2 [0] NCCL INFO ",
    "a:1:2 [0] NCCL INFO Channel\r",
    "RTUI_METRIC {\"step\": 1} and NCCL",
    "THROUGHPUT steps_per_sec=1 RTUI_ RTUI_",
    "bad \xff\xfe utf8 NCCL INFO NET/OFI Selected provider is efa",
    "",
]


@pytest.mark.parametrize("seed", range(40))
def test_scan_block_matches_the_plain_definition(seed: int) -> None:
    rng = random.Random(seed)
    lines = list(training_log(rng.randrange(50, 3000), nccl_share=rng.choice((0.0, 0.05, 0.5)),
                              metric_share=rng.choice((0.0, 0.005, 0.1)), seed=seed))
    for _ in range(rng.randrange(0, 8)):
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(ODD_LINES))
    if rng.random() < 0.3:  # a line across the search window boundary
        lines.insert(0, "y" * (_WINDOW - rng.randrange(0, 20)))
    block = "\n".join(lines).encode("utf-8", "surrogateescape") + b"\n"
    assert scan_block(block, INFO_WORDS) == reference(block)


def test_scan_block_of_only_odd_lines() -> None:
    for line in ODD_LINES:
        block = (line + "\n").encode() * 3
        assert scan_block(block, INFO_WORDS) == reference(block), line


def _complete_lines(chunk: bytes, skip_head: bool) -> bytes:
    lo = chunk.find(b"\n") + 1 if skip_head else 0
    hi = chunk.rfind(b"\n") + 1
    return chunk[lo:hi] if hi > lo else b""


@pytest.mark.parametrize("seed", range(30))
def test_a_chunk_is_scanned_in_place_between_its_first_and_last_newline(seed: int) -> None:
    rng = random.Random(1000 + seed)
    lines = list(run_log(rng.randrange(200, 4000), metric_every=rng.choice((3, 50, 400)), seed=seed))
    for _ in range(rng.randrange(0, 6)):
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(ODD_LINES))
    data = "\n".join(lines).encode("utf-8", "surrogateescape") + b"\n"
    a = rng.randrange(len(data) // 3)
    b = rng.randrange(a + 1, len(data) + 1)
    chunk = data[a:b]
    for skip_head in (False, True):
        expected = reference(_complete_lines(chunk, skip_head))
        assert scan_block(chunk, INFO_WORDS, skip_head=skip_head) == expected


def test_rare_markers_are_found_near_their_estimate_without_a_whole_block_search(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    # Lines of very different lengths: the estimate is off by kilobytes and its window must widen.
    noise = ["short", "x" * 900, "y" * 12_000, "TORCH_CUDA_ARCH_LIST is not set", "z" * 40]
    lines = [rng.choice(noise) for _ in range(3000)]
    marked = sorted(rng.sample(range(len(lines)), 12))
    for i in marked:
        lines[i] = f"(RayTrainWorker pid=1, ip=10.0.0.1) RTUI_METRIC {{\"step\": {i}}}"
    block = ("\n".join(lines) + "\n").encode()
    calls: list[bytes] = []
    real_find_all = scan.find_all
    monkeypatch.setattr(scan, "find_all", lambda *args: calls.append(args[1]) or real_find_all(*args))
    count, nccl, series = scan_block(block, INFO_WORDS)
    assert (count, nccl, series) == reference(block)
    assert [int(s.split(": ")[1].rstrip("}")) for s in series] == marked
    assert calls == []  # no whole-block search was needed


def test_a_marker_the_squeeze_made_up_falls_back_to_the_exact_search() -> None:
    # "RxTUI_" squeezes to the form of RTUI_ ("UI_"): the count check catches it.
    lines = ["pad " * 40] * 400
    lines[100] = "QUIT_ now: RxTUI_ is not a record"
    lines[300] = "(RayTrainWorker pid=1, ip=10.0.0.1) RTUI_METRIC {\"step\": 1}"
    block = ("\n".join(lines) + "\n").encode()
    assert scan.squeeze(block).count(b"UI_") == 3
    assert scan_block(block, INFO_WORDS) == reference(block)
    assert scan_block(block, INFO_WORDS)[2] == [lines[300]]


@pytest.mark.parametrize("seed", range(20))
def test_locate_finds_exactly_what_a_plain_search_finds(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = [b"NCCL", b"RTUI_", b"THROUGHPUT", b"N", b"CCL", b"UI_", b"\n", b"  ", b"RTUI", b"THROUGHPU",
                b"x" * 50, b"y" * 500]
    weights = [1, 1, 1, 3, 3, 3, 20, 20, 2, 2, 30, 3]
    block = b"".join(rng.choices(alphabet, weights, k=rng.randrange(10, 4000))) + b"\n"
    squeezed = scan.squeeze(block)
    for marker in (scan.NCCL, *scan.SERIES_MARKERS):
        expected = scan._all(squeezed, scan._FORMS[marker])
        found = scan.locate(block, squeezed, marker, expected, squeezed.count(b"\n"), 0, len(block)) if expected else []
        assert found == scan.find_all(block, marker)
