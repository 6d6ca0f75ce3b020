"""The run's volume on kube (issue 25, item 3): ``--storage-size`` makes a PersistentVolumeClaim of the
cluster's default StorageClass that the Ray head and workers mount; the job writes under it.

The emulator binds claims like the PV controller and a CSI provisioner (fake_control._claim) and sets
the default class at admission (kmock_ext._admit_claim): a claim with no class on a cluster without a
default StorageClass stays Pending, and so do the pods that mount it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from targets.kube import raycluster, volume_store
from targets.kube.config import KubeConfig
from tests.eventually import eventually
from tests.kube.conftest import KubeCluster
from tests.kube.fake_control import FakeControlPlane
from tests.kube.kube_world import KubeWorld, events, failure, gpu_cluster, world

__all__ = ["world"]  # the fixture, imported for pytest

MOUNT = "/var/lib/rtui-data"


def storage_class(cluster: KubeCluster, name: str, provisioner: str, *, default: bool = True,
                  binding: str = "Immediate") -> dict[str, Any]:
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return cluster.create({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                           "metadata": {"name": name, "annotations": annotations},
                           "provisioner": provisioner, "volumeBindingMode": binding})


def claim(cluster: KubeCluster, name: str, modes: tuple[str, ...] = ("ReadWriteMany",)) -> dict[str, Any]:
    cluster.add_namespace("team") if cluster.get("Namespace", "team") is None else None
    return cluster.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "metadata": {"name": name, "namespace": "team"},
                           "spec": {"accessModes": list(modes), "resources": {"requests": {"storage": "5Gi"}}}})


def _in_process(world: KubeWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(raycluster, "UNSCHEDULABLE_TIMEOUT_S", 3.0)


# ---- the emulator is as strict as the real thing -------------------------------------------------------

def test_a_claim_without_class_stays_pending_without_a_default_storage_class(kube_cluster: KubeCluster) -> None:
    with FakeControlPlane(kube_cluster) as control:
        made = claim(kube_cluster, "data")
        assert "storageClassName" not in made["spec"]
        control.settled()  # the PV controller has looked at the claim: it stays Pending
        live = kube_cluster.read("PersistentVolumeClaim", "data", "team")
        assert live["status"]["phase"] == "Pending"
        why = [e["message"] for e in kube_cluster.objects("Event", "team")
               if e["involvedObject"]["name"] == "data"]
        assert why == ["no persistent volumes available for this claim and no storage class is set"]
        # A pod that mounts it is never scheduled (kube-scheduler's VolumeBinding filter).
        node = kube_cluster.add_node("n0", gpus=0, efa=0)
        pod = kube_cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
                                   "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": [
                                       {"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}})
        assert control._schedule(pod, [node]) is None
        status = kube_cluster.read("Pod", "p", "team")["status"]
        assert "pod has unbound immediate PersistentVolumeClaims" in status["conditions"][0]["message"]


def test_the_default_storage_class_is_set_at_admission_and_binds(kube_cluster: KubeCluster) -> None:
    # The older default's name sorts first, so only its age can make the newer one win: in the same
    # second the API server picks by name (pkg/volume/util/storageclass.go GetDefaultClass).
    storage_class(kube_cluster, "an-old-default", "efs.csi.aws.com")
    kube_cluster.advance_clock(1)  # creationTimestamp has whole seconds: the newer default must be newer
    storage_class(kube_cluster, "efs", "efs.csi.aws.com")
    storage_class(kube_cluster, "not-default", "efs.csi.aws.com", default=False)
    with FakeControlPlane(kube_cluster):
        made = claim(kube_cluster, "data")
        assert made["spec"]["storageClassName"] == "efs"  # the newest default
        eventually("the claim to be Bound",
                   lambda: kube_cluster.read("PersistentVolumeClaim", "data", "team")["status"]["phase"] == "Bound",
                   timeout=30)


def test_two_defaults_of_the_same_second_go_by_name(kube_cluster: KubeCluster) -> None:
    kube_cluster.advance_clock(0)  # the server's clock stands: both defaults are of one second
    storage_class(kube_cluster, "efs", "efs.csi.aws.com")
    storage_class(kube_cluster, "zz-default", "efs.csi.aws.com")  # made last, but its name sorts last
    assert claim(kube_cluster, "data")["spec"]["storageClassName"] == "efs"


def test_a_block_device_class_refuses_read_write_many(kube_cluster: KubeCluster) -> None:
    storage_class(kube_cluster, "gp3", "ebs.csi.aws.com")
    with FakeControlPlane(kube_cluster) as control:
        claim(kube_cluster, "data")
        control.settled()  # the provisioner has looked at the claim: it refused it
        assert kube_cluster.read("PersistentVolumeClaim", "data", "team")["status"]["phase"] == "Pending"
        why = [e["reason"] for e in kube_cluster.objects("Event", "team") if e["involvedObject"]["name"] == "data"]
        assert why == ["ProvisioningFailed"]


# ---- rtui up --storage-size ---------------------------------------------------------------------------

def test_no_default_storage_class_is_refused_in_preflight_in_one_line(
        world: KubeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tui import cli

    gpu_cluster(world.cluster)
    storage_class(world.cluster, "efs", "efs.csi.aws.com", default=False)  # a class, but none is the default
    _in_process(world, monkeypatch)
    code = cli.main(["up", "--yes", "--storage-size", "50Gi"])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    lines = [ln for ln in text.splitlines() if "default StorageClass" in ln]
    assert code == 2, text[-3000:]
    assert lines and "stays Pending" in lines[0], text[-3000:]
    assert "Traceback" not in text
    assert world.labelled() == []
    assert world.cluster.objects("PersistentVolumeClaim") == []


def test_a_read_write_once_default_class_is_refused_with_the_reason(
        world: KubeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tui import cli

    gpu_cluster(world.cluster)
    storage_class(world.cluster, "gp3", "ebs.csi.aws.com", binding="WaitForFirstConsumer")
    _in_process(world, monkeypatch)
    code = cli.main(["up", "--yes", "--storage-size", "50Gi"])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 2, text[-3000:]
    lines = [ln for ln in text.splitlines() if "ReadWriteOnce" in ln]
    assert lines and "gp3" in lines[0] and "different nodes" in lines[0], text[-3000:]
    assert world.cluster.objects("PersistentVolumeClaim") == []


def test_the_plan_shows_the_volume(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    storage_class(world.cluster, "efs", "efs.csi.aws.com")
    out = world.rtui("plan", "--storage-size", "50Gi").stdout
    assert "kube.pvc.data" in out, out
    assert "50Gi" in out and "efs (efs.csi.aws.com, the cluster's default)" in out and "ReadWriteMany" in out, out


def test_the_volume_is_made_mounted_and_written_to(
        world: KubeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tui import cli

    gpu_cluster(world.cluster)
    storage_class(world.cluster, "efs", "efs.csi.aws.com")
    _in_process(world, monkeypatch)
    code = cli.main(["up", "--yes", "--json", "--storage-size", "50Gi"])
    out = capsys.readouterr().out
    assert code == 0, failure(out)
    assert events(out)[-1]["data"]["job_status"] == "SUCCEEDED"
    [pvc] = world.cluster.objects("PersistentVolumeClaim", "rtui")
    run_id = pvc["metadata"]["labels"]["rtui.dev/run"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert pvc["spec"]["storageClassName"] == "efs" and pvc["status"]["phase"] == "Bound"
    ray_pods = [p for p in world.cluster.objects("Pod", "rtui") if "ray.io/node-type" in p["metadata"]["labels"]]
    assert {p["metadata"]["labels"]["ray.io/node-type"] for p in ray_pods} == {"head", "worker"}
    for pod in ray_pods:
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["rtui-data"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
        mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
        assert MOUNT in mounts
    [job] = world.head.jobs.values()
    assert f"--storage-path {MOUNT}/{run_id}" in job.entrypoint


# ---- down keeps the volume; `rtui model` copies from it; --delete-data removes it --------------------

def _write_model(root: Path, files: dict[str, bytes]) -> None:
    """A model directory as training.export leaves it: the files, then the marker that lists them."""
    root.mkdir(parents=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    (root / "rtui_model.json").write_text(json.dumps({
        "format": "hf", "step": 5, "final": True, "dtype": "bf16", "files": sorted(files),
        "bytes": sum(len(d) for d in files.values()), "export_s": 0.1, "state_bytes": 1, "tokenizer": False,
        "eval": {"before": {"loss": 6.9, "tokens": 64}, "after": {"loss": 0.1, "tokens": 64}}}))


def _kept_run(world: KubeWorld, tmp_path: Path, files: dict[str, bytes]) -> tuple[str, str, Path]:
    """`up --storage-size`, a model (and a checkpoint) on its volume, then `down`: (run id, claim, volume dir)."""
    gpu_cluster(world.cluster)
    storage_class(world.cluster, "efs", "efs.csi.aws.com")
    world.rtui("up", "--yes", "--storage-size", "50Gi")
    [pvc] = world.cluster.objects("PersistentVolumeClaim", "rtui")
    run_id, claim_name = pvc["metadata"]["labels"]["rtui.dev/run"], pvc["metadata"]["name"]
    volume = tmp_path / "volume"
    world.control.volumes[("rtui", claim_name)] = volume
    _write_model(volume / run_id / "rtui-train" / "model", files)
    (volume / run_id / "rtui-train" / "checkpoint_000001").mkdir()
    (volume / run_id / "rtui-train" / "checkpoint_000001" / "rtui_checkpoint.json").write_text("{}")
    return run_id, claim_name, volume


def _reader_pods(world: KubeWorld) -> list[str]:
    return [s.path for s in world.cluster.requests("PATCH") if "-read-" in s.path]


def test_down_keeps_the_volume_model_copies_it_and_delete_data_removes_it(
        world: KubeWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = os.urandom(6 * 2**20) + b"\0" * 2**20 + bytes(range(256)) * 4096  # ~8 MiB, every byte value
    extra = os.urandom(300_000)
    run_id, claim_name, _ = _kept_run(world, tmp_path, {"config.json": b"{}", "model.safetensors": weights,
                                                         "tokenizer.json": extra})

    down = world.rtui("down", "--yes")
    text = down.stdout + down.stderr
    kept = [ln for ln in text.splitlines() if "kept on purpose" in ln]
    assert kept and f"pvc://rtui/{claim_name}/{run_id} (a 50Gi volume): 1 model, 1 checkpoint" \
        in kept[0] and "under $0.01/month" in kept[0], text
    assert world.cluster.get("PersistentVolumeClaim", claim_name, "rtui") is not None
    assert world.cluster.get("Namespace", "rtui") is not None
    assert world.cluster.objects("RayCluster", "rtui") == []

    # The sweep of another kube run's `rtui status` lists it as kept on purpose (as `down` measured it:
    # no pod for it), with the command that deletes it.
    _in_process(world, monkeypatch)
    from backend.store import RunStore

    other = RunStore().create(KubeConfig(target="kube", cluster_name="other", kubeconfig=str(world.cluster.kubeconfig)))
    status = world.rtui("status", other.run_id, "--json")
    [kept_json] = json.loads(status.stdout.splitlines()[-1])["kept_data"]
    assert kept_json["run_id"] == run_id and kept_json["kept_on_purpose"] is True and kept_json["models"] == 1
    assert kept_json["where"] == f"pvc://rtui/{claim_name}/{run_id} (a 50Gi volume)"
    assert kept_json["bytes"] > len(weights) and kept_json["monthly_cost"] is not None
    text = world.rtui("status", other.run_id).stdout
    lines = [ln for ln in text.splitlines() if ln.startswith("kept")]
    assert len(lines) == 1 and "(a 50Gi volume)" in lines[0] and "/month" in lines[0], text
    assert f"down {run_id} --delete-data --yes" in lines[0], text

    # A new run in that namespace is refused, saying whose data is there and how to remove it.
    again = world.rtui("up", "--yes", "--storage-size", "50Gi", check=False)
    refused = [ln for ln in (again.stdout + again.stderr).splitlines() if "kept" in ln]
    assert again.returncode == 2 and refused and run_id in refused[0], again.stdout + again.stderr
    assert f"rtui down {run_id} --delete-data --yes" in again.stdout + again.stderr

    # The TUI's teardown modal asks for the usage on its own event loop.
    async def on_a_loop() -> str:
        store = volume_store.VolumeStore(KubeConfig(target="kube", storage_size="50Gi", kubeconfig=str(
            world.cluster.kubeconfig)), run_id)
        return (await store.usage()).describe()

    assert "1 model, 1 checkpoint" in asyncio.run(on_a_loop())

    to = tmp_path / "model"
    from tui import cli

    pods_before, execs_before = len(_reader_pods(world)), len(world.cluster.requests(path_contains="/exec"))
    started = time.perf_counter()
    assert cli.main(["model", run_id, "--to", str(to)]) == 0
    took = time.perf_counter() - started
    assert (to / "model.safetensors").read_bytes() == weights
    assert (to / "tokenizer.json").read_bytes() == extra
    assert (to / "config.json").read_bytes() == b"{}"
    # One pod finds the model, one copies all of it: a listing and one tar stream in it.
    assert len(_reader_pods(world)) - pods_before == 2, _reader_pods(world)
    execs = world.cluster.requests(path_contains="/exec")[execs_before:]
    tars = [s for s in execs if s.query.get("command") == "tar"]
    assert len(tars) == 1 and tars[0].status == 101 and tars[0].method == "GET", execs
    assert [p for p in world.cluster.objects("Pod", "rtui") if "-read-" in p["metadata"]["name"]] == []
    mib = sum(len(b) for b in (weights, extra)) / 2**20
    print(f"\nrtui model --to: {mib:.1f} MiB in {took:.2f}s on the emulator ({took / mib * 1000:.0f} ms/MiB)")

    kept_record = json.loads(world.rtui("status", run_id, "--json").stdout.splitlines()[-1])["resources"]
    assert {a: r["status"] for a, r in kept_record.items() if r["kind"] in ("kube-pvc", "kube-namespace")} == {
        "kube.pvc.data": "ready", "kube.namespace": "ready"}, kept_record
    gone = world.rtui("down", run_id, "--delete-data", "--yes")
    assert "deleted" in gone.stdout + gone.stderr, gone.stdout + gone.stderr
    assert world.cluster.get("PersistentVolumeClaim", claim_name, "rtui") is None
    assert world.cluster.get("Namespace", "rtui") is None
    after = json.loads(world.rtui("status", run_id, "--json").stdout.splitlines()[-1])
    assert not [a for a, r in after["resources"].items() if r["status"] == "ready"], after["resources"]
    assert json.loads(world.rtui("status", other.run_id, "--json").stdout.splitlines()[-1])["kept_data"] == []
    assert [ln for ln in world.rtui("status", other.run_id).stdout.splitlines() if ln.startswith("kept")] == []


def test_a_stopped_copy_resumes_with_the_files_it_lacks(
        world: KubeWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"config.json": b"{}", "model-00001.safetensors": os.urandom(500_000),
             "model-00002.safetensors": os.urandom(400_000)}
    run_id, _, _ = _kept_run(world, tmp_path, files)
    to = tmp_path / "model"
    to.mkdir()
    (to / "model-00001.safetensors").write_bytes(files["model-00001.safetensors"])  # copied before it stopped
    (to / "model-00002.safetensors").write_bytes(files["model-00002.safetensors"][:1000])  # cut short
    _in_process(world, monkeypatch)

    store = volume_store.VolumeStore(KubeConfig(target="kube", storage_size="50Gi", kubeconfig=str(
        world.cluster.kubeconfig)), run_id)
    model = asyncio.run(store.latest_model())
    assert model is not None
    assert sorted(asyncio.run(store.fetch(model, to))) == ["config.json", "model-00002.safetensors"]
    for name, data in files.items():
        assert (to / name).read_bytes() == data
    [tar] = [s for s in world.cluster.requests(path_contains="/exec") if s.query.get("command") == "tar"]
    assert list(os.listdir(to)) and not [n for n in os.listdir(to) if n.endswith(".part")]
    assert asyncio.run(store.fetch(model, to)) == []  # all there: nothing asked of the volume's pod but its listing


def test_where_exec_is_forbidden_the_copy_says_so_once_and_reads_pod_logs(
        world: KubeWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(volume_store, "CHUNK_BYTES", 50_000)  # several reader pods for one file
    weights = bytes(range(256)) * 700 + b"\0" * 20_000  # equal chunks: numbered lines keep them apart
    run_id, _, _ = _kept_run(world, tmp_path, {"config.json": b"{}", "model.safetensors": weights})
    world.cluster.forbid("create", "pods/exec", "rtui")
    _in_process(world, monkeypatch)
    from tui import cli

    to = tmp_path / "model"
    capsys.readouterr()
    assert cli.main(["model", run_id, "--to", str(to)]) == 0
    assert (to / "model.safetensors").read_bytes() == weights
    err = capsys.readouterr().err
    notes = [ln for ln in err.splitlines() if "pods/exec" in ln]
    assert len(notes) == 1 and "pod logs" in notes[0], err
    assert len(_reader_pods(world)) >= 2 + len(weights) // 50_000


@pytest.mark.parametrize(("args", "says"), [
    (["--storage-size", "50GB"], "a size such as 50Gi"),
    (["--storage-size", "100Mi"], "at least 1Gi"),
    (["--storage-size", "50Gi", "--storage-path", "s3://bkt/p"], "pass one of them"),
    (["--storage-size", "50Gi", "--target", "local"], "the local target has none"),
])
def test_bad_storage_size_is_one_line_exit_2(args: list[str], says: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from tui import cli

    monkeypatch.setenv("RTUI_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RTUI_TARGET", "kube")
    code = cli.main(["plan", *args])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 2, text
    assert says in text and "Traceback" not in text, text
    assert len([ln for ln in text.splitlines() if ln.strip()]) <= 2, text


def test_the_manifest_shows_the_claim_and_the_mounts(world: KubeWorld) -> None:
    out = world.rtui("manifest", "--storage-size", "50Gi").stdout
    assert "kind: PersistentVolumeClaim" in out and "storage: 50Gi" in out and "ReadWriteMany" in out, out
    assert out.count("claimName: rtui-ray-data") == 2, out  # the head and the worker group


# ---- --service-account: the Ray pods run as an account the cluster gives credentials to -------------

def test_a_pod_of_a_missing_service_account_is_refused(kube_cluster: KubeCluster) -> None:
    kube_cluster.add_namespace("team")
    with pytest.raises(Exception, match="error looking up service account team/trainer"):
        kube_cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
                             "spec": {"serviceAccountName": "trainer", "containers": [{"name": "c", "image": "i"}]}})


def test_the_ray_pods_run_as_the_service_account_rtui_makes(
        world: KubeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tui import cli

    gpu_cluster(world.cluster)
    _in_process(world, monkeypatch)
    code = cli.main(["up", "--yes", "--json", "--service-account", "trainer"])
    out = capsys.readouterr().out
    assert code == 0, failure(out)
    account = world.cluster.read("ServiceAccount", "trainer", "rtui")
    assert account["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rtui"
    ray_pods = [p for p in world.cluster.objects("Pod", "rtui") if "ray.io/node-type" in p["metadata"]["labels"]]
    assert ray_pods and {p["spec"].get("serviceAccountName") for p in ray_pods} == {"trainer"}
    assert "ServiceAccount/trainer" in world.labelled()
    code = cli.main(["down", "--yes"])
    assert code == 0
    assert world.cluster.get("ServiceAccount", "trainer", "rtui") is None
