"""Finding a local cluster from the world, not the record: its marked dir and the processes holding it.

Each local cluster lives in ``/tmp/rtui-<run id>-<4 hex>``, made 0700 by us, with a marker
file naming the run and the cluster. A directory is ours only if it carries that marker and
belongs to our user; a process is ours only if its command line holds that exact directory.
So ``rtui down`` finds a cluster whose record (or whole state dir) is gone, and never
touches a path or a process that merely looks similar.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from backend.errors import OperationError
from backend.procs import owned

# Short on purpose: Ray puts unix sockets under <dir>/r/session_<date>_<pid>/sockets/, and a
# socket path may not exceed 107 bytes.
ROOT = Path("/tmp")
PREFIX = "rtui-"
MARKER = "rtui-cluster.json"


@dataclass
class ClusterDir:
    path: Path
    run_id: str
    cluster_name: str
    created_at: float
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ray_dir(self) -> Path:
        """Ray's temp dir. Ray makes it world-writable (0777); the 0700 dir around it keeps others out."""
        return self.path / "r"

    @property
    def dashboard_url(self) -> str | None:
        url = self.facts.get("dashboard_url")
        return str(url) if url else None


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
            "created_at": cluster.created_at, **cluster.facts}
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
        if not isinstance(run_id, str) or not isinstance(name, str) or not path.name.startswith(f"{PREFIX}{run_id}-"):
            return None
        return ClusterDir(path, run_id, name, created, data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


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
    """The ``ray start`` processes that hold a cluster dir, by node name."""

    head: psutil.Process | None = None
    workers: dict[int, psutil.Process] = field(default_factory=dict)


def node_name(cluster_name: str, worker: int | None) -> str:
    return f"{cluster_name}-head" if worker is None else f"{cluster_name}-worker-{worker}"


def holds(cmdline: list[str], path: Path) -> bool:
    """Whether a command line names exactly ``path`` (or something inside it), never a sibling."""
    p = str(path)
    return any(arg == p or arg.endswith("=" + p) or p + "/" in arg for arg in cmdline)


def node_procs(cluster: ClusterDir) -> NodeProcs:
    out = NodeProcs()
    head_name = node_name(cluster.cluster_name, None)
    worker_prefix = f"--node-name={cluster.cluster_name}-worker-"
    for proc in psutil.process_iter(["cmdline", "uids"]):
        cmdline = proc.info.get("cmdline") or []
        if not _mine(proc) or "start" not in cmdline or f"--temp-dir={cluster.ray_dir}" not in cmdline:
            continue
        if not _alive(proc):
            continue
        if "--head" in cmdline and f"--node-name={head_name}" in cmdline:
            out.head = proc
            continue
        for arg in cmdline:
            if arg.startswith(worker_prefix) and arg[len(worker_prefix):].isdigit():
                out.workers[int(arg[len(worker_prefix):])] = proc
    return out


def cluster_family(path: Path, roots: list[psutil.Process] | None = None) -> list[psutil.Process]:
    """Every live process of a cluster: holding its dir, started by a root, or in their sessions.

    Ray renames some processes (``ray::DashboardAgent``), so their command line no longer
    names the dir; they still share the session of the ``ray start`` that does.
    """
    found: dict[int, psutil.Process] = {}
    table: list[tuple[psutil.Process, int | None]] = []
    for proc in psutil.process_iter(["cmdline", "uids"]):
        if not _mine(proc):  # another user's process is never ours, whatever its command line says
            continue
        try:
            sid: int | None = os.getsid(proc.pid)
        except OSError:
            sid = None
        table.append((proc, sid))
        if holds(proc.info.get("cmdline") or [], path):
            found[proc.pid] = proc
    for root in roots or []:
        found[root.pid] = root
        with contextlib.suppress(psutil.Error):
            for child in root.children(recursive=True):
                found[child.pid] = child
    sessions = set()
    for proc in found.values():
        with contextlib.suppress(OSError):
            sessions.add(os.getsid(proc.pid))
    sessions.discard(os.getsid(0))  # never our own (the user's terminal) session
    for proc, sid in table:
        if sid is not None and sid in sessions:
            found.setdefault(proc.pid, proc)
    found.pop(os.getpid(), None)
    return [p for p in found.values() if _alive(p) and owned(p)]


def session_family(root: psutil.Process) -> list[psutil.Process]:
    """One node: its ``ray start`` and everything in that process's session (not the rest of the cluster)."""
    try:
        sid = os.getsid(root.pid)
    except OSError:
        return []
    if sid == os.getsid(0):
        return [root]
    out = [root]
    for proc in psutil.process_iter():
        with contextlib.suppress(OSError):
            if proc.pid != root.pid and os.getsid(proc.pid) == sid:
                out.append(proc)
    return [p for p in out if _alive(p) and owned(p)]


def _mine(proc: psutil.Process) -> bool:
    """``owned`` from the uids ``process_iter`` fetched (no second system call per process)."""
    uids = proc.info.get("uids")
    return uids is not None and uids.real == os.getuid()


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
