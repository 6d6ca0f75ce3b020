"""A local cluster left idle stops by itself (issue 26, item 4): real Ray, through the real `rtui` binary."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from backend.delivery import local_data_dir
from backend.layers.local_cluster import MARKER, find_clusters, node_procs
from backend.session import RunSession
from backend.store import RunStore
from tests.conftest import json_lines, run_rtui
from tests.test_local_e2e import cluster_dir, heads, our_processes

pytestmark = pytest.mark.ray


def _wait(what: str, cond: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_cluster_left_idle_stops_keeps_its_dir_and_says_why() -> None:
    proc = run_rtui("up", "--yes", "--json", "--idle-minutes", "0.1", "--steps", "3", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = json_lines(proc.stdout)
    run_id = events[0]["data"]["run_id"]
    assert events[-1]["data"]["job_status"] == "SUCCEEDED"
    head = next(e for e in events if e["step"] == "local.ray-head" and e["kind"] == "progress" and e["fraction"] == 1)
    assert "stops after 6s without a job or an rtui" in head["message"]
    path = cluster_dir(run_id)
    finished = time.monotonic()

    # No rtui attached (up exited) and no job: 6 s on, Ray's processes and the watcher are gone.
    _wait("the idle cluster to stop", lambda: not our_processes(run_id), timeout=90)
    took = time.monotonic() - finished
    print(f"\nidle local cluster stopped {took:.1f}s after `up` exited (idle time 6 s)")
    assert took >= 5.0, took  # not before its time
    assert not heads(run_id)
    # The dir stays, marked; what the job wrote stays in the run's data dir (issue 25); the record says
    # why; the ledger still has it.
    assert path.is_dir() and any(local_data_dir(RunStore().root, run_id).iterdir())
    marker = json.loads((path / MARKER).read_text())
    assert marker["stopped_while_idle"]["idle_s"] == 6
    record = RunStore().load(run_id)
    assert record.facts.stopped_while_idle is not None and record.facts.stopped_while_idle.dir == str(path)
    assert record.resources["local.ray-head"].id == str(path)
    assert [c.path for c in find_clusters(run_id=run_id)] == [path]
    assert all(node_procs(c).head is None for c in find_clusters(run_id=run_id))

    status = run_rtui("status", run_id, check=True).stdout
    assert "cluster  not running — stopped while idle at " in status, status
    # `rtui --resume` says it in the app's subtitle.
    from tui.app import RtuiApp

    app = RtuiApp(RunSession.open(run_id, RunStore()), resume=True)
    assert app.sub_title.endswith("· stopped while idle"), app.sub_title

    # The next plan says why the head is replaced.
    plan = json_lines(run_rtui("plan", "--json", "--idle-minutes", "0.1", "--steps", "3", check=True).stdout)[0]
    head_change = next(c for c in plan["changes"] if c["address"] == "local.ray-head")
    assert head_change["action"] == "replace" and "stopped while idle" in head_change["reason"], head_change

    down = run_rtui("down", run_id, "--yes", timeout=120)
    assert down.returncode == 0, down.stderr[-2000:]
    assert not Path(path).exists()
