"""A kube run's data on its volume (``--storage-size``), read from here through the API server.

rtui cannot reach the volume itself: a short-lived pod of the run mounts the claim **read-only**,
prints what rtui asks on its stdout, and rtui reads that through the API server (``pods/log``).

Why the pod's log and not ``exec`` with ``tar`` (what ``kubectl cp`` does): exec needs a WebSocket
(or SPDY) stream the kubernetes client speaks only with ``kubernetes.stream``, which hands stdout
back decoded as text, and the Kubernetes emulator of the tests (kmock 0.8) serves no exec at all.
The log is a plain GET every cluster answers, and its reader pod needs only ``pods`` create/get/
delete and ``pods/log`` get, which rtui already uses. Its limit: the kubelet rotates a container's
log at ``containerLogMaxSize`` (10Mi by default) and ``pods/log`` returns the current file only, so
one pod prints at most ``CHUNK_BYTES`` of a file (base64 in numbered lines well under that) and a
big file is read by several pods in turn; a fetch that stops keeps the files already copied and
goes on from the next one (a file of the right size is kept, as for S3).

Every line is numbered: the log reader drops a line repeated at one timestamp (a resumed stream
would repeat it), and two equal chunks of a file are not a repeat.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from backend.delivery import DataUsage, prepare_target
from backend.errors import OperationError
from backend.layers.kubernetes import manifests
from backend.layers.kubernetes.handlers import ours
from backend.layers.kubernetes.storage import claim_capacity
from training.export import INCOMPLETE, MODEL_MARKER, ExportInfo

if TYPE_CHECKING:
    from backend.config import RunConfig
    from backend.layers.kubernetes.access import KubeApi

T = TypeVar("T")
Obj = dict[str, Any]
ROLE_LABEL = "rtui.dev/role"
READER_ROLE = "data-reader"
# Raw bytes one reader pod prints: ~8 MiB of log in base64, under the kubelet's 10Mi rotation.
CHUNK_BYTES = 6 * 2**20
LINE_BYTES = 6000  # 8,000 base64 characters a line: far from the 16 KiB where runtimes split lines
READER_TIMEOUT_S = 300.0
LISTING_FRESH_S = 10.0
# What a month of stored data costs where the driver's price is known and billed on bytes stored:
# EFS Standard, us-east-1, $0.30 per GB-month (Amazon EFS pricing; other regions differ a little).
# Block volumes bill their whole provisioned size instead, and rtui refuses them for the run's volume.
PER_GIB_MONTH = {"efs.csi.aws.com": 0.30}
# The program the reader pod runs (python is in every Ray image): ``list RUN`` or ``read RUN PATH OFFSET LENGTH``.
READER = r"""
import base64, json, os, sys
n = 0
def out(text):
    global n
    n += 1
    print(f"{n} {text}", flush=True)
mode, run = sys.argv[1], sys.argv[2]
if os.path.isdir(run):
    os.chdir(run)
    if mode == "list":
        for root, dirs, files in os.walk("."):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)[2:]
                if os.path.islink(path):
                    continue
                entry = {"f": path, "s": os.path.getsize(path)}
                if name == "rtui_model.json":
                    with open(path) as fh:
                        entry["text"] = fh.read()
                out(json.dumps(entry))
    else:
        path, offset, left = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        with open(path, "rb") as fh:
            fh.seek(offset)
            while left > 0:
                chunk = fh.read(min(int(sys.argv[6]), left))
                if not chunk:
                    break
                out(base64.b64encode(chunk).decode())
                left -= len(chunk)
out("END")
"""


class VolumeStore:
    """The run's directory on its claim: ``pvc://<namespace>/<claim>/<run id>``."""

    def __init__(self, config: RunConfig, run_id: str) -> None:
        self.config, self.run_id = config, run_id
        self.claim = manifests.data_claim_name(config)
        self.uri = f"pvc://{config.namespace}/{self.claim}/{run_id}"
        self._listed: tuple[float, list[Obj]] | None = None  # the last listing: one pod serves a status

    # ---- the API, in a loop of its own (the store's methods are called in a worker thread) ----------
    def _with_api(self, fn: Callable[[KubeApi], Awaitable[T]]) -> T:
        # lazy: the kubernetes client (~1 s) only when a volume is read; `rtui status` of other runs does without
        from backend.layers.kubernetes.access import KubeApi

        async def run() -> T:
            api = KubeApi.from_kubeconfig(self.config.kubeconfig, self.config.context,
                                          timeout_s=self.config.kube_timeout_s,
                                          stream_idle_s=self.config.kube_stream_idle_s)
            try:
                return await fn(api)
            finally:
                api.close()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(run())
        # Called on a loop's own thread (the TUI's teardown modal asks for the usage): a loop of its own
        # in another thread, as asyncio.run cannot nest.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, run()).result()

    async def _live_claim(self, api: KubeApi) -> Obj | None:
        live = await api.get("v1", "PersistentVolumeClaim", self.claim, self.config.namespace)
        return live if ours(live, self.run_id) else None

    def _reader_pod(self, name: str, args: list[str]) -> Obj:
        off_gpu_nodes = {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": manifests.GPU_NODE_LABEL, "operator": "NotIn", "values": ["true"]}]}]}
        tiny = {"cpu": "100m", "memory": "256Mi"}
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.config.namespace,
                         "labels": {**manifests.labels(self.run_id), ROLE_LABEL: READER_ROLE}},
            "spec": {
                "restartPolicy": "Never",
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": off_gpu_nodes}},
                "containers": [{"name": "read", "image": self.config.image, "workingDir": manifests.DATA_MOUNT,
                                "command": ["python", "-c", READER, *args],
                                "resources": {"requests": dict(tiny), "limits": dict(tiny)},
                                "volumeMounts": [{"name": manifests.DATA_VOLUME, "mountPath": manifests.DATA_MOUNT,
                                                  "readOnly": True}]}],
                "volumes": [{"name": manifests.DATA_VOLUME, "persistentVolumeClaim": {
                    "claimName": self.claim, "readOnly": True}}],
            },
        }

    async def _read(self, api: KubeApi, args: list[str]) -> list[str]:
        """Run one reader pod to its end and return its numbered lines' payloads (all of them, or an error)."""
        name = f"{self.claim}-read-{secrets.token_hex(3)}"
        ns = self.config.namespace
        await api.apply(self._reader_pod(name, args))
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + READER_TIMEOUT_S
            while True:
                pod = await api.get("v1", "Pod", name, ns) or {}
                phase = (pod.get("status") or {}).get("phase")
                if phase in ("Succeeded", "Failed"):
                    break
                if loop.time() > deadline:
                    raise OperationError(f"the pod {ns}/{name} reading the run's volume did not finish in "
                                         f"{READER_TIMEOUT_S:.0f}s (phase {phase or 'Pending'})",
                                         remedy=f"see `kubectl -n {ns} describe pod {name}`, then run it again")
                await asyncio.sleep(0.2)
            lines = [line async for line in api.read_pod_log(ns, name, "read", timestamps=False)]
        finally:
            await api.delete("v1", "Pod", name, ns)
        payloads = []
        for expected, line in enumerate(lines, 1):
            number, _, payload = line.partition(" ")
            if number != str(expected):
                break
            payloads.append(payload)
        if phase != "Succeeded" or not payloads or payloads[-1] != "END":
            tail = lines[-1] if lines else "no output"
            raise OperationError(f"reading the run's volume {self.uri} failed ({phase}): {tail[:300]}",
                                 remedy="run it again; `kubectl describe pvc` shows whether the volume is there")
        return payloads[:-1]

    async def _listing(self, api: KubeApi) -> list[Obj]:
        """What the run's directory holds; a listing of the last few seconds serves again (`status` asks
        for the model and the usage one after the other: one reader pod, not two)."""
        now = time.monotonic()
        if self._listed is not None and now - self._listed[0] < LISTING_FRESH_S:
            return self._listed[1]
        if await self._live_claim(api) is None:
            return []
        listing = [json.loads(p) for p in await self._read(api, ["list", self.run_id])]
        self._listed = (now, listing)
        return listing

    # ---- DataStore -------------------------------------------------------------------------------
    def _models(self, listing: list[Obj]) -> list[ExportInfo]:
        files = {e["f"] for e in listing}
        found = []
        for entry in listing:
            path = str(entry["f"])
            if path.rsplit("/", 1)[-1] != MODEL_MARKER:
                continue
            directory = path[: -len(MODEL_MARKER)].rstrip("/")
            if INCOMPLETE in directory.rsplit("/", 1)[-1] or directory.count("/") > 1:
                continue  # an export that did not finish, or deeper than <run name>/<model>
            try:
                info = ExportInfo(**json.loads(entry.get("text") or ""))
            except (ValueError, TypeError):
                continue
            inside = f"{directory}/" if directory else ""
            if all(f"{inside}{name}" in files for name in info.files):
                uri = f"{self.uri}/{directory}" if directory else self.uri
                found.append(ExportInfo(**{**asdict(info), "uri": uri}))
        return sorted(found, key=lambda m: (m.final, m.step), reverse=True)

    def models(self) -> list[ExportInfo]:
        return self._models(self._with_api(self._listing))

    def latest_model(self) -> ExportInfo | None:
        models = self.models()
        return models[0] if models else None

    def usage(self) -> DataUsage:
        async def look(api: KubeApi) -> tuple[Obj | None, list[Obj], str]:
            claim = await self._live_claim(api)
            if claim is None:
                return None, [], ""
            class_name = (claim.get("spec") or {}).get("storageClassName")
            found = await api.get("storage.k8s.io/v1", "StorageClass", class_name) if class_name else None
            return claim, await self._listing(api), str((found or {}).get("provisioner") or "")

        claim, listing, provisioner = self._with_api(look)
        if claim is None:
            return DataUsage(self.uri, 0, 0, 0)
        size = sum(int(e["s"]) for e in listing)
        checkpoints = sum(1 for e in listing if str(e["f"]).rsplit("/", 1)[-1] == "rtui_checkpoint.json")
        volume = claim_capacity(claim)
        where = f"{self.uri} (a {volume} volume)" if volume else self.uri
        per_gib = PER_GIB_MONTH.get(provisioner)
        return DataUsage(where, size, len(self._models(listing)), checkpoints,
                         monthly_cost=size / 2**30 * per_gib if per_gib is not None else None)

    def fetch(self, model: ExportInfo, to: Path, progress: Callable[[int, int], None] | None = None) -> list[str]:
        """Copy the model's files through reader pods, ``CHUNK_BYTES`` a pod; a file already there with
        the right size is kept (an interrupted fetch goes on from the next file)."""
        prepare_target(to)
        directory = model.uri[len(self.uri):].strip("/")
        inside = f"{directory}/" if directory else ""

        async def copy(api: KubeApi) -> list[str]:
            self._listed = None  # the sizes to copy: as they are now
            sizes = {e["f"]: int(e["s"]) for e in await self._listing(api)}
            missing = [n for n in model.files if f"{inside}{n}" not in sizes]
            if missing:
                raise OperationError(f"the model at {model.uri} lacks {missing[0]} now",
                                     remedy="see `rtui status`: the run may have written a newer model")
            total, done, copied = sum(sizes[f"{inside}{n}"] for n in model.files), 0, []
            for name in model.files:
                size = sizes[f"{inside}{name}"]
                dst = to / name
                if not (dst.is_file() and dst.stat().st_size == size):
                    part = to / f".{name}.part"
                    part.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        with part.open("wb") as fh:
                            for offset in range(0, max(size, 1), CHUNK_BYTES):
                                for line in await self._read(api, ["read", self.run_id, f"{inside}{name}",
                                                                   str(offset), str(CHUNK_BYTES), str(LINE_BYTES)]):
                                    fh.write(base64.b64decode(line))
                                if progress is not None:
                                    progress(done + min(offset + CHUNK_BYTES, size), total)
                    except OSError as exc:
                        part.unlink(missing_ok=True)
                        raise OperationError(f"writing {name} to {to} failed: {exc.strerror or exc}",
                                             remedy="free some space there (or pick another --to) and run it "
                                                    "again; files already copied are kept") from None
                    except OperationError:
                        part.unlink(missing_ok=True)
                        raise
                    if part.stat().st_size != size:
                        part.unlink(missing_ok=True)
                        raise OperationError(f"{name} came back with another size than on the volume",
                                             remedy="run it again (the run may still be writing it)")
                    os.replace(part, dst)
                    copied.append(name)
                done += size
                if progress is not None:
                    progress(done, total)
            return copied

        return self._with_api(copy)

    def delete(self) -> None:
        """The claim (its volume goes with it where the class's reclaim policy is Delete, the default for
        provisioned volumes), then the run's namespace when nothing of the run runs there any more."""

        async def remove(api: KubeApi) -> None:
            ns = self.config.namespace
            if await self._live_claim(api) is not None:
                await api.delete("v1", "PersistentVolumeClaim", self.claim, ns)
            namespace = await api.get("v1", "Namespace", ns)
            if ours(namespace, self.run_id) and not await api.list("v1", "Pod", ns):
                await api.delete("v1", "Namespace", ns)

        self._with_api(remove)
