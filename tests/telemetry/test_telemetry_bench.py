"""A fast version of bench_parser.py in the normal suite: measured ratios, bounded memory.

The full measurement (>= 1M lines) is ``python tests/telemetry/bench_parser.py --sweep``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from tests.telemetry.bench_parser import measure, replay_ratios, write_log

# The goal is 0.5 on 1M lines (bench_parser.py measures 0.58-0.62 for the 16-rank run
# profile). On this 200k-line log the init bursts are a bigger share: it measures 0.42-0.52,
# where the design before the squeeze-guided search measured 0.26-0.28 (both on this machine,
# same script). The floor sits between them, with the median of five back-to-back pairs
# (each side best of two) absorbing bursts of load.
REPLAY_RATIO_FLOOR = 0.33


def test_parser_throughput_and_memory_are_measured(tmp_path: Path) -> None:
    path = tmp_path / "synthetic.log"
    write_log(path, 120_000)
    result = measure(path, runs=2)
    print(f"\nreplay/bare ratio {result['replay_ratio']:.2f}, "
          f"feed_lines/bare {result['feed_lines_ratio']:.2f}, "
          f"peak {result['peak_quarter_bytes'] / 1024:.0f} KiB for a quarter, "
          f"{result['peak_full_bytes'] / 1024:.0f} KiB for all")
    assert result["transport"] == "efa_gdr"
    assert 0.001 < result["nccl_share"] < 0.1
    assert result["points"] == min(4096, result["records"]) and result["records"] > 100
    # State is per process and the series is capped: a 4x longer input must not need 4x memory.
    assert result["peak_full_bytes"] < 1.5 * result["peak_quarter_bytes"] + 256 * 1024
    assert result["peak_full_bytes"] < 8 * 1024**2
    assert result["replay_ratio"] > 0.05


def test_replay_keeps_pace_with_a_bare_loop(tmp_path: Path) -> None:
    path = tmp_path / "synthetic.log"
    write_log(path, 200_000)
    ratio = statistics.median(replay_ratios(path, repeats=5))
    print(f"\nreplay/bare ratio, median of 5 on 200k lines: {ratio:.2f} (goal 0.5, floor {REPLAY_RATIO_FLOOR})")
    assert ratio >= REPLAY_RATIO_FLOOR
