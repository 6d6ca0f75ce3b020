"""A run's data on S3 (issue 25): the run's own prefix under ``--storage-path``; `rtui model` fetches
its newest complete model, `status` and `down` say what is kept and what it costs a month, and
`down --delete-data` deletes that prefix only — never another run's under the same path.

S3 is moto's server over real HTTP in a process of its own (its backends are process-wide). Real S3
lists a prefix 1,000 keys a page (ListObjectsV2 ``MaxKeys``) and DeleteObjects takes at most 1,000
keys (S3 API reference); moto pages and limits the same way, so the store is tested with more keys
than one page holds.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from backend.clients import Clients, ClientsClosed
from backend.delivery import (
    S3_STANDARD_PER_GIB_MONTH,
    S3Store,
    check_storage_writable,
    data_store_for,
    run_storage_uri,
)
from backend.errors import OperationError
from backend.jobspec import build_job_spec
from backend.resources import CheckStatus
from backend.store import RunStatus, RunStore
from targets.kube.config import KubeConfig
from tests.conftest import json_lines, run_rtui
from tests.moto_process import moto_server_process
from training.export import MODEL_MARKER, upload_dir

BUCKET = "rtui-models"
EVAL = {"before": {"loss": 6.9, "perplexity": 992.3, "tokens": 64, "step": 0, "phase": "before"},
        "after": {"loss": 1.2, "perplexity": 3.3, "tokens": 64, "step": 7, "phase": "after"}}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server_process() as endpoint:
        yield endpoint


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    import boto3

    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for key, value in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_CONFIG_FILE": "/nonexistent/rtui-test-aws-config",
                       "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/rtui-test-aws-credentials"}.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    yield client
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=obj["Key"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model directory written by training.export (one gloo rank, the tiny model)."""
    from tests.test_training_export import export_one_rank

    root = tmp_path_factory.mktemp("exported")
    export_one_rank(str(root), step=7, evaluation=EVAL)
    return root / "model"


def _tree(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def _upload(exported: Path, uri: str) -> list[str]:
    files = _tree(exported)  # rtui's check data sits in a subdirectory (training.export.RTUI_DIR)
    upload_dir(str(exported), uri, files)
    return files


def kube_run(storage: str) -> str:
    """A finished kube run that wrote to ``storage`` (its cluster unreachable: the kubeconfig is gone)."""
    store = RunStore()
    record = store.create(KubeConfig(target="kube", cluster_name="rtui-ray", storage_path=storage))
    record.status = RunStatus.DOWN
    store.save(record)
    return record.run_id


def test_the_job_writes_under_the_runs_own_prefix() -> None:
    config = KubeConfig(target="kube", storage_path="s3://bkt/p/")
    spec = build_job_spec(config, run_id="r-1")
    assert "--storage-path s3://bkt/p/r-1" in spec.entrypoint
    assert run_storage_uri("s3://bkt/p/", "r-1") == "s3://bkt/p/r-1"
    assert isinstance(data_store_for("s3://bkt/p", "r-1", local_default=None), S3Store)
    assert data_store_for(None, "r-1", local_default=None) is None


def test_model_fetches_the_newest_complete_one_and_status_prices_what_is_kept(
        s3: Any, exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "gone-kubeconfig"))
    storage = f"s3://{BUCKET}/runs"
    run_id = kube_run(storage)
    mine = run_storage_uri(storage, run_id)
    files = _upload(exported, f"{mine}/rtui-1700000000/model")
    # An export that did not finish (no marker: it is uploaded last), and another run's newer model.
    s3.put_object(Bucket=BUCKET, Key=f"runs/{run_id}/rtui-1700000000/export-step-9/config.json", Body=b"{}")
    _upload(exported, f"{storage}/other-run/rtui-1800000000/model")

    fetched = tmp_path / "fetched"
    out = run_rtui("model", run_id, "--to", str(fetched), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json_lines(out.stdout)[0]
    assert summary["uri"] == f"{mine}/rtui-1700000000/model" and summary["copied_to"] == str(fetched)
    assert _tree(fetched) == files
    for name in files:
        assert (fetched / name).read_bytes() == (exported / name).read_bytes()

    status = run_rtui("status", run_id, "--json", timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    report = json_lines(status.stdout)[0]
    assert report["model"]["uri"] == summary["uri"]
    size = sum((exported / n).stat().st_size for n in files) + 2  # and the unfinished export's "{}"
    assert report["data"]["bytes"] == size and report["data"]["models"] == 1
    assert report["data"]["monthly_cost"] == pytest.approx(size / 2**30 * S3_STANDARD_PER_GIB_MONTH)


def test_a_resumed_fetch_keeps_what_it_has(s3: Any, exported: Path, tmp_path: Path) -> None:
    storage = f"s3://{BUCKET}/resume"
    uri = run_storage_uri(storage, "r-2")
    _upload(exported, f"{uri}/job/model")
    store = S3Store(uri)
    model = asyncio.run(store.latest_model())
    assert model is not None and model.step == 7 and MODEL_MARKER in model.files
    to = tmp_path / "to"
    assert sorted(asyncio.run(store.fetch(model, to))) == sorted(model.files)
    (to / "model.safetensors").unlink()
    seen: list[tuple[int, int]] = []
    assert asyncio.run(store.fetch(model, to, lambda done, total: seen.append((done, total)))) == [
        "model.safetensors"]
    assert seen[-1][0] == seen[-1][1] == sum((to / name).stat().st_size for name in model.files)


def test_down_keeps_then_delete_data_removes_only_this_runs_prefix(s3: Any) -> None:
    from backend.flows import data_after_down

    storage = f"s3://{BUCKET}/shared"
    # More keys than one page of a listing or one DeleteObjects call holds.
    keys = [f"shared/{run}/job/checkpoint_{i:05d}/rtui_checkpoint.json"
            for run, count in (("mine", 1_050), ("theirs", 3)) for i in range(count)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: s3.put_object(Bucket=BUCKET, Key=key, Body=b"{}"), keys))

    class Session:  # what data_after_down reads of a session
        run_id = "mine"

        @staticmethod
        def data_store() -> S3Store:
            return S3Store(run_storage_uri(storage, "mine"))

    async def events(delete: bool) -> list[Any]:
        return [e async for e in data_after_down(Session(), delete)]  # type: ignore[arg-type]

    started, kept = asyncio.run(events(False))
    assert started.message == "Keep the run's checkpoints and models"  # the teardown pane's heading
    assert kept.message.startswith(f"kept on purpose: {storage}/mine: 0 models, 1,050 checkpoints")
    assert kept.message.endswith("2.1 kB, under $0.01/month") and "--delete-data" in (kept.remedy or "")
    *_, done = asyncio.run(events(True))
    assert done.data["deleted"]["checkpoints"] == 1_050
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="shared/")["Contents"]]
    assert len(left) == 3 and all(k.startswith("shared/theirs/") for k in left)


def test_a_sessions_stores_and_storage_check_share_its_s3_client_and_close_with_it(s3: Any) -> None:
    """Issue 38: every client from the session. A store or a check made in a session asks S3 through the
    session's one client (not a boto3 session each); when the session ends, that client is closed and a
    store of that session may not open another behind its back."""
    clients = Clients()
    storage = f"s3://{BUCKET}/team"
    one = data_store_for(storage, "r1", local_default=None, clients=clients)
    two = data_store_for(storage, "r2", local_default=None, clients=clients)
    assert isinstance(one, S3Store) and isinstance(two, S3Store)
    assert asyncio.run(one.usage()).checkpoints == 0 and asyncio.run(two.usage()).checkpoints == 0
    assert check_storage_writable(storage, run_id="r1", clients=clients).status is CheckStatus.OK
    assert len(clients) == 2  # S3 and STS, one each, for both stores and the check
    clients.close()
    with pytest.raises(ClientsClosed):
        asyncio.run(S3Store(run_storage_uri(storage, "r3"), clients=clients).usage())


def test_a_listing_the_credentials_may_not_make_is_one_line(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = S3Store(f"s3://no-such-bucket-{os.getpid()}/runs/r")
    with pytest.raises(OperationError) as err:
        asyncio.run(store.usage())
    assert err.value.message == f"listing s3://no-such-bucket-{os.getpid()}/runs/r failed: NoSuchBucket"
    assert "s3:ListBucket" in (err.value.remedy or "")
    assert json.dumps(err.value.message).count("\\n") == 0


# ---- `rtui model` writes nothing outside --to (issue 33, item 2) -----------------------------------
# An S3 key is any UTF-8 string up to 1,024 bytes (Amazon S3 user guide, "Naming Amazon S3 objects"):
# `..` segments, a leading `/` after the prefix, backslashes and control characters are all valid keys,
# and moto's server stores and lists them as S3 does. So a marker may list such a name and the
# completeness check (every listed name is a key) still passes.

def _hostile_model(s3: Any, exported: Path, prefix: str, extra: list[str], body: bytes = b"pwned") -> None:
    """A complete model under ``s3://BUCKET/prefix`` whose marker also lists ``extra``, each a key there."""
    _upload(exported, f"s3://{BUCKET}/{prefix}")
    marker = json.loads((exported / MODEL_MARKER).read_text())
    marker["files"] = [*marker["files"], *extra]
    for name in extra:
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=body)
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{MODEL_MARKER}", Body=json.dumps(marker).encode())


def _everything_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("bad", ["../x", "/ABS/x", "a\\b", "a/../../x", "a\0b", "a/./b", "a//b", "a\x1bb"])
def test_a_marker_naming_a_file_outside_to_is_refused_before_any_byte(
        s3: Any, exported: Path, tmp_path: Path, bad: str) -> None:
    from backend.safepath import UnsafeName

    home = tmp_path / "home"  # the sentinel: `to` is inside it, nothing else may appear there
    (home / "ABS").mkdir(parents=True)
    bad = bad.replace("/ABS", str(home / "ABS"))  # an absolute name, pointing into the sentinel
    to = home / "models" / "to"
    uri = run_storage_uri(f"s3://{BUCKET}/hostile", "r-3")
    _hostile_model(s3, exported, "hostile/r-3/job/model", [bad])
    store = S3Store(uri)
    model = asyncio.run(store.latest_model())
    assert model is not None and bad in model.files  # offered: every listed name is a key there
    before = _everything_under(home)
    with pytest.raises(UnsafeName) as err:
        asyncio.run(store.fetch(model, to))
    assert str(err.value).count("\n") == 0 and json.dumps(bad) in err.value.message, err.value.message
    assert "nothing was written" in err.value.message
    assert _everything_under(home) == before  # not `to`, not a .part, not the file


def test_rtui_model_refuses_a_marker_that_climbs_out_of_to_in_one_line(
        s3: Any, exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "gone-kubeconfig"))
    storage = f"s3://{BUCKET}/cli"
    run_id = kube_run(storage)
    home = tmp_path / "home"
    (home / "me").mkdir(parents=True)
    _hostile_model(s3, exported, f"cli/{run_id}/rtui-1700000000/model", ["../../../.bashrc"])
    out = run_rtui("model", run_id, "--to", str(home / "me" / "models" / "x"))
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "Traceback" not in text and '"../../../.bashrc"' in text, text
    assert not (home / ".bashrc").exists() and _everything_under(home) == {"me"}


def test_a_symlinked_directory_inside_to_is_never_written_through(
        s3: Any, exported: Path, tmp_path: Path) -> None:
    from backend.safepath import UnsafeName

    outside, to = tmp_path / "outside", tmp_path / "to"
    outside.mkdir()
    to.mkdir()
    (to / "sub").symlink_to(outside, target_is_directory=True)  # left there, or planted by anyone
    uri = run_storage_uri(f"s3://{BUCKET}/links", "r-4")
    _hostile_model(s3, exported, "links/r-4/job/model", ["sub/config.json"])
    store = S3Store(uri)
    model = asyncio.run(store.latest_model())
    assert model is not None
    with pytest.raises(UnsafeName) as err:
        asyncio.run(store.fetch(model, to))
    assert '"sub/config.json"' in err.value.message and "symlink" in err.value.message
    assert list(outside.iterdir()) == []
    assert sorted(os.listdir(to)) == ["sub"]  # nothing else written before the refusal


def test_an_existing_symlink_in_place_of_a_model_file_is_refused(
        s3: Any, exported: Path, tmp_path: Path) -> None:
    from backend.safepath import UnsafeName

    victim = tmp_path / "victim"
    victim.write_bytes(b"mine")
    to = tmp_path / "to"
    to.mkdir()
    (to / "config.json").symlink_to(victim)
    uri = run_storage_uri(f"s3://{BUCKET}/links", "r-5")
    _upload(exported, f"{uri}/job/model")
    store = S3Store(uri)
    model = asyncio.run(store.latest_model())
    assert model is not None and "config.json" in model.files
    with pytest.raises(UnsafeName) as err:
        asyncio.run(store.fetch(model, to))
    assert '"config.json"' in err.value.message and "symlink" in err.value.message
    assert victim.read_bytes() == b"mine" and (to / "config.json").is_symlink()
    assert sorted(os.listdir(to)) == ["config.json"]
