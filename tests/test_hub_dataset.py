"""Issue 36, item 6: on GPU targets the default data is a real, permissively licensed chat dataset from
the Hub, pinned to a commit at plan time like the model, and the job reads it at that commit.

The Hub double is ``tests/fake_hub.py``: ``HfApi.dataset_info`` (``/api/datasets/{id}/revision/{rev}``:
``sha``, the card's licence) and what huggingface_hub's ``HfFileSystem`` asks (tree listing, paths-info,
ranged reads of ``resolve/{rev}/{path}``), which is what ``training.data`` reads a Hub dataset with.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from backend.config import RunConfig
from backend.errors import OperationError, UserError
from backend.hub import DEFAULT_DATASET, resolve_dataset
from backend.jobspec import build_job_spec
from backend.layers.ray_job import JOB, RayJobLayer
from backend.record import RunFacts
from backend.resolve import resolve_config
from tests.fake_hub import FakeHub, chat_parquet
from training.data import _data_files, detect_data_mode, peek_records
from training.train import parse_args

SHA = "0" * 40  # a model commit: the Hub is not asked for the model


def _desired(config: RunConfig) -> dict[str, Any]:
    """What the ray-job layer plans for ``config``: its prepare (asks the Hub) and its desired job."""
    layer = RayJobLayer()
    ctx: Any = SimpleNamespace(config=config, record=SimpleNamespace(run_id="r1", jobs=[],
                                                                      facts=RunFacts()))
    asyncio.run(layer.prepare(ctx))
    [job] = layer.desired(ctx, [])
    assert job.address == JOB
    return dict(job.spec)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Any:
    with FakeHub() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield fake


@pytest.mark.parametrize("target", ["kube", "aws"])
def test_a_gpu_run_trains_on_the_default_hub_dataset_pinned_to_its_commit(hub: FakeHub, target: str) -> None:
    config = resolve_config({"target": target, "model_revision": SHA}, environ={}).config
    main = hub.dataset_refs[DEFAULT_DATASET.repo]["main"]
    job = _desired(config)
    pinned = f"hf://datasets/{DEFAULT_DATASET.repo}@{main}/{DEFAULT_DATASET.path}"
    # The plan names the dataset, the commit it resolved main to, and its licence.
    assert job["data"] == f"{pinned} (main), licence apache-2.0", job
    assert f"--data {pinned} " in job["entrypoint"] and "--data cycle" not in job["entrypoint"]
    # The job's arguments carry that commit, whatever main points at later.
    cfg = parse_args(job["entrypoint"].split()[3:])
    assert cfg.data == pinned


def test_the_local_target_keeps_the_offline_cycle() -> None:
    config = resolve_config({}, environ={}).config
    assert config.effective_data() == "cycle" and "--data cycle" in build_job_spec(config).entrypoint
    with pytest.raises(UserError, match="offline"):  # at plan time: `rtui status` etc. still resolve it
        _desired(resolve_config({"data": f"hf://datasets/{DEFAULT_DATASET.repo}"}, environ={}).config)


def test_the_hub_dataset_is_read_at_the_pinned_commit_not_the_branch_head(hub: FakeHub) -> None:
    old = hub.add_dataset("acme/chat", {"data/train.parquet": chat_parquet(4, " (old)")}, licence="mit")
    uri = f"hf://datasets/acme/chat@{old}/data"
    assert resolve_dataset("hf://datasets/acme/chat/data").sha == old
    new = hub.add_dataset("acme/chat", {"data/train.parquet": chat_parquet(4, " (new)")})  # main moves
    assert new != old and resolve_dataset("hf://datasets/acme/chat/data").describe().startswith(
        f"hf://datasets/acme/chat@{new}/data (main), licence mit")
    records = peek_records(uri, 2)
    assert records[0]["messages"][1]["content"] == "answer 0 (old)"
    assert detect_data_mode(uri, "text") == "messages"
    fs, files = _data_files(uri)
    assert files == [f"datasets/acme/chat@{old}/data/train.parquet"]
    pickle.loads(pickle.dumps(fs))  # Ray Data ships the file system to its read tasks


def test_a_hub_that_cannot_be_asked_is_one_line_saying_how_to_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    config = resolve_config({"target": "kube", "model_revision": SHA}, environ={}).config
    with pytest.raises(OperationError) as failed:
        _desired(config)
    assert DEFAULT_DATASET.repo in failed.value.message and "\n" not in failed.value.message
    assert "@COMMIT" in (failed.value.remedy or "")


def test_a_dataset_the_hub_does_not_have_is_a_user_error(hub: FakeHub, tmp_path: Path) -> None:
    config = resolve_config({"target": "kube", "model_revision": SHA, "data": "hf://datasets/acme/none"},
                            environ={}).config
    with pytest.raises(UserError, match="dataset acme/none is not on"):
        _desired(config)
