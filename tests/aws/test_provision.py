"""The aws layer against moto over real HTTP: what `up --until aws` makes, the plan after it, `down`."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from backend.resources import Action, EventKind
from backend.session import cost_meter
from targets.aws.config import AwsConfig
from targets.aws.facts import AwsFacts
from targets.aws.infra.api import AwsApi
from tests.aws.conftest import World
from tests.aws.provision_world import RUN_TAG, down, ec2, eks, given_vpc, iam, session_for, tagged, up
from tests.clock import FastClock
from tests.eventually import eventually_async

pytestmark = pytest.mark.usefixtures("fast_backoff")

EXPECTED = {"vpc": 1, "subnet": 4, "internet-gateway": 1, "nat-gateway": 1, "elastic-ip": 1, "route-table": 2,
            "security-group": 1, "launch-template": 2, "placement-group": 1, "iam-role": 6, "eks-cluster": 1,
            "nodegroup": 2, "addon": 4, "access-entry": 1, "s3-bucket": 1}


@pytest.mark.slow
async def test_up_until_aws_makes_everything_once_then_down_leaves_nothing(world: World, kube_file: Path) -> None:
    session = session_for()
    done = await up(session)
    assert done.ok, done.failures()
    run = session.run_id
    counts = tagged(run)
    assert {k: counts[k] for k in EXPECTED} == EXPECTED
    assert counts["network-interface"] >= 2  # EFA and CNI interfaces of the GPU nodes carry the LT's tags

    client = ec2()
    run_filter = [{"Name": f"tag:{RUN_TAG}", "Values": [run]}]
    vpc = client.describe_vpcs(Filters=run_filter)["Vpcs"][0]
    for attribute in ("enableDnsSupport", "enableDnsHostnames"):
        value = client.describe_vpc_attribute(VpcId=vpc["VpcId"], Attribute=attribute)
        assert value[attribute[0].upper() + attribute[1:]]["Value"] is True
    group = client.describe_security_groups(Filters=run_filter)["SecurityGroups"][0]
    for key in ("IpPermissions", "IpPermissionsEgress"):
        pairs = [pair["GroupId"] for p in group[key] if p["IpProtocol"] == "-1" for pair in p["UserIdGroupPairs"]]
        assert group["GroupId"] in pairs, f"no EFA self rule in {key}"
    template = client.describe_launch_templates(
        Filters=run_filter, LaunchTemplateNames=["rtui-rtui-ray-gpu"])["LaunchTemplates"][0]
    data = client.describe_launch_template_versions(LaunchTemplateId=template["LaunchTemplateId"])[
        "LaunchTemplateVersions"][0]["LaunchTemplateData"]
    interface = data["NetworkInterfaces"][0]
    assert (interface["InterfaceType"], interface["DeviceIndex"], interface["NetworkCardIndex"]) == ("efa", 0, 0)
    cluster_group = eks().describe_cluster(name="rtui-ray")["cluster"]["resourcesVpcConfig"]["clusterSecurityGroupId"]
    assert interface["Groups"] == [cluster_group, group["GroupId"]]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] >= 100
    placement = client.describe_placement_groups(Filters=run_filter)["PlacementGroups"][0]
    assert placement["Strategy"] == "cluster"
    assert data["Placement"]["GroupName"] == placement["GroupName"]

    cluster = eks().describe_cluster(name="rtui-ray")["cluster"]
    assert cluster["accessConfig"]["authenticationMode"] == "API"
    assert cluster["resourcesVpcConfig"]["endpointPrivateAccess"] is True
    assert cluster["tags"][RUN_TAG] == run
    subnets = {s["SubnetId"]: s for s in client.describe_subnets(Filters=run_filter)["Subnets"]}
    assert len({subnets[s]["AvailabilityZone"] for s in cluster["resourcesVpcConfig"]["subnetIds"]}) == 2
    gpu = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    assert len(gpu["subnets"]) == 1 and gpu["amiType"] == "AL2023_x86_64_NVIDIA"
    assert gpu["labels"]["nvidia.com/gpu.present"] == "true"
    assert gpu["scalingConfig"]["desiredSize"] == 2 and gpu["instanceTypes"] == ["g6.12xlarge"]
    assert gpu["launchTemplate"]["id"] == template["LaunchTemplateId"]
    assert AwsFacts.of(session.record.facts).gpu_az == subnets[gpu["subnets"][0]]["AvailabilityZone"]
    system = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-system")["nodegroup"]
    assert system["labels"]["role"] == "system" and system["instanceTypes"] == ["m7i.xlarge"]
    entries = eks().list_access_entries(clusterName="rtui-ray")["accessEntries"]
    policies = eks().list_associated_access_policies(clusterName="rtui-ray", principalArn=entries[0])
    assert [p["policyArn"].rsplit("/", 1)[1] for p in policies["associatedAccessPolicies"]] == [
        "AmazonEKSClusterAdminPolicy"]
    roles = {r["RoleName"]: r for r in iam().list_roles(PathPrefix="/rtui/")["Roles"]}
    attached = {p["PolicyName"] for p in iam().list_attached_role_policies(RoleName="rtui-rtui-ray-nodes")[
        "AttachedPolicies"]}
    # The CNI's, cluster-autoscaler's and the Ray pods' S3 permissions are their own roles' (pod identity:
    # test_node_security, test_node_autoscaler, test_run_bucket), not every pod's.
    assert attached == {"AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryPullOnly"} and len(roles) == 6
    assert kube_file.exists() and oct(kube_file.stat().st_mode & 0o777) == "0o600"
    assert "k8s-aws-v1" not in kube_file.read_text()  # an exec plugin, never a token

    again = await session.plan()
    assert [(c.address, c.reason) for c in again.changes if c.layer == "aws" and c.action is not Action.NOOP] == []

    gone = await down(session)
    assert gone.ok, gone.failures()
    assert tagged(run) == {}
    assert session.record.facts.sweep == []
    assert any(e.step == "sweep" and e.kind.value == "done" for e in gone.events)
    assert cluster["arn"] not in kube_file.read_text()


@pytest.mark.slow
async def test_plan_diff_updates_replacements_and_costs(world: World, kube_file: Path) -> None:
    fresh = await session_for().plan()
    aws = [c for c in fresh.changes if c.layer == "aws"]
    assert {c.action for c in aws} == {Action.CREATE}
    # The documented on-demand prices (us-east-1): 2 × g6.12xlarge, 1 × m7i.xlarge, the EKS control
    # plane, one NAT gateway and its public IPv4 address, the nodes' gp3 root volumes (2 × 200 GB, and
    # 100 GB for the system node, sized from the registry double's 14 GB default image).
    assert fresh.cost_per_hour == pytest.approx(2 * 4.6016 + 0.2016 + 0.10 + 0.045 + 0.005 + 500 * 0.08 / 730,
                                                abs=1e-4)
    assert fresh.price_source == "estimate, us-east-1 prices"  # the Pricing API is denied here
    gpu = fresh.change("aws.nodegroup.gpu")
    assert gpu is not None and gpu.quota["L-DB2E81BA"]["vcpus"] == 96
    assert gpu.quota["L-DB2E81BA"]["headroom"] == 192

    session = session_for()
    assert (await up(session)).ok
    bigger = await session_for(gpu_node_count=3).plan()
    change = bigger.change("aws.nodegroup.gpu")
    assert change is not None and change.action is Action.UPDATE
    assert (change.before or {})["size"] == 2 and (change.after or {})["size"] == 3
    assert change.cost_per_hour == pytest.approx(3 * 4.6016 + 3 * 200 * 0.08 / 730, abs=1e-4)
    assert [c.address for c in bigger.changes if c.layer == "aws" and c.action is not Action.NOOP] == [
        "aws.nodegroup.gpu"]
    other = await session_for(gpu_node_type="g6.48xlarge").plan()
    replaced = other.change("aws.nodegroup.gpu")
    assert replaced is not None and replaced.action is Action.REPLACE
    assert "instance_type" in replaced.reason

    grown = session_for(gpu_node_count=3)
    assert (await up(grown)).ok
    size = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    assert size["scalingConfig"]["desiredSize"] == 3
    assert (await down(grown)).ok
    assert tagged(session.run_id) == {}


@pytest.mark.slow
async def test_a_whole_up_and_down_through_throttling_and_5xx_on_every_call(world: World, kube_file: Path) -> None:
    """The flow, once: how one call is retried is tested in test_api_retries.py, without moto."""
    import random

    world.script.rng = random.Random(0)
    world.script.throttle_rate = 0.15
    world.script.error5xx_rate = 0.15
    session = session_for(cluster_name="flaky")
    # The session's AWS client, made here with a clock 50× faster (the backoff, in real seconds,
    # is not what this tests); the layers find it where they look for it.
    clock = FastClock(50.0)
    config = session.config
    session.clients.get(("aws", AwsConfig.of(config).region, config.profile),
                        lambda: AwsApi(AwsConfig.of(config).region, config.profile, clock=clock))
    made = await up(session)
    assert made.ok, made.failures()
    gone = await down(session)
    assert gone.ok, gone.failures()
    world.script.throttle_rate = world.script.error5xx_rate = 0.0  # the test's own look, unhindered
    assert tagged(session.run_id) == {}
    retried = made.retries() + gone.retries()
    assert retried and all(e.data.get("scope") == "call" for e in retried)
    assert any("Throttl" in (e.cause or "") or "RequestLimitExceeded" in (e.cause or "") for e in retried)
    assert any(e.cause in ("InternalError", "ServiceUnavailable", "InternalFailure") for e in retried)
    assert len(clock.slept) >= len(retried)  # every retry slept on the clock it was given
    assert world.script.throttled > 5 and world.script.faulted > 5, (world.script.throttled, world.script.faulted)


@pytest.mark.slow
async def test_no_capacity_in_the_gpu_az_fails_over_to_the_next_feasible_one(world: World, kube_file: Path) -> None:
    plan_session = session_for(gpu_node_count=1)
    await plan_session.plan()
    first = plan_session.stack.layer("aws").topology.gpu_az  # type: ignore[attr-defined]
    world.script.ice_zones["g6.12xlarge"] = {first}

    stuck = session_for(gpu_node_count=1)  # one node: AWS launched none of it (partial: test_provision_capacity)
    failed = await up(stuck)
    assert not failed.ok
    fault = next(e for e in failed.events if e.step == "aws.nodegroup.gpu" and e.kind is EventKind.FAILED)
    assert "InsufficientInstanceCapacity" in fault.message and first in fault.message
    assert "--az-failover" in (fault.remedy or "")
    # The failed nodegroup stays for teardown, but AWS launched no instance: the meter does not count it.
    assert stuck.record.resources["aws.nodegroup.gpu"].live
    meter = cost_meter(stuck.record)
    assert meter is not None and "aws.eks-cluster" in meter.resources
    assert "aws.nodegroup.gpu" not in meter.resources and meter.per_hour < 1.0

    moved = await up(stuck, az_failover=True)
    assert moved.ok, moved.failures()
    gpu = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    az = ec2().describe_subnets(SubnetIds=gpu["subnets"])["Subnets"][0]["AvailabilityZone"]
    assert az != first and gpu["status"] == "ACTIVE"
    assert AwsFacts.of(stuck.record.facts).az_moves[0].from_az == first
    assert "InsufficientInstanceCapacity" in AwsFacts.of(stuck.record.facts).az_moves[0].why
    assert AwsFacts.of(stuck.record.facts).gpu_az == az
    meter = cost_meter(stuck.record)
    assert meter is not None and meter.resources["aws.nodegroup.gpu"].per_hour > 4  # billing again
    assert (await down(stuck)).ok
    assert tagged(stuck.run_id) == {}


@pytest.mark.slow
async def test_half_made_resources_are_waited_on_not_made_again(world: World, kube_file: Path) -> None:

    # The double reads the create time when it is asked: the control plane stays CREATING however long
    # a loaded machine takes to plan again, and is made quick once the plan has been checked.
    world.script.timings.cluster_create = 120.0
    world.script.timings.nat_create = 0.6
    session = session_for()
    # Stop the run while the control plane and the NAT gateway are still being made.
    events = up(session)
    import asyncio

    task = asyncio.ensure_future(events)
    await eventually_async("the control plane to be asked for", lambda: eks().list_clusters()["clusters"], timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    plan = await session_for().plan()
    cluster = plan.change("aws.eks-cluster")
    assert cluster is not None and cluster.action is Action.UPDATE and "waiting" in cluster.reason
    world.script.timings.cluster_create = 3.0
    again = session_for()
    assert (await up(again)).ok
    counts = tagged(again.run_id)
    assert {k: counts[k] for k in EXPECTED} == EXPECTED
    assert (await down(again)).ok


async def test_a_cluster_of_our_name_made_by_someone_else_is_refused(world: World, kube_file: Path) -> None:
    world.script.timings.iam_propagation = 0.0  # someone's role of long ago: IAM has settled it
    iam().create_role(RoleName="someone", AssumeRolePolicyDocument="{}")
    eks().create_cluster(name="rtui-ray", roleArn="arn:aws:iam::123456789012:role/someone",
                         resourcesVpcConfig={"subnetIds": []})
    session = session_for()
    failed = [c for c in await session.preflight() if c.status.value == "fail"]
    assert [c.id for c in failed] == ["aws.name.cluster"]
    assert "someone else" in failed[0].detail and "--cluster-name" in (failed[0].remedy or "")


@pytest.mark.slow
async def test_a_missing_iam_permission_names_the_action(world: World, kube_file: Path) -> None:
    world.script.errors[("iam", "CreateRole")] = "AccessDenied"
    session = session_for()
    made = await up(session)
    assert not made.ok
    line = next(e for e in made.events if e.step == "aws.iam-role.cluster" and e.kind.value == "failed")
    assert "iam:CreateRole" in line.message and "IAM permission" in (line.remedy or "")
    world.script.errors.clear()
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}



@pytest.mark.slow
async def test_what_teardown_cannot_delete_is_listed_with_its_cost(world: World, kube_file: Path) -> None:
    session = session_for()
    assert (await up(session)).ok
    world.script.errors[("ec2", "DeleteNatGateway")] = "UnauthorizedOperation"
    gone = await down(session)
    assert not gone.ok
    sweep = next(e for e in gone.events if e.step == "sweep" and e.kind is EventKind.FAILED)
    assert sweep.message.startswith("9 resources of this run are still there "
                                    "($0.050/h, estimate, us-east-1 prices): NAT gateway")
    assert "Elastic IP" in sweep.message
    left = {item.kind: item for item in session.record.facts.sweep or []}
    assert left["NAT gateway"].cost_per_hour == pytest.approx(0.045)
    assert left["Elastic IP"].cost_per_hour == pytest.approx(0.005)
    assert "EKS cluster" not in left and "nodegroup" not in left  # what could go, went
    world.script.errors.clear()
    again = await down(session)
    assert again.ok, again.failures()
    assert tagged(session.run_id) == {}


@pytest.mark.slow
async def test_the_sweep_prices_leftovers_at_the_pricing_apis_quote(world: World, kube_file: Path) -> None:
    world.script.pricing_denied = False
    world.script.prices.update({("us-east-1", "g6.12xlarge"): 4.6016, ("us-east-1", "m7i.xlarge"): 0.2016})
    # Dearer than the built-in table, so a figure from the table would show.
    world.script.region_prices["us-east-1"] = {"eks": 0.10, "nat_hour": 0.06, "nat_gb": 0.05, "ebs_gp3": 0.08,
                                               "ipv4": 0.006}
    session = session_for()
    assert (await up(session)).ok
    world.script.errors[("ec2", "DeleteNatGateway")] = "UnauthorizedOperation"
    gone = await down(session)
    sweep = next(e for e in gone.events if e.step == "sweep" and e.kind is EventKind.FAILED)
    assert "($0.066/h, AWS Pricing API, us-east-1 on-demand)" in sweep.message
    left = {item.kind: item for item in session.record.facts.sweep or []}
    assert left["NAT gateway"].cost_per_hour == pytest.approx(0.06)
    assert left["Elastic IP"].cost_per_hour == pytest.approx(0.006)
    world.script.errors.clear()
    assert (await down(session)).ok


@pytest.mark.slow
async def test_a_given_vpc_is_adopted_checked_and_never_deleted(world: World, kube_file: Path) -> None:
    client = ec2()
    vpc, private = given_vpc(("us-east-1a", "us-east-1b"))
    session = session_for(vpc_id=vpc, private_subnet_ids=",".join(private), availability_zone="us-east-1a")
    assert not [c for c in await session.preflight() if c.status.value == "fail"]
    made = await up(session)
    assert made.ok, made.failures()
    counts = tagged(session.run_id)
    assert counts["vpc"] == 0 and counts["subnet"] == 0 and counts["nat-gateway"] == 0
    assert counts["eks-cluster"] == 1 and counts["nodegroup"] == 2 and counts["security-group"] == 1
    gpu = eks().describe_nodegroup(clusterName="rtui-ray", nodegroupName="rtui-ray-gpu")["nodegroup"]
    assert gpu["subnets"] == [private[0]]
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}
    assert client.describe_vpcs(VpcIds=[vpc])["Vpcs"]
    assert len(client.describe_subnets(SubnetIds=private)["Subnets"]) == 2


@pytest.mark.slow
async def test_the_security_group_eks_leaves_behind_goes_before_the_vpc(world: World, kube_file: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from targets.aws.infra import network

    monkeypatch.setattr(network, "DEPENDENCY_TIMEOUT_S", 5.0)
    world.script.leave_cluster_sg = True  # EKS sometimes leaves eks-cluster-sg-* when the cluster goes
    session = session_for()
    assert (await up(session)).ok
    group = eks().describe_cluster(name="rtui-ray")["cluster"]["resourcesVpcConfig"]["clusterSecurityGroupId"]
    gone = await down(session)
    assert gone.ok, gone.failures()
    assert tagged(session.run_id) == {}
    left = ec2().describe_security_groups(Filters=[{"Name": "tag:aws:eks:cluster-name", "Values": ["rtui-ray"]}])
    assert [g["GroupId"] for g in left["SecurityGroups"]] == [], group


@pytest.mark.slow
async def test_the_sweep_reports_what_is_left_in_the_vpc_tagged_or_not(world: World, kube_file: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from targets.aws.infra import network

    monkeypatch.setattr(network, "DEPENDENCY_TIMEOUT_S", 3.0)
    session = session_for()
    assert (await up(session)).ok
    vpc = ec2().describe_vpcs(Filters=[{"Name": f"tag:{RUN_TAG}", "Values": [session.run_id]}])["Vpcs"][0]["VpcId"]
    # Made in the run's VPC by someone else (a controller, a user): no tag of ours.
    stranger = ec2().create_security_group(GroupName="made-by-hand", Description="x", VpcId=vpc)["GroupId"]
    gone = await down(session)
    assert not gone.ok
    sweep = next(e for e in gone.events if e.step == "sweep" and e.kind is EventKind.FAILED)
    left = {item.id: item for item in session.record.facts.sweep or []}
    assert stranger in left and left[stranger].kind == "security group", sweep.message
    assert vpc in left
    ec2().delete_security_group(GroupId=stranger)
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


@pytest.mark.slow
async def test_the_access_entry_names_the_sso_role_with_its_path(world: World, kube_file: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:

    path = "/aws-reserved/sso.amazonaws.com/us-east-1/"
    role = iam().create_role(RoleName="AWSReservedSSO_AdministratorAccess_0123456789abcdef", Path=path,
                             AssumeRolePolicyDocument="{}")["Role"]
    # What the SSO permission set grants it (S3 calls of an assumed role are judged as IAM does them).
    iam().put_role_policy(RoleName=role["RoleName"], PolicyName="AdministratorAccess", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    creds = boto3.client("sts", region_name="us-east-1").assume_role(
        RoleArn=role["Arn"], RoleSessionName="someone@example.com")["Credentials"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", creds["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", creds["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", creds["SessionToken"])
    session = session_for()  # a new session: its clients sign as the new identity
    made = await up(session)
    assert made.ok, made.failures()
    assert eks().list_access_entries(clusterName="rtui-ray")["accessEntries"] == [role["Arn"]]
    assert path in role["Arn"]
    again = await session.plan()
    assert [(c.address, c.reason) for c in again.changes if c.layer == "aws" and c.action is not Action.NOOP] == []
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


@pytest.mark.slow
async def test_a_new_role_that_iam_has_not_settled_is_retried_and_shown(world: World, kube_file: Path) -> None:
    world.script.timings.iam_propagation = 2.0  # EKS refuses the new roles this long
    session = session_for()
    made = await up(session)
    assert made.ok, made.failures()
    settling = [e for e in made.retries() if e.cause == "IAM propagation"]
    assert {e.step for e in settling} >= {"aws.eks-cluster"}, [(e.step, e.message) for e in made.retries()]
    assert all("IAM" in e.message for e in settling)
    assert (await down(session)).ok


@pytest.mark.slow
async def test_every_ec2_create_carries_a_client_token(world: World, kube_file: Path) -> None:
    import botocore.session

    model = botocore.session.get_session().get_service_model("ec2")
    session = session_for()
    assert (await up(session)).ok
    creates = [(action, params) for action, params in world.script.ec2_requests
               if action.startswith(("Create", "Allocate", "Run"))
               and "ClientToken" in model.operation_model(action).input_shape.members]
    assert {action for action, _ in creates} >= {"CreateNatGateway", "CreateRouteTable", "CreateLaunchTemplate"}
    assert [action for action, params in creates if not params.get("ClientToken")] == []
    tokens = [params["ClientToken"] for _, params in creates]
    # EC2 takes 64 characters, CreateLaunchTemplate 128 (botocore's EC2 model, "Constraint: Maximum …").
    limit = {"CreateLaunchTemplate": 128}
    assert len(set(tokens)) == len(tokens)
    assert [(a, p["ClientToken"]) for a, p in creates if len(p["ClientToken"]) > limit.get(a, 64)] == []
    # Ours, not botocore's random one per call: a retry after a lost reply must send the same token.
    assert all(t.startswith(session.run_id) for t in tokens), tokens
    assert (await down(session)).ok


@pytest.mark.slow
async def test_a_create_whose_reply_was_lost_is_not_made_twice(world: World, kube_file: Path) -> None:
    world.script.lost_replies.update({"CreateRouteTable": 1, "CreateNatGateway": 1, "CreateLaunchTemplate": 1})
    session = session_for()
    made = await up(session)
    assert made.ok, made.failures()
    assert any(e.cause == "InternalError" for e in made.retries())
    counts = tagged(session.run_id)
    # the GPU and the system launch templates, once each
    assert (counts["route-table"], counts["nat-gateway"], counts["launch-template"]) == (2, 1, 2)
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


@pytest.mark.slow
async def test_a_degraded_add_on_fails_its_step_with_its_health_issues(world: World, kube_file: Path) -> None:
    world.script.degraded_addons["coredns"] = [{
        "code": "InsufficientNumberOfReplicas",
        "message": "The add-on is unhealthy because it doesn't have the desired number of replicas.",
        "resourceIds": []}]
    session = session_for()
    made = await up(session)
    assert not made.ok
    failed = next(e for e in made.events if e.step == "aws.addon.coredns" and e.kind is EventKind.FAILED)
    assert "degraded" in failed.message and "InsufficientNumberOfReplicas" in failed.message
    world.script.degraded_addons.clear()
    assert (await down(session)).ok
    assert tagged(session.run_id) == {}


@pytest.mark.slow
async def test_no_nat_gateway_available_for_the_private_route_is_one_line(world: World, kube_file: Path) -> None:
    from backend.errors import OperationError
    from targets.aws.infra.routes import RouteTableHandler

    session = session_for()
    assert (await up(session)).ok
    plan = await session.plan()
    change = plan.change("aws.route-table.private")
    assert change is not None
    nat = ec2().describe_nat_gateways(Filters=[{"Name": f"tag:{RUN_TAG}", "Values": [session.run_id]}])[
        "NatGateways"][0]["NatGatewayId"]
    ec2().delete_nat_gateway(NatGatewayId=nat)  # gone by hand (or failed) while the route is being made
    handler = RouteTableHandler()
    want = next(r for r in session.stack.layer("aws").desired(session.ctx, []) if r.address == change.address)
    have = next(o for o in await handler.observe(handler.api(session.ctx), session.ctx) if o.address == change.address)
    with pytest.raises(OperationError) as err:
        async for _ in handler.update(session.ctx, want, have):
            pass
    assert "NAT gateway" in err.value.message and "\n" not in err.value.message and err.value.remedy
    gone = await down(session)
    assert gone.ok, gone.failures()
