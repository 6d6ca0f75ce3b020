"""The Ray pods' S3 role, judged as IAM judges it (tests/aws/iam_strict.py): Ray Train's storage setup and
checkpoint upload (its ``StorageContext`` over pyarrow's S3 filesystem, what ``trainer.fit()`` runs first)
work with the pod role's credentials on the run's prefix, and nothing reaches another run's prefix.

Issue 34, item 1: the role granted ``s3:ListBucket`` only under an ``s3:prefix`` condition; pyarrow's
``create_dir`` sends HeadBucket first, which S3 authorises as ListBucket without that key, so IAM finds
the condition false and the default run failed at ``trainer.fit()`` with a 403 (moto passed it)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from torch.distributed.checkpoint.metadata import Metadata

from targets.aws.facts import AwsFacts
from targets.aws.infra.iam import DATA_IDENTITY, DATA_WORKERS_IDENTITY
from targets.kube.handlers import RAYCLUSTER
from tests.aws.conftest import World
from tests.aws.iam_strict import Decision, condition_holds, evaluate
from tests.aws.provision_world import REGION, eks, iam, session_for, up

pytestmark = pytest.mark.usefixtures("fast_backoff")


# -- the evaluator itself, on IAM's documented rules ------------------------------------------------------

def test_a_condition_on_a_key_the_request_lacks_is_false_but_for_ifexists_null_and_negations() -> None:
    none: dict[str, list[str]] = {}
    assert not condition_holds("StringLike", "s3:prefix", ["runs/*"], none)
    assert condition_holds("StringLikeIfExists", "s3:prefix", ["runs/*"], none)
    assert condition_holds("StringNotLike", "s3:prefix", ["runs/*"], none)
    assert condition_holds("Null", "s3:prefix", "true", none)
    assert not condition_holds("Null", "s3:prefix", "false", none)
    given = {"s3:prefix": ["runs/a/"]}
    assert condition_holds("StringLike", "s3:prefix", ["runs/a/*"], given)
    assert not condition_holds("StringLikeIfExists", "s3:prefix", ["runs/b/*"], given)
    assert condition_holds("StringLike", "s3:prefix", ["runs/?/"], given)


def test_an_explicit_deny_wins_and_nothing_allowed_is_an_implicit_deny() -> None:
    allow = {"Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}]}
    deny = {"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": "arn:aws:s3:::b/*",
                           "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}
    tls = {"aws:securetransport": ["true"]}
    assert evaluate([allow], "s3:GetObject", "arn:aws:s3:::b/k", tls, resource_policy=deny) is Decision.ALLOW
    assert evaluate([allow], "s3:GetObject", "arn:aws:s3:::b/k", {"aws:securetransport": ["false"]},
                    resource_policy=deny) is Decision.DENY
    assert evaluate([allow], "s3:PutObject", "arn:aws:s3:::b/k", tls) is Decision.IMPLICIT_DENY


# -- the pod role of a default aws run, over real HTTP -------------------------------------------------------

def pod_credentials(session: Any, account: str = DATA_IDENTITY.service_account) -> dict[str, str]:
    """What EKS Pod Identity hands the Ray pods: credentials of the role their association names."""
    (association,) = eks().list_pod_identity_associations(
        clusterName=session.config.cluster_name, namespace=session.config.namespace,
        serviceAccount=account)["associations"]
    role_arn = eks().describe_pod_identity_association(
        clusterName=session.config.cluster_name, associationId=association["associationId"])["association"]["roleArn"]
    assert iam().get_role(RoleName=role_arn.rsplit("/", 1)[1])
    creds = boto3.client("sts", region_name=REGION).assume_role(RoleArn=role_arn, RoleSessionName="ray-worker")
    c = creds["Credentials"]
    return {"access_key": c["AccessKeyId"], "secret_key": c["SecretAccessKey"], "session_token": c["SessionToken"]}


def pod_filesystem(world: World, creds: dict[str, str]) -> Any:
    import pyarrow.fs as pafs

    host = world.endpoint.removeprefix("http://")
    return pafs.S3FileSystem(**creds, endpoint_override=host, scheme="http", region=REGION)


def pod_s3(world: World, creds: dict[str, str]) -> Any:
    return boto3.client("s3", region_name=REGION, endpoint_url=world.endpoint, aws_access_key_id=creds["access_key"],
                        aws_secret_access_key=creds["secret_key"], aws_session_token=creds["session_token"])


@pytest.mark.slow
async def test_ray_trains_storage_setup_and_first_checkpoint_work_with_the_pod_role(
        world: World, kube_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.train import Checkpoint
    from ray.train.v2._internal.execution.storage import StorageContext

    # as_directory() copies the checkpoint under a lock of ray.air's in the system's temporary dir
    # (_ray_lockfiles, ray/_common/utils.get_default_system_temp_dir: RAY_TMPDIR, else TMPDIR): the test's.
    monkeypatch.setenv("TMPDIR", str(tmp_path))

    session = session_for()
    done = await up(session)
    assert done.ok, done.failures()
    bucket, run_id = str(AwsFacts.of(session.record.facts).data_bucket), session.run_id
    creds = pod_credentials(session)
    fs = pod_filesystem(world, creds)

    # What trainer.fit() does first on the driver, then per checkpoint on a worker (the job's
    # --storage-path is the run's prefix of its bucket; the run name is the experiment's dir).
    storage = StorageContext(storage_path=f"{bucket}/runs/{run_id}", experiment_dir_name="rtui-1",
                             storage_filesystem=fs)
    local = tmp_path / "ckpt"
    local.mkdir()
    (local / "rtui_checkpoint.json").write_text('{"step": 1, "world_size": 1}')
    (local / "rank0_state.pt").write_bytes(b"\0" * 1024)
    persisted = storage.persist_current_checkpoint(Checkpoint(str(local)), "checkpoint_step_00000001")
    with persisted.as_directory() as back:
        assert (Path(back) / "rtui_checkpoint.json").read_text() == '{"step": 1, "world_size": 1}'

    client = pod_s3(world, creds)
    client.head_bucket(Bucket=bucket)
    # A missing key of the run's own prefix answers 404 (resume looks for markers that are not there yet).
    with pytest.raises(ClientError) as missing:
        client.head_object(Bucket=bucket, Key=f"runs/{run_id}/nothing-here")
    assert missing.value.response["Error"]["Code"] in ("404", "NoSuchKey")
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"runs/{run_id}/")["Contents"]
    assert any(o["Key"].endswith("rank0_state.pt") for o in listed)
    client.delete_object(Bucket=bucket, Key=f"runs/{run_id}/rtui-1/checkpoint_step_00000001/rank0_state.pt")


@pytest.mark.slow
async def test_resume_finds_the_runs_checkpoints_with_the_pod_role(
        world: World, kube_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--resume-from latest`` looks at the job's storage path with the pods' credentials (pyarrow's
    ``from_uri`` takes them from the environment, as a pod's Pod Identity agent provides them)."""
    from training.checkpoint import find_checkpoints

    session = session_for()
    done = await up(session)
    assert done.ok, done.failures()
    bucket, run_id = str(AwsFacts.of(session.record.facts).data_bucket), session.run_id
    creds = pod_credentials(session)
    storage = f"s3://{bucket}/runs/{run_id}"
    for key, value in {"AWS_ACCESS_KEY_ID": creds["access_key"], "AWS_SECRET_ACCESS_KEY": creds["secret_key"],
                       "AWS_SESSION_TOKEN": creds["session_token"]}.items():
        monkeypatch.setenv(key, value)
    assert find_checkpoints(storage) == []  # nothing yet: a fresh start, not a 403
    client = pod_s3(world, creds)
    step = f"runs/{run_id}/rtui-1/checkpoint_step_00000003"
    # The finder reads .metadata (the shard files it names must all be there): a real, empty one.
    metadata = pickle.dumps(Metadata(state_dict_metadata={}, storage_data={}))
    for name, body in {"rtui_checkpoint.json": b'{"step": 3, "world_size": 1}', ".metadata": metadata,
                       "rank0_state.pt": b"s", "__0_0.distcp": b"d"}.items():
        client.put_object(Bucket=bucket, Key=f"{step}/{name}", Body=body)
    assert [s for s, _ in find_checkpoints(storage)] == [3]


@pytest.mark.slow
async def test_the_pod_role_reaches_nothing_of_another_runs_prefix(world: World, kube_file: Path) -> None:
    session = session_for()
    done = await up(session)
    assert done.ok, done.failures()
    bucket = str(AwsFacts.of(session.record.facts).data_bucket)
    boto3.client("s3", region_name=REGION).put_object(Bucket=bucket, Key="runs/other-run/secret", Body=b"x")
    client = pod_s3(world, pod_credentials(session))
    attempts: dict[str, Callable[[], Any]] = {
        "get": lambda: client.get_object(Bucket=bucket, Key="runs/other-run/secret"),
        "put": lambda: client.put_object(Bucket=bucket, Key="runs/other-run/x", Body=b"x"),
        "delete": lambda: client.delete_object(Bucket=bucket, Key="runs/other-run/secret"),
        "list": lambda: client.list_objects_v2(Bucket=bucket, Prefix="runs/other-run/"),
        "list the parent": lambda: client.list_objects_v2(Bucket=bucket, Prefix="runs/"),
        "bucket policy": lambda: client.get_bucket_policy(Bucket=bucket),
    }
    for what, attempt in attempts.items():
        with pytest.raises(ClientError) as refused:
            attempt()
        assert refused.value.response["Error"]["Code"] in ("AccessDenied", "403"), what


@pytest.mark.slow
async def test_the_workers_own_account_gets_the_same_data_rights_and_the_raycluster_uses_it(
        world: World, kube_file: Path) -> None:
    """Issue 33: workers never run as the head's account (KubeRay binds its autoscaler Role to it); on aws
    they still write checkpoints, so their own token-less account has its own association to the data role."""
    session = session_for()
    done = await up(session)
    assert done.ok, done.failures()
    bucket, run_id = str(AwsFacts.of(session.record.facts).data_bucket), session.run_id
    client = pod_s3(world, pod_credentials(session, DATA_WORKERS_IDENTITY.service_account))
    client.head_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key=f"runs/{run_id}/from-a-worker", Body=b"x")
    with pytest.raises(ClientError):
        client.get_object(Bucket=bucket, Key="runs/another-run/x")
    plan = await session.plan()
    cluster = next(c for c in plan.changes if c.address == RAYCLUSTER)
    assert (cluster.after or {})["worker_service_account"] == DATA_WORKERS_IDENTITY.service_account
    assert (cluster.after or {})["service_account"] == DATA_IDENTITY.service_account
    assert DATA_WORKERS_IDENTITY.address in cluster.depends_on
