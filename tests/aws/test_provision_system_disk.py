"""Issue 20 item 12: the system node's disk fits the image, sized from the image's registry.

The registry is tests/kube/fake_registry.py on loopback, reached through the config's image only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.resources import Action
from tests.aws.conftest import World
from tests.aws.provision_world import down, ec2, eks, session_for, tagged, up
from tests.kube.fake_registry import FakeRegistry

pytestmark = pytest.mark.usefixtures("fast_backoff")


def _system_disk() -> int:
    """The system nodes' root disk: their launch template's (which sets their metadata options too)."""
    group = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-system")["nodegroup"]
    assert group.get("diskSize") is None  # EKS refuses diskSize beside a launch template
    versions = ec2().describe_launch_template_versions(LaunchTemplateId=group["launchTemplate"]["id"],
                                                       Versions=[group["launchTemplate"]["version"]])
    return int(versions["LaunchTemplateVersions"][0]["LaunchTemplateData"]["BlockDeviceMappings"][0]["Ebs"][
        "VolumeSize"])


@pytest.mark.slow
async def test_the_system_disk_holds_the_image_as_its_registry_sizes_it(world: World, kube_file: Path) -> None:
    # 14 GB of compressed layers: ~42 GB unpacked beside the 14 GB of blobs, + the node's 20 GB, + 25%.
    with FakeRegistry(layers={"rtui/ray:test": [6_000_000_000, 5_000_000_000, 3_000_000_000]}) as registry:
        session = session_for(image=registry.image())
        made = await up(session)
        assert made.ok, made.failures()
        assert _system_disk() == 100
    # The registry is gone now: a second plan keeps the disk it sized, it replaces nothing.
    again = await session.plan()
    assert [(c.address, c.reason) for c in again.changes
            if c.layer == "aws" and c.action is not Action.NOOP] == []
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


@pytest.mark.slow
async def test_a_small_image_keeps_the_eks_default_disk(world: World, kube_file: Path) -> None:
    with FakeRegistry(layers={"rtui/ray:test": [2_000_000_000]}) as registry:
        session = session_for(image=registry.image())
        assert (await up(session)).ok
        assert _system_disk() == 50
        assert (await down(session)).ok
