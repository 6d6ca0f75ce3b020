"""Which mode rtui runs in on a cluster it did not make: cluster-wide, or namespace-only.

On a shared cluster the user is often admin of one namespace (a RoleBinding of the ``admin``
ClusterRole): everything namespaced there, nothing cluster-scoped (Kubernetes docs, "Using RBAC
Authorization", "User-facing roles"). Such a user cannot list nodes, DaemonSets or CRDs across the
cluster, and cannot install CRDs, an operator or device plugins. The mode is decided by asking the API
server (SelfSubjectAccessReview, as ``kubectl auth can-i`` does), never by trying and catching 403s:
in namespace-only mode rtui uses the cluster's own KubeRay (``ray.io/v1`` served), plans only objects
in the namespace, adopts a namespace that exists, and says once what it could not see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from backend.errors import ApiUnreachable, RtuiError

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

# What the cluster-wide mode reads before it plans (discovery of the add-ons, the node checks):
# (verb, resource, API group), each at the cluster scope.
CLUSTER_READS: tuple[tuple[str, str, str], ...] = (
    ("list", "nodes", ""),
    ("list", "daemonsets", "apps"),
    ("list", "deployments", "apps"),
    ("list", "customresourcedefinitions", "apiextensions.k8s.io"),
)
# What the NetworkPolicy admits to the dashboard port when the API server's addresses cannot be read
# (Endpoints default/kubernetes is outside the namespace): any address; Ray's token still refuses a
# caller without it, and the GCS and worker ports stay closed to pods that are not the run's.
ANYWHERE = ("0.0.0.0/0", "::/0")


@dataclass(frozen=True)
class Rights:
    """What the kubeconfig's credentials may do, as far as rtui's plan cares."""

    namespace: str
    denied: tuple[str, ...] = ()  # "list nodes", ... (cluster-wide reads the review refused)
    asked: bool = True  # False: the review could not be made (the cluster-wide mode, as before)

    @property
    def cluster_wide(self) -> bool:
        return not self.denied

    def line(self) -> str:
        if not self.asked:
            return "cluster-wide: the API server did not answer SelfSubjectAccessReview, so rtui assumes it"
        if self.cluster_wide:
            return "cluster-wide: these credentials may list nodes, DaemonSets, Deployments and CRDs " \
                   "(SelfSubjectAccessReview)"
        return (f"namespace-only: these credentials cannot {', '.join(self.denied)} at the cluster scope "
                f"(SelfSubjectAccessReview); rtui uses the cluster's KubeRay and makes objects only in "
                f"{self.namespace}")

    def unseen(self) -> str:
        """The one line for every cluster-scope check skipped in namespace-only mode."""
        return ("not visible with namespace rights, so not checked: the nodes (GPUs, CPU, memory), the device "
                "plugins, the KubeRay operator, the node autoscaler and the CNI; workers that fit no node stay "
                "Pending, and rtui says so")


# One answer per cluster, context and namespace for the process: the plan, its apply and the handlers
# ask the same question, and rights do not change between them.
_DECIDED: dict[tuple[str, str, str], Rights] = {}


async def decide(api: KubeApi, namespace: str) -> Rights:
    key = (api.server, api.context, namespace)
    if key in _DECIDED:
        return _DECIDED[key]
    try:
        denied = [f"{verb} {resource}.{group}" if group else f"{verb} {resource}"
                  for verb, resource, group in CLUSTER_READS if not await api.can_i(verb, resource, group)]
        rights = Rights(namespace, tuple(denied))
    except ApiUnreachable:
        raise  # no answer at all is not a "no": nothing is decided, the caller says the cluster is silent
    except RtuiError:
        # No review (an old or locked-down server): today's behaviour, whose 403s then say what is missing.
        rights = Rights(namespace, asked=False)
    _DECIDED[key] = rights
    return rights


def known(api: KubeApi) -> Rights | None:
    """The decision already made for this cluster and context (any namespace), for code that has no
    namespace at hand (the API server's addresses)."""
    return next((r for (server, context, _), r in _DECIDED.items()
                 if server == api.server and context == api.context), None)
