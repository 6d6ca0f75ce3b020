"""The training program's S3 writes, alone: the model export uploads through boto3 to moto's server
over real HTTP (``AWS_ENDPOINT_URL``, as a pod's environment or service account would set it up)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.moto_s3_server import moto_s3
from tests.test_cli_model import EVAL
from tests.test_training_export import export_one_rank
from training.export import CHECK_FILE, MODEL_MARKER, ExportInfo


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:  # boto3's clients are untyped
    with moto_s3(monkeypatch, "models") as client:
        yield client


def _export_to(root: str, **kwargs: object) -> ExportInfo | None:
    return export_one_rank(root, step=7, evaluation=EVAL, **kwargs)


def test_export_to_s3_uploads_a_directory_from_pretrained_loads(s3: Any, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    info = _export_to("s3://models/runs/r1")
    assert info is not None and info.uri == "s3://models/runs/r1/model"
    listed = s3.list_objects_v2(Bucket="models", Prefix="runs/r1/model/")["Contents"]
    names = {o["Key"].removeprefix("runs/r1/model/") for o in listed}
    assert names == set(info.files) and MODEL_MARKER in names
    local = tmp_path / "dl"
    local.mkdir()
    for name in names:
        (local / name).parent.mkdir(exist_ok=True)
        s3.download_file("models", f"runs/r1/model/{name}", str(local / name))
    check = load_file(str(local / CHECK_FILE))
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(local)(input_ids=check["input_ids"]).logits
    assert torch.allclose(logits, check["logits"], atol=1e-5)


def test_an_upload_cut_short_leaves_no_marker(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The marker goes last: an upload interrupted (teardown, a lost connection) leaves a prefix
    without it, which nothing offers as a model."""
    import boto3.s3.transfer

    real = boto3.s3.transfer.S3Transfer.upload_file
    sent: list[str] = []

    def flaky(self: object, filename: str, bucket: str, key: str, *args: object, **kwargs: object) -> None:
        if len(sent) == 2:
            raise ConnectionError("connection lost")
        sent.append(key)
        real(self, filename, bucket, key, *args, **kwargs)

    monkeypatch.setattr(boto3.s3.transfer.S3Transfer, "upload_file", flaky)
    with pytest.raises(ConnectionError):
        _export_to("s3://models/runs/r2")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="models", Prefix="runs/r2/")["Contents"]]
    assert len(keys) == 2 and not any(k.endswith(MODEL_MARKER) for k in keys)
