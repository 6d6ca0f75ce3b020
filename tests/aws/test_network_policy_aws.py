"""Issue 23 item 1 on the aws target: EKS's VPC CNI enforces the NetworkPolicy the kube layer
creates only when the vpc-cni add-on is installed with ``enableNetworkPolicy`` on (EKS User Guide,
"Restrict Pod network traffic with Kubernetes network policies"). Through `plan` and `up` on the AWS
double, whose add-ons keep their ``configurationValues`` and refuse what EKS refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from backend.resources import Action
from targets.aws.infra.common import addon_address
from tests.aws.conftest import World
from tests.aws.provision_world import down, eks, session_for, tagged, up
from tests.aws.test_moto_provision import client, cluster, code, network

pytestmark = pytest.mark.usefixtures("fast_backoff")
CLUSTER = "rtui-ray"


@pytest.mark.parametrize("values", ["{enableNetworkPolicy: true", '{"enableNetworkPolicy": true}',
                                    '{"enableNetworkPolicy": "yes"}', '{"noSuchSetting": "true"}', "[1, 2]"])
def test_the_double_refuses_configuration_values_eks_refuses(world: World, values: str) -> None:
    api = client("eks")
    cluster(api, network(client("ec2")))
    with pytest.raises(ClientError) as err:
        api.create_addon(clusterName="c1", addonName="vpc-cni", configurationValues=values)
    assert code(err) == "InvalidParameterException"
    assert api.list_addons(clusterName="c1")["addons"] == []
    api.create_addon(clusterName="c1", addonName="vpc-cni", configurationValues='{"enableNetworkPolicy": "true"}')
    with pytest.raises(ClientError) as err:
        api.update_addon(clusterName="c1", addonName="vpc-cni", configurationValues=values)
    assert code(err) == "InvalidParameterException"
    addon = api.describe_addon(clusterName="c1", addonName="vpc-cni")["addon"]
    assert json.loads(addon["configurationValues"]) == {"enableNetworkPolicy": "true"}


@pytest.mark.slow
async def test_the_vpc_cni_enforces_the_network_policy_on_aws(world: World, kube_file: Path) -> None:
    session = session_for()
    plan = await session.plan()
    changes = {c.address: c for c in plan.changes}
    assert (changes[addon_address("vpc-cni")].after or {})["configuration"] == {"enableNetworkPolicy": "true"}
    enforced = (changes["kube.networkpolicy.ray"].after or {})["enforced"]
    assert "enforced by the VPC CNI's network policy agent" in enforced, enforced

    made = await up(session, until=addon_address("vpc-cni"))
    assert made.ok, made.failures()
    addon = eks().describe_addon(clusterName=CLUSTER, addonName="vpc-cni")["addon"]
    assert json.loads(addon["configurationValues"]) == {"enableNetworkPolicy": "true"}

    # An add-on an earlier rtui made without the setting is updated in place, not left unenforced.
    eks().update_addon(clusterName=CLUSTER, addonName="vpc-cni", configurationValues="{}")
    again = {c.address: c for c in (await session.plan()).changes}
    assert again[addon_address("vpc-cni")].action is Action.UPDATE, again[addon_address("vpc-cni")]
    made = await up(session, until=addon_address("vpc-cni"))
    assert made.ok, made.failures()
    addon = eks().describe_addon(clusterName=CLUSTER, addonName="vpc-cni")["addon"]
    assert json.loads(addon["configurationValues"]) == {"enableNetworkPolicy": "true"}
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
