"""Preflight: a --storage-path the run cannot write fails before anything is made, naming the
principal and the permission it lacks (`rtui check`, the real binary, S3 on moto's server over HTTP).

moto's server answers every request as allowed until told to authenticate (``/moto-api/reset-auth``);
real S3 evaluates the caller's IAM policy and answers a PutObject it does not allow with 403
AccessDenied (AWS docs: Amazon S3 error responses, "AccessDenied"; IAM: "Actions, resources, and
condition keys for Amazon S3", s3:PutObject on arn:aws:s3:::bucket/key). The fixture turns moto's
authentication on after creating the users, so the double refuses as S3 does.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_rtui
from tests.moto_process import moto_server_process

PREFIX = "runs"


@pytest.fixture
def strict_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, dict[str, str]]]:
    """Bucket ``models``; users ``writer`` (may write runs/*) and ``reader`` (may only read); auth on."""
    # Only the user's access key signs: a session token left in the environment (tests/aws's
    # session-wide moto fixture sets AWS_SESSION_TOKEN until the session ends) makes moto, as STS,
    # refuse a long-term AKIA key with InvalidClientTokenId: the full suite's failure in CI.
    for name in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/rtui-test-aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/rtui-test-aws-credentials")

    with moto_server_process() as endpoint:
        yield from _users_on(endpoint)


def _users_on(endpoint: str) -> Iterator[dict[str, dict[str, str]]]:
    """The bucket and the two users, then moto's authentication on (and yields their keys)."""
    import boto3

    admin = {"endpoint_url": endpoint, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
             "region_name": "us-east-1"}
    boto3.client("s3", **admin).create_bucket(Bucket="models")
    iam = boto3.client("iam", **admin)
    keys: dict[str, dict[str, str]] = {}
    users = {"writer": ["s3:PutObject", "s3:GetObject", "s3:DeleteObject"], "reader": ["s3:GetObject"]}
    for user, actions in users.items():
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": actions, "Resource": f"arn:aws:s3:::models/{PREFIX}/*"},
                {"Effect": "Allow", "Action": "sts:GetCallerIdentity", "Resource": "*"}]}))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        keys[user] = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                      "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"], "AWS_DEFAULT_REGION": "us-east-1"}

    def auth(count: str) -> None:
        request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(), method="POST",
                                         headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).read()

    auth("0")
    yield keys


@pytest.mark.slow
def test_a_bucket_prefix_the_principal_may_not_write_fails_preflight(strict_s3: dict[str, dict[str, str]]) -> None:
    uri = f"s3://models/{PREFIX}"
    denied = run_rtui("check", "--storage-path", uri, "--json", env=strict_s3["reader"])
    assert denied.returncode == 3, denied.stdout + denied.stderr
    [storage] = [c for c in json.loads(denied.stdout)["checks"] if c["id"] == "storage.writable"]
    assert storage["status"] == "fail"
    assert "arn:aws:iam::123456789012:user/reader" in storage["detail"]
    assert "s3:PutObject" in storage["detail"] and f"arn:aws:s3:::models/{PREFIX}/" in storage["detail"]
    ok = run_rtui("check", "--storage-path", uri, "--json", env=strict_s3["writer"])
    [storage] = [c for c in json.loads(ok.stdout)["checks"] if c["id"] == "storage.writable"]
    assert storage["status"] == "ok" and "user/writer" in storage["detail"], storage


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_directory_the_user_may_not_write_fails_preflight(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    proc = run_rtui("check", "--storage-path", str(locked / "runs"), "--json")
    [storage] = [c for c in json.loads(proc.stdout)["checks"] if c["id"] == "storage.writable"]
    assert storage["status"] == "fail" and "missing write permission" in storage["detail"]


def test_a_path_below_a_file_fails_preflight(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    proc = run_rtui("check", "--storage-path", str(tmp_path / "afile" / "runs"), "--json")
    [storage] = [c for c in json.loads(proc.stdout)["checks"] if c["id"] == "storage.writable"]
    assert proc.returncode == 3 and storage["status"] == "fail" and "missing write permission" in storage["detail"]


def test_a_uri_rtui_cannot_check_says_so_instead_of_passing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gs:// (or abfs://, hdfs://) is written by the job with the cluster's credentials: the check says it
    was not made, where it used to test a local directory named "gs:" and pass."""
    monkeypatch.chdir(tmp_path)
    proc = run_rtui("check", "--storage-path", "gs://models/runs", "--json")
    [storage] = [c for c in json.loads(proc.stdout)["checks"] if c["id"] == "storage.writable"]
    assert storage["status"] == "info" and "not checked" in storage["detail"], storage
    assert not (tmp_path / "gs:").exists()
