"""Finding a local cluster from the world, not the record: its marked dir and the processes holding it.

Each local cluster lives in ``/tmp/rtui-<run id>-<4 hex>``, made 0700 by us, with a marker
file naming the run and the cluster. A directory is ours only if it carries that marker and
belongs to our user. A process is the cluster's only if rtui started it: the marker records
each root rtui started (pid and start time), and the cluster's processes are those roots, their
descendants and the members of the sessions the roots lead (see ``cluster_family``). A process
that merely names the dir (``tail -f <dir>/rtui-head.log``) is never the cluster's, nor is its
session. So ``rtui down`` finds a cluster whose record (or whole state dir) is gone, and never
touches a path or a process that merely looks similar.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from backend.errors import OperationError
from backend.procs import ProcRef, owned

# Short on purpose: Ray puts unix sockets under <dir>/r/session_<date>_<pid>/sockets/, and a
# socket path may not exceed 107 bytes.
ROOT = Path("/tmp")
PREFIX = "rtui-"
MARKER = "rtui-cluster.json"


@dataclass(frozen=True)
class Root:
    """A process rtui started for a cluster (``procs.start_detached``), under the name of its role:
    a node's name (``<cluster>-head``, ``<cluster>-worker-0``) or ``idle-watcher``."""

    role: str
    ref: ProcRef


@dataclass
class ClusterDir:
    path: Path
    run_id: str
    cluster_name: str
    created_at: float
    facts: dict[str, Any] = field(default_factory=dict)
    roots: list[Root] = field(default_factory=list)

    @property
    def ray_dir(self) -> Path:
        """Ray's temp dir. Ray makes it world-writable (0777); the 0700 dir around it keeps others out."""
        return self.path / "r"

    @property
    def dashboard_url(self) -> str | None:
        url = self.facts.get("dashboard_url")
        return str(url) if url else None


# How long a local cluster's processes get to exit on SIGTERM before SIGKILL. Most of a Ray node never
# does (`ray start --block`, the GCS, the raylet, the runtime-env agent and the autoscaler's monitor were
# all still there 6 s after it, Ray 2.58): a grace only makes `down` wait for them (4.8 s with 3 s).
# An earlier try of 1 s left a head's processes running beside a CPU-bound process: ones the cluster
# started after they were listed, which `down` now looks for again (``procs.stop_group``). With that,
# 1 s held beside a CPU-bound process (tests/test_local_security.py's two clusters at once, and
# test_local_ownership.py, test_local_e2e.py's kills).
STOP_GRACE_S = 1.0


def make_cluster_dir(run_id: str, cluster_name: str, facts: dict[str, Any]) -> ClusterDir:
    """A fresh 0700 dir with its marker written before anything is started in it."""
    for _ in range(20):
        path = ROOT / f"{PREFIX}{run_id}-{secrets.token_hex(2)}"
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        cluster = ClusterDir(path, run_id, cluster_name, time.time(), dict(facts))
        write_marker(cluster)
        return cluster
    raise OperationError(f"could not create a cluster dir under {ROOT}")


def write_marker(cluster: ClusterDir) -> None:
    data = {"run_id": cluster.run_id, "cluster_name": cluster.cluster_name, "target": "local",
            "created_at": cluster.created_at, **cluster.facts,
            "roots": [{"role": r.role, "pid": r.ref.pid, "create_time": r.ref.create_time} for r in cluster.roots]}
    tmp = cluster.path / f".{MARKER}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, cluster.path / MARKER)


def read_marker(path: Path) -> ClusterDir | None:
    """The cluster a dir holds, or None unless it is a real dir of ours with a valid marker."""
    try:
        st = path.lstat()
        if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid():
            return None
        data = json.loads((path / MARKER).read_text())
        run_id, name = data.pop("run_id"), data.pop("cluster_name")
        created = float(data.pop("created_at", st.st_mtime))
        roots = [Root(str(r["role"]), ProcRef(int(r["pid"]), float(r["create_time"]))) for r in data.pop("roots", [])]
        if not isinstance(run_id, str) or not isinstance(name, str) or not path.name.startswith(f"{PREFIX}{run_id}-"):
            return None
        return ClusterDir(path, run_id, name, created, data, roots)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def record_root(cluster: ClusterDir, role: str, ref: ProcRef) -> None:
    """Note in the marker a process rtui just started for the cluster: from now on it, its descendants
    and its session are the cluster's. Merged into the marker as it is on disk (another rtui or the
    idle watcher may have written it since ``cluster`` was read)."""
    on_disk = read_marker(cluster.path) or cluster
    on_disk.roots = [*on_disk.roots, Root(role, ref)]
    write_marker(on_disk)
    cluster.roots = list(on_disk.roots)


IDLE_WATCHER = "idle-watcher"  # the role of targets.local.idle's process among a cluster's roots


def idle_watch_s(cluster: ClusterDir) -> int:
    """The idle timeout (s) the cluster's live idle watcher keeps, read from its own command line (the
    last argument of ``python -m targets.local.idle DIR IDLE_S``); 0 when none runs."""
    for root in reversed(cluster.roots):
        proc = root.ref.process() if root.role == IDLE_WATCHER else None
        if proc is None:
            continue
        try:
            return int(proc.cmdline()[-1])
        except (psutil.Error, ValueError, IndexError):
            continue
    return 0


def find_clusters(*, run_id: str | None = None, cluster_name: str | None = None) -> list[ClusterDir]:
    """Marked cluster dirs on this host, newest first, of one run and/or one cluster name."""
    pattern = f"{PREFIX}{run_id}-*" if run_id else f"{PREFIX}*"
    found = []
    for path in ROOT.glob(pattern):
        cluster = read_marker(path)
        if cluster is None or (run_id and cluster.run_id != run_id):
            continue
        if cluster_name and cluster.cluster_name != cluster_name:
            continue
        found.append(cluster)
    return sorted(found, key=lambda c: c.created_at, reverse=True)


def tighten(path: Path) -> None:
    """Take group and other bits off everything under a cluster dir.

    Ray chmods the directories it makes to 0777 whatever the umask; the 0700 dir around them
    already keeps other users out, and this keeps the modes saying so too.
    """
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                if st.st_mode & 0o077 and not os.path.islink(os.path.join(root, name)):
                    os.chmod(os.path.join(root, name), st.st_mode & 0o700)


def remove_cluster_dir(path: Path) -> None:
    """Delete a cluster dir, but only one that still carries our marker."""
    if read_marker(path) is None:
        raise OperationError(f"refusing to delete {path}: it has no rtui marker of ours")
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        raise OperationError(f"could not remove {path}")


@dataclass
class NodeProcs:
    """The ``ray start`` processes rtui started for a cluster, by node."""

    head: psutil.Process | None = None
    workers: dict[int, psutil.Process] = field(default_factory=dict)


def node_name(cluster_name: str, worker: int | None) -> str:
    return f"{cluster_name}-head" if worker is None else f"{cluster_name}-worker-{worker}"


def node_procs(cluster: ClusterDir) -> NodeProcs:
    """The cluster's ``ray start`` processes (our uid, its ray dir, one of its node names) that rtui started."""
    out = NodeProcs()
    head_name = node_name(cluster.cluster_name, None)
    worker_prefix = f"{cluster.cluster_name}-worker-"
    for proc in psutil.process_iter(["cmdline", "uids"]):
        cmdline = proc.info.get("cmdline") or []
        if not _mine(proc) or "start" not in cmdline or f"--temp-dir={cluster.ray_dir}" not in cmdline:
            continue
        name = next((arg.removeprefix("--node-name=") for arg in cmdline if arg.startswith("--node-name=")), "")
        if not _started_by_rtui(cluster, name, proc) or not _alive(proc):
            continue
        if "--head" in cmdline and name == head_name:
            out.head = proc
        elif name.startswith(worker_prefix) and name[len(worker_prefix):].isdigit():
            out.workers[int(name[len(worker_prefix):])] = proc
    return out


def _started_by_rtui(cluster: ClusterDir, role: str, proc: psutil.Process) -> bool:
    """Whether ``proc`` is the recorded root of ``role``; for a role with no recorded root, whether it
    leads a session of its own.

    No recorded root means a dir made before roots were recorded, or an rtui that died between
    starting the node and writing the marker. rtui starts every node in a new session
    (``start_detached``), so such a node is a ``ray start`` of that exact ray dir and node name
    that leads its session; a ``ray start`` typed in a terminal does not (the shell leads that
    session), and anything else that merely names the dir is no ``ray start`` of this node."""
    refs = [r.ref for r in cluster.roots if r.role == role]
    if refs:
        return any(ref.matches(proc) for ref in refs)
    try:
        return bool(os.getsid(proc.pid) == proc.pid)
    except OSError:
        return False


def cluster_family(cluster: ClusterDir | Path) -> list[psutil.Process]:
    """Every live process of a cluster: its roots (its nodes' ``ray start`` and the recorded ones),
    their descendants, and the members of the sessions those roots lead.

    The sessions are needed because ``ray start`` daemonises: Ray starts its raylet, GCS and
    agents without a session of their own (``ray._private.services.start_ray_process``), and
    renames some (``ray::DashboardAgent``); when a ``ray start`` dies first they are re-parented
    to init and no longer its descendants, but keep its session id. Only a session a root leads
    counts (rtui made it with ``start_new_session``), never the session of a process that merely
    names the dir. A dir without our marker has no processes of ours."""
    if isinstance(cluster, Path):
        marked = read_marker(cluster)
        if marked is None:
            return []
        cluster = marked
    nodes = node_procs(cluster)
    roots = [p for p in (nodes.head, *nodes.workers.values()) if p is not None]
    sessions: dict[int, float] = {}  # a session a root leads -> when that root started
    for root in roots:
        with contextlib.suppress(OSError, psutil.Error):
            if os.getsid(root.pid) == root.pid:
                sessions[root.pid] = root.create_time()
    for recorded in cluster.roots:
        try:
            proc = psutil.Process(recorded.ref.pid)
        except psutil.NoSuchProcess:
            # Gone, but the kernel never hands out a pid again while a session (or process group)
            # of that id still has a member (POSIX: process ID reuse; Linux frees a pid only when
            # no task uses it as pid, pgid or sid): a session of that id is still the root's.
            sessions[recorded.ref.pid] = recorded.ref.create_time
            continue
        except psutil.Error:
            continue
        if recorded.ref.matches(proc):  # else its pid was reused: that process and its session are not ours
            roots.append(proc)
            sessions[recorded.ref.pid] = recorded.ref.create_time
    return _family(roots, sessions)


def _family(roots: list[psutil.Process], sessions: dict[int, float]) -> list[psutil.Process]:
    """The live roots, their descendants, and our processes in ``sessions`` (session id -> when its
    leader started), never this process or its session."""
    found: dict[int, psutil.Process] = {}
    for root in roots:
        found[root.pid] = root
        with contextlib.suppress(psutil.Error):
            for child in root.children(recursive=True):
                found[child.pid] = child
    sessions = {sid: started for sid, started in sessions.items() if sid != os.getsid(0)}  # never the user's terminal
    if sessions:
        for proc in psutil.process_iter(["uids", "create_time"]):
            if not _mine(proc):  # another user's process is never ours
                continue
            with contextlib.suppress(OSError):
                started = sessions.get(os.getsid(proc.pid))
                # A member started before the root cannot be one it made (a guard on the clock's word).
                if started is not None and (proc.info.get("create_time") or 0.0) >= started - 0.5:
                    found.setdefault(proc.pid, proc)
    found.pop(os.getpid(), None)  # the idle watcher is a root too, and stops the rest
    return [p for p in found.values() if _alive(p) and owned(p)]


def session_family(root: psutil.Process) -> list[psutil.Process]:
    """One node: its ``ray start``, its descendants and the session it leads (not the rest of the cluster)."""
    return node_family(root)()


def node_family(root: psutil.Process) -> Callable[[], list[psutil.Process]]:
    """``session_family`` to look up again while the node stops: whether the root leads its session is
    asked once, while it lives; the session outlives it (its id is not handed out again while the
    session has a member)."""
    try:
        sessions = {root.pid: root.create_time()} if os.getsid(root.pid) == root.pid else {}
    except (OSError, psutil.Error):
        sessions = {}
    return lambda: _family([root], sessions)


def _mine(proc: psutil.Process) -> bool:
    """``owned`` from the uids ``process_iter`` fetched (no second system call per process)."""
    uids = proc.info.get("uids")
    return uids is not None and uids.real == os.getuid()


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
