"""The Kubernetes API of a run's cluster: from the kubeconfig (kube target) or from EKS (aws target).

Below the layer and its handlers, which both reach the cluster through ``kube_api`` (the handlers
cannot import the layer that imports them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backend.config import RunConfig
from backend.errors import OperationError
from backend.layers.base import Context

if TYPE_CHECKING:
    from backend.layers.kubernetes.access import KubeApi

Obj = dict[str, Any]
_APIS: dict[tuple[str | None, ...], KubeApi] = {}


class ClusterNotReady(OperationError):
    """The aws target's EKS cluster is not there (yet): nothing of this layer can exist in it."""


def kube_api(ctx: Context) -> KubeApi:
    """The cluster's API for this config, made once per process (it refreshes its own token)."""
    # lazy: the kubernetes client only when a cluster is reached; not on the aws target's first frame
    from backend.layers.kubernetes.access import KubeApi

    if ctx.config.target == "aws":
        return _eks_api(ctx)
    key = (ctx.config.kubeconfig, ctx.config.context, str(ctx.config.kube_timeout_s),
           str(ctx.config.kube_stream_idle_s))
    if key not in _APIS:
        _APIS[key] = KubeApi.from_kubeconfig(ctx.config.kubeconfig, ctx.config.context,
                                             timeout_s=ctx.config.kube_timeout_s,
                                             stream_idle_s=ctx.config.kube_stream_idle_s)
    return _APIS[key]


def close_apis() -> None:
    """Close every cluster API this process made (their connections and idle threads)."""
    _EKS.clear()
    while _APIS:
        _APIS.popitem()[1].close()


def _eks_api(ctx: Context) -> KubeApi:
    """The EKS cluster of an aws run, as DescribeCluster showed it last (``refresh_eks_api``).

    Its endpoint and CA come from EKS, never from a kubeconfig entry: an entry named by the same ARN
    may be a leftover of a deleted cluster, or point at another one altogether. rtui signs its own
    EKS token (no exec plugin runs). The first use in a process asks EKS itself.
    """
    key = _eks_key(ctx)
    if key not in _EKS:
        _remember_eks(ctx, _describe_eks(ctx.config))
    return _EKS[key]


async def refresh_eks_api(ctx: Context) -> KubeApi:
    """Ask EKS again for the run's cluster: its API, or ClusterNotReady when there is none to use."""
    # lazy: boto3 only on the aws target; the kube target never loads it
    from backend.layers.aws.base import aws_api
    from backend.layers.aws.cluster import describe_cluster

    cluster = await describe_cluster(aws_api(ctx.config), ctx.config.cluster_name)
    return _remember_eks(ctx, cluster)


async def cluster_api(ctx: Context) -> KubeApi:
    """The cluster's API, the aws target's checked with EKS first (a cluster may have gone since)."""
    return await refresh_eks_api(ctx) if ctx.config.target == "aws" else kube_api(ctx)


_EKS: dict[tuple[str, str, str | None], KubeApi] = {}


def _eks_key(ctx: Context) -> tuple[str, str, str | None]:
    return ctx.config.cluster_name, ctx.config.region, ctx.config.profile


def _describe_eks(config: RunConfig) -> Obj | None:
    """The EKS cluster of this name (None: there is none), through the aws layer's client, blocking:
    only the first use in a process (``refresh_eks_api`` asks on the loop's terms)."""
    # lazy: boto3 only on the aws target; the kube target never loads it
    from botocore.exceptions import BotoCoreError, ClientError

    from backend.layers.aws.base import aws_api

    api = aws_api(config)
    try:
        return dict(api.client("eks").describe_cluster(name=config.cluster_name)["cluster"])
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return None
        raise api.error(err, "eks:DescribeCluster") from None
    except BotoCoreError as err:
        raise api.error(err, "eks:DescribeCluster") from None


def _remember_eks(ctx: Context, cluster: Obj | None) -> KubeApi:
    # lazy: boto3 and the kubernetes client only when the aws target reaches its cluster
    import boto3

    from backend.layers.kubernetes import eks
    from backend.layers.kubernetes.access import KubeApi

    config, key = ctx.config, _eks_key(ctx)
    endpoint = (cluster or {}).get("endpoint")
    ca_data = ((cluster or {}).get("certificateAuthority") or {}).get("data")
    if cluster is None or (cluster.get("tags") or {}).get(eks.RUN_TAG) != ctx.record.run_id \
            or cluster.get("status") not in ("ACTIVE", "UPDATING") or not endpoint or not ca_data:
        _EKS.pop(key, None)
        state = "not there" if cluster is None else "not this run's" \
            if (cluster.get("tags") or {}).get(eks.RUN_TAG) != ctx.record.run_id else str(cluster.get("status"))
        raise ClusterNotReady(f"the EKS cluster {config.cluster_name} is {state.lower()}",
                              remedy="`rtui up` makes it")
    ca_file = eks.ca_file(str(ca_data))
    api_key = ("aws", str(cluster["arn"]), str(endpoint), ca_file, str(config.kube_timeout_s),
               str(config.kube_stream_idle_s))
    if api_key not in _APIS:
        provider = eks.EksTokenProvider(config.cluster_name, config.region,
                                        boto3.Session(profile_name=config.profile, region_name=config.region))
        _APIS[api_key] = KubeApi.for_server(str(endpoint), ca_file, context=str(cluster["arn"]),
                                            token_provider=provider, timeout_s=config.kube_timeout_s,
                                            stream_idle_s=config.kube_stream_idle_s)
    _EKS[key] = _APIS[api_key]
    return _EKS[key]
