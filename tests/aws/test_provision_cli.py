"""The aws target through the real `rtui` binary: the plan as a user reads it, bad input as one line,
the status cost meter, and the kubeconfig entry read by the real kubectl."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import boto3
import pytest

from tests.aws.conftest import World
from tests.conftest import RTUI, run_rtui
from tests.kube.test_kubectl import kubectl

AWS = ["--target", "aws", "--region", "us-east-1"]


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_plan_shows_every_change_its_cost_and_the_quota_it_uses(world: World, kube_file: Path) -> None:
    proc = run_rtui("plan", *AWS)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for address in ("aws.vpc", "aws.nat-gateway", "aws.eks-cluster", "aws.nodegroup.gpu", "aws.launch-template.gpu",
                    "kube.raycluster", "ray.job.train"):
        assert f"+ {address}" in text, address
    assert "$9.2470/h" in text  # 2 × g6.12xlarge and their 200 GB gp3 root volumes
    assert "uses 96 vCPUs of quota L-DB2E81BA (headroom 192)" in text
    # The system disk is 100 GB here (the registry double's default image is 14 GB compressed).
    assert ("Cost: $9.61/hour, + $0.045/GB NAT data processing, + $0.50/GB (+ $0.03/GB-month) CloudWatch Logs: "
            "control-plane audit, authenticator logs (estimate, us-east-1 prices).") in text


def test_a_model_the_gpus_cannot_hold_is_refused_by_the_plan_with_sizes_that_would(world: World) -> None:
    # Issue 36: the job would stop at its own memory check, after the cluster was made and billed.
    proc = run_rtui("plan", *AWS, "--model-id", "Qwen/Qwen2.5-7B")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    line = one_line(proc)
    assert "Qwen/Qwen2.5-7B does not fit an L4" in line, line
    assert "--seq-len" in line and "--gpu-node-count" in line, line


@pytest.mark.slow
def test_up_status_down_through_the_binary(world: World, kube_file: Path) -> None:
    # `rtui` is not on this PATH: the next steps `up` prints must still work pasted here (issue 21, item 6).
    no_rtui = {"PATH": "/usr/bin:/bin"}
    up = run_rtui("up", "--yes", *AWS, "--until", "aws", env=no_rtui)
    assert up.returncode == 0, up.stdout + up.stderr
    hint = up.stdout.strip().splitlines()[-1]
    assert f"Logs: {RTUI} logs " in hint and f"tear down: {RTUI} down " in hint, hint
    pasted_down = hint.split("tear down: ", 1)[1].strip()
    status = json.loads(run_rtui("status", "--json").stdout)
    assert status["cost"]["per_hour"] == pytest.approx(9.6096)  # the system disk is 100 GB (a 14 GB image)
    assert status["cost"]["accrued"] >= 0 and "aws.nodegroup.gpu" in status["cost"]["resources"]
    assert "cost      $9.61/hour now" in run_rtui("status").stdout

    arn = boto3.client("eks", region_name="us-east-1").describe_cluster(name="rtui-ray")["cluster"]["arn"]
    view = subprocess.run([kubectl(), "config", "view", "--minify", "--context", arn, "-o", "json"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "KUBECONFIG": str(kube_file)})
    assert view.returncode == 0, view.stderr
    entry = json.loads(view.stdout)
    assert entry["clusters"][0]["cluster"]["server"] == world.script.cluster_endpoint
    user = entry["users"][0]["user"]["exec"]
    assert "rtui-ray" in user["args"] and "token" not in json.dumps(entry["users"][0]["user"]).replace(
        "get-token", "").replace('"token"', "")

    down = subprocess.run(pasted_down, shell=True, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **no_rtui}, stdin=subprocess.DEVNULL)
    assert down.returncode == 0, pasted_down + "\n" + down.stdout + down.stderr
    assert "Orphan sweep" in down.stdout or "nothing left" in down.stdout


NO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": ""}


@pytest.mark.parametrize("command", [["plan"], ["check"], ["up", "--yes"]])
def test_no_credentials_says_none_were_found_where_it_looked_and_how_to_provide_them(
        world: World, kube_file: Path, command: list[str]) -> None:
    """With no credentials anywhere botocore raises NoCredentialsError before any request: nothing
    was rejected. The user learns that none were found, where botocore looked (its default chain,
    botocore/credentials.py create_credential_resolver: environment, shared credentials file,
    config file, SSO, container and instance metadata) and how to provide some; exit 2 (issue 21, item 5)."""
    proc = run_rtui(*command, *AWS, env=NO_CREDENTIALS)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    line = one_line(proc)
    assert "rejected" not in line, line
    assert "no AWS credentials found" in line, line
    assert "AWS_ACCESS_KEY_ID" in line and "/nonexistent/rtui-test-aws-credentials" in line, line
    assert "/nonexistent/rtui-test-aws-config" in line and "instance metadata" in line, line
    assert "aws configure" in line and "--profile" in line, line


def test_a_short_quota_names_the_request_command(world: World, kube_file: Path) -> None:
    world.quota("us-east-1", "L-DB2E81BA", 48)
    proc = run_rtui("up", "--yes", *AWS, "--until", "aws")
    assert proc.returncode == 2
    line = one_line(proc)
    assert "quota" in line.lower() and "--request-quota-increase" in line


def test_a_region_without_the_gpu_type_points_at_the_all_region_check(world: World, kube_file: Path) -> None:
    proc = run_rtui("plan", *AWS, "--gpu-node-type", "p5e.48xlarge")  # not offered in us-east-1 (moto data)
    assert proc.returncode == 2
    assert "--all-regions" in one_line(proc)


def test_a_given_vpc_without_a_private_subnet_in_the_gpu_az_is_refused(world: World, kube_file: Path) -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{i}.0/24", AvailabilityZone=az)["Subnet"]["SubnetId"]
               for i, az in enumerate(("us-east-1c", "us-east-1d"))]
    proc = run_rtui("up", "--yes", *AWS, "--until", "aws", "--availability-zone", "us-east-1a", "--vpc-id", vpc,
                    "--private-subnet-ids", ",".join(subnets))
    assert proc.returncode == 2
    line = one_line(proc)
    assert "us-east-1a" in line and "private subnet" in line


@pytest.mark.slow
def test_down_finds_a_run_whose_record_is_lost_by_its_tags(world: World, kube_file: Path, tmp_path: Path) -> None:
    up = run_rtui("up", "--yes", *AWS, "--until", "aws")
    assert up.returncode == 0, up.stderr
    elsewhere = {"RTUI_STATE_DIR": str(tmp_path / "another-machine")}
    down = run_rtui("down", "--yes", *AWS, env=elsewhere)
    assert down.returncode == 0, down.stdout + down.stderr
    vpcs = boto3.client("ec2", region_name="us-east-1").describe_vpcs(
        Filters=[{"Name": "tag:rtui:cluster", "Values": ["rtui-ray"]}])["Vpcs"]
    assert vpcs == []
