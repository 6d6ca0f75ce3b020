"""A managed nodegroup's Auto Scaling group as AWS keeps it, where moto 5.2 has none (issue 26).

moto's EKS names an ASG for each nodegroup (``resources.autoScalingGroups``) but its autoscaling
backend holds no such group: tagging it raised a KeyError and no tag was ever read back. Here the
group is the nodegroup's (``moto_strict`` already describes it), with:

- **Its tags.** EKS tags the group it makes with the cluster-autoscaler discovery tags
  (``k8s.io/cluster-autoscaler/enabled``, ``k8s.io/cluster-autoscaler/<cluster>``) and its own
  ``eks:cluster-name``/``eks:nodegroup-name`` (EKS User Guide, "Managed node groups": managed node
  group resources are tagged for the Cluster Autoscaler), but never with the nodegroup's own
  ``tags``: "Tags that you create for Amazon EKS resources don't propagate to any other resources"
  (EKS API reference, TagResource and CreateNodegroup ``tags``; aws/containers-roadmap#608, the
  open request to tag the ASG). ``CreateOrUpdateTags`` on the group adds or overwrites tags,
  ``DeleteTags`` removes them, a group that does not exist is a ``ValidationError`` (Auto Scaling
  API reference, CreateOrUpdateTags, DeleteTags); ``DescribeTags`` and
  ``DescribeAutoScalingGroups`` show them. They go with the group when the nodegroup is deleted.
- **Its size.** ``SetDesiredCapacity`` (what cluster-autoscaler calls) outside ``MinSize..MaxSize``
  answers ``ValidationError`` ("New SetDesiredCapacity value N is below min value M for the
  AutoScalingGroup." / "above max value"; Auto Scaling API reference, SetDesiredCapacity); inside,
  it changes the group's desired capacity, which EKS then reports as the nodegroup's
  ``scalingConfig.desiredSize`` (EKS User Guide, "Managed node groups": the nodegroup's scaling
  config and its ASG are the same numbers; cluster-autoscaler changes the ASG directly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moto.autoscaling.exceptions import ValidationError
from moto.autoscaling.models import AutoScalingBackend
from moto.eks.models import Nodegroup, eks_backends

Patch = Callable[[Any, str, Any], None]


def _nodegroups(account: str, region: str) -> dict[str, Nodegroup]:
    backend = eks_backends[account][region]
    return {asg_name(ng): ng
            for cluster in backend.clusters.values() for ng in cluster.nodegroups.values()}


def eks_tags(ng: Nodegroup) -> dict[str, str]:
    """What EKS itself puts on the nodegroup's group."""
    return {"eks:cluster-name": ng.cluster_name, "eks:nodegroup-name": ng.nodegroup_name,
            "k8s.io/cluster-autoscaler/enabled": "true", f"k8s.io/cluster-autoscaler/{ng.cluster_name}": "owned",
            f"kubernetes.io/cluster/{ng.cluster_name}": "owned"}


def _held(ng: Nodegroup) -> dict[str, str]:
    """The group's tags, kept on the nodegroup (they go when it goes): EKS's own to start with."""
    held: dict[str, str] = ng.__dict__.setdefault("rtui_asg_tags", eks_tags(ng))
    return held


def asg_name(ng: Nodegroup) -> str:
    """The name of the Auto Scaling group moto's EKS names for a nodegroup."""
    groups: list[dict[str, str]] = vars(ng)["resources"]["autoScalingGroups"]
    return groups[0]["name"]


def asg_tags(ng: Nodegroup) -> list[dict[str, Any]]:
    """The group's tags as the Auto Scaling API returns them."""
    asg = asg_name(ng)
    return [{"ResourceId": asg, "ResourceType": "auto-scaling-group", "Key": k, "Value": v,
             "PropagateAtLaunch": True} for k, v in sorted(_held(ng).items())]


def _split(backend: AutoScalingBackend, tags: list[dict[str, Any]]) -> tuple[list[tuple[Nodegroup, dict[str, Any]]],
                                                                            list[dict[str, Any]]]:
    """The tags on nodegroups' groups, and the rest (moto's own groups; an unknown group is refused
    as AWS does, not with moto's KeyError)."""
    ours = _nodegroups(backend.account_id, backend.region_name)
    mine, rest = [], []
    for tag in tags:
        ng = ours.get(tag.get("ResourceId", ""))
        if ng is not None:
            mine.append((ng, tag))
        elif tag.get("ResourceId") in backend.autoscaling_groups:
            rest.append(tag)
        else:
            raise ValidationError("AutoScalingGroup name not found - null")
    return mine, rest


def _create_or_update_tags(original: Callable[..., None]) -> Callable[..., None]:
    def create_or_update_tags(self: AutoScalingBackend, tags: list[dict[str, Any]]) -> None:
        mine, rest = _split(self, tags)
        for ng, tag in mine:
            _held(ng)[tag["Key"]] = tag.get("Value", "")
        if rest:
            original(self, rest)

    return create_or_update_tags


def _delete_tags(original: Callable[..., None]) -> Callable[..., None]:
    def delete_tags(self: AutoScalingBackend, tags: list[dict[str, Any]]) -> None:
        mine, rest = _split(self, tags)
        for ng, tag in mine:
            _held(ng).pop(tag["Key"], None)
        if rest:
            original(self, rest)

    return delete_tags


def _describe_tags(original: Callable[..., list[dict[str, Any]]]) -> Callable[..., list[dict[str, Any]]]:
    def describe_tags(self: AutoScalingBackend, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        tags = [t for ng in _nodegroups(self.account_id, self.region_name).values() for t in asg_tags(ng)]
        for f in filters:
            values = list(f.get("Values") or [])
            field = {"auto-scaling-group": "ResourceId", "key": "Key", "value": "Value"}.get(f["Name"])
            if field:
                tags = [t for t in tags if t[field] in values]
        return [*tags, *original(self, filters)]

    return describe_tags


def _set_desired_capacity(original: Callable[..., None]) -> Callable[..., None]:
    def set_desired_capacity(self: AutoScalingBackend, group_name: str, desired_capacity: int | None) -> None:
        ng = _nodegroups(self.account_id, self.region_name).get(group_name)
        if ng is None:
            return original(self, group_name, desired_capacity)
        low, high = int(ng.scaling_config.get("minSize", 0)), int(ng.scaling_config.get("maxSize", 0))
        size = low if desired_capacity is None else int(desired_capacity)
        if size < low:
            raise ValidationError(f"New SetDesiredCapacity value {size} is below min value {low} for the "
                                  "AutoScalingGroup.")
        if size > high:
            raise ValidationError(f"New SetDesiredCapacity value {size} is above max value {high} for the "
                                  "AutoScalingGroup.")
        ng.scaling_config = {**ng.scaling_config, "desiredSize": size}
        return None

    return set_desired_capacity


def install(patch: Patch) -> None:
    patch(AutoScalingBackend, "create_or_update_tags", _create_or_update_tags(AutoScalingBackend.create_or_update_tags))
    patch(AutoScalingBackend, "delete_tags", _delete_tags(AutoScalingBackend.delete_tags))
    patch(AutoScalingBackend, "describe_tags", _describe_tags(AutoScalingBackend.describe_tags))
    patch(AutoScalingBackend, "set_desired_capacity", _set_desired_capacity(AutoScalingBackend.set_desired_capacity))
