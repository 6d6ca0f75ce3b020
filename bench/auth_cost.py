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
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.layers import local_cluster as lc  # noqa: E402
from backend.layers.local_ray import OBJECT_STORE_BYTES, PORT_NAMES, TOKEN_FILE, jobs_for, ray_env, ray_start  # noqa: E402
from backend.procs import free_ports, start_detached, terminate  # noqa: E402
from backend.rayjobs import RayJobs  # noqa: E402

JOB = "python -c \"import ray; ray.init(); print(ray.cluster_resources()['CPU'])\""


async def one(token: bool) -> tuple[float, float]:
    ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
    facts: dict[str, Any] = {"ports": ports, "gcs_address": f"127.0.0.1:{ports['gcs']}",
             "dashboard_url": f"http://127.0.0.1:{ports['dashboard']}", "state_dir": "bench"}
    cluster = lc.make_cluster_dir(f"bench{secrets.token_hex(2)}", "bench", facts)
    env = ray_env(cluster)
    if token:
        (cluster.path / TOKEN_FILE).write_text(secrets.token_hex(32))
        jobs = jobs_for(cluster)
    else:
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
            env.pop(name)
        jobs = RayJobs(facts["dashboard_url"])
    assert jobs is not None
    argv = ray_start("--head", f"--temp-dir={cluster.ray_dir}", "--node-ip-address=127.0.0.1",
                     f"--port={ports['gcs']}", "--num-cpus=1", f"--object-store-memory={OBJECT_STORE_BYTES}",
                     "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={ports['dashboard']}",
                     f"--ray-client-server-port={ports['client']}", "--disable-usage-stats")
    started = time.monotonic()
    start_detached(argv, log_path=cluster.path / "head.log", env=env, cwd=cluster.path)
    try:
        while True:
            try:
                await jobs.version(timeout_s=1.0)
                break
            except Exception:  # noqa: BLE001 - still starting
                await asyncio.sleep(0.2)
        up = time.monotonic() - started
        while True:
            try:
                sid = await jobs.submit(entrypoint=JOB, submission_id=f"b{secrets.token_hex(3)}", runtime_env={},
                                        metadata={})
                break
            except Exception:  # noqa: BLE001 - the job agent registers a little after the dashboard
                await asyncio.sleep(0.2)
        while not (status := await jobs.status(sid)).terminal:
            await asyncio.sleep(0.2)
        assert status.status == "SUCCEEDED", status
        return up, time.monotonic() - started
    finally:
        terminate(lc.cluster_family(cluster.path))
        lc.remove_cluster_dir(cluster.path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(args.reps):
        for token in (False, True):
            results[token].append(asyncio.run(one(token)))
            up, done = results[token][-1]
            print(f"token {'on ' if token else 'off'}: dashboard {up:.2f}s, job done {done:.2f}s", flush=True)
    for token, rows in results.items():
        print(f"token {'on ' if token else 'off'}: median dashboard {statistics.median(r[0] for r in rows):.2f}s, "
              f"median job done {statistics.median(r[1] for r in rows):.2f}s")


if __name__ == "__main__":
    main()
