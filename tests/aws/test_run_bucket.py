"""The run's own S3 bucket on the aws target (issue 25, item 3 and 5): made by `up` with its four
settings and the run's tags, where the job, `rtui model` and `rtui status` find the run's data; kept
by `down` while it holds data (said with its size and monthly cost, not a leftover of the sweep),
removed by `down --delete-data`, and by `down` when empty. Against moto's S3 over real HTTP, made as
strict as S3 on bucket names (tests/aws/moto_s3.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from backend import flows
from backend.ledger import ResourceStatus
from backend.resources import Action, EventKind, StepEvent
from backend.session import RunSession
from targets.aws.facts import AwsFacts
from targets.aws.infra.iam import DATA_IDENTITY, data_policy_for
from targets.aws.infra.storage import BUCKET, bucket_name
from targets.kube import manifests
from targets.kube.config import KubeConfig
from targets.kube.handlers import RAYCLUSTER
from targets.kube.serviceaccount import SERVICE_ACCOUNT
from tests.aws.conftest import World
from tests.aws.moto_s3 import valid_bucket_name
from tests.aws.provision_world import REGION, RUN_TAG, Outcome, collect, eks, iam, session_for, tagged, up

pytestmark = pytest.mark.usefixtures("fast_backoff")


def s3() -> Any:
    return boto3.client("s3", region_name=REGION)


async def bucket_of(session: RunSession) -> str:
    """`up` as far as the bucket (it depends on nothing else of the aws layer)."""
    done = await up(session, until=BUCKET)
    assert done.ok, done.failures()
    name = str(AwsFacts.of(session.record.facts).data_bucket)
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


@pytest.mark.slow
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
    name = str(AwsFacts.of(session.record.facts).data_bucket)
    s3().create_bucket(Bucket=name)  # same name, none of this run's tags
    done = await up(session, until=BUCKET)
    assert not done.ok
    assert any("S3 bucket" in f and "someone else" in f for f in done.failures()), done.failures()


@pytest.mark.slow
async def test_down_keeps_a_bucket_with_data_says_so_then_delete_data_removes_it(
        world: World, kube_file: Path) -> None:
    session = session_for()
    name = await bucket_of(session)
    key = f"runs/{session.run_id}/TorchTrainer_0/checkpoint_000001/rtui_checkpoint.json"
    s3().put_object(Bucket=name, Key=key, Body=b"x" * 4096)

    kept = await down(session)
    assert kept.ok, kept.failures()  # the sweep does not count it as a leftover
    assert s3().head_bucket(Bucket=name)
    kept_entry = session.record.resources[BUCKET]  # the record says it is still there, and why
    assert kept_entry.status is ResourceStatus.READY and kept_entry.outputs["kept"].startswith("1 object, 4.1 kB")
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
    assert session.record.resources[BUCKET].status is ResourceStatus.DELETED


async def test_an_empty_bucket_goes_with_down(world: World, kube_file: Path) -> None:
    session = session_for()
    name = await bucket_of(session)
    done = await down(session)
    assert done.ok, done.failures()
    assert name not in [b["Name"] for b in s3().list_buckets()["Buckets"]]
    assert any("(it was empty)" in m for m in step_messages(done, BUCKET))


def test_the_strict_double_refuses_deleting_a_bucket_with_an_unfinished_upload(world: World) -> None:
    """moto alone deletes it; S3 keeps a bucket holding parts of an incomplete multipart upload
    (moto_s3's reference), as it keeps one holding an object or a version."""
    client = s3()
    client.create_bucket(Bucket="holds-parts")
    upload = client.create_multipart_upload(Bucket="holds-parts", Key="runs/r1/model.safetensors")
    client.upload_part(Bucket="holds-parts", Key="runs/r1/model.safetensors", UploadId=upload["UploadId"],
                       PartNumber=1, Body=b"x" * 1024)
    with pytest.raises(ClientError) as refused:
        client.delete_bucket(Bucket="holds-parts")
    assert refused.value.response["Error"]["Code"] == "BucketNotEmpty"
    client.abort_multipart_upload(Bucket="holds-parts", Key="runs/r1/model.safetensors", UploadId=upload["UploadId"])
    client.delete_bucket(Bucket="holds-parts")


def test_the_pods_policy_reaches_only_the_runs_prefix() -> None:
    """Objects under the run's prefix, and the listing of that prefix only (the ``s3:prefix`` condition
    of the S3 User Guide's "Bucket policy examples"): no ``s3:*``, no other bucket, no other run."""
    doc = data_policy_for("s3://rtui-ray-abc/runs/r1", "aws")
    objects, listing, itself, markers = doc["Statement"]
    assert objects["Resource"] == "arn:aws:s3:::rtui-ray-abc/runs/r1/*"
    assert set(objects["Action"]) == {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"}
    assert listing["Action"] == "s3:ListBucket" and listing["Resource"] == "arn:aws:s3:::rtui-ray-abc"
    assert listing["Condition"] == {"StringLikeIfExists": {"s3:prefix": ["runs/r1/*"]}}
    assert itself["Action"] == "s3:GetObject" and itself["Resource"] == "arn:aws:s3:::rtui-ray-abc/runs/r1"
    # pyarrow's create_dir puts an empty marker for each ancestor: that key exactly, nothing else above.
    assert markers["Action"] == "s3:PutObject" and markers["Resource"] == ["arn:aws:s3:::rtui-ray-abc/runs/"]
    assert data_policy_for("s3://b/p/r1", "aws-cn")["Statement"][0]["Resource"] == "arn:aws-cn:s3:::b/p/r1/*"


@pytest.mark.slow
async def test_up_gives_the_ray_pods_a_role_for_the_runs_prefix_through_pod_identity(
        world: World, kube_file: Path) -> None:
    session = session_for()
    done = await up(session)
    assert done.ok, done.failures()
    name = str(AwsFacts.of(session.record.facts).data_bucket)
    prefix = f"runs/{session.run_id}"
    # The add-on that hands out the credentials, and the association for the Ray pods' account.
    addons = eks().list_addons(clusterName="rtui-ray")["addons"]
    assert "eks-pod-identity-agent" in addons
    (association,) = eks().list_pod_identity_associations(clusterName="rtui-ray", namespace="rtui",
                                                          serviceAccount="rtui-ray")["associations"]
    role = eks().describe_pod_identity_association(clusterName="rtui-ray", associationId=association[
        "associationId"])["association"]["roleArn"].rsplit("/", 1)[1]
    assert iam().list_attached_role_policies(RoleName=role)["AttachedPolicies"] == []
    (policy,) = iam().list_role_policies(RoleName=role)["PolicyNames"]
    document = iam().get_role_policy(RoleName=role, PolicyName=policy)["PolicyDocument"]
    assert document == data_policy_for(f"s3://{name}/{prefix}", "aws")
    trust = iam().get_role(RoleName=role)["Role"]["AssumeRolePolicyDocument"]["Statement"][0]["Condition"]
    assert trust["StringEquals"]["aws:RequestTag/kubernetes-namespace"] == "rtui"
    assert trust["StringEquals"]["aws:RequestTag/kubernetes-service-account"] == "rtui-ray"

    # The Ray pods run as that account, made after the association (credentials are injected when a pod
    # is created), and the second plan of the aws layer is all no-op.
    plan = await session.plan()
    cluster = next(c for c in plan.changes if c.address == RAYCLUSTER)
    assert {SERVICE_ACCOUNT, DATA_IDENTITY.address} <= set(cluster.depends_on)
    assert (cluster.after or {})["service_account"] == "rtui-ray"
    association_change = next(c for c in plan.changes if c.address == DATA_IDENTITY.address)
    assert BUCKET in association_change.depends_on
    assert [c.address for c in plan.changes if c.layer == "aws" and c.action is not Action.NOOP] == []
    spec = manifests.raycluster(KubeConfig.of(session.config), session.run_id, service_account="rtui-ray")["spec"]
    assert [g["template"]["spec"]["serviceAccountName"] for g in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]] \
        == ["rtui-ray", "rtui-ray"]

    # down goes all the way: the empty bucket, the role, the association.
    gone = await down(session)
    assert gone.ok, gone.failures()
    assert tagged(session.run_id) == {}
    assert name not in [b["Name"] for b in s3().list_buckets()["Buckets"]]


async def test_a_storage_path_of_the_users_bucket_plans_no_bucket_and_scopes_the_role_to_it(
        world: World, kube_file: Path) -> None:
    s3().create_bucket(Bucket="users-own-bucket")
    session = session_for(storage_path="s3://users-own-bucket/team/runs")
    plan = await session.plan()
    assert BUCKET not in [c.address for c in plan.changes]
    assert AwsFacts.of(session.record.facts).data_bucket is None and session.record.facts.storage_path is None
    role = next(c for c in plan.changes if c.address == DATA_IDENTITY.role_address)
    (document,) = (role.after or {})["inline"].values()
    uri = f"s3://users-own-bucket/team/runs/{session.run_id}"
    assert json.loads(document) == data_policy_for(uri, "aws")
    job = next(c for c in plan.changes if c.address == "ray.job.train")
    assert f"--storage-path {uri} " in str((job.after or {})["entrypoint"])
    store = session.data_store()
    assert store is not None and store.uri == uri


async def test_without_s3_storage_no_role_for_the_pods_is_planned(world: World, kube_file: Path) -> None:
    """A --storage-path that is not S3 (a path the pods share) gets no bucket and no S3 role."""
    session = session_for(storage_path="/mnt/shared/rtui")
    plan = await session.plan()
    addresses = [c.address for c in plan.changes]
    assert BUCKET not in addresses and DATA_IDENTITY.address not in addresses and SERVICE_ACCOUNT not in addresses


async def test_delete_data_empties_every_version_and_unfinished_upload_then_the_bucket(
        world: World, kube_file: Path) -> None:
    """A bucket someone turned versioning on for keeps old versions and delete markers, and a worker
    killed mid-upload leaves parts: S3 refuses to delete the bucket while any remain (moto_s3)."""
    session = session_for()
    name = await bucket_of(session)
    client = s3()
    client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    key = f"runs/{session.run_id}/model/model.safetensors"
    client.put_object(Bucket=name, Key=key, Body=b"v1")
    client.put_object(Bucket=name, Key=key, Body=b"v2")
    client.delete_object(Bucket=name, Key=f"runs/{session.run_id}/gone.json")  # a delete marker
    client.create_multipart_upload(Bucket=name, Key=f"runs/{session.run_id}/ckpt.bin")
    gone = await down(session, delete_data=True)
    assert gone.ok, gone.failures()
    assert name not in [b["Name"] for b in client.list_buckets()["Buckets"]]
