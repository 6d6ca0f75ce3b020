"""A local cluster left idle stops by itself (issue 26, item 4): real Ray, through the real `rtui` binary.

Issue 33 item 3: the idle stop and `rtui down` take only the processes rtui started. A terminal of the
user's that tails the head's log (its shell leading its own session) was killed by both before.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from backend.delivery import local_data_dir
from backend.session import RunSession
from backend.store import RunStore
from targets.local.cluster import IDLE_WATCHER, MARKER, find_clusters, idle_watch_s, node_procs
from tests.conftest import RTUI, json_lines, run_rtui
from tests.eventually import eventually
from tests.test_local_e2e import cluster_dir, heads, our_processes
from tests.test_local_ownership import Terminal

pytestmark = pytest.mark.ray


def _new_head_log(state: Path) -> Path | None:
    """The head's log of this test's cluster (its marker names this test's state dir), once it exists."""
    return next((c.path / "rtui-head.log" for c in find_clusters()
                 if c.facts.get("state_dir") == str(state) and (c.path / "rtui-head.log").exists()), None)


def test_a_cluster_left_idle_stops_keeps_its_dir_and_says_why(isolated_env: Path, tmp_path: Path) -> None:
    out = tmp_path / "up.jsonl"
    with out.open("w") as sink:
        up = subprocess.Popen([RTUI, "up", "--yes", "--json", "--idle-minutes", "0.1", "--steps", "3"],
                              stdout=sink, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    # The user tails the head's log in a terminal of their own while the run goes on.
    log = eventually("the head's log", lambda: _new_head_log(RunStore().root), timeout=120)
    assert log is not None
    terminal = Terminal(log)
    try:
        _, err = up.communicate(timeout=400)
        assert up.returncode == 0, out.read_text()[-3000:] + err[-3000:]
        _idle_stop_then_down(json_lines(out.read_text()), terminal)
    finally:
        terminal.close()


def _idle_stop_then_down(events: list[dict[str, Any]], terminal: Terminal) -> None:
    run_id = events[0]["data"]["run_id"]
    assert events[-1]["data"]["job_status"] == "SUCCEEDED"
    head = next(e for e in events if e["step"] == "local.ray-head" and e["kind"] == "progress" and e["fraction"] == 1)
    assert "stops after 6s without a job or an rtui" in head["message"]
    path = cluster_dir(run_id)

    # No rtui attached (up exited) and no job: 6 s on, Ray's processes and the watcher are gone.
    eventually("the idle cluster to stop", lambda: not our_processes(run_id), timeout=90, interval=0.2)
    # Not before its time, read from the product's own clocks (a slow test would shorten its own): the
    # watcher last saw `up` attached at most one poll (1.5 s) before up's last event, then waited 6 s.
    stopped_at = json.loads((path / MARKER).read_text())["stopped_while_idle"]["at"]
    assert stopped_at - events[-1]["ts"] >= 6 - 1.5, (stopped_at, events[-1]["ts"])
    assert terminal.alive(), "the idle stop killed the user's terminal"
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
    assert "cluster   not running — stopped while idle at " in status, status
    # `rtui --resume` says it in the app's subtitle.
    from tui.app import RtuiApp

    app = RtuiApp(RunSession.open(run_id, RunStore()), resume=True)
    assert "· stopped while idle · run " in app.sub_title, app.sub_title

    # The next plan says why the head is replaced.
    plan = json_lines(run_rtui("plan", "--json", "--idle-minutes", "0.1", "--steps", "3", check=True).stdout)[0]
    head_change = next(c for c in plan["changes"] if c["address"] == "local.ray-head")
    assert head_change["action"] == "replace" and "stopped while idle" in head_change["reason"], head_change

    down = run_rtui("down", run_id, "--yes", timeout=120)
    assert down.returncode == 0, down.stderr[-2000:]
    assert not Path(path).exists()
    assert terminal.alive(), "`rtui down` killed the user's terminal"


def test_a_new_idle_timeout_on_a_live_cluster_restarts_only_its_watcher(isolated_env: Path) -> None:
    """`--idle-minutes` on a run whose cluster is up (issue 38: the plan said no change while the watcher
    kept the old value): the plan updates the head in place, `up` starts the watcher anew with the new
    timeout and leaves the head and its job alone; `--idle-minutes 0` stops the watcher."""
    first = run_rtui("up", "--yes", "--json", "--idle-minutes", "5", "--steps", "2", timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    run_id = json_lines(first.stdout)[0]["data"]["run_id"]
    (cluster,) = find_clusters(run_id=run_id)
    head = node_procs(cluster).head
    assert head is not None and idle_watch_s(cluster) == 300
    try:
        same = json_lines(run_rtui("plan", "--json", "--idle-minutes", "5", "--steps", "2", check=True).stdout)[0]
        assert same["noop"] is True, same["changes"]
        plan = json_lines(run_rtui("plan", "--json", "--idle-minutes", "7", "--steps", "2", check=True).stdout)[0]
        changes = {c["address"]: c for c in plan["changes"] if c["action"] != "noop"}
        assert list(changes) == ["local.ray-head"], plan["changes"]
        assert changes["local.ray-head"]["action"] == "update", changes
        assert "after 420s" in changes["local.ray-head"]["reason"], changes

        again = run_rtui("up", "--yes", "--json", "--idle-minutes", "7", "--steps", "2", timeout=300)
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
        assert not [e for e in json_lines(again.stdout) if e["step"] == "ray.job.train"], "the job was made again"
        (after,) = find_clusters(run_id=run_id)
        assert node_procs(after).head == head, "the head was restarted"
        assert idle_watch_s(after) == 420
        assert len([r for r in after.roots if r.role == IDLE_WATCHER and r.ref.alive()]) == 1
        assert json_lines(run_rtui("plan", "--json", "--idle-minutes", "7", "--steps", "2",
                                   check=True).stdout)[0]["noop"] is True

        off = run_rtui("up", "--yes", "--json", "--idle-minutes", "0", "--steps", "2", timeout=300)
        assert off.returncode == 0, off.stdout[-2000:] + off.stderr[-2000:]
        (last,) = find_clusters(run_id=run_id)
        assert idle_watch_s(last) == 0 and node_procs(last).head == head
    finally:
        assert run_rtui("down", run_id, "--yes", timeout=120).returncode == 0
