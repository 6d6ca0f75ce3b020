"""A kube target world for subprocess tests: the emulated API server, its controllers, a Ray head, a registry.

It runs the CLI from this checkout (``python -m tui.cli`` with the checkout first on PYTHONPATH), so a
test of a branch exercises that branch's code, and it can start ``rtui`` in the background (to kill it,
or to follow a log while the test feeds it); with ``installed`` (test_kube_e2e), the installed ``rtui``
binary as a user runs it, on the environment as it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.eventually import eventually
from tests.fake_hub import FakeHub
from tests.kube.conftest import KubeCluster
from tests.kube.crds import crd_dir
from tests.kube.fake_control import FakeControlPlane
from tests.kube.fake_ray import FakeRayHead
from tests.kube.fake_registry import FakeRegistry

ROOT = Path(__file__).resolve().parents[2]
RTUI = str(Path(sys.executable).parent / "rtui")
RUN_LABEL = "rtui.dev/run"
# The emulated API server answers from a thread of the test process. Beside a CPU-bound process a whole
# batch of `down`'s deletes got no answer within rtui's default 10 s and then all answered at once
# (stress run of the suite): the rtui a test starts waits as a user on a slow link would, with
# `--kube-timeout-s` through its environment. Tests of the deadline itself set their own.
KUBE_TIMEOUT_ENV = {"RTUI_KUBE_TIMEOUT_S": "30"}
OURS = ["Namespace", "Secret", "ServiceAccount", "DaemonSet", "Deployment", "ClusterRole", "ClusterRoleBinding",
        "Role", "RoleBinding", "CustomResourceDefinition", "RayCluster", "NetworkPolicy"]


@dataclass
class KubeWorld:
    cluster: KubeCluster
    head: FakeRayHead
    control: FakeControlPlane
    registry: FakeRegistry
    env: dict[str, str]
    state: Path
    hub: FakeHub
    installed: bool = False  # the installed `rtui` binary, not this checkout's module

    def argv(self, *args: str) -> list[str]:
        return [RTUI, *args] if self.installed else [sys.executable, "-m", "tui.cli", *args]

    def rtui(self, *args: str, timeout: float = 120, check: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.argv(*args), env=env or self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)
        if check:
            assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
        return done

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*args), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT)

    def labelled(self) -> list[str]:
        """Every object of ours still in the cluster (any kind rtui applies)."""
        return [f"{kind}/{o['metadata']['name']}" for kind in OURS for o in self.cluster.objects(kind)
                if RUN_LABEL in (o["metadata"].get("labels") or {})]


def gpu_cluster(cluster: KubeCluster, *, gpu_nodes: int = 2, efa: int = 1, labelled: bool = True,
                advertised: bool = False, cpu: str = "48") -> None:
    """One system node and GPU nodes whose GPUs and EFA appear only once the device plugins run
    (``advertised``: already, a plugin rtui does not know runs), labelled ``nvidia.com/gpu.present``
    or not, with ``cpu`` allocatable CPUs."""
    cluster.add_node("system-0", gpus=0, efa=0)
    for i in range(gpu_nodes):
        node = cluster.add_node(f"gpu-{i}", gpus=4, efa=efa, gpu_label=labelled,
                                labels={"node.kubernetes.io/instance-type": "g6.12xlarge"})
        if cpu != node["status"]["allocatable"]["cpu"]:
            node = cluster.set_status("Node", f"gpu-{i}", None, {
                **node["status"], "allocatable": {**node["status"]["allocatable"], "cpu": cpu}})
        if advertised:
            continue
        # A merge patch keeps a key that is left out: None takes it away.
        allocatable = {**node["status"]["allocatable"], "nvidia.com/gpu": None, "vpc.amazonaws.com/efa": None}
        cluster.set_status("Node", f"gpu-{i}", None, {**node["status"], "allocatable": allocatable})


def make_world(kube_cluster: KubeCluster, tmp_path: Path, *, installed: bool = False) -> Iterator[KubeWorld]:
    head = FakeRayHead(steps=5).start()
    with FakeRegistry() as registry, FakeHub() as hub, FakeControlPlane(kube_cluster, jobs_url=head.url,
                                                                       registry=registry) as control:
        env = {**os.environ, "RTUI_STATE_DIR": str(tmp_path / "state"), "RTUI_TARGET": "kube",
               "RTUI_KUBERAY_CRDS": str(crd_dir(tmp_path)), "RTUI_IMAGE": registry.image(),
               "RTUI_ADDON_REGISTRY": registry.host, "HF_ENDPOINT": hub.url,
               "RTUI_CACHE_DIR": str(tmp_path / "cache"), "KUBECONFIG": str(kube_cluster.kubeconfig),
               **KUBE_TIMEOUT_ENV}
        if not installed:
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        try:
            yield KubeWorld(kube_cluster, head, control, registry, env, tmp_path / "state", hub, installed)
        finally:
            head.stop()
        assert not control.errors, control.errors[:3]


@pytest.fixture
def world(kube_cluster: KubeCluster, tmp_path: Path) -> Iterator[KubeWorld]:
    yield from make_world(kube_cluster, tmp_path)


def events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def failure(out: str) -> str:
    """The error line of the first failed step of an ``up --json``."""
    failed = [e for e in events(out) if e["kind"] == "failed" and e["step"] != "run"]
    assert failed, out[-2000:]
    return " — ".join(str(failed[0][k]) for k in ("message", "cause", "remedy") if failed[0].get(k))


def wait_until(what: str, cond: Callable[[], Any], timeout: float = 30.0) -> Any:
    """The kube tests' name for ``tests.eventually.eventually`` (the one polling implementation)."""
    return eventually(what, cond, timeout)
