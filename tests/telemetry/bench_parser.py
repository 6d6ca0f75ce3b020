"""Parser throughput vs a bare ``for line in f`` loop over the same file, in the same run.

    python tests/telemetry/bench_parser.py [--lines 1000000] [--nccl-share 0.05]

Prints both rates, their ratio (goal >= 0.5) and the traced memory peak of a full parse
next to that of a parse of a quarter of the file (bounded state means the two match).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Runnable as a script from the repo root: the repo and this folder must be importable.
for _path in (Path(__file__).resolve().parents[2], Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from backend.telemetry import Telemetry  # noqa: E402
from tests.telemetry.nccl_synth import training_log  # noqa: E402


def write_log(path: Path, n_lines: int, nccl_share: float) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(line + "\n" for line in training_log(n_lines, nccl_share=nccl_share))


def _best_of(runs: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bare_loop(path: Path) -> int:
    count = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for _line in f:
            count += 1
    return count


def parse(path: Path, limit: int | None = None) -> Telemetry:
    telemetry = Telemetry()
    with open(path, encoding="utf-8", errors="replace") as f:
        if limit is None:
            telemetry.feed_lines(f)
        else:
            telemetry.feed_lines(line for i, line in zip(range(limit), f, strict=False))
    return telemetry


def replay(path: Path) -> Telemetry:
    telemetry = Telemetry()
    telemetry.replay_file(path)
    return telemetry


def replay_ratios(path: Path, repeats: int = 3) -> list[float]:
    """bare/replay throughput ratios, each pair measured back to back (load hits both alike)."""
    return [_best_of(1, lambda: bare_loop(path)) / _best_of(1, lambda: replay(path)) for _ in range(repeats)]


def traced_peak(path: Path, limit: int | None) -> int:
    gc.collect()
    tracemalloc.start()
    if limit is None:
        replay(path)
    else:
        parse(path, limit)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def measure(path: Path, n_lines: int, runs: int = 3) -> dict[str, Any]:
    bare = _best_of(runs, lambda: bare_loop(path))
    parsed = _best_of(runs, lambda: parse(path))
    replayed = _best_of(runs, lambda: replay(path))
    telemetry = replay(path)
    by_line = parse(path)
    assert by_line.snapshot(tail=0)["transport"] == telemetry.snapshot(tail=0)["transport"]
    assert by_line.series.records == telemetry.series.records and by_line.lines == telemetry.lines
    return {
        "replay_s": replayed,
        "replay_lines_per_s": n_lines / replayed,
        "replay_ratio": bare / replayed,
        "lines": n_lines,
        "bare_s": bare,
        "parser_s": parsed,
        "bare_lines_per_s": n_lines / bare,
        "parser_lines_per_s": n_lines / parsed,
        "feed_lines_ratio": bare / parsed,
        "peak_quarter_bytes": traced_peak(path, n_lines // 4),
        "peak_full_bytes": traced_peak(path, None),
        "transport": telemetry.transport.transport,
        "points": len(telemetry.series),
        "records": telemetry.series.records,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--nccl-share", type=float, default=0.05)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.log"
        write_log(path, args.lines, args.nccl_share)
        size = path.stat().st_size
        r = measure(path, args.lines, args.runs)
    print(f"file: {args.lines:,} lines, {size / 2**20:.1f} MiB, NCCL share {args.nccl_share:.0%}")
    print(f"bare `for line in f`: {r['bare_s']:.3f} s ({r['bare_lines_per_s']:,.0f} lines/s)")
    print(f"Telemetry.replay_file (block scan): {r['replay_s']:.3f} s "
          f"({r['replay_lines_per_s']:,.0f} lines/s), ratio to bare {r['replay_ratio']:.2f} (goal >= 0.5)")
    print(f"Telemetry.feed_lines (str per line, live path): {r['parser_s']:.3f} s "
          f"({r['parser_lines_per_s']:,.0f} lines/s), ratio to bare {r['feed_lines_ratio']:.2f}")
    print(f"traced peak: feed_lines over a quarter of the file {r['peak_quarter_bytes'] / 2**10:.0f} KiB, "
          f"replay_file of the full file {r['peak_full_bytes'] / 2**10:.0f} KiB")
    print(f"verdict {r['transport']}, metric points {r['points']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
