"""The run delivers a model, for real: `rtui up` on the local target (a real Ray cluster, the real
binary), the job exports the tiny model, `rtui model --to` copies it, from_pretrained loads it and
reproduces the trained model's logits, eval after < before; `down` keeps it, `--delete-data` removes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.delivery import local_data_dir
from backend.store import RunStore
from tests.conftest import json_lines, run_rtui
from training.export import CHECK_FILE
from training.protocol import parse_record

pytestmark = pytest.mark.ray


def test_a_local_run_exports_a_model_that_loads_and_gives_the_trained_logits(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    proc = run_rtui("up", "--yes", "--json", "--steps", "40", timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_id = json_lines(proc.stdout)[0]["data"]["run_id"]
    data = local_data_dir(RunStore().root, run_id)
    assert data.stat().st_mode & 0o777 == 0o700

    spool = Path(RunStore().load(run_id).spool_path).read_text()
    evals = [r for line in spool.splitlines() if "RTUI_EVAL" in line
             and (r := parse_record(line, ("RTUI_EVAL",))) is not None]
    assert [e[1]["phase"] for e in evals] == ["before", "after"], evals
    exported = next(line for line in spool.splitlines() if "rtui-train: model (final) written to" in line)
    print(exported)

    status = json_lines(run_rtui("status", run_id, "--json", check=True).stdout)[0]
    model = status["model"]
    assert model and model["format"] == "hf" and model["uri"].startswith(str(data))
    before, after = model["eval_loss_before"], model["eval_loss_after"]
    assert after < before, (before, after)
    assert status["summary"]["eval_tokens"] >= 2048
    print(f"eval loss {before} → {after} on {status['summary']['eval_tokens']} tokens; "
          f"export {status['summary']['model']['export_s']}s for {status['summary']['model']['state_bytes']:,} bytes")

    target = tmp_path / "fetched"
    out = run_rtui("model", run_id, "--to", str(target), check=True).stdout
    assert f"copied to {target}" in out
    loaded = AutoModelForCausalLM.from_pretrained(target)
    check = load_file(str(target / CHECK_FILE))
    with torch.no_grad():
        logits = loaded(input_ids=check["input_ids"]).logits.float()
    assert torch.allclose(logits, check["logits"], atol=1e-4, rtol=1e-4), (logits - check["logits"]).abs().max()
    info = json_lines(run_rtui("model", run_id, "--json", check=True).stdout)[0]
    assert info["bytes"] == sum((target / n).stat().st_size for n in info["files"] if n != "rtui_model.json")

    down = run_rtui("down", run_id, "--yes", "--json", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    kept = [e for e in json_lines(down.stdout) if e["step"] == "data"]
    assert kept and kept[-1]["data"]["kept"]["models"] == 1, kept
    assert Path(model["uri"]).is_dir()
    gone = run_rtui("down", run_id, "--yes", "--delete-data", timeout=120)
    assert gone.returncode == 0 and not data.exists(), gone.stdout + gone.stderr
    assert json.loads(run_rtui("status", run_id, "--json", check=True).stdout.splitlines()[0])["model"] is None
