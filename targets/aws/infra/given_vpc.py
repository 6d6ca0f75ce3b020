"""``--vpc-id``: what EKS needs of a VPC rtui did not make. Read only: rtui never changes that VPC.

- **DNS.** The VPC needs both DNS resolution (``enableDnsSupport``) and DNS hostnames
  (``enableDnsHostnames``), or its nodes cannot register with the cluster (EKS User Guide, "View Amazon
  EKS networking requirements for VPC and subnets"). CreateVpc leaves hostnames off, so a hand-made VPC
  often lacks them. ModifyVpcAttribute takes one attribute per call and turns hostnames on only once
  resolution is on: the remedy names resolution first.
- **A way out.** The nodes pull images (ECR, and public registries such as registry.k8s.io for
  cluster-autoscaler) and reach EKS, STS and S3. Whatever a private subnet's default route leads to
  serves, as long as it is not an internet gateway: a NAT gateway, a transit gateway, a NAT instance
  (a route to an instance or its network interface), a Gateway Load Balancer or firewall endpoint
  (described with the endpoint's id in ``GatewayId``), a peering, a virtual private gateway, a Cloud WAN
  core network. A default route to an internet gateway makes the subnet public (VPC User Guide,
  "Subnet types"). No default route, or one whose target is gone (``blackhole``), leaves no way to the
  public registries even where interface endpoints serve the AWS APIs: refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backend.errors import OperationError, UserError
from targets.aws.infra.api import AwsApi

DEFAULT_ROUTE = "0.0.0.0/0"
# The Route fields that name a target, most telling first: a NAT instance's route names the instance
# and its interface, and the instance is what its owner recognises.
_TARGETS = (("NatGatewayId", "NAT gateway"), ("TransitGatewayId", "transit gateway"),
            ("InstanceId", "NAT instance"), ("NetworkInterfaceId", "network interface"),
            ("VpcPeeringConnectionId", "VPC peering"), ("CoreNetworkArn", "Cloud WAN core network"),
            ("LocalGatewayId", "local gateway"), ("CarrierGatewayId", "carrier gateway"))
_GATEWAYS = (("vpce-", "endpoint"), ("vgw-", "virtual private gateway"))
_ANY_TARGET = "a NAT gateway, transit gateway, NAT instance or firewall endpoint"


class GivenVpcRefused(UserError):
    """The VPC of ``--vpc-id`` lacks what EKS needs (preflight reports it as the VPC's check)."""


@dataclass(frozen=True)
class Egress:
    subnet_id: str
    az: str
    via: str  # "transit gateway tgw-…"

    def __str__(self) -> str:
        return f"{self.subnet_id} ({self.az}) via {self.via}"


def default_egress(routes: Sequence[Mapping[str, Any]]) -> tuple[str | None, str]:
    """How a route table's default route leads out: ``(via, "")``, or ``(None, why it does not)``."""
    default = next((r for r in routes if r.get("DestinationCidrBlock") == DEFAULT_ROUTE), None)
    if default is None:
        return None, f"has no default route ({DEFAULT_ROUTE})"
    target = _target(default)
    if target is None:
        return None, f"has a default route to nothing rtui knows ({dict(default)})"
    if target.startswith("igw-"):
        return None, f"is public: its default route goes to the internet gateway {target}"
    state = default.get("State", "active")
    if state != "active":
        return None, f"has a default route to {target} in state {state} (its target is gone)"
    for prefix, label in _GATEWAYS:
        if target.startswith(prefix):
            return f"{label} {target}", ""
    label = next((label for key, label in _TARGETS if default.get(key) == target), "gateway")
    return f"{label} {target}", ""


def _target(route: Mapping[str, Any]) -> str | None:
    for key, _ in _TARGETS:
        if route.get(key):
            return str(route[key])
    gateway = route.get("GatewayId")
    return str(gateway) if gateway and gateway != "local" else None


async def check_given_vpc(api: AwsApi, vpc_id: str, subnet_ids: Sequence[str]) -> list[Egress]:
    """Refuse (one line, the fix named) a VPC without DNS or a private subnet without a private way out;
    else how each subnet leads out, for the plan to say."""
    await _check_dns(api, vpc_id)
    try:
        subnets = await api.pages("ec2", "describe_subnets", "Subnets", SubnetIds=list(subnet_ids))
        tables = await api.pages("ec2", "describe_route_tables", "RouteTables",
                                 Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])
    except OperationError as exc:
        raise GivenVpcRefused(f"cannot read the routes of {vpc_id}: {exc.message}",
                              remedy="check --vpc-id, --private-subnet-ids and the region") from None
    # A subnet with no table of its own uses the VPC's main route table.
    main = next((t for t in tables if any(a.get("Main") for a in t.get("Associations") or [])), None)
    out = []
    for subnet in sorted(subnets, key=lambda s: str(s["SubnetId"])):
        sid = str(subnet["SubnetId"])
        table = next((t for t in tables if any(a.get("SubnetId") == sid for a in t.get("Associations") or [])), main)
        via, why = default_egress((table or {}).get("Routes") or [])
        if via is None:
            raise GivenVpcRefused(
                f"--private-subnet-ids: {sid} ({subnet['AvailabilityZone']}) {why}",
                remedy=f"pass private subnets of {vpc_id} whose default route goes to {_ANY_TARGET} in "
                       "--private-subnet-ids (rtui never changes your route tables), or drop --vpc-id")
        out.append(Egress(sid, str(subnet["AvailabilityZone"]), via))
    return out


async def _check_dns(api: AwsApi, vpc_id: str) -> None:
    for attribute, key, name in (("enableDnsSupport", "EnableDnsSupport", "DNS resolution"),
                                 ("enableDnsHostnames", "EnableDnsHostnames", "DNS hostnames")):
        try:
            answer = await api.call("ec2", "describe_vpc_attribute", VpcId=vpc_id, Attribute=attribute)
        except OperationError as exc:
            raise GivenVpcRefused(f"cannot read {attribute} of {vpc_id}: {exc.message}",
                                  remedy="check --vpc-id and the region, and that you may call "
                                         "ec2:DescribeVpcAttribute") from None
        if not (answer.get(key) or {}).get("Value"):
            flag = "--enable-dns-support" if attribute == "enableDnsSupport" else "--enable-dns-hostnames"
            raise GivenVpcRefused(
                f"{vpc_id} has {name} off: EKS nodes in it cannot register with the cluster",
                remedy=f"turn it on with `aws ec2 modify-vpc-attribute --vpc-id {vpc_id} {flag} "
                       "'{\"Value\":true}'` (rtui never changes your VPC), or drop --vpc-id")


def egress_note(vpc_id: str, egress: Sequence[Egress]) -> str:
    """One line of the plan: how each given private subnet leads out."""
    return f"{vpc_id}: the private subnets lead out through {'; '.join(map(str, egress))} (yours, unchanged)"
