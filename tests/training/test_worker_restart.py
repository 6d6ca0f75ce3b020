"""A worker that dies mid-run is replaced and the run goes on from its last complete checkpoint.

Ray 2.58, read in the installed sources: Ray Train v2's controller polls the worker group, and on a
dead worker (an actor whose process is gone) its ``FailurePolicy`` restarts the whole group while
``FailureConfig.max_failures`` allows it; the new group's ``ray.train.get_checkpoint()`` is the
checkpoint registered last. The workers are actors named ``RayTrainWorker`` (Ray titles an actor's
process ``ray::<class>...``), descendants of this test's own Ray (started in this process), so the
one killed here is certainly ours.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO
from tests.eventually import eventually
from tests.training.ray_cluster import WORKER_ENV
from tests.training.test_ray_train import CYCLE, TINY, Run
from training import checkpoint as ckpt

pytestmark = pytest.mark.ray


def _train_workers() -> list[psutil.Process]:
    """This test's Ray Train workers: descendants of this process titled as the actor."""
    found = []
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if "RayTrainWorker" in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:  # gone while listed
            continue
    return found


def test_a_killed_worker_is_replaced_and_the_run_resumes_from_its_last_checkpoint(
        ray_address: str, tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "job.log"
    argv = [*TINY, *CYCLE, "--steps", "60", "--shard", "full", "--checkpoint-every", "5", "--max-failures", "1",
            "--storage-path", str(store), "--run-name", "restart"]
    env = {**os.environ, **WORKER_ENV, "RAY_ADDRESS": ray_address}
    with open(out, "w") as log:
        job = subprocess.Popen([sys.executable, "-m", "training.train", *argv], stdout=log,
                               stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    try:
        # The marker is written after every rank's upload: from here a complete checkpoint exists.
        eventually("a complete checkpoint", lambda: ckpt.find_checkpoints(str(store)), timeout=180, interval=0.1)
        victim = eventually("a Ray Train worker process", lambda: _train_workers()[:1], timeout=30)[0]
        assert job.poll() is None, "the run ended before a worker could be killed"
        killed_at = f"pid {victim.pid} after {out.read_text().count('RTUI_METRIC')} metric lines"
        victim.send_signal(signal.SIGKILL)
        rc = job.wait(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()  # the job driver this test started
    run = Run(rc, out.read_text(), "")
    assert rc == 0, run.stdout[-4000:]
    resumed = re.findall(r"resumed from (\S+) at step (\d+)", run.stdout)
    assert resumed, f"killed {killed_at}\n" + "\n".join(
        line for line in run.stdout.splitlines() if "RTUI_METRIC" not in line and "PlacementGroupCleaner" not in line)
    where, step = resumed[-1][0], int(resumed[-1][1])
    assert step > 0 and step % 5 == 0 and where.endswith(ckpt.checkpoint_dir_name(step)), resumed
    after = run.stdout[run.stdout.rindex("resumed from"):]
    steps_after = sorted(Run(0, after, "").metrics)
    assert steps_after == list(range(step + 1, 61)), steps_after  # on from the checkpoint, to the end
    assert not psutil.pid_exists(victim.pid) or victim.status() == psutil.STATUS_ZOMBIE
