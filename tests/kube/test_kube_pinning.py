"""Issue 23 item 6: what runs is what the plan showed — every image pinned by digest at plan time,
and KubeRay's CRDs applied only as the release's bytes, never with a conversion webhook.

The real CLI (this checkout) against the emulated API server and the registry double
(``fake_registry``: per-repository token scopes, HEAD with ``Docker-Content-Digest``, 404 for an
unknown tag), with the add-on images served by that registry as a mirror (``--addon-registry``).
"""

from __future__ import annotations

import json
from pathlib import Path

from backend.store import RunStore
from tests.kube.crds import vouch_for
from tests.kube.kube_world import KubeWorld, failure, gpu_cluster, world

__all__ = ["world"]  # the fixture, imported for pytest

ADDONS = {"kube.device-plugin.nvidia": "nvidia/k8s-device-plugin:v0.18.0",
          "kube.device-plugin.efa": "eks/aws-efa-k8s-device-plugin:v0.5.6",
          "kube.kuberay-operator": "kuberay/operator:v1.7.0"}


def test_every_image_of_the_plan_is_resolved_to_a_digest_shown_recorded_and_pulled_by_it(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    plan = json.loads(world.rtui("plan", "--json").stdout)
    after = {c["address"]: c["after"] for c in plan["changes"]}
    for address, tag in ADDONS.items():
        digest = world.registry.tags[tag]
        assert after[address]["digest"] == digest, (address, after[address])
        assert after[address]["image"] == f"{world.registry.host}/{tag}@{digest}"
        assert after[address]["pinning"].startswith("pinned")
    assert after["kube.raycluster"]["image"].endswith("@" + world.registry.tags["rtui/ray:test"])
    # Each repository was asked with a token of its own scope (a registry refuses another's).
    heads = [(path, auth) for method, path, auth in world.registry.requests if method == "HEAD" and auth]
    assert {p.split("/manifests/")[0].removeprefix("/v2/") for p, _ in heads} == {
        "rtui/ray", "nvidia/k8s-device-plugin", "eks/aws-efa-k8s-device-plugin", "kuberay/operator"}

    world.rtui("up", "--yes", "--until", "kube", timeout=120)
    nvidia = world.cluster.read("DaemonSet", "rtui-nvidia-device-plugin", "kube-system")
    efa = world.cluster.read("DaemonSet", "rtui-efa-device-plugin", "kube-system")
    operator = world.cluster.read("Deployment", "kuberay-operator", "rtui-kuberay")
    applied = {address: obj["spec"]["template"]["spec"]["containers"][0]["image"] for address, obj in (
        ("kube.device-plugin.nvidia", nvidia), ("kube.device-plugin.efa", efa), ("kube.kuberay-operator", operator))}
    assert applied == {a: after[a]["image"] for a in ADDONS}
    run_id = json.loads(world.rtui("status", "--json").stdout)["run_id"]
    record = RunStore(world.state).load(run_id)
    assert {a: record.resources[a].outputs.get("digest") for a in ADDONS} == {
        a: world.registry.tags[t] for a, t in ADDONS.items()}
    assert record.plan is not None and all("@sha256:" in (c.after or {})["image"] for c in record.plan.changes
                                           if c.address in ADDONS)
    world.rtui("down", "--yes", timeout=120)


def test_an_image_that_cannot_be_pinned_stops_the_plan_in_one_line_unless_allowed(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    missing = world.registry.image("rtui/ray:nope")
    refused = world.rtui("plan", "--image", missing, check=False)
    assert refused.returncode == 2, (refused.stdout[-2000:], refused.stderr[-2000:])
    assert refused.stderr.count("\n") == 1 and missing in refused.stderr and "--allow-unpinned" in refused.stderr
    assert "Traceback" not in refused.stderr and refused.stdout == ""

    allowed = world.rtui("plan", "--image", missing, "--allow-unpinned", "--json")
    raycluster = next(c for c in json.loads(allowed.stdout)["changes"] if c["address"] == "kube.raycluster")
    assert raycluster["after"]["image"] == missing and raycluster["after"]["digest"] is None
    assert "--allow-unpinned" in raycluster["after"]["pinning"] and "HTTP 404" in raycluster["after"]["pinning"]
    text = world.rtui("plan", "--image", missing, "--allow-unpinned").stdout
    assert "pulled by tag (--allow-unpinned)" in text

    # An add-on the mirror does not hold is refused the same way, named with its registry.
    del world.registry.tags["kuberay/operator:v1.7.0"]
    refused = world.rtui("plan", check=False)
    assert refused.returncode == 2 and f"{world.registry.host}/kuberay/operator:v1.7.0" in refused.stderr


def test_crds_that_are_not_the_release_or_convert_through_a_webhook_never_reach_the_cluster(
        world: KubeWorld, tmp_path: Path) -> None:
    gpu_cluster(world.cluster)
    crds = Path(world.env["RTUI_KUBERAY_CRDS"])
    hooked = tmp_path / "hooked"
    hooked.mkdir()
    for file in crds.iterdir():
        (hooked / file.name).write_bytes(file.read_bytes())
    service = (hooked / "ray.io_rayservices.yaml").read_text().replace(
        "  scope: Namespaced\n", "  scope: Namespaced\n  conversion:\n    strategy: Webhook\n    webhook:\n"
        "      conversionReviewVersions: [v1]\n      clientConfig: {url: 'https://convert.example.net/ray'}\n")
    (hooked / "ray.io_rayservices.yaml").write_text(service)
    failed = world.rtui("up", "--yes", "--json", "--until", "kube.kuberay-operator", check=False,
                        env={**world.env, "RTUI_KUBERAY_CRDS": str(hooked)})
    assert failed.returncode != 0
    assert "not KubeRay 1.7.0's" in failure(failed.stdout)  # the stand-in's new bytes are not vouched for
    vouch_for(hooked / "ray.io_rayservices.yaml")  # vouched for: still refused for its webhook
    failed = world.rtui("up", "--yes", "--json", "--until", "kube.kuberay-operator", check=False,
                        env={**world.env, "RTUI_KUBERAY_CRDS": str(hooked)})
    assert failed.returncode != 0 and "convert.example.net" in failure(failed.stdout)
    assert world.cluster.objects("CustomResourceDefinition") == []
    world.rtui("down", "--yes", timeout=120)
