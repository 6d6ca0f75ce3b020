"""The block scanner against the plain definition: every NCCL line and metric line, exactly."""

from __future__ import annotations

import random

import pytest

from tests.telemetry.nccl_synth import training_log
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
