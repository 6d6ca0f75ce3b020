"""What Ray token authentication costs the local target: the same head and the same tiny job,
with and without it, interleaved, in one script.

    .venv/bin/python bench/auth_cost.py [--reps 3]

Each run makes a marked cluster dir as rtui does, starts the head with rtui's own environment
(minus the token settings for the "off" side), times until the dashboard answers, then submits
a job that connects to the cluster (`ray.init()` in the driver) and times until it succeeded.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.config import RunConfig  # noqa: E402
from backend.errors import OperationError, TransientError  # noqa: E402
from backend.procs import free_ports, start_detached, terminate  # noqa: E402
from backend.rayjobs import RayJobs, submit_when_ready  # noqa: E402
from backend.retry import Backoff, Retrying  # noqa: E402
from backend.store import RunStore  # noqa: E402
from targets.local import cluster as lc  # noqa: E402
from targets.local.layer import PORT_NAMES, TOKEN_FILE, head_argv, jobs_for, ray_env  # noqa: E402

JOB = "python -c \"import ray; ray.init(); print(ray.cluster_resources()['CPU'])\""
# Each wait has a deadline: a head that never answers ends the bench with its log, not a hang.
DASHBOARD_S = 90.0
SUBMIT_S = 60.0
JOB_S = 120.0


class BenchFailed(Exception):
    pass


def _tries(deadline_s: float) -> Retrying:
    return Retrying(Backoff(0.2, factor=1.0), deadline_s=deadline_s, report=None)


def _log_tail(cluster: lc.ClusterDir) -> str:
    try:
        return "\n".join((cluster.path / "head.log").read_text(errors="replace").splitlines()[-15:])
    except OSError:
        return "(no head.log)"


async def one(token: bool) -> tuple[float, float]:
    # A run record owns the cluster, as in rtui: another rtui on the host sees whose cluster it is
    # (the marker's state dir) and never calls it an orphan while the bench runs.
    store = RunStore()
    store.ensure_writable()
    record = store.create(RunConfig(cluster_name="bench-auth"))
    ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
    facts: dict[str, Any] = {"ports": ports, "gcs_address": f"127.0.0.1:{ports['gcs']}",
                             "dashboard_url": f"http://127.0.0.1:{ports['dashboard']}", "state_dir": str(store.root)}
    cluster = lc.make_cluster_dir(record.run_id, "bench-auth", facts)
    env = ray_env(cluster)
    if token:
        (cluster.path / TOKEN_FILE).write_text(secrets.token_hex(32))
        jobs = jobs_for(cluster)
    else:
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
            env.pop(name)
        jobs = RayJobs(facts["dashboard_url"])
    assert jobs is not None
    started = time.monotonic()
    ref = start_detached(head_argv(cluster, ports, cpus=1), log_path=cluster.path / "head.log", env=env,
                         cwd=cluster.path)
    try:
        tries = _tries(DASHBOARD_S)
        while True:
            try:
                await jobs.version(timeout_s=1.0)
                break
            except TransientError:
                if not ref.alive() or not await tries.again():
                    raise BenchFailed(f"the dashboard did not answer in {tries.elapsed:.0f}s") from None
        up = time.monotonic() - started
        sid = f"b{secrets.token_hex(3)}"
        try:  # as rtui submits: waiting out a job agent that registers a little after the dashboard
            async for _ in submit_when_ready(jobs, timeout_s=SUBMIT_S, entrypoint=JOB, submission_id=sid,
                                             runtime_env={}, metadata={}):
                pass
        except OperationError as exc:
            raise BenchFailed(f"no job agent took the job: {exc}") from None
        tries = _tries(JOB_S)
        while not (status := await jobs.status(sid)).terminal:
            if not await tries.again():
                raise BenchFailed(f"the job was still {status.status} after {tries.elapsed:.0f}s")
        if status.status != "SUCCEEDED":
            raise BenchFailed(f"the job ended {status.status}: {status.message}")
        return up, time.monotonic() - started
    except BenchFailed as exc:
        raise BenchFailed(f"token {'on' if token else 'off'}: {exc}\n--- head.log ---\n{_log_tail(cluster)}") from None
    finally:
        terminate(lc.cluster_family(cluster.path))
        lc.remove_cluster_dir(cluster.path)
        store.path_for(record.run_id).unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    # Stopped from outside (a test's timeout, a shell's kill): the finally above still stops the head.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    try:
        for _ in range(args.reps):
            for token in (False, True):
                results[token].append(asyncio.run(one(token)))
                up, done = results[token][-1]
                print(f"token {'on ' if token else 'off'}: dashboard {up:.2f}s, job done {done:.2f}s", flush=True)
    except BenchFailed as exc:
        print(f"auth_cost: {exc}", file=sys.stderr)
        sys.exit(1)
    for token, rows in results.items():
        print(f"token {'on ' if token else 'off'}: median dashboard {statistics.median(r[0] for r in rows):.2f}s, "
              f"median job done {statistics.median(r[1] for r in rows):.2f}s")


if __name__ == "__main__":
    main()
