"""Can the run's pods and nodes reach each other? Answered from the security groups EC2 describes.

A packet from one network interface to another passes when an egress rule of one of the sender's
groups and an ingress rule of one of the receiver's groups both admit it (security groups are
stateful: the reply is always let back). A rule admits a peer by one of its groups
(``UserIdGroupPairs``) or by a CIDR holding its address (VPC User Guide, "Security group rules",
docs.aws.amazon.com/vpc/latest/userguide/security-group-rules.html). With the VPC CNI a pod's
address is a secondary address of one of its node's interfaces, so a pod has its node's groups.

``assert_reachable`` checks what a Ray job on the aws target needs, after every full ``up`` test:
a pod on a GPU node reaches the system node (the Ray head and CoreDNS) on TCP 6379 (GCS), 8265
(dashboard / Jobs API), 10001–19999 (Ray's workers and object manager) and TCP/UDP 53 (DNS),
the head reaches the GPU nodes on Ray's ports, and the GPU nodes reach each other on all traffic
through their EFA interfaces.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from functools import cache
from typing import Any

import boto3
import boto3.session

REGION = "us-east-1"
RAY_PORTS = [("tcp", 6379), ("tcp", 8265), ("tcp", 10001), ("tcp", 15000), ("tcp", 19999)]
DNS = [("udp", 53), ("tcp", 53)]


@dataclass(frozen=True)
class Interface:
    eni_id: str
    instance_id: str
    address: str
    groups: tuple[str, ...]
    efa: bool


def _admits(rule: dict[str, Any], protocol: str, port: int, peer_groups: tuple[str, ...], peer_ip: str) -> bool:
    proto = str(rule.get("IpProtocol"))
    if proto != "-1":
        if protocol == "-1" or proto not in (protocol, {"tcp": "6", "udp": "17"}[protocol]):
            return False
        if not int(rule.get("FromPort", 0)) <= port <= int(rule.get("ToPort", 65535)):
            return False
    if any(pair.get("GroupId") in peer_groups for pair in rule.get("UserIdGroupPairs") or []):
        return True
    address = ipaddress.ip_address(peer_ip)
    return any(address in ipaddress.ip_network(r["CidrIp"]) for r in rule.get("IpRanges") or [])


def can_reach(groups: dict[str, dict[str, Any]], source: Interface, target: Interface, protocol: str,
              port: int = 0) -> bool:
    """``protocol`` "tcp"/"udp" with a port, or "-1" for all traffic (every protocol and port)."""
    out = any(_admits(rule, protocol, port, target.groups, target.address)
              for gid in source.groups for rule in groups[gid].get("IpPermissionsEgress") or [])
    into = any(_admits(rule, protocol, port, source.groups, source.address)
               for gid in target.groups for rule in groups[gid].get("IpPermissions") or [])
    return out and into


def interfaces(ec2: Any, vpc_id: str) -> list[Interface]:
    enis = ec2.describe_network_interfaces(Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])["NetworkInterfaces"]
    return [Interface(e["NetworkInterfaceId"], (e.get("Attachment") or {}).get("InstanceId", ""),
                      e["PrivateIpAddress"], tuple(g["GroupId"] for g in e.get("Groups") or []),
                      e.get("InterfaceType") == "efa")
            for e in enis if (e.get("Attachment") or {}).get("InstanceId")]


def _client(service: str) -> Any:
    """A client made once per service and identity: making one costs ~50 ms of CPU, and ``problems`` runs
    after every ``up`` of the aws tests."""
    return _made(service, *(os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                         "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL")))


@cache
def _made(service: str, key: str | None, secret: str | None, token: str | None, endpoint: str | None) -> Any:
    return boto3.session.Session(aws_access_key_id=key, aws_secret_access_key=secret,
                                 aws_session_token=token).client(service, region_name=REGION, endpoint_url=endpoint)


def problems(cluster: str = "rtui-ray") -> list[str]:
    """What the Ray job could not reach, in words (empty when everything is reachable)."""
    eks, ec2 = _client("eks"), _client("ec2")
    vpc_id = eks.describe_cluster(name=cluster)["cluster"]["resourcesVpcConfig"]["vpcId"]
    groups = {g["GroupId"]: g for g in ec2.describe_security_groups(
        Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])["SecurityGroups"]}
    found = interfaces(ec2, vpc_id)
    gpu_ids = {i.instance_id for i in found if i.efa}  # a GPU node has EFA interfaces, the system node none
    system_ids = {i.instance_id for i in found} - gpu_ids
    pods: dict[str, Interface] = {}  # the interface whose secondary addresses the node's pods use
    for i in sorted(found, key=lambda i: i.efa):
        pods.setdefault(i.instance_id, i)
    out = []
    if not gpu_ids or not system_ids:
        out.append(f"nodes not found (GPU: {len(gpu_ids)}, system: {len(system_ids)})")
    for gpu in sorted(gpu_ids):
        for system in sorted(system_ids):
            for protocol, port in [*RAY_PORTS, *DNS]:
                if not can_reach(groups, pods[gpu], pods[system], protocol, port):
                    out.append(f"GPU pod on {gpu} -> system node {system}: {protocol}/{port} refused")
            for protocol, port in RAY_PORTS:
                if not can_reach(groups, pods[system], pods[gpu], protocol, port):
                    out.append(f"head on {system} -> GPU pod on {gpu}: {protocol}/{port} refused")
    efa = [i for i in found if i.efa]
    for a in efa:
        for b in efa:
            if a.instance_id != b.instance_id and not can_reach(groups, a, b, "-1"):
                out.append(f"EFA {a.eni_id} ({a.instance_id}) -> {b.eni_id} ({b.instance_id}): all traffic refused")
    return out


def assert_reachable(cluster: str = "rtui-ray") -> None:
    found = problems(cluster)
    assert not found, "the run's security groups would block the Ray job:\n" + "\n".join(found)
