"""SIGKILL the real `rtui up --target aws` at every step boundary and in the middle of every wait;
each next `up` picks up where the killed one stopped. The moto server (in this process) outlives them.
At the end there is exactly one of each resource, and `down` leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from targets.aws.infra.common import Names
from tests.aws.conftest import World
from tests.aws.provision_world import session_for, tagged
from tests.aws.test_provision import EXPECTED
from tests.conftest import RTUI

ARGS = ["up", "--yes", "--target", "aws", "--region", "us-east-1", "--until", "aws", "--json"]


def kill_at_next_point(env: dict[str, str], seen: set[tuple[str, str]]) -> tuple[str, str] | None:
    """Run `up` and SIGKILL it at the first boundary (a step starting) or wait (a step reporting
    progress short of done) not killed at before. None: the run finished without meeting one."""
    proc = subprocess.Popen([RTUI, *ARGS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            event = json.loads(line)
            step, kind = event["step"], event["kind"]
            if kind == "failed":
                raise AssertionError(f"a resumed `up` failed after {sorted(seen)}: {step}: {event['message']}")
            if step == "run" or kind not in ("started", "progress"):
                continue
            if kind == "progress" and (event.get("fraction") is None or event["fraction"] >= 1.0):
                continue
            point = (step, kind)
            if kind == "failed" or point not in seen:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                return point
        proc.wait(timeout=60)
        if proc.returncode != 0:
            assert proc.stderr is not None
            raise AssertionError(f"a resumed `up` failed after {sorted(seen)}: {proc.stderr.read()[-2000:]}")
        return None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_killed_at_every_boundary_and_wait_then_resumed(world: World, kube_file: Path) -> None:
    timings = world.script.timings
    timings.cluster_create, timings.nodegroup_create, timings.addon_create, timings.nat_create = 1.0, 1.0, 1.2, 1.5
    # The cluster and the GPU nodegroup stay CREATING until their waits have been killed in, however long a
    # resumed `up` (a fresh interpreter: ~1 s idle, several on a loaded box) takes to ask: with 9 s and
    # 6 s scripted, a clean-clone run once found the GPU nodegroup ACTIVE before any `up` saw it creating.
    names = Names("rtui-ray")
    held = {"aws.eks-cluster": names.cluster, "aws.nodegroup.gpu": names.gpu_nodegroup}
    world.script.held.update(held.values())
    # The VPC waits on nothing: made within the test's reaction to the line before its own, it was never
    # killed at in two clean-clone runs (with a second's latency for CreateVpc, under load). Its answer is
    # held until an `up` has been killed in its step.
    world.script.held_actions.add(("ec2", "CreateVpc"))
    env = {**os.environ}
    seen: set[tuple[str, str]] = set()
    started = time.monotonic()
    while True:
        point = kill_at_next_point(env, seen)
        if point is None:
            break
        seen.add(point)
        if point[1] == "progress" and point[0] in held:
            world.script.held.discard(held[point[0]])
        if point[0] == "aws.vpc":
            world.script.release_action("ec2", "CreateVpc")
        assert len(seen) < 200
    steps = {step for step, _ in seen}
    assert {"aws.vpc", "aws.eks-cluster", "aws.nodegroup.gpu", "aws.nat-gateway"} <= steps
    assert ("aws.eks-cluster", "progress") in seen and ("aws.nodegroup.gpu", "progress") in seen
    session = session_for()
    counts = tagged(session.run_id)
    assert {k: counts[k] for k in EXPECTED} == EXPECTED, (len(seen), time.monotonic() - started)
    finished = subprocess.run([RTUI, *ARGS], capture_output=True, text=True, env=env, timeout=120)
    assert finished.returncode == 0, finished.stderr
    plan = json.loads(subprocess.run([RTUI, "plan", "--target", "aws", "--json"], capture_output=True, text=True,
                                     env=env, timeout=120).stdout)
    assert all(c["action"] == "noop" for c in plan["changes"] if c["layer"] == "aws")
    gone = subprocess.run([RTUI, "down", "--yes", "--target", "aws", "--region", "us-east-1"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert tagged(session.run_id) == {}
