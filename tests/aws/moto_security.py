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
- **EKS Pod Identity** (moto lacks it): Create/Describe/List/DeletePodIdentityAssociation.
  CreatePodIdentityAssociation takes the role ARN as IAM writes it and refuses a role whose trust
  policy does not let ``pods.eks.amazonaws.com`` both ``sts:AssumeRole`` and ``sts:TagSession``:
  ``InvalidParameterException: Trust policy of the role provided is invalid`` (EKS User Guide,
  "Create IAM role with trust policy required by EKS Pod Identity"; the answer quoted in
  hashicorp/terraform-provider-aws#41483; a role made a moment ago gets the same answer while IAM
  settles it, terraform-provider-aws#34711). One association per namespace and service account
  (ResourceInUseException). EKS does not check that the ``eks-pod-identity-agent`` add-on runs: the
  association is accepted, and its pods simply get no credentials (EKS User Guide, "Set up the EKS
  Pod Identity Agent").
- **The VPC CNI needs its ENI permissions before nodes join.** ``aws-node`` assigns the node's pod
  addresses with the ``AmazonEKS_CNI_Policy`` permissions, from the node role, or from its service
  account's role (IRSA through the vpc-cni add-on's ``serviceAccountRoleArn``, or an EKS Pod Identity
  association for ``kube-system/aws-node`` whose credentials only the running
  ``eks-pod-identity-agent`` add-on hands out). Without them the node stays NotReady and the
  managed nodegroup ends ``CREATE_FAILED`` with ``NodeCreationFailure`` (EKS User Guide, "Amazon EKS
  node IAM role" and "Configure Amazon VPC CNI plug-in to use IRSA"; "Troubleshoot ... managed node
  groups": NodeCreationFailure, instances failed to join the cluster).
- **A cluster role whose trust conditions do not match is not assumed.** EKS assumes the cluster role
  with ``aws:SourceAccount`` (the cluster's account) and ``aws:SourceArn`` (the cluster's ARN) in the
  request context, so a trust policy conditioned on other values refuses it and CreateCluster
  answers that the role could not be assumed (EKS User Guide, "Cross-service confused deputy
  prevention"; IAM User Guide, "The confused deputy problem"; the message as in ``_propagating``).
- **CreateCluster's ``publicAccessCidrs`` are CIDR blocks.** EKS refuses anything else with
  ``InvalidParameterException`` (EKS API reference, ``VpcConfigRequest.publicAccessCidrs``: the CIDR
  blocks allowed to reach the public endpoint; an IPv4 cluster takes no IPv6 block). moto stored any
  string. Whether EKS also refuses private ranges there is not documented; the double does not.
- **Control-plane logging.** EKS knows five log types (``api``, ``audit``, ``authenticator``,
  ``controllerManager``, ``scheduler``), refuses others with ``InvalidParameterException``, and
  reports all five in ``logging.clusterLogging`` as one enabled and one disabled group; an update
  changes only the types it names (EKS API reference, ``Logging``/``LogSetup``; EKS User Guide,
  "Send control plane logs to CloudWatch Logs": all off by default). moto kept whatever it was
  given, and replaced the whole setting on update.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from moto.core.responses import ActionResult
from moto.core.utils import utcnow
from moto.ec2.responses import EC2Response
from moto.eks import urls as eks_urls
from moto.eks.exceptions import InvalidParameterException, ResourceInUseException, ResourceNotFoundException
from moto.eks.models import Cluster, EKSBackend, Nodegroup, eks_backends
from moto.eks.responses import EKSResponse
from moto.iam.models import iam_backends

from tests.aws.moto_ext import SCRIPT
from tests.aws.moto_provision_api import _cluster

Patch = Callable[[Any, str, Any], None]

# What EC2 gives an instance of an AMI with ImdsSupport v2.0 when nothing at launch says otherwise.
AMI_V2_METADATA: dict[str, str | int] = {
    "HttpTokens": "required", "HttpPutResponseHopLimit": 2, "HttpEndpoint": "enabled",
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
            vars(cluster.nodegroups[self._get_param("nodegroupName")])["disk_size"] = None
        return result

    return create_nodegroup


# --- EKS Pod Identity --------------------------------------------------------------------------

POD_SERVICE = "pods.eks.amazonaws.com"
CNI_POLICY = "AmazonEKS_CNI_Policy"
AGENT = "eks-pod-identity-agent"


def _invalid(message: str) -> InvalidParameterException:
    return InvalidParameterException(clusterName=None, nodegroupName=None, fargateProfileName=None, addonName=None,
                                     message=message)


def _not_found(message: str) -> ResourceNotFoundException:
    return ResourceNotFoundException(clusterName=None, nodegroupName=None, fargateProfileName=None, addonName=None,
                                     message=message)


def _associations(cluster: Cluster) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = vars(cluster).setdefault("rtui_pod_identities", {})
    return found


def _role(account: str, partition: str, arn: str) -> Any:
    return next((r for r in iam_backends[account][partition].roles.values() if r.arn == arn), None)


def _trusts_pod_identity(role: Any) -> bool:
    document = role.assume_role_policy_document
    policy = json.loads(unquote(document)) if isinstance(document, str) else dict(document)
    statements = policy.get("Statement") or []
    for statement in statements if isinstance(statements, list) else [statements]:
        services = (statement.get("Principal") or {}).get("Service") or []
        actions = statement.get("Action") or []
        services = [services] if isinstance(services, str) else services
        actions = [actions] if isinstance(actions, str) else actions
        if statement.get("Effect") == "Allow" and POD_SERVICE in services and \
                {"sts:AssumeRole", "sts:TagSession"} <= set(actions):
            return True
    return False


def _public(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if not k.startswith("rtui_")}


def create_pod_identity_association(self: EKSResponse) -> ActionResult:
    cluster = _cluster(self)
    namespace, account = self._get_param("namespace"), self._get_param("serviceAccount")
    role_arn = str(self._get_param("roleArn") or "")
    role = _role(self.current_account, getattr(self, "partition", "aws"), role_arn)
    if role is None:
        raise _invalid(f"Role provided in the request does not exist: {role_arn}")
    created = getattr(role, "rtui_created", None)
    if not _trusts_pod_identity(role) or (
            created is not None and time.monotonic() - created < SCRIPT.timings.iam_propagation):
        raise _invalid("Trust policy of the role provided is invalid")
    if any(a["namespace"] == namespace and a["serviceAccount"] == account for a in _associations(cluster).values()):
        raise ResourceInUseException(clusterName=cluster.name, nodegroupName=None, addonName=None,
                                     message="Association already exists")
    association_id = "a-" + uuid.uuid4().hex[:17]
    association = {"clusterName": cluster.name, "namespace": namespace, "serviceAccount": account,
                   "roleArn": role_arn, "associationId": association_id,
                   "associationArn": f"{cluster.arn.replace(':cluster/', ':podidentityassociation/')}/{association_id}",
                   "tags": self._get_param("tags") or {}, "createdAt": utcnow(), "modifiedAt": utcnow()}
    _associations(cluster)[association_id] = association
    return ActionResult({"association": _public(association)})


def _association(self: EKSResponse) -> tuple[Cluster, dict[str, Any]]:
    cluster = _cluster(self)
    found = _associations(cluster).get(self._get_param("associationId"))
    if found is None:
        raise _not_found(f"No Pod Identity Association found for id: {self._get_param('associationId')}")
    return cluster, found


def describe_pod_identity_association(self: EKSResponse) -> ActionResult:
    return ActionResult({"association": _public(_association(self)[1])})


def list_pod_identity_associations(self: EKSResponse) -> ActionResult:
    found = [a for a in _associations(_cluster(self)).values()
             if self._get_param("namespace") in (None, a["namespace"])
             and self._get_param("serviceAccount") in (None, a["serviceAccount"])]
    return ActionResult({"associations": [{k: a[k] for k in ("clusterName", "namespace", "serviceAccount",
                                                              "associationArn", "associationId")} for a in found]})


def delete_pod_identity_association(self: EKSResponse) -> ActionResult:
    cluster, found = _association(self)
    del _associations(cluster)[found["associationId"]]
    return ActionResult({"association": _public(found)})


def _role_policies(account: str, partition: str, arn: str | None) -> set[str]:
    role = _role(account, partition, arn) if arn else None
    return {p.name for p in role.managed_policies.values()} if role is not None else set()


def cni_credentials(backend: EKSBackend, cluster: Cluster, ng: Nodegroup) -> bool | None:
    """Whether aws-node on this nodegroup's nodes would hold the CNI's ENI permissions (None: the node
    role is no IAM role of this account, as in the double's own tests, which give a made-up ARN)."""
    account, partition = backend.account_id, backend.partition
    if _role(account, partition, ng.node_role) is None:
        return None
    if CNI_POLICY in _role_policies(account, partition, ng.node_role):
        return True
    addons = getattr(cluster, "rtui_addons", {})
    irsa = (addons.get("vpc-cni") or {}).get("serviceAccountRoleArn")
    if irsa and CNI_POLICY in _role_policies(account, partition, irsa):
        return True
    agent = (addons.get(AGENT) or {}).get("status") in ("ACTIVE", "CREATING", "UPDATING")
    return agent and any(
        a["namespace"] == "kube-system" and a["serviceAccount"] == "aws-node"
        and CNI_POLICY in _role_policies(account, partition, a["roleArn"])
        for a in _associations(cluster).values())


def _tick_nodegroup(original: Callable[..., list[Callable[[], None]]]) -> Callable[..., list[Callable[[], None]]]:
    """The instances launch (or fail to, for capacity or their interfaces) as before; those that launch
    without the CNI's permissions never become Ready, and the nodegroup fails instead of going ACTIVE."""
    def tick_nodegroup(backend: EKSBackend, cluster: Cluster, ng: Nodegroup, now: float) -> list[Callable[[], None]]:
        was = ng.status
        hooks = original(backend, cluster, ng, now)
        if was == "CREATING" and ng.status == "ACTIVE" and cni_credentials(backend, cluster, ng) is False:
            ng.status = "CREATE_FAILED"
            ng.health = {"issues": [{"code": "NodeCreationFailure",
                                     "message": "Unhealthy nodes in the kubernetes cluster",
                                     "resourceIds": list((getattr(ng, "rtui_info", None) or {}).get("instance_ids")
                                                         or [])}]}
            return []  # they never register with the cluster
        return hooks

    return tick_nodegroup


def _services(named: Any) -> list[str]:
    return [named] if isinstance(named, str) else list(named or [])


def _condition_values(statement: dict[str, Any], operator: str, key: str) -> list[str] | None:
    values = ((statement.get("Condition") or {}).get(operator) or {}).get(key)
    return None if values is None else [values] if isinstance(values, str) else list(values)


def _create_cluster(original: Callable[[EKSResponse], Any]) -> Callable[[EKSResponse], Any]:
    def create_cluster(self: EKSResponse) -> Any:
        for cidr in (self._get_param("resourcesVpcConfig") or {}).get("publicAccessCidrs") or []:
            try:
                network = ipaddress.ip_network(str(cidr), strict=False)
            except ValueError:
                network = None
            if network is None or network.version != 4:
                raise _invalid(f"The following CIDRs are invalid in publicAccessCidrs: [{cidr}]")
        role_arn = str(self._get_param("roleArn") or "")
        partition = getattr(self, "partition", "aws")
        role = _role(self.current_account, partition, role_arn)
        if role is not None:
            document = role.assume_role_policy_document
            policy = json.loads(unquote(document)) if isinstance(document, str) else dict(document)
            statements = policy.get("Statement") or []
            statements = statements if isinstance(statements, list) else [statements]
            arn = f"arn:{partition}:eks:{self.region}:{self.current_account}:cluster/{self._get_param('name')}"
            context = {"aws:SourceAccount": self.current_account, "aws:SourceArn": arn}

            def admits(statement: dict[str, Any]) -> bool:
                for operator, match in (("StringEquals", lambda v, x: v == x), ("ArnEquals", lambda v, x: v == x),
                                        ("ArnLike", fnmatch.fnmatchcase), ("StringLike", fnmatch.fnmatchcase)):
                    for key, value in context.items():
                        wanted = _condition_values(statement, operator, key)
                        if wanted is not None and not any(match(value, w) for w in wanted):
                            return False
                return True

            eks_statements = [st for st in statements
                              if "eks.amazonaws.com" in _services((st.get("Principal") or {}).get("Service"))]
            if eks_statements and not any(admits(st) for st in eks_statements):
                raise _invalid(f"Role with arn: {role_arn}, could not be assumed because the trusted entity is not "
                               "correct. Please ensure that the trust policy allows eks.amazonaws.com")
        return original(self)

    return create_cluster


LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")


def _log_setting(current: dict[str, Any] | None, request: dict[str, Any] | None) -> dict[str, Any]:
    enabled = {t for group in (current or {}).get("clusterLogging") or [] if group.get("enabled")
               for t in group.get("types") or []}
    for group in (request or {}).get("clusterLogging") or []:
        types = list(group.get("types") or [])
        unknown = [t for t in types if t not in LOG_TYPES]
        if unknown:
            raise _invalid(f"The type {unknown[0]} is not a valid log type; valid types are {', '.join(LOG_TYPES)}")
        enabled = enabled | set(types) if group.get("enabled") else enabled - set(types)
    return {"clusterLogging": [{"types": [t for t in LOG_TYPES if t in enabled], "enabled": True},
                               {"types": [t for t in LOG_TYPES if t not in enabled], "enabled": False}]}


def _logged_create(original: Callable[[EKSResponse], Any]) -> Callable[[EKSResponse], Any]:
    def create_cluster(self: EKSResponse) -> Any:
        setting = _log_setting(None, self._get_param("logging"))
        result = original(self)
        self.eks_backend.clusters[self._get_param("name")].logging = setting
        return result

    return create_cluster


def _update_cluster_config(original: Callable[[EKSResponse], Any]) -> Callable[[EKSResponse], Any]:
    def update_cluster_config(self: EKSResponse) -> Any:
        cluster = _cluster(self)
        if self._get_param("logging") is not None:
            setting = _log_setting(cluster.logging, self._get_param("logging"))
            result = original(self)
            cluster.logging = setting
            return result
        return original(self)

    return update_cluster_config


ROUTES = ("{0}/clusters/(?P<name>[^/]+)/pod-identity-associations$",
          "{0}/clusters/(?P<name>[^/]+)/pod-identity-associations/(?P<associationId>[^/]+)$")
METHODS = (create_pod_identity_association, describe_pod_identity_association, list_pod_identity_associations,
           delete_pod_identity_association)


def install(patch: Patch) -> None:
    from tests.aws import moto_provision

    patch(EC2Response, "describe_instances", _describe_instances(EC2Response.describe_instances))
    patch(EKSResponse, "create_nodegroup", _create_nodegroup(EKSResponse.create_nodegroup))
    for method in METHODS:
        patch(EKSResponse, method.__name__, method)
    for route in ROUTES:
        eks_urls.url_paths.setdefault(route, eks_urls.response.dispatch)
    patch(EKSResponse, "create_cluster", _logged_create(_create_cluster(EKSResponse.create_cluster)))
    patch(EKSResponse, "update_cluster_config", _update_cluster_config(EKSResponse.update_cluster_config))
    patch(moto_provision, "_tick_nodegroup", _tick_nodegroup(moto_provision._tick_nodegroup))
