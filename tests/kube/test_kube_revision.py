"""Issue 23 item 6: ``--model-revision`` — the Hugging Face commit the job loads is settled at plan time.

The real CLI (this checkout) against the emulated cluster and the Hub double (``tests/fake_hub.py``,
reached through ``HF_ENDPOINT`` as huggingface_hub is): a branch or tag resolves to its commit, the
plan shows it, the job is submitted with ``--model-revision <commit>``, and a revision the Hub does not
have (or cannot be asked for) stops the plan in one line.
"""

from __future__ import annotations

import json
import socket

from tests.fake_hub import DEFAULT_MODEL, commit
from tests.kube.kube_world import KubeWorld, gpu_cluster, world

__all__ = ["world"]  # the fixture, imported for pytest


def _job(world: KubeWorld, *args: str) -> dict[str, str]:
    plan = json.loads(world.rtui("plan", "--json", *args).stdout)
    return next(c["after"] for c in plan["changes"] if c["address"] == "ray.job.train")


def test_the_revision_is_resolved_to_a_commit_shown_in_the_plan_and_given_to_the_job(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    main = world.hub.models[DEFAULT_MODEL]["main"]
    job = _job(world)
    assert job["model_revision"] == f"{main} (main)"
    assert f"--model-revision {main}" in job["entrypoint"] and f"--model-id {DEFAULT_MODEL}" in job["entrypoint"]
    tagged = _job(world, "--model-revision", "v1")
    assert tagged["model_revision"] == f"{commit('v1')} (v1)"
    # A full commit is used as it is: the Hub is not asked about the model (the default dataset is pinned
    # on its own, tests/test_hub_dataset.py).
    def model_requests() -> int:
        return sum(path.startswith("/api/models/") for path, _ in world.hub.requests)

    asked = model_requests()
    pinned = "f" * 40
    assert _job(world, "--model-revision", pinned)["model_revision"] == f"{pinned} ({pinned})"
    assert model_requests() == asked

    up = world.rtui("up", "--yes", "--json", timeout=180)
    assert json.loads(up.stdout.splitlines()[-1])["kind"] == "done"
    # main moved after the plan: the job still loads the commit the plan showed.
    world.hub.move(DEFAULT_MODEL, "main", commit("main-2"))
    submitted = world.head.on_loop(lambda: [j.entrypoint for j in world.head.jobs.values()])
    assert len(submitted) == 1 and f"--model-revision {main}" in submitted[0]
    # The next plan sees the new commit, and says the job would change.
    again = json.loads(world.rtui("plan", "--json").stdout)
    change = next(c for c in again["changes"] if c["address"] == "ray.job.train")
    assert change["after"]["model_revision"] == f"{commit('main-2')} (main)" and change["action"] != "noop"
    world.rtui("down", "--yes", timeout=180)


def test_a_revision_that_cannot_be_resolved_stops_the_plan_in_one_line(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    missing = world.rtui("plan", "--model-revision", "no-such-branch", check=False)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert "no-such-branch" in missing.stderr and "--model-revision" in missing.stderr

    world.hub.models["acme/private-model"] = {"main": commit("private")}
    world.hub.private["acme/private-model"] = "hf_private_token_0123456789"
    hidden = world.rtui("plan", "--model-id", "acme/private-model", check=False)
    assert hidden.returncode == 2 and hidden.stderr.count("\n") == 1 and "--hf-token" in hidden.stderr
    world.env["MY_HF"] = "hf_private_token_0123456789"
    readable = _job(world, "--model-id", "acme/private-model", "--hf-token", "env:MY_HF")
    assert readable["model_revision"] == f"{commit('private')} (main)"

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    offline = world.rtui("plan", check=False, env={**world.env, "HF_ENDPOINT": f"http://127.0.0.1:{port}"})
    assert offline.returncode == 1 and offline.stderr.count("\n") == 1, offline.stderr
    assert "--model-revision COMMIT" in offline.stderr and "Traceback" not in offline.stderr
