"""Issue 34 item 4: an S3 gateway endpoint on the run's private route table.

Without one, every byte the private subnets move to or from S3 (checkpoints, the model, the dataset)
goes through the NAT gateway at $0.045/GB; a gateway endpoint for ``com.amazonaws.<region>.s3`` costs
nothing (VPC User Guide, "Gateway endpoints for Amazon S3"). The double refuses a service the region
does not offer and a VPC deleted before its endpoints (tests/aws/moto_leftovers.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backend.resources import Action, EventKind
from tests.aws.conftest import World
from tests.aws.provision_world import RUN_TAG, down, ec2, given_vpc, session_for, tagged, up

pytestmark = pytest.mark.usefixtures("fast_backoff")

ENDPOINT = "aws.vpc-endpoint.s3"
SERVICE = "com.amazonaws.us-east-1.s3"


def live_endpoints(**filters: str) -> list[dict[str, Any]]:
    found = ec2().describe_vpc_endpoints(Filters=[{"Name": k, "Values": [v]} for k, v in filters.items()])
    return [e for e in found["VpcEndpoints"] if e["State"].lower() not in ("deleted", "deleting")]


@pytest.mark.slow
async def test_the_plan_shows_the_endpoint_free_and_up_routes_the_private_table_through_it(
        world: World, kube_file: Path) -> None:
    session = session_for()
    plan = await session.plan()
    change = next(c for c in plan.changes if c.address == ENDPOINT)
    assert change.action is Action.CREATE and change.cost_per_hour == 0.0
    assert "free" in change.cost_note and "NAT" in change.cost_note
    assert "aws.route-table.private" in change.depends_on
    made = await up(session)
    assert made.ok, made.failures()
    run = session.run_id
    [endpoint] = live_endpoints(**{f"tag:{RUN_TAG}": run})
    assert (endpoint["ServiceName"], endpoint["VpcEndpointType"]) == (SERVICE, "Gateway")
    private = ec2().describe_route_tables(Filters=[{"Name": f"tag:{RUN_TAG}", "Values": [run]},
                                                   {"Name": "tag:rtui:role", "Values": ["private"]}])["RouteTables"][0]
    assert endpoint["RouteTableIds"] == [private["RouteTableId"]]
    assert [r for r in private["Routes"] if r.get("GatewayId") == endpoint["VpcEndpointId"]
            and r.get("DestinationPrefixListId")]
    again = await session.plan()
    assert next(c for c in again.changes if c.address == ENDPOINT).action is Action.NOOP
    gone = await down(session)
    assert gone.ok, gone.failures()
    assert live_endpoints(**{f"tag:{RUN_TAG}": run}) == []
    assert tagged(run) == {}


@pytest.mark.slow
async def test_the_sweep_reports_an_endpoint_left_behind(world: World, kube_file: Path) -> None:
    session = session_for()
    assert (await up(session)).ok
    world.script.errors[("ec2", "DeleteVpcEndpoints")] = "UnauthorizedOperation"
    gone = await down(session)
    assert not gone.ok
    sweep = next(e for e in gone.events if e.step == "sweep" and e.kind is EventKind.FAILED)
    left = {item.kind: item for item in session.record.facts.sweep or []}
    assert "VPC endpoint" in left, sweep.message
    assert SERVICE in left["VPC endpoint"].state
    world.script.errors.clear()
    again = await down(session)
    assert again.ok, again.failures()
    assert tagged(session.run_id) == {} and live_endpoints(**{f"tag:{RUN_TAG}": session.run_id}) == []


async def test_a_given_vpc_without_an_s3_endpoint_gets_a_plan_note_not_an_endpoint(world: World,
                                                                                  kube_file: Path) -> None:
    vpc, private = given_vpc(("us-east-1a", "us-east-1b"))
    session = session_for(vpc_id=vpc, private_subnet_ids=",".join(private), availability_zone="us-east-1a")
    plan = await session.plan()
    assert ENDPOINT not in {c.address for c in plan.changes}
    [note] = [n for n in plan.notes if "S3" in n]
    assert SERVICE in note and "NAT" in note
    table = ec2().describe_route_tables(Filters=[{"Name": "association.subnet-id", "Values": [private[0]]}])
    ec2().create_vpc_endpoint(VpcId=vpc, ServiceName=SERVICE, VpcEndpointType="Gateway",
                              RouteTableIds=[table["RouteTables"][0]["RouteTableId"]])
    again = await session.plan()
    assert [n for n in again.notes if "S3" in n] == []


def test_the_double_refuses_a_service_the_region_does_not_offer(world: World) -> None:
    vpc = ec2().create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    with pytest.raises(Exception, match="InvalidServiceName"):
        ec2().create_vpc_endpoint(VpcId=vpc, ServiceName="com.amazonaws.us-west-2.s3", VpcEndpointType="Gateway")
    ec2().create_vpc_endpoint(VpcId=vpc, ServiceName=SERVICE, VpcEndpointType="Gateway")
    with pytest.raises(Exception, match="DependencyViolation"):
        ec2().delete_vpc(VpcId=vpc)
