"""Issue 35 item 8: an exec plugin's credential without ``expirationTimestamp`` is run again on a 401.

client-go (``plugin/pkg/client/auth/exec/exec.go``): a credential whose ExecCredential status has no
expiry is cached with a zero expiry (``credsExpired`` is false for ever) and kept until the server answers
401: the round tripper then calls ``maybeRefreshCreds``, which runs the plugin again unless another request
already rotated the credential. The official Python client's loader (kubernetes ``config/kube_config.py``
``_load_from_exec_plugin`` / ``_set_config``) refreshes only on an expiry, so without one the first token is
used for the whole process: a long ``rtui up`` whose plugin hands out tokens that the server stops
accepting (an OIDC or a rotated service token) fails with "refused the credentials" while the plugin
would have given a good one. The emulator's ``token_check`` accepts only the newest token the plugin gave.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from backend.errors import UserError
from targets.kube.api import KubeApi
from tests.kube.conftest import KubeCluster

PLUGIN = """\
import fcntl, json, sys
with open(sys.argv[1], "a+") as issued:
    fcntl.flock(issued, fcntl.LOCK_EX)
    issued.seek(0)
    n = len(issued.read().split()) + 1
    issued.write(f"plugin-token-{n}\\n")
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {"token": f"plugin-token-{n}"}}))
"""


def exec_kubeconfig(cluster: KubeCluster, tmp_path: Path) -> tuple[Path, Path]:
    plugin, issued = tmp_path / "plugin.py", tmp_path / "issued"
    plugin.write_text(PLUGIN)
    path = cluster.write_kubeconfig(tmp_path / "exec-kubeconfig", user={"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
        "args": [str(plugin), str(issued)], "interactiveMode": "Never"}})
    return path, issued


def newest(issued: Path) -> str:
    return issued.read_text().split()[-1] if issued.exists() else ""


async def test_a_token_without_expiry_is_renewed_on_a_401_and_the_request_sent_again(
        kube_cluster: KubeCluster, tmp_path: Path) -> None:
    path, issued = exec_kubeconfig(kube_cluster, tmp_path)
    revoked: set[str] = set()
    kube_cluster.require_token(lambda token: token == newest(issued) and token not in revoked)
    api = KubeApi.from_kubeconfig(str(path))
    try:
        assert await api.get("v1", "Namespace", "default") is not None
        assert newest(issued) == "plugin-token-1"
        # The server stops taking the plugin's token (revoked, rotated): the plugin has a newer one.
        revoked.add("plugin-token-1")
        assert await api.get("v1", "Namespace", "default") is not None
        assert newest(issued) == "plugin-token-2"  # the plugin ran once more, not once per request
        assert await api.get("v1", "Namespace", "kube-system") is not None
        assert newest(issued) == "plugin-token-2"
    finally:
        api.close()
    statuses = [s.status for s in kube_cluster.requests("GET", "/api/v1/namespaces/")]
    assert statuses == [200, 401, 200, 200], statuses


async def test_a_second_401_after_the_plugin_ran_again_is_the_usual_one_line(
        kube_cluster: KubeCluster, tmp_path: Path) -> None:
    path, issued = exec_kubeconfig(kube_cluster, tmp_path)
    kube_cluster.require_token(lambda token: False)
    api = KubeApi.from_kubeconfig(str(path))
    try:
        with pytest.raises(UserError, match="refused the credentials") as err:
            await api.get("v1", "Namespace", "default")
    finally:
        api.close()
    assert "\n" not in str(err.value)
    assert issued.read_text().split() == ["plugin-token-1", "plugin-token-2"]  # once at load, once on the 401
    assert [s.status for s in kube_cluster.requests("GET", "/api/v1/namespaces/")] == [401, 401]
