"""The real kubectl against the emulated cluster: the kubeconfigs rtui writes work outside rtui too."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from targets.aws import eks
from targets.kube.api import KubeApi
from tests.kube.conftest import KubeCluster

REPO = Path(__file__).resolve().parents[2]
ARN = "arn:aws:eks:us-west-2:123456789012:cluster/rtui-demo"
FAKE_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        # A fresh machine has no package lists yet: read them once, then install.
        for step in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "kubectl"]):
            try:
                subprocess.run(step, capture_output=True, timeout=180, env={**os.environ,
                                                                            "DEBIAN_FRONTEND": "noninteractive"})
            except subprocess.TimeoutExpired:
                break
        found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed (Debian package `kubectl`) and could not be installed here")
    return found


def run_kubectl(config: Path, *args: str, env: dict[str, str] | None = None,
                binary: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary or kubectl(), "--kubeconfig", str(config), "--request-timeout=10s", *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def is_eks_token_for(cluster: str, token: str) -> bool:
    """What EKS checks first: a presigned STS GetCallerIdentity that signed ``x-k8s-aws-id``."""
    if not token.startswith(eks.TOKEN_PREFIX):
        return False
    body = token.removeprefix(eks.TOKEN_PREFIX)
    url = urlparse(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode())
    query = parse_qs(url.query)
    return (url.netloc.startswith("sts.") and query.get("Action") == ["GetCallerIdentity"]
            and "x-k8s-aws-id" in query.get("X-Amz-SignedHeaders", [""])[0].split(";"))


def test_kubectl_gets_the_nodes_with_a_token_kubeconfig(kube_cluster: KubeCluster) -> None:
    kube_cluster.add_node("gpu-0")
    kube_cluster.add_node("gpu-1")
    kube_cluster.add_node("system-0", gpus=0, efa=0)
    out = run_kubectl(kube_cluster.kubeconfig, "get", "nodes", "-o", "name")
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split()) == ["node/gpu-0", "node/gpu-1", "node/system-0"]
    gpus = run_kubectl(kube_cluster.kubeconfig, "get", "nodes", "-l", "nvidia.com/gpu.present=true", "-o", "name")
    assert sorted(gpus.stdout.split()) == ["node/gpu-0", "node/gpu-1"], gpus.stderr


def test_kubectl_is_refused_with_a_wrong_token(kube_cluster: KubeCluster) -> None:
    kube_cluster.require_token(lambda token: token == "something-else")
    out = run_kubectl(kube_cluster.kubeconfig, "get", "nodes", "-o", "name")
    assert out.returncode != 0 and "You must be logged in" in out.stderr


async def test_the_entry_rtui_writes_works_for_kubectl_and_for_rtui(kube_cluster: KubeCluster, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``write_kubeconfig_entry`` with its ``rtui token`` exec plugin, end to end, with EKS-shaped tokens."""
    binary = kubectl()
    kube_cluster.add_node("gpu-0")
    kube_cluster.require_token(lambda token: is_eks_token_for("rtui-demo", token))
    # Stands in for the `rtui` binary: the same function `rtui token` prints, and a record of its argv.
    argv_log = tmp_path / "argv"
    fake_rtui = tmp_path / "bin" / "rtui"
    fake_rtui.parent.mkdir()
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r});"
            f"open({str(argv_log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n');"
            "from targets.aws.eks import token_command_output as t;"
            "a = sys.argv[1:]; print(t(a[a.index('--cluster-name') + 1], a[a.index('--region') + 1]))")
    fake_rtui.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"{code}\" \"$@\"\n")
    fake_rtui.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake_rtui.parent))  # no `aws` here: the entry must use rtui
    for key, value in FAKE_AWS.items():
        monkeypatch.setenv(key, value)
    config = tmp_path / "home-kubeconfig"
    config.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "",
                                      "clusters": [], "users": [], "contexts": []}))
    ca_data = base64.b64encode(kube_cluster.ca_pem).decode()
    context = eks.write_kubeconfig_entry(config, cluster_name="rtui-demo", region="us-west-2",
                                         endpoint=kube_cluster.url, ca_data_b64=ca_data, arn=ARN,
                                         rtui_bin=str(fake_rtui))
    assert "k8s-aws-v1" not in config.read_text()

    out = run_kubectl(config, "--context", context, "get", "nodes", "-o", "name", binary=binary)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["node/gpu-0"]
    assert argv_log.read_text().splitlines()[0] == "token --cluster-name rtui-demo --region us-west-2"

    api = KubeApi.from_kubeconfig(str(config), context)
    assert api.headers()["Authorization"].startswith("Bearer k8s-aws-v1.")
    assert api.ssl_context() is not None
    assert (await api.list("v1", "Node"))[0]["metadata"]["name"] == "gpu-0"


async def test_an_exec_plugin_kubeconfig_works_for_the_client_and_kubectl(kube_cluster: KubeCluster,
                                                                          tmp_path: Path) -> None:
    kube_cluster.add_node("gpu-0")
    credential = {"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {"token": "exec-token", "expirationTimestamp": "2999-01-01T00:00:00Z"}}
    kube_cluster.require_token(lambda token: token == "exec-token")
    config = kube_cluster.write_kubeconfig(tmp_path / "exec", user={"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
        "args": ["-c", f"print({json.dumps(json.dumps(credential))})"], "interactiveMode": "Never"}})

    api = KubeApi.from_kubeconfig(str(config))
    nodes = await api.list("v1", "Node")
    assert [n["metadata"]["name"] for n in nodes] == ["gpu-0"]
    out = run_kubectl(config, "get", "nodes", "-o", "name")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["node/gpu-0"]
