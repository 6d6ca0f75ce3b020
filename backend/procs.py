"""Processes we start and must be able to find and stop again, even after a crash.

A process is identified by (pid, create_time) so a recycled pid is never mistaken
for ours. A detached process leads a session of its own (``start_new_session``: its session
id is its pid), so everything it spawns shares that id, even once re-parented to init
(``targets.local.cluster`` finds them from the pid and start time it records).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from backend.errors import OperationError, UserError


@dataclass(frozen=True)
class ProcRef:
    pid: int
    create_time: float

    def matches(self, proc: psutil.Process) -> bool:
        """Whether ``proc`` is this very process, not another that got its pid later."""
        try:
            return bool(proc.pid == self.pid and abs(proc.create_time() - self.create_time) <= 0.5)
        except psutil.Error:
            return False

    def process(self) -> psutil.Process | None:
        """The live process, or None if it is gone, a zombie, or the pid was reused."""
        try:
            proc = psutil.Process(self.pid)
            if not self.matches(proc):
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def alive(self) -> bool:
        return self.process() is not None


# The lowest port rtui picks for a server: above the well-known ports and most services' defaults.
LISTEN_LOW = 10000


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out itself (outgoing connections, a bind to port 0): Linux's
    net.ipv4.ip_local_port_range (ip(7)); elsewhere the IANA dynamic range, macOS's default."""
    try:
        low, high = (int(word) for word in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def _listen_candidates() -> range:
    """Where rtui picks a server's port: below the ephemeral range, so no connection this machine makes
    takes it between the pick and the server's bind (a connected socket holds its local port against
    every bind, SO_REUSEADDR or not); an empty range when the kernel's covers nearly everything."""
    low, _ = ephemeral_range()
    return range(LISTEN_LOW, low) if low - LISTEN_LOW >= 1000 else range(0)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct ports free right now, for servers that bind them later (Ray's, seconds after).

    Picked at random outside the kernel's ephemeral range (``_listen_candidates``), each checked by
    binding it; all are held open together until the last is found, so none is handed out twice. Where
    there is no such range left, the kernel picks (port 0), as before."""
    candidates = _listen_candidates()
    pick = random.SystemRandom()
    socks: list[socket.socket] = []
    try:
        for _ in range(count * 50 if candidates else 0):
            if len(socks) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, pick.choice(candidates)))  # one already held here fails too
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < count:  # no range to pick from, or nearly all of it taken
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


STOP_ROUNDS = 5


def stop_group(find: Callable[[], Sequence[psutil.Process]], *, grace_s: float) -> tuple[int, list[psutil.Process]]:
    """Stop a group of processes that may start more while it stops (a raylet still starting a worker
    when its SIGTERM lands): ``terminate`` what ``find`` sees, then look again, until it sees none.

    Returns how many processes were stopped and those that would not stop (should be none)."""
    def running() -> list[psutil.Process]:  # a zombie has stopped: it only waits for its parent to reap it
        return [p for p in find() if _alive(p)]

    stopped: set[int] = set()
    for _ in range(STOP_ROUNDS):
        procs = running()
        if not procs:
            return len(stopped), []
        stopped.update(p.pid for p in procs)
        survivors = terminate(procs, grace_s=grace_s)
        if survivors:
            return len(stopped), survivors
    return len(stopped), running()


def check_port_free(port: int, host: str = "127.0.0.1", what: str = "port") -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            raise UserError(
                f"{what} {port} on {host} is already taken",
                remedy="choose another port, or 0 for a free one",
            ) from None


def start_detached(
    argv: Sequence[str], *, log_path: Path, env: dict[str, str], cwd: Path, umask: int = 0o077
) -> ProcRef:
    """Start a process that outlives us (own session, no terminal, output to a private file).

    ``umask`` is inherited by everything it starts: by default nothing it writes is readable
    by others.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with open(fd, "ab") as log, open(os.devnull, "rb") as devnull:
        try:
            proc = subprocess.Popen(
                list(argv), stdin=devnull, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                start_new_session=True, close_fds=True, umask=umask,
            )
        except OSError as exc:
            raise OperationError(f"cannot start {argv[0]}: {exc.strerror}") from None
    ps = psutil.Process(proc.pid)
    return ProcRef(pid=proc.pid, create_time=ps.create_time())


KILLED_GONE_S = 7.0  # how long a SIGKILLed process may take to be gone


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def owned(proc: psutil.Process) -> bool:
    """Whether ``proc`` runs as this process's user (real uid). A command line is anyone's to write:
    another user's process naming our dir is not ours, and root must not signal it."""
    try:
        return bool(proc.uids().real == os.getuid())
    except psutil.Error:
        return False


def terminate(procs: Sequence[psutil.Process], *, grace_s: float = 3.0) -> list[psutil.Process]:
    """SIGTERM, wait, then SIGKILL what is left. Returns what survived (should be nothing).

    Only processes of our own uid are signalled (see ``owned``); the others are left alone."""
    procs = [p for p in procs if owned(p)]
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    alive = _wait_gone(procs, grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return _wait_gone(alive, KILLED_GONE_S)


def _wait_gone(procs: Sequence[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after at most ``timeout_s``.

    Not ``psutil.wait_procs``: it takes a process that is not our child for alive until somebody reaps it
    (``wait_pid`` polls ``pid_exists``), and a Ray worker that exited stays a zombie while its raylet,
    which ignores SIGTERM, is alive: every stop waited out the whole grace."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _alive(p)]
    return alive
