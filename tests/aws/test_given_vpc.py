"""Issue 34 item 5 (first half): ``--vpc-id`` checks what EKS needs of a VPC rtui did not make.

- **DNS.** EKS User Guide, "View Amazon EKS networking requirements for VPC and subnets": the VPC needs
  DNS hostnames and DNS resolution, or its nodes cannot register with the cluster. CreateVpc leaves DNS
  hostnames off (VPC User Guide, "DNS attributes for your VPC"; moto does the same). rtui reads both
  attributes and refuses in one line with the command that turns one on; it never changes the VPC.
- **A way out.** Nodes in a private subnet reach EKS, ECR, STS, S3 and the public registries through
  whatever the subnet's default route leads to: a NAT gateway, a transit gateway, a NAT instance (a route
  to an instance or its network interface), a Gateway Load Balancer or firewall endpoint, a peering.
  A default route to an internet gateway makes the subnet public; no default route (or one whose target
  is gone: ``blackhole``) leaves the nodes no way to the registries. The routes are EC2's as
  tests/aws/moto_routes.py makes moto report them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backend.errors import UserError
from tests.aws.conftest import World
from tests.aws.provision_world import ec2, given_vpc, session_for
from tests.aws.test_provision_cli import AWS, one_line
from tests.conftest import run_rtui

pytestmark = pytest.mark.usefixtures("fast_backoff")

AZS = ("us-east-1a", "us-east-1b")


def _vpc(*, dns_hostnames: bool = True) -> tuple[str, list[str]]:
    """A VPC with a public subnet (us-east-1a) and private subnets in ``AZS``, no route out yet."""
    client = ec2()
    vpc = client.create_vpc(CidrBlock="10.8.0.0/16")["Vpc"]["VpcId"]
    if dns_hostnames:
        client.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
    private = [client.create_subnet(VpcId=vpc, CidrBlock=f"10.8.{i}.0/24", AvailabilityZone=az)["Subnet"]["SubnetId"]
               for i, az in enumerate(AZS)]
    return vpc, private


def _route_out(vpc: str, subnet: str, **target: str) -> None:
    client = ec2()
    table = client.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    client.create_route(RouteTableId=table, DestinationCidrBlock="0.0.0.0/0", **target)
    client.associate_route_table(RouteTableId=table, SubnetId=subnet)


def _failed(checks: list[Any]) -> list[str]:
    return [f"{c.title}: {c.detail}" for c in checks if c.status.value == "fail"]


@pytest.mark.slow
async def test_private_subnets_behind_a_transit_gateway_plan_and_the_plan_says_so(world: World,
                                                                                  kube_file: Path) -> None:
    vpc, private = _vpc()
    client = ec2()
    tgw = client.create_transit_gateway(Description="the company's egress")["TransitGateway"]["TransitGatewayId"]
    client.create_transit_gateway_vpc_attachment(TransitGatewayId=tgw, VpcId=vpc, SubnetIds=private)
    for subnet in private:
        _route_out(vpc, subnet, TransitGatewayId=tgw)
    session = session_for(vpc_id=vpc, private_subnet_ids=",".join(private), availability_zone="us-east-1a")
    assert _failed(await session.preflight()) == []
    plan = await session.plan()
    [note] = [n for n in plan.notes if tgw in n]
    assert "transit gateway" in note and all(s in note for s in private)
    assert client.describe_vpc_attribute(VpcId=vpc, Attribute="enableDnsHostnames")["EnableDnsHostnames"]["Value"]


@pytest.mark.slow
async def test_private_subnets_behind_a_nat_instance_plan(world: World, kube_file: Path) -> None:
    vpc, private = _vpc()
    client = ec2()
    public = client.create_subnet(VpcId=vpc, CidrBlock="10.8.100.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    image = client.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    nat = client.run_instances(ImageId=image, MinCount=1, MaxCount=1, SubnetId=public["SubnetId"])["Instances"][0]
    client.modify_instance_attribute(InstanceId=nat["InstanceId"], SourceDestCheck={"Value": False})
    eni = nat["NetworkInterfaces"][0]["NetworkInterfaceId"]
    _route_out(vpc, private[0], InstanceId=nat["InstanceId"])  # as the VPC guide's NAT instance page does
    _route_out(vpc, private[1], NetworkInterfaceId=eni)  # the same instance named by its interface
    session = session_for(vpc_id=vpc, private_subnet_ids=",".join(private), availability_zone="us-east-1a")
    assert _failed(await session.preflight()) == []
    plan = await session.plan()
    [note] = [n for n in plan.notes if nat["InstanceId"] in n]
    assert eni in note and f"{private[0]} (us-east-1a)" in note


@pytest.mark.slow
async def test_a_public_subnet_is_refused_as_private_in_one_line(world: World, kube_file: Path) -> None:
    vpc, private = _vpc()
    client = ec2()
    igw = client.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    client.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
    _route_out(vpc, private[0], GatewayId=igw)
    _route_out(vpc, private[1], GatewayId=igw)
    with pytest.raises(UserError) as refused:
        await session_for(vpc_id=vpc, private_subnet_ids=",".join(private), availability_zone="us-east-1a").plan()
    assert "public" in refused.value.message and igw in refused.value.message
    assert "\n" not in str(refused.value) and "--private-subnet-ids" in (refused.value.remedy or "")


async def test_a_subnet_with_no_way_out_is_refused(world: World, kube_file: Path) -> None:
    vpc, private = _vpc()
    with pytest.raises(UserError) as refused:
        await session_for(vpc_id=vpc, private_subnet_ids=",".join(private), availability_zone="us-east-1a").plan()
    assert "no default route" in refused.value.message and "\n" not in str(refused.value)


async def test_a_default_route_whose_nat_gateway_is_gone_is_refused(world: World, kube_file: Path) -> None:
    vpc, private = given_vpc(AZS)
    [nat] = ec2().describe_nat_gateways(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["NatGateways"]
    ec2().delete_nat_gateway(NatGatewayId=nat["NatGatewayId"])
    with pytest.raises(UserError) as refused:
        await session_for(vpc_id=vpc, private_subnet_ids=",".join(private), availability_zone="us-east-1a").plan()
    assert "blackhole" in refused.value.message and nat["NatGatewayId"] in refused.value.message


@pytest.mark.slow
def test_a_vpc_with_dns_hostnames_off_is_refused_in_one_line_and_left_as_it_is(world: World,
                                                                               kube_file: Path) -> None:
    vpc, private = _vpc(dns_hostnames=False)
    client = ec2()
    eip = client.allocate_address(Domain="vpc")["AllocationId"]
    public = client.create_subnet(VpcId=vpc, CidrBlock="10.8.100.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    nat = client.create_nat_gateway(SubnetId=public["SubnetId"], AllocationId=eip)["NatGateway"]["NatGatewayId"]
    for subnet in private:
        _route_out(vpc, subnet, NatGatewayId=nat)
    proc = run_rtui("up", "--yes", *AWS, "--until", "aws", "--availability-zone", "us-east-1a", "--vpc-id", vpc,
                    "--private-subnet-ids", ",".join(private))
    assert proc.returncode == 2
    line = one_line(proc)
    assert "DNS hostnames" in line and f"aws ec2 modify-vpc-attribute --vpc-id {vpc} --enable-dns-hostnames" in line
    assert not client.describe_vpc_attribute(VpcId=vpc, Attribute="enableDnsHostnames")["EnableDnsHostnames"]["Value"]
    assert client.describe_vpc_attribute(VpcId=vpc, Attribute="enableDnsSupport")["EnableDnsSupport"]["Value"]


async def test_dns_resolution_off_is_refused_first(world: World, kube_file: Path) -> None:
    vpc, private = given_vpc(AZS)
    ec2().modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": False})
    ec2().modify_vpc_attribute(VpcId=vpc, EnableDnsSupport={"Value": False})
    with pytest.raises(UserError) as refused:
        await session_for(vpc_id=vpc, private_subnet_ids=",".join(private), availability_zone="us-east-1a").plan()
    # Hostnames can be turned on only once resolution is (ModifyVpcAttribute): the remedy says that one first.
    assert "DNS resolution" in refused.value.message
    assert f"--vpc-id {vpc} --enable-dns-support" in (refused.value.remedy or "")


@pytest.mark.slow
def test_the_double_reports_routes_as_ec2_does(world: World) -> None:
    vpc, private = _vpc()
    client = ec2()
    with pytest.raises(Exception, match="InvalidTransitGatewayID.NotFound"):
        _route_out(vpc, private[0], TransitGatewayId="tgw-0123456789abcdef0")
    image = client.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    nat = client.run_instances(ImageId=image, MinCount=1, MaxCount=1, SubnetId=private[1])["Instances"][0]
    _route_out(vpc, private[1], InstanceId=nat["InstanceId"])
    client.terminate_instances(InstanceIds=[nat["InstanceId"]])
    tables = client.describe_route_tables(Filters=[{"Name": "association.subnet-id", "Values": [private[1]]}])
    [default] = [r for r in tables["RouteTables"][0]["Routes"] if r.get("DestinationCidrBlock") == "0.0.0.0/0"]
    assert default["State"] == "blackhole"


@pytest.mark.parametrize(("route", "via"), [
    # EC2 describes a route made with VpcEndpointId (a Gateway Load Balancer or Network Firewall endpoint)
    # with the endpoint's id in GatewayId.
    ({"GatewayId": "vpce-0a1b2c3d4e5f60718"}, "endpoint vpce-0a1b2c3d4e5f60718"),
    ({"VpcPeeringConnectionId": "pcx-0a1b2c3d"}, "VPC peering pcx-0a1b2c3d"),
    ({"GatewayId": "vgw-0a1b2c3d"}, "virtual private gateway vgw-0a1b2c3d"),
    # A NAT instance's route names the instance and its interface: the instance is what a reader knows.
    ({"InstanceId": "i-0a1b2c3d", "InstanceOwnerId": "111122223333", "NetworkInterfaceId": "eni-0a1b2c3d"},
     "NAT instance i-0a1b2c3d"),
])
def test_every_default_route_that_leads_out_privately_is_a_way_out(route: dict[str, str], via: str) -> None:
    from targets.aws.infra.given_vpc import default_egress

    found, why = default_egress([{"DestinationCidrBlock": "10.8.0.0/16", "GatewayId": "local", "State": "active"},
                                 {"DestinationCidrBlock": "0.0.0.0/0", "State": "active", **route}])
    assert found is not None and via in found and why == ""


def test_an_internet_gateway_or_a_blackhole_is_no_private_way_out() -> None:
    from targets.aws.infra.given_vpc import default_egress

    public, why = default_egress([{"DestinationCidrBlock": "0.0.0.0/0", "GatewayId": "igw-0a1b", "State": "active"}])
    assert public is None and "public" in why
    gone, why = default_egress([{"DestinationCidrBlock": "0.0.0.0/0", "NatGatewayId": "nat-0a1b",
                                 "State": "blackhole"}])
    assert gone is None and "blackhole" in why
