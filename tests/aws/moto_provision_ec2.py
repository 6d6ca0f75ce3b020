"""What moto 5.2's EC2 lacks for provisioning, added in-process.

- Placement groups (Create/Describe/Delete), kept on the EC2 backend (``rtui_pgs``).
- NAT gateways go ``pending`` -> ``available`` and ``deleting`` -> ``deleted`` in real seconds
  (``SCRIPT.timings``); a deleted one loses its ENI and EIP association and is still described
  for ``nat_deleted_visible`` seconds. DescribeNatGateways honours ``tag:KEY``/``tag-key``.
- DependencyViolation like AWS: DeleteSubnet while an ENI is in it, DeleteSecurityGroup while an
  ENI uses it, DeleteVpc while non-default security groups or attached internet gateways remain.
- CreateLaunchTemplate no longer copies the template's own tags into its LaunchTemplateData.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, cast

from moto.core.responses import ActionResult, EmptyResult
from moto.ec2.exceptions import DependencyViolationError, EC2ClientError
from moto.ec2.models import EC2Backend, ec2_backends
from moto.ec2.models.nat_gateways import NatGateway
from moto.ec2.responses import EC2Response

from tests.aws.moto_ext import SCRIPT

Patcher = Callable[[Any, str, Any], None]


def _pgs(backend: EC2Backend) -> dict[str, dict[str, Any]]:
    pgs: dict[str, dict[str, Any]] = vars(backend).setdefault("rtui_pgs", {})
    return pgs


def _filters(response: EC2Response) -> dict[str, list[str]]:
    """The request's filters; moto annotates ``_filters_from_querystring`` as ``dict[str, str]`` but each value
    is the list of the filter's ``Values``."""
    return cast(dict[str, list[str]], response._filters_from_querystring())


def _tags_match(tags: dict[str, str], filters: dict[str, list[str]]) -> bool:
    for name, values in filters.items():
        if name.startswith("tag:") and tags.get(name[4:]) not in values:
            return False
        if name == "tag-key" and not set(values) & set(tags):
            return False
    return True


# --- placement groups ------------------------------------------------------------------------


def create_placement_group(self: EC2Response) -> ActionResult:
    name = self._get_param("GroupName")
    groups = _pgs(self.ec2_backend)
    if name in groups:
        raise EC2ClientError("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
    tags = self._parse_tag_specification().get("placement-group", {})
    gid = f"pg-{uuid.uuid4().hex[:17]}"
    group: dict[str, Any] = {
        "GroupName": name,
        "GroupId": gid,
        "GroupArn": f"arn:aws:ec2:{self.region}:{self.current_account}:placement-group/{name}",
        "State": "available",
        "Strategy": self._get_param("Strategy") or "cluster",
        "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
    }
    if self._get_param("PartitionCount"):
        group["PartitionCount"] = int(self._get_param("PartitionCount"))
    if self._get_param("SpreadLevel"):
        group["SpreadLevel"] = self._get_param("SpreadLevel")
    groups[name] = group
    return ActionResult({"PlacementGroup": group})


def describe_placement_groups(self: EC2Response) -> ActionResult:
    groups = _pgs(self.ec2_backend)
    names = self._get_param("GroupNames", [])
    ids = self._get_param("GroupIds", [])
    for name in names:
        if name not in groups:
            raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
    known_ids = {g["GroupId"] for g in groups.values()}
    for gid in ids:
        if gid not in known_ids:
            raise EC2ClientError(
                "InvalidPlacementGroupId.Malformed" if not gid.startswith("pg-") else "InvalidPlacementGroup.Unknown",
                f"The Placement Group '{gid}' is unknown.",
            )
    filters = _filters(self)
    found = []
    for group in groups.values():
        tags = {t["Key"]: t["Value"] for t in group["Tags"]}
        if names and group["GroupName"] not in names or ids and group["GroupId"] not in ids:
            continue
        if "group-name" in filters and group["GroupName"] not in filters["group-name"]:
            continue
        if "strategy" in filters and group["Strategy"] not in filters["strategy"]:
            continue
        if "state" in filters and group["State"] not in filters["state"]:
            continue
        if _tags_match(tags, filters):
            found.append(group)
    return ActionResult({"PlacementGroups": found})


def delete_placement_group(self: EC2Response) -> ActionResult:
    name = self._get_param("GroupName")
    if _pgs(self.ec2_backend).pop(name, None) is None:
        raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
    return EmptyResult()


# --- NAT gateways ----------------------------------------------------------------------------


def tick_ec2(account: str, region: str) -> None:
    """Advance NAT gateways by elapsed time (called before every EC2, EKS and autoscaling call)."""
    backend = ec2_backends[account][region]
    now, t = time.monotonic(), SCRIPT.timings
    for nat in list(backend.nat_gateways.values()):
        age = now - float(getattr(nat, "rtui_since", 0.0))
        if nat.state == "pending" and age >= t.nat_create:
            nat.state = "available"
        elif nat.state == "deleting" and age >= t.nat_delete:
            _finish_nat_delete(backend, nat)
        elif nat.state == "deleted" and age >= t.nat_delete + t.nat_deleted_visible:
            backend.nat_gateways.pop(nat.id, None)


def _finish_nat_delete(backend: EC2Backend, nat: NatGateway) -> None:
    nat.state = "deleted"
    eni = backend.enis.pop(nat._eni.id, None)
    if eni is not None:
        for address in backend.addresses:
            if address.eni is eni:
                address.eni, address.association_id = None, None


def _create_nat_gateway(original: Callable[..., NatGateway]) -> Callable[..., NatGateway]:
    def create_nat_gateway(self: EC2Backend, *args: Any, **kwargs: Any) -> NatGateway:
        nat = original(self, *args, **kwargs)
        vars(nat)["rtui_since"] = time.monotonic()
        if SCRIPT.timings.nat_create > 0:
            nat.state = "pending"
        return nat

    return create_nat_gateway


def _delete_nat_gateway(self: EC2Backend, nat_gateway_id: str) -> NatGateway:
    nat = self.nat_gateways.get(nat_gateway_id)
    if nat is None:
        raise EC2ClientError("NatGatewayNotFound", f"The Nat Gateway {nat_gateway_id} was not found")
    if nat.state in ("pending", "available", "failed"):
        nat.state = "deleting"
        vars(nat)["rtui_since"] = time.monotonic()
        if SCRIPT.timings.nat_delete <= 0:
            _finish_nat_delete(self, nat)
    return nat


def _describe_nat_gateways(original: Callable[..., list[NatGateway]]) -> Callable[..., list[NatGateway]]:
    def describe_nat_gateways(self: EC2Backend, filters: Any, nat_gateway_ids: list[str] | None) -> list[NatGateway]:
        found = original(self, filters, nat_gateway_ids)
        tag_filters = {k: v for k, v in (filters or {}).items() if k.startswith("tag:") or k == "tag-key"}
        if tag_filters:
            found = [n for n in found if _tags_match({t["key"]: t["value"] for t in n.get_tags()}, tag_filters)]
        return found

    return describe_nat_gateways


# --- DependencyViolation ---------------------------------------------------------------------


def _delete_subnet(original: Callable[..., Any]) -> Callable[..., Any]:
    def delete_subnet(self: EC2Backend, subnet_id: str) -> Any:
        if any(eni.subnet.id == subnet_id for eni in self.enis.values()):
            raise DependencyViolationError(f"The subnet '{subnet_id}' has dependencies and cannot be deleted.")
        return original(self, subnet_id)

    return delete_subnet


def _delete_security_group(original: Callable[..., Any]) -> Callable[..., Any]:
    def delete_security_group(self: EC2Backend, name: str | None = None, group_id: str | None = None) -> Any:
        group = self.get_security_group_by_name_or_id(group_id or name or "")
        if group is not None and any(group in eni._group_set for eni in self.enis.values()):
            raise DependencyViolationError(f"resource {group.id} has a dependent object")
        return original(self, name=name, group_id=group_id)

    return delete_security_group


def _delete_vpc(original: Callable[..., Any]) -> Callable[..., Any]:
    def delete_vpc(self: EC2Backend, vpc_id: str) -> Any:
        groups = [g for g in self.groups.get(vpc_id, {}).values() if g.name != "default"]
        igws = [i for i in self.internet_gateways.values() if i.vpc is not None and i.vpc.id == vpc_id]
        if groups or igws:
            raise DependencyViolationError(f"The vpc '{vpc_id}' has dependencies and cannot be deleted.")
        return original(self, vpc_id)

    return delete_vpc


def _create_launch_template(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_launch_template(
        self: EC2Backend, name: str, description: str, data: dict[str, Any], tag_spec: dict[str, Any]
    ) -> Any:
        # moto copies the template's own tags (ResourceType launch-template) into its data.
        specs = [s for s in data.get("TagSpecifications") or [] if s.get("ResourceType") != "launch-template"]
        data = (
            {**data, "TagSpecifications": specs}
            if specs
            else {k: v for k, v in data.items() if k != "TagSpecifications"}
        )
        return original(self, name, description, data, tag_spec)

    return create_launch_template


def install(patch: Patcher) -> Callable[[], None]:
    """Apply the EC2 patches through ``patch`` (which records how to undo them)."""
    patch(EC2Response, "create_placement_group", create_placement_group)
    patch(EC2Response, "describe_placement_groups", describe_placement_groups)
    patch(EC2Response, "delete_placement_group", delete_placement_group)
    patch(EC2Backend, "create_nat_gateway", _create_nat_gateway(EC2Backend.create_nat_gateway))
    patch(EC2Backend, "delete_nat_gateway", _delete_nat_gateway)
    patch(EC2Backend, "describe_nat_gateways", _describe_nat_gateways(EC2Backend.describe_nat_gateways))
    patch(EC2Backend, "delete_subnet", _delete_subnet(EC2Backend.delete_subnet))
    patch(EC2Backend, "delete_security_group", _delete_security_group(EC2Backend.delete_security_group))
    patch(EC2Backend, "delete_vpc", _delete_vpc(EC2Backend.delete_vpc))
    patch(EC2Backend, "create_launch_template", _create_launch_template(EC2Backend.create_launch_template))
    return lambda: None
