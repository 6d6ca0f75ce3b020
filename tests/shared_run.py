"""A local run several tests of one module look at (tests/test_local_finished_run.py,
tests/test_local_running_job.py): started once by a module fixture, with state and config dirs of
its own, since each test's ``isolated_env`` points the environment at that test's dirs."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from backend.store import RunRecord, RunStore
from targets.local.cluster import ClusterDir
from tests.conftest import run_rtui


def own_env(base: Path, **extra: str) -> dict[str, str]:
    """This environment without the test's rtui dirs, with state, config and cache dirs under ``base``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("RTUI_")}, **extra,
            "RTUI_STATE_DIR": str(base / "state"), "RTUI_CONFIG_DIR": str(base / "config"),
            "RTUI_CACHE_DIR": str(base / "cache")}


@dataclass(frozen=True)
class SharedRun:
    env: dict[str, str]
    run_id: str
    cluster: ClusterDir

    @property
    def state(self) -> Path:
        return Path(self.env["RTUI_STATE_DIR"])

    def record(self) -> RunRecord:
        return RunStore(self.state).load(self.run_id)

    def rtui(self, *args: str, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run_rtui(*args, env=self.env, check=check, timeout=timeout)
