"""`rtui up --model-id DIR` on the local target: the job loads the directory through the cluster's
``from_pretrained`` path (real Ray, the real `rtui` binary). A model saved in bf16 trains like the same
weights saved in fp32: both load as fp32 master weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from backend.store import RunStore
from tests.conftest import json_lines, run_rtui
from tests.training.fixtures_model import save_tiny_qwen2
from training.protocol import METRIC_TAG, parse_record

pytestmark = pytest.mark.ray

STEPS = 6


def up(model_dir: Path, run_ids: list[str]) -> list[dict[str, Any]]:
    """``rtui up`` with the model directory: the job's metric records; its run id goes to ``run_ids``
    first (the caller takes the run down, whatever failed). A second ``up`` is a second job on the same
    run's cluster (one cluster start for both)."""
    proc = run_rtui("up", "--yes", "--json", "--model-id", str(model_dir), "--steps", str(STEPS), "--seq-len", "32",
                    "--batch-size", "2", "--learning-rate", "0.001", timeout=400)
    events = json_lines(proc.stdout)
    run_id = events[0]["data"]["run_id"] if events else None
    if isinstance(run_id, str):
        run_ids.append(run_id)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert events[-1]["data"]["job_status"] == "SUCCEEDED"
    assert isinstance(run_id, str)
    job = RunStore().load(run_id).jobs[-1]
    spool = Path(RunStore().load(run_id).job_spool_path(job))
    return [rec for line in spool.read_text().splitlines()
            if METRIC_TAG in line and (parsed := parse_record(line)) and (rec := parsed[1])]


def test_local_up_trains_the_model_directory_and_bf16_matches_fp32(tmp_path: Path) -> None:
    bf16 = save_tiny_qwen2(tmp_path / "bf16", torch.bfloat16)
    fp32 = save_tiny_qwen2(tmp_path / "fp32", torch.float32)  # the same (bf16-representable) weights
    from transformers import Qwen2ForCausalLM

    params = sum(p.numel() for p in Qwen2ForCausalLM.from_pretrained(bf16).parameters())
    run_ids: list[str] = []
    try:
        from_bf16, from_fp32 = up(bf16, run_ids), up(fp32, run_ids)
    finally:
        for run_id in dict.fromkeys(run_ids):
            down = run_rtui("down", run_id, "--yes", timeout=120)
            assert down.returncode == 0, down.stdout + down.stderr
    assert len(set(run_ids)) == 1  # the second job ran on the first one's cluster ...
    jobs = RunStore().load(run_ids[0]).jobs
    assert len(jobs) == 2 and jobs[0].spec_hash != jobs[1].spec_hash  # ... as a job of its own model dir
    assert [r["step"] for r in from_bf16] == list(range(1, STEPS + 1))
    assert {r["params"] for r in from_bf16} == {params}  # the directory's model, not the tiny default
    losses_bf16, losses_fp32 = [r["loss"] for r in from_bf16], [r["loss"] for r in from_fp32]
    assert losses_bf16 == pytest.approx(losses_fp32, rel=1e-3), (losses_bf16, losses_fp32)
    assert losses_bf16[-1] < losses_bf16[0]
