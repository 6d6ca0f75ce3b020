"""Where moto 5.2 is kinder than AWS on the points of issue 23 (nodes' credentials, the cluster's
API, its roles), made as strict as AWS. Each rule names the AWS document it copies.

- **Instance metadata options of the nodes.** EKS nodes are EC2 instances; ``DescribeInstances``
  reports each one's ``MetadataOptions``. The values come from the nodegroup's launch template
  where it sets them, else from the AMI: EKS's AL2023 AMIs are registered with ``ImdsSupport``
  ``v2.0``, which makes EC2 launch their instances with ``HttpTokens: required`` and
  ``HttpPutResponseHopLimit: 2`` (EC2 API reference, ``Image.ImdsSupport`` and
  ``LaunchTemplateInstanceMetadataOptionsRequest``; EC2 User Guide, "Order of precedence for
  instance metadata options": launch parameters, then the account default, then the AMI). A
  managed nodegroup without a launch template of its own gets one EKS generates, which sets no
  stricter hop limit (EKS User Guide, "Customize managed nodes with launch templates"). So such a
  node answers with hop limit 2: a pod, one hop further, can take the node role's credentials.
  The double answers ``DescribeInstances`` for the node instance IDs a nodegroup's Auto Scaling
  group lists (``moto_strict``); nodes are not in moto's instance table, so a describe without
  those IDs does not list them (a known gap; nothing in rtui lists nodes that way).
- **A nodegroup with a launch template reports no ``diskSize``.** The disk is the template's block
  device mapping then (EKS API reference, CreateNodegroup ``diskSize``: not given beside a launch
  template, which moto already refuses; ``Nodegroup.diskSize`` is absent in DescribeNodegroup for
  such a group). moto reported its default of 20 GB, so a reader of ``diskSize`` saw a disk that
  is not there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moto.core.responses import ActionResult
from moto.core.utils import utcnow
from moto.ec2.responses import EC2Response
from moto.eks.models import eks_backends
from moto.eks.responses import EKSResponse

Patch = Callable[[Any, str, Any], None]

# What EC2 gives an instance of an AMI with ImdsSupport v2.0 when nothing at launch says otherwise.
AMI_V2_METADATA = {"HttpTokens": "required", "HttpPutResponseHopLimit": 2, "HttpEndpoint": "enabled",
                   "HttpProtocolIpv6": "disabled", "InstanceMetadataTags": "disabled"}


def metadata_options(launch_template: dict[str, Any]) -> dict[str, Any]:
    """The instance's metadata options: the template's where it sets them, else the AMI's."""
    given = launch_template.get("MetadataOptions") or {}
    out = dict(AMI_V2_METADATA)
    for key in out:
        if given.get(key) not in (None, ""):
            out[key] = given[key]
    out["HttpPutResponseHopLimit"] = int(out["HttpPutResponseHopLimit"])
    return {"State": "applied", **out}


def _nodes(account: str, region: str) -> dict[str, dict[str, Any]]:
    """Instance ID -> what DescribeInstances says of it, for every node a nodegroup runs now."""
    from tests.aws.moto_strict import _instances, _live_nodegroups

    backend = eks_backends[account][region]
    out = {}
    for ng in _live_nodegroups(account, region):
        info = getattr(ng, "rtui_info", None) or {}
        lt = info.get("launch_template") or {}
        cluster = ng.cluster_name
        for i, instance_id in enumerate(_instances(ng)):
            subnets = info.get("subnets") or [None]
            out[instance_id] = {
                "InstanceId": instance_id, "InstanceType": info.get("instance_type"),
                "State": {"Code": 16, "Name": "running"}, "LaunchTime": utcnow(),
                "Placement": {"AvailabilityZone": info.get("zone") or "",
                              **({"GroupName": lt["Placement"]["GroupName"]}
                                 if (lt.get("Placement") or {}).get("GroupName") else {})},
                "SubnetId": subnets[i % len(subnets)],
                "IamInstanceProfile": {"Arn": f"arn:aws:iam::{backend.account_id}:instance-profile/eks-{ng.uuid}"},
                "MetadataOptions": metadata_options(lt),
                "Tags": [{"Key": "eks:cluster-name", "Value": cluster},
                         {"Key": "eks:nodegroup-name", "Value": ng.nodegroup_name}],
            }
    return out


def _describe_instances(original: Callable[[EC2Response], Any]) -> Callable[[EC2Response], Any]:
    def describe_instances(self: EC2Response) -> Any:
        asked = list(self._get_param("InstanceIds", []) or [])
        nodes = _nodes(self.current_account, self.region) if asked else {}
        ours = [nodes[i] for i in asked if i in nodes]
        if not ours:
            return original(self)
        if len(ours) != len(asked):  # nothing in rtui or its tests mixes nodes and other instances
            raise NotImplementedError("the double describes nodes and other instances in separate calls")
        return ActionResult({"Reservations": [{"ReservationId": "r-rtuinodes", "OwnerId": self.current_account,
                                               "Groups": [], "Instances": ours}]})

    return describe_instances


def _create_nodegroup(original: Callable[[EKSResponse], Any]) -> Callable[[EKSResponse], Any]:
    def create_nodegroup(self: EKSResponse) -> Any:
        result = original(self)
        if self._get_param("launchTemplate"):
            cluster = self.eks_backend.clusters[self._get_param("name")]
            cluster.nodegroups[self._get_param("nodegroupName")].disk_size = None
        return result

    return create_nodegroup


def install(patch: Patch) -> None:
    patch(EC2Response, "describe_instances", _describe_instances(EC2Response.describe_instances))
    patch(EKSResponse, "create_nodegroup", _create_nodegroup(EKSResponse.create_nodegroup))
