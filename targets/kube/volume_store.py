"""A kube run's data on its volume (``--storage-size``), read from here through the API server.

rtui cannot reach the volume itself. It reads it the way ``kubectl cp`` does: one short-lived pod of
the run mounts the claim **read-only** and sleeps, and rtui ``exec``s into it through the API server
(``pods/exec``, a WebSocket, v4.channel.k8s.io frames): a small python program lists the run's
directory, and ``tar cf -`` of the model's files streams them back, one pod and one stream for the
whole copy. A copy that stops keeps the files already complete and goes on from the next one (a file
of the right size is kept, as for S3). What a pod prints is data, never a path to trust: every line of
a listing must be an entry, every name is checked before the first byte is written (``safepath``), and
the pod runs the image the run pinned by digest, not its tag.

Some clusters forbid ``pods/exec`` by RBAC. Then rtui says so in one line and falls back to reading
the pod's log (``pods/log``, which rtui already needs): reader pods print numbered base64 lines, at
most ``CHUNK_BYTES`` a pod as the kubelet rotates a container's log at ``containerLogMaxSize`` (10Mi
by default) and ``pods/log`` returns the current file only: slow, but it needs no new permission.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import secrets
import sys
import tarfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from backend.delivery import DataUsage
from backend.errors import OperationError, RtuiError, UserError
from backend.safepath import already_there, checked_target, partial_file
from backend.waiting import Look, WaitTimedOut, wait_done
from targets.kube import manifests
from targets.kube.config import KubeConfig
from targets.kube.handlers import namespace_conditions, ours
from targets.kube.storage import claim_capacity
from training.export import INCOMPLETE, MODEL_MARKER, ExportInfo

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

T = TypeVar("T")
Obj = dict[str, Any]
ROLE_LABEL = "rtui.dev/role"
READER_ROLE = "data-reader"
# Raw bytes one reader pod prints: ~8 MiB of log in base64, under the kubelet's 10Mi rotation.
CHUNK_BYTES = 6 * 2**20
LINE_BYTES = 6000  # 8,000 base64 characters a line: far from the 16 KiB where runtimes split lines
READER_TIMEOUT_S = 300.0
READER_POLL_S = 0.2  # a reader pod is read the moment it has run: polls never slower than this
# A reader's ``sleep`` is PID 1 with no SIGTERM handler, so SIGTERM does nothing and the kubelet kills it
# only when the grace period ends (30 s by default, "Pod Lifecycle: Termination of Pods"): one second is
# all a reader that holds nothing needs, and its namespace can go right after.
READER_GRACE_S = 1
GONE_TIMEOUT_S = 120.0  # a reader pod, then the run's namespace, to be gone after their delete
# How long the exec'd reader pod lives at most (it is deleted when done; this bounds a crashed rtui's pod).
EXEC_POD_S = 3600
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

    def __init__(self, config: KubeConfig, run_id: str, state_root: Path | None = None, *,
                 api: Callable[[], Awaitable[KubeApi]] | None = None) -> None:
        """``api``: the session's client to the cluster (it closes it); without one (no session) each
        call makes its own from the kubeconfig and closes it."""
        self.config, self.run_id = config, run_id
        self.state_root = state_root  # where the run's record is (None: the state dir of the environment)
        self._session_api = api
        self._image: str | None = None  # the image reader pods run, settled at the first pod
        self.claim = manifests.data_claim_name(config)
        self.uri = f"pvc://{config.namespace}/{self.claim}/{run_id}"
        self._listed: tuple[float, list[Obj]] | None = None  # the last listing: one pod serves a status
        self._exec_allowed = True  # until the cluster answers 403 to pods/exec
        self.notice: Callable[[str], None] = lambda line: print(line, file=sys.stderr)

    @contextlib.asynccontextmanager
    async def _api(self) -> AsyncIterator[KubeApi]:
        if self._session_api is not None:
            yield await self._session_api()
            return
        # lazy: the kubernetes client (~1 s) only when a volume is read; `rtui status` of other runs does without
        from targets.kube.api import KubeApi

        api = KubeApi.from_kubeconfig(self.config.kubeconfig, self.config.context,
                                      timeout_s=self.config.kube_timeout_s,
                                      stream_idle_s=self.config.kube_stream_idle_s)
        try:
            yield api
        finally:
            api.close()

    async def _live_claim(self, api: KubeApi) -> Obj | None:
        live = await api.get("v1", "PersistentVolumeClaim", self.claim, self.config.namespace)
        return live if ours(live, self.run_id) else None

    async def _reader_image(self) -> str:
        """The image reader pods run, settled at the first (the record, perhaps the registry: off the loop)."""
        if self._image is None:
            self._image = await asyncio.to_thread(run_image, self.config, self.run_id, self.state_root)
        return self._image

    def _reader_pod(self, name: str, image: str, args: list[str], command: list[str] | None = None) -> Obj:
        off_gpu_nodes = {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": manifests.GPU_NODE_LABEL, "operator": "NotIn", "values": ["true"]}]}]}
        tiny = {"cpu": "100m", "memory": "256Mi"}
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.config.namespace,
                         "labels": {**manifests.labels(self.run_id), ROLE_LABEL: READER_ROLE}},
            "spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": READER_GRACE_S,
                **({"activeDeadlineSeconds": EXEC_POD_S} if command else {}),
                "nodeSelector": manifests.node_platform(),
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": off_gpu_nodes}},
                # It reads a volume, never the API: no token; Pod Security as every Ray container (issue 33):
                # as the user that wrote the files, the image's (non-root where the image is; a root image's
                # files may be readable by root alone).
                "automountServiceAccountToken": False, "securityContext": manifests.pod_security(),
                "containers": [{"name": "read", "image": image, "workingDir": manifests.DATA_MOUNT,
                                "securityContext": manifests.container_security(manifests.image_user(image)),
                                "command": command or ["python", "-c", READER, *args],
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
        await api.apply(self._reader_pod(name, await self._reader_image(), args))
        try:
            seen = ["Pending"]

            async def ended() -> Look:
                seen[0] = _phase(await api.get("v1", "Pod", name, ns))
                return Look(done=seen[0] in ("Succeeded", "Failed"), message=f"phase {seen[0]}")

            await wait_done(ended, what=f"the pod {ns}/{name} reading the run's volume", timeout_s=READER_TIMEOUT_S,
                            poll_s=READER_POLL_S, remedy=_describe(ns, name))
            phase = seen[0]
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

    async def _listing(self, api: KubeApi, pod: str | None = None) -> list[Obj]:
        """What the run's directory holds; a listing of the last few seconds serves again (`status` asks
        for the model and the usage one after the other: one reader pod, not two)."""
        now = time.monotonic()
        if self._listed is not None and now - self._listed[0] < LISTING_FRESH_S:
            return self._listed[1]
        if await self._live_claim(api) is None:
            return []
        if pod is not None:
            text = (await self._exec(api, pod, ["python", "-c", READER, "list", self.run_id])).decode()
            lines = [ln.partition(" ")[2] for ln in text.splitlines()]
            if not lines or lines[-1] != "END":
                raise OperationError(f"listing the run's volume {self.uri} came back cut short",
                                     remedy="run it again")
            payloads = lines[:-1]
        elif self._exec_allowed:
            async with self._exec_pod(api) as name:
                if name is not None:
                    return await self._listing(api, name)
            payloads = await self._read(api, ["list", self.run_id])
        else:
            payloads = await self._read(api, ["list", self.run_id])
        listing = [self._entry(p) for p in payloads]
        self._listed = (now, listing)
        return listing

    def _entry(self, payload: str) -> Obj:
        """One line of a listing as ``{"f": path, "s": size[, "text": marker]}``; anything else is what the
        pod's container chose to print, refused in one line (its names are checked again where written)."""
        try:
            entry = json.loads(payload)
        except ValueError:
            entry = None
        if not (isinstance(entry, dict) and isinstance(entry.get("f"), str) and type(entry.get("s")) is int
                and entry["s"] >= 0 and isinstance(entry.get("text", ""), str)):
            raise OperationError(f"the listing of the run's volume {self.uri} holds a line that is not an entry: "
                                 f"{json.dumps(payload[:100])}",
                                 remedy="the reader pod did not run rtui's program as written: check the image "
                                        f"{self._image or 'the run pinned'}")
        return entry

    # ---- exec: one pod, the way `kubectl cp` reads -------------------------------------------------
    @contextlib.asynccontextmanager
    async def _exec_pod(self, api: KubeApi) -> AsyncIterator[str | None]:
        """A reader pod that sleeps until deleted, Running; None (after one line on stderr) where the
        cluster forbids ``pods/exec``: the caller reads through pod logs instead."""
        from targets.kube.api import Forbidden  # lazy: as KubeApi, only when a volume is read

        name = f"{self.claim}-read-{secrets.token_hex(3)}"
        ns = self.config.namespace
        await api.apply(self._reader_pod(name, await self._reader_image(), [], ["sleep", str(EXEC_POD_S)]))
        try:
            async def running() -> Look:
                pod = await api.get("v1", "Pod", name, ns)
                phase = _phase(pod)
                started = [c for c in ((pod or {}).get("status") or {}).get("containerStatuses") or []
                           if "running" in (c.get("state") or {})]
                return Look(done=phase == "Running" and bool(started), message=f"phase {phase}",
                            fatal=f"it ended before it could be read (phase {phase})"
                            if phase in ("Succeeded", "Failed") else None)

            await wait_done(running, what=f"the pod {ns}/{name} reading the run's volume",
                            timeout_s=READER_TIMEOUT_S, poll_s=READER_POLL_S, remedy=_describe(ns, name))
            try:
                await self._exec(api, name, ["true"])
            except Forbidden as err:
                self._exec_allowed = False
                self.notice(f"note: {err.message}; reading the volume through pod logs instead (slow: "
                            f"{CHUNK_BYTES // 2**20} MiB a pod)")
                yield None
                return
            yield name
        finally:
            await api.delete("v1", "Pod", name, ns)
            # Gone before the command returns: a pod left Terminating would keep `down --delete-data`
            # from deleting the namespace right after.
            await _until_gone(api, "v1", "Pod", name, ns)

    async def _exec(self, api: KubeApi, pod: str, command: list[str],
                    sink: Callable[[Iterator[bytes]], None] | None = None) -> bytes:
        """Run ``command`` in the reader pod; its stdout goes to ``sink`` as it comes (in this thread's
        executor), else is returned whole. A non-zero exit is an error with the command's stderr."""
        stderr, status = bytearray(), {}

        def run() -> bytes:
            nonlocal status
            out = bytearray()

            def stdout() -> Generator[bytes, None, None]:
                nonlocal status
                for channel, data in api.exec_frames(self.config.namespace, pod, "read", command):
                    if channel == 1 and data:
                        yield data
                    elif channel == 2:
                        stderr.extend(data[: max(0, 4096 - len(stderr))])
                    elif channel == 3 and data:
                        status = json.loads(data)

            frames = stdout()
            try:
                if sink is not None:
                    sink(frames)
                for data in frames:  # what the sink left, to the end of the stream and its status
                    out.extend(data)
            finally:
                frames.close()  # a sink that failed: the stream is closed now, not when collected
            return bytes(out)

        result = await asyncio.to_thread(run)
        if status.get("status") != "Success":
            why = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [str(status.get("message") or
                                                                                      "the stream ended early")]
            raise OperationError(f"reading the run's volume {self.uri} failed: {why[0][:300]}",
                                 remedy="run it again; `kubectl describe pvc` shows whether the volume is there")
        return result

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

    async def models(self) -> list[ExportInfo]:
        async with self._api() as api:
            return self._models(await self._listing(api))

    async def latest_model(self) -> ExportInfo | None:
        models = await self.models()
        return models[0] if models else None

    async def usage(self) -> DataUsage:
        async def look(api: KubeApi) -> tuple[Obj | None, list[Obj], str]:
            claim = await self._live_claim(api)
            if claim is None:
                return None, [], ""
            class_name = (claim.get("spec") or {}).get("storageClassName")
            found = await api.get("storage.k8s.io/v1", "StorageClass", class_name) if class_name else None
            return claim, await self._listing(api), str((found or {}).get("provisioner") or "")

        async with self._api() as api:
            claim, listing, provisioner = await look(api)
        if claim is None:
            return DataUsage(self.uri, 0, 0, 0)
        size = sum(int(e["s"]) for e in listing)
        checkpoints = sum(1 for e in listing if str(e["f"]).rsplit("/", 1)[-1] == "rtui_checkpoint.json")
        volume = claim_capacity(claim)
        where = f"{self.uri} (a {volume} volume)" if volume else self.uri
        per_gib = PER_GIB_MONTH.get(provisioner)
        return DataUsage(where, size, len(self._models(listing)), checkpoints,
                         monthly_cost=size / 2**30 * per_gib if per_gib is not None else None)

    async def fetch(self, model: ExportInfo, to: Path,
                    progress: Callable[[int, int], None] | None = None) -> list[str]:
        """Copy the model's files through one reader pod: ``tar cf -`` of the files not here yet, streamed
        over ``exec``; a file already there with the right size is kept (an interrupted fetch goes on
        from the files it had not finished). The names come from the reader pod's output, which is
        whatever its container prints: all are checked (``safepath``) before a pod is even made."""
        paths = checked_target(to, model.files, source=model.uri)
        directory = model.uri[len(self.uri):].strip("/")
        inside = f"{directory}/" if directory else ""

        def sizes_of(listing: list[Obj]) -> dict[str, int]:
            sizes = {str(e["f"]): int(e["s"]) for e in listing}
            missing = [n for n in model.files if f"{inside}{n}" not in sizes]
            if missing:
                raise OperationError(f"the model at {model.uri} lacks {missing[0]} now",
                                     remedy="see `rtui status`: the run may have written a newer model")
            return sizes

        async def copy(api: KubeApi) -> list[str]:
            self._listed = None  # the sizes to copy: as they are now
            if self._exec_allowed:
                async with self._exec_pod(api) as pod:
                    if pod is not None:
                        sizes = sizes_of(await self._listing(api, pod))
                        return await self._copy_by_tar(api, pod, model, to, paths, inside, sizes, progress)
            sizes = sizes_of(await self._listing(api))
            return await self._copy_by_logs(api, model, to, paths, inside, sizes, progress)

        async with self._api() as api:
            return await copy(api)

    async def _copy_by_tar(self, api: KubeApi, pod: str, model: ExportInfo, to: Path, paths: dict[str, Path],
                           inside: str, sizes: dict[str, int],
                           progress: Callable[[int, int], None] | None) -> list[str]:
        """``tar cf - -C <run dir>/<model dir> -- FILES`` in the reader pod, unpacked here as it streams:
        each file to ``.NAME.part``, renamed once complete at its listed size. ``paths``: the checked
        names (``safepath.checked_target``) and where each goes."""
        total = sum(sizes[f"{inside}{n}"] for n in paths)
        wanted = {n for n, path in paths.items() if not already_there(path, sizes[f"{inside}{n}"])}
        done = total - sum(sizes[f"{inside}{n}"] for n in wanted)
        if progress is not None:
            progress(done, total)
        if not wanted:
            return []
        copied: list[str] = []

        def untar(frames: Iterator[bytes]) -> None:
            nonlocal done
            stream = _FrameReader(frames)
            try:
                with tarfile.open(fileobj=stream, mode="r|") as tar:
                    for member in tar:
                        if member.name not in wanted or not member.isfile():
                            continue  # only a checked name that was asked: never a path of the archive's choosing
                        size = sizes[f"{inside}{member.name}"]
                        if member.size != size:
                            raise OperationError(f"{member.name} came back with another size than on the volume",
                                                 remedy="run it again (the run may still be writing it)")
                        source = tar.extractfile(member)
                        assert source is not None  # a regular file
                        with partial_file(to, member.name) as fh:
                            while chunk := source.read(2**20):
                                fh.write(chunk)
                                done += len(chunk)
                                if progress is not None:
                                    progress(done, total)
                        copied.append(member.name)
            except tarfile.TarError as exc:
                raise OperationError(f"the copy from {model.uri} stopped: {exc}",
                                     remedy="run it again: the files already copied are kept") from None

        base = f"{self.run_id}/{inside}".rstrip("/")
        await self._exec(api, pod, ["tar", "cf", "-", "-C", base, "--", *sorted(wanted)], sink=untar)
        left = sorted(wanted - set(copied))
        if left:
            raise OperationError(f"the copy from {model.uri} ended without {left[0]}",
                                 remedy="run it again: the files already copied are kept")
        return copied

    async def _copy_by_logs(self, api: KubeApi, model: ExportInfo, to: Path, paths: dict[str, Path],
                            inside: str, sizes: dict[str, int],
                           progress: Callable[[int, int], None] | None) -> list[str]:
        """The fallback where ``pods/exec`` is forbidden: ``CHUNK_BYTES`` a reader pod, through its log."""
        total, done, copied = sum(sizes[f"{inside}{n}"] for n in paths), 0, []
        for name, path in paths.items():
            size = sizes[f"{inside}{name}"]
            if not already_there(path, size):
                with partial_file(to, name) as fh:
                    for offset in range(0, max(size, 1), CHUNK_BYTES):
                        for line in await self._read(api, ["read", self.run_id, f"{inside}{name}",
                                                           str(offset), str(CHUNK_BYTES), str(LINE_BYTES)]):
                            fh.write(base64.b64decode(line))
                        if progress is not None:
                            progress(done + min(offset + CHUNK_BYTES, size), total)
                    if fh.tell() != size:
                        raise OperationError(f"{name} came back with another size than on the volume",
                                             remedy="run it again (the run may still be writing it)")
                copied.append(name)
            done += size
            if progress is not None:
                progress(done, total)
        return copied

    async def delete(self) -> None:
        """The claim (its volume goes with it where the class's reclaim policy is Delete, the default for
        provisioned volumes), then the run's namespace when nothing of the run runs there any more."""

        async def remove(api: KubeApi) -> None:
            ns = self.config.namespace
            if await self._live_claim(api) is not None:
                await api.delete("v1", "PersistentVolumeClaim", self.claim, ns)
            namespace = await api.get("v1", "Namespace", ns)
            # A pod already Terminating (a reader just deleted) goes with the namespace; one still running
            # is someone's work: the namespace stays.
            running = [p for p in await api.list("v1", "Pod", ns) if not p["metadata"].get("deletionTimestamp")]
            if ours(namespace, self.run_id) and not running:
                await api.delete("v1", "Namespace", ns)
                left = await _until_gone(api, "v1", "Namespace", ns)
                if left is not None:
                    self.notice(f"note: namespace {ns} is still being deleted: {namespace_conditions(left)}")

        async with self._api() as api:
            await remove(api)


async def _until_gone(api: KubeApi, api_version: str, kind: str, name: str, namespace: str | None = None,
                      timeout_s: float = GONE_TIMEOUT_S) -> Obj | None:
    """Wait until the object is gone; what is left of it when ``timeout_s`` passes, else None."""
    left: list[Obj | None] = [None]

    async def gone() -> Look:
        left[0] = await api.get(api_version, kind, name, namespace)
        return Look(done=left[0] is None, message="being deleted")

    try:
        await wait_done(gone, what=f"{kind} {name}", timeout_s=timeout_s, poll_s=READER_POLL_S)
    except WaitTimedOut:
        return left[0]
    return None


def _describe(namespace: str, pod: str) -> str:
    return f"see `kubectl -n {namespace} describe pod {pod}`, then run it again"


def _phase(pod: Obj | None) -> str:
    return str(((pod or {}).get("status") or {}).get("phase") or "Pending")


def run_image(config: KubeConfig, run_id: str, state_root: Path | None) -> str:
    """The image a reader pod of the run pulls: the digest the run's plan pinned (the RayCluster's, kept
    in the run's record after `down`), never the tag, which may name other bits by now. A record
    without one (a run stopped before its plan was applied) pins the tag now, as the plan does: by tag
    only with --allow-unpinned."""
    # lazy: the record and the registry client only when a reader pod is made
    from backend.store import RunStore
    from targets.kube.handlers import PREPULL, RAYCLUSTER
    from targets.kube.registry import resolve_digest

    try:
        record = RunStore(state_root).load(run_id)
    except RtuiError:
        record = None  # not in this state dir: the registry is asked below
    digests: list[object] = []
    if record is not None:
        entry = record.resources.get(RAYCLUSTER)
        digests.append(entry.outputs.get("digest") if entry is not None else None)
        changes = record.plan.changes if record.plan is not None else []
        digests += [(c.after or {}).get("digest") for c in changes if c.address in (RAYCLUSTER, PREPULL)]
    for digest in digests:
        if isinstance(digest, str):
            with contextlib.suppress(ValueError):  # not a digest: the next source
                return manifests.pinned_image(config.image, digest)
    resolved = resolve_digest(config.image)
    if resolved.digest is not None:
        return manifests.pinned_image(config.image, resolved.digest)
    if config.allow_unpinned:
        return config.image
    raise UserError(f"cannot pin the image of the pod that reads the run's volume ({config.image}) to a digest: "
                    f"{resolved.reason.removeprefix('unpinned: ')}",
                    remedy="let this machine reach the registry, or pass --allow-unpinned to pull it by tag")


class _FrameReader(io.RawIOBase):
    """The exec stream's stdout frames as a file ``tarfile`` reads in stream mode."""

    def __init__(self, frames: Iterator[bytes]) -> None:
        self._frames, self._left = frames, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            chunk = next(self._frames, None)
            if chunk is None:
                return 0
            self._left = memoryview(chunk)
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n
