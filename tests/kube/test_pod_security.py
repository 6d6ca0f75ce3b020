"""Ray pods' identity and Pod Security (issue 33, item 5).

Workers ran as the head's service account: with idle scaling on, KubeRay 1.7.0 binds its autoscaler Role
(pods get/list/watch/patch, rayclusters get/patch: ray-operator/controllers/ray/common/rbac.go BuildRole,
BuildRoleBinding) to the account the head pod names (utils.GetHeadGroupServiceAccountName), and the
account's token was mounted in every worker: a compromised worker could patch the RayCluster's image.
KubeRay leaves a worker template's ``serviceAccountName`` as it is (common/pod.go
DefaultWorkerPodTemplate), so the workers' own account is ours to give.

Every pod rtui makes in the run's namespace is checked against the Pod Security Standards' Baseline
profile (https://kubernetes.io/docs/concepts/security/pod-security-standards/) as PodSecurity admission
would, on the pods KubeRay makes of the RayCluster (``pod_security.kuberay_pods``), and against
Restricted for what rtui claims of the Ray containers (all but running as non-root: the default image,
an AWS Deep Learning Container, runs as root).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backend.config import RunConfig
from targets.kube import manifests as m
from targets.kube.config import KubeConfig
from targets.kube.layer import every_object
from targets.kube.volume_store import VolumeStore
from tests.kube import pod_security as pss
from tests.kube.conftest import KubeCluster
from tests.kube.test_manifests import schema_errors

RUN = "r20260101-120000-abcd"
CONFIGS = {
    "idle scaling": KubeConfig(target="kube"),
    "fixed size": KubeConfig(target="kube", idle_minutes=0),
    "own volume": KubeConfig(target="kube", storage_size="100Gi"),
    "storage identity": KubeConfig(target="kube", service_account="ray-s3"),
}
# What rtui does not claim of the Ray containers: the default image runs as root (restricted's
# runAsNonRoot); Baseline does not ask it.
NOT_CLAIMED = ("runAsNonRoot",)


def pods_in_namespace(run_config: RunConfig) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Every pod rtui makes in the run's namespace: from the objects it applies, and its volume reader."""
    config = KubeConfig.of(run_config)
    objects, _ = every_object(config, RUN)
    out = [p for o in objects if (o["metadata"].get("namespace") == config.namespace)
           for p in pss.pod_specs(o)]
    if config.storage_size:
        store = VolumeStore(config, RUN)
        image = f"{config.image}@sha256:{'0' * 64}"  # as pinned at its first pod (no registry here)
        for pod in (store._reader_pod("reader", image, ["list", RUN]),
                    store._reader_pod("exec", image, [], ["sleep", "60"])):
            out += list(pss.pod_specs(pod))
    return out


def test_the_checker_refuses_each_baseline_control_as_admission_words_it() -> None:
    ok: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    assert pss.baseline_violations({}, ok) == []
    bad: dict[str, dict[str, Any]] = {
        "hostProcess": {"securityContext": {"windowsOptions": {"hostProcess": True}}},
        "host namespaces": {"hostNetwork": True},
        "privileged": {"containers": [{"name": "c", "securityContext": {"privileged": True}}]},
        "non-default capabilities": {"containers": [{"name": "c", "securityContext": {
            "capabilities": {"add": ["IPC_LOCK"]}}}]},
        "hostPath volumes": {"volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}]},
        "hostPort": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}]},
        "forbidden AppArmor": {"securityContext": {"appArmorProfile": {"type": "Unconfined"}}},
        "seLinuxOptions": {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}},
        "procMount": {"containers": [{"name": "c", "securityContext": {"procMount": "Unmasked"}}]},
        "seccompProfile": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
        "forbidden sysctls": {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}},
    }
    for reason, change in bad.items():
        found = pss.baseline_violations({}, {**ok, **change})
        assert len(found) == 1 and found[0].startswith(reason), (reason, found)
    message = pss.refusal("p", "baseline", "v1.33", pss.baseline_violations({}, {**ok, **bad["hostPath volumes"]}))
    assert message == 'pods "p" is forbidden: violates PodSecurity "baseline:v1.33": hostPath volumes (volumes "dev")'


@pytest.mark.parametrize("case", CONFIGS)
def test_every_pod_in_the_runs_namespace_passes_baseline_and_restricted_but_non_root(case: str) -> None:
    config = CONFIGS[case]
    found = pods_in_namespace(config)
    kinds = {what.split()[0] for what, _, _ in found}
    assert {"RayCluster", "DaemonSet"} <= kinds and ("Pod" in kinds) == bool(config.storage_size)
    for what, meta, spec in found:
        assert pss.baseline_violations(meta, spec) == [], what
        claimed = [v for v in pss.restricted_violations(meta, spec) if not v.startswith(NOT_CLAIMED)]
        assert claimed == [], what
        # No pod of the run holds a Kubernetes token unless it talks to the API (the autoscaler only).
        autoscaler = any(c["name"] == "autoscaler" for c in spec["containers"])
        assert spec.get("automountServiceAccountToken") is autoscaler, what


@pytest.mark.parametrize("case", CONFIGS)
def test_the_raycluster_still_validates_against_kuberays_crd(case: str) -> None:
    assert schema_errors(m.raycluster(CONFIGS[case], RUN)) == []


def test_the_namespace_enforces_baseline_and_warns_and_audits_restricted() -> None:
    labels = m.namespace(KubeConfig(target="kube"), RUN)["metadata"]["labels"]
    version = m.POD_SECURITY_VERSION
    assert {k: v for k, v in labels.items() if k.startswith(pss.LABEL_PREFIX)} == {
        "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": version,
        "pod-security.kubernetes.io/warn": "restricted", "pod-security.kubernetes.io/warn-version": version,
        "pod-security.kubernetes.io/audit": "restricted", "pod-security.kubernetes.io/audit-version": version}
    assert labels[m.MANAGED_BY_LABEL] == "rtui" and labels[m.RUN_LABEL] == RUN


@pytest.mark.parametrize("case", CONFIGS)
def test_workers_run_as_their_own_tokenless_account_never_the_one_kuberay_binds_its_autoscaler_role_to(
        case: str) -> None:
    config = CONFIGS[case]
    objects, _ = every_object(config, RUN)
    rc = objects[-1]
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    worker = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    # utils.GetHeadGroupServiceAccountName: the head template's account, else the RayCluster's name.
    bound = head.get("serviceAccountName") or rc["metadata"]["name"]
    if config.service_account:
        # The storage identity (EKS Pod Identity keys it on one account's name) is the workers' too, for their
        # checkpoints: they share the account, never its token, so the autoscaler's rights stay in the head.
        assert worker["serviceAccountName"] == bound == config.service_account
    else:
        assert worker["serviceAccountName"] == m.worker_service_account_name(config) != bound
    assert worker["automountServiceAccountToken"] is False
    accounts = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceAccount"
                and o["metadata"]["namespace"] == config.namespace}
    made = accounts[worker["serviceAccountName"]]
    assert made["automountServiceAccountToken"] is False
    assert made["metadata"]["labels"][m.MANAGED_BY_LABEL] == "rtui"
    # The head keeps its token only for KubeRay's autoscaler sidecar (idle scaling).
    assert head["automountServiceAccountToken"] is bool(config.idle_timeout_s())
    if config.service_account:  # the storage identity's account (Pod Identity needs no token mount)
        assert head["serviceAccountName"] == config.service_account
        assert accounts[config.service_account]["automountServiceAccountToken"] is False


async def test_the_emulator_refuses_a_pod_that_breaks_its_namespaces_enforce_level(kube_cluster: KubeCluster,
                                                                                  tmp_path: Path) -> None:
    """kube-apiserver's PodSecurity admission: a pod breaking the namespace's ``enforce`` level is refused
    with 403 Forbidden, every broken control named; an unlabelled namespace admits it (privileged)."""
    from backend.errors import RtuiError
    from tests.kube.test_ray_service_account import session_for

    session = session_for(tmp_path)
    from targets.kube.serviceaccount import ServiceAccountHandler

    api = ServiceAccountHandler().api(session.ctx)
    await api.apply(m.namespace(KubeConfig.of(session.config), session.run_id))
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "escape", "namespace": KubeConfig.of(session.config).namespace},
           "spec": {"hostNetwork": True, "containers": [{"name": "c", "image": "busybox"}],
                    "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}
    with pytest.raises(RtuiError) as refused:
        await api.apply(pod)
    assert (f'violates PodSecurity "baseline:{m.POD_SECURITY_VERSION}": host namespaces (hostNetwork=true), '
            'hostPath volumes (volumes "root")') in str(refused.value)
    assert await api.get("v1", "Pod", "escape", KubeConfig.of(session.config).namespace) is None
    # The same pod in a namespace without the labels (someone else's, say) is admitted.
    await api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "open"}})
    await api.apply({**pod, "metadata": {"name": "escape", "namespace": "open"}})
    assert await api.get("v1", "Pod", "escape", "open") is not None
    session.close()


async def test_a_namespace_this_run_made_before_pod_security_gets_its_labels_on_the_next_apply(
        kube_cluster: KubeCluster, tmp_path: Path) -> None:
    """A run made by an rtui without these labels: its namespace is ours, so the plan updates it in place
    (a Namespace's labels change without touching its pods; PodSecurity only warns about running pods
    that break the new level: https://kubernetes.io/docs/concepts/security/pod-security-admission/)."""
    from backend.resources import Action, Resource
    from targets.kube.handlers import NAMESPACE, NamespaceHandler
    from tests.kube.test_ray_service_account import session_for

    session = session_for(tmp_path)
    handler = NamespaceHandler()
    api = handler.api(session.ctx)
    old = m.namespace(KubeConfig.of(session.config), session.run_id)
    old["metadata"]["labels"] = m.labels(session.run_id)
    await api.apply(old)
    have = await handler.observe(api, session.ctx)
    assert have is not None
    want = Resource(address=NAMESPACE, layer="kube", kind=handler.kind,
                    spec={"name": KubeConfig.of(session.config).namespace, "pod_security": "baseline"})
    action, reason = handler.compare(want, have)
    assert action is Action.UPDATE and "pod_security" in reason
    from backend.ledger import ResourceStatus

    session.ctx.ledger.set(NAMESPACE, handler.kind, ResourceStatus.READY, layer="kube")  # made before
    async for _ in handler.update(session.ctx, want, have):
        pass
    live = await api.get("v1", "Namespace", KubeConfig.of(session.config).namespace)
    assert live is not None and live["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    again = await handler.observe(api, session.ctx)
    assert again is not None and handler.compare(want, again)[0] is Action.NOOP
    session.close()
