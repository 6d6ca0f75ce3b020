"""Time from `rtui up` to the first training-step event, to the end of `up`, and of the `down` after
it, for one or more checkouts, interleaved.

    .venv/bin/python bench/first_metric.py [--reps 2] ROOT [ROOT ...]

Each ROOT is a checkout of rtui run with this venv (PYTHONPATH=ROOT). Every run uses a fresh
state dir, trains 3 steps, and is torn down by the same checkout. Prints the medians per root, and
each root's against the first's.
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


PHASES = ("first metric", "up", "down")


def one(root: str) -> tuple[float, float, float]:
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
        up = time.monotonic() - started
        down_started = time.monotonic()
        subprocess.run([RTUI, "down", "--yes"], env=env, capture_output=True, cwd=tmp, check=False)
        down = time.monotonic() - down_started
    if first is None:
        raise SystemExit(f"{root}: no training step seen (exit {proc.returncode})")
    return first, up, down


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("roots", nargs="+")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    times: dict[str, list[tuple[float, float, float]]] = {r: [] for r in args.roots}
    for _ in range(args.reps):
        for root in args.roots:
            times[root].append(one(root))
            print(f"{root}: " + ", ".join(f"{name} {t:.1f}s" for name, t in zip(PHASES, times[root][-1], strict=True)),
                  flush=True)
    medians = {root: [statistics.median(run[i] for run in values) for i in range(len(PHASES))]
               for root, values in times.items()}
    base = medians[args.roots[0]]
    for root, values in medians.items():
        print(f"{root}: median over {len(times[root])} runs: "
              + ", ".join(f"{name} {t:.1f}s ({t / b:.2f}x)" for name, t, b in zip(PHASES, values, base, strict=True)))


if __name__ == "__main__":
    main()
