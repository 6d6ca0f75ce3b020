"""The EKS token and the kubeconfig entry: built offline with fake static credentials."""

from __future__ import annotations

import base64
import datetime as dt
import json
import stat
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import boto3
import pytest
import yaml

from targets.aws import eks

ARN = "arn:aws:eks:us-west-2:123456789012:cluster/rtui-demo"


@pytest.fixture(autouse=True)
def fake_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-west-2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


def decode(token: str) -> str:
    assert token.startswith("k8s-aws-v1.")
    body = token.removeprefix("k8s-aws-v1.")
    assert "=" not in body
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


def test_token_is_a_presigned_get_caller_identity_with_the_cluster_signed_in() -> None:
    before = dt.datetime.now(dt.UTC)
    token, expires_at = eks.eks_token("rtui-demo", "us-west-2", boto3.Session())
    url = urlparse(decode(token))
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert (url.scheme, url.netloc, url.path) == ("https", "sts.us-west-2.amazonaws.com", "/")
    assert query["Action"] == "GetCallerIdentity" and query["Version"] == "2011-06-15"
    assert query["X-Amz-Expires"] == "60"
    assert query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    credential = query["X-Amz-Credential"]
    assert credential.startswith("testing/") and credential.endswith("/us-west-2/sts/aws4_request")
    assert "x-k8s-aws-id" in query["X-Amz-SignedHeaders"].split(";")
    assert "host" in query["X-Amz-SignedHeaders"].split(";")
    assert query["X-Amz-Security-Token"] == "testing"
    assert dt.timedelta(minutes=14) < expires_at - before <= dt.timedelta(minutes=15, seconds=5)


def test_the_signature_depends_on_the_cluster_name() -> None:
    one, _ = eks.eks_token("a", "us-west-2", boto3.Session())
    two, _ = eks.eks_token("b", "us-west-2", boto3.Session())
    sig = [parse_qs(urlparse(decode(t)).query)["X-Amz-Signature"][0] for t in (one, two)]
    assert sig[0] != sig[1]


def test_provider_caches_and_renews_a_minute_before_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = eks.eks_token

    def counting(cluster: str, region: str, session: boto3.Session) -> tuple[str, dt.datetime]:
        calls.append(cluster)
        return real(cluster, region, session)

    monkeypatch.setattr(eks, "eks_token", counting)
    provider = eks.EksTokenProvider("rtui-demo", "us-west-2", boto3.Session())
    first = provider()
    assert provider() == first and len(calls) == 1
    provider._expires_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=59)  # inside the margin
    provider()
    assert len(calls) == 2


def test_token_command_prints_an_exec_credential() -> None:
    out = json.loads(eks.token_command_output("rtui-demo", "us-west-2"))
    assert out["apiVersion"] == "client.authentication.k8s.io/v1beta1" and out["kind"] == "ExecCredential"
    assert out["status"]["token"].startswith("k8s-aws-v1.")
    expiry = dt.datetime.strptime(out["status"]["expirationTimestamp"], "%Y-%m-%dT%H:%M:%S%z")
    assert dt.timedelta(minutes=13) < expiry - dt.datetime.now(dt.UTC) < dt.timedelta(minutes=15)


EXISTING = {
    "apiVersion": "v1", "kind": "Config", "current-context": "work",
    "clusters": [{"name": "work", "cluster": {"server": "https://work.example"}}],
    "users": [{"name": "work", "user": {"token": "keep-me"}}],
    "contexts": [{"name": "work", "context": {"cluster": "work", "user": "work"}}],
}


def write_entry(path: Path, *, profile: str | None = None, rtui_bin: str | None = None,
                set_current: bool = False) -> str:
    return eks.write_kubeconfig_entry(path, cluster_name="rtui-demo", region="us-west-2",
                                      endpoint="https://ABC.gr7.us-west-2.eks.amazonaws.com", ca_data_b64="Q0E=",
                                      arn=ARN, profile=profile, rtui_bin=rtui_bin, set_current=set_current)


def test_merge_keeps_other_entries_and_the_current_context(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(EXISTING))
    path.chmod(0o644)
    assert write_entry(path) == ARN
    config = yaml.safe_load(path.read_text())
    assert config["current-context"] == "work"
    for section in ("clusters", "users", "contexts"):
        assert [e["name"] for e in config[section]] == ["work", ARN]
    assert config["users"][0]["user"] == {"token": "keep-me"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # the user's choice stays
    once = path.read_bytes()
    write_entry(path)
    assert path.read_bytes() == once  # idempotent
    write_entry(path, set_current=True)
    assert yaml.safe_load(path.read_text())["current-context"] == ARN
    assert [e["name"] for e in yaml.safe_load(path.read_text())["users"]] == ["work", ARN]


def test_new_file_is_0600_and_holds_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no aws CLI: the entry runs rtui itself
    path = tmp_path / "kube" / "config"
    write_entry(path, profile="dev", rtui_bin="/opt/rtui/bin/rtui")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "k8s-aws-v1" not in text and "token:" not in text
    config = yaml.safe_load(text)
    assert config["current-context"] == ARN
    plugin = config["users"][0]["user"]["exec"]
    assert plugin["apiVersion"] == "client.authentication.k8s.io/v1beta1"
    assert plugin["command"] == "/opt/rtui/bin/rtui"
    assert plugin["args"] == ["token", "--cluster-name", "rtui-demo", "--region", "us-west-2", "--profile", "dev"]
    assert config["clusters"][0]["cluster"] == {"server": "https://ABC.gr7.us-west-2.eks.amazonaws.com",
                                                "certificate-authority-data": "Q0E="}


def test_the_aws_cli_is_preferred_when_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_aws = tmp_path / "aws"
    fake_aws.write_text("#!/bin/sh\n")
    fake_aws.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    write_entry(tmp_path / "config")
    plugin = yaml.safe_load((tmp_path / "config").read_text())["users"][0]["user"]["exec"]
    assert plugin["command"] == "aws"
    assert plugin["args"] == ["--region", "us-west-2", "eks", "get-token", "--cluster-name", "rtui-demo",
                              "--output", "json"]


def test_a_symlinked_kubeconfig_stays_a_link_and_its_target_is_written(tmp_path: Path) -> None:
    # dotfiles managers link ~/.kube/config to a file kept elsewhere: writing must go through the link.
    real = tmp_path / "dotfiles" / "kubeconfig"
    real.parent.mkdir()
    real.write_text(yaml.safe_dump(EXISTING))
    real.chmod(0o640)
    link = tmp_path / "kube" / "config"
    link.parent.mkdir()
    link.symlink_to(real)
    assert write_entry(link) == ARN
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert [e["name"] for e in yaml.safe_load(real.read_text())["clusters"]] == ["work", ARN]
    assert stat.S_IMODE(real.stat().st_mode) == 0o640  # the target's mode stays
    assert not [p for p in real.parent.iterdir() if p.name.startswith(".")]  # no temp file left
    assert eks.remove_kubeconfig_entry(link, ARN)
    assert link.is_symlink() and [e["name"] for e in yaml.safe_load(real.read_text())["clusters"]] == ["work"]


def test_a_link_to_a_file_not_yet_there_makes_the_target_0600(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "kubeconfig"
    link = tmp_path / "config"
    link.symlink_to(real)
    write_entry(link)
    assert link.is_symlink() and real.is_file() and stat.S_IMODE(real.stat().st_mode) == 0o600
