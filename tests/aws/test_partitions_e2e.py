"""Issue 20 item 10 end to end: `rtui plan` and `rtui up --until aws` in an aws-cn and an aws-us-gov
region against the double, and every ARN, service principal and endpoint AWS is told is the partition's.

moto's bundled EC2 offerings have no rows for these regions; the test offers the plan's two types in two
AZs of each (zone names and IDs as the EC2 User Guide, "Regions and Zones", and the AWS China and
GovCloud user guides list them: cn-northwest-1a/b = cnnw1-az1/2, us-gov-west-1a/b = usgw1-az1/2)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from targets.kube.manifests import EFA_RESOURCE
from tests.aws.conftest import World
from tests.conftest import run_rtui

PARTITIONS = [("cn-northwest-1", "aws-cn", "amazonaws.com.cn", {"cn-north-1", "cn-northwest-1"}),
              ("us-gov-west-1", "aws-us-gov", "amazonaws.com", {"us-gov-west-1", "us-gov-east-1"})]
# The roles' service principals IAM takes there (tests/aws/moto_provision.py SERVICE_PRINCIPALS, eksctl's
# partitions.go): EKS keeps amazonaws.com even in aws-cn (EKS Pod Identity's too), EC2 takes the partition's suffix.
PRINCIPALS = {"aws-cn": {"eks.amazonaws.com", "ec2.amazonaws.com.cn", "pods.eks.amazonaws.com"},
              "aws-us-gov": {"eks.amazonaws.com", "ec2.amazonaws.com", "pods.eks.amazonaws.com"}}
ARN = re.compile(r"arn:([a-z-]+):")
HOST = re.compile(r"\b[\w.-]+\.amazonaws\.com(?:\.cn)?\b")
EFA = re.compile(re.escape(EFA_RESOURCE).replace("/", "(?:/|%2F)"), re.IGNORECASE)
# S3's XML namespace, which botocore writes into S3 request bodies (CreateBucketConfiguration, Tagging...):
# a fixed URI in every partition's S3 API, not a host anyone connects to.
S3_XMLNS = re.compile(re.escape("http://s3.amazonaws.com/doc/2006-03-01/"))


def _offer(world: World, region: str) -> None:
    for zone in (f"{region}a", f"{region}b"):
        for instance_type in ("g6.12xlarge", "m7i.xlarge"):
            world.offer(region, zone, instance_type)


@pytest.mark.slow
@pytest.mark.parametrize(("region", "partition", "suffix", "signing"), PARTITIONS)
def test_plan_and_up_in_another_partition_say_only_its_arns_and_hosts(
        world: World, kube_file: Path, region: str, partition: str, suffix: str, signing: set[str]) -> None:
    _offer(world, region)
    planned = run_rtui("plan", "--target", "aws", "--region", region, "--json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout.strip().splitlines()[-1])
    # No Pricing API serves this partition from the aws one: the plan is the labelled estimate.
    assert plan["price_source"] == "estimate, us-east-1 prices"
    roles = {c["address"]: c["after"]["service"] for c in plan["changes"] if c["kind"] == "aws-iam-role"}
    assert set(roles.values()) == PRINCIPALS[partition], roles

    made = run_rtui("up", "--yes", "--target", "aws", "--region", region, "--until", "aws")
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr
    told = world.script.requests
    assert told, "no request reached the double"
    assert {r for _, r, _, _ in told} <= signing  # every request signed for the partition's regions
    arns = {m.group(1) for *_, text in told for m in ARN.finditer(text)}
    assert arns == {partition}, arns
    # The EFA device resource (vpc.amazonaws.com/efa) names no host: it is in cluster-autoscaler's ASG tags.
    hosts = {h for *_, text in told for h in HOST.findall(S3_XMLNS.sub("", EFA.sub("", text)))}
    # The only hosts AWS is told of are the roles' service principals, each as the partition writes it.
    assert hosts == PRINCIPALS[partition], hosts


def test_the_double_refuses_a_service_principal_iam_does_not_know_in_the_partition(world: World) -> None:
    import boto3
    from botocore.exceptions import ClientError

    iam = boto3.client("iam", region_name="cn-northwest-1")

    def trust(service: str) -> str:
        return json.dumps({"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]})

    with pytest.raises(ClientError) as refused:
        iam.create_role(RoleName="cn-eks", AssumeRolePolicyDocument=trust("eks.amazonaws.com.cn"))
    assert refused.value.response["Error"]["Code"] == "MalformedPolicyDocument"
    assert "eks.amazonaws.com.cn" in refused.value.response["Error"]["Message"]
    assert iam.create_role(RoleName="cn-eks", AssumeRolePolicyDocument=trust("eks.amazonaws.com"))["Role"]["Arn"] \
        .startswith("arn:aws-cn:iam::")
