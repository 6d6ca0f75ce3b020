"""Shared fixtures: an isolated state dir per test, and helpers to run the real `rtui` binary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
RTUI = str(Path(sys.executable).parent / "rtui")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No test reads the user's config or writes the user's state."""
    for key in list(os.environ):
        if key.startswith("RTUI_"):
            monkeypatch.delenv(key)
    state = tmp_path / "state"
    monkeypatch.setenv("RTUI_STATE_DIR", str(state))
    monkeypatch.setenv("RTUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    yield state
    _reap_clusters(state)


def _reap_clusters(state: Path) -> None:
    """A failed test must not leave a Ray cluster running for the rest of the suite.

    Only clusters whose marker names this test's state dir: never another session's.
    """
    from backend.layers.local_cluster import cluster_family, find_clusters, remove_cluster_dir
    from backend.procs import terminate

    for cluster in find_clusters():
        if cluster.facts.get("state_dir") == str(state):
            terminate(cluster_family(cluster.path))
            remove_cluster_dir(cluster.path)


def run_rtui(*args: str, timeout: float = 300, env: dict[str, str] | None = None,
             check: bool = False) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([RTUI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"rtui {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`), tests that start a real Ray cluster or drive tmux share one
    group: one worker runs them one after another, as a serial run does, while the rest spread.
    So do the tests marked ``host_clusters``: a local cluster is found host-wide (its marked dir
    under /tmp), so a test that makes one, or that counts on seeing no other rtui's (no orphans, "no
    runs yet", `down` by the default name), must not run beside another that has one up.

    First, before xdist's own hook reads the ``xdist_group`` marks into the node ids: run after
    it, the marks came too late and the group was never formed (a Ray bench and a Ray test ran
    side by side on two workers, and each saw the other's cluster as an orphan)."""
    for item in items:
        if any(item.get_closest_marker(name) for name in ("ray", "tmux", "host_clusters")):
            item.add_marker(pytest.mark.xdist_group("ray"))
