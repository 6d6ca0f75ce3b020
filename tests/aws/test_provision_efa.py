"""One EFA interface per network card, as DescribeInstanceTypes says: in the plan, the launch
template, the nodes AWS launches and the RayCluster's request (issue 20, item 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from targets.kube import manifests
from targets.kube.config import KubeConfig
from tests.aws.conftest import P, World
from tests.aws.provision_world import RUN_TAG, down, ec2, session_for, tagged, up

pytestmark = pytest.mark.usefixtures("fast_backoff")


@pytest.mark.slow
async def test_the_plan_gives_each_network_card_its_efa_and_the_workers_ask_for_them_all(
        world: World, kube_file: Path) -> None:
    world.script.default_quotas[P] = 1000
    for instance_type, count in (("g6.12xlarge", 1), ("p4d.24xlarge", 4), ("p5.48xlarge", 32)):
        plan = await session_for(gpu_node_type=instance_type).plan()
        template = plan.change("aws.launch-template.gpu")
        assert template is not None and (template.after or {})["efa_interfaces"] == count, instance_type
        ray = plan.change("kube.raycluster")
        assert ray is not None
        wanted = int((ray.after or {}).get("efa_interfaces") or 1)
        assert wanted == count, instance_type
        config = session_for(gpu_node_type=instance_type).config
        worker = manifests.raycluster(KubeConfig.of(config), "r", efa_interfaces=wanted)["spec"]["workerGroupSpecs"][0]
        limits = worker["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits[manifests.EFA_RESOURCE] == str(count)


@pytest.mark.slow
async def test_p4d_nodes_launch_with_an_efa_on_each_of_their_four_cards(world: World, kube_file: Path) -> None:
    world.script.default_quotas[P] = 1000
    session = session_for(gpu_node_type="p4d.24xlarge")
    made = await up(session)
    assert made.ok, made.failures()
    client = ec2()
    run = [{"Name": f"tag:{RUN_TAG}", "Values": [session.run_id]}]
    template = client.describe_launch_templates(Filters=run, LaunchTemplateNames=["rtui-rtui-ray-gpu"])[
        "LaunchTemplates"][0]
    data = client.describe_launch_template_versions(LaunchTemplateId=template["LaunchTemplateId"])[
        "LaunchTemplateVersions"][0]["LaunchTemplateData"]
    nics = data["NetworkInterfaces"]
    assert [(n["NetworkCardIndex"], n["DeviceIndex"], n["InterfaceType"]) for n in nics] == [
        (0, 0, "efa"), (1, 1, "efa"), (2, 1, "efa"), (3, 1, "efa")]
    efa = [e for e in client.describe_network_interfaces(Filters=run)["NetworkInterfaces"]
           if e["InterfaceType"] == "efa"]
    per_node: dict[str, int] = {}
    for eni in efa:
        per_node[eni["Attachment"]["InstanceId"]] = per_node.get(eni["Attachment"]["InstanceId"], 0) + 1
    assert sorted(per_node.values()) == [4, 4]
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
