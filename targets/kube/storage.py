"""The run's volume on kube (``--storage-size``): a PersistentVolumeClaim of the cluster's default StorageClass.

What the Kubernetes docs say, and what rtui does with it:

- A claim without ``storageClassName`` gets the cluster's default StorageClass (the class annotated
  ``storageclass.kubernetes.io/is-default-class: "true"``; the newest when several are) from the
  DefaultStorageClass admission plugin. With no default it keeps no class and can bind only a
  pre-made PV of no class: a claim meant to be provisioned stays Pending. (kubernetes.io/docs/
  concepts/storage/persistent-volumes/ "Class"; /storage-classes/ "Default StorageClass".)
  Preflight refuses that in one line.
- Access modes: ``ReadWriteOnce`` is "mounted as read-write by a single node" (several pods may share
  it only on that node); ``ReadWriteMany`` by many nodes. A StorageClass does not say which modes
  its provisioner gives: that is the driver's (block devices such as EBS, GCE PD, Azure Disk,
  local-path give ReadWriteOnce only; file systems such as EFS, Filestore, Azure Files, NFS, CephFS
  give ReadWriteMany). The Ray head runs on a CPU node and every GPU worker on its own GPU node, and
  all of them write the run's storage (Ray Train's controller on the head, each rank's checkpoint
  shards): a ReadWriteOnce volume cannot serve them, so a default class of a block-device driver is
  refused in preflight, and an unknown driver is asked for ReadWriteMany with a warning.
- ``volumeBindingMode: WaitForFirstConsumer`` (EBS's usual classes): the claim binds only once a
  pod that mounts it is scheduled, so the claim's step does not wait for Bound then.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backend.layers.base import Context
from backend.resources import Action, CheckResult, CheckStatus, Observed, Resource
from backend.runner import Progress
from backend.waiting import Look, wait_until
from targets.kube import manifests
from targets.kube.config import KubeConfig, kube_config
from targets.kube.handlers import LAYER, NAMESPACE, KubeHandler, delete_ours, object_id, ours
from targets.kube.specs import ClaimSpec

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

Obj = dict[str, Any]
DATA_CLAIM = "kube.pvc.data"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
# The CSI drivers (and in-tree names) of shared file systems: ReadWriteMany.
MANY_NODE_PROVISIONERS = frozenset({
    "efs.csi.aws.com", "fsx.csi.aws.com", "filestore.csi.storage.gke.io", "file.csi.azure.com",
    "kubernetes.io/azure-file", "nfs.csi.k8s.io", "cephfs.csi.ceph.com", "rook-ceph.cephfs.csi.ceph.com",
    "kubernetes.io/glusterfs", "cluster.local/nfs-subdir-external-provisioner", "nfs-provisioner"})
# Block devices and node-local disks: ReadWriteOnce (and ReadWriteOncePod) only.
SINGLE_NODE_PROVISIONERS = frozenset({
    "ebs.csi.aws.com", "kubernetes.io/aws-ebs", "pd.csi.storage.gke.io", "kubernetes.io/gce-pd",
    "disk.csi.azure.com", "kubernetes.io/azure-disk", "rancher.io/local-path", "kubernetes.io/no-provisioner",
    "driver.longhorn.io", "rbd.csi.ceph.com", "rook-ceph.rbd.csi.ceph.com"})
BIND_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class StorageFacts:
    """The cluster's default StorageClass, as far as the run's claim cares."""

    class_name: str | None  # None: the cluster has no default class
    provisioner: str = ""
    binding_mode: str = "Immediate"

    @property
    def access_mode(self) -> str:
        return manifests.READ_WRITE_ONCE if self.provisioner in SINGLE_NODE_PROVISIONERS \
            else manifests.READ_WRITE_MANY

    @property
    def known(self) -> bool:
        return self.provisioner in SINGLE_NODE_PROVISIONERS | MANY_NODE_PROVISIONERS


def default_class(classes: list[Obj]) -> Obj | None:
    """The class a claim without one gets: the newest of those marked default (admission's choice)."""
    defaults = [c for c in classes
                if ((c.get("metadata") or {}).get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true"]
    return max(defaults, key=lambda c: c["metadata"].get("creationTimestamp") or "", default=None)


async def storage_facts(api: KubeApi) -> StorageFacts:
    found = default_class(await api.list("storage.k8s.io/v1", "StorageClass"))
    if found is None:
        return StorageFacts(None)
    return StorageFacts(found["metadata"]["name"], str(found.get("provisioner") or ""),
                        str(found.get("volumeBindingMode") or "Immediate"))


def claim_spec(config: KubeConfig, run_id: str, facts: StorageFacts | None) -> ClaimSpec:
    """What the plan shows of the run's volume."""
    if facts is None:
        where = "the cluster's default (not asked yet)"
    elif facts.class_name is None:
        where = "none: the cluster has no default StorageClass"
    else:
        where = f"{facts.class_name} ({facts.provisioner or 'no provisioner named'}, the cluster's default)"
    return ClaimSpec(name=manifests.data_claim_name(config), size=config.storage_size, storage_class=where,
                     access_mode=facts.access_mode if facts else manifests.READ_WRITE_MANY,
                     mounted_at=manifests.DATA_MOUNT, job_writes_to=manifests.job_storage_path(run_id),
                     on_down="kept unless --delete-data")


def check(config: KubeConfig, facts: StorageFacts) -> CheckResult:
    """Whether the claim can be provisioned and mounted by every Ray pod: one line either way."""
    title = "Run volume (--storage-size)"
    if facts.class_name is None:
        return CheckResult(
            id="kube.storage", title=title, status=CheckStatus.FAIL,
            detail="the cluster has no default StorageClass: a PersistentVolumeClaim without storageClassName "
                   "stays Pending",
            remedy="mark one default (kubectl annotate storageclass NAME "
                   f"{DEFAULT_CLASS_ANNOTATION}=true), or pass --storage-path s3://BUCKET/PREFIX instead")
    if facts.access_mode == manifests.READ_WRITE_ONCE:
        return CheckResult(
            id="kube.storage", title=title, status=CheckStatus.FAIL,
            detail=f"the default StorageClass {facts.class_name} ({facts.provisioner}) gives ReadWriteOnce volumes, "
                   f"mounted by one node at a time, but the Ray head and the {config.gpu_node_count} GPU worker(s) "
                   "run on different nodes and all write the run's storage",
            remedy="make a ReadWriteMany class the default (EFS, Filestore, Azure Files, NFS, CephFS), or pass "
                   "--storage-path s3://BUCKET/PREFIX instead")
    if not facts.known:
        return CheckResult(
            id="kube.storage", title=title, status=CheckStatus.WARN,
            detail=f"{config.storage_size} ReadWriteMany from the default StorageClass {facts.class_name}: rtui does "
                   f"not know whether {facts.provisioner or 'its provisioner'} gives ReadWriteMany (if not, the claim "
                   "stays Pending with a ProvisioningFailed event)")
    return CheckResult(id="kube.storage", title=title, status=CheckStatus.OK,
                       detail=f"{config.storage_size} ReadWriteMany from the default StorageClass {facts.class_name} "
                              f"({facts.provisioner})")


def claim_size(claim: Obj) -> str:
    return str((((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage") or "")


def claim_capacity(claim: Obj) -> str:
    """The claim's size as Kubernetes writes it (its capacity once bound, else its request): ``50Gi``."""
    return str(((claim.get("status") or {}).get("capacity") or {}).get("storage") or claim_size(claim))


class DataClaimHandler(KubeHandler):
    kind = "kube-pvc"
    spec_model = ClaimSpec
    title = "Create the run's volume (PersistentVolumeClaim)"
    expected_s = 10.0

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        config = kube_config(ctx)
        if not config.storage_size:
            return None  # no run without one asks for claims (nor needs the permission to)
        live = await api.get("v1", "PersistentVolumeClaim", manifests.data_claim_name(config),
                             config.namespace)
        if live is None or not ours(live, ctx.record.run_id):
            return None
        phase = (live.get("status") or {}).get("phase") or "Pending"
        return Observed(address=DATA_CLAIM, layer=LAYER, kind=self.kind, id=object_id(live),
                        state={"size": claim_size(live), "phase": phase,
                               "storage_class": (live.get("spec") or {}).get("storageClassName")},
                        depends_on=(NAMESPACE,), reason=phase.lower())

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        if have.state.get("size") != ClaimSpec.of(want).size:
            # A claim never shrinks, and grows only where its class allows expansion: the data stays.
            return Action.NOOP, f"kept at {have.state.get('size')} with the run's data (resize it with kubectl " \
                                "where the StorageClass allows expansion)"
        return Action.NOOP, have.reason

    def kube_objects(self, ctx: Context, want: Resource) -> list[manifests.Manifest]:
        return [manifests.data_claim(kube_config(ctx), ctx.record.run_id,
                                     ClaimSpec.of(want).access_mode or manifests.READ_WRITE_MANY)]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = kube_config(ctx)
        api = self.api(ctx)
        facts = await storage_facts(api)
        claim = manifests.data_claim(config, ctx.record.run_id, facts.access_mode)
        await api.apply(claim)
        ctx.ledger.update(want.address, id=object_id(claim), outputs={"size": config.storage_size})
        if facts.binding_mode == "WaitForFirstConsumer":
            yield Progress(f"{object_id(claim)}: {config.storage_size}, bound when the first Ray pod that "
                           f"mounts it is scheduled ({facts.class_name} waits for a consumer)", 1.0)
            return

        async def bound() -> Look:
            live = await api.get(*_ref(config))
            phase = ((live or {}).get("status") or {}).get("phase") or "Pending"
            return Look(phase == "Bound", f"claim {phase}")

        async for p in wait_until(bound, what=f"the volume {object_id(claim)} to be provisioned",
                                timeout_s=BIND_TIMEOUT_S,
                                remedy=f"see `kubectl -n {config.namespace} describe pvc "
                                       f"{manifests.data_claim_name(config)}` (its events say why)"):
            yield p

    def kept_on_down(self, have: Observed, observed: Sequence[Observed]) -> bool:
        return True  # the run's checkpoints and model: `rtui down --delete-data` removes it (VolumeStore)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        async for p in delete_ours(self.api(ctx), ctx, [manifests.data_claim(kube_config(ctx), ctx.record.run_id)]):
            yield p


def _ref(config: KubeConfig) -> tuple[str, str, str, str]:
    return "v1", "PersistentVolumeClaim", manifests.data_claim_name(config), config.namespace
