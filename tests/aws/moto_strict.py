"""Where moto 5.2 is kinder than AWS on the points of issue 20 (items 4-11), made as strict as AWS.

Each rule names the AWS document or upstream source it copies. Patched on top of
``moto_provision``'s wrappers (``install`` takes its ``patch`` so ``uninstall`` undoes it).

- **CreateCluster subnets** (item 4, 5). EKS answers ``UnsupportedAvailabilityZoneException``
  (HTTP 400, with ``validZones``) when a cluster subnet lies in an AZ whose *zone ID* has no EKS
  control-plane capacity (use1-az3, usw1-az2, cac1-az3), and ``InvalidParameterException``
  "Subnets specified must be in at least two different AZs" for fewer than two AZs.
  References: the EKS API reference, ``CreateCluster`` errors and the
  ``UnsupportedAvailabilityZoneException`` shape (botocore ``data/eks/2017-11-01/service-2.json``);
  EKS User Guide, "View Amazon EKS networking requirements for VPC and subnets" (subnet
  requirements: at least two subnets in different AZs; the zone IDs above cannot host them).
  Nodegroup subnets are not checked against those zone IDs: the restriction is the control
  plane's (same guide: nodes may run in those AZs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moto.core.responses import ActionResult
from moto.ec2.models import ec2_backends
from moto.eks.exceptions import EKSError, InvalidParameterException
from moto.eks.responses import EKSResponse

Patch = Callable[[Any, str, Any], None]
EKS_CONTROL_PLANE_REJECTED_ZONE_IDS = frozenset({"use1-az3", "usw1-az2", "cac1-az3"})


class UnsupportedAvailabilityZoneException(EKSError):
    TYPE = "UnsupportedAvailabilityZoneException"
    STATUS = 400


def _zones(account: str, region: str) -> list[tuple[str, str]]:
    ec2 = ec2_backends[account][region]
    return [(z.name, z.zone_id) for z in ec2.describe_availability_zones()]


def check_cluster_subnets(account: str, region: str, name: str, subnet_ids: list[str]) -> None:
    """Raise what EKS raises for control-plane subnets it cannot use."""
    ec2 = ec2_backends[account][region]
    ids = {zone: zid for zone, zid in _zones(account, region)}
    azs = []
    for subnet_id in subnet_ids:
        zone = ec2.get_subnet(subnet_id).availability_zone
        if zone not in azs:
            azs.append(zone)
    bad = [z for z in azs if ids.get(z) in EKS_CONTROL_PLANE_REJECTED_ZONE_IDS]
    if bad:
        valid = sorted(z for z, zid in ids.items() if zid not in EKS_CONTROL_PLANE_REJECTED_ZONE_IDS)
        raise UnsupportedAvailabilityZoneException(
            clusterName=name,
            message=f"Cannot create cluster '{name}' because {bad[0]}, the targeted availability zone, does not "
            "currently have sufficient capacity to support the cluster. Retry and choose from these "
            f"availability zones: {', '.join(valid)}",
            validZones=valid,
        )
    if len(azs) < 2:
        raise InvalidParameterException(
            clusterName=name, message="Subnets specified must be in at least two different AZs"
        )


def _strict_create_cluster(original: Callable[[EKSResponse], ActionResult]) -> Callable[[EKSResponse], ActionResult]:
    def create_cluster(self: EKSResponse) -> ActionResult:
        config = self._get_param("resourcesVpcConfig") or {}
        subnets = list(config.get("subnetIds") or [])
        if subnets:  # moto's own check (no subnets at all) stays moto's
            check_cluster_subnets(self.current_account, self.region, self._get_param("name"), subnets)
        return original(self)

    return create_cluster


def install(patch: Patch) -> None:
    patch(EKSResponse, "create_cluster", _strict_create_cluster(EKSResponse.create_cluster))

