"""The aws target's settings: where the EKS cluster goes, its network and machines, Spot, and how long
AWS may take to answer. The Kubernetes side is the kube target's (``KubeConfig``)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from backend.config import SESSION, matches
from targets.kube.config import INSTANCE_TYPE, KubeConfig

if TYPE_CHECKING:
    from backend.layers.base import Context

# field -> (full-match pattern, what is accepted: the second half of the error line)
PATTERNS: dict[str, tuple[str, str]] = {
    "region": (r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d", "an AWS region name such as us-east-1"),
    "system_node_type": INSTANCE_TYPE,
    "vpc_id": (r"vpc-[0-9a-f]{8,17}", "a VPC id such as vpc-0abc12345def67890"),
    "private_subnet_ids": (r"(subnet-[0-9a-f]{8,17}(,subnet-[0-9a-f]{8,17})*)?",
                           "subnet ids, comma-separated, such as subnet-0abc1234,subnet-0def5678"),
    "spot_types": (r"([a-z][a-z0-9-]*\.[a-z0-9]+(,[a-z][a-z0-9-]*\.[a-z0-9]+)*)?",
                   "EC2 instance types, comma-separated, such as g6.24xlarge"),
    "api_cidrs": (r"(\d{1,3}(\.\d{1,3}){3}/\d{1,2}(,\d{1,3}(\.\d{1,3}){3}/\d{1,2})*)?",
                  "IPv4 CIDRs, comma-separated, such as 203.0.113.0/24"),
}


class AwsConfig(KubeConfig):
    """A run on a new EKS cluster: the aws target's config."""

    # backend.trust: what a checkout's rtui.toml may set without a confirmation (free), and why each other
    # field waits for one (held), one line each: `rtui config show` and the wizard's modal print it.
    free_fields: ClassVar[frozenset[str]] = frozenset({
        "availability_zone", "aws_timeout_s",
    })
    held_fields: ClassVar[Mapping[str, str]] = MappingProxyType({
        "region": "chooses the AWS region whose resources are created and torn down",
        "kubernetes_version": "chooses the Kubernetes version the new EKS cluster runs",
        "vpc_id": "adopts an existing VPC: rtui builds into someone's network",
        "private_subnet_ids": "adopts existing subnets: rtui builds into someone's network",
        "api_cidrs": "chooses who may reach the EKS API endpoint (0.0.0.0/0 is everyone)",
        "access_scope": "chooses what your EKS access entry grants",
        "system_node_type": "chooses the machines created and billed by the hour",
        "system_node_count": "chooses how many machines are created and billed by the hour",
        "spot": "chooses how the GPU machines are bought: Spot ones AWS may take back mid-run",
        "spot_types": "chooses which machines are created and billed by the hour",
        "spot_fallback": "chooses to buy the GPU machines On-Demand, at the full price, when Spot has none",
    })

    refused_fields: ClassVar[Mapping[str, tuple[str, str]]] = MappingProxyType({
        "storage_size": ("--storage-size is a volume in a kube cluster; the aws target keeps the run's data in S3",
                         "drop --storage-size (--storage-path names where the data goes)"),
        "service_account": ("--service-account is for the kube target; the aws target gives its pods their "
                            "credentials itself", "drop --service-account"),
        "context": ("--context picks a cluster of your kubeconfig for the kube target; the aws target makes its "
                    "own cluster and reaches it through EKS", "drop --context"),
    })

    region: str = Field(default="us-east-1", description="AWS region")
    availability_zone: str | None = Field(default=None,
        description="AZ for the GPU nodes (chosen by preflight when unset)")
    kubernetes_version: str = Field(default="1.34", description="EKS Kubernetes version")
    vpc_id: str | None = Field(default=None,
        description="An existing VPC to use (adopted: checked, never deleted)")
    private_subnet_ids: str = Field(default="",
        description="aws with --vpc-id: its private subnets, comma-separated (two "
                                                    "AZs at least, one in the GPU AZ, each routed to a NAT gateway)")
    api_cidrs: str = Field(default="",
        description="Public CIDRs allowed to reach the EKS API endpoint, comma-separated "
                                           "(default: your public address as AWS sees it; 0.0.0.0/0 opens it to "
                                           "everyone, flagged in the plan)")
    access_scope: Literal["cluster", "namespace"] = Field(
        default="cluster", description="What your EKS access entry grants once rtui's cluster-wide objects "
                                       "are installed: admin of the whole cluster, or admin of the run's namespace "
                                       "only (AmazonEKSAdminPolicy there; `down` restores cluster admin first)")
    system_node_type: str = Field(default="m7i.xlarge",
        description="Instance type of the system node (Ray head, operator)")
    system_node_count: int = Field(default=1, ge=1, le=10, description="Number of system nodes")
    spot: bool = Field(default=False,
        description="The GPU nodes on Spot capacity (priced at the GPU AZ's Spot price, about a third of "
                    "On-Demand's often; AWS may take a node back with two minutes' notice)")
    spot_types: str = Field(default="",
        description="aws with --spot: more instance types the GPU nodegroup may launch, comma-separated, each with "
                    "the GPU type's GPUs and EFA (a wider Spot pool); priced at the dearest of them")
    spot_fallback: Literal["none", "on-demand"] = Field(default="none",
        description="aws with --spot: when AWS has no Spot capacity for the GPU nodes (their group gave up "
                    "launching), move them to On-Demand in the same AZ and go on (`none`: stop and say so)")
    aws_timeout_s: float = Field(default=12.0, gt=0, le=600,
        description="How long the first AWS answers (the regions and instance types) may take before the "
                    "endpoint is reported unreachable; a region's checks get 2.5× that and the "
                    "whole check 5×", json_schema_extra=SESSION)

    @field_validator("region", "system_node_type", "vpc_id", "private_subnet_ids", "api_cidrs", "spot_types")
    @classmethod
    def _aws_patterns(cls, v: str | None, info: ValidationInfo) -> str | None:
        return matches(PATTERNS, v, info)

    @field_validator("api_cidrs")
    @classmethod
    def _real_cidrs(cls, v: str) -> str:
        """Each an IPv4 network as written (no host bits), public: the public endpoint sees public addresses."""
        for text in (c for c in v.split(",") if c):
            try:
                network = ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise ValueError(f"{text} is not an IPv4 CIDR (such as 203.0.113.0/24)") from None
            if str(network) != text:
                raise ValueError(f"{text} has host bits set: did you mean {network}?")
            if network.prefixlen and not network.is_global:
                raise ValueError(f"{text} is a private or reserved range: the public API endpoint sees only public "
                                 "addresses")
        return v

    def private_subnet_id_list(self) -> list[str]:
        return [s for s in self.private_subnet_ids.split(",") if s]

    def spot_type_list(self) -> list[str]:
        """The GPU nodegroup's instance types beyond ``gpu_node_type`` (``--spot-types``), in order, once each."""
        return [t for t in dict.fromkeys(self.spot_types.split(",")) if t and t != self.gpu_node_type]

    def api_cidr_list(self) -> list[str]:
        """The CIDRs given (none: the plan uses the caller's public address)."""
        return [c for c in self.api_cidrs.split(",") if c]


def aws_config(ctx: Context) -> AwsConfig:
    """The run's config, as the aws target's layers read it."""
    return AwsConfig.of(ctx.config)
