"""`rtui model`, `rtui status --json`'s model and `rtui down` keeping the data, through the real binary.

The run's data dir holds a model the training program's own export wrote (one gloo rank, no Ray); the
Ray end to end of the same path is tests/test_local_finished_run.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from backend.delivery import local_data_dir
from backend.store import RunStatus, RunStore
from targets.local.config import LocalConfig
from tests.conftest import json_lines, run_rtui
from tests.test_cli_errors import assert_one_line
from training.export import CHECK_FILE, INCOMPLETE, MODEL_MARKER, ExportInfo
from training.metrics import eval_record, model_record
from training.protocol import SUMMARY_TAG, format_record

EVAL = {"before": {"loss": 6.93, "perplexity": 1022.7, "tokens": 2048, "step": 0, "phase": "before"},
        "after": {"loss": 0.08, "perplexity": 1.08, "tokens": 2048, "step": 20, "phase": "after"}}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model directory written by training.export from a one-rank FSDP2 model."""
    from tests.test_training_export import export_one_rank

    root = tmp_path_factory.mktemp("exported")
    export_one_rank(str(root), step=20, evaluation=EVAL)
    return root / "model"


def finished_run(exported: Path, *, partial: bool = False) -> tuple[str, Path]:
    """A finished local run whose job wrote its model under the run's data dir and its summary to the spool."""
    store = RunStore()
    record = store.create(LocalConfig())
    record.status = RunStatus.UP
    data = local_data_dir(store.root, record.run_id)
    job_dir = data / "rtui-1700000000"
    job_dir.mkdir(parents=True)
    shutil.copytree(exported, job_dir / ("model" if not partial else f".model{INCOMPLETE}x1y2"))
    spool = Path(record.spool_path)
    spool.parent.mkdir(parents=True, exist_ok=True)
    info = ExportInfo(**{**json.loads((exported / MODEL_MARKER).read_text()), "uri": str(job_dir / "model")})
    summary = {"steps": 20, "final_loss": 0.1, **eval_record(EVAL), "model": model_record(info)}
    spool.write_text(format_record(SUMMARY_TAG, summary) + "\n")
    store.save(record)
    return record.run_id, data


def test_model_copies_the_directory_and_says_how_to_load_it(exported: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    run_id, data = finished_run(exported)
    status = json_lines(run_rtui("status", run_id, "--json", check=True).stdout)[0]
    model = status["model"]
    assert model["uri"] == str(data / "rtui-1700000000" / "model") and model["format"] == "hf"
    assert (model["eval_loss_before"], model["eval_loss_after"]) == (6.93, 0.08)
    assert "config.json" in model["files"] and model["bytes"] > 0
    text = run_rtui("status", run_id, check=True).stdout
    assert "eval loss 6.93 → 0.08 on 2,048 held-out tokens" in text

    target = tmp_path / "fetched"
    out = run_rtui("model", run_id, "--to", str(target), check=True).stdout
    assert f"copied to {target}" in out and f"from_pretrained('{target}')" in out
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()) == sorted(model["files"])
    loaded = AutoModelForCausalLM.from_pretrained(target)
    check = load_file(str(target / CHECK_FILE))
    with torch.no_grad():
        logits = loaded(input_ids=check["input_ids"]).logits
    assert torch.allclose(logits, check["logits"], atol=1e-5)

    as_json = json_lines(run_rtui("model", run_id, "--json", check=True).stdout)[0]
    assert {k: as_json[k] for k in ("uri", "format", "files", "bytes", "eval_loss_before", "eval_loss_after")} == \
        {k: model[k] for k in ("uri", "format", "files", "bytes", "eval_loss_before", "eval_loss_after")}


def test_a_second_fetch_goes_on_where_the_first_stopped(exported: Path, tmp_path: Path) -> None:
    run_id, _ = finished_run(exported)
    target = tmp_path / "fetched"
    run_rtui("model", run_id, "--to", str(target), check=True)
    (target / "model.safetensors").unlink()
    before = {n: (target / n).stat().st_mtime_ns for n in os.listdir(target)}
    run_rtui("model", run_id, "--to", str(target), check=True)
    assert (target / "model.safetensors").is_file()
    assert all((target / n).stat().st_mtime_ns == t for n, t in before.items())


def test_an_interrupted_export_is_not_offered(exported: Path) -> None:
    run_id, data = finished_run(exported, partial=True)
    assert_one_line(run_rtui("model", run_id, "--to", "x"), 2, f"run {run_id} has no complete model")
    assert json_lines(run_rtui("status", run_id, "--json", check=True).stdout)[0]["model"] is None


def test_bad_to_is_one_line_exit_2(exported: Path, tmp_path: Path) -> None:
    run_id, _ = finished_run(exported)
    (tmp_path / "afile").write_text("x")
    assert_one_line(run_rtui("model", run_id, "--to", str(tmp_path / "afile")), 2, "is a file, not a directory")
    assert_one_line(run_rtui("model", "nosuchrun"), 2, "no run")


@pytest.mark.host_clusters  # no orphans: counts on no other test's cluster being up
def test_down_keeps_the_data_and_lists_it_then_delete_data_removes_it(exported: Path) -> None:
    run_id, data = finished_run(exported)
    down = run_rtui("down", run_id, "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "kept on purpose" in down.stdout and "1 model" in down.stdout and "--delete-data" in down.stdout
    assert (data / "rtui-1700000000" / "model" / MODEL_MARKER).is_file()
    assert json_lines(run_rtui("status", run_id, "--json", check=True).stdout)[0]["model"] is not None
    # The sweep of another run's status reports it as kept on purpose, not as a leftover.
    other = RunStore().create(LocalConfig(cluster_name="other"))
    swept = json_lines(run_rtui("status", other.run_id, "--json", check=True).stdout)[0]
    assert swept["orphans"] == [] and [k["run_id"] for k in swept["kept_data"]] == [run_id]
    assert swept["kept_data"][0]["kept_on_purpose"] is True and swept["kept_data"][0]["models"] == 1
    assert "kept      on purpose: run " + run_id in run_rtui("status", other.run_id, check=True).stdout
    again = run_rtui("down", run_id, "--yes", "--delete-data", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    deleted = [e for e in json_lines(again.stdout) if e["step"] == "data" and e["kind"] == "done"]
    assert deleted and deleted[0]["data"]["deleted"]["models"] == 1
    assert not data.exists()
