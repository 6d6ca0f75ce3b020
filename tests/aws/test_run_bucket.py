"""The run's own S3 bucket on the aws target (issue 25, item 3 and 5): made by `up` with its four
settings and the run's tags, where the job, `rtui model` and `rtui status` find the run's data; kept
by `down` while it holds data (said with its size and monthly cost, not a leftover of the sweep),
removed by `down --delete-data`, and by `down` when empty. Against moto's S3 over real HTTP, made as
strict as S3 on bucket names (tests/aws/moto_s3.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from backend import flows
from backend.layers.aws.storage import BUCKET, bucket_name
from backend.model import Action, EventKind, StepEvent
from backend.session import RunSession
from tests.aws.conftest import World
from tests.aws.moto_s3 import valid_bucket_name
from tests.aws.provision_world import REGION, RUN_TAG, Outcome, collect, session_for, up

pytestmark = pytest.mark.usefixtures("fast_backoff")


def s3() -> Any:
    return boto3.client("s3", region_name=REGION)


async def bucket_of(session: RunSession) -> str:
    """`up` as far as the bucket (it depends on nothing else of the aws layer)."""
    done = await up(session, until=BUCKET)
    assert done.ok, done.failures()
    name = str(session.record.facts["data_bucket"])
    assert session.record.resources[BUCKET].id == name
    return name


async def down(session: RunSession, *, delete_data: bool = False) -> Outcome:
    return await collect(flows.down(session, delete_data=delete_data))


def step_messages(outcome: Outcome, step: str) -> list[str]:
    return [e.message for e in outcome.events if e.step == step and e.kind is EventKind.PROGRESS]


def kept_event(outcome: Outcome) -> StepEvent | None:
    return next((e for e in outcome.events if e.step == flows.DATA_STEP and "kept" in e.data), None)


def test_the_strict_double_refuses_what_s3_refuses() -> None:
    """moto alone takes all of these; S3 answers InvalidBucketName (moto_s3's reference)."""
    for bad in ("Upper-Case", "under_score", "a..b", "192.168.5.4", "xn--abc", "sthree-abc", "abc-s3alias", "-abc",
                "abc-", "ab", "a" * 64, "abc--ol-s3", "amzn-s3-demo-x"):
        assert not valid_bucket_name(bad), bad
    assert valid_bucket_name("rtui-ray-r20261205-011320-571c-adf9ccb7")


def test_a_bad_name_is_refused_over_http(world: World) -> None:
    with pytest.raises(ClientError) as refused:
        s3().create_bucket(Bucket="Not_A_Bucket")
    assert refused.value.response["Error"]["Code"] == "InvalidBucketName"


@pytest.mark.parametrize("cluster", ["rtui-ray", "a", "c" * 40, "x1-" + "y" * 37])
def test_the_bucket_name_follows_s3s_rules_and_names_the_run(cluster: str) -> None:
    name = bucket_name(cluster, "r20261205-011320-571c", "123456789012", "us-east-1")
    assert valid_bucket_name(name) and len(name) <= 63, name
    assert "r20261205-011320-571c" in name and name.startswith("rtui-")
    other_account = bucket_name(cluster, "r20261205-011320-571c", "210987654321", "us-east-1")
    assert other_account != name  # global names: two accounts' runs of the same id never collide


async def test_up_makes_the_bucket_with_its_four_settings_and_tags_and_the_run_writes_there(
        world: World, kube_file: Path) -> None:
    session = session_for()
    name = await bucket_of(session)
    client = s3()
    block = client.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]
    assert block == {"BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
                     "RestrictPublicBuckets": True}
    rules = client.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"]["Rules"]
    assert [r["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] for r in rules] == ["AES256"]
    assert "Status" not in client.get_bucket_versioning(Bucket=name)  # never enabled
    lifecycle = client.get_bucket_lifecycle_configuration(Bucket=name)["Rules"]
    assert [(r["Status"], r["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"]) for r in lifecycle] == \
        [("Enabled", 1)]
    tags = {t["Key"]: t["Value"] for t in client.get_bucket_tagging(Bucket=name)["TagSet"]}
    assert tags[RUN_TAG] == session.run_id and tags["rtui:cluster"] == "rtui-ray"

    # The job writes under the run's own prefix of it; rtui model/status read the same place.
    store = session.data_store()
    assert store is not None and store.uri == f"s3://{name}/runs/{session.run_id}"
    plan = await session.plan()
    job = next(c for c in plan.changes if c.address == "ray.job.train")
    assert f"--storage-path s3://{name}/runs/{session.run_id} " in str((job.after or {})["entrypoint"])
    bucket = next(c for c in plan.changes if c.address == BUCKET)
    assert bucket.action is Action.NOOP, bucket.reason  # applying twice does nothing the second time
    assert bucket.cost_per_hour == 0 and bucket.cost_note == "$0.023/GB-month of what it holds"

    # A setting changed behind rtui's back is put back by the next apply.
    client.delete_bucket_lifecycle(Bucket=name)
    again = await session.plan()
    assert next(c for c in again.changes if c.address == BUCKET).action is Action.UPDATE
    done = await up(session, until=BUCKET)
    assert done.ok, done.failures()
    assert client.get_bucket_lifecycle_configuration(Bucket=name)["Rules"][0]["ID"]


async def test_a_bucket_of_the_runs_name_made_by_someone_else_is_refused(world: World, kube_file: Path) -> None:
    session = session_for()
    plan = await session.plan()
    assert any(c.address == BUCKET for c in plan.changes)
    name = str(session.record.facts["data_bucket"])
    s3().create_bucket(Bucket=name)  # same name, none of this run's tags
    done = await up(session, until=BUCKET)
    assert not done.ok
    assert any("S3 bucket" in f and "someone else" in f for f in done.failures()), done.failures()


async def test_down_keeps_a_bucket_with_data_says_so_then_delete_data_removes_it(
        world: World, kube_file: Path) -> None:
    session = session_for()
    name = await bucket_of(session)
    key = f"runs/{session.run_id}/TorchTrainer_0/checkpoint_000001/rtui_checkpoint.json"
    s3().put_object(Bucket=name, Key=key, Body=b"x" * 4096)

    kept = await down(session)
    assert kept.ok, kept.failures()  # the sweep does not count it as a leftover
    assert s3().head_bucket(Bucket=name)
    assert any(m.startswith(f"kept: {name} holds data (1 object, 4.1 kB") for m in step_messages(kept, BUCKET))
    sweep = " ".join(step_messages(kept, "sweep"))
    assert f"kept on purpose: S3 bucket {name}" in sweep, sweep
    event = kept_event(kept)
    assert event is not None and event.data["kept"]["bytes"] == 4096 and event.data["kept"]["checkpoints"] == 1
    assert event.data["kept"]["monthly_cost"] == pytest.approx(4096 / 2**30 * 0.023)
    assert "--delete-data" in (event.remedy or "")

    gone = await down(session, delete_data=True)
    assert gone.ok, gone.failures()
    with pytest.raises(ClientError) as missing:
        s3().head_bucket(Bucket=name)
    assert missing.value.response["Error"]["Code"] == "404"
    assert kept_event(gone) is None


async def test_an_empty_bucket_goes_with_down(world: World, kube_file: Path) -> None:
    session = session_for()
    name = await bucket_of(session)
    done = await down(session)
    assert done.ok, done.failures()
    assert name not in [b["Name"] for b in s3().list_buckets()["Buckets"]]
    assert any("(it was empty)" in m for m in step_messages(done, BUCKET))
