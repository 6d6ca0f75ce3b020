"""The aws layer's own preflight checks beside the feasibility matrix: names this run would take that
something else holds, and a given VPC's subnets."""

from __future__ import annotations

from backend.layers.base import Context
from backend.resources import CheckResult, CheckStatus
from targets.aws.config import aws_config
from targets.aws.infra.api import RUN_TAG
from targets.aws.infra.cluster import describe_cluster
from targets.aws.infra.common import Topology, aws_api
from targets.aws.infra.iam import RoleHandler


async def names_taken(ctx: Context, roles: RoleHandler) -> list[CheckResult]:
    """What this run would make under a name that is already taken by something it did not make."""
    config = aws_config(ctx)
    api = aws_api(ctx)
    name = config.cluster_name
    out = []
    cluster = await describe_cluster(api, name)
    if cluster is not None and (cluster.get("tags") or {}).get(RUN_TAG) != ctx.record.run_id:
        owner = "another rtui run" if RUN_TAG in (cluster.get("tags") or {}) else "someone else"
        out.append(CheckResult(id="aws.name.cluster", title=f"EKS cluster {name}", status=CheckStatus.FAIL,
                               detail=f"exists in {config.region} and belongs to {owner}",
                               remedy="choose another --cluster-name (rtui never takes over what it did not make)"))
    for stack in (f"eksctl-{name}-cluster", name):
        found = await api.call("cloudformation", "describe_stacks", StackName=stack, ok=("ValidationError",))
        live = [s for s in (found or {}).get("Stacks") or [] if s.get("StackStatus") != "DELETE_COMPLETE"]
        if live:
            out.append(CheckResult(id="aws.name.stack", title=f"CloudFormation stack {stack}",
                                   status=CheckStatus.FAIL, detail="exists: a cluster of this name is managed "
                                   "by eksctl or CloudFormation", remedy="choose another --cluster-name"))
    for role in await roles.foreign(api, ctx):
        out.append(CheckResult(id="aws.name.role", title=f"IAM role {role}", status=CheckStatus.FAIL,
                               detail="exists and was not made by this run",
                               remedy="choose another --cluster-name"))
    return out


async def given_vpc(ctx: Context, topo: Topology) -> list[CheckResult]:
    """Whether ``--private-subnet-ids`` are private subnets of ``--vpc-id`` in two AZs, the GPU AZ one."""
    api, config = aws_api(ctx), aws_config(ctx)
    ids = config.private_subnet_id_list()
    if not ids:
        return [CheckResult(id="aws.vpc", title=f"VPC {config.vpc_id}", status=CheckStatus.FAIL,
                            detail="--vpc-id needs its private subnets", remedy="pass --private-subnet-ids")]
    subnets = await api.pages("ec2", "describe_subnets", "Subnets", SubnetIds=ids)
    problems = [f"{s['SubnetId']} is in {s['VpcId']}" for s in subnets if s["VpcId"] != config.vpc_id]
    azs = {s["AvailabilityZone"] for s in subnets}
    if topo.gpu_az not in azs:
        problems.append(f"no private subnet in the GPU AZ {topo.gpu_az}")
    if len(azs) < 2:
        problems.append("EKS needs private subnets in two AZs")
    # DNS and each subnet's way out were checked by prepare (given_vpc), which refuses in one line.
    return [CheckResult(id="aws.vpc", title=f"VPC {config.vpc_id}",
                        status=CheckStatus.FAIL if problems else CheckStatus.OK,
                        detail=problems[0] if problems else f"{len(subnets)} private subnets in {sorted(azs)}",
                        remedy="fix the subnets or drop --vpc-id to let rtui build a VPC" if problems else None)]
