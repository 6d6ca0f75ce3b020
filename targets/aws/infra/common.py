"""What every handler of the AWS layer shares: the region's API, names, the topology and prices.

Each handler finds its resources by our tags (``rtui:run``), never by the record alone; a
resource of our name that another run or someone else made is refused, never adopted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import ClassVar

from backend.layers.base import Context, Handler
from backend.ledger import ResourceStatus
from backend.resources import Action, Observed, Resource
from backend.runner import Progress
from targets.aws.config import aws_config
from targets.aws.facts import ReservationFact, aws_facts
from targets.aws.infra.api import EC2_TOKEN, AwsApi, client_token

LAYER = "aws"
VPC = "aws.vpc"
IGW = "aws.internet-gateway"
NAT = "aws.nat-gateway"
PUBLIC_RT = "aws.route-table.public"
PRIVATE_RT = "aws.route-table.private"
NODE_SG = "aws.security-group.nodes"
CLUSTER_ROLE = "aws.iam-role.cluster"
NODE_ROLE = "aws.iam-role.nodes"
EKS_CLUSTER = "aws.eks-cluster"
ACCESS_ENTRY = "aws.access-entry.admin"
KUBECONFIG = "aws.kubeconfig"
PLACEMENT_GROUP = "aws.placement-group.gpu"
LAUNCH_TEMPLATE = "aws.launch-template.gpu"
SYSTEM_LAUNCH_TEMPLATE = "aws.launch-template.system"
SYSTEM_NODES = "aws.nodegroup.system"
GPU_NODES = "aws.nodegroup.gpu"
GPU_ASG_TAGS = "aws.asg-tags.gpu"  # cluster-autoscaler's tags on the GPU nodes' Auto Scaling group
ADDONS = ("vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent")
# The add-ons' configuration values. EKS's VPC CNI enforces Kubernetes NetworkPolicies (the one the
# kube layer creates around Ray) only with enableNetworkPolicy on, a string "true" in the add-on's
# configuration values: it then runs its network policy agent (the aws-node DaemonSet's
# aws-network-policy-agent container) on every node. It needs vpc-cni 1.14+ on Kubernetes 1.25+ and a
# Linux kernel 5.10+ (the EKS-optimized AL2023 AMIs rtui uses qualify). EKS User Guide, "Restrict Pod
# network traffic with Kubernetes network policies" (cni-network-policy-configure).
ADDON_CONFIGURATION: dict[str, dict[str, str]] = {"vpc-cni": {"enableNetworkPolicy": "true"}}

VPC_CIDR = "10.0.0.0/16"
ROOT_VOLUME_GB = 200  # the Ray image is ~30 GB unpacked; room for it, checkpoints and logs
# The system node (Ray head, operator) pulls the same image. A registry gives only the compressed
# layer sizes; gzip'd layers of Python/CUDA images unpack to about 2-3x, so 3x is the estimate, and
# containerd keeps the downloaded blobs beside the unpacked snapshot: both count. On top: the OS,
# kubelet and the add-ons' images, then a quarter for margin (logs, a second image version on update).
SYSTEM_DISK_MIN_GB = 50  # EKS's nodegroup default, the floor
SYSTEM_DISK_UNKNOWN_GB = 100  # the registry did not answer: room for a ~12 GB (compressed) image
UNPACK_RATIO = 3.0
NODE_BASE_GB = 20
DISK_MARGIN = 1.25


def system_disk_gb(compressed_bytes: int | None) -> tuple[int, str]:
    """The system node's disk for an image of ``compressed_bytes`` (None: unknown), and how it was sized."""
    if compressed_bytes is None:
        return SYSTEM_DISK_UNKNOWN_GB, "image size unknown"
    compressed = compressed_bytes / 1e9
    need = (compressed * (1 + UNPACK_RATIO) + NODE_BASE_GB) * DISK_MARGIN
    size = max(SYSTEM_DISK_MIN_GB, int(-(-need // 10) * 10))
    return size, (f"image {compressed:.1f} GB compressed, ~{compressed * UNPACK_RATIO:.0f} GB unpacked, "
                  f"+{NODE_BASE_GB} GB node, +{round((DISK_MARGIN - 1) * 100)}%")


def subnet_address(role: str, az: str) -> str:
    return f"aws.subnet.{role}.{az}"


def addon_address(name: str) -> str:
    return f"aws.addon.{name}"


def subnet_cidr(role: str, az_index: int) -> str:
    """Private /20s from 10.0.0.0 (pods take VPC addresses), public /22s from 10.0.128.0."""
    if role == "private":
        return f"10.0.{16 * az_index}.0/20"
    return f"10.0.{128 + 4 * az_index}.0/22"


@dataclass(frozen=True)
class Names:
    """Every AWS name a run uses, from its cluster name (unique per account and region)."""

    cluster: str

    @property
    def cluster_role(self) -> str:
        return f"rtui-{self.cluster}-cluster"[:64]

    @property
    def node_role(self) -> str:
        return f"rtui-{self.cluster}-nodes"[:64]

    @property
    def security_group(self) -> str:
        return f"rtui-{self.cluster}-nodes"

    def placement_group(self, az: str) -> str:
        return f"rtui-{self.cluster}-gpu-{az}"

    @property
    def launch_template(self) -> str:
        return f"rtui-{self.cluster}-gpu"

    @property
    def system_launch_template(self) -> str:
        return f"rtui-{self.cluster}-system"

    @property
    def system_nodegroup(self) -> str:
        return f"{self.cluster}-system"

    @property
    def gpu_nodegroup(self) -> str:
        return f"{self.cluster}-gpu"


@dataclass(frozen=True)
class NamedReservation:
    """The reservation the GPU launch template names."""

    id: str
    kind: str  # "odcr" (targeted) or "capacity-block"
    placement_group: str | None = None  # the cluster placement group its capacity is held in

    def to_fact(self, az: str) -> ReservationFact:
        return ReservationFact(az=az, id=self.id, kind=self.kind, placement_group=self.placement_group)


@dataclass
class Topology:
    """The AZs of a run: the two the network spans, the GPU nodes' one, and where to fail over to."""

    network_azs: list[str]
    gpu_az: str
    az_index: dict[str, int]
    failover_azs: list[str] = field(default_factory=list)
    gpu_quota_code: str | None = None
    gpu_headroom: float | None = None
    system_quota_code: str | None = None
    system_headroom: float | None = None
    vcpus: dict[str, int] = field(default_factory=dict)
    efa_interfaces: int = 1  # per GPU node: one per network card (DescribeInstanceTypes)
    # AZ -> the reservation the GPU launch template names there: a targeted ODCR or a Capacity Block
    # that holds every GPU node. Open ODCRs need no naming.
    reservations: dict[str, NamedReservation] = field(default_factory=dict)
    # AZ -> the GPU type's Spot price in effect there (USD per instance-hour): Spot plans only.
    spot_prices: dict[str, float] = field(default_factory=dict)
    system_disk_gb: int = 50
    system_disk_why: str = ""

    @property
    def gpu_reservation(self) -> NamedReservation | None:
        return self.reservations.get(self.gpu_az)

    @property
    def gpu_placement_group(self) -> tuple[str | None, bool]:
        """The placement group the GPU nodes launch into, and whether rtui makes it.

        EC2 puts a reservation's capacity where it was made (EC2 User Guide, "Use Capacity Reservations
        with cluster placement groups"): a targeted ODCR made in a cluster placement group holds the nodes
        in that group; one made outside any group holds them somewhere in the AZ, where a fresh cluster
        group of ours would have to find them again (InsufficientInstanceCapacity, the reservation
        notwithstanding); a Capacity Block is co-located already and takes no group ("Capacity Blocks
        for ML"). Without a named reservation the nodes go into rtui's own cluster group."""
        named = self.gpu_reservation
        if named is None:
            return None, True
        return named.placement_group, False

    @property
    def subnet_azs(self) -> list[str]:
        """Private subnets: the network's AZs, and the GPU AZ when failover moved it elsewhere."""
        return list(dict.fromkeys([*self.network_azs, self.gpu_az]))


def aws_api(ctx: Context) -> AwsApi:
    """The region's API for this config, made once per session (the session closes it)."""
    region, profile = aws_config(ctx).region, aws_config(ctx).profile
    return ctx.clients.get(("aws", region, profile), lambda: AwsApi(region, profile))


class AwsHandler(Handler):
    """A handler that also finds its resources live (the layer asks each one)."""

    address: ClassVar[str] = ""

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        raise NotImplementedError

    def api(self, ctx: Context) -> AwsApi:
        return aws_api(ctx)

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        # Found half-made (a crash, a detach): wait for it, never make a second one.
        if have.state.get("pending"):
            return Action.UPDATE, f"{have.state['pending']}: waiting for it"
        return super().compare(want, have)

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        if not have.state.get("pending"):
            raise NotImplementedError(f"{self.kind} cannot be updated in place")
        async for p in self.wait_ready(ctx, have.id):
            yield p

    def wait_ready(self, ctx: Context, resource_id: str) -> AsyncIterator[Progress]:
        raise NotImplementedError(f"{self.kind} is never half-made")

    def made(self, ctx: Context, want: Resource, resource_id: str, **outputs: object) -> None:
        """The create call went out and AWS named the resource: the ledger learns its id."""
        ctx.ledger.update(want.address, status=ResourceStatus.CREATING, id=resource_id, outputs=dict(outputs))


def create_token(ctx: Context, address: str, *parts: str, limits: tuple[int, int] = EC2_TOKEN) -> str:
    """The idempotency token of one create call of ``address``: the run, the resource, what places it
    (``parts``: an AZ, a placement group) and the attempt, counted in the run record, so a replacement
    or a failover never reuses the token of an earlier request with other parameters."""
    attempts = aws_facts(ctx).create_attempts
    attempts[address] = attempts.get(address, 0) + 1
    ctx.save()
    return client_token(ctx.record.run_id, address.removeprefix("aws."), *parts, str(attempts[address]),
                        limits=limits)
