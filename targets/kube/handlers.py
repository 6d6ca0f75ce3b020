"""One handler per kind of the Kubernetes layer: look first, apply with server-side apply, wait.

Every object rtui applies carries our labels; discovery and teardown go by them, so nothing
without them (an operator or a device plugin someone else installed) is ever changed or deleted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from backend.aio import all_or_none
from backend.errors import UserError
from backend.hub import read_hf_token
from backend.layers.base import Context, Handler
from backend.paths import cache_dir
from backend.resources import Action, Observed, Resource
from backend.runner import Progress
from backend.waiting import Look, wait_until
from targets.kube import addons, idle, manifests, pods
from targets.kube.cluster_api import kube_api
from targets.kube.config import kube_config
from targets.kube.specs import HfTokenSpec, NamespaceSpec, OperatorSpec, PinnedImageSpec

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

Manifest = dict[str, Any]
LAYER = "kube"
NAMESPACE = "kube.namespace"
HF_SECRET = "kube.secret.hf-token"
NVIDIA_PLUGIN = "kube.device-plugin.nvidia"
EFA_PLUGIN = "kube.device-plugin.efa"
OPERATOR = "kube.kuberay-operator"
PREPULL = "kube.image-prepull"
RAYCLUSTER = "kube.raycluster"
WORKERS = "kube.gpu-workers"

# Deadlines: a first image pull of the multi-GB Ray image is the slowest thing here.
ADDON_TIMEOUT_S = 600.0
PULL_TIMEOUT_S = 1800.0
# A CRD is Established within a second or two on a healthy API server.
CRD_TIMEOUT_S = 120.0


def ours(obj: Manifest | None, run_id: str | None = None) -> bool:
    """Whether rtui made ``obj`` (and, given a run id, this run)."""
    meta_labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    if meta_labels.get(manifests.MANAGED_BY_LABEL) != manifests.MANAGED_BY:
        return False
    return run_id is None or meta_labels.get(manifests.RUN_LABEL) == run_id


def ref(obj: Manifest) -> tuple[str, str, str, str | None]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace")


def object_id(obj: Manifest) -> str:
    meta = obj["metadata"]
    return f"{obj['kind']}/{meta['namespace']}/{meta['name']}" if meta.get("namespace") else \
        f"{obj['kind']}/{meta['name']}"


async def pod_report(api: KubeApi, namespace: str, pod_list: list[Manifest]) -> pods.PodProblem | None:
    """The first problem a pod has, from the pods' status and their events, its message naming the pod."""
    for pod in pod_list:
        if pods.pod_running(pod):
            continue
        name = pod["metadata"]["name"]
        problem = pods.pod_problem(pod, await api.events(namespace, name))
        if problem is not None:
            return dataclasses.replace(problem, message=f"pod {name}: {problem.message}")
    return None


async def deployment_check(api: KubeApi, live: Manifest) -> Look:
    """Whether a Deployment is Available, else why not: Kubernetes' own reason from its pods when one
    cannot run (not schedulable, image not pullable, crashing; ``pods.pod_problem``), fatal where
    waiting will not fix it."""
    done, why = addons.deployment_available(live)
    if done:
        return Look(True, why, 1.0)
    match = live["spec"]["selector"].get("matchLabels") or {}
    namespace = live["metadata"]["namespace"]
    selector = ",".join(f"{k}={v}" for k, v in match.items())
    # Checked here too: a list may ignore the selector.
    mine = [p for p in await api.list("v1", "Pod", namespace, selector)
            if all((p.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in match.items())]
    problem = await pod_report(api, namespace, mine)
    if problem is not None:
        why = problem.message
    elif not mine:
        why = f"{why}; no pod yet"
    elif all(pods.pod_running(p) for p in mine):
        why = f"{why}; its pod is running, not ready yet"
    return Look(False, why, 0.5, fatal=problem.message if problem is not None and problem.fatal else None)


async def get_if_served(api: KubeApi, api_version: str, kind: str, name: str,
                        namespace: str | None = None) -> Manifest | None:
    """The object, or None when it or its whole kind is missing (a fresh cluster serves no ray.io yet)."""
    # lazy: the kubernetes client only when a cluster is reached; not on the aws target's first frame
    from targets.kube.api import KindNotServed

    try:
        return await api.get(api_version, kind, name, namespace)
    except KindNotServed:
        return None


async def list_if_served(api: KubeApi, api_version: str, kind: str, namespace: str | None = None,
                         label_selector: str | None = None) -> list[Manifest]:
    """The objects, none when the server does not serve the kind (its CRD missing or not Established)."""
    # lazy: the kubernetes client only when a cluster is reached; not on the aws target's first frame
    from targets.kube.api import KindNotServed

    try:
        return await api.list(api_version, kind, namespace, label_selector)
    except KindNotServed:
        return []


# Every kind of KubeRay's group: deleting a CRD deletes every object of its kind, in every namespace.
RAY_KINDS = ("RayCluster", "RayJob", "RayService", "RayCronJob")


async def ray_objects_left(api: KubeApi, kinds: tuple[str, ...] = RAY_KINDS) -> list[str]:
    """``RayJob team-b/nightly``, ... for each object of these ray.io kinds in any namespace that is
    not being deleted (a kind the server does not serve has none)."""
    found = await all_or_none(*(list_if_served(api, "ray.io/v1", kind) for kind in kinds))
    return [f"{kind} {o['metadata'].get('namespace')}/{o['metadata']['name']}"
            for kind, objects in zip(kinds, found, strict=True) for o in objects
            if not o["metadata"].get("deletionTimestamp")]


def crd_established(crd: Manifest | None) -> bool:
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in ((crd or {}).get("status") or {}).get("conditions") or [])


async def wait_established(api: KubeApi, names: list[str]) -> AsyncIterator[Progress]:
    """Wait until each CRD is Established: until then the server answers its kinds with 404."""

    async def established() -> Look:
        waiting = [n for n in names if not crd_established(
            await api.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", n))]
        return Look(not waiting, f"waiting for {', '.join(waiting)} to be Established" if waiting
                     else "CRDs established")

    async for p in wait_until(established, what="the KubeRay CRDs to be served", timeout_s=CRD_TIMEOUT_S,
                            remedy="see `kubectl get crd -o yaml` (conditions NamesAccepted, Established)"):
        yield p


async def apply_all(api: KubeApi, objects: list[Manifest]) -> AsyncIterator[Progress]:
    for n, obj in enumerate(objects, 1):
        await api.apply(obj)
        yield Progress(f"applied {object_id(obj)} ({n}/{len(objects)})", 0.3 * n / len(objects))


async def delete_ours(api: KubeApi, ctx: Context, objects: list[Manifest], *,
                     any_run: bool = False) -> AsyncIterator[Progress]:
    """Delete each object that is still there and labelled with this run (``any_run``: with any rtui
    run's, for the shared add-ons the last run out removes); never anything else."""
    for obj in reversed(objects):
        live = await get_if_served(api, *ref(obj))
        if live is None:
            continue
        if not ours(live, None if any_run else ctx.record.run_id):
            yield Progress(f"left {object_id(obj)}: not made by {'rtui' if any_run else 'this run'}")
            continue
        await api.delete(*ref(obj))
        yield Progress(f"deleted {object_id(obj)}")


async def gpu_nodes(api: KubeApi) -> list[Manifest]:
    return [n for n in await api.list("v1", "Node") if pods.is_gpu_node(n)]


class KubeHandler(Handler):
    """A handler that also finds its resource live (the layer asks each one)."""

    layer_api: ClassVar[str] = LAYER

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        raise NotImplementedError

    def api(self, ctx: Context) -> KubeApi:
        return kube_api(ctx)


def namespace_conditions(namespace: Manifest) -> str:
    """What the namespace controller says keeps a Terminating namespace (its True conditions: content or
    finalizers remaining, a deletion failure), in one line."""
    conditions = [c for c in (namespace.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    return "; ".join(str(c.get("message") or c.get("reason")) for c in conditions) or "no condition reported yet"


async def wait_namespace_gone(api: KubeApi, name: str) -> AsyncIterator[Progress]:
    """Until the namespace is gone, saying what keeps it while it is Terminating."""

    async def gone() -> Look:
        live = await api.get("v1", "Namespace", name)
        return Look(live is None, "namespace gone" if live is None else
                     f"namespace {name} is still being deleted: {namespace_conditions(live)}")

    async for p in wait_until(gone, what=f"deleting namespace {name}", timeout_s=ADDON_TIMEOUT_S,
                            remedy=f"see `kubectl get namespace {name} -o yaml` (status.conditions)"):
        yield p


class NamespaceHandler(KubeHandler):
    kind = "kube-namespace"
    spec_model = NamespaceSpec
    title = "Create the namespace"
    expected_s = 1.0
    updatable = True  # its labels: Pod Security's level, on a namespace an older rtui made (issue 33)

    def kept_on_down(self, have: Observed, observed: Sequence[Observed]) -> bool:
        """Kept while it holds the run's volume: deleting a namespace deletes its claims."""
        return any(o.kind == "kube-pvc" for o in observed)

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        config = kube_config(ctx)
        live = await api.get("v1", "Namespace", config.namespace)
        if live is None or not ours(live, ctx.record.run_id):
            return None  # someone else's: preflight refuses it
        enforce = (live["metadata"].get("labels") or {}).get(f"{manifests.POD_SECURITY_LABEL}enforce")
        return Observed(address=NAMESPACE, layer=LAYER, kind=self.kind, id=config.namespace,
                        state={"name": config.namespace, "pod_security": enforce}, reason="exists")

    def kube_objects(self, ctx: Context, want: Resource) -> list[Manifest]:
        return [manifests.namespace(kube_config(ctx), ctx.record.run_id)]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = kube_config(ctx)
        api = self.api(ctx)
        live = await api.get("v1", "Namespace", config.namespace)
        if live is not None and live["metadata"].get("deletionTimestamp"):
            # Still going (a `down` just now): nothing can be created in it until it is gone.
            async for p in wait_namespace_gone(api, config.namespace):
                yield p
            live = None
        if live is not None and not ours(live, ctx.record.run_id):
            raise UserError(f"namespace {config.namespace} exists and is not this run's",
                            remedy="choose another with --namespace")
        async for p in apply_all(api, self.kube_objects(ctx, want)):
            yield p
        ctx.ledger.update(want.address, id=config.namespace)
        yield Progress(f"namespace {config.namespace}", 1.0)

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self.create(ctx, want):
            yield p

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        async for p in delete_ours(api, ctx, [manifests.namespace(kube_config(ctx), ctx.record.run_id)]):
            yield p
        async for p in wait_namespace_gone(api, have.id):
            yield p


class HfTokenHandler(KubeHandler):
    kind = "kube-secret"
    spec_model = HfTokenSpec
    title = "Store the Hugging Face token as a Secret"
    # The token may have changed: apply it again whenever asked (it is never kept to compare).
    updatable = True

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        config = kube_config(ctx)
        name = manifests.hf_token_secret_name(config)
        live = await api.get("v1", "Secret", name, config.namespace)
        if live is None or not ours(live, ctx.record.run_id):
            return None
        return Observed(address=HF_SECRET, layer=LAYER, kind=self.kind, id=f"{config.namespace}/{name}",
                        state={"source": config.hf_token}, depends_on=(NAMESPACE,), reason="exists")

    def kube_objects(self, ctx: Context, want: Resource) -> list[Manifest]:
        source = HfTokenSpec.of(want).source
        return [manifests.hf_token_secret(kube_config(ctx), ctx.record.run_id, f"<read from {source} when applied>")]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        (secret,) = self.kube_objects(ctx, want)
        secret["stringData"] = {manifests.HF_TOKEN_KEY: read_hf_token(HfTokenSpec.of(want).source)}
        await self.api(ctx).apply(secret)
        ctx.ledger.update(want.address, id=object_id(secret))
        yield Progress("token stored in the cluster", 1.0)

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self.create(ctx, want):
            yield p

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        secret = manifests.hf_token_secret(kube_config(ctx), ctx.record.run_id, "")
        async for p in delete_ours(self.api(ctx), ctx, [secret]):
            yield p


class AddonHandler(KubeHandler):
    """A cluster add-on (a device plugin, the operator): one installer per cluster, so one that
    runs already, whoever installed it, is adopted and left alone; ours is updated in place."""

    address: ClassVar[str]
    updatable = True

    def pinned(self, want: Resource) -> PinnedImageSpec:
        """Its image and digest, as the plan pinned them."""
        spec = (self.spec_model or PinnedImageSpec).of(want)
        assert isinstance(spec, PinnedImageSpec)
        return spec

    def observed(self, found: Manifest, ctx: Context, ready: bool, why: str) -> Observed:
        """Ours, another rtui run's (shared: used as it is, and removed by whichever run is the last
        one out), or someone else's (adopted: never changed, never deleted)."""
        mine, rtui = ours(found, ctx.record.run_id), ours(found)
        image = found["spec"]["template"]["spec"]["containers"][0].get("image", "")
        state: dict[str, Any] = {"image": image}
        if mine:
            reason = why
        elif rtui:
            run = found["metadata"].get("labels", {}).get(manifests.RUN_LABEL, "?")
            state["shared_with_run"] = run
            reason = f"installed by rtui run {run} as {object_id(found)}: shared"
        else:
            reason = f"already running as {object_id(found)}: adopted"
        return Observed(address=self.address, layer=LAYER, kind=self.kind, id=object_id(found), state=state,
                        healthy=ready or not mine, adopted=not rtui, reason=reason)

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        if have.state.get("shared_with_run"):
            return Action.NOOP, have.reason  # another run's: never changed under it
        if not have.healthy:
            return Action.UPDATE, have.reason
        image = self.pinned(want).image
        if have.state.get("image") != image:
            return Action.UPDATE, f"image {have.state.get('image')} -> {image}"
        return Action.NOOP, have.reason or "in place"

    async def users(self, api: KubeApi, objects: list[Manifest]) -> list[str]:
        """What still uses rtui's add-on: a RayCluster (any run's, anyone's), by default."""
        return await ray_objects_left(api, ("RayCluster",))

    async def delete_shared(self, ctx: Context, objects: list[Manifest]) -> AsyncIterator[Progress]:
        """Delete rtui's add-on unless something still uses it (``users``): then the last one out removes it."""
        api = self.api(ctx)
        users = await self.users(api, objects)
        if users:
            more = f" (+{len(users) - 1} more)" if len(users) > 1 else ""
            yield Progress(f"kept: {users[0]}{more} still uses it", 1.0)
            return
        async for p in delete_ours(api, ctx, objects, any_run=True):
            yield p

    async def readiness(self, api: KubeApi, live: Manifest) -> Look:
        """Whether the add-on's workload (its DaemonSet or Deployment) is ready, and why not."""
        raise NotImplementedError

    async def install(self, ctx: Context, want: Resource, objects: list[Manifest]) -> AsyncIterator[Progress]:
        """Apply ``objects``, record the workload among them, and wait until it is ready."""
        api = self.api(ctx)
        async for p in apply_all(api, objects):
            yield p
        workload = next(o for o in objects if o["kind"] in ("DaemonSet", "Deployment"))
        ctx.ledger.update(want.address, id=object_id(workload),
                          outputs={"image": workload["spec"]["template"]["spec"]["containers"][0]["image"],
                                   "digest": self.pinned(want).digest})

        async def ready() -> Look:
            live = await api.get(*ref(workload))
            if live is None:
                return Look(False, f"waiting for the {workload['kind']} to appear")
            return await self.readiness(api, live)

        namespace = workload["metadata"]["namespace"]
        async for p in wait_until(ready, what=self.title, timeout_s=ADDON_TIMEOUT_S,
                                remedy=f"see `kubectl -n {namespace} describe {workload['kind'].lower()}`"):
            yield p

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self.create(ctx, want):
            yield p


async def _scaled_to_zero(api: KubeApi, ctx: Context) -> bool:
    """This run's RayCluster is live and lets its GPU workers all go while idle."""
    config = kube_config(ctx)
    live = await get_if_served(api, "ray.io/v1", "RayCluster", config.cluster_name, config.namespace)
    return live is not None and ours(live, ctx.record.run_id) and idle.scales_to_zero(live)


class DevicePluginHandler(AddonHandler):
    """One installer per device plugin: ours only where the cluster runs none (DESIGN.md §4)."""

    which: ClassVar[Literal["nvidia", "efa"]]
    expected_s = 60.0

    def objects(self, ctx: Context, digest: str | None = None) -> list[Manifest]:
        make = addons.nvidia_device_plugin if self.which == "nvidia" else addons.efa_device_plugin
        return make(kube_config(ctx), ctx.record.run_id, digest)

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        found = addons.find_device_plugin(self.which, await api.list("apps/v1", "DaemonSet"))
        if found is not None:
            nodes = await gpu_nodes(api)
            if not nodes and await _scaled_to_zero(api, ctx):
                # No GPU node because the idle workers went and their nodes with them (issue 26):
                # the plugin is in place and runs on each GPU node as the next job brings it.
                return self.observed(found, ctx, True, "no GPU node now (scaled to zero while idle): "
                                                       "runs on each one as it joins")
            return self.observed(found, ctx, *addons.daemonset_ready(found, nodes))
        # A plugin of another vendor or installer (GKE's, the GPU Operator's, a renamed image) runs
        # where the GPU nodes already advertise the resource: a second one would fight it.
        resource = manifests.GPU_RESOURCE if self.which == "nvidia" else manifests.EFA_RESOURCE
        advertising = [pods.node_name(n) for n in await gpu_nodes(api) if pods.advertises(n, resource)]
        if not advertising:
            return None
        return Observed(address=self.address, layer=LAYER, kind=self.kind, id=f"advertised:{resource}",
                        state={"advertised_by": advertising}, adopted=True,
                        reason=f"GPU nodes already advertise {resource} ({', '.join(advertising[:3])}"
                               f"{', ...' if len(advertising) > 3 else ''}): a plugin runs, adopted")

    def kube_objects(self, ctx: Context, want: Resource) -> list[Manifest]:
        return self.objects(ctx, self.pinned(want).digest)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        async for p in self.install(ctx, want, self.kube_objects(ctx, want)):
            yield p

    async def readiness(self, api: KubeApi, live: Manifest) -> Look:
        nodes = await gpu_nodes(api)
        done, why = addons.daemonset_ready(live, nodes)
        return Look(done, why, 1.0 if done else 0.5, fatal=addons.daemonset_blocked(live, nodes))


    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        async for p in self.delete_shared(ctx, self.objects(ctx)):
            yield p

    async def users(self, api: KubeApi, objects: list[Manifest]) -> list[str]:
        """Also any pod not rtui's that requests the device: without the plugin its node stops advertising
        it, and the kubelet refuses such a pod there (UnexpectedAdmissionError) when it restarts."""
        resource = manifests.GPU_RESOURCE if self.which == "nvidia" else manifests.EFA_RESOURCE
        return [*await super().users(api, objects),
                *(f"pod {p}" for p in addons.pods_requesting(resource, await api.list("v1", "Pod")))]


class NvidiaPluginHandler(DevicePluginHandler):
    kind = "kube-device-plugin-nvidia"
    spec_model = PinnedImageSpec
    title = "Install the NVIDIA device plugin"
    which = "nvidia"
    address = NVIDIA_PLUGIN


class EfaPluginHandler(DevicePluginHandler):
    kind = "kube-device-plugin-efa"
    spec_model = PinnedImageSpec
    title = "Install the EFA device plugin"
    which = "efa"
    address = EFA_PLUGIN


@functools.lru_cache(maxsize=2)
def kuberay_crds(source: str, version: str) -> list[Manifest]:
    """The CRDs, parsed once per process (about 2 MB of YAML: a second or so)."""
    return addons.load_kuberay_crds(source, version, cache_dir=cache_dir())


class OperatorHandler(AddonHandler):
    """The KubeRay operator and its CRDs; adopted, never installed twice, when one already runs."""

    kind = "kuberay-operator"
    spec_model = OperatorSpec
    address = OPERATOR
    title = "Install the KubeRay operator"
    expected_s = 60.0
    # Shared by runs: a namespace this run creates (the Role's home) never remakes another run's operator.
    follows_dependencies = False

    def objects(self, ctx: Context, crds: list[Manifest], digest: str | None = None) -> list[Manifest]:
        return addons.kuberay_operator(kube_config(ctx), ctx.record.run_id, crds, digest)

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        deployments = await api.list("apps/v1", "Deployment")
        crds = await api.list("apiextensions.k8s.io/v1", "CustomResourceDefinition")
        # rtui's own operator when it runs (what its runs use and the last one removes), even beside
        # another team's installed later (which is theirs, adopted, and never rtui's to remove).
        found = addons.find_kuberay_operator([d for d in deployments if ours(d)], crds) \
            or addons.find_kuberay_operator(deployments, crds)
        if found is None:
            return None
        return self.observed(found, ctx, *addons.deployment_available(found))

    def kube_objects(self, ctx: Context, want: Resource) -> list[Manifest]:
        """Without the CRDs: read from their source when applied (`rtui manifest` says where from)."""
        return self.objects(ctx, [], self.pinned(want).digest)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = kube_config(ctx)
        yield Progress(f"reading the KubeRay {config.kuberay_version} CRDs")
        crds = await asyncio.to_thread(kuberay_crds, config.kuberay_crds, config.kuberay_version)
        objects = self.objects(ctx, crds, self.pinned(want).digest)
        definitions = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
        api = self.api(ctx)
        existing = {c["metadata"]["name"]: c for c in
                    await api.list("apiextensions.k8s.io/v1", "CustomResourceDefinition")}
        # A CRD this run did not apply is someone else's (or another run's): used as it is, never
        # force-applied over or relabelled; it must serve ray.io/v1 for the RayCluster.
        foreign = [existing[d["metadata"]["name"]] for d in definitions if d["metadata"]["name"] in existing
                   and not ours(existing[d["metadata"]["name"]], ctx.record.run_id)]
        for crd in foreign:
            if not any(v.get("name") == "v1" and v.get("served") for v in crd.get("spec", {}).get("versions") or []):
                raise UserError(f"the CRD {crd['metadata']['name']} in the cluster does not serve ray.io/v1 "
                                "(KubeRay older than 1.0), and rtui never replaces a CRD it did not install",
                                remedy="upgrade KubeRay's CRDs to 1.0 or later")
            yield Progress(f"using the existing CRD {crd['metadata']['name']} as it is")
        skip = {c["metadata"]["name"] for c in foreign}
        async for p in apply_all(api, [d for d in definitions if d["metadata"]["name"] not in skip]):
            yield p
        # The operator watches the kinds at start, and rtui applies a RayCluster next: both need them served.
        async for p in wait_established(api, [o["metadata"]["name"] for o in definitions]):
            yield p
        async for p in self.install(ctx, want, [o for o in objects if o["kind"] != "CustomResourceDefinition"]):
            yield p

    async def readiness(self, api: KubeApi, live: Manifest) -> Look:
        return await deployment_check(api, live)


    async def users(self, api: KubeApi, objects: list[Manifest]) -> list[str]:
        """The RayClusters in the namespaces the operator watches (all of them when cluster-wide): one
        elsewhere is no user of a namespaced operator, and must not keep it (nor refuse later runs)."""
        workload = next(o for o in objects if o["kind"] == "Deployment")
        live = await get_if_served(api, *ref(workload))
        watched = addons.watched_namespaces(live) if live is not None else None
        clusters = await ray_objects_left(api, ("RayCluster",))
        return [c for c in clusters if watched is None or c.split(" ", 1)[1].split("/", 1)[0] in watched]

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        objects = [o for o in self.objects(ctx, []) if o["kind"] != "CustomResourceDefinition"]
        async for p in self.delete_shared(ctx, objects):
            yield p
        # The CRDs go last, and only when no object of any ray.io kind is left in any namespace:
        # deleting a CRD deletes every object of its kind. Only rtui's (any run's); never someone else's.
        crds = [c for c in await api.list("apiextensions.k8s.io/v1", "CustomResourceDefinition")
                if ours(c) and (c.get("spec") or {}).get("group") == "ray.io"]
        if not crds:
            return
        # Nor while another operator runs (another team's, installed on top of rtui's CRDs): its informers
        # list these kinds, and fail once they are gone.
        others = [d for d in addons.kuberay_operators(await api.list("apps/v1", "Deployment")) if not ours(d)]
        if others:
            where = f"{others[0]['metadata'].get('namespace')}/{others[0]['metadata'].get('name')}"
            yield Progress(f"kept the KubeRay CRDs: the operator {where} (not rtui's) uses them")
            return
        left = await ray_objects_left(api)
        if left:
            more = f" (+{len(left) - 1} more)" if len(left) > 1 else ""
            yield Progress(f"kept the KubeRay CRDs: {left[0]}{more} still exists")
            return
        for crd in crds:
            await api.delete(*ref(crd))
            yield Progress(f"deleted {object_id(crd)}")
