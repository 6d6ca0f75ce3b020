"""Replay speed vs a bare ``for line in f`` loop over the same file, in the same run (a script, not a test).

    python tests/telemetry/bench_parser.py [--lines 1000000] [--sweep] [--json]

The default log is one real 16-rank run as its Ray job log shows it (``nccl_synth.run_log``:
2 nodes x 8 ranks, every rank's NCCL INFO init on 2 communicators, again after one resume,
the training program's metric lines, the workers' chatter), so its NCCL INFO density is what
such a run gives a log of this length. ``--sweep`` adds the same run with 4x the channels and a
third communicator (NCCL chattier per rank, as on 8-GPU nodes with 32 channels), and logs with
NCCL lines spread evenly at higher shares, up to a log of nothing but NCCL init, to show where
the ratio falls.

For each log: the best of ``--runs`` timings of the bare loop, ``Telemetry.replay_file``
(what a resumed session pays for its spool) and ``Telemetry.feed_lines`` over the lines of a
text-mode file, each measured right after a bare loop; seconds, lines per second and the
throughput ratio to the bare loop. The goal (DESIGN.md §6) is a 1M-line spool in about a
second. Also the traced memory peak of replaying the whole file next to replaying its first
quarter (bounded state means the two match).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

# Runnable as a script from the repo root: the repo and this folder must be importable.
for _path in (Path(__file__).resolve().parents[2], Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from backend.telemetry import Telemetry  # noqa: E402
from tests.telemetry.nccl_synth import run_log, training_log  # noqa: E402

GOAL_S_PER_MILLION_LINES = 1.0
SWEEP_SHARES = (0.01, 0.05, 0.25)


def write_lines(path: Path, lines: Iterator[str]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(line + "\n" for line in lines)


def write_log(path: Path, n_lines: int, nccl_share: float | None = None, **run: int) -> None:
    """The run profile (``run`` overrides its settings) when ``nccl_share`` is None, else NCCL
    lines spread evenly at that share."""
    write_lines(path, run_log(n_lines, **run) if nccl_share is None else training_log(n_lines, nccl_share=nccl_share))


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


def parse(path: Path) -> Telemetry:
    telemetry = Telemetry()
    with open(path, encoding="utf-8", errors="replace") as f:
        telemetry.feed_lines(f)
    return telemetry


def replay(path: Path) -> Telemetry:
    telemetry = Telemetry()
    telemetry.replay_file(path)
    return telemetry


def traced_peak(path: Path) -> int:
    gc.collect()
    tracemalloc.start()
    replay(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def nccl_share_of(path: Path) -> float:
    with open(path, encoding="utf-8", errors="replace") as f:
        total = nccl = 0
        for line in f:
            total += 1
            nccl += "NCCL INFO" in line
    return nccl / max(total, 1)


def measure(path: Path, runs: int = 3) -> dict[str, Any]:
    """Timings of one log file, each against a bare loop timed right before it."""
    n_lines = bare_loop(path)
    bare_r = _best_of(runs, lambda: bare_loop(path))
    replayed = _best_of(runs, lambda: replay(path))
    bare_f = _best_of(runs, lambda: bare_loop(path))
    parsed = _best_of(runs, lambda: parse(path))
    telemetry, by_line = replay(path), parse(path)
    # Both paths must agree, or the faster one is not doing the same work.
    assert by_line.snapshot(tail=0).transport == telemetry.snapshot(tail=0).transport
    assert by_line.series.records == telemetry.series.records and by_line.lines == telemetry.lines == n_lines
    quarter = path.with_suffix(".quarter")
    with open(path, encoding="utf-8", errors="replace") as f:
        write_lines(quarter, (line.rstrip("\n") for line in islice(f, n_lines // 4)))
    return {
        "lines": n_lines,
        "mib": path.stat().st_size / 2**20,
        "nccl_share": nccl_share_of(path),
        "bare_s": bare_r,
        "bare_lines_per_s": n_lines / bare_r,
        "replay_s": replayed,
        "replay_ratio": bare_r / replayed,
        "feed_lines_s": parsed,
        "feed_lines_ratio": bare_f / parsed,
        "replay_lines_per_s": n_lines / replayed,
        "peak_quarter_bytes": traced_peak(quarter),
        "peak_full_bytes": traced_peak(path),
        "transport": telemetry.transport.transport,
        "points": len(telemetry.series),
        "records": telemetry.series.records,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sweep", action="store_true", help="also logs with NCCL lines spread evenly")
    parser.add_argument("--json", action="store_true", help="one JSON object per log")
    args = parser.parse_args(argv)
    logs: list[tuple[str, float | None, dict[str, int]]] = [("16-rank run", None, {})]
    if args.sweep:
        logs += [("same, 32ch 3 comms", None, {"channels": 32, "communicators": 3})]
        logs += [(f"even {share:.0%} NCCL", share, {}) for share in SWEEP_SHARES] + [("NCCL init only", 1.0, {})]
    if not args.json:
        print(f"{'log':<18} {'lines':>9} {'MiB':>6} {'NCCL':>6} {'bare s':>7} {'replay s':>8} {'lines/s':>9} "
              f"{'replay/bare':>11} {'feed_lines/bare':>15} {'peak 1/4 → full KiB':>20}  verdict")
    with tempfile.TemporaryDirectory() as tmp:
        for name, share, run in logs:
            path = Path(tmp) / "synthetic.log"
            write_log(path, args.lines, share, **run)
            r = measure(path, args.runs)
            if args.json:
                print(json.dumps({"log": name, **r}))
                continue
            print(f"{name:<18} {r['lines']:>9,} {r['mib']:>6.1f} {r['nccl_share']:>6.1%} {r['bare_s']:>7.3f} "
                  f"{r['replay_s']:>8.3f} {r['replay_lines_per_s']:>9.3g} {r['replay_ratio']:>11.2f} "
                  f"{r['feed_lines_ratio']:>15.2f} "
                  f"{r['peak_quarter_bytes'] / 1024:>9.0f} → {r['peak_full_bytes'] / 1024:>6.0f}  "
                  f"{r['transport']}")
    if not args.json:
        print(f"goal: replay of 1M lines in about {GOAL_S_PER_MILLION_LINES:g} s (ratios are of throughput; "
              f"bare loop and parser timed back to back, best of {args.runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
