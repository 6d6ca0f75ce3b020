"""bench/gpu_step.py's CPU smoke run: the GPU check runs end to end with only torch and transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_gpu_step_tiny_runs_the_production_path_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # the script finds the project itself
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_step.py"), "--tiny", "--steps", "5",
                           "--out", str(out)], capture_output=True, text=True, timeout=240, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "gpu_step: RESULT tokens/s" in proc.stdout
    # Saved in bf16, loaded by the production path: fp32 master weights and AdamW states, train mode.
    assert result["loaded_param_dtype"] == "torch.float32" and result["param_dtype"] == "torch.float32"
    assert result["optimizer_state_dtypes"] == ["torch.float32"]
    assert result["model_training"] is True and result["use_cache"] is False
    assert result["weights_moved_share"] == 1.0
    assert result["loss_fell"] and result["tokens_per_s"] > 0 and len(result["losses"]) == 5


def test_gpu_step_bad_input_is_one_line_and_exit_2() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_step.py"), "--steps", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--steps, --seq and --batch must be at least 1" in proc.stderr
    assert "Traceback" not in proc.stderr
