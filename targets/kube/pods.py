"""What a person needs to know about nodes and pods: why a worker cannot fit, why a pod is not running.

Pure functions of objects as the API server returns them in JSON (camelCase keys, the shape of
``ApiClient().sanitize_for_serialization(obj)`` or of a raw response), never of the client's
``to_dict()`` (snake_case). The handlers list nodes, pods and events; these say what is wrong
in one line a person can act on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from targets.kube.manifests import EFA_RESOURCE, GPU_NODE_LABEL, GPU_RESOURCE

Obj = Mapping[str, Any]

# The taints a Ray worker tolerates: the GPU workers of manifests.py tolerate exactly this one.
WORKER_TOLERATIONS: tuple[dict[str, str], ...] = ({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},)
# The kubelet backs off 10 s, 20 s, 40 s, ... up to 5 min between pulls: five failed pulls are
# about five minutes of a registry that does not answer, long enough to stop waiting.
PULL_FAILURES_FATAL = 5
# Restarts after which a crash loop is the container's own fault, not a dependency still starting.
CRASH_RESTARTS_FATAL = 3
# Registry answers that no retry changes: the image or tag is not there, or we may not read it.
_PULL_NEVER = re.compile(r"not found|manifest unknown|repository does not exist|unauthorized|"
                         r"access denied|denied|forbidden", re.IGNORECASE)
# Waiting reasons the kubelet never leaves by itself.
_WAITING_FATAL = frozenset({"InvalidImageName", "CreateContainerConfigError", "CreateContainerError"})
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})
_INSUFFICIENT = re.compile(r"(\d+) Insufficient ([\w./-]+)")


@dataclass(frozen=True)
class PodProblem:
    """Why a pod is not running, in one line. ``fatal``: waiting longer will not fix it."""

    message: str
    fatal: bool
    # Resources the scheduler found too little of, so a caller can hold them against allocatable_problems.
    insufficient: tuple[str, ...] = ()
    # The scheduler placed it nowhere: a wait with its own deadline (room may free up, a node be added).
    unscheduled: bool = False


def _name(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("name", "?"))


node_name = _name


def _count(quantity: object) -> int:
    """An integer extended resource (``"4"``), 0 when absent or not a whole number."""
    try:
        return int(str(quantity))
    except ValueError:
        return 0


def advertises(node: Obj, resource: str) -> bool:
    """Whether the node offers some of ``resource`` (a device plugin runs there for it)."""
    return _count((node.get("status", {}).get("allocatable") or {}).get(resource, 0)) > 0


def is_gpu_node(node: Obj) -> bool:
    """Labelled as a GPU node, or already advertising GPUs (a cluster that never labels them)."""
    labels = node.get("metadata", {}).get("labels") or {}
    allocatable = node.get("status", {}).get("allocatable") or {}
    return labels.get(GPU_NODE_LABEL) == "true" or _count(allocatable.get(GPU_RESOURCE, 0)) > 0


def _tolerates(taint: Obj, tolerations: Collection[Obj]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if not t.get("key"):
            if t.get("operator") == "Exists":  # an empty key with Exists tolerates every taint
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _matches(expr: Obj, labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator"), list(expr.get("values") or [])
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def unschedulable_reason(pod_spec: Obj, node: Obj) -> str | None:
    """Why a pod with ``pod_spec`` cannot be placed on ``node`` by its labels and taints, or None.

    Only what the node's labels and taints decide (nodeSelector, required node affinity,
    NoSchedule/NoExecute taints); resources are allocatable_problems' business.
    """
    labels = node.get("metadata", {}).get("labels") or {}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"its node selector wants {key}={value}"
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    # Terms are ORed, the expressions of one term ANDed (the scheduler's rule).
    if terms and not any(all(_matches(e, labels) for e in t.get("matchExpressions") or []) for t in terms):
        return "its node affinity does not match the node's labels"
    tolerations = pod_spec.get("tolerations") or []
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(taint, tolerations):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"it does not tolerate the taint {taint.get('key')}{value}:{taint.get('effect')}"
    return None


def _node_not_ready(node: Obj) -> str | None:
    if node.get("spec", {}).get("unschedulable"):
        return "is cordoned (spec.unschedulable)"
    for c in node.get("status", {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") != "True":
            return f"is not Ready ({c.get('reason') or c.get('status')})"
    return None


def _quantity(value: object) -> Decimal | None:
    # The client's parser (all suffixes: m, Ki..Ei, k..E, exponents); kubernetes.utils imports the
    # whole client, so only when a node is checked, never when this module is imported.
    # lazy: kubernetes.utils imports the whole client; only when a node is checked
    from kubernetes.utils.quantity import parse_quantity

    try:
        return Decimal(parse_quantity(value))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, ArithmeticError):
        return None


def _amount(resource: str, value: Decimal) -> str:
    """A quantity as a person writes it: CPUs as a number (``7.5``), memory in Gi."""
    if resource == "memory":
        value = value / 2**30
    text = f"{value.quantize(Decimal('0.1')).normalize():f}" if value % 1 else f"{int(value)}"
    return text + ("Gi" if resource == "memory" else "")


def cpu_memory_shortfalls(node: Obj, requests: Mapping[str, str]) -> list[str]:
    """``allocatable cpu is 32, a worker needs 40 (8 short)`` for each of cpu and memory the node
    cannot give one worker, as the scheduler's NodeResourcesFit would find (before other pods)."""
    allocatable = node.get("status", {}).get("allocatable") or {}
    out = []
    for resource in ("cpu", "memory"):
        want = _quantity(requests.get(resource)) if resource in requests else None
        have = _quantity(allocatable.get(resource, 0))
        if want is None or have is None or have >= want:
            continue
        out.append(f"allocatable {resource} is {_amount(resource, have)}, a worker needs "
                   f"{_amount(resource, want)} ({_amount(resource, want - have)} short)")
    return out


def allocatable_problems(nodes: list[dict[str, Any]], *, gpus_per_node: int, efa_per_node: int = 1,
                         node_count: int, require_efa: bool,
                         tolerations: Collection[Obj] = WORKER_TOLERATIONS,
                         requests: Mapping[str, str] | None = None,
                         is_gpu: Callable[[Obj], bool] = is_gpu_node) -> list[str]:
    """One line per reason the GPU nodes cannot hold ``node_count`` workers; empty when they can.

    Missing EFA is a problem only with ``require_efa`` (the caller offers
    ``--require-transport any`` to train over TCP instead). ``requests``: a worker's requests,
    whose cpu and memory each node's allocatable must cover too. ``is_gpu``: which nodes are GPU
    nodes (preflight also counts those a device plugin will serve: capacity.has_nvidia_gpus).
    """
    gpu_nodes = [n for n in nodes if is_gpu(n)]
    if not gpu_nodes:
        return [f"no GPU nodes: no node is labelled {GPU_NODE_LABEL}=true or advertises {GPU_RESOURCE} — "
                f"add GPU nodes, or label them `kubectl label node NAME {GPU_NODE_LABEL}=true`"]
    problems: list[str] = []
    fit = 0
    for node in gpu_nodes:
        name = _name(node)
        allocatable = node.get("status", {}).get("allocatable") or {}
        own: list[str] = []
        gpus = _count(allocatable.get(GPU_RESOURCE, 0))
        if gpus == 0:
            own.append(f"node {name}: allocatable {GPU_RESOURCE} is 0 (the NVIDIA device plugin is not running there)")
        elif gpus < gpus_per_node:
            own.append(f"node {name}: allocatable {GPU_RESOURCE} is {gpus}, a worker needs {gpus_per_node}")
        efa = _count(allocatable.get(EFA_RESOURCE, 0))
        if require_efa and efa == 0:
            own.append(f"node {name}: allocatable {EFA_RESOURCE} is 0 (the EFA device plugin is not running there, "
                       f"or the instance has no EFA interface)")
        elif require_efa and efa < efa_per_node:
            own.append(f"node {name}: allocatable {EFA_RESOURCE} is {efa}, a worker needs {efa_per_node}")
        own += [f"node {name}: {short}" for short in cpu_memory_shortfalls(node, requests or {})]
        state = _node_not_ready(node)
        if state:
            own.append(f"node {name} {state}")
        # Taints the workers do not tolerate: a GPU node the scheduler will never use for them.
        taints = [t for t in node.get("spec", {}).get("taints") or []
                  if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(t, tolerations)]
        if taints:
            t = taints[0]
            value = f"={t['value']}" if t.get("value") else ""
            own.append(f"node {name}: the workers do not tolerate its taint {t.get('key')}{value}:{t.get('effect')}")
        problems += own
        fit += not own
    if fit < node_count:
        want = f"{gpus_per_node} {GPU_RESOURCE}" + (f" and {efa_per_node} {EFA_RESOURCE}" if require_efa else "")
        problems.append(f"only {fit} GPU node(s) advertise {want} and accept workers, need {node_count}")
    return problems


def pod_ready(pod: Obj) -> bool:
    """The kubelet's verdict: every container ready and passing its readiness probe."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions") or [])


def pod_running(pod: Obj) -> bool:
    """Phase Running with every container running now: a container in a crash loop leaves
    the phase at Running between restarts, so the phase alone would call it running."""
    status = pod.get("status", {})
    containers = status.get("containerStatuses") or []
    return status.get("phase") == "Running" and bool(containers) and all(
        "running" in (c.get("state") or {}) for c in containers)


def _about(event: Obj, pod: Obj) -> bool:
    target = event.get("involvedObject") or event.get("regarding") or {}
    uid = pod.get("metadata", {}).get("uid")
    if uid and target.get("uid"):
        return bool(target.get("uid") == uid)
    return target.get("kind", "Pod") == "Pod" and target.get("name") == _name(pod)


def _when(event: Obj) -> str:
    # RFC 3339 timestamps in UTC sort as strings; events.k8s.io/v1 carries eventTime and
    # (for core events seen through it) deprecatedLastTimestamp.
    return str(event.get("lastTimestamp") or event.get("deprecatedLastTimestamp") or event.get("eventTime")
               or event.get("metadata", {}).get("creationTimestamp") or "")


def _message(event: Obj) -> str:
    return str(event.get("message") or event.get("note") or "")


def _times(event: Obj) -> int:
    series = event.get("series") or {}
    return int(event.get("count") or series.get("count") or 1)


def _scheduling_problem(message: str, unobtainable: Collection[str]) -> PodProblem:
    """``0/3 nodes are available: 1 node(s) had untolerated taint {...}, 2 Insufficient vpc.amazonaws.com/efa.``"""
    head = message.split(" preemption:", 1)[0].strip().rstrip(".")
    insufficient = tuple(dict.fromkeys(r for _, r in _INSUFFICIENT.findall(head)))
    if insufficient:
        short = ", ".join(f"{n} node{'s' if n != '1' else ''} lack {r}" for n, r in _INSUFFICIENT.findall(head))
        fatal = any(r in unobtainable for r in insufficient)
        why = " (no node can offer it)" if fatal else ""
        return PodProblem(f"not scheduled: {short}{why} — {head}", fatal, insufficient, unscheduled=True)
    return PodProblem(f"not scheduled: {head}", False, unscheduled=True)


def _container_problem(c: Obj, pod: Obj, events: Sequence[Obj]) -> PodProblem | None:
    name, image = c.get("name", "?"), c.get("image", "?")
    state, last = c.get("state") or {}, c.get("lastState") or {}
    waiting = state.get("waiting") or {}
    reason, detail = waiting.get("reason", ""), waiting.get("message", "")
    terminated = state.get("terminated") or last.get("terminated") or {}
    if terminated.get("reason") == "OOMKilled":
        limit = next((x.get("resources", {}).get("limits", {}).get("memory") for x in
                      pod.get("spec", {}).get("containers") or [] if x.get("name") == name), None)
        over = f" of {limit}" if limit else ""
        return PodProblem(f"container {name} was killed for using more than its memory limit{over} (OOMKilled)", True)
    if reason in ("ErrImagePull", "ImagePullBackOff"):
        failed = [e for e in events if e.get("reason") == "Failed" and "Failed to pull image" in _message(e)]
        pulls = sum(_times(e) for e in failed)
        cause = _message(failed[-1]) if failed else detail
        never = bool(_PULL_NEVER.search(cause))
        return PodProblem(f"cannot pull image {image} for container {name}: {cause or reason}",
                          never or pulls >= PULL_FAILURES_FATAL)
    if reason == "CrashLoopBackOff":
        restarts = int(c.get("restartCount") or 0)
        exit_ = last.get("terminated") or {}
        how = f"exit code {exit_.get('exitCode')}" + (f" ({exit_['reason']})" if exit_.get("reason") else "")
        return PodProblem(f"container {name} keeps crashing (restarted {restarts} times, last {how})",
                          restarts >= CRASH_RESTARTS_FATAL)
    if reason in _WAITING_FATAL:
        # A Secret or ConfigMap that is missing now stays missing: rtui creates them before the pods.
        return PodProblem(f"container {name}: {reason}: {detail or '(no message)'}", True)
    if reason and reason not in _STARTING:
        return PodProblem(f"container {name} waiting: {reason}" + (f": {detail}" if detail else ""), False)
    if state.get("terminated") and pod.get("status", {}).get("phase") == "Failed":
        t = state["terminated"]
        return PodProblem(f"container {name} exited with code {t.get('exitCode')} ({t.get('reason', 'Error')})", True)
    return None


def pod_problem(pod: Obj, events: list[dict[str, Any]], *,
                unobtainable: Collection[str] = frozenset()) -> PodProblem | None:
    """The one line that says why ``pod`` is not running yet, or None when it is fine or just starting.

    ``unobtainable``: resources allocatable_problems says no node will offer (say the EFA plugin
    cannot run); a pod waiting for one of them waits forever, so that insufficiency is fatal.
    Otherwise "not scheduled" is transient: an autoscaler or a device plugin may still add capacity.
    Still pulling an image is transient and worth saying: a training image takes minutes.
    An OOM kill is reported even after the container restarted: the Ray worker it held is gone,
    and the same job on the same limit will be killed again.
    """
    mine = sorted((e for e in events if _about(e, pod)), key=_when)
    status = pod.get("status", {})
    if status.get("phase") == "Failed":
        # Evicted, or the node went away: the pod object is dead; its controller makes a new one.
        reason = status.get("reason")
        if reason:
            return PodProblem(f"pod failed: {reason}: {status.get('message', '')}".rstrip(": "), True)
    for c in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        found = _container_problem(c, pod, mine)
        if found:
            return found
    if status.get("phase") == "Failed":
        return PodProblem("pod failed", True)
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            scheduling = [e for e in mine if e.get("reason") == "FailedScheduling"]
            return _scheduling_problem(_message(scheduling[-1]) if scheduling else cond.get("message", ""),
                                       unobtainable)
    if pod_running(pod):
        return None
    for e in reversed(mine):
        reason = e.get("reason")
        if reason == "Pulled" or reason == "Started":
            return None
        if reason == "Pulling":
            return PodProblem(f"{_message(e)} (still pulling)", False)
        if reason in ("FailedMount", "FailedAttachVolume", "FailedCreatePodSandBox"):
            return PodProblem(f"{reason}: {_message(e)}", False)
    return None
