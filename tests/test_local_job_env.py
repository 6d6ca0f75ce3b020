"""Issue 23 item 5, the local half: ``--job-env`` values reach the job through a 0600 file in the
cluster's 0700 dir, never through ``runtime_env``. Here the entrypoint's side; the real local Ray
cluster's (no value in the Jobs API, Ray's logs or rtui's records) is in tests/test_local_finished_run.py."""

from __future__ import annotations

import json
from pathlib import Path

VALUE = "hf_rtuiJobEnvProbe7c41e9"


def test_the_entrypoint_loads_the_file_it_is_pointed_at(tmp_path: Path) -> None:
    from training.passed_env import JOB_ENV_FILE, load_passed_env

    assert load_passed_env({}) == []
    carrier = tmp_path / "env.json"
    carrier.write_text(json.dumps({"HF_TOKEN": VALUE, "WANDB_API_KEY": "w"}))
    environ = {JOB_ENV_FILE: str(carrier)}
    assert load_passed_env(environ) == ["HF_TOKEN", "WANDB_API_KEY"]
    assert environ["HF_TOKEN"] == VALUE
