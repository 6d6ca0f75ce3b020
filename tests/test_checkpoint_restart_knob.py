"""``--max-failures N`` reaches Ray Train: the job's entrypoint carries it and the program hands it to
``FailureConfig(max_failures=N)``, which (Ray 2.58 ``ray.train.FailureConfig``: "tries to recover a run
at least this many times"; the v2 controller restarts the whole worker group) restarts the group when a
worker dies; the restarted loop resumes from the run's newest complete checkpoint
(tests/training/test_worker_restart.py kills a real worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.config import free_fields
from backend.errors import UserError
from backend.jobspec import build_job_spec
from backend.resolve import resolve_config
from training import train


def test_max_failures_reaches_the_training_program(tmp_path: Path) -> None:
    cfg = resolve_config({"max_failures": "2", "checkpoint_every": "5"}, environ={}, cwd=tmp_path).config
    entry = build_job_spec(cfg).entrypoint
    assert "--max-failures 2" in entry
    assert train.parse_args(entry.split()[3:]).max_failures == 2
    # Off by default: a job that fails says so instead of retrying silently.
    assert "--max-failures" not in build_job_spec(resolve_config({}, environ={}, cwd=tmp_path).config).entrypoint


def test_max_failures_is_a_free_field_and_never_negative(tmp_path: Path) -> None:
    """How often to retry chooses nothing that runs or is read: a checkout's rtui.toml may set it."""
    assert "max_failures" in free_fields()
    with pytest.raises(UserError, match="--max-failures"):
        resolve_config({"max_failures": "-1"}, environ={}, cwd=tmp_path)
