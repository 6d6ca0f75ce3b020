"""What an aws run is made of (DESIGN.md §3, the aws layer's ``desired``): its network, IAM roles, EKS
cluster, add-ons, pod identities, launch templates and nodegroups, each with its spec, what it needs
made first, its price per hour and the quota it draws on, from the run's config and the AZs and
reservation settled for it (``zones.settle_azs``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from backend.delivery import S3_STANDARD_PER_GIB_MONTH, effective_storage_path, run_storage_uri
from backend.layers.base import Context
from backend.resources import Resource, Spec
from targets.aws.cloud.pricing import PlanShape, RegionPrices, price_plan, spot_nodes_cost
from targets.aws.config import AwsConfig, aws_config
from targets.aws.facts import aws_facts
from targets.aws.infra.autoscaler import CLUSTER_AUTOSCALER, ClusterAutoscalerHandler
from targets.aws.infra.cluster import CLOUDWATCH_LOGS_GB_MONTH, CONTROL_PLANE_LOGS
from targets.aws.infra.common import (
    ACCESS_ENTRY,
    ADDON_CONFIGURATION,
    ADDONS,
    CLUSTER_ROLE,
    EKS_CLUSTER,
    GPU_ASG_TAGS,
    GPU_NODES,
    IGW,
    KUBECONFIG,
    LAUNCH_TEMPLATE,
    LAYER,
    NAT,
    NODE_ROLE,
    NODE_SG,
    PLACEMENT_GROUP,
    PRIVATE_RT,
    PUBLIC_RT,
    ROOT_VOLUME_GB,
    SYSTEM_LAUNCH_TEMPLATE,
    SYSTEM_NODES,
    VPC,
    NamedReservation,
    Names,
    Topology,
    addon_address,
    subnet_address,
    subnet_cidr,
)
from targets.aws.infra.endpoints import S3_ENDPOINT, S3EndpointHandler
from targets.aws.infra.iam import (
    AUTOSCALER_IDENTITY,
    CLUSTER_POLICIES,
    CNI_IDENTITY,
    DATA_IDENTITY,
    NODE_POLICIES,
    inline_policies,
    planned_identities,
    service_principal,
    trust_shape,
    trust_statement,
)
from targets.aws.infra.logs import LOG_GROUP, LogGroupHandler, log_group_name
from targets.aws.infra.node_autoscaler import (
    check_offered_version,
    cluster_autoscaler_image,
    gpu_asg_tags,
    gpu_scaling_config,
)
from targets.aws.infra.order import rank
from targets.aws.infra.podidentity import POD_IDENTITY_AGENT, PodIdentityHandler
from targets.aws.infra.specs import (
    AccessEntrySpec,
    AddonSpec,
    AsgTagsSpec,
    EksClusterSpec,
    InternetGatewaySpec,
    KubeconfigSpec,
    LaunchTemplateSpec,
    LogGroupSpec,
    NatGatewaySpec,
    NodegroupSpec,
    PlacementGroupSpec,
    RoleSpec,
    RouteTableSpec,
    SecurityGroupSpec,
    SubnetSpec,
    VpcSpec,
)
from targets.aws.infra.storage import BUCKET, BucketHandler

GPU_LABEL = "nvidia.com/gpu.present"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}
AMI_GPU = "AL2023_x86_64_NVIDIA"
AMI_CPU = "AL2023_x86_64_STANDARD"


def desired_resources(ctx: Context, topo: Topology, prices: RegionPrices, *, spot: bool,
                      api_cidrs: Sequence[str]) -> tuple[list[Resource], str]:
    """The run's resources in the order they are made, and what still bills while its GPU nodes are
    scaled to zero (empty when they never are). ``spot``: the GPU nodes are bought on Spot now;
    ``api_cidrs``: who may reach the EKS API endpoint."""
    config = aws_config(ctx)
    check_offered_version(config.kubernetes_version)  # idle GPU nodes need its cluster-autoscaler
    names = Names(config.cluster_name)
    out: list[Resource] = []

    def res(address: str, kind: str, spec: Spec, *deps: str, cost: float | None = 0.0,
            quota: dict[str, dict[str, float | None]] | None = None, note: str = "") -> None:
        out.append(Resource(address=address, layer=LAYER, kind=kind, spec=spec.as_spec(), depends_on=deps,
                            cost_per_hour=cost, cost_note=note, quota=quota or {}))

    adopted = bool(config.vpc_id)
    cost = price_plan(prices, PlanShape(
        gpu_node_type=config.gpu_node_type, gpu_node_count=config.gpu_node_count, gpu_disk_gb=ROOT_VOLUME_GB,
        system_node_type=config.system_node_type, system_node_count=config.system_node_count,
        system_disk_gb=topo.system_disk_gb, nat_gateway=not adopted)).parts
    if spot:  # the GPU nodes at the GPU AZ's Spot price: every figure of the plan says it
        cost["gpu_nodes"] = spot_nodes_cost(prices, config.gpu_node_type, config.gpu_node_count, ROOT_VOLUME_GB,
                                            topo.gpu_az, topo.spot_prices.get(topo.gpu_az),
                                            also=tuple(config.spot_type_list()))
    idle = _idle_note(config, cost, nat=not adopted)
    private = [subnet_address("private", az) for az in topo.subnet_azs]
    res(VPC, "aws-vpc", VpcSpec(cidr=None if adopted else "10.0.0.0/16"))
    for az in topo.subnet_azs:
        res(subnet_address("private", az), "aws-subnet",
            SubnetSpec(az=az, cidr=subnet_cidr("private", topo.az_index[az]), role="private"), VPC)
    if not adopted:
        public = [subnet_address("public", az) for az in topo.network_azs]
        for az in topo.network_azs:
            res(subnet_address("public", az), "aws-subnet",
                SubnetSpec(az=az, cidr=subnet_cidr("public", topo.az_index[az]), role="public"), VPC)
        res(IGW, "aws-internet-gateway", InternetGatewaySpec(), VPC)
        nat = cost["nat_gateway"]
        res(NAT, "aws-nat-gateway", NatGatewaySpec(az=topo.network_azs[0]), IGW, public[0], cost=nat.per_hour,
            note=nat.note)
        res(PUBLIC_RT, "aws-route-table",
            RouteTableSpec(role="public", via="internet-gateway", azs=sorted(topo.network_azs)), IGW, *public)
        res(PRIVATE_RT, "aws-route-table",
            RouteTableSpec(role="private", via="nat-gateway", azs=sorted(topo.subnet_azs)), NAT, *private)
        res(S3_ENDPOINT, S3EndpointHandler.kind, S3EndpointHandler.spec(config.region), VPC, PRIVATE_RT,
            note=f"free: S3 traffic of the private subnets skips the NAT's ${prices.nat_per_gb:.3f}/GB")
    routes = () if adopted else (PRIVATE_RT,)
    res(NODE_SG, "aws-security-group", SecurityGroupSpec(efa_rule=True), VPC)
    own_bucket = not config.storage_path and aws_facts(ctx).data_bucket
    if own_bucket:
        res(BUCKET, BucketHandler.kind, BucketHandler.spec(aws_facts(ctx).data_bucket or ""),
            note=f"${S3_STANDARD_PER_GIB_MONTH}/GB-month of what it holds")
    # The run's own prefix in S3 (its bucket's, or the user's --storage-path): the Ray pods' role reaches
    # that prefix only.
    storage = effective_storage_path(config.storage_path, ctx.record.facts.storage_path)
    data_uri = run_storage_uri(storage, ctx.record.run_id) if storage and storage.startswith("s3://") else None
    def role(address: str, policies: Sequence[str]) -> None:
        # The trust's actions and condition keys (the account is filled in when the role is made).
        shape = trust_shape(trust_statement(address, config.region, "", config.cluster_name, config.namespace))
        inline = inline_policies(address, config.cluster_name, ctx.record.run_id, config.region, data_uri)
        res(address, "aws-iam-role", RoleSpec(service=service_principal(address, config.region),
                                              policies=sorted(policies), trust=shape, **({"inline": inline}
                                                                                          if inline else {})))

    role(CLUSTER_ROLE, CLUSTER_POLICIES)
    role(NODE_ROLE, NODE_POLICIES)
    identities = planned_identities(config, data_uri)
    for identity in identities:
        role(identity.role_address, identity.policies)
    cluster_private = [subnet_address("private", az) for az in topo.network_azs]
    cidrs = api_cidrs
    access = ("OPEN TO THE WHOLE INTERNET (0.0.0.0/0): anyone can reach the API endpoint, which still asks "
              "for credentials" if "0.0.0.0/0" in cidrs else f"only from {', '.join(sorted(cidrs))}")
    # Made before the cluster (EKS writes into it, and would make it untagged otherwise), deleted after it;
    # the cluster does not depend on it, so a group made anew never makes the cluster again.
    res(LOG_GROUP, LogGroupHandler.kind, LogGroupSpec(name=log_group_name(config.cluster_name)),
        note=f"${CLOUDWATCH_LOGS_GB_MONTH:.2f}/GB-month of the control-plane logs it keeps")
    res(EKS_CLUSTER, "aws-eks-cluster", EksClusterSpec(version=config.kubernetes_version, azs=topo.network_azs,
                                                       auth="API", endpoint_private=True,
                                                       public_cidrs=sorted(cidrs), api_access=access,
                                                       logs=sorted(CONTROL_PLANE_LOGS)),
        CLUSTER_ROLE, NODE_SG, *cluster_private, cost=cost["eks_control_plane"].per_hour)
    res(ACCESS_ENTRY, "aws-access-entry", AccessEntrySpec(policy="cluster-admin"), EKS_CLUSTER)
    res(KUBECONFIG, "aws-kubeconfig", KubeconfigSpec(context="the cluster ARN"), EKS_CLUSTER, ACCESS_ENTRY)
    for addon in ADDONS:
        deps = (EKS_CLUSTER, SYSTEM_NODES) if addon == "coredns" else (EKS_CLUSTER,)
        configuration = ADDON_CONFIGURATION.get(addon)
        res(addon_address(addon), "aws-eks-addon",
            AddonSpec(name=addon, **({"configuration": configuration} if configuration else {})), *deps)
    for identity in identities:
        # The data role's pods write to the bucket: it exists before they can start.
        data_deps = (BUCKET,) if identity is DATA_IDENTITY and own_bucket else ()
        res(identity.address, "aws-pod-identity", PodIdentityHandler.spec(ctx, identity), EKS_CLUSTER,
            identity.role_address, addon_address(POD_IDENTITY_AGENT), *data_deps)
    efa = config.wants_efa()
    named = topo.gpu_reservation
    block = named is not None and named.kind == "capacity-block"
    placement, own_group = topo.gpu_placement_group
    if own_group:
        placement = names.placement_group(topo.gpu_az)
        res(PLACEMENT_GROUP, "aws-placement-group", PlacementGroupSpec(strategy="cluster", az=topo.gpu_az))
    res(LAUNCH_TEMPLATE, "aws-launch-template",
        LaunchTemplateSpec(efa=efa, efa_interfaces=topo.efa_interfaces if efa else 0, volume_gb=ROOT_VOLUME_GB,
                           imdsv2=True, imds_hop_limit=1, cluster_sg=True, reservation=named.id if named else None,
                           capacity_block=block, placement_group=placement),
        NODE_SG, EKS_CLUSTER, *((PLACEMENT_GROUP,) if own_group else ()),
        note="" if named is None else _placement_note(named))
    res(SYSTEM_LAUNCH_TEMPLATE, "aws-launch-template",
        LaunchTemplateSpec(volume_gb=topo.system_disk_gb, imdsv2=True, imds_hop_limit=1), EKS_CLUSTER)
    # The nodes join once aws-node can assign addresses: its permissions come by pod identity.
    node_deps = (EKS_CLUSTER, NODE_ROLE, *routes, addon_address("vpc-cni"), addon_address("kube-proxy"),
                 CNI_IDENTITY.address)
    system_cost, gpu_cost = cost["system_nodes"], cost["gpu_nodes"]
    scaling = gpu_scaling_config(config)  # min 0 when idle workers go (cluster-autoscaler takes their nodes)
    spot_types = config.spot_type_list() if spot else []
    res(SYSTEM_NODES, "aws-nodegroup",
        NodegroupSpec(instance_type=config.system_node_type, size=config.system_node_count, azs=topo.network_azs,
                      ami_type=AMI_CPU, labels={"role": "system"}, disk_gb=topo.system_disk_gb,
                      launch_template=True),
        *node_deps, *cluster_private, SYSTEM_LAUNCH_TEMPLATE,
        cost=system_cost.per_hour, note=system_cost.note,
        quota=_quota(topo.system_quota_code, topo.system_headroom,
                          topo.vcpus.get(config.system_node_type, 0) * config.system_node_count))
    res(GPU_NODES, "aws-nodegroup",
        NodegroupSpec(instance_type=config.gpu_node_type, size=config.gpu_node_count,
                      min_size=scaling["minSize"], max_size=scaling["maxSize"], azs=[topo.gpu_az],
                      ami_type=AMI_GPU, labels={GPU_LABEL: "true"}, taints=[GPU_TAINT], launch_template=True,
                      capacity_type="SPOT" if spot else "CAPACITY_BLOCK" if block else "ON_DEMAND",
                      **({"instance_types": [config.gpu_node_type, *spot_types]} if spot_types else {})),
        *node_deps, subnet_address("private", topo.gpu_az), LAUNCH_TEMPLATE,
        cost=gpu_cost.per_hour, note=gpu_cost.note,
        quota=_quota(topo.gpu_quota_code, topo.gpu_headroom,
                          topo.vcpus.get(config.gpu_node_type, 0) * config.gpu_node_count))
    if config.idle_timeout_s():  # the group may shrink to zero: cluster-autoscaler must know its nodes
        res(GPU_ASG_TAGS, "aws-asg-tags", AsgTagsSpec(tags=gpu_asg_tags(config, config.cluster_name, ctx.record.run_id,
                                                                       topo.efa_interfaces if efa else 0)), GPU_NODES)
        image = cluster_autoscaler_image(config.kubernetes_version)
        if image is not None:  # its credentials come with its pods, which start on the system node
            res(CLUSTER_AUTOSCALER, "aws-cluster-autoscaler", ClusterAutoscalerHandler.spec(ctx, image),
                KUBECONFIG, SYSTEM_NODES, AUTOSCALER_IDENTITY.address)
    return sorted(out, key=lambda r: rank(r.address)), idle


def efa_per_gpu_node(planned: Sequence[Resource]) -> int:
    """How many EFA devices each GPU node has, as the plan's GPU launch template gives it (0: none planned,
    or a template without EFA): what the kube layer asks of each Ray worker."""
    template = next((r for r in planned if r.address == LAUNCH_TEMPLATE), None)
    return LaunchTemplateSpec.of(template).efa_interfaces if template is not None else 0


def _quota(code: str | None, headroom: float | None, vcpus: int) -> dict[str, dict[str, float | None]]:
    return {code: {"vcpus": float(vcpus), "headroom": headroom}} if code else {}


def _idle_note(config: AwsConfig, cost: Mapping[str, Any], *, nat: bool) -> str:
    """What still bills while cluster-autoscaler has taken every GPU node (the plan's priced parts but
    the GPU nodes), beside the full size; empty with ``--idle-minutes 0`` (the nodes never go)."""
    if not config.idle_timeout_s():
        return ""
    full = sum(float(p.per_hour or 0.0) for p in cost.values())
    idle = full - float(cost["gpu_nodes"].per_hour or 0.0)
    billing = "the system node, EKS and the NAT gateway" if nat else "the system node and EKS"
    return (f"idle after {config.idle_minutes:g} min without a job: the GPU nodes scale to zero "
            f"(cluster-autoscaler) and {billing} keep billing, ${idle:.2f}/h instead of ${full:.2f}/h")


def _placement_note(named: NamedReservation) -> str:
    """Why the GPU nodes go where they go when a reservation holds them."""
    if named.kind == "capacity-block":
        return f"Capacity Block {named.id}: co-located already, no placement group"
    if named.placement_group:
        return f"targeted ODCR {named.id}: into its placement group {named.placement_group}"
    return f"targeted ODCR {named.id}: made outside any placement group, so none (its capacity is not in one)"

