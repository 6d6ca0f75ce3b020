"""Time from `rtui up` to the first training-step event, for one or more checkouts, interleaved.

    .venv/bin/python bench/first_metric.py [--reps 2] ROOT [ROOT ...]

Each ROOT is a checkout of rtui run with this venv (PYTHONPATH=ROOT). Every run uses a fresh
state dir, trains 3 steps, and is torn down by the same checkout. Prints the median per root.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RTUI = str(Path(sys.executable).parent / "rtui")


def one(root: str) -> float:
    # A fresh state dir for each run, removed with everything in it once the run is down.
    with tempfile.TemporaryDirectory(prefix="rtui-bench-") as tmp:
        env = {**os.environ, "PYTHONPATH": root, "RTUI_STATE_DIR": f"{tmp}/state"}
        started = time.monotonic()
        proc = subprocess.Popen([RTUI, "up", "--yes", "--json", "--steps", "3"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, cwd=tmp)
        first = None
        assert proc.stdout is not None
        for line in proc.stdout:
            event = json.loads(line)
            if first is None and event["step"] == "train" and event["kind"] == "progress" \
                    and event["message"].startswith("step"):
                first = time.monotonic() - started
        proc.wait()
        subprocess.run([RTUI, "down", "--yes"], env=env, capture_output=True, cwd=tmp, check=False)
    if first is None:
        raise SystemExit(f"{root}: no training step seen (exit {proc.returncode})")
    return first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("roots", nargs="+")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    times: dict[str, list[float]] = {r: [] for r in args.roots}
    for _ in range(args.reps):
        for root in args.roots:
            times[root].append(one(root))
            print(f"{root}: {times[root][-1]:.1f}s", flush=True)
    for root, values in times.items():
        print(f"{root}: median {statistics.median(values):.1f}s over {len(values)} runs")


if __name__ == "__main__":
    main()
