"""bench/kube_up.py runs both orders on the same simulated cluster to the end and reports their ratio.

The ratio itself (goal 0.75, measured 0.64-0.70 on a quiet machine) is the benchmark's figure, reported
by `python bench/kube_up.py`, never a pass/fail threshold here: on a loaded machine it drifts (0.92 seen)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "kube_up.py"


def test_the_plan_overlaps_what_the_seed_does_one_after_another() -> None:
    # One simulated minute = 0.4 s: long enough that the emulator's own CPU time (applying 2 MB of
    # CRDs) stays small beside the simulated waits on a loaded 2-core machine; ~12 s in all.
    done = subprocess.run([sys.executable, str(BENCH), "--reps", "1", "--minute", "0.4"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert float(last.split("ratio ")[1].split()[0]) > 0, last  # both orders finished and were timed
