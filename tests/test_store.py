from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from backend.errors import OperationError, UserError
from backend.ledger import ResourceStatus
from backend.spool import LogSpool
from backend.store import (
    SCHEMA_VERSION,
    CorruptRecordError,
    JobState,
    RunLockedError,
    RunRecord,
    RunStatus,
    RunStore,
)
from targets.local.config import LocalConfig
from tests.eventually import eventually


def make(store: RunStore) -> RunRecord:
    return store.create(LocalConfig(cluster_name="c1", steps=3))


def test_records_are_private_and_round_trip(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    rec = make(store)
    path = store.path_for(rec.run_id)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.runs_dir.stat().st_mode) == 0o700
    store.ledger(rec).set("local.ray-head", "ray-head", ResourceStatus.INTENDED)
    store.ledger(rec).update("local.ray-head", status=ResourceStatus.CREATING, id="/tmp/x", outputs={"a": 1})
    loaded = store.load(rec.run_id)
    assert loaded.resources == rec.resources and loaded.schema_version == SCHEMA_VERSION
    entry = loaded.resources["local.ray-head"]
    assert (entry.status, entry.id, entry.outputs) == (ResourceStatus.CREATING, "/tmp/x", {"a": 1})


def test_a_crash_while_saving_leaves_the_old_record_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(tmp_path / "s")
    rec = make(store)
    before = store.path_for(rec.run_id).read_bytes()

    def crash(*_a: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    rec.status = RunStatus.UP
    with pytest.raises(OSError):
        store.save(rec)
    assert store.path_for(rec.run_id).read_bytes() == before
    assert not list(store.runs_dir.glob("*.tmp")), "temp file left behind"


def test_kill_during_many_saves_never_leaves_a_torn_record(tmp_path: Path) -> None:
    root = tmp_path / "s"
    rec = make(RunStore(root))
    code = (
        "import sys; from backend.store import RunStore; s=RunStore(__import__('pathlib').Path(sys.argv[1]));"
        "r=s.load(sys.argv[2])\n"
        "for i in range(100000):\n r.facts.kept_data={'i': i, 'pad': 'x'*4096*(i%7)}; s.save(r)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(root), rec.run_id], cwd=Path(__file__).parents[1])
    def saving() -> bool:  # killed in the middle of its saves
        assert proc.poll() is None, "the writer ended before it was killed"
        return int(str((RunStore(root).load(rec.run_id).facts.kept_data or {}).get("i") or 0)) >= 50

    eventually("the writer to make 50 saves", saving, timeout=30)
    proc.kill()
    proc.wait()
    loaded = RunStore(root).load(rec.run_id)  # parses: never half-written
    assert int(str((loaded.facts.kept_data or {}).get("i") or 0)) > 0


def test_a_corrupt_record_is_reported_where_it_lies_and_set_aside_only_when_asked(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    rec = make(store)
    path = store.path_for(rec.run_id)
    path.write_text('{"schema_version": 1, "run_id": ')
    for _ in range(2):  # reading it again says the same: the first read moved nothing
        with pytest.raises(CorruptRecordError) as info:
            store.load(rec.run_id)
        assert rec.run_id in str(info.value) and f"left as it is at {path}" in str(info.value)
        assert "rtui runs --set-aside-corrupt" in str(info.value)
    assert path.exists() and not store.corrupt_dir.exists()
    [kept] = store.set_aside_corrupt()
    assert kept.parent == store.corrupt_dir and kept.read_text().startswith('{"schema_version": 1')
    assert not path.exists() and store.set_aside_corrupt() == []


def test_unknown_schema_version_is_not_silently_read(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    rec = make(store)
    path = store.path_for(rec.run_id)
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(OperationError, match="written by a newer rtui") as info:
        store.load(rec.run_id)
    assert not isinstance(info.value, CorruptRecordError)
    assert path.read_text() == json.dumps(data), "a newer record is left alone, not set aside"
    data["schema_version"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(CorruptRecordError, match="schema version 0"):
        store.load(rec.run_id)


def test_a_v1_record_is_migrated_to_the_ledger(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    rec = make(store)
    path = store.path_for(rec.run_id)
    data = json.loads(path.read_text())
    data["schema_version"] = 1
    data["resources"] = {"temp_dir": "/tmp/rtui-old", "head": {"pid": 7, "create_time": 1.0},
                         "workers": [{"pid": 8, "create_time": 1.0}], "dashboard_url": "http://127.0.0.1:1",
                         "ports": {"gcs": 1}, "shape": {"cpus": 2}}
    data["jobs"] = [{"submission_id": "rtui-x-1", "submitted_at": 1.0, "spec_hash": "abc", "status": "RUNNING"}]
    path.write_text(json.dumps(data))
    loaded = store.load(rec.run_id)
    assert loaded.schema_version == SCHEMA_VERSION
    head = loaded.resources["local.ray-head"]
    assert (head.kind, head.id, head.status) == ("ray-head", "/tmp/rtui-old", ResourceStatus.READY)
    assert head.outputs["dashboard_url"] == "http://127.0.0.1:1"
    assert loaded.resources["local.ray-worker.0"].kind == "ray-worker"
    assert loaded.resources["ray.job.train"].id == "rtui-x-1"
    assert loaded.current_job is not None and loaded.current_job.status is JobState.RUNNING


def test_odd_names_in_the_runs_dir_are_not_records(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    good = make(store)
    (store.runs_dir / "r20260101-000000-dead.json").mkdir()
    (store.runs_dir / ".r1.abc.tmp").write_text("{")
    records, warnings = store.list()
    assert [r.run_id for r in records] == [good.run_id] and warnings == []
    with pytest.raises(OperationError, match="is a directory"):
        store.load("r20260101-000000-dead")
    with pytest.raises(UserError, match="invalid run id"):
        store.path_for("x" * 300)


def test_list_skips_corrupt_records_with_a_warning(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    good = make(store)
    bad = make(store)
    store.path_for(bad.run_id).write_text("not json")
    stale = store.runs_dir / f".{good.run_id}.old.tmp"  # a dead save's temp file: only a save sweeps it
    stale.write_text("{")
    os.utime(stale, (0, 0))

    def state() -> dict[str, tuple[bytes, int]]:
        return {str(p.relative_to(store.root)): (p.read_bytes(), p.stat().st_mtime_ns)
                for p in sorted(store.root.rglob("*")) if p.is_file()}

    before = state()
    for _ in range(2):
        records, warnings = store.list()
        assert [r.run_id for r in records] == [good.run_id]
        assert len(warnings) == 1 and bad.run_id in warnings[0] and "is corrupt" in warnings[0]
    assert state() == before, "listing has no side effect"
    assert store.latest().run_id == good.run_id and state() == before


def test_unwritable_state_dir_is_a_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match="not writable"):
        RunStore(blocker / "state").ensure_writable()


def test_find_active_and_latest(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    with pytest.raises(UserError, match="no runs yet"):
        store.latest()
    first = make(store)
    first.status = RunStatus.DOWN
    store.save(first)
    assert store.find_active("local", "c1") is None
    second = make(store)
    active = store.find_active("local", "c1")
    assert active is not None and active.run_id == second.run_id
    assert store.find_active("local", "other") is None


def test_lock_is_exclusive_across_processes_and_released_on_kill(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = RunStore(root)
    rec = make(store)
    # The holder keeps the lock until the test kills it: it blocks reading its stdin, which the test never
    # writes (no cap on its life that a slow machine could reach).
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; from backend.store import RunStore;"
         "s=RunStore(Path(sys.argv[1]));\nwith s.lock(sys.argv[2]):\n print('held', flush=True); sys.stdin.read()",
         str(root), rec.run_id],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(RunLockedError, match=f"pid {holder.pid}"), store.lock(rec.run_id):
        pass
    assert store.is_locked(rec.run_id)
    holder.kill()
    holder.wait()
    assert not store.is_locked(rec.run_id)


def test_spool_lines_partial_chunks_and_offsets(tmp_path: Path) -> None:
    spool = LogSpool(tmp_path / "x.log")
    assert spool.char_count() == 0 and list(spool.iter_lines()) == []
    spool.append("héllo\nwor")
    assert spool.read_from(0) == (["héllo"], len("héllo\n".encode()))
    spool.append("ld\n")
    lines, offset = spool.read_from(len("héllo\n".encode()))
    assert lines == ["world"] and offset == spool.size()
    assert spool.char_count() == len("héllo\nworld\n")
    assert stat.S_IMODE(spool.path.stat().st_mode) == 0o600


def test_spool_iter_from_streams_complete_lines_with_offsets(tmp_path: Path) -> None:
    spool = LogSpool(tmp_path / "y.log")
    spool.append("a\nbb\nccc")
    got = list(spool.iter_from(0))
    assert got == [("a", 2), ("bb", 5)]
    spool.append("\n")
    assert list(spool.iter_from(5)) == [("ccc", 9)]


def test_a_dead_save_leaves_no_temp_file_for_long_and_asking_leaves_no_lock(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    rec = make(store)
    stale, fresh = store.runs_dir / f".{rec.run_id}.old.tmp", store.runs_dir / f".{rec.run_id}.new.tmp"
    stale.write_text("{")
    fresh.write_text("{")
    os.utime(stale, (0, 0))
    store.list()
    assert stale.exists() and fresh.exists(), "listing changes nothing"
    store.save(rec)  # at write time
    assert not stale.exists() and fresh.exists(), "only a temp file too old to be a save in flight goes"
    assert not store.is_locked(rec.run_id) and not (store.lock_dir / f"{rec.run_id}.lock").exists()
    with store.lock(rec.run_id):
        holder = subprocess.run([sys.executable, "-c", "import sys; from backend.store import RunStore;"
                                 f"print(RunStore(__import__('pathlib').Path(sys.argv[1])).is_locked('{rec.run_id}'))",
                                 str(store.root)], capture_output=True, text=True, cwd=Path(__file__).parents[1])
        assert holder.stdout.strip() == "True", holder.stderr
