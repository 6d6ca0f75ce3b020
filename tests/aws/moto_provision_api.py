"""EKS add-on and access-entry operations moto 5.2 lacks, as ``EKSResponse`` methods.

State lives on moto's ``Cluster`` objects (``rtui_addons``, ``rtui_access``), set up by
``moto_provision``'s CreateCluster wrapper; transitions are run by ``moto_provision.tick``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from moto.core.responses import ActionResult
from moto.core.utils import utcnow
from moto.eks.exceptions import (
    InvalidParameterException,
    InvalidRequestException,
    ResourceInUseException,
    ResourceNotFoundException,
)
from moto.eks.models import Cluster
from moto.eks.responses import EKSResponse
from moto.iam.models import iam_backends

from tests.aws.moto_ext import SCRIPT

DEFAULT_ADDON_VERSIONS = {
    "vpc-cni": "v1.19.2-eksbuild.1",
    "coredns": "v1.11.4-eksbuild.2",
    "kube-proxy": "v1.31.3-eksbuild.2",
    "aws-efs-csi-driver": "v2.1.4-eksbuild.1",
    "aws-ebs-csi-driver": "v1.38.1-eksbuild.2",
}


def _not_found(message: str) -> ResourceNotFoundException:
    return ResourceNotFoundException(
        clusterName=None, nodegroupName=None, fargateProfileName=None, addonName=None, message=message
    )


def _in_use(message: str) -> ResourceInUseException:
    return ResourceInUseException(clusterName=None, nodegroupName=None, addonName=None, message=message)


def _cluster(self: EKSResponse) -> Cluster:
    name = self._get_param("name")
    cluster = self.eks_backend.clusters.get(name)
    if cluster is None:
        raise _not_found(f"No cluster found for name: {name}.")
    return cluster


def _active_cluster(self: EKSResponse) -> Cluster:
    cluster = _cluster(self)
    if cluster.status != "ACTIVE":
        raise InvalidRequestException(message=f"Cluster '{cluster.name}' is not in ACTIVE status")
    return cluster


def _addons(cluster: Cluster) -> dict[str, dict[str, Any]]:
    addons: dict[str, dict[str, Any]] = vars(cluster).setdefault("rtui_addons", {})
    return addons


def _access(cluster: Cluster) -> dict[str, dict[str, Any]]:
    access: dict[str, dict[str, Any]] = vars(cluster).setdefault("rtui_access", {})
    return access


def _public(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if not k.startswith("rtui_")}


def _addon(self: EKSResponse, cluster: Cluster) -> dict[str, Any]:
    name = self._get_param("addonName")
    addon = _addons(cluster).get(name)
    if addon is None:
        raise _not_found(f"No addon: {name} found in cluster: {cluster.name}")
    return addon


# --- add-ons ---------------------------------------------------------------------------------

# The top-level keys of the vpc-cni add-on's configuration schema (``aws eks describe-addon-configuration
# --addon-name vpc-cni``: a JSON schema with ``additionalProperties: false``), as far as rtui needs them.
# ``enableNetworkPolicy`` is a string ("true"/"false"), not a JSON boolean (EKS User Guide, "Restrict Pod
# network traffic with Kubernetes network policies": ``{"enableNetworkPolicy": "true"}``).
VPC_CNI_SETTINGS = frozenset({"affinity", "enableNetworkPolicy", "enableWindowsIpam", "enableWindowsPrefixDelegation",
                              "env", "eniConfig", "init", "livenessProbeTimeoutSeconds", "nodeAgent",
                              "readinessProbeTimeoutSeconds", "resources", "tolerations"})
BOOLEAN_STRINGS = ("true", "false")


def configuration_values(addon_name: str, raw: str | None) -> str | None:
    """``configurationValues`` as EKS takes them (EKS API reference, CreateAddon/UpdateAddon:
    "validated against the schema returned by DescribeAddonConfiguration"; a value that is not JSON,
    or that the add-on's schema refuses, is an ``InvalidParameterException`` and nothing is created or
    changed). Kept verbatim, as DescribeAddon returns them. rtui sends JSON; YAML is not modelled."""
    if raw is None or raw == "":
        return raw
    try:
        values = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidParameterException(message=f"ConfigurationValue is not in valid JSON format: {exc.msg}") \
            from None
    if not isinstance(values, dict):
        raise InvalidParameterException(
            message="ConfigurationValue provided in request is not supported: Json schema validation failed "
                    f"with error: [$: {type(values).__name__} found, object expected]")
    if addon_name == "vpc-cni":
        unknown = sorted(set(values) - VPC_CNI_SETTINGS)
        if unknown:
            raise InvalidParameterException(
                message="ConfigurationValue provided in request is not supported: Json schema validation failed "
                        f"with error: [$.{unknown[0]}: is not defined in the schema and the schema does not allow "
                        "additional properties]")
        policy = values.get("enableNetworkPolicy")
        if policy is not None and policy not in BOOLEAN_STRINGS:
            raise InvalidParameterException(
                message="ConfigurationValue provided in request is not supported: Json schema validation failed "
                        f"with error: [$.enableNetworkPolicy: {json.dumps(policy)} is not a boolean string]")
    return raw



def settle_addon(addon: dict[str, Any]) -> None:
    """Where a new add-on ends: ACTIVE, or DEGRADED with the health issues that say why when
    ``SCRIPT.degraded_addons`` names it (EKS API reference, Addon ``status`` and ``health.issues``;
    e.g. coredns ``InsufficientNumberOfReplicas`` when its pods cannot be scheduled)."""
    issues = SCRIPT.degraded_addons.get(addon["addonName"])
    addon["status"] = "DEGRADED" if issues else "ACTIVE"
    addon["health"] = {"issues": list(issues or [])}


def create_addon(self: EKSResponse) -> ActionResult:
    cluster = _active_cluster(self)
    name = self._get_param("addonName")
    if name in _addons(cluster):
        raise _in_use(f"Addon already exists with name: {name}")
    configuration = configuration_values(name, self._get_param("configurationValues"))
    delay = SCRIPT.timings.addon_create
    addon = {
        "addonName": name,
        "clusterName": cluster.name,
        "status": "CREATING" if delay > 0 else "ACTIVE",
        "addonVersion": self._get_param("addonVersion") or DEFAULT_ADDON_VERSIONS.get(name, "v1.0.0-eksbuild.1"),
        "health": {"issues": []},
        "addonArn": f"{cluster.arn.replace(':cluster/', ':addon/')}/{name}/{uuid.uuid4()}",
        "createdAt": utcnow(),
        "modifiedAt": utcnow(),
        "serviceAccountRoleArn": self._get_param("serviceAccountRoleArn"),
        "tags": self._get_param("tags") or {},
        "configurationValues": configuration,
        "rtui_since": time.monotonic(),
    }
    if delay <= 0:
        settle_addon(addon)
    _addons(cluster)[name] = addon
    return ActionResult({"addon": _public(addon)})


def describe_addon(self: EKSResponse) -> ActionResult:
    return ActionResult({"addon": _public(_addon(self, _cluster(self)))})


def list_addons(self: EKSResponse) -> ActionResult:
    return ActionResult({"addons": sorted(_addons(_cluster(self)))})


def update_addon(self: EKSResponse) -> ActionResult:
    addon = _addon(self, _cluster(self))
    configuration_values(addon["addonName"], self._get_param("configurationValues"))  # all or nothing
    params = []
    for key in ("addonVersion", "serviceAccountRoleArn", "configurationValues"):
        value = self._get_param(key)
        if value is not None:
            addon[key] = value
            params.append({"type": key[0].upper() + key[1:], "value": str(value)})
    addon["modifiedAt"] = utcnow()
    update = {
        "id": str(uuid.uuid4()),
        "status": "Successful",
        "type": "AddonUpdate",
        "params": params,
        "createdAt": utcnow(),
        "errors": [],
    }
    return ActionResult({"update": update})


def delete_addon(self: EKSResponse) -> ActionResult:
    cluster = _cluster(self)
    addon = _addon(self, cluster)
    addon["status"], addon["rtui_since"] = "DELETING", time.monotonic()
    out = _public(addon)
    if SCRIPT.timings.addon_delete <= 0:
        _addons(cluster).pop(addon["addonName"], None)
    return ActionResult({"addon": out})


def describe_addon_versions(self: EKSResponse) -> ActionResult:
    wanted = self._get_param("addonName")
    names = [wanted] if wanted else sorted(DEFAULT_ADDON_VERSIONS)
    addons = [
        {
            "addonName": name,
            "type": "networking",
            "addonVersions": [
                {
                    "addonVersion": DEFAULT_ADDON_VERSIONS.get(name, "v1.0.0-eksbuild.1"),
                    "architecture": ["amd64", "arm64"],
                    "compatibilities": [{"clusterVersion": v, "defaultVersion": True} for v in ("1.30", "1.31")],
                }
            ],
            "owner": "aws",
        }
        for name in names
    ]
    return ActionResult({"addons": addons})


# --- access entries --------------------------------------------------------------------------


def _principal(self: EKSResponse) -> str:
    return unquote(str(self._get_param("principalArn")))


def _entry(self: EKSResponse, cluster: Cluster) -> dict[str, Any]:
    principal = _principal(self)
    entry = _access(cluster).get(principal)
    if entry is None:
        raise _not_found(f"The specified principalArn could not be found: {principal}")
    return entry


def _check_principal(self: EKSResponse, cluster: Cluster, principal: str) -> None:
    """EKS takes an IAM role or user ARN exactly as IAM writes it, path included, and refuses any
    other: ``InvalidParameterException: The specified principalArn is invalid: invalid principal``
    (EKS API reference, CreateAccessEntry ``principalArn``; EKS User Guide, "Create access entries":
    an IAM Identity Center role is ``arn:aws:iam::<account>:role/aws-reserved/sso.amazonaws.com/...``;
    aws/containers-roadmap#2196 for the message a path-less ARN of a pathed role gets)."""
    partition = getattr(self, "partition", "aws")
    if principal == f"arn:{partition}:sts::{self.current_account}:user/moto":
        return  # moto's stand-in for the caller when the access key is none of its own: an IAM user
    iam = iam_backends[self.current_account][partition]
    kind, _, rest = principal.partition(":iam::")[2].partition(":")[2].partition("/")
    name = rest.rsplit("/", 1)[-1]
    known = {"role": {r.name: r.arn for r in iam.roles.values()},
             "user": {u.name: u.arn for u in iam.users.values()}}.get(kind, {})
    if known.get(name) != principal:
        raise InvalidParameterException(clusterName=cluster.name, nodegroupName=None, fargateProfileName=None,
                                        addonName=None,
                                        message="The specified principalArn is invalid: invalid principal")


def create_access_entry(self: EKSResponse) -> ActionResult:
    cluster = _active_cluster(self)
    mode = getattr(cluster, "access_config", {}).get("authenticationMode", "CONFIG_MAP")
    if mode == "CONFIG_MAP":
        raise InvalidRequestException(
            message="The cluster's authentication mode must be set to one of [API, API_AND_CONFIG_MAP] "
            "to perform this operation."
        )
    principal = _principal(self)
    _check_principal(self, cluster, principal)
    if principal in _access(cluster):
        raise _in_use(f"The specified access entry resource is already in use on this cluster: {principal}")
    entry = {
        "clusterName": cluster.name,
        "principalArn": principal,
        "kubernetesGroups": self._get_param("kubernetesGroups") or [],
        "accessEntryArn": f"{cluster.arn.replace(':cluster/', ':access-entry/')}/{uuid.uuid4()}",
        "createdAt": utcnow(),
        "modifiedAt": utcnow(),
        "tags": self._get_param("tags") or {},
        "username": self._get_param("username") or principal,
        "type": self._get_param("type") or "STANDARD",
        "rtui_policies": {},
    }
    _access(cluster)[principal] = entry
    return ActionResult({"accessEntry": _public(entry)})


def describe_access_entry(self: EKSResponse) -> ActionResult:
    return ActionResult({"accessEntry": _public(_entry(self, _cluster(self)))})


def list_access_entries(self: EKSResponse) -> ActionResult:
    return ActionResult({"accessEntries": sorted(_access(_cluster(self)))})


def delete_access_entry(self: EKSResponse) -> ActionResult:
    cluster = _cluster(self)
    entry = _entry(self, cluster)
    del _access(cluster)[entry["principalArn"]]
    return ActionResult({})


def access_scope(cluster: Cluster, scope: Any) -> dict[str, Any]:
    """An access policy's scope as EKS takes it (EKS API reference, ``AccessScope``: ``type`` is
    ``cluster`` or ``namespace``, and ``namespaces`` is required when it is ``namespace``;
    AssociateAccessPolicy answers ``InvalidParameterException`` otherwise and associates nothing)."""
    def refuse(message: str) -> InvalidParameterException:
        return InvalidParameterException(clusterName=cluster.name, nodegroupName=None, fargateProfileName=None,
                                         addonName=None, message=message)

    if not isinstance(scope, dict) or scope.get("type") not in ("cluster", "namespace"):
        raise refuse("accessScope.type must be one of [cluster, namespace]")
    namespaces = scope.get("namespaces") or []
    if scope["type"] == "namespace" and not namespaces:
        raise refuse("accessScope.namespaces must be specified when accessScope.type is namespace")
    return {"type": scope["type"], "namespaces": list(namespaces)}


def associate_access_policy(self: EKSResponse) -> ActionResult:
    cluster = _cluster(self)
    entry = _entry(self, cluster)
    policy = {
        "policyArn": self._get_param("policyArn"),
        "accessScope": access_scope(cluster, self._get_param("accessScope")),
        "associatedAt": utcnow(),
        "modifiedAt": utcnow(),
    }
    entry["rtui_policies"][policy["policyArn"]] = policy
    return ActionResult(
        {"clusterName": cluster.name, "principalArn": entry["principalArn"], "associatedAccessPolicy": policy}
    )


def list_associated_access_policies(self: EKSResponse) -> ActionResult:
    cluster = _cluster(self)
    entry = _entry(self, cluster)
    policies = list(entry["rtui_policies"].values())
    return ActionResult(
        {"clusterName": cluster.name, "principalArn": entry["principalArn"], "associatedAccessPolicies": policies}
    )


def disassociate_access_policy(self: EKSResponse) -> ActionResult:
    entry = _entry(self, _cluster(self))
    arn = unquote(str(self._get_param("policyArn")))
    if entry["rtui_policies"].pop(arn, None) is None:
        raise _not_found(f"The specified policy is not associated: {arn}")
    return ActionResult({})


METHODS: dict[str, Callable[[EKSResponse], ActionResult]] = {
    fn.__name__: fn
    for fn in (
        create_addon,
        describe_addon,
        list_addons,
        update_addon,
        delete_addon,
        describe_addon_versions,
        create_access_entry,
        describe_access_entry,
        list_access_entries,
        delete_access_entry,
        associate_access_policy,
        list_associated_access_policies,
        disassociate_access_policy,
    )
}
