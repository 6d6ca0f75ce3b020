"""Pods the API server refused to create: seen from their controllers' records, named by the rule that refused them.

A pod that admission refuses never exists, so nothing on a pod says why the head, a worker or the pre-pull is
missing. Their controllers record it instead (issue 35, item 4):

- KubeRay (ray-operator/controllers/ray/raycluster_controller.go, createHeadPod/createWorkerPod): a Warning
  event on the RayCluster, reason ``FailedToCreateHeadPod`` or ``FailedToCreateWorkerPod``, message
  "Failed to create head Pod <ns>/<name>, <the API's error>"; and, in its status, the condition
  ``ReplicaFailure`` True with reason ``FailedCreateHeadPod``/``FailedCreateWorkerPod`` and the error.
- The DaemonSet controller (kubernetes pkg/controller/controller_utils.go): a Warning event on the DaemonSet,
  reason ``FailedCreate``, message "Error creating: <the API's error>".

The API's error names its rule: PodSecurity admission writes ``violates PodSecurity "<level>:<version>"``
(k8s.io/pod-security-admission), a webhook (Kyverno, Gatekeeper) ``admission webhook "<name>" denied the
request``, ResourceQuota ``exceeded quota: <name>``, a ValidatingAdmissionPolicy ``ValidatingAdmissionPolicy
'<name>' with binding ...``. A refusal that repeats will repeat: the wait stops at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backend.errors import RtuiError
from backend.resources import CheckResult, CheckStatus
from targets.kube.config import KubeConfig
from targets.kube.manifests import image_user

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

Manifest = dict[str, Any]

# The controllers' event reasons for a pod they could not create.
FAILED_CREATE = frozenset({"FailedToCreateHeadPod", "FailedToCreateWorkerPod", "FailedCreate"})
ROLES = {"FailedToCreateHeadPod": "the head pod", "FailedToCreateWorkerPod": "a worker pod"}
_POD_SECURITY = re.compile(r'violates PodSecurity "([^"]+)"')
_WEBHOOK = re.compile(r'admission webhook "([^"]+)" denied')
_QUOTA = re.compile(r"exceeded quota: ([^,\s]+)")
_POLICY = re.compile(r"ValidatingAdmissionPolicy '([^']+)'")


@dataclass(frozen=True)
class Refusal:
    """What the API server answered a controller's pod create: the rule, and its own words."""

    rule: str
    message: str
    what: str  # "the head pod", "a worker pod", "the pre-pull's pods"

    def line(self, namespace: str) -> str:
        # What follows the rule in the API's message stays whole: it names every control the pod broke.
        found = _POD_SECURITY.search(self.message)
        detail = self.message[found.end():].lstrip(": ") if found else self.message.split("forbidden: ", 1)[-1]
        return f"{self.rule} in namespace {namespace} refused {self.what}: {detail}"

    def remedy(self, namespace: str, ray_version: str = "<version>") -> str:
        if self.rule.startswith("Pod Security") and "runAsNonRoot" in self.message:
            return (f"use an image that runs as non-root (--image rayproject/ray:{ray_version}-gpu, uid 1000), "
                    f"or a namespace whose pod-security.kubernetes.io/enforce is baseline (not {namespace})")
        if self.rule.startswith("ResourceQuota"):
            return f"ask for more quota in namespace {namespace}, or lower --gpu-node-count / --gpus-per-node"
        return f"ask the cluster's admins to admit rtui's pods in namespace {namespace}, or use another --namespace"


def refusal_rule(message: str) -> str:
    """The rule an admission refusal names, as a person would look it up."""
    if found := _POD_SECURITY.search(message):
        return f'Pod Security "{found.group(1)}"'
    if found := _WEBHOOK.search(message):
        return f'admission webhook "{found.group(1)}"'
    if found := _QUOTA.search(message):
        return f'ResourceQuota "{found.group(1)}"'
    if found := _POLICY.search(message):
        return f'ValidatingAdmissionPolicy "{found.group(1)}"'
    return "admission"


def _api_error(reason: str, message: str) -> str:
    """The API's own error inside a controller's event message."""
    if reason == "FailedCreate":
        return message.removeprefix("Error creating: ")
    # KubeRay: "Failed to create head Pod <ns>/<name>, <err>"
    return message.split(", ", 1)[1] if ", " in message else message


def _refused(message: str) -> bool:
    # Admission answers 403 Forbidden ("... is forbidden: ...") or a webhook's denial; anything else a
    # controller fails to create (a conflict, a timeout) it retries, and so does rtui's wait.
    return "forbidden" in message or "denied the request" in message


def from_events(events: list[Manifest], what: str) -> Refusal | None:
    """The latest refusal among a controller's events on its object, or None."""
    for event in reversed(events):
        reason = str(event.get("reason") or "")
        if reason not in FAILED_CREATE or event.get("type") not in (None, "Warning"):
            continue
        error = _api_error(reason, str(event.get("message") or event.get("note") or ""))
        if _refused(error):
            return Refusal(refusal_rule(error), error, ROLES.get(reason, what))
    return None


def from_conditions(raycluster: Manifest | None) -> Refusal | None:
    """KubeRay's ``ReplicaFailure`` condition when a pod create was refused (its message: reason, newline, error)."""
    for cond in ((raycluster or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") != "ReplicaFailure" or cond.get("status") != "True":
            continue
        error = str(cond.get("message") or "").split("\n", 1)[-1]
        if _refused(error):
            role = "the head pod" if "Head" in str(cond.get("reason")) else "a worker pod"
            return Refusal(refusal_rule(error), error, role)
    return None


async def refused(api: KubeApi, namespace: str, owner: str, *, raycluster: Manifest | None = None,
                  what: str = "its pods") -> Refusal | None:
    """Why the API server refused the pods of ``owner`` (a RayCluster or a DaemonSet), or None."""
    found = from_conditions(raycluster) if raycluster is not None else None
    return found or from_events(await api.events(namespace, owner), what)


# ---- before anything is applied ----------------------------------------------------------------------------
POD_SECURITY_LABEL = "pod-security.kubernetes.io/"


async def pod_security_check(api: KubeApi, config: KubeConfig) -> CheckResult | None:
    """Preflight: whether the namespace (the user's, adopted) enforces Pod Security ``restricted`` while the
    image runs as root, which no setting of rtui's can make pass (``runAsNonRoot``). None where there is
    nothing to say: no such namespace yet (rtui's own enforces baseline), another level, or not readable."""
    try:
        live = await api.get("v1", "Namespace", config.namespace)
    except RtuiError:  # not readable with these rights: the pods' refusal, if any, is read from the events
        return None
    labels = ((live or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(f"{POD_SECURITY_LABEL}enforce") != "restricted":
        return None
    rule = f'Pod Security "restricted:{labels.get(f"{POD_SECURITY_LABEL}enforce-version", "latest")}"'
    user = image_user(config.image)
    if user is not None:
        return CheckResult(id="kube.pod-security", title="Pod Security", status=CheckStatus.OK,
                           detail=f"namespace {config.namespace} enforces {rule}: the Ray pods run as uid {user[0]}, "
                                  "the image's own non-root user")
    return CheckResult(
        id="kube.pod-security", title="Pod Security", status=CheckStatus.FAIL,
        detail=f"namespace {config.namespace} enforces {rule}, which refuses pods that may run as root, and the "
               f"image {config.image} runs as root (or as a user rtui does not know)",
        remedy=f"use Ray's image, which runs as uid 1000 (--image rayproject/ray:{config.ray_version}-gpu), or a "
               "namespace whose pod-security.kubernetes.io/enforce is baseline")
