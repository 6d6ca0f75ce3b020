"""The Kubernetes API of a run's cluster, as the run's target reaches it.

Below the layer and its handlers, which both reach the cluster through ``kube_api`` (the handlers
cannot import the layer that imports them). The APIs are the session's (``ctx.clients``). A target
whose stack has this layer says how its cluster is reached (``ClusterAccess``): the kube target
through the kubeconfig (``kubeconfig_api``), the aws target through EKS (``targets.aws.eks``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from backend import targets
from backend.errors import OperationError
from backend.layers.base import Context
from targets.kube.config import kube_config

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

Obj = dict[str, Any]


class ClusterNotReady(OperationError):
    """The run's cluster is not there (yet; the aws target's EKS cluster): nothing of this layer can exist in it."""


@runtime_checkable
class ClusterAccess(Protocol):
    """How a target reaches its cluster's API (a target without it: through the kubeconfig)."""

    def kube_api(self, ctx: Context) -> KubeApi:
        """The API, made once per session (it refreshes its own token; the session closes it)."""

    async def cluster_api(self, ctx: Context) -> KubeApi:
        """The API after checking the cluster is there to reach (ClusterNotReady when it is not)."""


def kube_api(ctx: Context) -> KubeApi:
    """The cluster's API for this config, made once per session."""
    access = targets.get(kube_config(ctx).target)
    return access.kube_api(ctx) if isinstance(access, ClusterAccess) else kubeconfig_api(ctx)


async def cluster_api(ctx: Context) -> KubeApi:
    """The cluster's API, checked first where the target can check it (an EKS cluster may have gone since)."""
    access = targets.get(kube_config(ctx).target)
    return await access.cluster_api(ctx) if isinstance(access, ClusterAccess) else kubeconfig_api(ctx)


def kubeconfig_api(ctx: Context) -> KubeApi:
    """The API of the kubeconfig's cluster (``--kubeconfig``, ``--context``)."""
    # lazy: the kubernetes client (~1 s) only when a cluster is reached; making the stack does without
    from targets.kube.api import KubeApi

    config = kube_config(ctx)
    key = ("kube", config.kubeconfig, config.context, config.kube_timeout_s, config.kube_stream_idle_s)
    return ctx.clients.get(key, lambda: KubeApi.from_kubeconfig(config.kubeconfig, config.context,
                                                                timeout_s=config.kube_timeout_s,
                                                                stream_idle_s=config.kube_stream_idle_s))
