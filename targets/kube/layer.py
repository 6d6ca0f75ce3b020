"""The Kubernetes layer: device plugins, KubeRay, the namespace, the RayCluster, its workers.

Shared by the ``kube`` target (a cluster from kubeconfig) and the ``aws`` target (after its EKS
cluster exists). It offers the Ray Jobs API to the ray-job layer through the API server's
service proxy (DESIGN.md §4): no port is opened outside the cluster, no port-forward runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from backend import targets
from backend.aio import all_or_none
from backend.errors import OperationError, RtuiError, UserError
from backend.hub import read_hf_token
from backend.layers.base import Context, Handler, Layer
from backend.resources import CheckResult, CheckStatus, GpuFleet, Observed, Resource, Spec
from targets.kube import addons, admission, capacity, identity, idle, manifests, pods, rights, storage
from targets.kube.cluster_api import ClusterNotReady, cluster_api, kube_api
from targets.kube.config import KubeConfig, kube_config
from targets.kube.handlers import (
    EFA_PLUGIN,
    HF_SECRET,
    LAYER,
    NAMESPACE,
    NVIDIA_PLUGIN,
    OPERATOR,
    PREPULL,
    RAYCLUSTER,
    WORKERS,
    EfaPluginHandler,
    HfTokenHandler,
    KubeHandler,
    NamespaceHandler,
    NvidiaPluginHandler,
    OperatorHandler,
    get_if_served,
    list_if_served,
    namespace_conditions,
    ours,
)
from targets.kube.kuberay_version import refuse_unfit_kuberay
from targets.kube.probe import GCS_PORT, PROBE, NetworkPolicyProbeHandler, verdict_name
from targets.kube.raycluster import (
    PrepullHandler,
    RayClusterHandler,
    WorkersHandler,
    ray_pods_selector,
)
from targets.kube.registry import Resolved, resolve_digest
from targets.kube.security import (
    JOB_ENV,
    NETWORK_POLICY,
    RAY_TOKEN,
    JobEnvHandler,
    NetworkPolicyHandler,
    RayTokenHandler,
    network_policy_name,
    policy_enforcer,
    ray_token,
)
from targets.kube.serviceaccount import (
    SERVICE_ACCOUNT,
    WORKER_ACCOUNT,
    ServiceAccountHandler,
    WorkerAccountHandler,
)
from targets.kube.specs import (
    HfTokenSpec,
    JobEnvSpec,
    NamespaceSpec,
    NetworkPolicySpec,
    OperatorSpec,
    PinnedImageSpec,
    PrepullSpec,
    ProbeSpec,
    RayClusterSpec,
    RayTokenSpec,
    ServiceAccountSpec,
    WorkersSpec,
)
from training.passed_env import JOB_ENV_FILE

if TYPE_CHECKING:
    from backend.rayjobs import RayJobs
    from targets.kube.api import KubeApi

Obj = dict[str, Any]
@dataclass(frozen=True)
class Below:
    """The addresses of the layer under this one that it waits for, handed in by the target that stacks
    them (``targets.aws``); none on a cluster that is already there (``targets.kube``)."""

    api_ready: str | None = None  # after it, the cluster's API answers (a kubeconfig entry)
    system_nodes: str | None = None  # the nodes of the operator and the Ray head
    gpu_nodes: str | None = None  # the GPU nodes: the workers and device plugins wait for them; priced
    # How many EFA devices each GPU node made below has, read from what that layer plans (aws: the GPU launch
    # template's network interfaces); None: the device plugin says, one per worker asked for.
    efa_per_node: Callable[[Sequence[Resource]], int] | None = None
    # What enforces NetworkPolicy on the cluster made below (its CNI, as that layer installs it).
    network_policy: str | None = None
    # The Ray pods' service account and the address below that gives it AWS credentials (the aws layer's
    # pod identity association for the run's data): made, and the pods run as it, when that is planned.
    ray_service_account: str | None = None
    ray_identity: str | None = None
    # The same for the workers' own account (no Kubernetes token: issue 33), when they need credentials too.
    ray_worker_service_account: str | None = None
    ray_worker_identity: str | None = None

    @property
    def makes_cluster(self) -> bool:
        """Whether the cluster is made below: its nodes are that layer's to check, not this one's."""
        return self.api_ready is not None


def wants_volume(ctx: Context) -> bool:
    """Whether the run has its own volume (kube's --storage-size): the target says where the job writes."""
    config = kube_config(ctx)
    return targets.get(config.target).job_storage_path(config, ctx.record.run_id) is not None


class KubeLayer(Layer):
    name = LAYER
    title = "Kubernetes objects"
    _handlers: ClassVar[dict[str, Handler]] = {h.kind: h for h in (
        NamespaceHandler(), HfTokenHandler(), RayTokenHandler(), JobEnvHandler(), NetworkPolicyHandler(),
        NvidiaPluginHandler(), storage.DataClaimHandler(), ServiceAccountHandler(), WorkerAccountHandler(),
        EfaPluginHandler(), OperatorHandler(), PrepullHandler(), RayClusterHandler(), WorkersHandler(),
        NetworkPolicyProbeHandler())}

    def __init__(self, below: Below | None = None) -> None:
        self.below = below or Below()
        self._images: dict[str, Resolved] = {}  # image by tag -> its digest, asked at plan time
        self._enforcement = "not checked"
        self._storage: storage.StorageFacts | None = None  # the default StorageClass, asked at plan time
        self._rights: rights.Rights | None = None  # cluster-wide or namespace-only, asked at plan time

    @property
    def handlers(self) -> Mapping[str, Handler]:
        return self._handlers

    async def decide_rights(self, ctx: Context) -> rights.Rights:
        """Cluster-wide, or namespace-only (``rights.py``), as the API server answers for these credentials."""
        config = kube_config(ctx)
        if self.below.makes_cluster:  # a cluster made below: its maker is its admin
            return rights.Rights(config.namespace)
        try:
            found = await rights.decide(kube_api(ctx), config.namespace)
        except ClusterNotReady:
            return rights.Rights(config.namespace, asked=False)
        self._rights = found
        return found

    def _namespace_only(self) -> bool:
        return self._rights is not None and not self._rights.cluster_wide

    async def prepare(self, ctx: Context) -> None:
        """Every image the plan pulls, resolved to the digest its registry names now (all at once).

        An image that cannot be resolved stops the plan unless the user allows tags (--allow-unpinned):
        what runs on the cluster must be what the plan showed, also for a pod rescheduled a day later.
        """
        config = kube_config(ctx)
        namespace_only = not (await self.decide_rights(ctx)).cluster_wide
        # Namespace-only: no add-on of rtui's is planned, so none of their images is asked for.
        wanted = [config.image, *([] if namespace_only else addons.addon_images(config).values())]
        # A digest found is kept for the process (the TUI plans again); one not found is asked again.
        asked = [i for i in dict.fromkeys(wanted) if i not in self._images or self._images[i].digest is None]
        found = await all_or_none(*(asyncio.to_thread(resolve_digest, i) for i in asked))
        self._images.update(zip(asked, found, strict=True))
        unpinned = [self._images[i] for i in wanted if self._images[i].digest is None]
        if unpinned and not config.allow_unpinned:
            first = unpinned[0]
            more = f" (+{len(unpinned) - 1} more)" if len(unpinned) > 1 else ""
            raise UserError(f"cannot pin the image {first.image} to a digest: {first.reason.removeprefix('unpinned: ')}"
                            f"{more}",
                            remedy="let this machine reach the registry, pin it yourself as IMAGE@sha256:…, or pass "
                                   "--allow-unpinned to pull by tag (the plan flags it)")
        self._enforcement = (await self._policy_check(ctx)).detail or ""
        await refuse_unfit_kuberay(ctx)  # a KubeRay someone else runs that cannot carry rtui's token auth
        if wants_volume(ctx) and not namespace_only:  # StorageClasses are cluster-scoped
            try:
                self._storage = await storage.storage_facts(await cluster_api(ctx))
            except RtuiError:
                self._storage = None  # preflight says why the cluster cannot be asked

    def _resolved(self, image: str) -> Resolved:
        return self._images.get(image) or Resolved(image, None, "unpinned: the registry was not asked")

    def _pinned_spec(self, image: str) -> PinnedImageSpec:
        resolved = self._resolved(image)
        pinning = resolved.reason if resolved.digest else f"{resolved.reason}; pulled by tag (--allow-unpinned)"
        return PinnedImageSpec(image=manifests.pinned_image(image, resolved.digest), digest=resolved.digest,
                               pinning=pinning)

    def desired(self, ctx: Context, below: Sequence[Resource]) -> list[Resource]:
        config = kube_config(ctx)
        image = self._resolved(config.image)
        pinned = manifests.pinned_image(config.image, image.digest)
        addon = addons.addon_images(config)

        # On a cluster made below (aws): the API once the kubeconfig entry exists, a node for the operator
        # and the head once the system nodes are up, the GPU nodes only for the workers.
        made_below = {r.address for r in below}
        api_ready = tuple(a for a in (self.below.api_ready,) if a in made_below)
        system = tuple(a for a in (self.below.system_nodes,) if a in made_below)
        gpu = tuple(a for a in (self.below.gpu_nodes,) if a in made_below)

        def res(address: str, kind: str, spec: Spec, *deps: str, cost: float = 0.0,
                cluster_wide: str = "") -> Resource:
            return Resource(address=address, layer=LAYER, kind=kind, spec=spec.as_spec(),
                            depends_on=tuple(dict.fromkeys([*deps, *api_ready])), cost_per_hour=cost,
                            cluster_wide=cluster_wide)

        out = [res(NAMESPACE, "kube-namespace", NamespaceSpec(name=config.namespace,
                                                             pod_security=manifests.POD_SECURITY["enforce"]))]
        if config.hf_token:
            out.append(res(HF_SECRET, "kube-secret", HfTokenSpec(source=config.hf_token), NAMESPACE))
        # Made when applied, kept only in the cluster: the spec says where, never what.
        out.append(res(RAY_TOKEN, "kube-ray-token", RayTokenSpec(key=manifests.RAY_TOKEN_KEY), NAMESPACE))
        # Names only: the values are read from rtui's environment when applied.
        out.append(res(JOB_ENV, "kube-job-env", JobEnvSpec(names=sorted(config.job_env_names())), NAMESPACE))
        # Before the pods start: no moment where the pod network reaches them unfiltered.
        namespace_only = self._namespace_only()
        apiserver = (f"any address on port {manifests.DASHBOARD_PORT} (the API server's addresses are outside "
                     "the namespace; Ray's token refuses a caller without it)" if namespace_only else
                     "the API server's addresses (Endpoints default/kubernetes, read when applied) on port "
                     f"{manifests.DASHBOARD_PORT}")
        out.append(res(NETWORK_POLICY, "kube-networkpolicy",
                       NetworkPolicySpec(admits=f"the Ray pods of this cluster; {apiserver}",
                                         # A hint until the probe below has tried the policy (the DaemonSets
                                         # the cluster runs).
                                         enforced=f"guessed: {self._enforcement}"),
                       NAMESPACE))
        # The run's volume: before the Ray pods that mount it.
        volume = [storage.DATA_CLAIM] if wants_volume(ctx) else []
        if volume:
            out.append(res(storage.DATA_CLAIM, "kube-pvc",
                           storage.claim_spec(config, ctx.record.run_id, self._storage), NAMESPACE))
        # The Ray pods' service account: the user's (kube, --service-account), else the one the cluster
        # below gives AWS credentials to (aws: the run's data role by Pod Identity, whose association
        # must come first: its agent injects credentials when a pod is created).
        identity_below = [a for a in (self.below.ray_identity,) if a in made_below]
        account_name = config.service_account or (self.below.ray_service_account if identity_below else None)
        account = [SERVICE_ACCOUNT] if account_name else []
        if account_name:
            out.append(res(SERVICE_ACCOUNT, "kube-serviceaccount", ServiceAccountSpec(name=account_name), NAMESPACE))
        # The workers never hold a token (issue 33): an account of their own, with its own AWS identity from
        # below when the pods get one there; only the user's one --service-account (kube) is shared.
        worker_identity = [a for a in (self.below.ray_worker_identity,) if a in made_below]
        worker_account = (config.service_account or (self.below.ray_worker_service_account if worker_identity else None)
                          or manifests.worker_service_account_name(config))
        workers = [] if config.service_account else [WORKER_ACCOUNT]
        if workers:
            out.append(res(WORKER_ACCOUNT, "kube-serviceaccount-workers", ServiceAccountSpec(name=worker_account),
                           NAMESPACE, *worker_identity))
        # Namespace-only rights (rights.py): the cluster's own plugins and KubeRay, nothing cluster-wide.
        plugins: list[str] = []
        operator: list[str] = []
        if not namespace_only:
            # A plugin is ready once it runs on every GPU node: on aws, after the GPU nodes join.
            out.append(res(NVIDIA_PLUGIN, "kube-device-plugin-nvidia", self._pinned_spec(addon["nvidia"]), *gpu,
                           cluster_wide=f"a DaemonSet in {addons.SYSTEM_NAMESPACE} on every GPU node"))
            plugins.append(NVIDIA_PLUGIN)
            if config.wants_efa():
                out.append(res(EFA_PLUGIN, "kube-device-plugin-efa", self._pinned_spec(addon["efa"]), *gpu,
                               cluster_wide=f"a DaemonSet in {addons.SYSTEM_NAMESPACE} on every EFA node"))
                plugins.append(EFA_PLUGIN)
            # Scoped to the run's namespace, the operator's Role lives there: the namespace comes first.
            scoped = [NAMESPACE] if config.operator_scope == "namespace" else []
            reach = ("its Role in the run's namespace" if scoped else
                     "a ClusterRole over every namespace (--operator-scope cluster)")
            out.append(res(OPERATOR, "kuberay-operator",
                           OperatorSpec(**self._pinned_spec(addon["operator"]).as_spec(), scope=config.operator_scope),
                           *scoped, *system,
                           cluster_wide=f"KubeRay's CRDs, seen by every namespace; the operator with {reach}"))
            operator.append(OPERATOR)
        out.append(res(PREPULL, "kube-image-prepull", PrepullSpec(image=pinned, digest=image.digest), NAMESPACE))
        # On aws: as many EFA devices per worker as the GPU launch template gives each node.
        efa_below = self.below.efa_per_node(below) if self.below.efa_per_node is not None else 0
        spec = RayClusterSpec(
            **self._pinned_spec(config.image).as_spec(), gpu_nodes=config.gpu_node_count,
            gpus_per_node=config.gpus_per_node, efa=config.wants_efa(), ray_version=config.ray_version,
            hf_token=bool(config.hf_token), auth="token",
            # KubeRay adds the autoscaler (issue 26) only to a head pod it creates: a new idle time
            # or turning it on or off is a new RayCluster.
            idle_timeout_s=config.idle_timeout_s(),
            # Mounting a volume or not is a new RayCluster, so is another service account.
            **({"volume": manifests.data_claim_name(config)} if volume else {}),
            **({"service_account": account_name} if account_name else {}),
            # And the pods' hardening (issue 33): a cluster made before it is made again with it.
            worker_service_account=worker_account, pod_security=manifests.POD_SECURITY["enforce"],
            **({"efa_interfaces": efa_below} if config.wants_efa() and efa_below > 1 else {}))
        deps = [NAMESPACE, RAY_TOKEN, JOB_ENV, NETWORK_POLICY, *operator, *([HF_SECRET] if config.hf_token else []),
                *volume, *account, *workers, *identity_below, *worker_identity, *system]
        out.append(res(RAYCLUSTER, "raycluster", spec, *deps))
        out.append(res(WORKERS, "ray-gpu-workers", WorkersSpec(nodes=config.gpu_node_count,
                                                               gpus_per_node=config.gpus_per_node),
                       RAYCLUSTER, *plugins, *gpu))
        # Once the head runs: a pod the policy does not admit tries its GCS port (probe.py), with the image
        # the head runs, so the verdict comes from the cluster's network, not from the DaemonSets' names.
        out.append(res(PROBE, "kube-netpol-probe",
                       ProbeSpec(tries="the Ray head's GCS port from a pod the policy does not admit", image=pinned),
                       NETWORK_POLICY, RAYCLUSTER))
        return out

    def plan_notes(self, ctx: Context) -> list[str]:
        """Namespace-only rights: which mode and why, what is used instead, what was not seen."""
        if self._rights is None or self._rights.cluster_wide:
            return []
        return [self._rights.line(),
                "KubeRay is the cluster's own (ray.io/v1 served): no CRD, operator or device plugin is planned",
                self._rights.unseen()]

    async def discover(self, ctx: Context) -> list[Observed]:
        try:
            api = await cluster_api(ctx)
        except ClusterNotReady:
            return []
        namespace_only = not (await self.decide_rights(ctx)).cluster_wide
        # Namespace-only: the add-ons are the cluster's, not visible (cluster-wide lists), never rtui's.
        cluster_scoped = (NvidiaPluginHandler, EfaPluginHandler, OperatorHandler)
        found = await all_or_none(*(h.observe(api, ctx) for h in self._handlers.values()
                                    if isinstance(h, KubeHandler)
                                    and not (namespace_only and isinstance(h, cluster_scoped))))
        if namespace_only and not any(o is not None and o.address == NAMESPACE for o in found):
            found.append(await self._adopted_namespace(api, ctx))
        order = [NAMESPACE, HF_SECRET, RAY_TOKEN, JOB_ENV, NETWORK_POLICY, storage.DATA_CLAIM, SERVICE_ACCOUNT,
                 WORKER_ACCOUNT, NVIDIA_PLUGIN, EFA_PLUGIN, OPERATOR, PREPULL, RAYCLUSTER, WORKERS, PROBE]
        return sorted((o for o in found if o is not None), key=lambda o: order.index(o.address))

    @staticmethod
    async def _adopted_namespace(api: KubeApi, ctx: Context) -> Observed | None:
        """The user's namespace, named with --namespace and not made by rtui: used as it is, never deleted
        (namespace-only rights cannot make one; what rtui makes in it carries its labels and goes with down)."""
        config = kube_config(ctx)
        live = await api.get("v1", "Namespace", config.namespace)
        if live is None or ours(live):
            return None
        return Observed(address=NAMESPACE, layer=LAYER, kind="kube-namespace", id=config.namespace,
                        state={"name": config.namespace}, adopted=True,
                        reason="exists, not made by rtui: adopted, never deleted")

    async def preflight(self, ctx: Context) -> list[CheckResult]:
        config = kube_config(ctx)
        if self.below.makes_cluster:
            # The cluster and its nodes are the layer below's to make; the plan says what its CNI enforces.
            return self._token_check(config)
        try:
            api = kube_api(ctx)
            mode = await self.decide_rights(ctx)
            if not mode.cluster_wide:
                return await self._namespace_preflight(api, ctx, mode)
            nodes = await api.list("v1", "Node")
        except UserError as exc:  # the kubeconfig or its credentials: the user has something to change
            # An OperationError (no answer by the deadline, TLS) goes up as it is: the check could
            # not run, an operational failure (exit 1), not bad input (a failed check is exit 2).
            return [CheckResult(id="kube.access", title="Kubernetes API", status=CheckStatus.FAIL,
                                detail=exc.message, remedy=exc.remedy)]
        results = [CheckResult(id="kube.access", title="Kubernetes API", status=CheckStatus.OK,
                               detail=f"context {api.context} at {api.server}, {len(nodes)} nodes")]
        # Also the GPU nodes no device plugin serves yet (rtui's comes with the plan): labels and instance type.
        gpu = [n for n in nodes if capacity.has_nvidia_gpus(n, config.gpu_node_type)]
        node_autoscaler = await idle.find_node_autoscaler(api)
        if not gpu and (node_autoscaler.found or await self._scaled_to_zero(api, ctx)):
            results.append(CheckResult(
                id="kube.gpu-nodes", title="GPU nodes", status=CheckStatus.WARN,
                detail=f"no GPU node now (0/{config.gpu_node_count}): "
                       + ("the GPU pool scales from zero: the node autoscaler adds nodes when the workers ask"
                          if node_autoscaler.found else
                          "this run's workers were scaled down while idle; they come back only if a node "
                          "autoscaler adds GPU nodes"),
                remedy=None if node_autoscaler.found else "add GPU nodes if the workers stay Pending"))
        else:
            results.append(self._gpu_node_check(config, nodes, gpu, await self._bound_pods(api),
                                                run_id=ctx.record.run_id, autoscaler=node_autoscaler.found))
        results.append(CheckResult(id="kube.node-autoscaler", title="Node autoscaler",
                                   status=CheckStatus.OK if node_autoscaler.found or not config.idle_timeout_s()
                                   else CheckStatus.WARN, detail=node_autoscaler.line(),
                                   data={"found": node_autoscaler.found, "looked": node_autoscaler.looked}))
        results.extend(await self._foreign_objects(api, ctx))
        results.extend(await self._operator_reach(api, ctx))
        results.append(await self._policy_check(ctx))
        if wants_volume(ctx):
            results.append(storage.check(config, await storage.storage_facts(api)))
        if config.service_account:
            results.append(identity.check(config))
        results += [c for c in [await admission.pod_security_check(api, config)] if c is not None]
        return results + self._token_check(config)

    async def _namespace_preflight(self, api: KubeApi, ctx: Context, mode: rights.Rights) -> list[CheckResult]:
        """Namespace-only rights: the cluster's KubeRay or nothing, the namespace's own checks, and one
        line for every cluster-scope check that cannot be made."""
        config = kube_config(ctx)
        results = [
            CheckResult(id="kube.access", title="Kubernetes API", status=CheckStatus.OK,
                        detail=f"context {api.context} at {api.server}"),
            CheckResult(id="kube.rights", title="Rights", status=CheckStatus.INFO, detail=mode.line()),
            CheckResult(id="kube.cluster-scope", title="Cluster-wide checks", status=CheckStatus.WARN,
                        detail=mode.unseen())]
        if await api.serves("ray.io/v1"):
            results.append(CheckResult(
                id="kube.kuberay", title="KubeRay", status=CheckStatus.OK,
                detail="the cluster's: ray.io/v1 is served (its operator is not visible with namespace rights)"))
        else:
            results.append(CheckResult(
                id="kube.kuberay", title="KubeRay", status=CheckStatus.FAIL,
                detail="the cluster serves no ray.io/v1 (no KubeRay), and namespace rights cannot install it",
                remedy="ask the cluster's admin to install KubeRay for your namespace, or use credentials that "
                       "may install CRDs"))
        results.extend(await self._foreign_objects(api, ctx))
        if wants_volume(ctx):
            results.append(CheckResult(
                id="kube.storage", title="Storage", status=CheckStatus.WARN,
                detail="the default StorageClass is not visible with namespace rights: the claim is made as "
                       "planned; a class that cannot give ReadWriteMany leaves it Pending"))
        if config.service_account:
            results.append(identity.check(config))
        results += [c for c in [await admission.pod_security_check(api, config)] if c is not None]
        return results + self._token_check(config)

    async def _policy_check(self, ctx: Context) -> CheckResult:
        """Whether the cluster enforces the NetworkPolicy rtui creates, guessed from a known CNI agent: only a
        hint before the probe (``probe.py``) tries the policy once the Ray head runs."""
        if self.below.network_policy:  # the layer below installs the CNI that enforces it
            return CheckResult(id="kube.network-policy", title="NetworkPolicy enforcement", status=CheckStatus.OK,
                               detail=self.below.network_policy)
        if self._namespace_only():
            return CheckResult(id="kube.network-policy", title="NetworkPolicy enforcement", status=CheckStatus.INFO,
                               detail="not known with namespace rights (the CNI's DaemonSets are not visible); "
                                      "a probe pod tries the policy once the Ray head runs")
        try:
            enforcer = policy_enforcer(await kube_api(ctx).list("apps/v1", "DaemonSet"))
        except ClusterNotReady:
            return CheckResult(id="kube.network-policy", title="NetworkPolicy enforcement", status=CheckStatus.INFO,
                               detail="not checked: the cluster is not reachable yet; Ray's token protects the "
                                      "cluster either way")
        except RtuiError as exc:
            return CheckResult(id="kube.network-policy", title="NetworkPolicy enforcement", status=CheckStatus.WARN,
                               detail=f"not known: could not list the cluster's DaemonSets ({exc.message})")
        if enforcer:
            # A name is a hint, not proof (a CNI may run with its policy support off): the probe decides.
            return CheckResult(id="kube.network-policy", title="NetworkPolicy enforcement", status=CheckStatus.OK,
                               detail=f"enforced by {enforcer}, guessed from its DaemonSet; a probe pod confirms "
                                      "it once the Ray head runs")
        return CheckResult(
            id="kube.network-policy", title="NetworkPolicy enforcement", status=CheckStatus.WARN,
            detail="no agent that enforces NetworkPolicies found (calico, cilium, antrea, kube-router, weave, "
                   "EKS's VPC CNI with its network policy agent): the policy is created but likely not enforced, "
                   "so any pod can reach Ray's ports; Ray's token still refuses it",
            remedy="enable the CNI's policy support (EKS: the vpc-cni add-on's enableNetworkPolicy)")

    @staticmethod
    async def _scaled_to_zero(api: KubeApi, ctx: Context) -> bool:
        config = kube_config(ctx)
        live = await get_if_served(api, "ray.io/v1", "RayCluster", config.cluster_name, config.namespace)
        return live is not None and ours(live, ctx.record.run_id) and idle.scales_to_zero(live)

    @staticmethod
    async def _bound_pods(api: KubeApi) -> list[dict[str, Any]] | None:
        """Every pod in the cluster (what the scheduler counts against each node), None when not listable."""
        try:
            return await api.list("v1", "Pod")
        except UserError:
            return None

    @staticmethod
    def _gpu_node_check(config: KubeConfig, nodes: list[dict[str, Any]], gpu: list[dict[str, Any]],
                        bound: list[dict[str, Any]] | None = None, *, run_id: str = "",
                        autoscaler: str | None = None) -> CheckResult:
        if not gpu:
            return CheckResult(
                id="kube.gpu-nodes", title="GPU nodes", status=CheckStatus.FAIL,
                detail="no node has GPUs (no nvidia.com/gpu.present label, no nvidia.com/gpu allocatable, no "
                       "label or instance type of NVIDIA GPUs)",
                remedy="add a GPU node group, or use another --context")
        requests = manifests.worker_resources(config)
        if bound is not None:
            # What is free now, not what the node has: another team's pods hold GPUs, CPU and memory.
            rooms = capacity.rooms(gpu, bound, requests, run_id)
            fit = sum(r.workers for r in rooms)
            held = [f"node {r.node}: {r.why}" for r in rooms if r.why]
            if fit < config.gpu_node_count and held:
                more = f" (+{len(held) - 1} more)" if len(held) > 1 else ""
                return CheckResult(
                    id="kube.gpu-nodes", title="GPU nodes",
                    status=CheckStatus.WARN if autoscaler else CheckStatus.FAIL,
                    detail=f"only {fit} of {config.gpu_node_count} workers fit now: {held[0]}{more}"
                           + ("; the node autoscaler may add nodes" if autoscaler else ""),
                    remedy="wait until those pods finish, or ask for fewer workers (--gpu-node-count)")
        # CPU and memory come with the node, not with a device plugin: short now, short for good.
        short = [f"node {pods.node_name(n)}: {why}" for n in gpu for why in pods.cpu_memory_shortfalls(n, requests)]
        roomy = sum(not pods.cpu_memory_shortfalls(n, requests) for n in gpu)
        if short and roomy < config.gpu_node_count:
            more = f" (+{len(short) - 1} more)" if len(short) > 1 else ""
            return CheckResult(
                id="kube.gpu-nodes", title="GPU nodes", status=CheckStatus.FAIL,
                detail=f"{short[0]}{more}; {roomy} of {len(gpu)} GPU nodes can hold a worker, "
                       f"{config.gpu_node_count} needed",
                remedy="use GPU nodes with more CPU and memory, or fewer --gpus-per-node (a worker asks "
                       f"{manifests.CPU_PER_GPU} CPU and {manifests.MEMORY_GIB_PER_GPU}Gi per GPU)")
        problems = pods.allocatable_problems(gpu, gpus_per_node=config.gpus_per_node,
                                             node_count=config.gpu_node_count, require_efa=config.wants_efa(),
                                             requests=requests, is_gpu=lambda _: True)
        return CheckResult(
            id="kube.gpu-nodes", title="GPU nodes", status=CheckStatus.WARN if problems else CheckStatus.OK,
            detail=(problems[0] if problems else f"{len(gpu)} GPU nodes")
            + (" (checked again once the device plugins run)" if problems else ""),
            remedy="--require-transport any runs without EFA" if problems and config.wants_efa() else None)

    @staticmethod
    def _token_check(config: KubeConfig) -> list[CheckResult]:
        if not config.hf_token:
            return []
        try:
            read_hf_token(config.hf_token)
        except RtuiError as exc:
            return [CheckResult(id="kube.hf-token", title="Hugging Face token", status=CheckStatus.FAIL,
                                detail=exc.message, remedy=exc.remedy)]
        return [CheckResult(id="kube.hf-token", title="Hugging Face token", status=CheckStatus.OK,
                            detail=f"from {config.hf_token}")]

    async def _foreign_objects(self, api: KubeApi, ctx: Context) -> list[CheckResult]:
        """A namespace or a RayCluster of our names that this run did not make: refused, never overwritten."""
        config, run_id = kube_config(ctx), ctx.record.run_id
        out = []
        namespace = await api.get("v1", "Namespace", config.namespace)
        if namespace is not None and namespace["metadata"].get("deletionTimestamp"):
            # Going (a `down` just now): whoever made it, `up` waits until it is gone and makes it anew.
            out.append(CheckResult(id="kube.namespace", title=f"Namespace {config.namespace}", status=CheckStatus.WARN,
                                   detail=f"still being deleted: {namespace_conditions(namespace)}; up waits "
                                          "until it is gone"))
            namespace = None
        if namespace is not None and not ours(namespace) and self._namespace_only():
            out.append(CheckResult(id="kube.namespace", title=f"Namespace {config.namespace}", status=CheckStatus.OK,
                                   detail="exists, not made by rtui: used as it is and never deleted; what rtui "
                                          "makes in it carries its labels and goes with `rtui down`"))
        elif namespace is not None and not ours(namespace, run_id):
            owner = "another rtui run" if ours(namespace) else "someone else"
            other = (namespace["metadata"].get("labels") or {}).get(manifests.RUN_LABEL, "")
            kept = [c for c in await api.list("v1", "PersistentVolumeClaim", config.namespace)
                    if ours(c, other)] if ours(namespace) else []
            if kept:  # a torn-down run's data, kept on purpose
                out.append(CheckResult(
                    id="kube.namespace", title=f"Namespace {config.namespace}", status=CheckStatus.FAIL,
                    detail=f"holds the volume run {other} kept ({kept[0]['metadata']['name']}: its checkpoints and "
                           "model)", remedy=f"choose another --namespace, or delete that data with `rtui down "
                                            f"{other} --delete-data --yes`"))
            else:
                out.append(CheckResult(id="kube.namespace", title=f"Namespace {config.namespace}",
                                       status=CheckStatus.FAIL, detail=f"exists and belongs to {owner}",
                                       remedy="choose another with --namespace"))
        cluster = await get_if_served(api, "ray.io/v1", "RayCluster", config.cluster_name, config.namespace) \
            if namespace is not None else None
        if cluster is not None and not ours(cluster, run_id):
            out.append(CheckResult(
                id="kube.raycluster", title=f"RayCluster {config.cluster_name}", status=CheckStatus.FAIL,
                detail=f"a RayCluster of this name in {config.namespace} was not made by this run",
                remedy="choose another --cluster-name"))
        return out

    @staticmethod
    async def _operator_reach(api: KubeApi, ctx: Context) -> list[CheckResult]:
        """A KubeRay operator already running (rtui's for another run, or anyone's) that watches only
        other namespaces would never reconcile this run's RayCluster: said before anything is applied."""
        config = kube_config(ctx)
        try:
            found = addons.find_kuberay_operator(await api.list("apps/v1", "Deployment"),
                                                 await list_if_served(api, "apiextensions.k8s.io/v1",
                                                                      "CustomResourceDefinition"))
        except UserError:
            return []  # the operator handler says what is wrong with it
        watched = None if found is None else addons.watched_namespaces(found)
        if found is None or watched is None or config.namespace in watched:
            return []
        where = f"{found['metadata'].get('namespace')}/{found['metadata'].get('name')}"
        return [CheckResult(id="kube.operator-scope", title="KubeRay operator", status=CheckStatus.FAIL,
                            detail=f"the operator {where} watches only {', '.join(watched)}, "
                                   f"not {config.namespace}",
                            remedy="run after the run that installed it is down (its last run removes it), or have "
                                   "one operator for every namespace (--operator-scope cluster on the first run)")]

    # --- ClusterAccess -------------------------------------------------------------------
    def access(self) -> KubeLayer:
        return self

    async def jobs(self, ctx: Context) -> RayJobs | None:
        """The head's Jobs API through the API server, once this run's head pod is ready."""
        config = kube_config(ctx)
        # lazy: the kubernetes client (~1 s) only when the cluster is reached; making the stack does without
        from targets.kube.api import Unreachable
        from targets.kube.head_route import head_jobs

        try:
            api = await cluster_api(ctx)
            cluster = await api.get("ray.io/v1", "RayCluster", config.cluster_name, config.namespace)
            if cluster is None or not ours(cluster, ctx.record.run_id):
                return None
            heads = await api.list("v1", "Pod", config.namespace,
                                   ray_pods_selector(config.cluster_name, "head"))
            token = await ray_token(api, config, ctx.record.run_id)
        except Unreachable:
            raise  # not "no Jobs API yet": the cluster cannot be asked at all (status says so, exit 1)
        except RtuiError:
            return None
        ready = [p for p in heads if pods.pod_ready(p)]
        if not ready:
            return None
        # A cluster of this run without its token (a Secret deleted by hand) is asked without one:
        # Ray refuses, and the refusal says so.
        auth = {manifests.RAY_TOKEN_HEADER: f"Bearer {token}"} if token else {}
        # A port-forward to the head, which no NetworkPolicy filters; the service proxy without the right.
        return await head_jobs(api, config, ready[0]["metadata"]["name"], manifests.DASHBOARD_PORT,
                               manifests.head_service_name(config), manifests.DASHBOARD_PORT_NAME, auth,
                               network_policy_name(config))

    def job_env(self, ctx: Context) -> dict[str, str]:
        return {}

    def carry_job_secrets(self, ctx: Context, submission_id: str, values: Mapping[str, str]) -> dict[str, str]:
        """The values are in the run's job-env Secret (``kube.secret.job-env``, applied before the job from
        the same environment), mounted in every Ray container: the job gets the file's path only."""
        return {JOB_ENV_FILE: manifests.job_env_file()}

    async def gpu_fleet(self, ctx: Context) -> GpuFleet | None:
        """GPU workers and nodes now (issue 26); the aws target prices its GPU nodegroup."""
        config = kube_config(ctx)
        try:
            api = await cluster_api(ctx)
            cluster = await get_if_served(api, "ray.io/v1", "RayCluster", config.cluster_name,
                                          config.namespace)
            if cluster is None or not ours(cluster, ctx.record.run_id):
                return None
            mode = rights.known(api)
            if mode is not None and not mode.cluster_wide:
                return None  # the GPU nodes are not visible with namespace rights: no line rather than a wrong one
            fleet = await idle.gpu_fleet(api, config, cluster)
        except RtuiError:
            return None
        return replace(fleet, idle_timeout_s=config.idle_timeout_s(),
                       priced=self.below.gpu_nodes if self.below.gpu_nodes in ctx.record.resources else None)

    async def head_log(self, ctx: Context, *, since_time: str | None, follow: bool) -> AsyncIterator[str]:
        config = kube_config(ctx)
        api = await cluster_api(ctx)
        heads = await api.list("v1", "Pod", config.namespace, ray_pods_selector(config.cluster_name, "head"))
        if not heads:
            raise OperationError(f"no head pod of RayCluster {config.cluster_name} in {config.namespace}",
                                 remedy="see `rtui status`")
        newest = max(heads, key=lambda p: p["metadata"].get("creationTimestamp") or "")
        async for line in api.read_pod_log(config.namespace, newest["metadata"]["name"], "ray-head",
                                           since_time=since_time, follow=follow, timestamps=True):
            yield line

    def job_finished(self, ctx: Context) -> None:
        return None


def every_object(config: KubeConfig, run_id: str) -> tuple[list[manifests.Manifest], list[str]]:
    """What ``rtui manifest`` prints: the Kubernetes objects of every resource of the run's plan, in the
    order it applies them, each from its handler's ``kube_objects``, the objects ``up`` applies for it
    (issue 38: a separate list here drifted from them); notes for what it cannot show (the CRDs come from
    their source; a token, the API server's addresses and the GPU nodes' names are read when applied)."""
    # lazy: the planner imports the layers' base, which this module is one of
    from backend.layers.base import Context
    from backend.planner import desired
    from backend.store import RunStore

    store = RunStore()
    record = store.new(config)
    record.run_id = run_id
    stack = targets.get(config.target).stack(config)
    ctx = Context(config=config, record=record, store=store,
                  cluster=next((a for a in (layer.access() for layer in stack.layers) if a is not None), None))
    for layer in stack.layers:
        layer.settle_offline(ctx)
    objects = [obj for want in desired(stack, ctx)
               for obj in stack.handler(want.layer, want.kind).kube_objects(ctx, want)]
    notes = [f"the KubeRay {config.kuberay_version} CRDs (RayCluster, RayJob, RayService) come first, from "
             f"{config.kuberay_crds or 'the KubeRay release'}",
             "device plugins and the operator are skipped where the cluster already runs them",
             "the NetworkPolicy also admits the API server's addresses (Endpoints default/kubernetes) on port "
             f"{manifests.DASHBOARD_PORT}, read when applied",
             "every image is pinned by digest at plan time (refused when its registry does not answer, "
             "unless --allow-unpinned)",
             "once the Ray head runs, a probe pod (the Ray image, on the head's node) tries the head's port "
             f"{GCS_PORT} to confirm the NetworkPolicy is enforced, and is deleted; its verdict is kept in the "
             f"ConfigMap {verdict_name(config)}"]
    return objects, notes
