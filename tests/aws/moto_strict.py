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
- **Partial capacity** (item 6). A managed nodegroup's Auto Scaling group launches what it can
  and EKS marks the nodegroup ``CREATE_FAILED`` (``AsgInstanceLaunchFailures``) while the
  instances it did launch keep running (EKS User Guide, "Troubleshoot ... managed node groups",
  AsgInstanceLaunchFailures; the ASG is not rolled back). Here a failed GPU nodegroup keeps
  ``desired - 1`` instances (at least one when it asked for two or more), shown by
  ``DescribeAutoScalingGroups`` for the nodegroup's ASG until the nodegroup is deleted.
- **Placement groups in use** (item 6). ``DeletePlacementGroup`` answers
  ``InvalidPlacementGroup.InUse`` while an instance runs in the group (EC2 API reference, "Error
  codes": InvalidPlacementGroup.InUse; EC2 User Guide, "Delete a placement group": terminate or
  move its instances first). An instance is in the group while its nodegroup (whose launch
  template names the group) has instances: ACTIVE, CREATE_FAILED with instances, or DELETING.
- **Idempotency tokens** (item 6). EKS refuses a ``clientRequestToken`` outside 33..126
  characters with ``InvalidParameterException`` "The client request token parameter must be
  between 33 and 126 characters." (the EKS answer quoted in ansible-collections/community.aws
  PR #844). EC2 refuses a ``ClientToken`` over the operation's maximum (64 ASCII characters;
  128 for CreateLaunchTemplate: botocore's EC2 model docs) and, for a token reused with other
  parameters, answers ``IdempotentParameterMismatch`` (EC2 developer guide, "Ensuring
  idempotency"). EKS documents no answer for a reused token with other parameters; the double
  applies EC2's documented rule to it (``InvalidParameterException``), the strict reading.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from typing import Any

from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import ActionResult
from moto.core.utils import utcnow
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models import ec2_backends
from moto.ec2.responses import EC2Response
from moto.eks.exceptions import EKSError, InvalidParameterException
from moto.eks.models import EKSBackend, Nodegroup, eks_backends
from moto.eks.responses import EKSResponse

from tests.aws import moto_asg

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


# --- partial capacity and placement groups in use ------------------------------------------


def _instances(ng: Nodegroup) -> list[str]:
    """The instances a nodegroup's Auto Scaling group runs now (a deleting one: until it is gone)."""
    if ng.status not in ("ACTIVE", "UPDATING", "DELETING", "CREATE_FAILED"):
        return []
    return list((getattr(ng, "rtui_info", None) or {}).get("instance_ids") or [])


def _live_nodegroups(account: str, region: str) -> list[Nodegroup]:
    backend: EKSBackend = eks_backends[account][region]
    return [ng for cluster in backend.clusters.values() for ng in cluster.nodegroups.values()]


def _fail_capacity(original: Callable[..., None]) -> Callable[..., None]:
    def fail_capacity(backend: EKSBackend, ng: Nodegroup, info: dict[str, Any]) -> None:
        original(backend, ng, info)
        launched = max(0, info["desired_size"] - 1)
        partial = [f"i-{uuid.uuid4().hex[:17]}" for _ in range(launched)]
        vars(ng).update(rtui_partial=partial, rtui_info={**info, "instance_ids": list(partial)})

    return fail_capacity


def _describe_auto_scaling_groups(original: Callable[[AutoScalingResponse], ActionResult]
                                  ) -> Callable[[AutoScalingResponse], ActionResult]:
    def describe_auto_scaling_groups(self: AutoScalingResponse) -> ActionResult:
        names = self._get_param("AutoScalingGroupNames", [])
        ours = []
        for ng in _live_nodegroups(self.current_account, self.region):
            info = getattr(ng, "rtui_info", None) or {}
            asg = moto_asg.asg_name(ng)
            if names and asg not in names:
                continue
            zone = info.get("zone") or ""
            size = int(ng.scaling_config.get("desiredSize", 0))
            ours.append({
                "AutoScalingGroupName": asg, "MinSize": int(ng.scaling_config.get("minSize", 0)),
                "MaxSize": int(ng.scaling_config.get("maxSize", size)), "DesiredCapacity": size,
                "DefaultCooldown": 300, "AvailabilityZones": list(info.get("zones") or []),
                "HealthCheckType": "EC2", "CreatedTime": utcnow(), "Tags": moto_asg.asg_tags(ng),
                # EKS opts a Spot nodegroup's group in to Capacity Rebalancing (EKS User Guide, "Managed node
                # group capacity types": it replaces a Spot node on its rebalance recommendation, then cordons
                # and drains the old one); an On-Demand group has no use for it.
                "CapacityRebalance": ng.capacity_type == "SPOT",
                "Instances": [{"InstanceId": i, "InstanceType": info.get("instance_type"), "AvailabilityZone": zone,
                               "LifecycleState": "InService", "HealthStatus": "Healthy",
                               "ProtectedFromScaleIn": False} for i in _instances(ng)],
            })
        if names and len(ours) == len(names):
            return ActionResult({"AutoScalingGroups": ours})
        found = original(self)
        theirs = found.result
        if not ours or not isinstance(theirs, dict):
            return found
        return ActionResult({**theirs, "AutoScalingGroups": [*ours, *theirs["AutoScalingGroups"]]})

    return describe_auto_scaling_groups


def _delete_placement_group(original: Callable[[EC2Response], Any]) -> Callable[[EC2Response], Any]:
    def delete_placement_group(self: EC2Response) -> Any:
        name = self._get_param("GroupName")
        for ng in _live_nodegroups(self.current_account, self.region):
            template = (getattr(ng, "rtui_info", None) or {}).get("launch_template") or {}
            if (template.get("Placement") or {}).get("GroupName") == name and _instances(ng):
                raise EC2ClientError("InvalidPlacementGroup.InUse",
                                     f"The placement group '{name}' is in use and may not be deleted.")
        result: Any = original(self)
        return result

    return delete_placement_group


# --- idempotency tokens ----------------------------------------------------------------------

EC2_TOKEN_MAX = {"CreateLaunchTemplate": 128}  # else 64


def _fingerprint(params: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()


def _seen(backend: Any) -> dict[tuple[str, str], str]:
    seen: dict[tuple[str, str], str] = backend.__dict__.setdefault("rtui_tokens", {})
    return seen


def _eks_tokens(original: Callable[[EKSResponse], Any]) -> Callable[[EKSResponse], Any]:
    def create(self: EKSResponse) -> Any:
        body = json.loads(self.body) if self.body else {}
        token = body.get("clientRequestToken")
        if token is not None:
            if not 33 <= len(token) <= 126:
                raise InvalidParameterException(
                    message="The client request token parameter must be between 33 and 126 characters.")
            params = {"path": self.path, **{k: v for k, v in body.items() if k != "clientRequestToken"}}
            seen = _seen(eks_backends[self.current_account][self.region])
            key, print_ = (self.path, token), _fingerprint(params)
            if seen.setdefault(key, print_) != print_:
                raise InvalidParameterException(
                    message=f"The client request token {token} was already used with other parameters.")
        return original(self)

    return create


def _ec2_tokens(action: str, original: Callable[[EC2Response], Any]) -> Callable[[EC2Response], Any]:
    def create(self: EC2Response) -> Any:
        token = self._get_param("ClientToken")
        if token:
            limit = EC2_TOKEN_MAX.get(action, 64)
            if len(token) > limit:
                raise EC2ClientError("InvalidParameterValue",
                                     f"Value ({token}) for parameter clientToken is invalid. "
                                     f"Length exceeds maximum of {limit} characters.")
            params = {k: v for k, v in self.querystring.items() if k not in ("ClientToken", "Version")}
            seen = _seen(ec2_backends[self.current_account][self.region])
            key, print_ = (action, token), _fingerprint(params)
            if seen.setdefault(key, print_) != print_:
                raise EC2ClientError("IdempotentParameterMismatch",
                                     f"Client token {token} was already used with other parameters.")
        return original(self)

    return create


def install(patch: Patch) -> None:
    from tests.aws import moto_provision, moto_provision_ec2

    patch(EKSResponse, "create_cluster", _strict_create_cluster(EKSResponse.create_cluster))
    patch(moto_provision, "_fail_capacity", _fail_capacity(moto_provision._fail_capacity))
    patch(AutoScalingResponse, "describe_auto_scaling_groups",
          _describe_auto_scaling_groups(AutoScalingResponse.describe_auto_scaling_groups))
    moto_asg.install(patch)
    patch(EC2Response, "delete_placement_group", _delete_placement_group(moto_provision_ec2.delete_placement_group))
    for name in ("create_cluster", "create_nodegroup", "create_addon", "create_access_entry"):
        patch(EKSResponse, name, _eks_tokens(getattr(EKSResponse, name)))
    for action, name in (("CreateLaunchTemplate", "create_launch_template"), ("CreateNatGateway", "create_nat_gateway"),
                         ("CreateFleet", "create_fleet"), ("RunInstances", "run_instances")):
        patch(EC2Response, name, _ec2_tokens(action, getattr(EC2Response, name)))

