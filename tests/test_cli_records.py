"""Broken, odd or foreign run records: one line and the right exit code, and nothing lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.store import RunStatus, RunStore
from tests.conftest import run_rtui
from tests.test_cli_errors import assert_one_line


def saved_run(**changes: object) -> tuple[RunStore, str, Path]:
    store = RunStore()
    record = store.create(target="local", cluster_name="rtui-ray", config={})
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


def test_malformed_resources_are_set_aside_in_one_line(isolated_env: Path) -> None:
    store, run_id, path = saved_run(resources={"local.ray-head": {"kind": "ray-head", "id": 7, "status": "nope"}})
    assert_one_line(run_rtui("status", run_id), 1, f"run record {run_id} is corrupt")
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


def test_a_directory_named_like_a_record(isolated_env: Path) -> None:
    store = RunStore()
    store.ensure_writable()
    (store.runs_dir / "r20260101-000000-dir0.json").mkdir()
    assert run_rtui("runs").returncode == 0
    assert_one_line(run_rtui("status", "r20260101-000000-dir0"), 1, "is a directory")
    assert_one_line(run_rtui("status"), 2, "no runs yet")
