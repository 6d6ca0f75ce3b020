"""What each kind of aws resource is made with (DESIGN.md §3: a handler's ``spec_model``).

``desired`` builds these and the plan holds their JSON form; each handler reads its own back, checked
(``Spec.of``), so a key one side writes and the other reads is a field of one type here, not a string
in two files. Optional fields left out of a spec stay out of its JSON form (``Spec.as_spec``), so a
plan compares with what an earlier run recorded as it did before they were typed.
"""

from __future__ import annotations

from typing import Literal

from backend.resources import Spec


class VpcSpec(Spec):
    cidr: str | None  # None: an adopted VPC (--vpc-id), whose CIDR is its own


class SubnetSpec(Spec):
    az: str
    cidr: str
    role: Literal["private", "public"]


class InternetGatewaySpec(Spec):
    pass


class NatGatewaySpec(Spec):
    az: str  # of the public subnet it sits in


class RouteTableSpec(Spec):
    role: Literal["private", "public"]
    via: Literal["internet-gateway", "nat-gateway"]
    azs: list[str]


class S3EndpointSpec(Spec):
    service: str
    type: Literal["Gateway"]
    route_tables: list[str]


class SecurityGroupSpec(Spec):
    efa_rule: bool  # all traffic to and from itself: what EFA needs between the GPU nodes


class BucketSpec(Spec):
    name: str
    block_public_access: bool
    encryption: str
    versioning: str
    abort_incomplete_uploads_days: int
    tls_only: bool


class RoleSpec(Spec):
    service: str  # the principal that assumes it
    policies: list[str]  # managed policies attached
    trust: list[str]  # the trust's actions and condition keys (the account is filled in when made)
    inline: dict[str, str] | None = None  # inline policies by name: their documents, canonical JSON


class LogGroupSpec(Spec):
    name: str


class EksClusterSpec(Spec):
    version: str
    azs: list[str]
    auth: str
    endpoint_private: bool
    public_cidrs: list[str]
    api_access: str  # in words, for the plan
    logs: list[str]


class AccessEntrySpec(Spec):
    policy: str


class KubeconfigSpec(Spec):
    context: str


class AddonSpec(Spec):
    name: str
    configuration: dict[str, str] | None = None  # the add-on's configuration values


class PodIdentitySpec(Spec):
    namespace: str
    service_account: str
    role: str
    policies: list[str]


class PlacementGroupSpec(Spec):
    strategy: Literal["cluster"]
    az: str


class LaunchTemplateSpec(Spec):
    """The GPU nodes' template sets every field; the system nodes' the disk and the metadata options.
    (Every spec's fields are in the order the plan shows them.)"""

    efa: bool = False
    efa_interfaces: int = 0
    volume_gb: int
    imdsv2: bool
    imds_hop_limit: int
    cluster_sg: bool = False
    reservation: str | None = None
    capacity_block: bool = False
    placement_group: str | None = None


class NodegroupSpec(Spec):
    instance_type: str
    size: int
    min_size: int | None = None
    max_size: int | None = None
    azs: list[str]
    ami_type: str
    labels: dict[str, str]
    disk_gb: int | None = None
    taints: list[dict[str, str]] | None = None
    launch_template: bool
    capacity_type: Literal["ON_DEMAND", "SPOT", "CAPACITY_BLOCK"] | None = None
    instance_types: list[str] | None = None  # Spot: the GPU type and the --spot-types beside it

    def types(self) -> list[str]:
        """The types the group may launch: the node type, then a Spot group's ``--spot-types``."""
        return list(self.instance_types or [self.instance_type])

    def bounds(self) -> tuple[int, int]:
        """The group's (minSize, maxSize): the planned size both ways unless the plan lets it shrink."""
        return (self.size if self.min_size is None else self.min_size,
                self.size if self.max_size is None else self.max_size)


class AsgTagsSpec(Spec):
    tags: dict[str, str]


class ClusterAutoscalerSpec(Spec):
    image: str
    command: list[str]


class AccessScopeSpec(Spec):
    scope: Literal["namespace"]
    namespaces: list[str]
    policy: str
    group: str
