"""The aws target with a kubeconfig it did not write (issue 19, item 7).

A kubeconfig outlives clusters: an entry named by the cluster's ARN may point at an endpoint of a
cluster deleted long ago, or at another cluster altogether. The Kubernetes layer takes the endpoint
and CA of the EKS cluster the aws layer finds (DescribeCluster), never the kubeconfig's, and with no
cluster it finds nothing on the Kubernetes side. ``rtui down`` takes out what rtui wrote, as
``eksctl delete cluster`` does, and leaves every other byte of the file as it was.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.aws.conftest import World
from tests.conftest import run_rtui
from tests.eventually import eventually
from tests.kube.conftest import KubeCluster

AWS = ["--target", "aws", "--region", "us-east-1"]
ARN = "arn:aws:eks:us-east-1:123456789012:cluster/rtui-ray"  # moto's account
# A user's kubeconfig as people keep them: comments, another cluster, quoting and order of their own.
USERS_OWN = """\
# my clusters -- do not lose this comment
apiVersion: v1
kind: Config
preferences: {}
current-context: team-a   # the one I use
clusters:
- cluster:
    server: "https://team-a.example.com:6443"
    insecure-skip-tls-verify: true
  name: team-a
contexts:
- context: {cluster: team-a, user: alice, namespace: ml}
  name: team-a
users:
- name: alice
  user:
    token: 'not-a-real-token'
"""
STALE = """\
- cluster:
    server: {server}
  name: {arn}
"""


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture
def elsewhere() -> Iterator[KubeCluster]:
    """Another cluster, which the stale entry names: it takes any EKS token, so only trust would reach it."""
    cluster = KubeCluster()
    cluster.start()
    cluster.require_token(lambda token: token.startswith("k8s-aws-v1."))
    try:
        yield cluster
    finally:
        cluster.stop()


def with_stale_entry(text: str, server: str) -> str:
    return text.replace("contexts:\n", STALE.format(server=server, arn=ARN) + "contexts:\n", 1)


@pytest.mark.slow
@pytest.mark.parametrize("stale_server", ["elsewhere", "dead"])
def test_a_stale_kubeconfig_entry_for_the_arn_is_never_trusted(
        world: World, kube_file: Path, elsewhere: KubeCluster, stale_server: str) -> None:
    server = elsewhere.url if stale_server == "elsewhere" else "https://127.0.0.1:9"
    kube_file.parent.mkdir(parents=True, exist_ok=True)
    kube_file.write_text(with_stale_entry(USERS_OWN, server))
    proc = run_rtui("plan", *AWS)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for address in ("aws.eks-cluster", "kube.namespace", "kube.raycluster"):
        assert f"+ {address}" in proc.stdout, address
    assert elsewhere.requests() == []


def test_down_takes_out_only_what_up_wrote(world: World, kube_file: Path) -> None:
    kube_file.parent.mkdir(parents=True, exist_ok=True)
    kube_file.write_text(USERS_OWN)
    before = kube_file.read_bytes()
    up = run_rtui("up", "--yes", *AWS, "--until", "aws")
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    written = kube_file.read_text()
    assert ARN in written and "# my clusters -- do not lose this comment" in written
    down = run_rtui("down", "--yes", *AWS)
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
    assert kube_file.read_bytes() == before


def test_down_takes_out_our_entry_when_the_cluster_went_first(world: World, kube_file: Path) -> None:
    import boto3

    kube_file.parent.mkdir(parents=True, exist_ok=True)
    kube_file.write_text(USERS_OWN)
    before = kube_file.read_bytes()
    up = run_rtui("up", "--yes", *AWS, "--until", "aws.kubeconfig")
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    assert ARN in kube_file.read_text()
    eks = boto3.client("eks", region_name="us-east-1")
    eks.delete_cluster(name="rtui-ray")  # by hand, in the console, say
    eventually("the cluster deleted by hand to be gone", lambda: "rtui-ray" not in eks.list_clusters()["clusters"],
               timeout=10)
    down = run_rtui("down", "--yes", *AWS)
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
    assert kube_file.read_bytes() == before
