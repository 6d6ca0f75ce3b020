"""Issue 23 item 5, the local half: ``--job-env`` values reach the job through a 0600 file in the
cluster's 0700 dir, never through ``runtime_env``, where Ray's Jobs API returns them to anyone with
the token and its runtime-env agent writes them to its log (a real local Ray cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from backend.layers.local_cluster import find_clusters
from backend.store import JobState, RunStore
from tests.conftest import json_lines

VALUE = "hf_rtuiJobEnvProbe7c41e9"


def test_the_entrypoint_loads_the_file_it_is_pointed_at(tmp_path: Path) -> None:
    from training.passed_env import JOB_ENV_FILE, load_passed_env

    assert load_passed_env({}) == []
    carrier = tmp_path / "env.json"
    carrier.write_text(json.dumps({"HF_TOKEN": VALUE, "WANDB_API_KEY": "w"}))
    environ = {JOB_ENV_FILE: str(carrier)}
    assert load_passed_env(environ) == ["HF_TOKEN", "WANDB_API_KEY"]
    assert environ["HF_TOKEN"] == VALUE


@pytest.mark.ray
def test_job_env_value_is_not_in_the_jobs_api_nor_in_rays_logs(tmp_path: Path) -> None:
    rtui = str(Path(sys.executable).parent / "rtui")
    env = {**os.environ, "HF_TOKEN": VALUE, "RTUI_STATE_DIR": str(tmp_path / "state")}
    try:
        up = subprocess.run([rtui, "up", "--yes", "--json", "--steps", "2", "--job-env", "HF_TOKEN",
                             "--cluster-name", "jobenv"], env=env, capture_output=True, text=True, timeout=500)
        assert up.returncode == 0, up.stderr[-2000:]
        run_id = json_lines(up.stdout)[0]["data"]["run_id"]
        record = RunStore(tmp_path / "state").load(run_id)
        assert record.current_job is not None and record.current_job.status is JobState.SUCCEEDED
        cluster = find_clusters(run_id=run_id)[0]
        token = (cluster.path / "auth_token").read_text().strip()
        request = urllib.request.Request(f"http://127.0.0.1:{cluster.facts['ports']['dashboard']}/api/jobs/",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            listed = response.read().decode()
        assert json.loads(listed), "the Jobs API listed no job"
        assert VALUE not in listed, "the Jobs API shows the --job-env value"
        logs = [p for p in (cluster.path / "r").rglob("*") if p.is_file() and "logs" in p.parts]
        assert logs, "Ray wrote no log files"
        leaked = [str(p.relative_to(cluster.path)) for p in logs if VALUE in p.read_text(errors="replace")]
        assert not leaked, f"Ray's logs show the --job-env value: {leaked}"
        stored = [p for p in (tmp_path / "state").rglob("*") if p.is_file()]
        assert not any(VALUE in p.read_text(errors="replace") for p in stored)
        log = Path(record.spool_path).read_text()
        assert VALUE not in log
        # The job got the variable: its entrypoint says which names it read from the file (never values).
        assert "rtui-train: variables from --job-env: HF_TOKEN" in log, log[-3000:]
        # What carries it is private to the user, and gone once the job ended.
        carriers = [p for p in cluster.path.rglob("*") if p.is_file() and VALUE in p.read_text(errors="replace")]
        assert all(p.stat().st_mode & 0o077 == 0 for p in carriers), carriers
    finally:
        subprocess.run([rtui, "down", "--yes", "--cluster-name", "jobenv"], env=env, capture_output=True,
                       timeout=180)
