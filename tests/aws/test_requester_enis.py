"""Issue 34, item 5: another service's interface in the run's subnet blocks `down`, and rtui says so.

A Lambda function someone gave the run's private subnet (tests/aws/moto_enis.py: a requester-managed
interface, which the VPC's owner can neither detach nor delete; EC2 User Guide, "Requester-managed
network interfaces") makes DeleteSubnet answer DependencyViolation until Lambda lets it go. rtui waited
900 s saying only "1 network interfaces still attached": the step's progress must name the interface,
whose it is and that AWS removes it, while it waits, and the failure after the deadline must too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backend import flows
from backend.resources import EventKind, StepEvent
from targets.aws.infra import network
from tests.aws import moto_enis
from tests.aws.conftest import World
from tests.aws.provision_world import REGION, RUN_TAG, ec2, session_for, tagged, up
from tests.eventually import eventually_async

pytestmark = pytest.mark.usefixtures("fast_backoff")

ACCOUNT = "123456789012"


@pytest.mark.slow
async def test_down_names_the_requester_managed_interface_that_blocks_the_subnet(
        world: World, kube_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = session_for()
    made = await up(session)
    assert made.ok, made.failures()
    subnet = ec2().describe_subnets(Filters=[{"Name": f"tag:{RUN_TAG}", "Values": [session.run_id]},
                                             {"Name": "map-public-ip-on-launch", "Values": ["false"]}])["Subnets"]
    subnet_id = subnet[0]["SubnetId"]
    eni = moto_enis.service_eni(ACCOUNT, REGION, subnet_id)

    # The deadline passes while Lambda holds it: the failure names it (a short deadline, not a timing check).
    monkeypatch.setattr(network, "DEPENDENCY_TIMEOUT_S", 3.0)
    first = [e async for e in flows.down(session)]
    fault = next(e for e in first if e.kind is EventKind.FAILED and subnet_id in e.step + e.message)
    for said in (eni, "Lambda", "requester-managed", "AWS removes it"):
        assert said in fault.message, fault.message
    assert fault.remedy is not None and "Lambda" in fault.remedy, fault.remedy

    # Another `down` says the same while it waits, and goes on once Lambda lets go.
    monkeypatch.setattr(network, "DEPENDENCY_TIMEOUT_S", 900.0)
    seen: list[StepEvent] = []

    async def run_down() -> None:
        async for event in flows.down(session):
            seen.append(event)

    task = asyncio.create_task(run_down())
    await eventually_async("the subnet step names the interface while it waits", lambda: any(
        e.kind is EventKind.PROGRESS and eni in e.message and "requester-managed" in e.message for e in seen),
        timeout=120)
    moto_enis.service_lets_go(ACCOUNT, REGION, eni)
    await asyncio.wait_for(task, 300)
    assert not [e for e in seen if e.kind is EventKind.FAILED], [e.message for e in seen]
    assert tagged(session.run_id) == {}
