"""moto, as extended by moto_provision*, behaves like AWS for what the provisioner does."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.aws.conftest import World
from tests.eventually import eventually

REGION = "us-east-1"
TAGS = [{"Key": "rtui:run", "Value": "r1"}, {"Key": "rtui:cluster", "Value": "c1"}]
ROLE = "arn:aws:iam::123456789012:role/rtui/eks"


def client(service: str) -> Any:
    return boto3.client(service, region_name=REGION, config=Config(retries={"mode": "standard", "max_attempts": 5}))


def code(err: pytest.ExceptionInfo[ClientError]) -> str:
    return str(err.value.response["Error"]["Code"])


def network(ec2: Any) -> dict[str, Any]:
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    a = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    b = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.16.0/20", AvailabilityZone="us-east-1b")["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName="efa", Description="efa", VpcId=vpc)["GroupId"]
    return {"vpc": vpc, "a": a, "b": b, "sg": sg}


def efa_template(ec2: Any, sg: str, itype: str = "g6.12xlarge") -> str:
    lt = ec2.create_launch_template(
        LaunchTemplateName="gpu",
        LaunchTemplateData={
            "InstanceType": itype,
            "NetworkInterfaces": [{"InterfaceType": "efa", "DeviceIndex": 0, "NetworkCardIndex": 0, "Groups": [sg]}],
            "MetadataOptions": {"HttpTokens": "required"},
            "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 200, "VolumeType": "gp3"}}],
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": TAGS},
                {"ResourceType": "network-interface", "Tags": TAGS},
            ],
        },
        TagSpecifications=[{"ResourceType": "launch-template", "Tags": TAGS}],
    )
    return str(lt["LaunchTemplate"]["LaunchTemplateId"])


def cluster(eks: Any, net: dict[str, Any], name: str = "c1") -> dict[str, Any]:
    return dict(
        eks.create_cluster(
            name=name,
            roleArn=ROLE,
            resourcesVpcConfig={
                "subnetIds": [net["a"], net["b"]],
                "securityGroupIds": [net["sg"]],
                "endpointPrivateAccess": True,
                "endpointPublicAccess": True,
                "publicAccessCidrs": ["203.0.113.7/32"],
            },
            accessConfig={"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": False},
            tags={"rtui:run": "r1"},
        )["cluster"]
    )


def gpu_nodegroup(eks: Any, net: dict[str, Any], lt: str, name: str = "gpu") -> dict[str, Any]:
    return dict(
        eks.create_nodegroup(
            clusterName="c1",
            nodegroupName=name,
            nodeRole=ROLE,
            subnets=[net["a"]],
            scalingConfig={"minSize": 0, "maxSize": 2, "desiredSize": 2},
            amiType="AL2023_x86_64_NVIDIA",
            labels={"rtui/role": "gpu"},
            launchTemplate={"id": lt, "version": "1"},
            tags={"rtui:run": "r1"},
        )["nodegroup"]
    )


def answer(call: Callable[[], object]) -> object:
    """What a call returns, or the code of the AWS error it raises."""
    try:
        return call()
    except ClientError as err:
        return err.response["Error"]["Code"]


def wait_for(fn: Any, want: Any, timeout: float = 3.0) -> Any:
    """What ``fn()`` gives once it gives ``want`` (polled by ``eventually``), or its last answer after
    ``timeout`` s, for the caller's assert to show."""
    got: list[Any] = []

    def reached() -> bool:
        got[:] = [fn()]
        return bool(got[0] == want)

    with contextlib.suppress(AssertionError):
        eventually(f"{want!r}", reached, timeout)
    return got[0]


def test_placement_groups(world: World) -> None:
    ec2 = client("ec2")
    spec = [{"ResourceType": "placement-group", "Tags": TAGS}]
    pg = ec2.create_placement_group(GroupName="pg1", Strategy="cluster", TagSpecifications=spec)["PlacementGroup"]
    assert pg["GroupId"].startswith("pg-") and pg["Strategy"] == "cluster"
    with pytest.raises(ClientError) as err:
        ec2.create_placement_group(GroupName="pg1", Strategy="cluster")
    assert code(err) == "InvalidPlacementGroup.Duplicate"
    ec2.create_placement_group(GroupName="pg2", Strategy="spread")
    by_tag = ec2.describe_placement_groups(Filters=[{"Name": "tag:rtui:run", "Values": ["r1"]}])["PlacementGroups"]
    assert [g["GroupName"] for g in by_tag] == ["pg1"]
    assert ec2.describe_placement_groups(GroupIds=[pg["GroupId"]])["PlacementGroups"][0]["GroupName"] == "pg1"
    assert (
        len(ec2.describe_placement_groups(Filters=[{"Name": "strategy", "Values": ["spread"]}])["PlacementGroups"]) == 1
    )
    assert (
        len(ec2.describe_placement_groups(Filters=[{"Name": "tag-key", "Values": ["rtui:cluster"]}])["PlacementGroups"])
        == 1
    )
    ec2.delete_placement_group(GroupName="pg1")
    calls: list[Callable[[], object]] = [
        lambda: ec2.delete_placement_group(GroupName="pg1"),
        lambda: ec2.describe_placement_groups(GroupNames=["pg1"]),
    ]
    for call in calls:
        with pytest.raises(ClientError) as err:
            call()
        assert code(err) == "InvalidPlacementGroup.Unknown"


def test_cluster_keeps_access_config_and_vpc_config(world: World) -> None:
    ec2, eks = client("ec2"), client("eks")
    net = network(ec2)
    cluster(eks, net)
    got = eks.describe_cluster(name="c1")["cluster"]
    assert got["accessConfig"]["authenticationMode"] == "API"
    vpc = got["resourcesVpcConfig"]
    assert vpc["endpointPrivateAccess"] and vpc["endpointPublicAccess"]
    assert vpc["publicAccessCidrs"] == ["203.0.113.7/32"] and vpc["securityGroupIds"] == [net["sg"]]
    assert vpc["subnetIds"] == [net["a"], net["b"]] and vpc["vpcId"] == net["vpc"]
    assert got["tags"] == {"rtui:run": "r1"} and got["status"] == "ACTIVE"


@pytest.mark.slow
def test_cluster_endpoint_and_ca_override(world: World) -> None:
    ec2, eks = client("ec2"), client("eks")
    net = network(ec2)
    world.script.cluster_endpoint, world.script.cluster_ca = "https://127.0.0.1:6443", "Q0E="
    cluster(eks, net)
    cluster(eks, net, "c2")
    world.script.cluster_endpoints["c2"] = ("https://127.0.0.1:7443", "Q0Ey")
    assert eks.describe_cluster(name="c1")["cluster"]["endpoint"] == "https://127.0.0.1:6443"
    c2 = eks.describe_cluster(name="c2")["cluster"]
    assert (c2["endpoint"], c2["certificateAuthority"]["data"]) == ("https://127.0.0.1:7443", "Q0Ey")


def test_addons_lifecycle(world: World) -> None:
    ec2, eks = client("ec2"), client("eks")
    cluster(eks, network(ec2))
    world.script.timings.addon_create = world.script.timings.addon_delete = 0.2
    addon = eks.create_addon(clusterName="c1", addonName="vpc-cni", tags={"rtui:run": "r1"})["addon"]
    assert addon["status"] == "CREATING" and addon["addonVersion"]
    with pytest.raises(ClientError) as err:
        eks.create_addon(clusterName="c1", addonName="vpc-cni")
    assert code(err) == "ResourceInUseException"
    def status() -> str:
        return str(eks.describe_addon(clusterName="c1", addonName="vpc-cni")["addon"]["status"])

    assert wait_for(status, "ACTIVE") == "ACTIVE"
    assert eks.list_addons(clusterName="c1")["addons"] == ["vpc-cni"]
    eks.update_addon(clusterName="c1", addonName="vpc-cni", addonVersion="v9")
    assert eks.describe_addon(clusterName="c1", addonName="vpc-cni")["addon"]["addonVersion"] == "v9"
    assert eks.delete_addon(clusterName="c1", addonName="vpc-cni")["addon"]["status"] == "DELETING"
    assert wait_for(lambda: answer(status), "ResourceNotFoundException") == "ResourceNotFoundException"
    versions = eks.describe_addon_versions(addonName="coredns")["addons"]
    assert versions[0]["addonVersions"][0]["compatibilities"][0]["defaultVersion"]


def test_access_entries(world: World) -> None:
    ec2, eks = client("ec2"), client("eks")
    cluster(eks, network(ec2))
    who = client("iam").create_role(RoleName="admin", Path="/rtui/", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    assert who == "arn:aws:iam::123456789012:role/rtui/admin"
    policy = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
    eks.create_access_entry(clusterName="c1", principalArn=who)
    with pytest.raises(ClientError) as err:
        eks.create_access_entry(clusterName="c1", principalArn=who)
    assert code(err) == "ResourceInUseException"
    assert eks.describe_access_entry(clusterName="c1", principalArn=who)["accessEntry"]["principalArn"] == who
    assert eks.list_access_entries(clusterName="c1")["accessEntries"] == [who]
    eks.associate_access_policy(clusterName="c1", principalArn=who, policyArn=policy, accessScope={"type": "cluster"})
    listed = eks.list_associated_access_policies(clusterName="c1", principalArn=who)["associatedAccessPolicies"]
    assert [(p["policyArn"], p["accessScope"]["type"]) for p in listed] == [(policy, "cluster")]
    eks.disassociate_access_policy(clusterName="c1", principalArn=who, policyArn=policy)
    assert eks.list_associated_access_policies(clusterName="c1", principalArn=who)["associatedAccessPolicies"] == []
    eks.delete_access_entry(clusterName="c1", principalArn=who)
    with pytest.raises(ClientError) as err:
        eks.describe_access_entry(clusterName="c1", principalArn=who)
    assert code(err) == "ResourceNotFoundException"


def test_cluster_and_nodegroup_lifecycles_and_hooks(world: World) -> None:
    ec2, eks = client("ec2"), client("eks")
    net = network(ec2)
    lt = efa_template(ec2, net["sg"])
    t = world.script.timings
    t.cluster_create = t.cluster_delete = t.nodegroup_create = 0.2
    t.nodegroup_delete = 1.0  # long enough that DeleteCluster surely comes while it is DELETING
    events: list[tuple[str, str, str, dict[str, Any]]] = []
    world.script.on_nodegroup_active = lambda c, n, info: events.append(("active", c, n, info))
    world.script.on_nodegroup_deleted = lambda c, n, info: events.append(("deleted", c, n, info))
    assert cluster(eks, net)["status"] == "CREATING"
    assert wait_for(lambda: eks.describe_cluster(name="c1")["cluster"]["status"], "ACTIVE") == "ACTIVE"
    ng = gpu_nodegroup(eks, net, lt)
    assert ng["status"] == "CREATING" and ng["amiType"] == "AL2023_x86_64_NVIDIA"
    assert ng["resources"]["autoScalingGroups"][0]["name"]
    status = lambda: eks.describe_nodegroup(clusterName="c1", nodegroupName="gpu")["nodegroup"]["status"]  # noqa: E731
    assert wait_for(status, "ACTIVE") == "ACTIVE"
    [(kind, _, name, info)] = events
    assert (kind, name, info["instance_type"], info["desired_size"]) == ("active", "gpu", "g6.12xlarge", 2)
    assert info["zone"] == "us-east-1a" and info["labels"] == {"rtui/role": "gpu"}
    eks.update_nodegroup_config(clusterName="c1", nodegroupName="gpu", scalingConfig={"desiredSize": 1})
    assert (
        eks.describe_nodegroup(clusterName="c1", nodegroupName="gpu")["nodegroup"]["scalingConfig"]["desiredSize"] == 1
    )
    assert eks.delete_nodegroup(clusterName="c1", nodegroupName="gpu")["nodegroup"]["status"] == "DELETING"
    with pytest.raises(ClientError) as err:
        eks.delete_cluster(name="c1")
    assert code(err) == "ResourceInUseException"
    groups = lambda: tuple(eks.list_nodegroups(clusterName="c1")["nodegroups"])  # noqa: E731
    assert wait_for(groups, ()) == () and events[-1][0] == "deleted"
    assert eks.delete_cluster(name="c1")["cluster"]["status"] == "DELETING"
    assert eks.list_clusters()["clusters"] == ["c1"]
    gone = wait_for(lambda: answer(lambda: eks.describe_cluster(name="c1")["cluster"]["status"]),
                    "ResourceNotFoundException")
    assert gone == "ResourceNotFoundException"


def test_nodegroup_enis_left_behind_block_deletion(world: World) -> None:
    ec2, eks = client("ec2"), client("eks")
    net = network(ec2)
    lt = efa_template(ec2, net["sg"])
    cluster(eks, net)
    gpu_nodegroup(eks, net, lt)
    enis = ec2.describe_network_interfaces(Filters=[{"Name": "subnet-id", "Values": [net["a"]]}])["NetworkInterfaces"]
    cni = [e for e in enis if e["Description"].startswith("aws-K8S-i-")]
    efa = [e for e in enis if e["InterfaceType"] == "efa"]
    assert len(cni) == 2 and len(efa) == 2
    assert {"Key": "cluster.k8s.amazonaws.com/name", "Value": "c1"} in cni[0]["TagSet"]
    assert all(e["Status"] == "in-use" and e["Attachment"]["Status"] == "attached" for e in enis)
    assert efa[0]["Groups"][0]["GroupId"] == net["sg"] and {"Key": "rtui:run", "Value": "r1"} in efa[0]["TagSet"]
    tagged = ec2.describe_network_interfaces(Filters=[{"Name": "tag:rtui:run", "Values": ["r1"]}])["NetworkInterfaces"]
    assert len(tagged) == 2
    eks.delete_nodegroup(clusterName="c1", nodegroupName="gpu")
    enis = ec2.describe_network_interfaces(Filters=[{"Name": "subnet-id", "Values": [net["a"]]}])["NetworkInterfaces"]
    assert len(enis) == 4 and {e["Status"] for e in enis} == {"available"}
    dependent: list[Callable[[], object]] = [
        lambda: ec2.delete_subnet(SubnetId=net["a"]),
        lambda: ec2.delete_security_group(GroupId=net["sg"]),
        lambda: ec2.delete_vpc(VpcId=net["vpc"]),
    ]
    for call in dependent:
        with pytest.raises(ClientError) as err:
            call()
        assert code(err) == "DependencyViolation"
    for eni in enis:
        ec2.delete_network_interface(NetworkInterfaceId=eni["NetworkInterfaceId"])
    ec2.delete_subnet(SubnetId=net["a"])
    ec2.delete_subnet(SubnetId=net["b"])
    igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=net["vpc"])
    for step in (lambda: None, lambda: ec2.delete_security_group(GroupId=net["sg"])):
        step()
        with pytest.raises(ClientError) as err:
            ec2.delete_vpc(VpcId=net["vpc"])
        assert code(err) == "DependencyViolation"
    ec2.detach_internet_gateway(InternetGatewayId=igw, VpcId=net["vpc"])
    with pytest.raises(ClientError) as err:  # EKS's cluster security group is still in the VPC
        ec2.delete_vpc(VpcId=net["vpc"])
    assert code(err) == "DependencyViolation"
    eks.delete_cluster(name="c1")  # goes at once (no timings): EKS deletes its group with it
    ec2.delete_vpc(VpcId=net["vpc"])


def test_the_cluster_security_group_is_real_and_only_on_nodes_whose_template_names_none(world: World) -> None:
    ec2, eks = client("ec2"), client("eks")
    net = network(ec2)
    made = cluster(eks, net)
    group_id = made["resourcesVpcConfig"]["clusterSecurityGroupId"]
    group = ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    assert group["GroupName"].startswith("eks-cluster-sg-c1-") and group["VpcId"] == net["vpc"]
    assert tags["aws:eks:cluster-name"] == "c1" and tags["kubernetes.io/cluster/c1"] == "owned"
    assert "rtui:run" not in tags  # the cluster's tags do not propagate
    assert [(p["IpProtocol"], [g["GroupId"] for g in p["UserIdGroupPairs"]], p.get("IpRanges"))
            for p in group["IpPermissions"]] == [("-1", [group_id], [])]
    assert any(r.get("CidrIp") == "0.0.0.0/0" for p in group["IpPermissionsEgress"] for r in p["IpRanges"])
    eks.create_nodegroup(clusterName="c1", nodegroupName="plain", nodeRole=ROLE, subnets=[net["b"]],
                         scalingConfig={"minSize": 1, "maxSize": 1, "desiredSize": 1})
    gpu_nodegroup(eks, net, efa_template(ec2, net["sg"]))
    enis = ec2.describe_network_interfaces(Filters=[{"Name": "vpc-id", "Values": [net["vpc"]]}])["NetworkInterfaces"]
    by_subnet = {(e["SubnetId"], tuple(g["GroupId"] for g in e["Groups"])) for e in enis}
    assert by_subnet == {(net["b"], (group_id,)), (net["a"], (net["sg"],))}


def test_insufficient_capacity(world: World) -> None:
    ec2, eks, asg = client("ec2"), client("eks"), client("autoscaling")
    net = network(ec2)
    lt = efa_template(ec2, net["sg"])
    world.script.ice_zones["g6.12xlarge"] = {"us-east-1a"}
    cluster(eks, net)
    gpu_nodegroup(eks, net, lt)
    ng = eks.describe_nodegroup(clusterName="c1", nodegroupName="gpu")["nodegroup"]
    [issue] = ng["health"]["issues"]
    name = ng["resources"]["autoScalingGroups"][0]["name"]
    assert ng["status"] == "CREATE_FAILED" and issue["code"] == "AsgInstanceLaunchFailures"
    assert "InsufficientInstanceCapacity" in issue["message"] and "(us-east-1a)" in issue["message"]
    assert issue["resourceIds"] == [name]
    [activity] = asg.describe_scaling_activities(AutoScalingGroupName=name)["Activities"]
    assert activity["StatusCode"] == "Failed" and "g6.12xlarge capacity" in activity["StatusMessage"]
    assert ec2.describe_network_interfaces()["NetworkInterfaces"] == []


def test_nat_gateway_lifecycle(world: World) -> None:
    ec2 = client("ec2")
    net = network(ec2)
    world.script.timings.nat_create = world.script.timings.nat_delete = 0.2
    eip = ec2.allocate_address(Domain="vpc", TagSpecifications=[{"ResourceType": "elastic-ip", "Tags": TAGS}])
    nat = ec2.create_nat_gateway(
        SubnetId=net["a"],
        AllocationId=eip["AllocationId"],
        TagSpecifications=[{"ResourceType": "natgateway", "Tags": TAGS}],
    )["NatGateway"]
    def state() -> str:
        return str(ec2.describe_nat_gateways(NatGatewayIds=[nat["NatGatewayId"]])["NatGateways"][0]["State"])

    assert state() == "pending"
    assert wait_for(state, "available") == "available"
    tagged = ec2.describe_nat_gateways(Filter=[{"Name": "tag:rtui:run", "Values": ["r1"]}])["NatGateways"]
    assert (
        len(tagged) == 1
        and not ec2.describe_nat_gateways(Filter=[{"Name": "tag:rtui:run", "Values": ["x"]}])["NatGateways"]
    )
    assert len(ec2.describe_addresses(Filters=[{"Name": "tag:rtui:run", "Values": ["r1"]}])["Addresses"]) == 1
    ec2.delete_nat_gateway(NatGatewayId=nat["NatGatewayId"])
    assert state() == "deleting"
    assert wait_for(state, "deleted") == "deleted"
    assert ec2.describe_network_interfaces()["NetworkInterfaces"] == []
    assert "AssociationId" not in ec2.describe_addresses()["Addresses"][0]


def test_launch_template_round_trip(world: World) -> None:
    ec2 = client("ec2")
    net = network(ec2)
    lt = efa_template(ec2, net["sg"])
    [version] = ec2.describe_launch_template_versions(LaunchTemplateId=lt)["LaunchTemplateVersions"]
    data = version["LaunchTemplateData"]
    assert data["NetworkInterfaces"] == [
        {"InterfaceType": "efa", "DeviceIndex": 0, "NetworkCardIndex": 0, "Groups": [net["sg"]]}
    ]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 200
    assert {s["ResourceType"] for s in data["TagSpecifications"]} == {"instance", "network-interface"}
    found = ec2.describe_launch_templates(Filters=[{"Name": "tag:rtui:run", "Values": ["r1"]}])["LaunchTemplates"]
    assert [t["LaunchTemplateId"] for t in found] == [lt]


def test_tag_filters_on_network_resources(world: World) -> None:
    ec2 = client("ec2")
    net = network(ec2)
    igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    rt = ec2.create_route_table(VpcId=net["vpc"])["RouteTable"]["RouteTableId"]
    ec2.create_tags(Resources=[net["vpc"], net["a"], net["sg"], igw, rt], Tags=TAGS)
    flt = [{"Name": "tag:rtui:run", "Values": ["r1"]}]
    assert len(ec2.describe_vpcs(Filters=flt)["Vpcs"]) == 1
    assert len(ec2.describe_subnets(Filters=flt)["Subnets"]) == 1
    assert len(ec2.describe_security_groups(Filters=flt)["SecurityGroups"]) == 1
    assert len(ec2.describe_internet_gateways(Filters=flt)["InternetGateways"]) == 1
    assert len(ec2.describe_route_tables(Filters=flt)["RouteTables"]) == 1


def test_iam_roles_with_path_and_tags(world: World) -> None:
    iam = client("iam")
    doc = '{"Version":"2012-10-17","Statement":[]}'
    iam.create_role(RoleName="eks", Path="/rtui/", AssumeRolePolicyDocument=doc, Tags=TAGS)
    iam.create_role(RoleName="other", AssumeRolePolicyDocument=doc)
    iam.attach_role_policy(RoleName="eks", PolicyArn="arn:aws:iam::aws:policy/AmazonEKSClusterPolicy")
    assert [r["RoleName"] for r in iam.list_roles(PathPrefix="/rtui/")["Roles"]] == ["eks"]
    assert sorted(iam.list_role_tags(RoleName="eks")["Tags"], key=str) == sorted(TAGS, key=str)
    attached = iam.list_attached_role_policies(RoleName="eks")["AttachedPolicies"]
    assert [p["PolicyName"] for p in attached] == ["AmazonEKSClusterPolicy"]


@pytest.mark.usefixtures("fast_backoff")
@pytest.mark.parametrize("service", ["ec2", "eks", "iam", "autoscaling", "sts"])
def test_transient_5xx_are_retried(world: World, service: str) -> None:
    world.script.error5xx_rate = 1.0
    world.script.throttle_max_attempt = 2
    calls = {
        "ec2": lambda c: c.describe_vpcs(),
        "eks": lambda c: c.list_clusters(),
        "iam": lambda c: c.list_roles(),
        "autoscaling": lambda c: c.describe_auto_scaling_groups(),
        "sts": lambda c: c.get_caller_identity(),
    }
    response = calls[service](client(service))
    assert response["ResponseMetadata"]["RetryAttempts"] == 2 and world.script.faulted == 2
    world.script.throttle_max_attempt = 9
    with pytest.raises(ClientError) as err:
        calls[service](client(service))
    assert code(err) in ("InternalError", "ServiceUnavailable")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] in (500, 503)


def test_an_access_entry_needs_the_role_arn_with_its_path(world: World) -> None:
    ec2, eks, iam = client("ec2"), client("eks"), client("iam")
    cluster(eks, network(ec2))
    arn = iam.create_role(RoleName="AWSReservedSSO_Admin_1", Path="/aws-reserved/sso.amazonaws.com/us-east-1/",
                          AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    for wrong in ("arn:aws:iam::123456789012:role/AWSReservedSSO_Admin_1", "arn:aws:iam::123456789012:role/nobody"):
        with pytest.raises(ClientError) as err:
            eks.create_access_entry(clusterName="c1", principalArn=wrong)
        assert code(err) == "InvalidParameterException"
        assert "The specified principalArn is invalid: invalid principal" in str(err.value)
    eks.create_access_entry(clusterName="c1", principalArn=arn)
    eks.associate_access_policy(clusterName="c1", principalArn=arn, accessScope={"type": "cluster"},
                                policyArn="arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy")
    assert eks.list_associated_access_policies(clusterName="c1", principalArn=arn)["associatedAccessPolicies"]


def test_a_client_token_reused_with_other_parameters_is_refused(world: World) -> None:
    ec2 = client("ec2")
    net = network(ec2)
    first = ec2.create_route_table(VpcId=net["vpc"], ClientToken="t-1")["RouteTable"]["RouteTableId"]
    again = ec2.create_route_table(VpcId=net["vpc"], ClientToken="t-1")["RouteTable"]["RouteTableId"]
    assert again == first  # the same request: the first answer, nothing made twice
    assert len(ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [net["vpc"]]}])["RouteTables"]) == 2
    other = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    with pytest.raises(ClientError) as err:
        ec2.create_route_table(VpcId=other, ClientToken="t-1")
    assert code(err) == "IdempotentParameterMismatch"


def test_reservations_take_only_the_instances_ec2_would_place_in_them(world: World) -> None:
    """moto_reservations: a targeted ODCR or a Capacity Block takes only instances that name it; a Capacity
    Block needs the capacity-block market and a CAPACITY_BLOCK nodegroup, which needs a launch template."""
    ec2, eks = client("ec2"), client("eks")
    net = network(ec2)
    world.script.ice_zones["g6.12xlarge"] = {"us-east-1a"}
    targeted = world.reserve(REGION, "us-east-1a", count=2, match="targeted")
    block = world.reserve(REGION, "us-east-1a", count=2, kind="capacity-block")
    cluster(eks, net)
    plain = efa_template(ec2, net["sg"])
    gpu_nodegroup(eks, net, plain, name="unnamed")  # names nothing: On-Demand, and the AZ has none
    ng = eks.describe_nodegroup(clusterName="c1", nodegroupName="unnamed")["nodegroup"]
    assert ng["status"] == "CREATE_FAILED" and "InsufficientInstanceCapacity" in ng["health"]["issues"][0]["message"]
    assert targeted["AvailableInstanceCount"] == 2 and block["AvailableInstanceCount"] == 2

    with pytest.raises(ClientError) as err:  # CAPACITY_BLOCK without a launch template
        eks.create_nodegroup(clusterName="c1", nodegroupName="nolt", nodeRole=ROLE, subnets=[net["a"]],
                             instanceTypes=["g6.12xlarge"], capacityType="CAPACITY_BLOCK",
                             scalingConfig={"minSize": 2, "maxSize": 2, "desiredSize": 2})
    assert code(err) == "InvalidParameterException"

    def template(name: str, data: dict[str, Any]) -> str:
        return str(ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData={
            "InstanceType": "g6.12xlarge", **data})["LaunchTemplate"]["LaunchTemplateId"])

    def nodegroup(name: str, lt: str, **extra: Any) -> dict[str, Any]:
        eks.create_nodegroup(clusterName="c1", nodegroupName=name, nodeRole=ROLE, subnets=[net["a"]],
                             scalingConfig={"minSize": 2, "maxSize": 2, "desiredSize": 2},
                             launchTemplate={"id": lt, "version": "1"}, **extra)
        return dict(eks.describe_nodegroup(clusterName="c1", nodegroupName=name)["nodegroup"])

    def target(cr: dict[str, Any]) -> dict[str, Any]:
        return {"CapacityReservationTarget": {"CapacityReservationId": cr["CapacityReservationId"]}}

    no_target = nodegroup("block-unnamed", template("b0", {}), capacityType="CAPACITY_BLOCK")
    assert no_target["status"] == "CREATE_FAILED" and "CAPACITY_BLOCK" in no_target["health"]["issues"][0]["message"]
    wrong_market = nodegroup("block-on-demand", template("b1", {"CapacityReservationSpecification": target(block)}))
    assert wrong_market["status"] == "CREATE_FAILED" and block["AvailableInstanceCount"] == 2
    named = nodegroup("odcr", template("o1", {"CapacityReservationSpecification": target(targeted)}))
    assert named["status"] == "ACTIVE" and targeted["AvailableInstanceCount"] == 0
    in_block = nodegroup("block", template("b2", {"CapacityReservationSpecification": target(block),
                                                  "InstanceMarketOptions": {"MarketType": "capacity-block"}}),
                         capacityType="CAPACITY_BLOCK")
    assert in_block["status"] == "ACTIVE" and block["AvailableInstanceCount"] == 0
    full = nodegroup("full", template("o2", {"CapacityReservationSpecification": target(targeted)}))
    assert full["status"] == "CREATE_FAILED" and "ReservationCapacityExceeded" in full["health"]["issues"][0]["message"]
    eks.delete_nodegroup(clusterName="c1", nodegroupName="odcr")
    # Gone (the double ticks on each call): its instances free their slots.
    assert wait_for(lambda: (eks.list_nodegroups(clusterName="c1"), targeted["AvailableInstanceCount"])[1], 2) == 2
