"""A fast version of bench_parser.py in the normal suite: measured ratios, bounded memory.

The full measurement (>= 1M lines) is ``python tests/telemetry/bench_parser.py``.
"""

from __future__ import annotations

from pathlib import Path

from tests.telemetry.bench_parser import measure, write_log


def test_parser_throughput_and_memory_are_measured(tmp_path: Path) -> None:
    path = tmp_path / "synthetic.log"
    n_lines = 120_000
    write_log(path, n_lines, nccl_share=0.05)
    result = measure(path, n_lines, runs=2)
    print(f"\nreplay/bare ratio {result['replay_ratio']:.2f}, "
          f"feed_lines/bare {result['feed_lines_ratio']:.2f}, "
          f"peak {result['peak_full_bytes'] / 1024:.0f} KiB")
    assert result["transport"] == "efa_gdr"
    assert result["points"] == min(4096, result["records"]) and result["records"] > 100
    # State is per process and the series is capped: a 4x longer input must not need 4x memory.
    assert result["peak_full_bytes"] < 2 * result["peak_quarter_bytes"] + 512 * 1024
    assert result["peak_full_bytes"] < 8 * 1024**2
    # A gross-regression guard only; the goal (>= 0.5) is reported by bench_parser.py.
    assert result["replay_ratio"] > 0.05
