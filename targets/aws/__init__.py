"""The aws target: a new EKS cluster with EFA GPU nodes in one AZ (DESIGN.md §3).

Layers: ``targets.aws.infra`` (network, IAM, EKS, nodegroups), then the kube layer (shared
with the kube target: this target hands it the addresses of what the aws layer makes), the caller's
access narrowed to the namespace when asked (``targets.aws.infra.access_scope``) and the ray-job layer.
Read-only AWS (preflight matrix, pricing, quotas) is ``targets.aws.cloud``. The first
screen's panel, the region/AZ feasibility matrix, is ``targets.aws.panel``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from backend.clients import Clients
from backend.errors import UserError
from backend.planner import Stack
from backend.targets import Defaults, GpuNodes, InterruptionRate, Target
from targets.aws.check import feasibility
from targets.aws.config import AwsConfig
from targets.aws.facts import AwsFacts
from targets.kube import (
    GPU_SCALE_UP_S,
    gpu_cluster_defaults,
    gpu_cluster_job_nodes,
    gpu_cluster_nodes,
    kubernetes_manifest,
)

if TYPE_CHECKING:
    from pathlib import Path

    from backend.errors import NoCapacity
    from backend.layers.base import Context
    from backend.record import RunFacts
    from targets.kube.api import KubeApi


class AwsTarget(Target[AwsConfig]):
    name = "aws"
    label = "AWS — a new EKS cluster with EFA GPU nodes, in an AZ the checks pick"
    costs_money = True
    has_kubernetes = True
    has_feasibility = True
    config_model = AwsConfig
    facts_model = AwsFacts
    panel = "targets.aws.panel:MatrixPanel"
    scale_up_s = GPU_SCALE_UP_S
    nowhere_to_move = ("no other feasible AZ is left for the GPU nodes",
                       "`rtui check --target aws --all-regions` shows other regions")
    fail_over_words = ("AWS has no capacity for the GPU nodes in their AZ. m moves them to the next feasible AZ and "
                       "re-plans (`rtui up --az-failover` does the same)")

    def stack(self, config: AwsConfig) -> Stack:
        # lazy: the layers (aiohttp, boto3, kubernetes) load when the stack is made; listing targets does without
        from backend.layers.ray_job import RayJobLayer
        from targets.aws.infra.access_scope import AccessScopeLayer
        from targets.aws.infra.common import GPU_NODES, KUBECONFIG, SYSTEM_NODES
        from targets.aws.infra.desired import efa_per_gpu_node
        from targets.aws.infra.iam import DATA_IDENTITY, DATA_WORKERS_IDENTITY
        from targets.aws.infra.layer import AwsLayer
        from targets.kube.layer import Below, KubeLayer

        below = Below(api_ready=KUBECONFIG, system_nodes=SYSTEM_NODES, gpu_nodes=GPU_NODES,
                      efa_per_node=efa_per_gpu_node,
                      network_policy="enforced by the VPC CNI's network policy agent (the aws layer installs the "
                                     "vpc-cni add-on with enableNetworkPolicy on)",
                      # The run's data in S3: the Ray pods' account, its role by pod identity (issue 25).
                      ray_service_account=DATA_IDENTITY.service_account, ray_identity=DATA_IDENTITY.address,
                      ray_worker_service_account=DATA_WORKERS_IDENTITY.service_account,
                      ray_worker_identity=DATA_WORKERS_IDENTITY.address)
        # The access entry is narrowed (--access-scope namespace) after the kube layer's installs.
        return Stack(self.name, [AwsLayer(), KubeLayer(below), AccessScopeLayer(), RayJobLayer()])

    def defaults(self, config: AwsConfig) -> Defaults:
        return gpu_cluster_defaults(config)

    def job_nodes(self, config: AwsConfig) -> int | None:
        return gpu_cluster_job_nodes(config)

    def manifest(self, config: AwsConfig, run_id: str) -> str | None:
        return kubernetes_manifest(config, run_id)

    def gpu_nodes(self, config: AwsConfig) -> GpuNodes | None:
        return gpu_cluster_nodes(config)

    def where(self, config: AwsConfig) -> str:
        return config.availability_zone or config.region  # the AZ once chosen, else the region

    async def tagged_runs(self, config: AwsConfig) -> list[str]:
        # lazy: boto3 (~400 ms) only on the aws target; listing the targets does without
        from targets.aws.infra.api import AwsApi
        from targets.aws.infra.sweep import runs_of_cluster

        async with Clients() as clients:  # no session yet: the run found opens its own
            api = clients.get(("aws", config.region, config.profile), lambda: AwsApi(config.region, config.profile))
            return list(await runs_of_cluster(api, config.cluster_name))

    def fail_over(self, stack: Stack, ctx: Context, error: NoCapacity, *, elsewhere: bool = True,
                  on_demand: bool | None = True) -> str | None:
        """Spot GPU nodes AWS has no Spot capacity for go On-Demand in their AZ (``on_demand``); else the
        GPU nodes move to the next feasible AZ (``elsewhere``). ``AwsLayer`` keeps why in the record."""
        # lazy: boto3 (~400 ms) only on the aws target; listing the targets does without
        from targets.aws.infra.layer import AwsLayer

        layer = next((x for x in stack.layers if isinstance(x, AwsLayer)), None)
        if layer is None or layer.topology is None:
            return None
        old = error.az or layer.topology.gpu_az
        if on_demand is None:
            on_demand = AwsConfig.of(ctx.config).spot_fallback == "on-demand"
        if on_demand and layer.buys_spot(ctx):
            layer.fall_back_to_on_demand(ctx, old, error.message)
            return f"{error.code} for Spot in {old}: the GPU nodes go On-Demand there (at the On-Demand price)"
        if not elsewhere:
            return None
        new = layer.fail_over(ctx, old, error.message)
        return None if new is None else f"{error.code} in {old}: moving the GPU nodes to {new}"

    def fail_over_hint(self, config: AwsConfig, facts: RunFacts) -> str | None:
        if config.spot and AwsFacts.of(facts).spot_fallback is None:
            return ("AWS has no Spot capacity for the GPU nodes in their AZ. m moves them to On-Demand there, at the "
                    "On-Demand price, and re-plans (`rtui up --spot-fallback on-demand` does the same)")
        return self.fail_over_words

    def interruption_rate(self, config: AwsConfig, facts: RunFacts) -> InterruptionRate:
        """Spot GPU nodes: how often Spot takes one back (the Spot Instance Advisor's bucket for the GPU
        types in the region, as the plan read it) on top of the failures every GPU node has. When the plan
        could not read the advisor, its worst bucket (">20%" a month): AWS publishes no higher edge."""
        base = super().interruption_rate(config, facts)
        own = AwsFacts.of(facts)
        if not config.spot or own.spot_fallback is not None:
            return base
        risk = own.spot_risk
        if risk is None:
            # lazy: the advisor's module (pydantic models of the preflight) only for a Spot plan
            from targets.aws.cloud.spot_advisor import rate_per_hour

            per_hour, source = rate_per_hour(0.2), "Spot taking back >20% of nodes a month (no advisor data)"
        else:
            per_hour, source = risk.per_node_hour, risk.source
        return InterruptionRate(per_hour + base.per_node_hour, f"{source}, plus {base.source}")

    def check(self, config: AwsConfig, cwd: Path) -> AwsConfig:
        for field, (message, remedy) in config.refused_fields.items():  # a config made otherwise than by flags
            if getattr(config, field) != type(config).model_fields[field].default:
                raise UserError(message, remedy=remedy)
        if config.spot_fallback != "none" and not config.spot:
            raise UserError(f"--spot-fallback {config.spot_fallback}: only with --spot (the GPU nodes are On-Demand "
                            "without it)", remedy="add --spot, or leave --spot-fallback out")
        if config.spot_types and not config.spot:
            raise UserError("--spot-types: only with --spot (On-Demand GPU nodes are all the GPU node type)",
                            remedy="add --spot, or leave --spot-types out")
        return config

    def feasibility(self, config: AwsConfig, *, regions: list[str] | None, all_regions: bool,
                    request_quota: bool, yes: bool, as_json: bool, out: TextIO) -> int | None:
        return feasibility(config, regions=regions, all_regions=all_regions, request_quota=request_quota, yes=yes,
                           as_json=as_json, out=out)

    def storage_profile(self, config: AwsConfig) -> str | None:
        return config.profile

    # Its ClusterAccess (targets.kube.cluster_api): the kube layer reaches the EKS cluster as EKS
    # describes it, never through a kubeconfig entry.
    def kube_api(self, ctx: Context) -> KubeApi:
        # lazy: boto3 and the kubernetes client only when the cluster is reached
        from targets.aws.eks_api import eks_api

        return eks_api(ctx)

    async def cluster_api(self, ctx: Context) -> KubeApi:
        # lazy: boto3 and the kubernetes client only when the cluster is reached
        from targets.aws.eks_api import refresh_eks_api

        return await refresh_eks_api(ctx)
