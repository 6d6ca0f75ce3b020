"""The kube target end to end: the real `rtui` binary against the emulated API server over HTTP.

The test plays the cluster (fake_control: KubeRay, the controllers, scheduler and kubelets) and a
Ray head's Jobs API behind the service proxy (fake_ray); rtui does not know it is under test: it
reads a kubeconfig, asks a registry for the image digest, and talks HTTP.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube.conftest import KubeCluster
from tests.kube.kube_world import RUN_LABEL, KubeWorld, events, gpu_cluster, make_world


@pytest.fixture
def world(kube_cluster: KubeCluster, tmp_path: Path) -> Iterator[KubeWorld]:
    """The world of tests.kube.kube_world, driven through the installed `rtui` binary."""
    yield from make_world(kube_cluster, tmp_path, installed=True)


def test_fresh_cluster_plan_up_noop_status_logs_down(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    plan = json.loads(world.rtui("plan", "--json").stdout)
    actions = {c["address"]: c["action"] for c in plan["changes"]}
    assert set(actions.values()) == {"create"}, actions
    assert {"kube.namespace", "kube.device-plugin.nvidia", "kube.device-plugin.efa", "kube.kuberay-operator",
            "kube.image-prepull", "kube.raycluster", "kube.gpu-workers", "ray.job.train"} <= set(actions)
    # What changes the cluster for everyone on it is said (issue 40 item 7: the TUI asks twice for it).
    shared = {c["address"] for c in plan["changes"] if c["cluster_wide"]}
    assert shared == {"kube.device-plugin.nvidia", "kube.device-plugin.efa", "kube.kuberay-operator"}, shared
    raycluster = next(c for c in plan["changes"] if c["address"] == "kube.raycluster")
    assert raycluster["after"]["digest"] == world.registry.tags["rtui/ray:test"]
    assert "@sha256:" in raycluster["after"]["image"]

    up = world.rtui("up", "--yes", "--json", timeout=180)
    last = events(up.stdout)[-1]
    assert last["kind"] == "done" and last["data"]["job_status"] == "SUCCEEDED", last

    again = json.loads(world.rtui("plan", "--json").stdout)
    assert {c["address"]: c["action"] for c in again["changes"] if c["action"] != "noop"} == {}

    status = json.loads(world.rtui("status", "--json").stdout)
    assert status["transport"]["transport"] == "efa", status["transport"]
    assert status["resources"]["kube.raycluster"]["status"] == "ready"
    logs = world.rtui("logs").stdout
    assert "Using network AWS Libfabric" in logs and "RTUI_METRIC" in logs

    # The Jobs API was reached only through the API server's port-forward to the head (portforward.py),
    # which takes no request without the kubeconfig's token (the fixture answers 401 to any other).
    forwarded = world.cluster.requests(path_contains="/pods/rtui-ray-head-0/portforward")
    assert forwarded and all(r.status < 400 for r in forwarded), \
        [(r.path, r.status) for r in forwarded if r.status >= 400]

    world.rtui("down", "--yes", timeout=180)
    assert world.labelled() == []
    assert not world.cluster.objects("Pod", "rtui")
    # Nothing of the token or the kubeconfig's secrets landed in rtui's files.
    for path in world.state.rglob("*"):
        if path.is_file():
            assert world.cluster.token not in path.read_text(errors="replace"), path


def test_the_hugging_face_token_reaches_a_secret_and_nothing_else(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    token = "hf_TestTokenValue1234567890"
    world.env["MY_HF"] = token
    world.rtui("up", "--yes", "--hf-token", "env:MY_HF", "--until", "kube.raycluster", timeout=120)
    secret = world.cluster.get("Secret", "rtui-ray-hf-token", "rtui")
    assert secret is not None and base64.b64decode(secret["data"]["HF_TOKEN"]).decode() == token
    rc = world.cluster.get("RayCluster", "rtui-ray", "rtui")
    assert rc is not None and token not in str(rc)
    env = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "rtui-ray-hf-token", "key": "HF_TOKEN"}}} in env
    assert token not in world.rtui("manifest", "--hf-token", "env:MY_HF").stdout
    for path in world.state.rglob("*"):
        if path.is_file():
            assert token not in path.read_text(errors="replace"), path
    # A variable that is not set stops the run before anything is applied, in one line.
    del world.env["MY_HF"]
    failed = world.rtui("up", "--yes", "--hf-token", "env:MY_HF", check=False)
    assert failed.returncode == 2 and "MY_HF" in failed.stderr and failed.stderr.count("\n") == 1


@pytest.mark.parametrize("args", [(), ("--hf-token", "env:MY_HF", "--idle-minutes", "0")],
                         ids=["defaults", "token-fixed-size"])
def test_rtui_manifest_prints_exactly_the_objects_up_applies(world: KubeWorld, args: tuple[str, ...]) -> None:
    """Issue 38: `rtui manifest` renders the plan's objects, so it is what `up` sends, kind for kind and
    field for field (less what only the moment of applying knows: a secret's value, a digest, addresses)."""
    from tests.kube.applied import applied, differences, printed

    gpu_cluster(world.cluster)
    world.env["MY_HF"] = "hf_TestTokenValue1234567890"
    world.rtui("up", "--yes", *args, "--until", "kube", timeout=180)
    run_id = world.cluster.read("Namespace", "rtui")["metadata"]["labels"][RUN_LABEL]
    manifest = world.rtui("manifest", *args, "--run-id", run_id).stdout
    found = differences(printed(manifest), applied(world.cluster, run_id))
    assert not found, "\n".join(found)
