"""Deletion as kube-apiserver, the kubelet and the namespace controller do it, for ``RtuiKube``.

- **A pod's grace period** ("Pod Lifecycle: Termination of Pods", kubernetes.io/docs/concepts/workloads/
  pods/pod-lifecycle/#pod-termination): a DELETE sets ``deletionTimestamp`` and
  ``deletionGracePeriodSeconds`` (``spec.terminationGracePeriodSeconds``, 30 by default); the kubelet sends
  SIGTERM and the pod stays, Terminating, until its containers exit or the grace period ends (then
  SIGKILL). A PID 1 with no handler for SIGTERM ignores it (the kernel gives PID 1 of a PID namespace no
  default action): ``sleep`` as the container's command waits out the whole grace period. Other
  containers here exit at once on SIGTERM (KubeRay's pods, rtui's readers that run to their end), and a
  pod already Succeeded or Failed has nothing to stop.
- **A namespace's deletion** (pkg/controller/namespace/deletion/namespaced_resources_deleter.go): the
  namespace gets ``deletionTimestamp`` and phase ``Terminating``; the controller deletes its content and
  keeps the namespace, with the conditions ``NamespaceContentRemaining`` ("Some resources are remaining:
  pods. has 1 resource instances", reason SomeResourcesRemain) and friends, until nothing is left.
- **NamespaceLifecycle admission** (plugin/pkg/admission/namespace/lifecycle/admission.go): a create in a
  namespace being terminated is refused 403 Forbidden, "unable to create new content in namespace X
  because it is being terminated", with a cause of type ``NamespaceTerminating``.
"""

from __future__ import annotations

import asyncio
import copy
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.kube.kmock_ext import RtuiKube

Obj = dict[str, Any]
POD_KEY = ("", "v1", "pods")
NAMESPACE_KEY = ("", "v1", "namespaces")
DEFAULT_GRACE_S = 30  # the API server's default for spec.terminationGracePeriodSeconds
_timers: set[asyncio.TimerHandle] = set()


def _now() -> str:
    from tests.kube.kmock_ext import now_rfc3339

    return now_rfc3339()


def ignores_sigterm(pod: Obj) -> bool:
    """A container whose PID 1 is ``sleep`` (no SIGTERM handler) outlives SIGTERM."""
    return any((c.get("command") or [""])[0] == "sleep" for c in (pod.get("spec") or {}).get("containers") or [])


def terminating(namespace: Obj | None) -> bool:
    return bool(namespace and (namespace.get("metadata") or {}).get("deletionTimestamp"))


def refuse_in_terminating(kube: RtuiKube, key: tuple[str, str, str], namespace: str | None, name: str) -> None:
    """NamespaceLifecycle admission: no new content in a namespace being deleted."""
    from tests.kube.kmock_ext import ApiError

    if namespace is None or key == NAMESPACE_KEY or not terminating(kube.find(NAMESPACE_KEY, None, namespace)):
        return
    group, _, plural = key
    raise ApiError(403, "Forbidden", f'{plural}{"." + group if group else ""} "{name}" is forbidden: unable to create '
                                     f"new content in namespace {namespace} because it is being terminated",
                   {"name": name, "group": group, "kind": plural, "causes": [{
                       "reason": "NamespaceTerminating", "message": f"namespace {namespace} is being terminated",
                       "field": "metadata.namespace"}]})


async def held(kube: RtuiKube, key: tuple[str, str, str], namespace: str | None, obj: Obj) -> Obj | None:
    """What a DELETE leaves for now: the pod or namespace as it stands while it terminates, or None when it
    goes at once (the caller removes it)."""
    if key == POD_KEY:
        return await _hold_pod(kube, namespace or "", obj)
    if key == NAMESPACE_KEY:
        return await _hold_namespace(kube, obj)
    return None


async def _hold_pod(kube: RtuiKube, namespace: str, pod: Obj) -> Obj | None:
    meta = pod["metadata"]
    if meta.get("deletionTimestamp"):
        return copy.deepcopy(pod)  # deleted again: still terminating, the first grace period runs on
    grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    grace = DEFAULT_GRACE_S if grace is None else int(grace)
    if grace <= 0 or not ignores_sigterm(pod) or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    name = meta["name"]
    kept = await kube._update(POD_KEY, namespace, name, {"metadata": {
        "deletionTimestamp": _now(), "deletionGracePeriodSeconds": grace}}, None)

    def kill() -> None:
        _timers.discard(timer)
        asyncio.ensure_future(_gone(kube, namespace, name))

    timer = asyncio.get_running_loop().call_later(grace, kill)
    _timers.add(timer)
    return kept


async def _gone(kube: RtuiKube, namespace: str, name: str) -> None:
    """The grace period is over: the kubelet kills the pod and the API server removes it; a namespace
    waiting only for it goes next."""
    if kube.find(POD_KEY, namespace, name) is not None:
        await kube._delete(POD_KEY, namespace, name, now=True)
    live = kube.find(NAMESPACE_KEY, None, namespace)
    if terminating(live) and not kube.items(POD_KEY, namespace):
        await kube._delete(NAMESPACE_KEY, None, namespace, now=True)


async def _hold_namespace(kube: RtuiKube, namespace: Obj) -> Obj | None:
    name = namespace["metadata"]["name"]
    if not terminating(namespace):
        await kube._update(NAMESPACE_KEY, None, name, {"metadata": {"deletionTimestamp": _now()}}, None)
        await kube._update(NAMESPACE_KEY, None, name, {"status": {"phase": "Terminating"}}, "status")
    for pod in kube.items(POD_KEY, name):
        await kube._delete(POD_KEY, name, pod["metadata"]["name"])
    left = kube.items(POD_KEY, name)
    if not left:
        return None
    conditions = [
        {"type": "NamespaceDeletionDiscoveryFailure", "status": "False", "reason": "ResourcesDiscovered",
         "message": "All resources successfully discovered", "lastTransitionTime": _now()},
        {"type": "NamespaceDeletionContentFailure", "status": "False", "reason": "ContentDeleted",
         "message": "All content successfully deleted, may be waiting on finalization",
         "lastTransitionTime": _now()},
        {"type": "NamespaceContentRemaining", "status": "True", "reason": "SomeResourcesRemain",
         "message": f"Some resources are remaining: pods. has {len(left)} resource instances",
         "lastTransitionTime": _now()},
        {"type": "NamespaceFinalizersRemaining", "status": "False", "reason": "ContentHasNoFinalizers",
         "message": "All content-preserving finalizers finished", "lastTransitionTime": _now()},
    ]
    return await kube._update(NAMESPACE_KEY, None, name,
                              {"status": {"phase": "Terminating", "conditions": conditions}}, "status")
