"""The run's bucket refuses every request that does not come over TLS (issue 33, item 6).

S3 takes plain HTTP as well as HTTPS (S3 User Guide, "Protecting data in transit with encryption");
its "Security best practices for Amazon S3" say to refuse HTTP with a bucket policy that denies
``s3:*`` on the bucket and its objects when ``aws:SecureTransport`` is ``false``. The run's bucket had
no policy at all, so a client configured for ``http://`` (a proxy, an ``endpoint_url`` typo, an old
tool) moved checkpoints and model weights in clear text. Against moto's S3 with
``tests/aws/moto_s3_policy.py``, which evaluates a bucket policy's Deny with the request's transport
(the world's endpoint stands for S3's HTTPS one; ``plain_http_listener`` is a plain-HTTP door to the
same buckets).
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from backend import flows
from backend.resources import Action
from targets.aws.facts import AwsFacts
from targets.aws.infra.storage import BUCKET, TLS_ONLY_SID
from tests.aws.conftest import World
from tests.aws.moto_s3_policy import plain_http_listener
from tests.aws.provision_world import REGION, collect, session_for, up

pytestmark = pytest.mark.usefixtures("fast_backoff")


def s3(endpoint: str | None = None) -> Any:
    return boto3.client("s3", region_name=REGION, endpoint_url=endpoint)


def tls_only(bucket: str) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": [{
        "Sid": "DenyPlainHttp", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}


def refused(call: Any) -> str:
    with pytest.raises(ClientError) as err:
        call()
    return str(err.value.response["Error"]["Code"])


def test_the_double_refuses_plain_http_and_takes_tls_under_such_a_policy(world: World) -> None:
    """moto alone refused every object request under this policy (TLS too) and let bucket requests
    through (plain HTTP too): moto_s3_policy's reference."""
    secure = s3()
    secure.create_bucket(Bucket="tls-only-bucket")
    secure.put_bucket_policy(Bucket="tls-only-bucket", Policy=json.dumps(tls_only("tls-only-bucket")))
    secure.put_object(Bucket="tls-only-bucket", Key="a/b.json", Body=b"{}")
    assert secure.get_object(Bucket="tls-only-bucket", Key="a/b.json")["Body"].read() == b"{}"
    assert [o["Key"] for o in secure.list_objects_v2(Bucket="tls-only-bucket")["Contents"]] == ["a/b.json"]
    with plain_http_listener() as endpoint:
        plain = s3(endpoint)
        assert refused(lambda: plain.get_object(Bucket="tls-only-bucket", Key="a/b.json")) == "AccessDenied"
        assert refused(lambda: plain.put_object(Bucket="tls-only-bucket", Key="c", Body=b"x")) == "AccessDenied"
        assert refused(lambda: plain.list_objects_v2(Bucket="tls-only-bucket")) == "AccessDenied"
        assert refused(lambda: plain.head_object(Bucket="tls-only-bucket", Key="a/b.json")) == "403"  # no body
        assert refused(lambda: plain.create_multipart_upload(Bucket="tls-only-bucket", Key="d")) == "AccessDenied"
        # DeleteObjects answers 200 and refuses each key in its Errors (S3 API reference, DeleteObjects).
        batch = plain.delete_objects(Bucket="tls-only-bucket", Delete={"Objects": [{"Key": "a/b.json"}]})
        assert [e["Code"] for e in batch.get("Errors", [])] == ["AccessDenied"] and not batch.get("Deleted")
        assert refused(lambda: plain.delete_bucket_policy(Bucket="tls-only-bucket")) == "AccessDenied"
        assert refused(lambda: plain.delete_bucket(Bucket="tls-only-bucket")) == "AccessDenied"
        plain.create_bucket(Bucket="no-policy-bucket")  # no policy: plain HTTP is taken, as S3 takes it
        plain.put_object(Bucket="no-policy-bucket", Key="k", Body=b"x")
    secure.delete_object(Bucket="tls-only-bucket", Key="a/b.json")
    secure.delete_bucket(Bucket="tls-only-bucket")


@pytest.mark.slow
async def test_the_runs_bucket_denies_requests_without_tls_and_down_still_deletes_it(world: World,
                                                                                      kube_file: Any) -> None:
    session = session_for()
    done = await up(session, until=BUCKET)
    assert done.ok, done.failures()
    name = str(AwsFacts.of(session.record.facts).data_bucket)
    arn = f"arn:aws:s3:::{name}"

    statements = json.loads(s3().get_bucket_policy(Bucket=name)["Policy"])["Statement"]
    (deny,) = [s for s in statements if s.get("Sid") == TLS_ONLY_SID]
    assert deny["Effect"] == "Deny" and deny["Principal"] == "*" and deny["Action"] == "s3:*"
    assert sorted(deny["Resource"]) == [arn, f"{arn}/*"]
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}

    key = f"runs/{session.run_id}/model/config.json"
    s3().put_object(Bucket=name, Key=key, Body=b"{}")  # over TLS: taken
    with plain_http_listener() as endpoint:
        assert refused(lambda: s3(endpoint).get_object(Bucket=name, Key=key)) == "AccessDenied"
        assert refused(lambda: s3(endpoint).put_object(Bucket=name, Key=key, Body=b"x")) == "AccessDenied"

    # Applying again changes nothing; a policy taken away behind rtui's back is put back.
    again = await session.plan()
    assert next(c for c in again.changes if c.address == BUCKET).action is Action.NOOP
    s3().delete_bucket_policy(Bucket=name)
    drifted = await session.plan()
    assert next(c for c in drifted.changes if c.address == BUCKET).action is Action.UPDATE
    done = await up(session, until=BUCKET)
    assert done.ok, done.failures()
    assert json.loads(s3().get_bucket_policy(Bucket=name)["Policy"])["Statement"][0]["Sid"] == TLS_ONLY_SID

    # `down --delete-data` goes over TLS: the policy refuses none of its calls.
    gone = await collect(flows.down(session, delete_data=True))
    assert gone.ok, gone.failures()
    assert name not in [b["Name"] for b in s3().list_buckets()["Buckets"]]


@pytest.mark.slow
async def test_a_statement_someone_added_to_the_runs_bucket_policy_is_kept(world: World, kube_file: Any) -> None:
    session = session_for()
    done = await up(session, until=BUCKET)
    assert done.ok, done.failures()
    name = str(AwsFacts.of(session.record.facts).data_bucket)
    theirs = {"Sid": "AuditorsRead", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
              "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{name}/*"}
    s3().put_bucket_policy(Bucket=name, Policy=json.dumps({"Version": "2012-10-17", "Statement": [theirs]}))
    done = await up(session, until=BUCKET)
    assert done.ok, done.failures()
    statements = json.loads(s3().get_bucket_policy(Bucket=name)["Policy"])["Statement"]
    assert theirs in statements and TLS_ONLY_SID in [s.get("Sid") for s in statements]
