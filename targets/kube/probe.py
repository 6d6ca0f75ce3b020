"""Whether the cluster enforces the run's NetworkPolicy, confirmed by trying it, never guessed.

A NetworkPolicy is accepted by every API server and does nothing unless the cluster's network plugin
implements it (Kubernetes docs, "Network Policies": "Posting a NetworkPolicy to the API server will
have no effect unless your network plugin supports it"). Which plugin does, rtui can only guess from
the DaemonSets it sees (``security.policy_enforcer``); the plan shows that guess, marked as one. Once
the Ray head runs, a short-lived probe pod that the policy does not admit (no ``ray.io/cluster``
label, no address of the API server's) tries to open a TCP connection to the head's GCS port. If it
connects, the policy is not enforced: any pod of the cluster reaches Ray's ports, and only Ray's
token refuses it. The verdict is kept in a ConfigMap of the run (found live, like every resource)
and in the run's ledger; `rtui status` and every later plan say it in one line.

The probe runs the image the Ray head runs, by its pinned digest, on the head's own node: nothing new
is pulled. It meets Pod Security's ``restricted`` profile (and so ``baseline``): non-root by a numeric
uid, no privilege escalation, every capability dropped, seccomp RuntimeDefault, no service account
token. It is deleted when it ends, and by `down` when a crash left it (it carries the run's labels).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import TYPE_CHECKING

from backend.errors import RtuiError
from backend.layers.base import Context
from backend.resources import Action, Observed, Resource
from backend.runner import Progress
from backend.waiting import Look, wait_until
from targets.kube import manifests, pods
from targets.kube.config import KubeConfig, kube_config
from targets.kube.handlers import LAYER, RAYCLUSTER, KubeHandler, object_id, ours, pod_report
from targets.kube.raycluster import ray_pods_selector
from targets.kube.security import NETWORK_POLICY
from targets.kube.specs import ProbeSpec

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

PROBE = "kube.probe.netpol"
# The key the volume reader's pods carry their role under too: rtui's pods that are no Ray pods.
ROLE_LABEL = "rtui.dev/role"
PROBE_ROLE = "netpol-probe"
CONTAINER = "probe"
# The head's GCS port (manifests.HEAD_PORTS): the policy admits it only from the Ray pods themselves.
GCS_PORT = dict(manifests.HEAD_PORTS)["gcs-server"]
CONNECT_S = 5.0  # a dropped SYN gets no answer: the probe gives up on it after this
# Scheduling is skipped (nodeName) and the image is on the node: a probe that has not ended by then will not.
PROBE_TIMEOUT_S = 120.0
# rayproject/ray's images run as user ``ray``: uid 1000, gid 100 (docker/base-deps/Dockerfile, RAY_UID/RAY_GID).
RAY_UID, RAY_GID = 1000, 100
# The probe itself: first a connection the policy cannot block (the API server's Service, which every
# pod is told of by the kubelet's KUBERNETES_SERVICE_* variables), so a probe with no network at all
# never reads as "refused"; then the head's GCS port. One line of verdict, whatever happens.
SCRIPT = """
import os, socket, sys
def reach(host, port, wait):
    try:
        socket.create_connection((host, int(port)), timeout=wait).close()
    except OSError as exc:
        return type(exc).__name__ + ": " + str(exc)
    return None
host, port, wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
api = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
if all(api):
    why = reach(api[0], api[1], wait)
    if why is not None:
        print("rtui-probe: no-network " + why)
        sys.exit(0)
why = reach(host, port, wait)
print("rtui-probe: connected" if why is None else "rtui-probe: refused " + why)
"""
MARK = "rtui-probe: "


class Enforcement(StrEnum):
    ENFORCED = "enforced"
    NOT_ENFORCED = "not_enforced"
    UNCONFIRMED = "unconfirmed"


def verdict_line(verdict: Enforcement, detail: str) -> str:
    """What the plan, the apply and `rtui status` say: one line, with what it means."""
    if verdict is Enforcement.ENFORCED:
        return f"NetworkPolicy enforced (confirmed: a pod outside it was refused at {detail})"
    if verdict is Enforcement.NOT_ENFORCED:
        return (f"NetworkPolicy NOT enforced: a pod outside it connected to {detail}, so any pod of the cluster "
                "reaches Ray's ports and only Ray's token refuses it; enable your CNI's NetworkPolicy support")
    return f"NetworkPolicy enforcement unconfirmed: {detail}"


def probe_pod_prefix(config: KubeConfig) -> str:
    return f"{config.cluster_name}-netpol-probe"


def verdict_name(config: KubeConfig) -> str:
    return f"{config.cluster_name}-netpol-verdict"


def probe_selector(run_id: str) -> str:
    return f"{manifests.RUN_LABEL}={run_id},{ROLE_LABEL}={PROBE_ROLE}"


def probe_pod(config: KubeConfig, run_id: str, name: str, image: str, node: str | None, target_ip: str,
              port: int = GCS_PORT) -> manifests.Manifest:
    """The probe pod: labelled the run's, never a Ray pod's (the policy must not admit it), restricted."""
    tiny = {"cpu": "50m", "memory": "64Mi"}
    spec: manifests.Manifest = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": int(PROBE_TIMEOUT_S),
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RAY_UID, "runAsGroup": RAY_GID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": CONTAINER, "image": image, "imagePullPolicy": "IfNotPresent",
            "command": ["python", "-c", SCRIPT, target_ip, str(port), str(CONNECT_S)],
            "resources": {"requests": dict(tiny), "limits": dict(tiny)},
            "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                                "runAsNonRoot": True, "runAsUser": RAY_UID,
                                "capabilities": {"drop": ["ALL"]},
                                "seccompProfile": {"type": "RuntimeDefault"}}}],
    }
    if node:
        # The head's node holds the image already; the scheduler is skipped, so the probe starts at once.
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": config.namespace,
                         "labels": {**manifests.labels(run_id), ROLE_LABEL: PROBE_ROLE}},
            "spec": spec}


def verdict_map(config: KubeConfig, run_id: str, verdict: Enforcement, detail: str) -> manifests.Manifest:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": verdict_name(config), "namespace": config.namespace,
                         "labels": {**manifests.labels(run_id), ROLE_LABEL: PROBE_ROLE}},
            "data": {"verdict": verdict.value, "detail": detail}}


def read_verdict(lines: list[str], phase: str | None, target: str) -> tuple[Enforcement, str]:
    """The probe's verdict from its log; unconfirmed when it said none (it failed, or printed nothing)."""
    said = [line.split(MARK, 1)[1].strip() for line in lines if MARK in line]
    if said and said[-1] == "connected":
        return Enforcement.NOT_ENFORCED, target
    if said and said[-1].startswith("refused"):
        return Enforcement.ENFORCED, f"{target} ({said[-1].removeprefix('refused').strip()})"
    if said and said[-1].startswith("no-network"):
        return Enforcement.UNCONFIRMED, (f"the probe pod reached not even the API server's Service "
                                         f"({said[-1].removeprefix('no-network').strip()})")
    tail = lines[-1][:200] if lines else "no output"
    return Enforcement.UNCONFIRMED, f"the probe pod ended {phase or 'unknown'} without a verdict ({tail})"


class NetworkPolicyProbeHandler(KubeHandler):
    """A step of the plan after the RayCluster (it needs the head to try), not part of the policy's
    create: the policy comes before any Ray pod, and a probe there would have nothing to reach."""

    kind = "kube-netpol-probe"
    spec_model = ProbeSpec
    title = "Confirm the NetworkPolicy is enforced (a probe pod it does not admit)"
    expected_s = 10.0

    async def _probe_pods(self, api: KubeApi, ctx: Context) -> list[manifests.Manifest]:
        found = await api.list("v1", "Pod", kube_config(ctx).namespace, probe_selector(ctx.record.run_id))
        # Checked here too (a list may ignore the selector); one already being deleted is not left over.
        return [p for p in found if ours(p, ctx.record.run_id)
                and (p["metadata"].get("labels") or {}).get(ROLE_LABEL) == PROBE_ROLE
                and not p["metadata"].get("deletionTimestamp")]

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        config = kube_config(ctx)
        left = [p["metadata"]["name"] for p in await self._probe_pods(api, ctx)]
        live = await api.get("v1", "ConfigMap", verdict_name(config), config.namespace)
        if live is not None and not ours(live, ctx.record.run_id):
            live = None
        if live is None and not left:
            return None
        data = (live or {}).get("data") or {}
        try:
            verdict = Enforcement(data.get("verdict", ""))
        except ValueError:
            verdict = None
        if live is None or verdict is None or left:
            why = f"a probe pod left behind ({left[0]})" if left else "no verdict recorded"
            return Observed(address=PROBE, layer=LAYER, kind=self.kind,
                            id=object_id(live) if live is not None else f"Pod/{config.namespace}/{left[0]}",
                            state={"pods": left}, depends_on=(NETWORK_POLICY, RAYCLUSTER), healthy=False, reason=why)
        return Observed(address=PROBE, layer=LAYER, kind=self.kind, id=object_id(live),
                        state={"verdict": verdict.value, "pods": []}, depends_on=(NETWORK_POLICY, RAYCLUSTER),
                        reason=verdict_line(verdict, data.get("detail", "")))

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        # The verdict is a fact about the cluster's network plugin: asked once per cluster of the run.
        return (Action.NOOP, have.reason) if have.healthy else (Action.REPLACE, have.reason)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        config = kube_config(ctx)
        for left in await self._probe_pods(api, ctx):
            await api.delete("v1", "Pod", left["metadata"]["name"], config.namespace)
        verdict, detail = await self._try(api, ctx, want)
        record = verdict_map(config, ctx.record.run_id, verdict, detail)
        await api.apply(record)
        line = verdict_line(verdict, detail)
        ctx.ledger.update(want.address, id=object_id(record), outputs={"verdict": verdict.value, "notice": line})
        yield Progress(line, 1.0)

    async def _try(self, api: KubeApi, ctx: Context, want: Resource) -> tuple[Enforcement, str]:
        """Run one probe pod against the head and read its verdict (unconfirmed where it could not tell)."""
        config = kube_config(ctx)
        heads = [p for p in await api.list("v1", "Pod", config.namespace,
                                           ray_pods_selector(config.cluster_name, "head"))
                 if pods.pod_running(p) and (p.get("status") or {}).get("podIP")]
        if not heads:
            return Enforcement.UNCONFIRMED, "no running Ray head to probe"
        head = heads[0]
        target_ip = head["status"]["podIP"]
        target = f"the Ray head's GCS port ({target_ip}:{GCS_PORT})"
        image = ProbeSpec.of(want).image or str(head["spec"]["containers"][0]["image"])
        name = f"{probe_pod_prefix(config)}-{secrets.token_hex(3)}"
        await api.apply(probe_pod(config, ctx.record.run_id, name, image, head["spec"].get("nodeName"), target_ip))
        phase: str | None = None
        try:
            async def ended() -> Look:
                nonlocal phase
                pod = await api.get("v1", "Pod", name, config.namespace) or {}
                phase = (pod.get("status") or {}).get("phase")
                if phase in ("Succeeded", "Failed"):
                    return Look(True, f"probe pod {phase.lower()}")
                problem = await pod_report(api, config.namespace, [pod]) if pod else None
                return Look(False, problem.message if problem else f"probe pod {phase or 'Pending'}",
                             fatal=problem.message if problem is not None and problem.fatal else None)

            async for _ in wait_until(ended, what=f"the probe pod {name}", timeout_s=PROBE_TIMEOUT_S):
                pass
            lines = [line async for line in api.read_pod_log(config.namespace, name, CONTAINER, timestamps=False)]
        except RtuiError as exc:  # it could not run: the policy is neither confirmed nor refuted
            return Enforcement.UNCONFIRMED, f"the probe pod did not run ({exc.message})"
        finally:
            await api.delete("v1", "Pod", name, config.namespace)
        return read_verdict(lines, phase, target)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        config = kube_config(ctx)
        api = self.api(ctx)
        for left in await self._probe_pods(api, ctx):
            await api.delete("v1", "Pod", left["metadata"]["name"], config.namespace)
            yield Progress(f"deleted the probe pod {left['metadata']['name']}")
        live = await api.get("v1", "ConfigMap", verdict_name(config), config.namespace)
        if live is not None and ours(live, ctx.record.run_id):
            await api.delete("v1", "ConfigMap", verdict_name(config), config.namespace)
            yield Progress(f"deleted {object_id(live)}")
