"""Local discovery without Ray: a dir is ours only with our marker; a process only if it holds that exact dir."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.errors import OperationError
from backend.layers import local_cluster as lc
from backend.ledger import ResourceStatus
from backend.store import RunStatus, RunStore
from tests.conftest import run_rtui


@pytest.fixture
def cluster() -> lc.ClusterDir:
    made = lc.make_cluster_dir("r20260101-000000-test", "c1", {"state_dir": os.environ["RTUI_STATE_DIR"]})
    yield made
    if made.path.exists():
        lc.remove_cluster_dir(made.path)


def test_a_cluster_dir_is_private_and_found_by_run_and_by_name(cluster: lc.ClusterDir) -> None:
    assert cluster.path.stat().st_mode & 0o777 == 0o700
    assert (cluster.path / lc.MARKER).stat().st_mode & 0o777 == 0o600
    assert [c.path for c in lc.find_clusters(run_id=cluster.run_id)] == [cluster.path]
    assert cluster.path in [c.path for c in lc.find_clusters(cluster_name="c1")]
    assert cluster.path not in [c.path for c in lc.find_clusters(cluster_name="other")]


def test_a_dir_without_our_marker_is_never_deleted(tmp_path: Path) -> None:
    lookalike = lc.ROOT / "rtui-r20260101-000000-none-abcd"
    lookalike.mkdir(mode=0o700)
    try:
        (lookalike / "precious").write_text("keep")
        assert lc.read_marker(lookalike) is None
        with pytest.raises(OperationError, match="no rtui marker"):
            lc.remove_cluster_dir(lookalike)
        # A marker naming another run does not make it this run's either.
        (lookalike / lc.MARKER).write_text('{"run_id": "r20260101-000000-else", "cluster_name": "c"}')
        assert lc.read_marker(lookalike) is None
        link = lc.ROOT / "rtui-r20260101-000000-link-abcd"
        link.symlink_to(tmp_path)
        try:
            assert lc.read_marker(link) is None
        finally:
            link.unlink()
    finally:
        (lookalike / "precious").unlink()
        (lookalike / lc.MARKER).unlink(missing_ok=True)
        lookalike.rmdir()


def test_only_processes_holding_that_exact_dir_are_ours(cluster: lc.ClusterDir) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = subprocess.Popen([*sleeper, f"--temp-dir={cluster.ray_dir}"], start_new_session=True)
    sibling = subprocess.Popen([*sleeper, f"--temp-dir={cluster.path}2/r"], start_new_session=True)
    try:
        time.sleep(0.3)
        found = {p.pid for p in lc.cluster_family(cluster.path)}
        assert ours.pid in found and sibling.pid not in found
    finally:
        for proc in (ours, sibling):
            proc.kill()
            proc.wait()


def test_down_never_touches_a_recorded_dir_without_the_marker(isolated_env: Path) -> None:
    store = RunStore()
    record = store.create(target="local", cluster_name="rtui-ray", config={})
    decoy = lc.ROOT / f"rtui-{record.run_id}-dead"
    decoy.mkdir(mode=0o700)
    try:
        (decoy / "precious").write_text("keep")
        store.ledger(record).set("local.ray-head", "ray-head", ResourceStatus.READY, id=str(decoy))
        record.status = RunStatus.UP
        store.save(record)
        proc = run_rtui("down", record.run_id, "--yes", timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert (decoy / "precious").read_text() == "keep"
        assert store.load(record.run_id).status is RunStatus.DOWN
    finally:
        (decoy / "precious").unlink()
        decoy.rmdir()


def test_a_second_up_on_the_same_cluster_gets_one_line_naming_the_run(isolated_env: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from backend.store import RunStore\n"
         "with RunStore().cluster_lock('local', 'rtui-ray', 'r20260101-000000-aaaa'):\n"
         "    print('held', flush=True); time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        proc = run_rtui("up", "--yes", timeout=60)
        assert proc.returncode == 1 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and "r20260101-000000-aaaa" in proc.stderr
        assert "cluster rtui-ray on local is being changed by run" in proc.stderr
        other = run_rtui("up", "--yes", "--cluster-name", "another", "--until", "nowhere", timeout=60)
        assert "being changed" not in other.stderr, "a different cluster name is not locked"
    finally:
        holder.kill()
        holder.wait()
