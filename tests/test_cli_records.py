"""Broken, odd or foreign run records: one line and the right exit code, and nothing lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.store import JobRecord, JobState, RunStatus, RunStore
from targets.kube.config import KubeConfig
from targets.local.config import LocalConfig
from tests.conftest import run_rtui
from tests.test_cli_errors import assert_one_line


def saved_run(**changes: object) -> tuple[RunStore, str, Path]:
    store = RunStore()
    record = store.create(LocalConfig())
    record.status = RunStatus.UP
    store.save(record)
    path = store.path_for(record.run_id)
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    return store, record.run_id, path


@pytest.mark.parametrize("command", ["status", "logs", "down", "--resume"])
def test_a_300_character_run_id(isolated_env: Path, command: str) -> None:
    args = [command, "r" * 300] + (["--yes"] if command == "down" else [])
    assert_one_line(run_rtui(*args), 2, "invalid run id")


def test_malformed_resources_are_reported_in_one_line_and_set_aside_when_asked(isolated_env: Path) -> None:
    store, run_id, path = saved_run(resources={"local.ray-head": {"kind": "ray-head", "id": 7, "status": "nope"}})
    before = path.read_bytes()
    assert_one_line(run_rtui("status", run_id), 1, f"run record {run_id} is corrupt")
    listing = run_rtui("runs")
    assert listing.returncode == 0 and f"run record {run_id} is corrupt" in listing.stderr
    assert path.read_bytes() == before and not store.corrupt_dir.exists(), "reading and listing move nothing"
    aside = run_rtui("runs", "--set-aside-corrupt")
    assert aside.returncode == 0 and "set aside an unreadable run record" in aside.stderr, aside.stderr
    assert not path.exists() and len(list(store.corrupt_dir.iterdir())) == 1
    # Nothing of that run is live, so down has nothing to find: one line, not a traceback.
    assert_one_line(run_rtui("down", run_id, "--yes"), 2, f"no run {run_id}")


def test_a_config_this_rtui_rejects_still_shows_and_tears_down(isolated_env: Path) -> None:
    _, run_id, _ = saved_run(config={"steps": -3})
    status = run_rtui("status", run_id)
    assert status.returncode == 0 and run_id in status.stdout and "Traceback" not in status.stderr
    resume = run_rtui("--resume", run_id)
    assert_one_line(resume, 1, "has a config this rtui cannot use")
    assert "rtui down --yes --target local --cluster-name rtui-ray" in resume.stderr
    down = run_rtui("down", run_id, "--yes")
    assert down.returncode == 0 and f"run {run_id} is down" in down.stdout, down.stderr
    assert RunStore().load(run_id).status is RunStatus.DOWN


def test_a_record_from_a_newer_rtui_is_left_alone(isolated_env: Path) -> None:
    store, run_id, path = saved_run(schema_version=99)
    before = path.read_bytes()
    assert_one_line(run_rtui("status", run_id), 1, "written by a newer rtui")
    listing = run_rtui("runs")
    assert listing.returncode == 0 and "written by a newer rtui" in listing.stderr
    assert path.read_bytes() == before and not store.corrupt_dir.exists()


@pytest.mark.host_clusters  # "no runs yet": counts on no other test's cluster being up
def test_a_directory_named_like_a_record(isolated_env: Path) -> None:
    store = RunStore()
    store.ensure_writable()
    (store.runs_dir / "r20260101-000000-dir0.json").mkdir()
    assert run_rtui("runs").returncode == 0
    assert_one_line(run_rtui("status", "r20260101-000000-dir0"), 1, "is a directory")
    assert_one_line(run_rtui("status"), 2, "no runs yet")


@pytest.mark.slow
def test_logs_and_status_show_the_latest_job_and_earlier_ones_stay_readable(isolated_env: Path) -> None:
    """Two jobs on one run, each with its own spool: `logs` is the latest, `--job 1` the first."""
    from tests.test_follow import metric_lines

    store, run_id, _ = saved_run()
    record = store.load(run_id)
    first, second = Path(record.spool_path), Path(record.spool_path).parent / run_id / "job-2.log"
    second.parent.mkdir(parents=True)
    first.write_text(metric_lines(20))
    second.write_text(metric_lines(5))
    record.jobs = [JobRecord(submission_id=f"rtui-{run_id}-1", submitted_at=1.0, spec_hash="a",
                             status=JobState.SUCCEEDED, spool_path=str(first)),
                   JobRecord(submission_id=f"rtui-{run_id}-2", submitted_at=2.0, spec_hash="b",
                             status=JobState.SUCCEEDED, spool_path=str(second))]
    record.status = RunStatus.DOWN  # nothing live to ask: what the record and spools hold
    store.save(record)

    assert run_rtui("logs", run_id, check=True).stdout == metric_lines(5)
    assert run_rtui("logs", "--job", "2", check=True).stdout == metric_lines(5)
    assert run_rtui("logs", run_id, "--job", "1", check=True).stdout == metric_lines(20)
    assert_one_line(run_rtui("logs", run_id, "--job", "3"), 2, f"run {run_id} has no job 3 (it has 2 jobs)")
    status = json.loads(run_rtui("status", run_id, "--json", check=True).stdout)
    assert status["job"]["submission_id"] == f"rtui-{run_id}-2" and status["job"]["number"] == 2
    assert status["last_metric"]["step"] == 5 and status["summary"]["steps"] == 5
    text = run_rtui("status", run_id, check=True).stdout
    assert f"rtui-{run_id}-2: SUCCEEDED (job 2;" in text and "training  step 5 " in text
    assert "(world 2)" in text and "world None" not in text


@pytest.mark.slow
def test_status_honours_target(isolated_env: Path) -> None:
    """`rtui status --target kube` shows the latest kube run, not the latest run (issue 21, item 4)."""
    store = RunStore()
    kube = store.create(KubeConfig(target="kube"))
    kube.status = RunStatus.DOWN
    store.save(kube)
    _, local_id, _ = saved_run()
    store.save(store.load(local_id).model_copy(update={"status": RunStatus.DOWN}))
    assert json.loads(run_rtui("status", "--json", check=True).stdout)["run_id"] == local_id
    assert json.loads(run_rtui("status", "--target", "kube", "--json", check=True).stdout)["run_id"] == kube.run_id
    env = {"RTUI_TARGET": "kube"}
    assert json.loads(run_rtui("status", "--json", env=env, check=True).stdout)["run_id"] == kube.run_id
    assert_one_line(run_rtui("status", "--target", "aws"), 2, "no runs on the aws target")
    assert_one_line(run_rtui("status", local_id, "--target", "kube"), 2, f"run {local_id} is on the local target")
