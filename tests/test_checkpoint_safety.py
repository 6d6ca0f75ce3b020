"""A checkpoint is data, not code: resuming from a directory someone else wrote runs nothing of theirs.

What upstream does with a checkpoint directory (torch 2.13, read in the installed sources):

* ``torch.distributed.checkpoint`` (DCP) writes ``.metadata`` with ``pickle.dump`` in
  ``FileSystemWriter.finish`` and reads it back with a bare ``pickle.load`` in
  ``FileSystemReader.read_metadata`` (filesystem.py): any ``__reduce__`` in that file runs.
* DCP's ``DefaultLoadPlanner.load_bytes`` (default_planner.py) reads every non-tensor item the
  metadata marks ``BytesStorageMetadata`` (the optimizer's param_groups) with
  ``torch.load(value, weights_only=False)``: a forged ``.metadata`` can point such an item at a
  pickle payload, so a safe ``.metadata`` alone is not enough.
* ``FileSystemReader.read_data`` opens ``concat_path(checkpoint dir, _StorageInfo.relative_path)``
  with whatever path the metadata names (``../`` included).
* ``torch.load(weights_only=True)`` (torch.serialization docs, "weights_only"; the default since
  torch 2.6) unpickles only tensors, primitive types, dicts/lists/tuples and an allowlist of torch
  globals; anything else raises ``UnpicklingError`` naming the refused ``GLOBAL``.

The attacks below write a marker through a pickled ``os.mkdir`` call; a refusal must leave no
marker and say in one line which checkpoint and which global were refused.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import gloo
from tests.moto_s3_server import moto_s3
from tests.training.fixtures_model import save_tiny_qwen2
from tests.training.test_finetune import build, config, run_steps
from training import checkpoint as ckpt
from training.data import SyntheticTokens
from training.safe_load import SafeFileSystemReader

SAVED_RANK_STATE_KEYS = {"data", "torch_rng"}


class Payload:
    """What an attacker pickles: unpickling it calls ``os.mkdir(marker)``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (str(self.marker),)


@pytest.fixture(scope="module", autouse=True)
def world_of_one() -> Iterator[None]:
    with gloo.world_of_one():
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2"), torch.float32)


def _local(tensor: Any) -> torch.Tensor:
    full: torch.Tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return full.detach().clone()


def _saved(model_dir: Path, where: Path, steps: int = 2,
           mark: bool = True) -> tuple[Path, dict[str, Any], dict[str, torch.Tensor]]:
    """A real checkpoint of the tiny model after ``steps`` steps, saved by the program's own code
    (copied to ``where``, then marked complete as rank 0 does once every rank reported), the rank
    state it saved and the weights it had."""
    cfg = config(model_dir, "--lr", "1e-3")
    model, optimizer = build(cfg)
    data = SyntheticTokens("cycle", 256, 2, 32, cfg.seed, 0)
    run_steps(model, optimizer, cfg, data, steps)
    state = {"data": data.state(), "torch_rng": torch.get_rng_state()}
    local = ckpt.save_local(model, optimizer, 0, state, ckpt.CheckpointMeta(step=steps, world_size=1))
    shutil.copytree(local, where)
    ckpt.discard_local(local)
    if mark:
        ckpt.mark_complete(str(where), ckpt.CheckpointMeta(step=steps, world_size=1))
    return where, state, {name: _local(t) for name, t in model.state_dict().items()}


def _fresh(model_dir: Path) -> tuple[Any, Any]:
    return build(config(model_dir, "--lr", "1e-3"))


def _real_metadata(directory: Path) -> Any:
    with open(directory / ckpt.DCP_METADATA, "rb") as f:
        return pickle.load(f)  # the test's own file, read to forge a variant of it


def _refused(call: Callable[[], object], marker: Path | None, directory: Path | str, what: str) -> None:
    """``call`` refuses the checkpoint in one line naming it and ``what``, and the payload never ran."""
    error: Exception | None = None
    try:
        call()
    except Exception as exc:  # what matters first is whether the payload ran, whatever was raised
        error = exc
    assert marker is None or not marker.exists(), f"{marker} exists: the checkpoint ran code or wrote outside its dir"
    assert isinstance(error, ckpt.UnsafeCheckpoint), f"not refused: {error!r}"
    message = str(error)
    assert "\n" not in message, message
    assert str(directory) in message and what in message, message


# -- the attacks --------------------------------------------------------------------------------

def test_rank_state_with_a_pickle_payload_runs_nothing_and_is_refused(model_dir: Path, tmp_path: Path) -> None:
    directory, _, _ = _saved(model_dir, tmp_path / "ckpt")
    marker = tmp_path / "pwned-by-rank-state"
    torch.save({"data": Payload(marker), "torch_rng": torch.get_rng_state()}, directory / ckpt.rank_state_file(0))
    model, optimizer = _fresh(model_dir)
    _refused(lambda: ckpt.load(str(directory), model, optimizer, 0), marker, directory, "mkdir")


def test_dcp_metadata_with_a_pickle_payload_runs_nothing_and_is_refused(model_dir: Path, tmp_path: Path) -> None:
    directory, _, _ = _saved(model_dir, tmp_path / "ckpt")
    marker = tmp_path / "pwned-by-metadata"
    metadata = _real_metadata(directory)
    metadata.planner_data = Payload(marker)  # the rest stays a valid DCP metadata file
    (directory / ckpt.DCP_METADATA).write_bytes(pickle.dumps(metadata))
    model, optimizer = _fresh(model_dir)
    _refused(lambda: ckpt.load(str(directory), model, optimizer, 0), marker, directory, "posix.mkdir")


def test_a_bytes_item_pointed_at_a_payload_runs_nothing_and_is_refused(model_dir: Path, tmp_path: Path) -> None:
    """A ``.metadata`` of allowed classes only, whose optimizer ``lr`` entry (a BYTE_IO item that
    DCP's default planner hands to ``torch.load(weights_only=False)``) points at a payload."""
    directory, _, _ = _saved(model_dir, tmp_path / "ckpt")
    marker = tmp_path / "pwned-by-bytes-item"
    buffer = io.BytesIO()
    torch.save(Payload(marker), buffer)
    (directory / "__0_1.distcp").write_bytes(buffer.getvalue())
    metadata = _real_metadata(directory)
    for index, info in metadata.storage_data.items():
        if index.fqn == "optim.param_groups.0.lr":
            info.relative_path, info.offset, info.length = "__0_1.distcp", 0, len(buffer.getvalue())
    (directory / ckpt.DCP_METADATA).write_bytes(pickle.dumps(metadata))
    model, optimizer = _fresh(model_dir)
    _refused(lambda: ckpt.load(str(directory), model, optimizer, 0), marker, directory, "mkdir")


def test_metadata_naming_a_file_outside_the_checkpoint_is_refused(model_dir: Path, tmp_path: Path) -> None:
    directory, _, _ = _saved(model_dir, tmp_path / "ckpt")
    (tmp_path / "elsewhere.distcp").write_bytes((directory / "__0_0.distcp").read_bytes())
    metadata = _real_metadata(directory)
    for info in metadata.storage_data.values():
        info.relative_path = "../elsewhere.distcp"
    (directory / ckpt.DCP_METADATA).write_bytes(pickle.dumps(metadata))
    model, optimizer = _fresh(model_dir)
    _refused(lambda: ckpt.load(str(directory), model, optimizer, 0), None, directory, "../elsewhere.distcp")


def test_the_driver_refuses_a_hostile_checkpoint_before_any_worker_loads_it(model_dir: Path, tmp_path: Path) -> None:
    """``--resume-from`` is resolved in the job's driver: the refusal comes there, in one line."""
    directory, _, _ = _saved(model_dir, tmp_path / "run" / ckpt.checkpoint_dir_name(2))
    marker = tmp_path / "pwned-on-the-driver"
    metadata = _real_metadata(directory)
    metadata.planner_data = Payload(marker)
    (directory / ckpt.DCP_METADATA).write_bytes(pickle.dumps(metadata))
    _refused(lambda: ckpt.resolve_resume(str(tmp_path / "run"), str(tmp_path / "storage")), marker, directory,
             "posix.mkdir")


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:  # boto3's clients are untyped
    """moto's S3 over real HTTP (``AWS_ENDPOINT_URL``, which boto3 and pyarrow's S3 both read).
    moto, like S3, stores a key holding ``..`` as given (S3 user guide, "Naming objects": such keys
    are allowed and not normalised)."""
    with moto_s3(monkeypatch, "shared-ckpts") as client:
        yield client


def test_a_remote_checkpoint_listing_a_dotdot_key_writes_nothing_outside(
        bucket: Any, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's ``Checkpoint.as_directory`` downloads a remote checkpoint with ``pyarrow.fs.copy_files``
    into ``<tempdir>/checkpoint_tmp_<uuid>``, joining each listed key to it as is; pyarrow reads the
    key ``run/ck/sub/../../escaped`` as ``run/escaped`` and writes it to ``<tempdir>/escaped``."""
    directory, _, _ = _saved(model_dir, tmp_path / "ckpt")
    for path in directory.iterdir():
        bucket.put_object(Bucket="shared-ckpts", Key=f"run/ck/{path.name}", Body=path.read_bytes())
    bucket.put_object(Bucket="shared-ckpts", Key="run/escaped", Body=b"written outside")
    bucket.put_object(Bucket="shared-ckpts", Key="run/ck/sub/../../escaped", Body=b"written outside")
    downloads = tmp_path / "tmp"  # Ray's temp dir: an escape lands here, not on the machine at large
    downloads.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(downloads))
    model, optimizer = _fresh(model_dir)
    uri = "s3://shared-ckpts/run/ck"
    _refused(lambda: ckpt.load(uri, model, optimizer, 0), downloads / "escaped", uri, "sub/../../escaped")
    _refused(lambda: ckpt.verify(uri), downloads / "escaped", uri, "sub/../../escaped")
    assert not list(downloads.iterdir())  # nothing was downloaded at all


# -- what still works ---------------------------------------------------------------------------

def test_the_allowlist_covers_every_global_a_real_checkpoint_holds(model_dir: Path, tmp_path: Path) -> None:
    """The allowlist was derived this way: record every global DCP pickles into ``.metadata`` for
    the tiny model with its AdamW state. A torch upgrade that adds one fails here, not in a job."""
    directory, _, _ = _saved(model_dir, tmp_path / "ckpt")
    seen: set[tuple[str, str]] = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            seen.add((module, name))
            return super().find_class(module, name)

    with open(directory / ckpt.DCP_METADATA, "rb") as f:
        Recording(f).load()
    assert ("torch.distributed.checkpoint.metadata", "Metadata") in seen
    assert seen <= ckpt.DCP_METADATA_GLOBALS, seen - ckpt.DCP_METADATA_GLOBALS


def test_save_then_load_round_trips_weights_optimizer_and_rng(model_dir: Path, tmp_path: Path) -> None:
    directory, state, weights = _saved(model_dir, tmp_path / "ckpt")
    # The rank state is plain data: torch.load's safe mode reads it without any extra globals.
    assert set(torch.load(directory / ckpt.rank_state_file(0), weights_only=True)) == SAVED_RANK_STATE_KEYS
    expected_draw = torch.rand(4, generator=torch.Generator().set_state(state["torch_rng"]))

    model, optimizer = _fresh(model_dir)
    torch.manual_seed(12345)  # the process's RNG moved on since the save
    restored = ckpt.load(str(directory), model, optimizer, 0)
    assert restored.meta.step == 2 and restored.rank_state is not None
    torch.set_rng_state(restored.rank_state["torch_rng"])
    assert torch.equal(torch.rand(4), expected_draw)
    data = SyntheticTokens("cycle", 256, 2, 32, 0, 0)
    data.load_state(restored.rank_state["data"])
    assert torch.equal(data.generator.get_state(), state["data"]["generator"])

    got = {name: _local(t) for name, t in model.state_dict().items()}
    assert got.keys() == weights.keys()
    assert all(torch.equal(got[name], weights[name]) for name in weights)
    assert {float(s["step"]) for s in optimizer.state_dict()["state"].values()} == {2.0}
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_dcp_reader_itself_refuses_hostile_metadata(model_dir: Path, tmp_path: Path) -> None:
    """The reader handed to ``dcp.load`` refuses on its own (also for the rank-local
    ``__<rank>.metadata`` DCP falls back to), not only the check before it."""
    directory, _, _ = _saved(model_dir, tmp_path / "ckpt")
    marker = tmp_path / "pwned-through-the-reader"
    metadata = _real_metadata(directory)
    metadata.planner_data = Payload(marker)
    (directory / "__0.metadata").write_bytes(pickle.dumps(metadata))
    reader = SafeFileSystemReader(str(directory), str(directory))
    assert reader.read_metadata().storage_data  # the real one reads
    _refused(lambda: reader.read_metadata(rank=0), marker, directory, "__0.metadata names posix.mkdir")


def test_a_refusal_survives_the_trip_to_the_driver() -> None:
    """DCP gathers a rank's exception to all ranks and Ray ships it to the driver, both by pickle."""
    refusal = ckpt.UnsafeCheckpoint("s3://bucket/run/checkpoint_step_00000010", ".metadata names os.system")
    again = pickle.loads(pickle.dumps(refusal))
    assert isinstance(again, ckpt.UnsafeCheckpoint) and str(again) == str(refusal)
