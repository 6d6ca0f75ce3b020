"""Issue 23 item 8 (local): a process is ours only if it runs as our uid, whatever its command line.

On a shared host another user can start a process whose command line names our cluster's dir (the
path is in /tmp, its name visible to all in `ps`). Before, such a process (uid 65534) was taken
for the head, and `rtui down` run as root killed it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest

from backend.layers import local_cluster as lc
from tests.conftest import run_rtui

NOBODY = 65534

pytestmark = [pytest.mark.skipif(os.getuid() != 0, reason="starting a process as another uid needs root"),
              pytest.mark.host_clusters]


def _spoof(argv_tail: list[str]) -> subprocess.Popen[bytes]:
    # `sh -c 'sleep 120; :' sh ARGS...`: ARGS stay in sh's command line; the `; :` keeps sh from
    # replacing itself with sleep.
    return subprocess.Popen(["/bin/sh", "-c", "sleep 120; :", "sh", *argv_tail], user=NOBODY, group=NOBODY,
                            start_new_session=True, cwd="/", stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_a_process_of_another_uid_with_our_command_line_is_never_ours(isolated_env: Path) -> None:
    cluster = lc.make_cluster_dir("r20261204-spoof01", "spoof", {"state_dir": str(isolated_env)})
    spoofed = _spoof(["start", "--head", f"--temp-dir={cluster.ray_dir}", "--node-name=spoof-head",
                      f"--storage={cluster.path}/x"])
    try:
        proc = psutil.Process(spoofed.pid)
        assert proc.uids().real == NOBODY and lc.holds(proc.cmdline(), cluster.path)
        assert lc.node_procs(cluster).head is None, "a process of another uid was taken for the head"
        assert spoofed.pid not in {p.pid for p in lc.cluster_family(cluster.path)}
        down = run_rtui("down", "--yes", "--cluster-name", "spoof", timeout=120)
        assert down.returncode == 0, down.stderr
        assert spoofed.poll() is None, "rtui down signalled a process of another user"
        assert not cluster.path.exists()
    finally:
        spoofed.kill()
        spoofed.wait(timeout=10)
        lc.remove_cluster_dir(cluster.path) if cluster.path.exists() else None
