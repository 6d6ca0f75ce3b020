"""An API server that cannot be reached (issue 19, item 8): every command says so in one line.

The line names the server and the kubeconfig context, the exit code is 1 (an operation that failed,
not bad input), no traceback, and it comes within the configured deadline (``--kube-timeout-s``)
whether the server refuses connections or accepts them and never answers (a black hole).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.kube.kube_world import KubeWorld, gpu_cluster, world  # noqa: F401 - a fixture
from tests.kube.test_kube_failures_access import silent_server  # noqa: F401 - a fixture

DEADLINE_S = 1
DEFAULT_DEADLINE_S = 10  # RunConfig.kube_timeout_s


def one_line(proc: subprocess.Popen[str], out: str, err: str) -> str:
    assert proc.returncode == 1, (proc.args, proc.returncode, out[-2000:], err[-2000:])
    assert "Traceback" not in out + err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rtui: "), err
    return lines[0]


@pytest.mark.parametrize("how", ["never answers", "refuses"])
def test_an_unreachable_api_server_is_one_line_in_every_command(
        world: KubeWorld, silent_server: str, tmp_path: Path, how: str) -> None:  # noqa: F811
    gpu_cluster(world.cluster)
    world.rtui("up", "--yes", "--until", "kube.namespace", timeout=120)  # a run for status and down
    server = silent_server if how == "never answers" else "https://127.0.0.1:9"
    config = yaml.safe_load(world.cluster.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = server
    (tmp_path / "gone").write_text(yaml.safe_dump(config))
    env = {**world.env, "KUBECONFIG": str(tmp_path / "gone"), "RTUI_KUBE_TIMEOUT_S": str(DEADLINE_S)}
    # Side by side, so the test waits about one deadline: plan and up on state of their own,
    # status and down on the run's.
    commands = {"plan": {}, "up": {"RTUI_STATE_DIR": str(tmp_path / "state-up")},
                "status": {}, "logs": {}, "down": {}}
    runs = {}
    for name, extra in commands.items():
        args = (name, "--yes") if name in ("up", "down") else ("logs", "--source", "head") if name == "logs" \
            else (name,)
        runs[name] = subprocess.Popen(world.argv(*args), env={**env, **extra}, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=60)
        line = one_line(proc, out, err)
        assert server in line and "'kmock'" in line, (name, line)
        if how == "never answers":
            # The configured deadline, not the default one: read from the line, not from a stopwatch.
            assert f"within {DEADLINE_S}s" in line and f"within {DEFAULT_DEADLINE_S}s" not in line, (name, line)
