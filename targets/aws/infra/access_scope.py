"""``--access-scope namespace``: the caller's EKS access entry narrowed to the run's namespace once
rtui's cluster-wide objects are installed, and widened back before teardown deletes any of them.

A layer of its own, stacked by ``targets.aws`` above the kube layer: its one resource depends on
everything that needs cluster admin to install (the Namespace, the device plugins in kube-system, the
KubeRay CRDs and operator, cluster-autoscaler, the access entry), so it comes after them; teardown runs
in reverse dependency order, so restoring cluster admin comes before every deletion of a cluster-wide
object, and ``down`` never locks itself out. Each call is idempotent and discovery keeps finding the
narrowed entry (its group or its namespaced policy) until the restore has finished: a ``down`` that
crashed half-way is finished by the next one.

Which policy: AmazonEKSAdminPolicy, not AmazonEKSEditPolicy. Both are namespaced grants of Kubernetes'
own resources (EKS User Guide, "Review access policy permissions"); Admin adds Roles and RoleBindings
of the namespace, which rtui itself manages there (the operator's Role under ``--operator-scope
namespace``, the RayCluster Role below) and which the user would otherwise have to widen the entry
again to fix. Neither reaches anything cluster-scoped, which is the point.

Neither covers custom resources (RayCluster) nor the cluster-scoped reads rtui's discovery makes (Nodes,
CustomResourceDefinitions, and DaemonSets and Deployments of every namespace: which device plugins,
operator and node autoscaler are there). EKS's answer for what the policies lack is Kubernetes RBAC for a
group named in the access entry: made while still cluster admin, a ClusterRole that only reads those
kinds (no Secrets, no writes), a Role that reads only the Endpoints ``default/kubernetes`` (the API
server's addresses the NetworkPolicy admits) and a Role that manages RayClusters in the namespace, all
bound to the entry's group ``rtui-<cluster>-caller``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar

from backend.layers.base import Context, Handler, Layer
from backend.resources import Observed, Resource
from backend.runner import Progress
from targets.aws.config import aws_config
from targets.aws.infra.api import AwsApi, partition
from targets.aws.infra.autoscaler import CLUSTER_AUTOSCALER
from targets.aws.infra.cluster import (
    NAMESPACE_POLICY_NAME,
    admin_policy,
    caller_access_entry,
    caller_principal,
)
from targets.aws.infra.common import ACCESS_ENTRY, EKS_CLUSTER, AwsHandler, aws_api
from targets.aws.infra.specs import AccessScopeSpec
from targets.kube import manifests
from targets.kube.cluster_api import ClusterNotReady, cluster_api
from targets.kube.handlers import EFA_PLUGIN, NAMESPACE, NVIDIA_PLUGIN, OPERATOR, apply_all, delete_ours
from targets.kube.security import APISERVER_ENDPOINTS

LAYER = "aws-access"
ACCESS_SCOPE = "aws.access-scope"
_NOT_FOUND = ("ResourceNotFoundException",)
_READ = ["get", "list", "watch"]
# What rtui's discovery reads outside the namespace (targets/kube: the device plugins, the
# operator and its CRDs, the nodes; targets/aws/infra/autoscaler.py: cluster-autoscaler's Deployment).
CLUSTER_READS = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": _READ},
    {"apiGroups": ["apps"], "resources": ["daemonsets", "deployments"], "verbs": _READ},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": _READ},
]
RAYCLUSTER_RULES = [{"apiGroups": ["ray.io"], "resources": ["rayclusters", "rayclusters/status"],
                     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]


def namespace_policy(region: str) -> str:
    return f"arn:{partition(region).name}:eks::aws:cluster-access-policy/{NAMESPACE_POLICY_NAME}"


def caller_group(cluster: str) -> str:
    return f"rtui-{cluster}-caller"


def _installed_first() -> tuple[str, ...]:
    """What needs cluster admin to install: the narrowing waits for each of them that the plan makes."""

    return ACCESS_ENTRY, CLUSTER_AUTOSCALER, NAMESPACE, NVIDIA_PLUGIN, EFA_PLUGIN, OPERATOR


def rbac_objects(cluster: str, namespace: str, run_id: str) -> list[dict[str, Any]]:
    """The grants the namespaced policy lacks, bound to the access entry's group."""

    labels = manifests.labels(run_id)
    group = caller_group(cluster)
    name = f"{group}-read"[:253]
    subject = [{"kind": "Group", "name": group, "apiGroup": "rbac.authorization.k8s.io"}]
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": name, "labels": labels},
         "rules": CLUSTER_READS},
        {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": name, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": subject},
        # The NetworkPolicy admits the API server's addresses, read from this one object when applied.
        {"apiVersion": rbac, "kind": "Role", "metadata": {"name": name, "namespace": APISERVER_ENDPOINTS[0],
                                                          "labels": labels},
         "rules": [{"apiGroups": [""], "resources": ["endpoints"], "resourceNames": [APISERVER_ENDPOINTS[1]],
                    "verbs": ["get"]}]},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": name, "namespace": APISERVER_ENDPOINTS[0],
                                                                 "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": subject},
        {"apiVersion": rbac, "kind": "Role", "metadata": {"name": "rtui-caller-rayclusters", "namespace": namespace,
                                                          "labels": labels},
         "rules": RAYCLUSTER_RULES},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": "rtui-caller-rayclusters",
                                                                 "namespace": namespace, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rtui-caller-rayclusters"},
         "subjects": subject},
    ]


class AccessScopeHandler(AwsHandler):
    kind = "aws-access-scope"
    spec_model = AccessScopeSpec
    title = "Narrow your cluster admin to the run's namespace"
    delete_title = "Restore your cluster admin (before anything cluster-wide is deleted)"
    address = ACCESS_SCOPE
    expected_s = 3.0
    follows_dependencies = False  # a dependency made again is made while still (or again) cluster admin

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        # Looked for when this run asks for it or its ledger has it (a run narrowed once is found by `down`
        # whatever its flags): other runs pay no calls for it.
        config = aws_config(ctx)
        if config.access_scope != "namespace" and ACCESS_SCOPE not in ctx.record.resources:
            return []
        found = await caller_access_entry(api, ctx)
        if found is None:
            return []
        name = config.cluster_name
        principal, entry, policies = found
        groups = list(entry.get("kubernetesGroups") or [])
        region = config.region
        narrow = [p for p in policies if p.get("policyArn") == namespace_policy(region)]
        admin = any(p.get("policyArn") == admin_policy(region) and (p.get("accessScope") or {}).get("type") == "cluster"
                    for p in policies)
        group = caller_group(name)
        if not narrow and group not in groups:
            return []
        scope = (narrow[0].get("accessScope") or {}) if narrow else {}
        namespaces = [str(n) for n in scope.get("namespaces") or []]
        state = {"scope": scope.get("type"), "namespaces": namespaces,
                 "policy": NAMESPACE_POLICY_NAME if narrow else None, "group": group if group in groups else None}
        missing = [why for why, bad in (("the namespaced policy", not narrow), ("the RBAC group", group not in groups),
                                        ("cluster admin still associated", admin)) if bad]
        return [Observed(address=ACCESS_SCOPE, layer=LAYER, kind=self.kind, id=f"{name}|{principal}",
                         depends_on=(EKS_CLUSTER, *_installed_first()), state=state, healthy=not missing,
                         reason=f"narrowed to {', '.join(namespaces) or 'no namespace'}" if not missing
                         else "half narrowed: " + "; ".join(missing))]

    def kube_objects(self, ctx: Context, want: Resource) -> list[dict[str, Any]]:
        config = aws_config(ctx)
        return rbac_objects(config.cluster_name, config.namespace, ctx.record.run_id)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:

        config = aws_config(ctx)
        api = self.api(ctx)
        name, namespace, region = config.cluster_name, config.namespace, config.region
        principal = await caller_principal(api)
        self.made(ctx, want, f"{name}|{principal}")
        # While still cluster admin: the grants the namespaced policy lacks, then the group that gets them.
        async for p in apply_all(await cluster_api(ctx), self.kube_objects(ctx, want)):
            yield p
        entry = (await api.call("eks", "describe_access_entry", clusterName=name, principalArn=principal))
        groups = list(entry["accessEntry"].get("kubernetesGroups") or [])
        await api.call("eks", "update_access_entry", clusterName=name, principalArn=principal,
                       kubernetesGroups=list(dict.fromkeys([*groups, caller_group(name)])))
        await api.call("eks", "associate_access_policy", clusterName=name, principalArn=principal,
                       policyArn=namespace_policy(region), accessScope={"type": "namespace", "namespaces": [namespace]})
        await api.call("eks", "disassociate_access_policy", clusterName=name, principalArn=principal,
                       policyArn=admin_policy(region), ok=_NOT_FOUND)
        yield Progress(f"{principal} is admin of the namespace {namespace} only", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:

        config = aws_config(ctx)
        api = self.api(ctx)
        name, principal = have.id.split("|", 1)
        region = config.region
        # Cluster admin first: each later call (and every deletion that waits for this step) needs it.
        await api.call("eks", "associate_access_policy", clusterName=name, principalArn=principal,
                       policyArn=admin_policy(region), accessScope={"type": "cluster"})
        yield Progress(f"{principal} is cluster admin again", 0.5)
        await api.call("eks", "disassociate_access_policy", clusterName=name, principalArn=principal,
                       policyArn=namespace_policy(region), ok=_NOT_FOUND)
        namespaces = list(have.state.get("namespaces") or []) or [config.namespace]
        try:
            kube = await cluster_api(ctx)
        except ClusterNotReady:
            pass
        else:
            for namespace in namespaces:
                async for p in delete_ours(kube, ctx, rbac_objects(name, namespace, ctx.record.run_id)):
                    yield p
        # Last: until the group is gone, discovery finds this half-restored entry again.
        entry = await api.call("eks", "describe_access_entry", clusterName=name, principalArn=principal,
                               ok=_NOT_FOUND)
        if entry is not None:
            groups = list(entry["accessEntry"].get("kubernetesGroups") or [])
            await api.call("eks", "update_access_entry", clusterName=name, principalArn=principal,
                           kubernetesGroups=[g for g in groups if g != caller_group(name)])
        yield Progress(f"{principal}'s namespaced access removed", 1.0)


class AccessScopeLayer(Layer):
    """The aws target's access entry, narrowed after the kube layer (``--access-scope namespace``)."""

    name = LAYER
    title = "Your cluster access"
    _handlers: ClassVar[dict[str, Handler]] = {AccessScopeHandler.kind: AccessScopeHandler()}

    @property
    def handlers(self) -> Mapping[str, Handler]:
        return self._handlers

    def desired(self, ctx: Context, below: Sequence[Resource]) -> list[Resource]:
        config = aws_config(ctx)
        if config.access_scope != "namespace":
            return []
        made = {r.address for r in below}
        spec = AccessScopeSpec(scope="namespace", namespaces=[config.namespace], policy=NAMESPACE_POLICY_NAME,
                               group=caller_group(config.cluster_name))
        return [Resource(address=ACCESS_SCOPE, layer=LAYER, kind=AccessScopeHandler.kind, spec=spec.as_spec(),
                         depends_on=tuple(a for a in _installed_first() if a in made))]

    async def discover(self, ctx: Context) -> list[Observed]:
        handler = self._handlers[AccessScopeHandler.kind]
        assert isinstance(handler, AccessScopeHandler)
        return await handler.observe(aws_api(ctx), ctx)

    def plan_notes(self, ctx: Context) -> list[str]:
        config = aws_config(ctx)
        if config.access_scope != "namespace":
            return []
        return [f"access scope: once the cluster-wide objects are in, your access entry is admin of the namespace "
                f"{config.namespace} only ({NAMESPACE_POLICY_NAME}), reads nodes, CRDs, DaemonSets and "
                "Deployments, and manages RayClusters there; `rtui down` makes it cluster admin again first"]
