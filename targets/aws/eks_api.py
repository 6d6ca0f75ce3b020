"""The EKS cluster's API for the kube layer on the aws target (its ``ClusterAccess``).

Its endpoint and CA come from EKS (DescribeCluster), never from a kubeconfig entry, and rtui signs
its own EKS token (``targets.aws.eks``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from backend.boto import boto3_session
from backend.layers.base import Context
from targets.aws import eks
from targets.aws.config import aws_config
from targets.aws.infra.cluster import describe_cluster
from targets.aws.infra.common import aws_api
from targets.kube.cluster_api import ClusterNotReady

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

Obj = dict[str, Any]


def eks_api(ctx: Context) -> KubeApi:
    """The EKS cluster of an aws run, as DescribeCluster showed it last (``refresh_eks_api``).

    Its endpoint and CA come from EKS, never from a kubeconfig entry: an entry named by the same ARN
    may be a leftover of a deleted cluster, or point at another one altogether. rtui signs its own
    EKS token (no exec plugin runs). The first use in a session asks EKS itself.
    """
    # lazy: the kubernetes client (~1 s) only when a cluster is reached; making the stack does without
    from targets.kube.api import KubeApi

    known = ctx.clients.aliased(_eks_key(ctx))
    if isinstance(known, KubeApi):
        return known
    return _remember_eks(ctx, _describe_eks(ctx))


async def refresh_eks_api(ctx: Context) -> KubeApi:
    """Ask EKS again for the run's cluster: its API, or ClusterNotReady when there is none to use."""
    cluster = await describe_cluster(aws_api(ctx), aws_config(ctx).cluster_name)
    return _remember_eks(ctx, cluster)


def _eks_key(ctx: Context) -> tuple[str, str, str, str | None]:
    config = aws_config(ctx)
    return "eks", config.cluster_name, config.region, config.profile


def _describe_eks(ctx: Context) -> Obj | None:
    """The EKS cluster of this name (None: there is none), through the aws layer's client, blocking:
    only the first use in a session (``refresh_eks_api`` asks on the loop's terms)."""
    api = aws_api(ctx)
    try:
        return dict(api.client("eks").describe_cluster(name=aws_config(ctx).cluster_name)["cluster"])
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return None
        raise api.error(err, "eks:DescribeCluster") from None
    except BotoCoreError as err:
        raise api.error(err, "eks:DescribeCluster") from None


def _remember_eks(ctx: Context, cluster: Obj | None) -> KubeApi:
    # lazy: the kubernetes client (~1 s) only when a cluster is reached
    from targets.kube.api import KubeApi

    config, key = aws_config(ctx), _eks_key(ctx)
    endpoint = (cluster or {}).get("endpoint")
    ca_data = ((cluster or {}).get("certificateAuthority") or {}).get("data")
    if cluster is None or (cluster.get("tags") or {}).get(eks.RUN_TAG) != ctx.record.run_id \
            or cluster.get("status") not in ("ACTIVE", "UPDATING") or not endpoint or not ca_data:
        ctx.clients.forget(key)
        state = "not there" if cluster is None else "not this run's" \
            if (cluster.get("tags") or {}).get(eks.RUN_TAG) != ctx.record.run_id else str(cluster.get("status"))
        raise ClusterNotReady(f"the EKS cluster {config.cluster_name} is {state.lower()}",
                              remedy="`rtui up` makes it")
    ca_file = eks.ca_file(str(ca_data))
    arn = str(cluster["arn"])
    api_key = ("eks-api", arn, str(endpoint), ca_file, config.kube_timeout_s,
               config.kube_stream_idle_s)

    def make() -> KubeApi:
        provider = eks.EksTokenProvider(config.cluster_name, config.region,
                                        boto3_session(config.profile, config.region))
        return KubeApi.for_server(str(endpoint), ca_file, context=arn, token_provider=provider,
                                  timeout_s=config.kube_timeout_s, stream_idle_s=config.kube_stream_idle_s)

    api = ctx.clients.get(api_key, make)
    ctx.clients.alias(key, api_key)
    return api
