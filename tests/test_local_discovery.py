"""Local discovery without Ray: a dir is ours only with our marker; a process only if rtui started it there."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from backend.errors import OperationError
from backend.ledger import ResourceStatus
from backend.procs import ProcRef
from backend.store import RunStatus, RunStore
from targets.local import cluster as lc
from targets.local.config import LocalConfig
from tests.conftest import json_lines, run_rtui
from tests.eventually import eventually

pytestmark = pytest.mark.host_clusters  # makes marked cluster dirs under /tmp


@pytest.fixture
def cluster() -> Iterator[lc.ClusterDir]:
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


def _argv_shown(pid: int) -> bool:
    try:
        return any(arg.startswith("--temp-dir=") for arg in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def test_only_processes_rtui_started_for_that_exact_dir_are_ours(cluster: lc.ClusterDir) -> None:
    """Issue 33: naming the dir no longer makes a process ours (tests/test_local_ownership.py); a root
    recorded in its marker does, and never in a sibling's."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]  # models time: lives until stopped
    ours = subprocess.Popen([*sleeper, f"--temp-dir={cluster.ray_dir}"], start_new_session=True)
    named = subprocess.Popen([*sleeper, f"--temp-dir={cluster.ray_dir}"], start_new_session=True)
    sibling = subprocess.Popen([*sleeper, f"--temp-dir={cluster.path}2/r"], start_new_session=True)
    try:
        eventually("the processes exec'd, their argv readable",
                   lambda: all(_argv_shown(proc.pid) for proc in (ours, named, sibling)), timeout=20)
        lc.record_root(cluster, "idle-watcher", ProcRef(ours.pid, psutil.Process(ours.pid).create_time()))
        found = {p.pid for p in lc.cluster_family(cluster.path)}
        assert ours.pid in found and named.pid not in found and sibling.pid not in found
    finally:
        for proc in (ours, named, sibling):
            proc.kill()
            proc.wait()


def test_down_never_touches_a_recorded_dir_without_the_marker(isolated_env: Path) -> None:
    store = RunStore()
    record = store.create(LocalConfig())
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
         "    print('held', flush=True); time.sleep(60)\n"],  # models time: lives until stopped
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


def test_ray_gets_a_minimal_environment_pinned_to_its_cluster(cluster: lc.ClusterDir) -> None:
    from targets.local.layer import ray_env

    cluster.facts.update({"ports": {}, "gcs_address": "127.0.0.1:9"})
    user = {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
            "AWS_ACCESS_KEY_ID": "AKIA", "HF_TOKEN": "hf_x", "GITHUB_TOKEN": "ghp", "RAY_ADDRESS": "10.0.0.1:6379",
            "RAY_AUTH_TOKEN": "theirs", "RAY_DEDUP_LOGS": "0", "OMP_NUM_THREADS": "1"}
    env = ray_env(cluster, environ=user)
    assert not {"AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "HF_TOKEN", "GITHUB_TOKEN", "RAY_AUTH_TOKEN"} & set(env)
    assert env["RAY_ADDRESS"] == "127.0.0.1:9" and env["RAY_AUTH_MODE"] == "token"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(cluster.path / "auth_token")
    assert env["RAY_DEDUP_LOGS"] == "0" and env["OMP_NUM_THREADS"] == "1" and env["LANG"] == "C.UTF-8"
    # No metrics server without a token (issue 23): not started at all.
    assert (env["AUTOSCALER_METRIC_PORT"], env["DASHBOARD_METRIC_PORT"]) == ("-1", "-1")
    assert env["RAY_enable_metrics_collection"] == "0"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    # The dashboard's modules get longer than Ray's 30 s to start on a busy machine; a user's value stays.
    assert float(env["RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT"]) > 30
    mine = ray_env(cluster, environ={**user, "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": "45"})
    assert mine["RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT"] == "45"
    # No worker processes started ahead of a job that cannot use them (they lack its runtime env).
    assert env["RAY_prestart_worker_first_driver"] == "0"
    assert ray_env(cluster, environ={**user, "RAY_prestart_worker_first_driver": "1"})[
        "RAY_prestart_worker_first_driver"] == "1"


def test_only_the_variables_the_user_names_reach_the_job() -> None:
    from backend.errors import UserError
    from backend.jobspec import build_job_spec, passed_env_values
    from backend.resolve import resolve_config

    spec = build_job_spec(resolve_config({"job_env": "HF_TOKEN"}, environ={}).config)
    assert passed_env_values(spec, {"HF_TOKEN": "hf_x", "AWS_SECRET_ACCESS_KEY": "s"}) == {"HF_TOKEN": "hf_x"}
    assert "hf_x" not in repr(spec) and "hf_x" not in str(spec.summary())
    with pytest.raises(UserError, match="--job-env names HF_TOKEN, which is not set"):
        passed_env_values(spec, {})


def test_down_by_name_leaves_a_cluster_of_another_state_dir_and_says_whose(tmp_path: Path) -> None:
    other = tmp_path / "other-state"
    (other / "runs").mkdir(parents=True)
    made = lc.make_cluster_dir("r20260101-000000-othr", "shared-name", {"state_dir": str(other)})
    try:
        (other / "runs" / "r20260101-000000-othr.json").write_text("{}")
        proc = run_rtui("down", "--yes", "--cluster-name", "shared-name", timeout=60)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert "belongs to run r20260101-000000-othr of another state dir" in proc.stderr
        assert f"RTUI_STATE_DIR={other} rtui down r20260101-000000-othr --yes" in proc.stderr
        assert made.path.exists()
    finally:
        lc.remove_cluster_dir(made.path)


def test_an_orphan_dir_whose_processes_are_gone_is_not_called_running(tmp_path: Path) -> None:
    """A cluster killed with its state dir (a crash, a reboot's leftovers) leaves only its marked dir:
    status says so instead of "is running", and `down` by run id removes it."""
    made = lc.make_cluster_dir("r20260101-000000-gone", "gone", {"state_dir": str(tmp_path / "lost")})
    try:
        status = run_rtui("status", timeout=60)
        line = next(x for x in status.stdout.splitlines() if "r20260101-000000-gone" in x)
        assert "was left behind, its processes gone," in line and "is running" not in line, line
        assert "remove it:" in line and "down r20260101-000000-gone --yes" in line
        orphans = json_lines(run_rtui("status", "--json", timeout=60).stdout)[0]["orphans"]
        assert [o["running"] for o in orphans if o["run_id"] == made.run_id] == [False]
        down = run_rtui("down", made.run_id, "--yes", timeout=60)
        assert down.returncode == 0, down.stdout + down.stderr
        assert not made.path.exists()
    finally:
        if made.path.exists():
            lc.remove_cluster_dir(made.path)


def test_an_orphan_with_a_live_process_is_running(tmp_path: Path) -> None:
    made = lc.make_cluster_dir("r20260101-000000-live", "live", {"state_dir": str(tmp_path / "lost")})
    # Lives until killed: it blocks reading its stdin, which the test never writes.
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", str(made.path / "r")],
                              stdin=subprocess.PIPE)
    # A process is the cluster's only if rtui started it (recorded in the marker), never for naming the dir.
    lc.record_root(made, lc.node_name("live", None), ProcRef(holder.pid, psutil.Process(holder.pid).create_time()))
    try:
        orphans = json_lines(run_rtui("status", "--json", timeout=60).stdout)[0]["orphans"]
        assert [o["running"] for o in orphans if o["run_id"] == made.run_id] == [True]
    finally:
        holder.kill()
        holder.wait()
        lc.remove_cluster_dir(made.path)
