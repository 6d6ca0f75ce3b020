"""``check_command``: exit codes, the --json contract, one-line errors, progress on stderr."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import pytest

from targets.aws.cloud import PreflightRequest, check_command, request_quota_increase
from tests.aws.conftest import G, World

ZONE_KEYS = {
    "zone",
    "zone_id",
    "gpu_offered",
    "system_offered",
    "efa",
    "efa_interfaces",
    "gdr",
    "eks_supported",
    "reservations",
    "feasible",
    "reasons",
}


class TtyStream(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(
    request: PreflightRequest, *, as_json: bool, stderr: io.StringIO | None = None
) -> tuple[int, str, str]:
    out, err = io.StringIO(), stderr if stderr is not None else io.StringIO()
    code = check_command(request, as_json=as_json, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_json_contract_and_exit_0(world: World) -> None:
    code, out, err = run(
        PreflightRequest(regions=["us-east-1", "us-west-1"]), as_json=True, stderr=TtyStream()
    )
    assert code == 0
    doc = json.loads(out)  # stdout is exactly one JSON object, progress went to stderr
    assert set(doc) >= {"regions", "recommendation"}
    assert doc["recommendation"]["region"] == "us-east-1" and doc["recommendation"]["zone"] == "us-east-1a"
    for region in doc["regions"]:
        assert set(region) >= {"region", "enabled", "price_per_hour", "quota", "zones", "feasible"}
        assert set(region["quota"]) >= {"code", "limit", "used", "needed", "headroom", "ok"}
        for zone in region["zones"]:
            assert set(zone) >= ZONE_KEYS
    assert err.count("\n") == 2 and "us-west-1: 0/2 AZ feasible" in err


def test_text_output_names_reasons_and_recommendation(world: World) -> None:
    world.quota("us-east-1", G, 48)
    code, out, err = run(PreflightRequest(regions=["us-east-1"]), as_json=False)
    assert code == 3
    assert "SHORT by 48" in out and "--quota-code L-DB2E81BA --desired-value 96" in out
    assert "No feasible AZ" in out
    assert err == ""  # not a TTY: no progress


def test_text_output_says_an_eks_refused_zone_holds_gpu_nodes_only(world: World) -> None:
    world.offer("us-east-1", "us-east-1e", "g6.12xlarge")
    code, out, _ = run(PreflightRequest(regions=["us-east-1"]), as_json=False)
    assert code == 0
    line = next(x for x in out.splitlines() if "us-east-1e" in x and "use1-az3" in x)
    assert "EKS rejects zone ID use1-az3 (us-east-1e) for its control plane: GPU nodes only" in line


def test_no_feasible_zone_exits_3_with_json(world: World) -> None:
    code, out, _ = run(PreflightRequest(regions=["us-west-1"]), as_json=True)
    assert code == 3
    assert json.loads(out)["recommendation"] is None


@pytest.mark.parametrize(
    ("request_kwargs", "needle"),
    [
        ({"regions": ["nowhere-1"]}, "unknown region nowhere-1"),
        ({"gpu_node_type": "g6.13xlarge"}, "does not exist"),
        ({"gpu_node_type": "g4dn.xlarge"}, "does not support EFA"),
    ],
)
def test_bad_input_exits_2_with_one_line(world: World, request_kwargs: dict[str, Any], needle: str) -> None:
    code, out, err = run(PreflightRequest(**request_kwargs), as_json=True)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_aws_error_exits_1_with_code_and_remedy(world: World) -> None:
    world.script.errors[("ec2", "*")] = "ExpiredToken"
    code, out, err = run(PreflightRequest(profile=None), as_json=True)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "ExpiredToken" in err and "aws sso login" in err


def test_unknown_profile_exits_2(world: World) -> None:
    code, _, err = run(PreflightRequest(profile="no-such-profile"), as_json=False)
    assert code == 2 and "no-such-profile" in err


def test_quota_increase_request_only_when_called(world: World) -> None:
    world.quota("us-east-1", G, 48)
    run(PreflightRequest(), as_json=True)
    assert world.script.quota_requests == []  # the check itself never asks
    result = request_quota_increase("us-east-1", G, 100)
    assert result.status == "PENDING" and result.desired_value == 100
    (sent,) = world.script.quota_requests
    assert (sent["Region"], sent["QuotaCode"], sent["DesiredValue"]) == ("us-east-1", G, 100)


def test_backend_aws_imports_no_ui() -> None:
    code = (
        "import sys, targets.aws.cloud; bad = [m for m in sys.modules if m.split('.')[0] in "
        "('textual', 'tui', 'screens')]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_check_honours_require_transport(world: World) -> None:
    from tests.conftest import run_rtui

    args = ["check", "--target", "aws", "--gpu-node-type", "g5.xlarge", "--json"]
    refused = run_rtui(*args)  # aws defaults to requiring EFA, which g5.xlarge lacks
    assert refused.returncode == 2 and "g5.xlarge does not support EFA" in refused.stderr
    allowed = run_rtui(*args, "--require-transport", "any")
    assert allowed.returncode in (0, 3), allowed.stderr
    assert json.loads(allowed.stdout)["gpu_node_type"] == "g5.xlarge"
