"""Helpers for the aws layer's tests: a run against moto, and what AWS holds of it, read with boto3."""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.exceptions import ClientError

from backend import flows
from backend.ledger import ResourceStatus
from backend.resolve import resolve_config
from backend.resources import EventKind, StepEvent
from backend.session import RunSession
from targets.aws.infra.layer import AwsLayer
from tests.aws.conftest import image_env
from tests.aws.moto_ext import SCRIPT
from tests.aws.reachability import assert_reachable

REGION = "us-east-1"
RUN_TAG = "rtui:run"


@dataclass
class Outcome:
    events: list[StepEvent] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """`up`: how its run ended (a failover retries after a failure); `down`: no step failed."""
        runs = [e for e in self.events if e.step == flows.RUN and e.kind in (EventKind.DONE, EventKind.FAILED)]
        if runs:
            return runs[-1].kind is EventKind.DONE
        return not any(e.kind in (EventKind.FAILED, EventKind.CANCELLED) for e in self.events)

    def failures(self) -> list[str]:
        return [f"{e.step}: {e.message}" for e in self.events if e.kind is EventKind.FAILED]

    def retries(self) -> list[StepEvent]:
        return [e for e in self.events if e.kind is EventKind.RETRYING]


async def collect(events: AsyncIterator[StepEvent]) -> Outcome:
    out = Outcome()
    async for event in events:
        out.events.append(event)
    return out


def gpu_az(session: RunSession) -> str:
    """The AZ the aws layer chose for the GPU nodes when the session last planned."""
    layer = session.stack.layer("aws")
    assert isinstance(layer, AwsLayer) and layer.topology is not None, "the session has not planned on aws"
    return layer.topology.gpu_az


# The sessions this test made: the world fixture ends each (its clients and their threads) after it.
OPEN: list[RunSession] = []


def session_for(**values: Any) -> RunSession:
    # Images come from the registry double (conftest.image_env); one that cannot be pinned goes on
    # by tag (--allow-unpinned). tests/kube tests the pinning.
    session = RunSession.for_config(resolve_config({"target": "aws", "region": REGION, "allow_unpinned": "true",
                                                    "model_revision": "0" * 40, **values}, environ=image_env()))
    OPEN.append(session)
    return session


def close_sessions() -> None:
    while OPEN:
        OPEN.pop().close()


async def up(session: RunSession, *, until: str | None = "aws", az_failover: bool = False) -> Outcome:
    """`rtui up`; when it made the nodes, the Ray job must be able to reach across them (reachability)."""
    outcome = await collect(flows.up(session, until=until, follow=False, az_failover=az_failover))
    gpu = session.record.resources.get("aws.nodegroup.gpu")
    if outcome.ok and gpu is not None and gpu.status is ResourceStatus.READY:
        # The test's own look goes unhindered by the faults a test injects into rtui's calls.
        rates = (SCRIPT.throttle_rate, SCRIPT.error5xx_rate)
        SCRIPT.throttle_rate = SCRIPT.error5xx_rate = 0.0
        try:
            assert_reachable(session.config.cluster_name)
        finally:
            SCRIPT.throttle_rate, SCRIPT.error5xx_rate = rates
    return outcome


async def down(session: RunSession) -> Outcome:
    return await collect(flows.down(session))


def aws_client(service: str, region: str = REGION) -> Any:
    """The test's own boto3 client (not rtui's), one per service, region, endpoint and caller: making one
    costs 3-20 ms of CPU, and ``tagged`` alone made a dozen a call (IAM's once per role)."""
    caller = tuple(os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"))
    return _client(service, region, caller)


@functools.cache
def _client(service: str, region: str, caller: tuple[str | None, ...]) -> Any:
    return boto3.client(service, region_name=region)


def ec2() -> Any:
    return aws_client("ec2")


def eks() -> Any:
    return aws_client("eks")


def iam() -> Any:
    return aws_client("iam")


def tagged(run_id: str) -> Counter[str]:
    """How many of each EC2 kind (and IAM role, EKS object, S3 bucket) carry this run's tag (what `down`
    must leave at zero)."""
    client = ec2()
    run = [{"Name": f"tag:{RUN_TAG}", "Values": [run_id]}]
    counts: Counter[str] = Counter()
    counts["vpc"] = len(client.describe_vpcs(Filters=run)["Vpcs"])
    counts["subnet"] = len(client.describe_subnets(Filters=run)["Subnets"])
    counts["internet-gateway"] = len(client.describe_internet_gateways(Filters=run)["InternetGateways"])
    counts["nat-gateway"] = len([n for n in client.describe_nat_gateways(Filters=run)["NatGateways"]
                                 if n["State"] not in ("deleted", "deleting")])
    counts["elastic-ip"] = len(client.describe_addresses(Filters=run)["Addresses"])
    counts["route-table"] = len(client.describe_route_tables(Filters=run)["RouteTables"])
    counts["security-group"] = len(client.describe_security_groups(Filters=run)["SecurityGroups"])
    counts["launch-template"] = len(client.describe_launch_templates(Filters=run)["LaunchTemplates"])
    counts["placement-group"] = len([g for g in client.describe_placement_groups(Filters=run)["PlacementGroups"]
                                     if g.get("State") not in ("deleted", "deleting")])
    counts["network-interface"] = len(client.describe_network_interfaces(Filters=run)["NetworkInterfaces"])
    counts["vpc-endpoint"] = len([e for e in client.describe_vpc_endpoints(Filters=run)["VpcEndpoints"]
                                  if e["State"].lower() not in ("deleted", "deleting")])
    logs = aws_client("logs")
    for group in logs.describe_log_groups(logGroupNamePrefix="/aws/eks/")["logGroups"]:
        group_tags = logs.list_tags_for_resource(resourceArn=group["logGroupArn"])["tags"]
        counts["log-group"] += group_tags.get(RUN_TAG) == run_id
    roles = iam().list_roles(PathPrefix="/rtui/")["Roles"]
    counts["iam-role"] = sum(1 for r in roles if {"Key": RUN_TAG, "Value": run_id}
                             in iam().list_role_tags(RoleName=r["RoleName"])["Tags"])
    clusters = [c for c in eks().list_clusters()["clusters"]
                if eks().describe_cluster(name=c)["cluster"].get("tags", {}).get(RUN_TAG) == run_id]
    counts["eks-cluster"] = len(clusters)
    for name in clusters:
        counts["nodegroup"] += len(eks().list_nodegroups(clusterName=name)["nodegroups"])
        counts["addon"] += len(eks().list_addons(clusterName=name)["addons"])
        counts["access-entry"] += len(eks().list_access_entries(clusterName=name)["accessEntries"])
    s3 = aws_client("s3")
    for bucket in s3.list_buckets()["Buckets"]:
        try:
            tag_set = s3.get_bucket_tagging(Bucket=bucket["Name"])["TagSet"]
        except ClientError:  # NoSuchTagSet
            continue
        counts["s3-bucket"] += {"Key": RUN_TAG, "Value": run_id} in tag_set
    return +counts


def given_vpc(azs: tuple[str, ...]) -> tuple[str, list[str]]:
    """A VPC someone else made: a public subnet with a NAT gateway, private subnets in ``azs`` routed to it."""
    client = ec2()
    vpc = client.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
    # CreateVpc leaves DNS hostnames off; a VPC made for EKS has them on (EKS needs them: test_given_vpc).
    client.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
    public = client.create_subnet(VpcId=vpc, CidrBlock="10.7.100.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    eip = client.allocate_address(Domain="vpc")["AllocationId"]
    nat = client.create_nat_gateway(SubnetId=public["SubnetId"], AllocationId=eip)["NatGateway"]["NatGatewayId"]
    table = client.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    client.create_route(RouteTableId=table, DestinationCidrBlock="0.0.0.0/0", NatGatewayId=nat)
    private = []
    for i, az in enumerate(azs):
        sid = client.create_subnet(VpcId=vpc, CidrBlock=f"10.7.{i}.0/24", AvailabilityZone=az)["Subnet"]["SubnetId"]
        client.associate_route_table(RouteTableId=table, SubnetId=sid)
        private.append(sid)
    return vpc, private
