"""The order an aws run's resources are made in, and so the order they go in (each waits for what it
needs): one list of address prefixes, the build's order; teardown goes the other way.

A plan's resources say what each needs (``Resource.depends_on``). What discovery finds in the account
(after a crash, on another machine) carries no plan: ``with_teardown_order`` gives each found resource
the resources it must outlive, from this list and ``needs``, which knows what shares nothing with the
rest (the bucket, the log group, IAM but for what uses each role).
"""

from __future__ import annotations

from backend.resources import Observed
from targets.aws.infra.autoscaler import CLUSTER_AUTOSCALER
from targets.aws.infra.common import (
    ACCESS_ENTRY,
    CLUSTER_ROLE,
    EKS_CLUSTER,
    GPU_ASG_TAGS,
    GPU_NODES,
    IGW,
    KUBECONFIG,
    LAUNCH_TEMPLATE,
    NAT,
    NODE_ROLE,
    NODE_SG,
    PLACEMENT_GROUP,
    PRIVATE_RT,
    PUBLIC_RT,
    SYSTEM_NODES,
    VPC,
)
from targets.aws.infra.endpoints import S3_ENDPOINT
from targets.aws.infra.iam import POD_IDENTITY_PREFIX
from targets.aws.infra.logs import LOG_GROUP
from targets.aws.infra.storage import BUCKET

# The order things are made in; teardown goes the other way (each waits for what depends on it).
ORDER = (BUCKET, VPC, "aws.subnet", IGW, NAT, PUBLIC_RT, PRIVATE_RT, S3_ENDPOINT, NODE_SG, CLUSTER_ROLE, NODE_ROLE,
         "aws.iam-role", LOG_GROUP, EKS_CLUSTER, ACCESS_ENTRY, KUBECONFIG, "aws.addon", "aws.pod-identity",
         PLACEMENT_GROUP, "aws.launch-template", SYSTEM_NODES, GPU_NODES, GPU_ASG_TAGS, CLUSTER_AUTOSCALER)


def rank(address: str) -> int:
    """Where ``address`` comes in ``ORDER`` (after every listed prefix when none matches)."""
    return next((i for i, prefix in enumerate(ORDER) if address == prefix or address.startswith(prefix + ".")),
                len(ORDER))


def with_teardown_order(observed: list[Observed]) -> list[Observed]:
    """Each found resource depends on everything found that is made before it: teardown then
    goes strictly in reverse (a NAT gateway before its subnet, the nodegroups before the cluster)."""
    out = []
    for o in observed:
        earlier = tuple(p.address for p in observed if rank(p.address) < rank(o.address)
                        and needs(o.address, p.address))
        out.append(o.model_copy(update={"depends_on": tuple(dict.fromkeys([*o.depends_on, *earlier]))}))
    return out


def needs(later: str, earlier: str) -> bool:
    """Whether ``later`` must go before ``earlier`` is deleted (they share the VPC; IAM stands apart)."""
    if BUCKET in (earlier, later):  # the bucket shares nothing with the rest: it goes when the job is gone
        return False
    if LOG_GROUP in (earlier, later):  # it shares only the cluster's name: it goes once the cluster is gone
        return earlier == LOG_GROUP and later == EKS_CLUSTER
    if earlier.startswith("aws.iam-role."):
        return later in (EKS_CLUSTER, SYSTEM_NODES, GPU_NODES) or later.startswith(POD_IDENTITY_PREFIX)
    if later.startswith("aws.iam-role."):
        return False
    if earlier == PLACEMENT_GROUP:
        return later in (LAUNCH_TEMPLATE, GPU_NODES)
    return True
