"""The Ray side of the Kubernetes layer: the image pre-pull, the RayCluster and its GPU workers.

The RayCluster step waits for the head only (it needs no GPU); the workers step waits for the
device plugins too, checks that the GPU nodes advertise what the pods ask for, then waits for
every worker, saying why a pod is not running yet as soon as Kubernetes knows.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from backend.errors import OperationError, UserError
from backend.layers.base import Context
from backend.resources import Action, Observed, Resource
from backend.runner import Progress
from backend.waiting import Look, wait_until
from targets.kube import admission, idle, manifests, pods, rights
from targets.kube.config import kube_config
from targets.kube.handlers import (
    EFA_PLUGIN,
    HF_SECRET,
    LAYER,
    NAMESPACE,
    NVIDIA_PLUGIN,
    OPERATOR,
    PREPULL,
    PULL_TIMEOUT_S,
    RAYCLUSTER,
    WORKERS,
    KubeHandler,
    delete_ours,
    get_if_served,
    gpu_nodes,
    object_id,
    ours,
    pod_report,
    ref,
    wait_established,
)
from targets.kube.security import JOB_ENV, NETWORK_POLICY, RAY_TOKEN
from targets.kube.serviceaccount import SERVICE_ACCOUNT, WORKER_ACCOUNT
from targets.kube.specs import PrepullSpec, RayClusterSpec, WorkersSpec
from targets.kube.storage import DATA_CLAIM

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

Manifest = dict[str, Any]
SPEC_ANNOTATION = "rtui.dev/spec"
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"


IMAGE_KEYS = ("image", "digest", "pinning")
# A pod the scheduler places nowhere may still get room: capacity another pod frees, a node an
# autoscaler adds (a few minutes). Past this it is not coming, while the GPU nodes cost money.
UNSCHEDULABLE_TIMEOUT_S = 600.0


def _digest_of(state: dict[str, Any]) -> str | None:
    image = str(state.get("image") or "")
    return image.split("@", 1)[1] if "@" in image else None


def same_image(want: dict[str, Any], have: dict[str, Any]) -> bool:
    """The same image, unless a digest known on both sides differs: a registry that did not answer
    this time (no digest) never makes rtui replace a cluster that runs the pinned image."""
    want_name = str(want.get("image") or "").split("@", 1)[0]
    have_name = str(have.get("image") or "").split("@", 1)[0]
    if want_name != have_name:
        return False
    return want.get("digest") is None or have.get("digest") is None or want.get("digest") == have.get("digest")


def ray_pods_selector(config_name: str, node_type: str | None = None) -> str:
    selector = f"{CLUSTER_LABEL}={config_name}"
    return selector + (f",{NODE_TYPE_LABEL}={node_type}" if node_type else "")


class Unscheduled:
    """How long the pods have been unschedulable without a break, and whether that is long enough to stop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.since: float | None = None
        self.clock = clock

    def fatal(self, problem: pods.PodProblem | None) -> str | None:
        """The line to fail with: the problem if fatal in itself, or unscheduled past the deadline."""
        if problem is not None and problem.fatal:
            return problem.message
        if problem is None or not problem.unscheduled:
            self.since = None
            return None
        now = self.clock()
        self.since = now if self.since is None else self.since
        waited = now - self.since
        if waited < UNSCHEDULABLE_TIMEOUT_S:
            return None
        return f"{problem.message} (unschedulable for {waited:.0f}s)"


async def _ray_pods_refused(api: KubeApi, ctx: Context) -> admission.Refusal | None:
    """Why KubeRay could not create the run's Ray pods, when the API server refused them."""
    config = kube_config(ctx)
    live = await get_if_served(api, "ray.io/v1", "RayCluster", config.cluster_name, config.namespace)
    if live is None:
        return None
    return await admission.refused(api, config.namespace, config.cluster_name, raycluster=live)


async def refuse_if_refused(ctx: Context, refusal: admission.Refusal | None) -> None:
    """Stop at once on a refusal: its controller retries, and every retry is refused the same way."""
    config = kube_config(ctx)
    if refusal is not None:
        raise UserError(refusal.line(config.namespace),
                        remedy=refusal.remedy(config.namespace, config.ray_version))


class PrepullHandler(KubeHandler):
    kind = "kube-image-prepull"
    spec_model = PrepullSpec
    title = "Pull the Ray image on the nodes"
    expected_s = 300.0
    updatable = True

    def objects(self, ctx: Context, want: Resource, gpu_node_names: list[str] | None = None) -> list[Manifest]:
        return [manifests.image_prepull(kube_config(ctx), ctx.record.run_id, image_digest=PrepullSpec.of(want).digest,
                                        gpu_nodes=gpu_node_names or ())]

    def kube_objects(self, ctx: Context, want: Resource) -> list[Manifest]:
        """Only the labelled GPU nodes: the ones seen by name are added when applied."""
        return self.objects(ctx, want)

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        config = kube_config(ctx)
        name = f"{config.cluster_name}-{manifests.PREPULL_NAME_SUFFIX}"
        live = await api.get("apps/v1", "DaemonSet", name, config.namespace)
        if live is None or not ours(live, ctx.record.run_id):
            return None
        status = live.get("status") or {}
        pulled = status.get("numberReady", 0) >= status.get("desiredNumberScheduled", 0)
        image = live["spec"]["template"]["spec"]["containers"][0]["image"]
        return Observed(address=PREPULL, layer=LAYER, kind=self.kind, id=object_id(live), state={"image": image},
                        depends_on=(NAMESPACE,), healthy=pulled,
                        reason="pulled on every node" if pulled else "still pulling")

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        if not same_image(want.spec, {"image": have.state.get("image"), "digest": _digest_of(have.state)}):
            return Action.UPDATE, "another image"
        return (Action.NOOP, have.reason) if have.healthy else (Action.UPDATE, have.reason)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = kube_config(ctx)
        api = self.api(ctx)
        mode = rights.known(api)
        # The GPU nodes by name too (many carry no GPU label, only allocatable GPUs); with namespace rights
        # the nodes are not visible: the labelled ones alone.
        names = [pods.node_name(n) for n in await gpu_nodes(api)] if mode is None or mode.cluster_wide else []
        (daemonset,) = self.objects(ctx, want, names)
        await api.apply(daemonset)
        ctx.ledger.update(want.address, id=object_id(daemonset))
        selector = daemonset["spec"]["selector"]["matchLabels"]
        label = ",".join(f"{k}={v}" for k, v in selector.items())

        async def pulled() -> Look:
            live = await api.get(*ref(daemonset))
            status = (live or {}).get("status") or {}
            want_n, ready_n = status.get("desiredNumberScheduled", 0), status.get("numberReady", 0)
            if live is not None and status.get("currentNumberScheduled", 0) < want_n:
                await refuse_if_refused(ctx, await admission.refused(
                    api, config.namespace, daemonset["metadata"]["name"], what="the pre-pull's pods"))
            # The controller saw this generation and found no node for it (no GPU node yet, say): nothing
            # to wait for here; the workers' nodes pull the image as they start.
            seen = live is not None and status.get("observedGeneration", 0) >= live["metadata"].get("generation", 1)
            if seen and want_n == 0:
                return Look(True, "no GPU node to pull onto yet: each pulls the image as its worker starts", 1.0)
            problem = await pod_report(api, config.namespace,
                                       await api.list("v1", "Pod", config.namespace, label))
            message = problem.message if problem else f"image on {ready_n}/{want_n} nodes"
            done = live is not None and want_n > 0 and ready_n >= want_n
            return Look(done, message, ready_n / want_n if want_n else None, unscheduled.fatal(problem))

        unscheduled = Unscheduled()

        async for p in wait_until(pulled, what="pulling the Ray image", timeout_s=PULL_TIMEOUT_S,
                                remedy="check the image name and the nodes' access to its registry"):
            yield p

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self.create(ctx, want):
            yield p

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        # What is deleted is named by the config and the run alone (no plan: a teardown's spec is empty).
        named = manifests.image_prepull(kube_config(ctx), ctx.record.run_id)
        async for p in delete_ours(self.api(ctx), ctx, [named]):
            yield p


class RayClusterHandler(KubeHandler):
    kind = "raycluster"
    spec_model = RayClusterSpec
    title = "Create the RayCluster and wait for its head"
    delete_title = "Delete the RayCluster and wait for its pods to go"
    expected_s = 120.0
    updatable = True  # "update" waits again for a head that is not ready; a new spec replaces

    def manifest(self, ctx: Context, want: Resource) -> Manifest:
        spec = RayClusterSpec.of(want)
        obj = manifests.raycluster(kube_config(ctx), ctx.record.run_id, image_digest=spec.digest,
                                   efa_interfaces=spec.efa_interfaces or 1, service_account=spec.service_account)
        obj["metadata"]["annotations"] = {SPEC_ANNOTATION: json.dumps(want.spec, sort_keys=True)}
        return obj

    def kube_objects(self, ctx: Context, want: Resource) -> list[Manifest]:
        return [self.manifest(ctx, want)]

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        config = kube_config(ctx)
        live = await get_if_served(api, "ray.io/v1", "RayCluster", config.cluster_name, config.namespace)
        if live is None or not ours(live, ctx.record.run_id):
            return None  # someone else's RayCluster of this name: preflight refuses it
        try:
            state = json.loads(live["metadata"].get("annotations", {}).get(SPEC_ANNOTATION, "{}"))
        except ValueError:
            state = {}
        heads = await api.list("v1", "Pod", config.namespace, ray_pods_selector(config.cluster_name, "head"))
        ready = any(pods.pod_ready(p) for p in heads)
        # Teardown order: everything the pods used outlives them (job, RayCluster; then the rest).
        return Observed(address=RAYCLUSTER, layer=LAYER, kind=self.kind, id=object_id(live), state=state,
                        depends_on=(NAMESPACE, HF_SECRET, RAY_TOKEN, JOB_ENV, NETWORK_POLICY, DATA_CLAIM,
                                    SERVICE_ACCOUNT, WORKER_ACCOUNT, OPERATOR, NVIDIA_PLUGIN, EFA_PLUGIN, PREPULL),
                        healthy=ready,
                        reason="head ready" if ready else "head not ready")

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        changed = sorted(k for k, v in want.spec.items()
                         if k not in IMAGE_KEYS and have.state.get(k) != v)
        if not same_image(want.spec, have.state):
            changed.insert(0, "image")
        if changed:
            return Action.REPLACE, f"changed: {', '.join(changed)}"
        return (Action.NOOP, have.reason) if have.healthy else (Action.UPDATE, have.reason)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = kube_config(ctx)
        api = self.api(ctx)
        obj = self.manifest(ctx, want)
        mode = rights.known(api)
        if mode is None or mode.cluster_wide:  # CRDs are cluster-scoped: namespace-only, preflight saw ray.io/v1
            async for p in wait_established(api, [manifests.RAYCLUSTER_CRD]):
                yield p
        live = await api.get(*ref(obj))
        if live is not None and not ours(live, ctx.record.run_id):
            raise UserError(f"a RayCluster {config.cluster_name} in namespace {config.namespace} "
                            "exists and is not this run's: rtui never overwrites it",
                            remedy="choose another --cluster-name")
        await api.apply(obj)
        spec = RayClusterSpec.of(want)
        ctx.ledger.update(want.address, id=object_id(obj),
                          outputs={"image": spec.image, "digest": spec.digest,
                                   "ray_version": config.ray_version,
                                   "kuberay_version": config.kuberay_version})
        yield Progress(f"applied {object_id(obj)}", 0.2)
        async for p in self._wait_head(api, ctx):
            yield p

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self._wait_head(self.api(ctx), ctx):
            yield p

    async def _wait_head(self, api: KubeApi, ctx: Context) -> AsyncIterator[Progress]:
        config = kube_config(ctx)
        selector = ray_pods_selector(config.cluster_name, "head")

        async def head_ready() -> Look:
            heads = await api.list("v1", "Pod", config.namespace, selector)
            if not heads:
                await refuse_if_refused(ctx, await _ray_pods_refused(api, ctx))
                return Look(False, "waiting for KubeRay to create the head pod", 0.3)
            if any(pods.pod_ready(p) for p in heads):
                return Look(True, "head ready", 1.0)
            problem = await pod_report(api, config.namespace, heads)
            return Look(False, problem.message if problem else f"head pod {heads[0]['metadata']['name']} starting",
                         0.5, unscheduled.fatal(problem))

        unscheduled = Unscheduled()

        async for p in wait_until(head_ready, what="the Ray head", timeout_s=PULL_TIMEOUT_S,
                                remedy=f"see `kubectl -n {config.namespace} describe pod -l {selector}`"):
            yield p

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        config = kube_config(ctx)
        api = self.api(ctx)
        # What is deleted is named by the config and the run alone (no plan: a teardown's spec is empty).
        async for p in delete_ours(api, ctx, [manifests.raycluster(config, ctx.record.run_id)]):
            yield p
        selector = ray_pods_selector(config.cluster_name)

        async def pods_gone() -> Look:
            left = await api.list("v1", "Pod", config.namespace, selector)
            return Look(not left, f"{len(left)} Ray pods terminating" if left else "every Ray pod gone")

        async for p in wait_until(pods_gone, what="the Ray pods going", timeout_s=600.0):
            yield p


class WorkersHandler(KubeHandler):
    """The GPU worker pods: the allocatable check, then every worker running."""

    kind = "ray-gpu-workers"
    spec_model = WorkersSpec
    title = "Check the GPU nodes and wait for the workers"
    delete_title = "GPU workers (they go with the RayCluster)"
    expected_s = 60.0
    updatable = True
    follows_dependencies = False  # pods, not an object of ours: KubeRay makes them again

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        config = kube_config(ctx)
        cluster = await get_if_served(api, "ray.io/v1", "RayCluster", config.cluster_name, config.namespace)
        if cluster is None or not ours(cluster, ctx.record.run_id):
            return None
        workers = await api.list("v1", "Pod", config.namespace,
                                 ray_pods_selector(config.cluster_name, "worker"))
        running = sum(pods.pod_running(p) for p in workers)
        want = config.gpu_node_count
        # Scaled down while idle (issue 26): as it should be. The job's placement group brings the
        # workers back through Ray's autoscaler; waiting for them here would wait for nobody.
        idle_down = running < want and idle.scales_to_zero(cluster)
        return Observed(address=WORKERS, layer=LAYER, kind=self.kind, id=object_id(cluster),
                        state={"nodes": want, "gpus_per_node": config.gpus_per_node},
                        depends_on=(RAYCLUSTER,), healthy=running >= want or idle_down,
                        reason=f"{running}/{want} workers running"
                               + (": scaled down while idle, the job scales them up" if idle_down else ""))

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        return (Action.NOOP, have.reason) if have.healthy else (Action.UPDATE, have.reason)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = kube_config(ctx)
        api = self.api(ctx)
        count = config.gpu_node_count
        mode = rights.known(api)
        if mode is not None and not mode.cluster_wide:  # nodes are not visible: the pods' state says it all
            yield Progress("the GPU nodes are not visible with namespace rights: waiting for the workers", 0.2)
        else:
            async for p in self._nodes_check(api, ctx):
                yield p
        selector = ray_pods_selector(config.cluster_name, "worker")

        async def running() -> Look:
            workers = await api.list("v1", "Pod", config.namespace, selector)
            up = sum(pods.pod_running(p) for p in workers)
            if up >= count:
                return Look(True, f"{up}/{count} workers running", 1.0)
            if len(workers) < count:  # pods missing: KubeRay may have been refused them
                await refuse_if_refused(ctx, await _ray_pods_refused(api, ctx))
            problem = await pod_report(api, config.namespace, workers)
            return Look(False, problem.message if problem else f"{up}/{count} workers running",
                         0.2 + 0.8 * up / count, unscheduled.fatal(problem))

        unscheduled = Unscheduled()

        async for p in wait_until(running, what="the GPU workers", timeout_s=PULL_TIMEOUT_S,
                                remedy=f"see `kubectl -n {config.namespace} describe pod -l {selector}`"):
            yield p

    async def _nodes_check(self, api: KubeApi, ctx: Context) -> AsyncIterator[Progress]:
        config = kube_config(ctx)
        yield Progress("checking what the GPU nodes advertise", 0.1)
        problems = pods.allocatable_problems(await api.list("v1", "Node"), gpus_per_node=config.gpus_per_node,
                                             node_count=config.gpu_node_count,
                                             require_efa=config.wants_efa(),
                                             requests=manifests.worker_resources(config))
        if problems:
            hint = (" (or --require-transport any to run over TCP)"
                    if config.wants_efa() and any(manifests.EFA_RESOURCE in p for p in problems) else "")
            raise OperationError(problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
                                 remedy=f"fix the node, or change --gpu-node-count / --gpus-per-node{hint}")
        yield Progress(f"{len(await gpu_nodes(api))} GPU nodes advertise what {config.gpu_node_count} workers "
                       "need", 0.2)

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self.create(ctx, want):
            yield p

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        yield Progress("the worker pods go with the RayCluster", 1.0)
