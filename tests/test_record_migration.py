"""The typed run record: it round-trips whole, and records in an older rtui's format still load.

The samples in ``tests/data/records`` were written by an older rtui's own ``RunStore.save`` (their
README says which and how); they are read here as a user's state dir would hold them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from backend.ledger import ResourceStatus
from backend.record import StoppedWhileIdle, TelemetrySnapshot
from backend.resources import Action, Change, Leftover, Plan
from backend.store import SCHEMA_VERSION, JobRecord, JobState, RunRecord, RunStatus, RunStore, StepState, StepStatus
from backend.telemetry import Telemetry
from targets.aws.config import AwsConfig
from targets.aws.facts import AwsFacts, AzMove, ReservationFact
from targets.local.config import LocalConfig
from tests.conftest import json_lines, run_rtui
from tests.test_cli_errors import assert_one_line

RECORDS = Path(__file__).parent / "data" / "records"


def placed(store: RunStore, sample: str) -> tuple[str, dict[str, Any]]:
    """A sample record put in ``store`` as an older rtui left it; its run id and its JSON."""
    store.ensure_writable()
    data = json.loads((RECORDS / sample).read_text())
    shutil.copy(RECORDS / sample, store.path_for(data["run_id"]))
    return data["run_id"], data


def test_a_v2_local_record_loads_typed(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    run_id, old = placed(store, "v2-local-down.json")
    record = store.load(run_id)
    assert old["schema_version"] == 2 and record.schema_version == SCHEMA_VERSION
    # v4: a run's config holds its target's fields only (v2 and v3 held every target's)
    mine = {k: v for k, v in old["config"].items() if k in LocalConfig.model_fields}
    assert record.config == LocalConfig.model_validate(mine) and record.config.steps == 5
    assert type(record.config) is LocalConfig and "region" in old["config"]
    assert record.rejected_config is None
    assert record.plan is not None and [c.address for c in record.plan.changes] == [
        "local.ray-head", "local.ray-worker.0", "ray.job.train"]
    assert record.plan.changes[1].depends_on == ("local.ray-head",) and record.plan.changes[1].action is Action.CREATE
    # Apply and teardown steps apart, no prefix; each step and resource knows its layer.
    assert set(record.steps) == {"local.ray-head", "local.ray-worker.0", "ray.job.train"}
    assert set(record.teardown_steps) == {"ray.job.train", "local.ray-worker.0", "local.ray-head", "sweep"}
    assert record.steps["local.ray-head"].layer == "local-ray" and record.steps["ray.job.train"].layer == "ray-job"
    assert record.teardown_steps["sweep"].layer == "" and record.teardown_steps["sweep"].status is StepStatus.DONE
    assert {a: r.layer for a, r in record.resources.items()} == {
        "local.ray-head": "local-ray", "local.ray-worker.0": "local-ray", "ray.job.train": "ray-job"}
    assert record.resources["local.ray-head"].outputs["ports"] == {"dashboard": 8265}
    # Telemetry: the run's and its job's, typed.
    job = record.current_job
    assert job is not None and job.status is JobState.SUCCEEDED and job.telemetry == record.telemetry
    assert record.telemetry is not None and record.telemetry.transport.transport == "socket"
    assert record.telemetry.metrics.latest is not None and record.telemetry.metrics.latest.step == 5
    assert record.telemetry.spool.offset == old["telemetry"]["spool"]["offset"]
    # Facts.
    assert record.facts.stopped_while_idle == StoppedWhileIdle(at=1765000100.0, idle_s=600.0,
                                                               dir="/tmp/rtui-r20251206-053320-a1b2-x")
    assert record.facts.sweep == []
    assert record.status is RunStatus.DOWN


def test_a_v2_aws_record_loads_typed(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    run_id, old = placed(store, "v2-aws-failed.json")
    record = store.load(run_id)
    assert record.config.target == "aws" and AwsConfig.of(record.config).availability_zone == "us-east-1b"
    assert "local_cpus" in old["config"] and "local_cpus" not in record.config.model_dump()  # v4: aws's only
    assert record.plan is not None and record.plan.price_source == "estimate, us-east-1 prices"
    assert record.plan.change("aws.nodegroup.gpu") is not None
    assert record.plan.prices() == {"aws.nat-gateway": 0.045, "aws.eks-cluster": 0.10, "aws.nodegroup.gpu": 9.2032}
    ray = record.plan.change("kube.raycluster.rtui.rtui-ray")  # v5: the kube layer's words (v2: "k8s.")
    assert ray is not None and ray.layer == "kube" and ray.depends_on == ("aws.nodegroup.gpu",)
    assert record.steps["aws.nodegroup.gpu"].status is StepStatus.FAILED and record.teardown_steps == {}
    assert record.resources["aws.nodegroup.gpu"].layer == "aws"
    facts = AwsFacts.of(record.facts)
    assert type(record.facts.own) is AwsFacts  # v4: the aws target's facts, typed by it
    assert (facts.gpu_az, facts.network_azs, facts.failed_azs) == ("us-east-1b", ["us-east-1a", "us-east-1b"],
                                                                    ["us-east-1a"])
    assert facts.az_moves == [AzMove(from_az="us-east-1a", to="us-east-1b",
                                     why="InsufficientInstanceCapacity: none left", at=1765000040.0)]
    assert facts.api_cidrs == ["203.0.113.7/32"] and facts.create_attempts == {"aws.nodegroup.gpu": 2}
    assert facts.system_disk_gb == 60 and facts.reservation is None
    assert record.facts.sweep == [Leftover("NAT gateway", "nat-0abc", "available", 0.045, "estimate, us-east-1 prices")]
    assert record.telemetry is None and record.status is RunStatus.FAILED


def test_a_v4_kube_record_reads_in_one_spelling(tmp_path: Path) -> None:
    """v4 named the kube layer "kubernetes", its addresses "k8s.…" and its kinds "k8s-…" (issue 38: one
    spelling). Its plan, steps and ledger read as "kube" everywhere, so `down` and `--resume` find each
    resource by the address the layer gives it now; nothing is left in the old words."""
    store = RunStore(tmp_path / "s")
    run_id, old = placed(store, "v4-kube-up.json")
    assert old["schema_version"] == 4 and "k8s.raycluster" in old["resources"]
    record = store.load(run_id)
    assert record.plan is not None
    assert [(c.address, c.layer, c.kind) for c in record.plan.changes] == [
        ("kube.namespace", "kube", "kube-namespace"), ("kube.secret.ray-token", "kube", "kube-ray-token"),
        ("kube.raycluster", "kube", "raycluster"), ("ray.job.train", "ray-job", "ray-job")]
    ray = record.plan.change("kube.raycluster")
    assert ray is not None and ray.depends_on == ("kube.namespace", "kube.secret.ray-token")
    assert {a: (r.kind, r.layer, r.id) for a, r in record.resources.items()} == {
        "kube.namespace": ("kube-namespace", "kube", "team-a"),
        "kube.secret.ray-token": ("kube-ray-token", "kube", "team-a/rtui-ray-token"),
        "kube.raycluster": ("raycluster", "kube", "RayCluster/team-a/rtui-ray"),
        "ray.job.train": ("ray-job", "ray-job", "rtui-r20251207-090000-e5f6-1")}
    assert {sid: (s.layer, s.title) for sid, s in record.steps.items()} == {
        "kube.namespace": ("kube", "Namespace"), "kube.secret.ray-token": ("kube", "Ray token"),
        "kube.raycluster": ("kube", "Replace kube.raycluster"), "ray.job.train": ("ray-job", "Submit the training job")}
    assert record.status is RunStatus.UP and record.config.target == "kube"
    store.save(record)
    assert "k8s" not in store.path_for(run_id).read_text() and "kubernetes" not in store.path_for(run_id).read_text()


def test_the_durations_an_older_rtui_kept_still_give_the_steps_their_eta(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    store.ensure_writable()
    shutil.copy(RECORDS / "v4-durations.json", store.durations_path)
    assert store.durations() == {"kube/kube-namespace/create": 3.0, "kube/kube-ray-token/create": 3.0,
                                 "kube/raycluster/create": 3.0, "kube/ray-job/create": 3.0}


@pytest.mark.parametrize("sample", ["v2-local-down.json", "v2-aws-failed.json", "v4-kube-up.json"])
def test_loading_an_old_record_changes_nothing_until_it_is_saved(tmp_path: Path, sample: str) -> None:
    store = RunStore(tmp_path / "s")
    run_id, _ = placed(store, sample)
    path = store.path_for(run_id)
    before = path.read_bytes()
    migrated = store.load(run_id)
    store.list()
    assert path.read_bytes() == before
    store.save(migrated)
    saved = json.loads(path.read_text())
    assert saved["schema_version"] == SCHEMA_VERSION
    assert not [k for k in saved["steps"] if k.startswith("teardown:")]
    again = store.load(run_id)
    assert again.model_dump(exclude={"updated_at"}) == migrated.model_dump(exclude={"updated_at"})


def test_a_typed_record_round_trips_whole(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    record = store.new(AwsConfig(target="aws", cluster_name="c1", region="us-west-2", gpu_node_count=3))
    record.plan = Plan(target="aws", notes=["moved"], changes=[
        Change(address="aws.vpc", layer="aws", kind="vpc", action=Action.CREATE, after={"cidr": "10.0.0.0/16"}),
        Change(address="aws.nodegroup.gpu", layer="aws", kind="nodegroup", action=Action.REPLACE,
               depends_on=("aws.vpc",), before={"size": 2}, after={"size": 3}, cost_per_hour=13.8,
               quota={"L-DB2E81BA": {"vcpus": 144.0, "headroom": None}})])
    store.ledger(record).set("aws.vpc", "vpc", ResourceStatus.READY, layer="aws", id="vpc-1", outputs={"n": [1, 2]})
    record.steps["aws.vpc"] = StepState(status=StepStatus.DONE, layer="aws", attempts=1, started_at=1.0, ended_at=2.0)
    record.teardown_steps["aws.vpc"] = StepState(status=StepStatus.FAILED, layer="aws", error="DependencyViolation")
    telemetry = Telemetry()
    telemetry.feed_lines(["NCCL INFO Using network AWS Libfabric",
                          'RTUI_METRIC {"step": 1, "loss": 2.5, "tokens_per_s": 10.0}'])
    snapshot = telemetry.snapshot()
    record.telemetry = snapshot
    record.jobs.append(JobRecord(submission_id="j1", submitted_at=3.0, spec_hash="h", telemetry=snapshot))
    AwsFacts.of(record.facts).az_moves.append(AzMove(from_az="us-west-2a", to="us-west-2b", why="no capacity", at=4.0))
    AwsFacts.of(record.facts).reservation = ReservationFact(az="us-west-2b", id="cr-1", kind="odcr")
    record.facts.sweep = [Leftover("Elastic IP", "eipalloc-1", "", 0.005)]
    store.save(record)
    loaded = store.load(record.run_id)
    assert loaded == record
    assert isinstance(loaded.telemetry, TelemetrySnapshot) and loaded.telemetry.metrics.latest is not None
    assert loaded.telemetry.metrics.latest.loss == 2.5 and loaded.telemetry.transport.network == "AWS Libfabric"


def test_a_fact_this_rtui_does_not_know_is_no_silent_loss(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    run_id, old = placed(store, "v2-aws-failed.json")
    old["facts"]["gpu_zone_of_tomorrow"] = "x"
    store.path_for(run_id).write_text(json.dumps(old))
    with pytest.raises(Exception, match="is corrupt .*gpu_zone_of_tomorrow"):
        store.load(run_id)


def test_a_config_this_rtui_rejects_is_kept_as_written(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s")
    run_id, old = placed(store, "v2-local-down.json")
    old["config"]["steps"] = -3
    store.path_for(run_id).write_text(json.dumps(old))
    record = store.load(run_id)
    assert record.rejected_config is not None and record.rejected_config.written["steps"] == -3
    assert "steps" in record.rejected_config.reason
    assert (record.config.target, record.config.cluster_name) == ("local", "rtui-ray")
    store.save(record)  # a teardown saves it: what was written is still there
    assert store.load(run_id).rejected_config == record.rejected_config
    record.use_config(LocalConfig(steps=7))  # applied again with a config this rtui takes
    store.save(record)
    again = store.load(run_id)
    assert again.rejected_config is None and again.config.steps == 7


def test_the_cli_reads_an_old_record(isolated_env: Path) -> None:
    run_id, _ = placed(RunStore(), "v2-local-down.json")
    runs = run_rtui("runs", "--json")
    assert runs.returncode == 0, runs.stderr
    assert [r["run_id"] for r in json_lines(runs.stdout)[0]["runs"]] == [run_id]
    status = run_rtui("status", run_id, "--json")
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    data = json_lines(status.stdout)[0]
    assert data["status"] == "down" and set(data["teardown_steps"]) >= {"sweep", "local.ray-head"}
    human = run_rtui("status", run_id)
    assert human.returncode == 0 and "teardown local.ray-head" in human.stdout, human.stderr
    assert data["cluster"]["stopped_while_idle"] == {"at": 1765000100.0, "idle_s": 600.0,
                                                     "dir": "/tmp/rtui-r20251206-053320-a1b2-x"}


def test_a_record_of_no_known_version_says_so_in_one_line(isolated_env: Path) -> None:
    store = RunStore()
    run_id, old = placed(store, "v2-local-down.json")
    old["schema_version"] = 0
    store.path_for(run_id).write_text(json.dumps(old))
    assert_one_line(run_rtui("status", run_id), 1, f"run record {run_id} is corrupt (schema version 0")


def test_a_record_is_a_run_record_with_typed_parts() -> None:
    """No untyped dict is left among the record's own fields."""
    loose = {name: str(field.annotation) for name, field in RunRecord.model_fields.items()
             if "Any" in str(field.annotation)}
    assert loose == {}
