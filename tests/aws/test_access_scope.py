"""Issue 23 item 7: the EKS double takes an access policy's scope as EKS does
(EKS API reference, ``AccessScope`` and AssociateAccessPolicy), so a narrowed admin access entry
can be tested against it."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.aws.conftest import World
from tests.aws.test_moto_provision import client, cluster, code, network

ADMIN = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSAdminPolicy"


def _entry(world: World) -> tuple[Any, str]:
    eks = client("eks")
    cluster(eks, network(client("ec2")))
    who = client("iam").create_role(RoleName="admin", Path="/rtui/", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    eks.create_access_entry(clusterName="c1", principalArn=who)
    return eks, who


@pytest.mark.parametrize("scope", [{"type": "namespace"}, {"type": "namespace", "namespaces": []},
                                   {"type": "everything"}])
def test_a_scope_eks_refuses_is_refused_and_nothing_is_associated(world: World, scope: dict[str, Any]) -> None:
    eks, who = _entry(world)
    with pytest.raises(ClientError) as err:
        eks.associate_access_policy(clusterName="c1", principalArn=who, policyArn=ADMIN, accessScope=scope)
    assert code(err) == "InvalidParameterException"
    assert eks.list_associated_access_policies(clusterName="c1", principalArn=who)["associatedAccessPolicies"] == []


def test_a_namespace_scope_is_kept(world: World) -> None:
    eks, who = _entry(world)
    eks.associate_access_policy(clusterName="c1", principalArn=who, policyArn=ADMIN,
                                accessScope={"type": "namespace", "namespaces": ["rtui", "ml"]})
    [policy] = eks.list_associated_access_policies(clusterName="c1", principalArn=who)["associatedAccessPolicies"]
    assert policy["accessScope"] == {"type": "namespace", "namespaces": ["rtui", "ml"]}


def test_update_access_entry_replaces_the_groups(world: World) -> None:
    eks, who = _entry(world)
    eks.update_access_entry(clusterName="c1", principalArn=who, kubernetesGroups=["a", "b"])
    def groups() -> Any:
        return eks.describe_access_entry(clusterName="c1", principalArn=who)["accessEntry"]["kubernetesGroups"]

    assert groups() == ["a", "b"]
    eks.update_access_entry(clusterName="c1", principalArn=who, kubernetesGroups=[])
    assert groups() == []


def test_the_access_scope_flag_is_validated_and_shown() -> None:
    from tests.conftest import run_rtui

    bad = run_rtui("config", "show", "--target", "aws", "--access-scope", "everything")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "expected one of cluster, namespace" in bad.stderr
    shown = run_rtui("config", "show", "--target", "aws", "--access-scope", "namespace")
    assert shown.returncode == 0, shown.stderr
    assert [line.split()[:2] for line in shown.stdout.splitlines() if line.startswith("access_scope")] == \
        [["access_scope", '"namespace"']]
