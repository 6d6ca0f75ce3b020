"""Replaying a long spool needs no more memory than replaying a short one.

Speed is measured, not tested: ``python tests/telemetry/bench_parser.py``. On a shared
machine a wall-clock floor measures the neighbours' load as much as the code.
"""

from __future__ import annotations

from itertools import islice
from pathlib import Path

from tests.telemetry.bench_parser import replay, traced_peak, write_lines
from tests.telemetry.nccl_synth import run_log


def test_replay_memory_does_not_grow_with_the_spool(tmp_path: Path) -> None:
    full, quarter = tmp_path / "full.log", tmp_path / "quarter.log"
    write_lines(full, run_log(120_000))
    write_lines(quarter, islice(run_log(120_000), 30_000))
    telemetry = replay(full)
    assert telemetry.transport.transport == "efa_gdr" and telemetry.lines == 120_000
    assert telemetry.series.records > 100 and len(telemetry.series) == min(4096, telemetry.series.records)
    peak_quarter, peak_full = traced_peak(quarter), traced_peak(full)
    # State is per process and the series is capped: 4x the input must not need 4x the memory.
    assert peak_full < 1.5 * peak_quarter + 256 * 1024
    assert peak_full < 8 * 1024**2
