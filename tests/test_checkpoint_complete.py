"""Only a complete checkpoint is resumable, and ``latest`` is the newest one the last run completed.

How the pieces arrive (Ray 2.58 and torch 2.13, read in the installed sources):

* Ray Train v2's ``ray.train.report(checkpoint=...)`` (``v2/_internal/execution/context.py``) has each
  worker upload its own directory into ``<storage>/<run name>/<checkpoint_dir_name>/``, one worker
  independently of the others: the only barrier is the one agreeing on the dir name *before* the
  uploads. With ``checkpoint_upload_mode=ASYNC`` the upload runs on one background thread per worker
  (``checkpoint_upload_threadpool``, one thread, in report order) while training goes on, and the
  worker waits for it when the training function returns (``worker.py``). A rank that dies mid-upload
  leaves the others' files there.
* DCP's ``.metadata`` (``FileSystemWriter.finish``) names, for every saved item, the file that holds
  it (``_StorageInfo.relative_path``: ``__<rank>_0.distcp``) with its offset and length; a rank's
  shard can be missing while ``.metadata`` and every ``rank*_state.pt`` are there.

So a checkpoint counts only when every file its ``.metadata`` names is there at its full length,
every rank's state file is there, rtui's marker is there and, for a marker that says so, every rank's
done file, which each rank's upload writes after its own files (``ckpt.Uploader``).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.test_checkpoint_safety import _local, _real_metadata, _saved, bucket, model_dir, world_of_one
from training import checkpoint as ckpt

__all__ = ["bucket", "model_dir", "world_of_one"]  # fixtures shared with the safety tests


def _two_rank(one_rank: Path, where: Path, step: int, ts: float) -> Path:
    """A checkpoint as two ranks save it: half the items in ``__1_0.distcp`` (a copy of rank 0's file,
    so every offset stays valid), ``rank1_state.pt`` beside rank 0's, the marker saying world 2."""
    shutil.copytree(one_rank, where)
    shutil.copy(where / "__0_0.distcp", where / "__1_0.distcp")
    shutil.copy(where / ckpt.rank_state_file(0), where / ckpt.rank_state_file(1))
    metadata = _real_metadata(where)
    for n, info in enumerate(metadata.storage_data.values()):
        if n % 2:
            info.relative_path = "__1_0.distcp"
    (where / ckpt.DCP_METADATA).write_bytes(pickle.dumps(metadata))
    (where / ckpt.MARKER).write_text(ckpt.CheckpointMeta(step=step, world_size=2, ts=ts).to_json())
    return where


@pytest.fixture(scope="module")
def one_rank(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory, _, _ = _saved(model_dir, tmp_path_factory.mktemp("saved") / "ckpt")
    return directory


def _stamp(directory: Path, step: int, ts: float, world: int = 1) -> None:
    (directory / ckpt.MARKER).write_text(ckpt.CheckpointMeta(step=step, world_size=world, ts=ts).to_json())


@pytest.mark.slow
def test_a_checkpoint_missing_one_ranks_shard_is_never_picked(one_rank: Path, tmp_path: Path) -> None:
    run = tmp_path / "store" / "rtui-100"
    _two_rank(one_rank, run / ckpt.checkpoint_dir_name(5), 5, ts=100.0)
    partial = _two_rank(one_rank, run / ckpt.checkpoint_dir_name(10), 10, ts=200.0)
    (partial / "__1_0.distcp").unlink()  # rank 1 died before its upload
    lines: list[str] = []
    chosen = ckpt.resolve_resume("latest", str(tmp_path / "store"), say=lines.append)
    assert chosen == str(run / ckpt.checkpoint_dir_name(5))
    assert any("__1_0.distcp" in line and ckpt.checkpoint_dir_name(10) in line for line in lines), lines
    assert [s for s, _ in ckpt.find_checkpoints(str(tmp_path / "store"))] == [5]


def test_a_truncated_shard_is_as_partial_as_a_missing_one(one_rank: Path, tmp_path: Path) -> None:
    partial = _two_rank(one_rank, tmp_path / "run" / ckpt.checkpoint_dir_name(10), 10, ts=200.0)
    data = (partial / "__1_0.distcp").read_bytes()
    (partial / "__1_0.distcp").write_bytes(data[: len(data) // 2])  # an upload cut off
    assert ckpt.find_checkpoints(str(tmp_path / "run")) == []


def test_a_checkpoint_without_its_marker_is_never_picked(one_rank: Path, tmp_path: Path) -> None:
    run = tmp_path / "store" / "rtui-100"
    _two_rank(one_rank, run / ckpt.checkpoint_dir_name(5), 5, ts=100.0)
    unmarked = _two_rank(one_rank, run / ckpt.checkpoint_dir_name(10), 10, ts=200.0)
    (unmarked / ckpt.MARKER).unlink()
    lines: list[str] = []
    assert ckpt.resolve_resume("latest", str(tmp_path / "store"), say=lines.append) == \
        str(run / ckpt.checkpoint_dir_name(5))
    assert any(ckpt.MARKER in line and ckpt.checkpoint_dir_name(10) in line for line in lines), lines


def test_save_local_leaves_the_marker_to_the_end(model_dir: Path, tmp_path: Path) -> None:
    """``save_local`` writes no marker: rank 0's upload writes it after its own files
    (``ckpt.Uploader``), with ``mark_complete``."""
    directory, _, _ = _saved(model_dir, tmp_path / "ckpt", mark=False)
    assert not (directory / ckpt.MARKER).exists()
    assert ckpt.find_checkpoints(str(directory)) == []
    meta = ckpt.CheckpointMeta(step=2, world_size=1, ts=5.0)
    ckpt.mark_complete(str(directory), meta)
    assert json.loads((directory / ckpt.MARKER).read_text())["step"] == 2
    assert ckpt.find_checkpoints(str(directory)) == [(2, str(directory))]


def test_latest_is_the_newest_run_s_newest_checkpoint_not_the_highest_step(one_rank: Path, tmp_path: Path) -> None:
    """An earlier job of the same storage ran to step 20; the last job ran to step 4 (a new config):
    ``latest`` continues the last job, not the old one's higher step."""
    store = tmp_path / "store"
    for step, ts in ((10, 100.0), (20, 110.0)):
        shutil.copytree(one_rank, store / "rtui-100" / ckpt.checkpoint_dir_name(step))
        _stamp(store / "rtui-100" / ckpt.checkpoint_dir_name(step), step, ts)
    for step, ts in ((2, 200.0), (4, 210.0)):
        shutil.copytree(one_rank, store / "rtui-200" / ckpt.checkpoint_dir_name(step))
        _stamp(store / "rtui-200" / ckpt.checkpoint_dir_name(step), step, ts)
    assert ckpt.resolve_resume("latest", str(store)) == str(store / "rtui-200" / ckpt.checkpoint_dir_name(4))
    # A job that names its run (--run-name) continues that run.
    assert ckpt.resolve_resume("latest", str(store), run_name="rtui-100") == \
        str(store / "rtui-100" / ckpt.checkpoint_dir_name(20))


def test_a_failing_save_leaves_no_temp_dir(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.checkpoint import state_dict_saver

    from tests.training.test_finetune import build, config

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    model, optimizer = build(config(model_dir))

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state_dict_saver, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        ckpt.save_local(model, optimizer, 0, {"data": {}, "torch_rng": torch.get_rng_state()},
                        ckpt.CheckpointMeta(step=1, world_size=1))
    assert os.listdir(temp) == []


@pytest.mark.slow
def test_a_remote_checkpoint_is_read_item_by_item_not_downloaded_whole(
        bucket: Any, one_rank: Path, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's ``Checkpoint.as_directory()`` copies the whole remote dir (``pyarrow.fs.copy_files``) on
    every rank. A rank needs only the items its load plan names: here half the items sit in
    ``__1_0.distcp`` and half in ``__0_0.distcp`` (each file a full copy), so the whole dir is about
    twice what one rank must read."""
    from tests.test_checkpoint_safety import _fresh

    directory = _two_rank(one_rank, tmp_path / "ckpt", 2, ts=1.0)
    (directory / ckpt.rank_state_file(1)).unlink()  # one rank of a world of one reads it
    _stamp(directory, 2, 1.0, world=1)
    total = 0
    for path in directory.iterdir():
        bucket.put_object(Bucket="shared-ckpts", Key=f"run/ck/{path.name}", Body=path.read_bytes())
        total += path.stat().st_size
    downloads = tmp_path / "tmp"
    downloads.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(downloads))
    model, optimizer = _fresh(model_dir)
    restored = ckpt.load("s3://shared-ckpts/run/ck", model, optimizer, 0)
    expected = ckpt.load(str(directory), *_fresh(model_dir), 0)
    assert restored.meta.step == 2 and restored.bytes_read == expected.bytes_read
    shard = (directory / "__0_0.distcp").stat().st_size
    assert restored.bytes_read < shard * 1.1 < total * 0.6, (restored.bytes_read, shard, total)
    assert not list(downloads.iterdir())  # nothing went through a local copy
    got, want = model.state_dict(), expected_model_state(model_dir, directory)
    assert all(torch.equal(_local(got[name]), want[name]) for name in want)


def expected_model_state(model_dir: Path, directory: Path) -> dict[str, torch.Tensor]:
    from tests.test_checkpoint_safety import _fresh

    model, optimizer = _fresh(model_dir)
    ckpt.load(str(directory), model, optimizer, 0)
    return {name: _local(t) for name, t in model.state_dict().items()}


def test_after_a_restart_the_group_takes_the_runs_newest_complete_checkpoint(one_rank: Path, tmp_path: Path) -> None:
    """Ray Train hands a restarted group the checkpoint its controller registered last
    (``ray.train.get_checkpoint()``); it registers a report only after polling every worker's result,
    and before rank 0 writes the marker. The run's own dir says which checkpoint is complete."""
    run = tmp_path / "store" / "rtui-100"
    _two_rank(one_rank, run / ckpt.checkpoint_dir_name(5), 5, ts=100.0)
    unmarked = _two_rank(one_rank, run / ckpt.checkpoint_dir_name(10), 10, ts=200.0)
    (unmarked / ckpt.MARKER).unlink()
    lines: list[str] = []
    assert ckpt.restart_point(str(run), "/given", say=lines.append) == str(run / ckpt.checkpoint_dir_name(5))
    assert any(ckpt.checkpoint_dir_name(10) in line for line in lines), lines
    assert ckpt.restart_point(str(tmp_path / "store" / "fresh"), "/given") == "/given"  # a first start
    shutil.rmtree(run / ckpt.checkpoint_dir_name(5))
    assert ckpt.restart_point(str(run), None, say=lines.append) is None


class _Storage:
    """Ray's StorageContext as an upload function meets it: ``persist_current_checkpoint`` copies the
    rank's local dir into ``<root>/<dir name>`` (Ray 2.58 ``storage.py``: ``pyarrow.fs.copy_files``, no
    marker of its own) and returns a checkpoint there; ``fail`` is a connection lost mid-copy."""

    def __init__(self, root: Path, fail: bool = False) -> None:
        self.root, self.fail = root, fail

    def persist_current_checkpoint(self, checkpoint: Any, dir_name: str) -> Any:
        import pyarrow.fs as pafs

        dest = self.root / dir_name
        dest.mkdir(parents=True, exist_ok=True)
        for n, path in enumerate(sorted(Path(checkpoint.path).iterdir())):
            if self.fail and n == 1:
                raise ConnectionError("connection lost")
            shutil.copy(path, dest / path.name)
        return SimpleNamespace(filesystem=pafs.LocalFileSystem(), path=str(dest))


def _rank_dirs(one_rank: Path, tmp_path: Path) -> list[Path]:
    """The two local dirs two ranks report for one checkpoint (what ``save_local`` leaves each)."""
    whole = _two_rank(one_rank, tmp_path / "whole", 10, ts=0.0)
    (whole / ckpt.MARKER).unlink()
    ranks = [tmp_path / "local0", tmp_path / "local1"]
    for rank, names in enumerate(([ckpt.DCP_METADATA, "__0_0.distcp", ckpt.rank_state_file(0)],
                                  ["__1_0.distcp", ckpt.rank_state_file(1)])):
        ranks[rank].mkdir()
        for name in names:
            shutil.copy(whole / name, ranks[rank] / name)
    return ranks


def test_an_async_upload_is_complete_only_when_every_rank_has_finished_its_own(one_rank: Path,
                                                                               tmp_path: Path) -> None:
    """Rank 0 finishes first and writes the marker; without rank 1's done file the checkpoint is not
    resumable (rank 1's shard may still be on its way), and each rank's local dir goes with its upload."""
    storage, meta = _Storage(tmp_path / "store" / "run"), ckpt.CheckpointMeta(step=10, world_size=2)
    local = _rank_dirs(one_rank, tmp_path)
    name = ckpt.checkpoint_dir_name(10)
    persisted = ckpt.Uploader(storage, 0, meta, str(local[0]))(SimpleNamespace(path=str(local[0])), name)
    where = storage.root / name
    assert persisted.path == str(where) and not local[0].exists()
    marker = json.loads((where / ckpt.MARKER).read_text())
    assert marker["rank_markers"] is True and marker["ts"] > 0
    assert ckpt.find_checkpoints(str(storage.root)) == []
    (partial,) = ckpt.scan(str(storage.root))
    assert partial.missing == f"no {ckpt.rank_done_file(1)}" or "__1_0.distcp" in partial.missing, partial
    ckpt.Uploader(storage, 1, meta, str(local[1]))(SimpleNamespace(path=str(local[1])), name)
    assert not local[1].exists()
    assert ckpt.find_checkpoints(str(storage.root)) == [(10, str(where))]


def test_a_rank_whose_files_arrived_but_not_its_done_file_is_partial(one_rank: Path, tmp_path: Path) -> None:
    """Every shard at full length is not enough under an async marker: a rank's state file has no
    length to check, so its done file, written after it, is what says the rank finished."""
    where = _two_rank(one_rank, tmp_path / "run" / ckpt.checkpoint_dir_name(10), 10, ts=1.0)
    (where / ckpt.MARKER).write_text(
        ckpt.CheckpointMeta(step=10, world_size=2, ts=1.0, rank_markers=True).to_json())
    (where / ckpt.rank_done_file(0)).write_text("{}")
    assert ckpt.find_checkpoints(str(tmp_path / "run")) == []
    (where / ckpt.rank_done_file(1)).write_text("{}")
    assert ckpt.find_checkpoints(str(tmp_path / "run")) == [(10, str(where))]


def test_a_failed_upload_raises_writes_no_done_file_and_leaves_no_local_dir(one_rank: Path, tmp_path: Path) -> None:
    storage = _Storage(tmp_path / "store" / "run", fail=True)
    local = _rank_dirs(one_rank, tmp_path)[0]
    with pytest.raises(ConnectionError):
        ckpt.Uploader(storage, 0, ckpt.CheckpointMeta(step=10, world_size=2), str(local))(
            SimpleNamespace(path=str(local)), ckpt.checkpoint_dir_name(10))
    where = storage.root / ckpt.checkpoint_dir_name(10)
    assert not local.exists()
    assert not (where / ckpt.MARKER).exists() and not (where / ckpt.rank_done_file(0)).exists()
