"""Time from `rtui up` to the first training-step event, to the end of `up`, and of the `down` after
it, for one or more checkouts, interleaved; with ``--floor``, what Ray itself takes on the same head.

    .venv/bin/python bench/first_metric.py [--reps 2] [--floor] ROOT [ROOT ...]

Each ROOT is a checkout of rtui run with this venv (PYTHONPATH=ROOT). Every run uses a fresh
state dir, trains 3 steps, and is torn down by the same checkout. Prints the medians per root, and
each root's against the first's.

``--floor``: before the `down`, on the head that run started (warm now), a second `rtui up` of the
same run (4 steps: a new job) is timed from its submission to its first step, beside two jobs submitted straight to the
same head's Jobs API: one that prints a line (Ray's job floor) and one whose Ray Train function, on
as many CPU workers as rtui's job, prints a line and returns (Ray Train's floor: no torch process
group, no model). rtui's warm job over the Ray Train floor is what rtui's program adds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.rayjobs import RayJobs  # noqa: E402
from backend.retry import Backoff, Retrying  # noqa: E402
from targets.local import cluster as lc  # noqa: E402
from targets.local.layer import jobs_for  # noqa: E402

RTUI = str(Path(sys.executable).parent / "rtui")
PHASES = ("first metric", "up", "down")
FLOOR_PHASES = ("rtui job to first metric", "Ray Train floor", "Ray job floor")
MARK = "rtui-bench-floor: first line"
# Prints MARK without holding it: Ray's job log starts with the entrypoint's own text.
PRINT_MARK = "print('rtui-bench-floor:', 'first line', flush=True)"
TRIVIAL_JOB = f"python -c {shlex.quote(PRINT_MARK)}"
# Ray Train's own start on the head: the controller, its helper actors, the worker group, the function.
TRAIN_FLOOR = """
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

def first(config):
    {print_mark}

ray.init()
DataParallelTrainer(first, scaling_config=ScalingConfig(num_workers={workers}, resources_per_worker={{"CPU": 1}}),
                    run_config=RunConfig(storage_path={storage!r})).fit()
"""
JOB_S = 300.0  # a floor job that shows no line by then ends the bench with what it printed


def rtui_up(env: dict[str, str], cwd: str, steps: int) -> tuple[float | None, float | None, float, int]:
    """Seconds from the start of `rtui up` to the job's submission and to the first training-step event
    (None: not seen), to the end of `up`; and its exit code."""
    started = time.monotonic()
    proc = subprocess.Popen([RTUI, "up", "--yes", "--json", "--steps", str(steps)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=cwd)
    submitted = first = None
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if submitted is None and event["step"].startswith("ray.job.") and event["kind"] == "done":
            submitted = time.monotonic() - started
        if first is None and event["step"] == "train" and event["kind"] == "progress" \
                and event["message"].startswith("step"):
            first = time.monotonic() - started
    proc.wait()
    return submitted, first, time.monotonic() - started, proc.returncode


async def first_line(jobs: RayJobs, entrypoint: str) -> float:
    """Seconds from submitting ``entrypoint`` to its log holding MARK; it then runs to its end."""
    sid = f"bench-floor-{secrets.token_hex(3)}"
    started = time.monotonic()
    await jobs.submit(entrypoint=entrypoint, submission_id=sid, runtime_env={}, metadata={})
    tries = Retrying(Backoff(0.05, factor=1.0), deadline_s=JOB_S, report=None)
    while MARK not in (log := await jobs.logs(sid)):
        if (await jobs.status(sid)).terminal or not await tries.again():
            raise SystemExit(f"first_metric: the floor job printed no first line:\n{log[-2000:]}")
    took = time.monotonic() - started
    while not (await jobs.status(sid)).terminal:  # the next job gets the whole head
        await tries.again()
    return took


async def floors(run_id: str, storage: str) -> tuple[float, float]:
    clusters = lc.find_clusters(run_id=run_id)
    jobs = jobs_for(clusters[0]) if clusters else None
    if jobs is None:
        raise SystemExit(f"first_metric: no local cluster of run {run_id} to measure the floor on")
    async with jobs:
        script = TRAIN_FLOOR.format(print_mark=PRINT_MARK, workers=2, storage=storage)
        train = await first_line(jobs, f"python -c {shlex.quote(script)}")
        trivial = await first_line(jobs, TRIVIAL_JOB)
    return train, trivial


def one(root: str, floor: bool) -> tuple[tuple[float, float, float], tuple[float, float, float] | None]:
    # A fresh state dir for each run, removed with everything in it once the run is down.
    with tempfile.TemporaryDirectory(prefix="rtui-bench-") as tmp:
        env = {**os.environ, "PYTHONPATH": root, "RTUI_STATE_DIR": f"{tmp}/state"}
        _, first, up, code = rtui_up(env, tmp, 3)
        measured = None
        try:
            if first is None:
                raise SystemExit(f"{root}: no training step seen (exit {code})")
            if floor:
                submitted, warm_first, _, code = rtui_up(env, tmp, 4)
                if submitted is None or warm_first is None:
                    raise SystemExit(f"{root}: no training step seen in the second job (exit {code})")
                warm = warm_first - submitted  # from its submission, as the floors are timed
                run_id = next(Path(tmp, "state", "runs").glob("*.json")).stem
                train, trivial = asyncio.run(floors(run_id, f"{tmp}/floor-results"))
                measured = (warm, train, trivial)
        finally:
            down_started = time.monotonic()
            subprocess.run([RTUI, "down", "--yes"], env=env, capture_output=True, cwd=tmp, check=False)
            down = time.monotonic() - down_started
    return (first, up, down), measured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("roots", nargs="+")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--floor", action="store_true", help="also time Ray's own floor on each run's head")
    args = parser.parse_args()
    times: dict[str, list[tuple[float, float, float]]] = {r: [] for r in args.roots}
    floor_times: dict[str, list[tuple[float, float, float]]] = {r: [] for r in args.roots}
    for _ in range(args.reps):
        for root in args.roots:
            phases, measured = one(root, args.floor)
            times[root].append(phases)
            line = ", ".join(f"{name} {t:.1f}s" for name, t in zip(PHASES, phases, strict=True))
            if measured is not None:
                floor_times[root].append(measured)
                line += "; warm head: " + ", ".join(f"{name} {t:.1f}s" for name, t in
                                                     zip(FLOOR_PHASES, measured, strict=True))
            print(f"{root}: {line}", flush=True)
    medians = {root: [statistics.median(run[i] for run in values) for i in range(len(PHASES))]
               for root, values in times.items()}
    base = medians[args.roots[0]]
    for root, values in medians.items():
        print(f"{root}: median over {len(times[root])} runs: "
              + ", ".join(f"{name} {t:.1f}s ({t / b:.2f}x)" for name, t, b in zip(PHASES, values, base, strict=True)))
        rows = floor_times[root]
        if rows:
            warm, train, trivial = (statistics.median(r[i] for r in rows) for i in range(3))
            print(f"{root}: warm head, median over {len(rows)}: rtui job to first metric {warm:.1f}s, "
                  f"Ray Train floor {train:.1f}s, Ray job floor {trivial:.1f}s; "
                  f"rtui / Ray Train floor {warm / train:.2f}x")


if __name__ == "__main__":
    main()
