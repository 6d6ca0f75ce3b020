"""Issue 20 item 10: ARNs, service principals and the STS endpoint follow the region's partition."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from urllib.parse import urlparse

import boto3
import pytest

from targets.aws.eks import TOKEN_PREFIX, eks_token

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("region", "host"), [("us-east-1", "sts.us-east-1.amazonaws.com"),
                                              ("cn-north-1", "sts.cn-north-1.amazonaws.com.cn"),
                                              ("us-gov-west-1", "sts.us-gov-west-1.amazonaws.com")])
def test_the_eks_token_is_signed_for_the_partitions_sts(region: str, host: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    session = boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name=region)
    token, _ = eks_token("c", region, session)
    url = base64.urlsafe_b64decode(token.removeprefix(TOKEN_PREFIX) + "==").decode()
    assert urlparse(url).hostname == host


@pytest.mark.parametrize(("region", "arn", "principal"), [
    ("us-east-1", "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy", "ec2.amazonaws.com"),
    ("cn-north-1", "arn:aws-cn:iam::aws:policy/AmazonEKS_CNI_Policy", "ec2.amazonaws.com.cn"),
    ("us-gov-west-1", "arn:aws-us-gov:iam::aws:policy/AmazonEKS_CNI_Policy", "ec2.amazonaws.com")])
def test_policy_arns_and_service_principals_come_from_the_partition(region: str, arn: str, principal: str) -> None:
    from targets.aws.infra.cluster import admin_policy
    from targets.aws.infra.common import CLUSTER_ROLE, NODE_ROLE
    from targets.aws.infra.iam import managed_policy_arn, service_principal

    assert managed_policy_arn("AmazonEKS_CNI_Policy", region) == arn
    assert service_principal(NODE_ROLE, region) == principal
    # EKS keeps the standard suffix in every partition: IAM refuses eks.amazonaws.com.cn (tests/aws/moto_provision.py).
    assert service_principal(CLUSTER_ROLE, region) == "eks." + principal.split(".", 1)[1].removesuffix(".cn")
    assert admin_policy(region).startswith(arn.split(":iam:")[0] + ":eks::aws:cluster-access-policy/")


def test_no_partition_or_dns_suffix_is_written_into_the_aws_layer() -> None:
    layer = sorted((ROOT / "targets" / "aws" / "infra").glob("*.py"))
    assert len(layer) > 10, "the aws layer's modules moved: point this test at them"
    sources = [*layer, ROOT / "targets/aws/eks.py"]
    written = re.compile(r"arn:aws:|\w\.amazonaws\.com")
    found = [f"{p.name}: {m.group(0)}" for p in sources for m in written.finditer(p.read_text())]
    assert found == []
