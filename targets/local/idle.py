"""A local cluster's watcher: ``python -m targets.local.idle <cluster dir> <seconds>``. It stops the
cluster left idle (issue 26, item 4; 0 seconds: never), and starts anew a worker node whose processes
ended (issue 41: what a node group does for a node it lost).

A local cluster has no autoscaler to lend, so the head's start leaves this small watcher beside
it, detached like Ray's own processes and recorded in the marker as one of the cluster's roots (so
``rtui down`` stops it with the rest). Every few seconds it asks the head's Jobs API
whether a job is pending or running, and the run's lock whether an rtui is attached. After
``seconds`` with neither, it takes the run's lock (no rtui attaches meanwhile), stops the cluster's
Ray processes by pid (only those rtui started: ``local_cluster.cluster_family``), and says so in
the marker and in the run's record (``facts["stopped_while_idle"]``). The dir stays, with the
results the jobs wrote in it; the ledger keeps it as the head's resource, so ``rtui down`` removes it and a new
``rtui up`` replaces the stopped head.

The worker nodes a run wants are in the marker (``layer.WORKER_NODES``, written once a node joined,
dropped before rtui stops one): one of them with no ``ray start`` process left is started again with
the same name and CPUs, and the marker notes the loss (``layer.NODE_LOSSES``), which `rtui status` and
the run screen give as the cause of the job's restart. A cluster with worker nodes gets the watcher
even without an idle stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path

from backend.errors import RtuiError
from backend.procs import stop_group
from backend.record import StoppedWhileIdle
from backend.store import RunLockedError, RunStore
from targets.local import cluster as lc
from targets.local.layer import NODE_LOSSES, WORKER_NODES, jobs_for, start_worker_node

POLL_MAX_S = 5.0
# What took a job's node, as the run screen and `rtui status` say it ("interrupted at step 6 (worker node
# lost), resumed …"): the watcher saw the node's processes gone and started it anew.
LOST_WORKER = "worker node lost"
REPLACE_AGAIN_S = 60.0  # a worker node that ends again this soon after its start is not started again


async def busy(cluster: lc.ClusterDir) -> bool:
    """A job pending or running; an unanswered question counts as busy (never stop on a doubt)."""
    jobs = jobs_for(cluster)
    if jobs is None:
        return True
    try:
        async with jobs:
            return any(not job.terminal for job in await jobs.list())
    except RtuiError:
        return True


def stop(cluster: lc.ClusterDir, idle_s: float, store_root: Path | None) -> bool:
    """Stop the cluster's processes under the run's lock; False when an rtui holds the run."""
    store = RunStore(store_root) if store_root is not None else None
    hold = store.lock(cluster.run_id) if store is not None else contextlib.nullcontext()
    try:
        with hold:
            at = time.time()
            cluster.facts["stopped_while_idle"] = {"at": at, "idle_s": idle_s}
            lc.write_marker(cluster)
            # Never this process (a recorded root too); looked up again while the cluster stops.
            stop_group(lambda: lc.cluster_family(cluster), grace_s=lc.STOP_GRACE_S)
            if store is not None:
                with contextlib.suppress(RtuiError, OSError):
                    record = store.load(cluster.run_id)
                    record.facts.stopped_while_idle = StoppedWhileIdle(at=at, idle_s=idle_s, dir=str(cluster.path))
                    store.save(record)
    except RunLockedError:
        return False
    return True


def replace_lost_workers(cluster: lc.ClusterDir, replaced: dict[int, float]) -> list[str]:
    """Start anew each worker node the run wants (``layer.WORKER_NODES``) whose processes ended, as a
    node group replaces a node it lost, and note each in the marker (``layer.NODE_LOSSES``): a job that
    may restart (``--max-failures``) then finds the workers it had. ``replaced``: when each index was
    last started here; one that ends again within ``REPLACE_AGAIN_S`` is left (a node that cannot start
    would be started forever). The names of the nodes started."""
    wanted = cluster.facts.get(WORKER_NODES) or {}
    running = lc.node_procs(cluster).workers if wanted else {}
    started = []
    for key, cpus in sorted(wanted.items()):
        index = int(key)
        if index in running or time.monotonic() - replaced.get(index, -REPLACE_AGAIN_S) < REPLACE_AGAIN_S:
            continue
        fresh = lc.read_marker(cluster.path)  # `rtui down` or a smaller plan may have let it go just now
        if fresh is None or key not in (fresh.facts.get(WORKER_NODES) or {}):
            continue
        start_worker_node(fresh, index, int(cpus))
        replaced[index] = time.monotonic()
        name = lc.node_name(fresh.cluster_name, index)
        noted = lc.read_marker(cluster.path) or fresh
        noted.facts[NODE_LOSSES] = [*(noted.facts.get(NODE_LOSSES) or []),
                                    {"at": time.time(), "node": name, "cause": LOST_WORKER}]
        lc.write_marker(noted)
        started.append(name)
    return started


async def watch(path: Path, idle_s: float) -> str:
    """Watch until the cluster is stopped here (``"stopped"``) or goes some other way (``"gone"``);
    ``idle_s`` 0: never stop it for idleness, only replace its lost worker nodes."""
    poll = max(0.2, min(POLL_MAX_S, idle_s / 4)) if idle_s else POLL_MAX_S
    since = time.monotonic()
    replaced: dict[int, float] = {}
    while True:
        await asyncio.sleep(poll)
        cluster = lc.read_marker(path)
        if cluster is None or lc.node_procs(cluster).head is None:
            return "gone"  # torn down, or stopped by someone else: nothing left to watch
        for name in replace_lost_workers(cluster, replaced):
            print(f"rtui watcher: {name} stopped; started it anew", flush=True)
        if not idle_s:
            continue
        root = cluster.facts.get("state_dir")
        store_root = Path(root) if root else None
        attached = store_root is not None and RunStore(store_root).is_locked(cluster.run_id)
        if attached or await busy(cluster):
            since = time.monotonic()
            continue
        if time.monotonic() - since >= idle_s and stop(cluster, idle_s, store_root):
            return "stopped"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m targets.local.idle <cluster dir> <idle seconds>", file=sys.stderr)
        return 2
    outcome = asyncio.run(watch(Path(argv[0]), float(argv[1])))
    print(f"rtui idle watcher: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
