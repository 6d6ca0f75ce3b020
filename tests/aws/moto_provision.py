"""What moto 5.2 lacks for provisioning an EKS cluster, added in-process (EKS side).

- EKS add-ons and access entries (new routes and response methods), ``accessConfig`` and the
  ``resourcesVpcConfig`` defaults AWS reports, endpoint/CA overrides from ``SCRIPT``.
- Lifecycles in real seconds (``SCRIPT.timings``): clusters, nodegroups and add-ons go
  CREATING -> ACTIVE and DELETING -> gone, evaluated lazily whenever EKS, EC2 or autoscaling is
  called (no threads). Nodegroups whose instance type is in ``SCRIPT.ice_zones`` for their AZ get a
  failed scaling activity at once (while CREATING) and end CREATE_FAILED with EKS's health issue
  ``timings.capacity_verdict`` later (moto_activities), unless their instances land
  in capacity reservations as EC2 would place them (``moto_reservations``: open ODCRs, targeted
  ODCRs and Capacity Blocks named by the launch template).
- When a nodegroup turns ACTIVE it leaves ENIs (CNI, and EFA when its launch template asks),
  detached but not deleted when it goes, and calls ``SCRIPT.on_nodegroup_active``/``_deleted``.
EC2 (placement groups, NAT lifecycle, DependencyViolation) lives in ``moto_provision_ec2``.
State lives on moto's backend objects, so ``/moto-api/reset`` clears it; ``Script.reset`` the rest.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote

from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import ActionResult
from moto.core.utils import utcnow
from moto.ec2.models import ec2_backends
from moto.ec2.models import instance_types as moto_instance_types
from moto.ec2.responses import EC2Response
from moto.eks import urls as eks_urls
from moto.eks.exceptions import InvalidParameterException, ResourceInUseException, ResourceNotFoundException
from moto.eks.models import Cluster, EKSBackend, Nodegroup, eks_backends
from moto.eks.responses import EKSResponse
from moto.iam.aws_managed_policies import aws_managed_policies_data
from moto.iam.exceptions import MalformedPolicyDocument
from moto.iam.models import AWSManagedPolicy, IAMBackend, iam_backends

from tests.aws import (
    moto_activities,
    moto_asg,
    moto_enis,
    moto_leftovers,
    moto_provision_ec2,
    moto_reservations,
    moto_s3,
    moto_security,
    moto_strict,
)
from tests.aws import moto_provision_api as api
from tests.aws.moto_ext import SCRIPT

LOCK = threading.RLock()
Patch = tuple[Any, str, Any]


def _since(obj: Any) -> float:
    return float(getattr(obj, "rtui_since", 0.0))


def _start(obj: Any, status: str) -> None:
    obj.status = status
    obj.rtui_since = time.monotonic()


def not_found(message: str) -> ResourceNotFoundException:
    return ResourceNotFoundException(
        clusterName=None, nodegroupName=None, fargateProfileName=None, addonName=None, message=message
    )


def in_use(message: str) -> ResourceInUseException:
    return ResourceInUseException(clusterName=None, nodegroupName=None, addonName=None, message=message)


# --- lazy lifecycles -------------------------------------------------------------------------


def tick(account: str, region: str) -> None:
    """Advance every scripted transition in this account and region; then run the hooks."""
    hooks: list[Callable[[], None]] = []
    with LOCK:
        moto_provision_ec2.tick_ec2(account, region)
        backend: EKSBackend = eks_backends[account][region]
        now, t = time.monotonic(), SCRIPT.timings
        for cluster in list(backend.clusters.values()):
            age = now - _since(cluster)
            if cluster.status == "CREATING" and age >= t.cluster_create and cluster.name not in SCRIPT.held:
                cluster.status = "ACTIVE"
            for ng in list(cluster.nodegroups.values()):
                hooks += _tick_nodegroup(backend, cluster, ng, now)
            addons: dict[str, dict[str, Any]] = getattr(cluster, "rtui_addons", {})
            for name, addon in list(addons.items()):
                addon_age = now - addon["rtui_since"]
                if addon["status"] == "CREATING" and addon_age >= t.addon_create:
                    api.settle_addon(addon)
                elif addon["status"] == "DELETING" and addon_age >= t.addon_delete:
                    del addons[name]
            if cluster.status == "DELETING" and age >= t.cluster_delete:
                _delete_cluster_security_group(account, region, cluster)
                backend.clusters.pop(cluster.name, None)
                backend.cluster_count -= 1
    for hook in hooks:
        hook()


def _tick_nodegroup(backend: EKSBackend, cluster: Cluster, ng: Nodegroup, now: float) -> list[Callable[[], None]]:
    t = SCRIPT.timings
    age = now - _since(ng)
    hooks: list[Callable[[], None]] = []
    if ng.status == "CREATING":
        # Its Auto Scaling group tries to launch at once; EKS says how that went only later.
        info, invalid, refused, short = vars(ng).get("rtui_launch") or _launch(backend, ng)
        if age < t.nodegroup_create + (t.capacity_verdict if short else 0.0) or ng.nodegroup_name in SCRIPT.held:
            return hooks
        if invalid or refused:
            _fail_launch(ng, info, str(invalid or refused))
        elif short:
            _fail_capacity(backend, ng, info)
        else:
            ng.status = "ACTIVE"
            info["instance_ids"] = _leave_enis(backend, cluster, ng, info)
            vars(ng)["rtui_info"] = info
            moto_activities.launched(backend.account_id, backend.region_name, info["asg"], info["instance_ids"],
                                     started=moto_activities.started_at(age), before=0)
            if SCRIPT.on_nodegroup_active is not None:
                hook = SCRIPT.on_nodegroup_active
                hooks.append(lambda: hook(cluster.name, ng.nodegroup_name, info))
    elif ng.status == "DELETING" and age >= t.nodegroup_delete:
        cluster.nodegroups.pop(ng.nodegroup_name, None)
        cluster.nodegroup_count -= 1
        _detach_enis(backend, ng)
        moto_reservations.give_back(backend.region_name, ng)
        last: dict[str, Any] | None = getattr(ng, "rtui_info", None)
        if last is not None and last.get("instance_ids"):
            moto_activities.terminated(backend.account_id, backend.region_name, last["asg"], last["instance_ids"],
                                       before=len(last["instance_ids"]), cause="a user request to delete the group")
        if last is not None and SCRIPT.on_nodegroup_deleted is not None:
            gone = SCRIPT.on_nodegroup_deleted
            hooks.append(lambda: gone(cluster.name, ng.nodegroup_name, last))
    return hooks


def _launch(backend: EKSBackend, ng: Nodegroup) -> tuple[dict[str, Any], str | None, str | None, bool]:
    """The group's first launch: its info, why EC2 refuses it, and whether capacity ran short (then the
    failed activity is written now, while the nodegroup is CREATING: moto_activities)."""
    info = nodegroup_info(backend, ng)
    spot = info["capacity_type"] == "SPOT"  # Spot capacity runs short apart from On-Demand's
    short_of = SCRIPT.spot_ice_zones if spot else SCRIPT.ice_zones

    def dry(instance_type: str) -> bool:
        return bool(info["zones"]) and all(zone in short_of.get(instance_type, set()) for zone in info["zones"])

    if spot:
        # A Spot group of several types launches from the pools that have capacity (EKS User Guide,
        # "Managed node group capacity types": Spot groups use a capacity-optimized allocation strategy
        # across their instance types); On-Demand ones take the types in order ("prioritized"), the first.
        info["instance_type"] = next((t for t in info["instance_types"] if not dry(t)), info["instance_types"][0])
    invalid = _invalid_interfaces(info)
    reserved, refused = (0, None) if invalid else moto_reservations.draw(backend.region_name, ng, info)
    short = (not invalid and not refused and reserved < info["desired_size"] and dry(info["instance_type"]))
    if short:
        moto_activities.failed_launch(backend.account_id, backend.region_name, info["asg"], _ice_message(info))
    vars(ng)["rtui_launch"] = (info, invalid, refused, short)
    return info, invalid, refused, short


def _launch_template(backend: EKSBackend, ng: Nodegroup) -> dict[str, Any]:
    ref = ng.launch_template or {}
    if "id" not in ref:
        return {}
    ec2 = ec2_backends[backend.account_id][backend.region_name]
    template = ec2.launch_templates.get(ref["id"])
    if template is None:
        return {}
    return dict(template.get_version(ref.get("version", "$Default")).data)


def nodegroup_info(backend: EKSBackend, ng: Nodegroup) -> dict[str, Any]:
    """What a fake control plane needs to register the nodegroup's nodes."""
    ec2 = ec2_backends[backend.account_id][backend.region_name]
    lt = _launch_template(backend, ng)
    types = list(ng.instance_types or []) or [lt.get("InstanceType", "t3.medium")]
    zones = []
    for subnet_id in ng.subnets or []:
        zone = ec2.get_subnet(subnet_id).availability_zone
        if zone not in zones:
            zones.append(zone)
    return {
        "labels": dict(ng.labels or {}),
        "taints": list(ng.taints or []),
        "instance_type": types[0],
        "instance_types": types,
        "desired_size": int(ng.scaling_config.get("desiredSize", 0)),
        "zone": zones[0] if zones else None,
        "zones": zones,
        "subnets": list(ng.subnets or []),
        "asg": moto_asg.asg_name(ng),
        "launch_template": lt,
        "capacity_type": ng.capacity_type,
    }


def _invalid_interfaces(info: dict[str, Any]) -> str | None:
    """Why EC2 would refuse the launch template's interfaces on this instance type (None: it would not).

    EC2 User Guide, "Network cards" and "Maximize network bandwidth on instances with multiple network
    cards" (efa-acc-inst-types): the primary interface is on network card 0 at device index 0, a card
    index must be below ``MaximumNetworkCards``, a device index is used once per card, and an instance
    takes at most ``EfaInfo.MaximumEfaInterfaces`` EFA interfaces."""
    nics = (info["launch_template"] or {}).get("NetworkInterfaces") or []
    if not nics:
        return None
    network = moto_instance_types.INSTANCE_TYPES.get(info["instance_type"], {}).get("NetworkInfo") or {}
    cards = int(network.get("MaximumNetworkCards") or 1)
    slots = [(int(n.get("NetworkCardIndex", 0)), int(n.get("DeviceIndex", 0))) for n in nics]
    efa = sum(1 for n in nics if n.get("InterfaceType") == "efa")
    if (0, 0) not in slots:
        return "InvalidParameterValue: the primary network interface must be at network card 0, device index 0"
    if len(set(slots)) != len(slots):
        return "InvalidParameterValue: a device index is used twice on one network card"
    if max(card for card, _ in slots) >= cards:
        return f"InvalidParameterValue: network card index out of range ({info['instance_type']} has {cards})"
    if efa > int((network.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or 0):
        return f"InvalidParameterCombination: {info['instance_type']} does not take {efa} EFA interfaces"
    return None


def _fail_launch(ng: Nodegroup, info: dict[str, Any], why: str) -> None:
    ng.status = "CREATE_FAILED"
    ng.health = {"issues": [{"code": "AsgInstanceLaunchFailures", "message": f"{why}. Launching EC2 instance failed.",
                             "resourceIds": [info["asg"]]}]}


def _ice_message(info: dict[str, Any]) -> str:
    if info.get("capacity_type") == "SPOT":
        # EC2's answer to a Spot launch it has no capacity for (RunInstances/CreateFleet error
        # InsufficientInstanceCapacity, "There is no Spot capacity available that matches your request.",
        # as Spot users' logs quote it), in the group's activity wording.
        return ("Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available "
                "that matches your request. Launching EC2 instance failed.")
    return ("Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have "
            f"sufficient {info['instance_type']} capacity in the Availability Zone you requested ({info['zone']}). "
            "Our system will be working on provisioning additional capacity. You can currently get capacity by "
            "not specifying an Availability Zone in your request or choosing a different Availability Zone. "
            "Launching EC2 instance failed.")


def _fail_capacity(backend: EKSBackend, ng: Nodegroup, info: dict[str, Any]) -> None:
    """EKS's verdict on a group that found no capacity (its failed activity was written at launch)."""
    ng.status = "CREATE_FAILED"
    ng.health = {"issues": [{"code": "AsgInstanceLaunchFailures", "message": _ice_message(info),
                             "resourceIds": [info["asg"]]}]}


def _attach(eni: Any, instance_id: str, account: str, device_index: int) -> None:
    eni.instance = SimpleNamespace(id=instance_id, owner_id=account, security_groups=[], nics={})
    eni.attachment_id = f"eni-attach-{uuid.uuid4().hex[:17]}"
    eni.attach_time = utcnow()
    eni.device_index = device_index
    eni.status = "in-use"


def _leave_enis(backend: EKSBackend, cluster: Cluster, ng: Nodegroup, info: dict[str, Any]) -> list[str]:
    ec2 = ec2_backends[backend.account_id][backend.region_name]
    lt = info["launch_template"]
    nics = lt.get("NetworkInterfaces") or []
    efa = [nic for nic in nics if nic.get("InterfaceType") == "efa"]
    # EKS User Guide, "Customize managed nodes with launch templates" (launch-templates.html): the
    # cluster security group is added to a node only when its launch template names no groups.
    lt_groups = list(dict.fromkeys([g for nic in nics for g in nic.get("Groups", [])]
                                   or list(lt.get("SecurityGroupIds", []))))
    cluster_group = cluster.resources_vpc_config.get("clusterSecurityGroupId")
    groups = lt_groups or ([cluster_group] if cluster_group else [])
    nic_tags: dict[str, str] = {}
    for spec in lt.get("TagSpecifications") or []:
        if spec.get("ResourceType") == "network-interface":
            nic_tags.update({tag["Key"]: tag["Value"] for tag in spec.get("Tags", [])})
    ids, enis = [], []
    for i in range(info["desired_size"]):
        subnet = ng.subnets[i % len(ng.subnets)]
        instance_id = f"i-{uuid.uuid4().hex[:17]}"
        ids.append(instance_id)
        cni = ec2.create_network_interface(
            subnet,
            [],
            group_ids=groups or None,
            description=f"aws-K8S-{instance_id}",
            tags={"cluster.k8s.amazonaws.com/name": cluster.name, "node.k8s.amazonaws.com/instance_id": instance_id},
        )
        _attach(cni, instance_id, backend.account_id, 1)
        enis.append(cni.id)
        for spec in efa:  # one EFA interface per one the template asks for (one per network card)
            nic = ec2.create_network_interface(
                subnet, [], group_ids=groups or None, description="", tags=dict(nic_tags)
            )
            nic.interface_type = "efa"
            vars(nic)["rtui_card"] = int(spec.get("NetworkCardIndex", 0))
            _attach(nic, instance_id, backend.account_id, int(spec.get("DeviceIndex", 0)))
            enis.append(nic.id)
    vars(ng)["rtui_enis"] = enis
    return ids


def _detach_enis(backend: EKSBackend, ng: Nodegroup) -> None:
    ec2 = ec2_backends[backend.account_id][backend.region_name]
    for eni_id in getattr(ng, "rtui_enis", []):
        eni = ec2.enis.get(eni_id)
        if eni is not None:
            eni.instance, eni.attachment_id, eni.attach_time, eni.status = None, None, None, "available"


# --- patched moto methods --------------------------------------------------------------------


def _ticking(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def call_action(self: Any) -> Any:
        if self.region:
            tick(self.current_account, self.region)
        return original(self)

    return call_action


# The service principals IAM takes in a trust policy, per partition: each service's own name, which in
# aws-cn is ``ec2.amazonaws.com.cn`` but ``eks.amazonaws.com`` (eksctl pkg/apis/eksctl.io/v1alpha5/
# partitions.go; terraform-provider-aws names.ServicePrincipalNameForPartition, from aws-cdk's
# region-info). IAM refuses another with ``MalformedPolicyDocument: Invalid principal in policy:
# "SERVICE":"eks.amazonaws.com.cn"`` (the error users of terraform-aws-eks met in cn-north-1).
# EKS Pod Identity's principal is ``pods.eks.amazonaws.com`` in every partition (EKS User Guide, "Create IAM
# role with trust policy required by EKS Pod Identity", the same in its aws-cn edition).
SERVICE_PRINCIPALS = {"aws": {"ec2.amazonaws.com", "eks.amazonaws.com", "pods.eks.amazonaws.com"},
                      "aws-us-gov": {"ec2.amazonaws.com", "eks.amazonaws.com", "pods.eks.amazonaws.com"},
                      "aws-cn": {"ec2.amazonaws.com.cn", "ec2.amazonaws.com", "eks.amazonaws.com",
                                 "pods.eks.amazonaws.com"}}


def _trusted_services(document: str) -> list[str]:
    policy = json.loads(unquote(document))
    statements = policy.get("Statement") or []
    services: list[str] = []
    for statement in statements if isinstance(statements, list) else [statements]:
        named = (statement.get("Principal") or {}).get("Service") or []
        services += [named] if isinstance(named, str) else list(named)
    return services


def _create_role(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_role(self: IAMBackend, *args: Any, **kwargs: Any) -> Any:
        document = kwargs.get("assume_role_policy_document", args[1] if len(args) > 1 else "{}")
        known = SERVICE_PRINCIPALS.get(self.partition, SERVICE_PRINCIPALS["aws"])
        for service in _trusted_services(document):
            if service.endswith((".amazonaws.com", ".amazonaws.com.cn")) and service not in known:
                raise MalformedPolicyDocument(f'Invalid principal in policy: "SERVICE":"{service}"')
        role = original(self, *args, **kwargs)
        role.rtui_created = time.monotonic()
        return role

    return create_role


def _propagating(self: EKSResponse, role_arn: str | None, message: str) -> None:
    """IAM is eventually consistent: for a while after CreateRole, EKS's CreateCluster and
    CreateNodegroup refuse the new role with InvalidParameterException (IAM User Guide, "Changes that
    I make are not always immediately visible"; the messages terraform-provider-aws retries on,
    internal/service/eks/cluster.go: "does not exist", "Role could not be assumed because the
    trusted entity is not correct", "The provided role doesn't have the Amazon EKS Managed
    Policies associated with it")."""
    iam = iam_backends[self.current_account][getattr(self, "partition", "aws")]
    role = next((r for r in iam.roles.values() if r.arn == role_arn), None)
    created = getattr(role, "rtui_created", None)
    if created is not None and time.monotonic() - created < SCRIPT.timings.iam_propagation:
        raise InvalidParameterException(clusterName=None, nodegroupName=None, fargateProfileName=None,
                                        addonName=None, message=message.format(arn=role_arn))


def _create_cluster(original: Callable[[EKSResponse], ActionResult]) -> Callable[[EKSResponse], ActionResult]:
    def create_cluster(self: EKSResponse) -> ActionResult:
        _propagating(self, self._get_param("roleArn"), "Role with arn: {arn}, could not be assumed because the "
                     "trusted entity is not correct. Please ensure that the trust policy allows eks.amazonaws.com")
        if self._get_param("capacityType") == "CAPACITY_BLOCK" and not self._get_param("launchTemplate"):
            # EKS User Guide, capacity-blocks-mng: such a nodegroup is made only with a launch template.
            raise InvalidParameterException(clusterName=None, nodegroupName=None, fargateProfileName=None,
                                            addonName=None, message="Capacity type CAPACITY_BLOCK requires a "
                                            "launch template")
        result = original(self)
        cluster = self.eks_backend.clusters[self._get_param("name")]
        access = self._get_param("accessConfig") or {}
        vars(cluster)["access_config"] = {
            "authenticationMode": access.get("authenticationMode", "CONFIG_MAP"),
            "bootstrapClusterCreatorAdminPermissions": access.get("bootstrapClusterCreatorAdminPermissions", True),
        }
        vpc = dict(cluster.resources_vpc_config or {})
        subnets = vpc.get("subnetIds") or []
        ec2 = ec2_backends[self.current_account][self.region]
        vpc.setdefault("securityGroupIds", [])
        vpc.setdefault("endpointPublicAccess", True)
        vpc.setdefault("endpointPrivateAccess", False)
        vpc.setdefault("publicAccessCidrs", ["0.0.0.0/0"])
        if subnets and "vpcId" not in vpc:
            vpc["vpcId"] = ec2.get_subnet(subnets[0]).vpc_id
        if vpc.get("vpcId"):
            vpc["clusterSecurityGroupId"] = _cluster_security_group(ec2, cluster.name, vpc["vpcId"]).id
        cluster.resources_vpc_config = vpc
        vars(cluster).update(rtui_addons={}, rtui_access={})
        _start(cluster, "CREATING" if SCRIPT.timings.cluster_create > 0 else "ACTIVE")
        return result

    return create_cluster


def _cluster_security_group(ec2: Any, name: str, vpc_id: str) -> Any:
    """The security group EKS makes for every cluster, as AWS documents it (EKS User Guide,
    "View Amazon EKS security group requirements for clusters", docs.aws.amazon.com/eks/latest/
    userguide/sec-group-reqs.html): named ``eks-cluster-sg-<cluster>-<id>``, tagged
    ``aws:eks:cluster-name`` and ``kubernetes.io/cluster/<cluster>: owned``; inbound all traffic
    from itself only, outbound all traffic anywhere. The cluster's own tags do not propagate to it
    (CreateCluster API reference, ``tags``). EKS puts managed nodes in it only when their launch
    template names no security group (``_leave_enis``)."""
    group_name = f"eks-cluster-sg-{name}-{uuid.uuid4().int % 10**10:010d}"
    group = ec2.create_security_group(
        group_name,
        "EKS created security group applied to ENI that is attached to EKS Control Plane master nodes, "
        "as well as any managed workloads.",
        vpc_id,
        tags={"aws:eks:cluster-name": name, f"kubernetes.io/cluster/{name}": "owned", "Name": group_name},
    )
    ec2.authorize_security_group_ingress(group.id, "-1", None, None, [], source_groups=[{"GroupId": group.id}])
    return group


def _delete_cluster_security_group(account: str, region: str, cluster: Cluster) -> None:
    """EKS deletes the cluster security group with the cluster, but not while a network interface still
    uses it, and sometimes not at all (``SCRIPT.leave_cluster_sg``): the group then stays in the VPC."""
    group_id = (cluster.resources_vpc_config or {}).get("clusterSecurityGroupId")
    ec2 = ec2_backends[account][region]
    group = ec2.get_security_group_from_id(group_id) if group_id else None
    if group is None or SCRIPT.leave_cluster_sg or any(group in eni._group_set for eni in ec2.enis.values()):
        return
    ec2._delete_security_group(group.vpc_id, group.id)


def _describe_cluster(original: Callable[..., Cluster]) -> Callable[..., Cluster]:
    def describe_cluster(self: EKSBackend, name: str) -> Cluster:
        cluster = original(self, name)
        endpoint, ca = SCRIPT.cluster_endpoints.get(name, (SCRIPT.cluster_endpoint, SCRIPT.cluster_ca))
        if endpoint:
            cluster.endpoint = endpoint
        if ca:
            cluster.certificate_authority = {"data": ca}
        return cluster

    return describe_cluster


def _delete_cluster(original: Callable[..., Cluster]) -> Callable[..., Cluster]:
    def delete_cluster(self: EKSBackend, name: str) -> Cluster:
        cluster = self.clusters.get(name)
        if cluster is None or cluster.status == "DELETING":
            return original(self, name) if cluster is None else cluster
        if cluster.nodegroups:
            raise in_use("Cluster has nodegroups attached")
        _start(cluster, "DELETING")
        for addon in getattr(cluster, "rtui_addons", {}).values():
            addon["status"] = "DELETING"
        tick(self.account_id, self.region_name)
        return cluster

    return delete_cluster


def _create_nodegroup(original: Callable[[EKSResponse], ActionResult]) -> Callable[[EKSResponse], ActionResult]:
    def create_nodegroup(self: EKSResponse) -> ActionResult:
        _propagating(self, self._get_param("nodeRole"), "The provided role doesn't have the Amazon EKS Managed "
                     "Policies associated with it. Please ensure the following policies [arn:aws:iam::aws:policy/"
                     "AmazonEKSWorkerNodePolicy, arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly] are "
                     "attached")
        if self._get_param("capacityType") == "CAPACITY_BLOCK" and not self._get_param("launchTemplate"):
            # EKS User Guide, capacity-blocks-mng: such a nodegroup is made only with a launch template.
            raise InvalidParameterException(clusterName=None, nodegroupName=None, fargateProfileName=None,
                                            addonName=None, message="Capacity type CAPACITY_BLOCK requires a "
                                            "launch template")
        result = original(self)
        cluster = self.eks_backend.clusters[self._get_param("name")]
        ng = cluster.nodegroups[self._get_param("nodegroupName")]
        ng.scaling_config = dict(ng.scaling_config)  # moto shares its default dicts between nodegroups
        ng.health = {"issues": []}
        if not self._get_param("instanceTypes") and ng.launch_template:
            vars(ng)["instance_types"] = None  # AWS reports none when the launch template names the type
        _start(ng, "CREATING")
        tick(self.current_account, self.region)
        return result

    return create_nodegroup


def _delete_nodegroup(original: Callable[..., Nodegroup]) -> Callable[..., Nodegroup]:
    def delete_nodegroup(self: EKSBackend, cluster_name: str, nodegroup_name: str) -> Nodegroup:
        cluster = self.clusters.get(cluster_name)
        ng = cluster.nodegroups.get(nodegroup_name) if cluster else None
        if ng is None:
            return original(self, cluster_name, nodegroup_name)
        if ng.status != "DELETING":
            _start(ng, "DELETING")
        tick(self.account_id, self.region_name)
        return ng

    return delete_nodegroup


ROUTES = {  # added to moto's EKS URL map before the server builds its app
    "{0}/clusters/(?P<name>[^/]+)/addons$": "addons",
    "{0}/clusters/(?P<name>[^/]+)/addons/(?P<addonName>[^/]+)$": "addon",
    "{0}/clusters/(?P<name>[^/]+)/addons/(?P<addonName>[^/]+)/update$": "addon-update",
    "{0}/addons/supported-versions$": "addon-versions",
    "{0}/clusters/(?P<name>[^/]+)/access-entries$": "access-entries",
    "{0}/clusters/(?P<name>[^/]+)/access-entries/(?P<rest>.+)$": "access-entry",
}


# The AWS managed policies rtui attaches. moto can load all ~1,400 (MOTO_IAM_LOAD_MANAGED_POLICIES),
# but it then parses them again at every reset: ~3 s per test. These few are all a test needs.
NEEDED_POLICIES = ("AmazonEKSClusterPolicy", "AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy",
                   "AmazonEC2ContainerRegistryReadOnly", "AmazonEC2ContainerRegistryPullOnly",
                   "AmazonSSMManagedInstanceCore")


@functools.cache
def _policy_data() -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(aws_managed_policies_data)
    return {name: parsed[name] for name in NEEDED_POLICIES}


def _needed_aws_policies(self: IAMBackend) -> list[Any]:
    return [AWSManagedPolicy.from_data(name, self.account_id, self.region_name, data)
            for name, data in _policy_data().items()]


def install_provisioning() -> Callable[[], None]:
    """Patch moto for provisioning (EKS and EC2); returns the function that undoes it."""
    patches: list[Patch] = []

    def patch(obj: Any, name: str, value: Any) -> None:
        patches.append((obj, name, obj.__dict__.get(name, _MISSING)))
        setattr(obj, name, value)

    patch(EKSResponse, "create_cluster", _create_cluster(EKSResponse.create_cluster))
    patch(EKSResponse, "create_nodegroup", _create_nodegroup(EKSResponse.create_nodegroup))
    patch(EKSBackend, "describe_cluster", _describe_cluster(EKSBackend.describe_cluster))
    patch(EKSBackend, "delete_cluster", _delete_cluster(EKSBackend.delete_cluster))
    patch(EKSBackend, "delete_nodegroup", _delete_nodegroup(EKSBackend.delete_nodegroup))
    patch(AutoScalingResponse, "describe_scaling_activities", moto_activities.describe_scaling_activities)
    # moto reads the region from ".<region>.amazonaws.com" anywhere in the URL; an IAM Identity Center
    # principal in an access-entry path (".../role/aws-reserved/sso.amazonaws.com/...") fooled it. AWS
    # takes the region from the endpoint's host: so does this.
    patch(EKSResponse, "region_regex", re.compile(r"^[a-z]+://[^/]*?\.(?P<region>[^./]+)\.amazonaws\.com"))
    for name, method in api.METHODS.items():
        patch(EKSResponse, name, method)
    for cls in (EKSResponse, EC2Response, AutoScalingResponse):
        patch(cls, "call_action", _ticking(cls.call_action))
    for route in ROUTES:
        eks_urls.url_paths.setdefault(route, eks_urls.response.dispatch)
    patch(IAMBackend, "_init_aws_policies", _needed_aws_policies)
    patch(IAMBackend, "create_role", _create_role(IAMBackend.create_role))
    undo_ec2 = moto_provision_ec2.install(patch)
    moto_strict.install(patch)  # issue 20's rules, on top of the wrappers above
    moto_security.install(patch)  # issue 23's rules
    moto_s3.install(patch)  # issue 25's: S3 bucket names
    moto_leftovers.install(patch)  # issue 34's: the control-plane log group, VPC endpoints
    moto_enis.install(patch)  # issue 34's: other services' (requester-managed) interfaces

    def uninstall() -> None:
        undo_ec2()
        for route in (*ROUTES, *moto_security.ROUTES):
            eks_urls.url_paths.pop(route, None)
        for obj, name, old in reversed(patches):
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)

    return uninstall


_MISSING = object()
