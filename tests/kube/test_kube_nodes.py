"""What the GPU nodes offer and what the workers ask (issue 19, items 2 and 3), through the CLI.

The emulated scheduler (fake_control) filters nodes like kube-scheduler: node selector and
affinity, taints, and requests against allocatable for cpu, memory, GPUs and EFA.
"""

from __future__ import annotations

import pytest

from targets.kube import raycluster
from tests.kube.kube_world import KubeWorld, events, failure, gpu_cluster, world

__all__ = ["world"]  # the fixture, imported for pytest


def _in_process(world: KubeWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the CLI in this process, with the unschedulable deadline cut to seconds (no knob in production)."""
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(raycluster, "UNSCHEDULABLE_TIMEOUT_S", 3.0)


def test_gpu_nodes_without_the_gpu_present_label_take_the_workers(
        world: KubeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """EKS nodes with NVIDIA's static plugin, GKE nodes: GPUs advertised, no nvidia.com/gpu.present label."""
    from tui import cli

    gpu_cluster(world.cluster, labelled=False, advertised=True)
    _in_process(world, monkeypatch)
    code = cli.main(["up", "--yes", "--json"])
    out = capsys.readouterr().out
    assert code == 0, failure(out)
    assert events(out)[-1]["data"]["job_status"] == "SUCCEEDED"
    workers = [p for p in world.cluster.objects("Pod", "rtui")
               if p["metadata"]["labels"].get("ray.io/node-type") == "worker"]
    assert sorted(p["spec"]["nodeName"] for p in workers) == ["gpu-0", "gpu-1"]


def test_gpu_nodes_short_of_cpu_fail_before_anything_is_applied(
        world: KubeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """4 GPUs but 32 allocatable CPUs: a worker asks 40, so it could only sit Pending."""
    from tui import cli

    gpu_cluster(world.cluster, cpu="32")
    _in_process(world, monkeypatch)
    code = cli.main(["up", "--yes"])
    captured = capsys.readouterr()
    lines = [ln for ln in (captured.out + captured.err).splitlines() if "gpu-0" in ln]
    assert code == 2, captured.out[-2000:] + captured.err[-2000:]
    assert lines and "allocatable cpu is 32, a worker needs 40 (8 short)" in lines[0], lines
    assert "Traceback" not in captured.out + captured.err
    assert world.labelled() == []  # nothing applied, nothing waited for
