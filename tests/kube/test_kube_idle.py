"""Idle GPUs cost nothing on a kube cluster (issue 26, items 3 and 6), through the CLI.

The test plays Ray's autoscaler and cluster-autoscaler by their documented rules
(fake_autoscalers), KubeRay as v1.7.0 scales a worker group (fake_control), and a Ray head
whose training starts only once its workers are up (fake_ray).
"""

from __future__ import annotations

import json

from targets.kube import GPU_SCALE_UP_S
from tests.kube.conftest import KubeCluster
from tests.kube.fake_autoscalers import Autoscalers, NodeAutoscaler, RayAutoscaler
from tests.kube.kube_world import KubeWorld, events, gpu_cluster, wait_until, world

__all__ = ["world"]  # the fixture, imported for pytest

IDLE = ("--idle-minutes", "0.05")  # 3 s: KubeRay's idleTimeoutSeconds
NS, WORKER = "rtui", "rtui-ray-gpu-worker-"


def _workers(cluster: KubeCluster, running: bool = False) -> list[str]:
    return [p["metadata"]["name"] for p in cluster.objects("Pod", NS) if p["metadata"]["name"].startswith(WORKER)
            and (not running or (p.get("status") or {}).get("phase") == "Running")]


def _players(world: KubeWorld, unneeded_s: float = 0.5) -> Autoscalers:
    def jobs() -> list[tuple[str, float | None]]:
        return [(j.status, j.end_time / 1000 if j.end_time else None) for j in list(world.head.jobs.values())]

    def make_node(name: str) -> None:  # joins without its GPUs: the device plugin advertises them
        node = world.cluster.add_node(name, gpus=4, efa=1, labels={"node.kubernetes.io/instance-type": "g6.12xlarge"})
        world.cluster.set_status("Node", name, None, {**node["status"], "allocatable": {
            **node["status"]["allocatable"], "nvidia.com/gpu": None, "vpc.amazonaws.com/efa": None}})

    world.head.workers_ready = lambda: len(_workers(world.cluster, running=True)) >= 2
    return Autoscalers(RayAutoscaler(world.cluster, jobs), NodeAutoscaler(world.cluster, make_node,
                                                                       unneeded_s=unneeded_s))


def test_idle_workers_and_their_nodes_go_and_a_new_job_brings_them_back(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    # The players start once the job is done: the node autoscaler would otherwise take the GPU nodes
    # while they are still empty, before the workers land (as cluster-autoscaler would, past
    # --scale-down-delay-after-add).
    up = world.rtui("up", "--yes", "--json", *IDLE, timeout=180)
    assert events(up.stdout)[-1]["data"]["job_status"] == "SUCCEEDED"
    with _players(world) as players:
        rc = world.cluster.get("RayCluster", "rtui-ray", NS)
        assert rc is not None and rc["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] == 3

        # The job's end -> the workers go after the idle timeout -> their empty nodes go.
        wait_until("the idle workers to go", lambda: not _workers(world.cluster), timeout=60)
        wait_until("the empty GPU nodes to go", lambda: not players.nodes.gpu_nodes(), timeout=30)
        assert sorted(players.nodes.removed) == ["gpu-0", "gpu-1"]
        status = json.loads(world.rtui("status", "--json").stdout)
        gpu = status["gpu"]
        assert (gpu["workers"], gpu["nodes"], gpu["full"], gpu["autoscaling"]) == (0, 0, 2, True), gpu
        assert gpu["scaled_down_at"] == gpu["idle_since"] + 3
        text = world.rtui("status").stdout
        assert "GPU nodes 0/2, Ray worker pods 0/2 — idle since " in text and ", scaled to zero at " in text, text
        # The preflight of the next `up` says what is there: no GPU node now, and a node autoscaler or not.
        checks = {c["id"]: c for c in json.loads(world.rtui("check", "--json", *IDLE).stdout)["checks"]}
        assert checks["kube.gpu-nodes"]["status"] == "warn" and "0/2" in checks["kube.gpu-nodes"]["detail"]
        assert checks["kube.node-autoscaler"]["detail"].startswith("no node autoscaler found")

        # A new job on the scaled-to-zero cluster: its placement group brings nodes and workers back.
        world.control.timings.pull_s = 3.0  # a fresh node pulls the Ray image before its worker starts
        players.nodes.launch_s = 3.0  # and joins a while after cluster-autoscaler asked for it
        again = world.rtui("up", "--yes", "--json", *IDLE, "--steps", "6", timeout=180)
        last = events(again.stdout)[-1]
        assert last["kind"] == "done" and last["data"]["job_status"] == "SUCCEEDED", again.stdout[-3000:]
        assert len(players.nodes.added) == 2
        # It said it was scaling up, with the nodes arriving, and its ETA counted them.
        train = [e for e in events(again.stdout) if e["step"] == "train"]
        arriving = [e["message"] for e in train if e["message"].startswith("scaling up from idle: GPU nodes")]
        assert any(a.startswith("scaling up from idle: GPU nodes 0/2, Ray worker pods 0/2") for a in arriving), arriving
        assert len(set(arriving)) >= 2, arriving  # nodes and workers arriving, one line each
        started = next(e for e in train if e["kind"] == "started")
        assert started["data"]["expected_s"] >= GPU_SCALE_UP_S
        assert "RTUI_METRIC" in world.rtui("logs").stdout

    # Never in the way of a job: nothing was removed while a job of this head was pending or running.
    assert players.ray.removed and not [r for r in players.ray.removed if r[2]], players.ray.removed
    assert not players.errors, players.errors[:3]


def test_a_running_job_keeps_its_workers_past_the_idle_timeout(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    world.head.line_every_s = 0.6  # ~6 s of training: twice the idle timeout
    with _players(world, unneeded_s=600) as players:
        seen: list[int] = []
        proc = world.start("up", "--yes", "--json", *IDLE)
        wait_until("the job to run", lambda: any(j.status == "RUNNING" for j in world.head.jobs.values()), 120)
        while proc.poll() is None:
            if any(j.status == "RUNNING" for j in world.head.jobs.values()):
                seen.append(len(_workers(world.cluster, running=True)))
            wait_until("a tick", lambda: True)
        out, err = proc.communicate()
        assert proc.returncode == 0, err[-2000:]
        assert json.loads(out.splitlines()[-1])["data"]["job_status"] == "SUCCEEDED"
    assert seen and min(seen) == 2, seen
    assert not players.errors, players.errors[:3]


def test_changing_the_idle_time_replaces_the_raycluster_and_the_same_one_is_a_noop(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    world.rtui("up", "--yes", *IDLE, "--until", "kube.raycluster", timeout=180)
    same = json.loads(world.rtui("plan", "--json", *IDLE).stdout)
    assert {c["address"]: c["action"] for c in same["changes"]}["kube.raycluster"] == "noop"
    # The autoscaler's sidecar and options exist only in a new head pod: KubeRay applies them at creation.
    fixed = json.loads(world.rtui("plan", "--json", "--idle-minutes", "0").stdout)
    change = next(c for c in fixed["changes"] if c["address"] == "kube.raycluster")
    assert change["action"] == "replace" and "idle_timeout_s" in change["reason"], change
