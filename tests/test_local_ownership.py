"""Whose processes a local cluster's are: only those rtui started (issues 23 item 8 and 33 item 3).

Issue 23: on a shared host another user can start a process whose command line names our cluster's
dir (the path is in /tmp, its name visible to all in `ps`); such a process (uid 65534) was taken for
the head, and `rtui down` run as root killed it.

Issue 33: a process of our own user that merely names the dir (`tail -f <dir>/rtui-head.log` in a
terminal) was taken for the cluster's, and with it every process of its session: `rtui down` and the
idle watcher killed the terminal's shell. A process is the cluster's only if rtui started it: a root
recorded in the marker (pid and start time), its descendants, and the root's own session.

Sessions, as the kernel keeps them (setsid(2), credentials(7)): a process started with
``start_new_session`` leads a new session whose id is its pid; its children inherit it, and a child
re-parented to init (or a subreaper) when its parent exits keeps it. Ray starts its raylet, GCS and
agents with plain ``subprocess.Popen`` (``ray._private.services.start_ray_process``: no new session,
only SIGINT blocked), so they stay in the session of the ``ray start`` that rtui made its leader.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from backend.procs import ProcRef, start_detached, terminate
from targets.local import cluster as lc
from targets.local import idle as local_idle
from tests.conftest import run_rtui
from tests.eventually import eventually

NOBODY = 65534

pytestmark = pytest.mark.host_clusters  # makes marked cluster dirs under /tmp
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="starting a process as another uid needs root")

# Each line is one write(2) to the O_APPEND log: the daemon and the head write at the same moment, and
# print() wrote each word apart ("daemonchild  9291" on a loaded machine).
# Stands in for `ray start --block` as rtui runs it: a child beside it (as Ray starts its raylet and
# GCS: same session), and a daemon that leaves it (double fork: re-parented to init or a subreaper,
# still in the session), the way `ray start` without --block leaves its processes behind.
FAKE_RAY_START = """\
import os, subprocess, sys, time
sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]  # models time: lives until stopped
child = subprocess.Popen([sys.executable, "-c", os.environ.get("FAKE_CHILD", sleeper[2])])
if os.fork() == 0:
    if os.fork() == 0:
        os.write(1, f"daemon {os.getpid()}\\n".encode())
        os.execv(sys.executable, sleeper)
    os._exit(0)
os.wait()
os.write(1, f"child {child.pid}\\n".encode())
time.sleep(300)  # models time: lives until stopped
"""


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


class FakeCluster:
    """A marked cluster dir with a fake `ray start` head started the way rtui starts one."""

    def __init__(self, state_dir: Path, name: str, *, record: bool, child: str | None = None) -> None:
        self.name = name
        self.dir = lc.make_cluster_dir("r20261205-own0001", name, {"state_dir": str(state_dir)})
        log = self.dir.path / "rtui-head.log"
        argv = [sys.executable, "-c", FAKE_RAY_START, "start", "--block", "--head",
                f"--node-name={lc.node_name(name, None)}", f"--temp-dir={self.dir.ray_dir}"]
        env = {**os.environ, **({"FAKE_CHILD": child} if child else {})}
        self.head = start_detached(argv, log_path=log, env=env, cwd=self.dir.path)
        if record:
            lc.record_root(self.dir, lc.node_name(name, None), self.head)
        try:  # a bound, not a pace: a loaded machine may take long to start three Pythons
            lines = eventually("the fake head's child and daemon", lambda: _pids(log), timeout=120)
        except AssertionError as exc:
            alive = self.head.alive()
            raise AssertionError(f"{exc}; head alive: {alive}; its log: {log.read_text()[-2000:]!r}") from None
        assert lines is not None
        self.child, self.daemon = lines["child"], lines["daemon"]

    @property
    def pids(self) -> set[int]:
        return {self.head.pid, self.child, self.daemon}


def _pids(log: Path) -> dict[str, int] | None:
    words = dict(line.split() for line in log.read_text().splitlines() if line.count(" ") == 1)
    return {k: int(v) for k, v in words.items()} if {"child", "daemon"} <= words.keys() else None


class Terminal:
    """The user's terminal: a shell leading its own session, and `tail -f` of the head's log in it.

    The shell's own command line names nothing of the cluster (the path is in its environment), as
    an interactive shell's does not; only its child `tail` names the file."""

    def __init__(self, log: Path) -> None:
        self.shell = subprocess.Popen(["/bin/sh", "-c", 'tail -f "$LOG" & wait'], start_new_session=True,
                                      env={"LOG": str(log), "PATH": os.defpath}, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shell = psutil.Process(self.shell.pid)
        tail = eventually("tail to start in the terminal's session",
                          lambda: next((p for p in shell.children() if _names(p, log)), None), timeout=30)
        assert tail is not None
        self.tail: psutil.Process = tail
        assert os.getsid(self.tail.pid) == self.shell.pid

    @property
    def pids(self) -> set[int]:
        return {self.shell.pid, self.tail.pid}

    def alive(self) -> bool:
        return all(_alive(pid) for pid in self.pids)

    def close(self) -> None:
        terminate([p for p in (self.tail, psutil.Process(self.shell.pid)) if p.is_running()])
        self.shell.wait(timeout=10)


def _names(proc: psutil.Process, path: Path) -> bool:
    try:
        return str(path) in proc.cmdline()
    except psutil.Error:
        return False


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    made: list[Terminal] = []
    yield made
    for term in made:
        term.close()


@pytest.fixture
def fakes() -> Iterator[list[FakeCluster]]:
    made: list[FakeCluster] = []
    yield made
    for fake in made:
        terminate([p for pid in fake.pids if (p := _process(pid)) is not None])
        if fake.dir.path.exists():
            lc.remove_cluster_dir(fake.dir.path)


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


@pytest.mark.parametrize("record", [True, False], ids=["roots-recorded", "older-dir-without-roots"])
@pytest.mark.parametrize("how", ["down", "idle"])
def test_a_terminal_tailing_the_head_log_survives_down_and_the_idle_stop(
        isolated_env: Path, fakes: list[FakeCluster], terminals: list[Terminal], record: bool, how: str) -> None:
    fake = FakeCluster(isolated_env, f"own-{how}-{int(record)}", record=record)
    fakes.append(fake)
    term = Terminal(fake.dir.path / "rtui-head.log")
    terminals.append(term)

    family = {p.pid for p in lc.cluster_family(fake.dir.path)}
    assert fake.pids <= family, "the cluster's own processes (child, re-parented daemon) were missed"
    assert not family & term.pids, "a user's terminal that only reads the cluster's log was taken for it"

    if how == "idle":
        cluster = lc.read_marker(fake.dir.path)
        assert cluster is not None and local_idle.stop(cluster, 6.0, None)
    else:
        down = run_rtui("down", "--yes", "--cluster-name", fake.name, timeout=120)
        assert down.returncode == 0, down.stderr
        assert not fake.dir.path.exists()
    # stop/down return only after the processes they signalled are gone: the moment has passed.
    assert not any(_alive(pid) for pid in fake.pids), "the cluster's processes outlived the stop"
    assert term.alive(), f"`{how}` killed the user's terminal or its tail"


# A child that, when stopped, starts one more process in the cluster's session before it exits: a
# raylet still starting a worker when its SIGTERM lands. It says when its handler is in place.
SPAWNS_WHEN_STOPPED = """\
import os, signal, subprocess, sys, time
def stopped(*_):
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # models time
    os.write(1, f"late {late.pid}\\n".encode())
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
os.write(1, f"ready {os.getpid()}\\n".encode())
time.sleep(300)  # models time: lives until stopped
"""


def _words(log: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in log.read_text().splitlines() if line.count(" ") == 1)}


@pytest.mark.parametrize("how", ["down", "idle"])
def test_a_process_started_while_the_cluster_stops_is_stopped_too(
        isolated_env: Path, fakes: list[FakeCluster], how: str) -> None:
    """One look at a cluster's processes before the signals misses those it starts while it stops;
    `down` and the idle stop look again until none is left (CI, issue 37: `down` exited 0 with the
    head's processes still running)."""
    fake = FakeCluster(isolated_env, f"own-late-{how}", record=True, child=SPAWNS_WHEN_STOPPED)
    fakes.append(fake)
    log = fake.dir.path / "rtui-head.log"
    eventually("the child's SIGTERM handler in place", lambda: _words(log).get("ready") == fake.child, timeout=120)
    late: int | None = None
    try:
        if how == "idle":
            cluster = lc.read_marker(fake.dir.path)
            assert cluster is not None and local_idle.stop(cluster, 6.0, None)
            late = _words(log).get("late")
        else:
            down = run_rtui("down", "--yes", "--cluster-name", fake.name, timeout=120)
            assert down.returncode == 0, down.stderr
            assert not fake.dir.path.exists()
        # The log went with the dir on `down`: the late process is then found by its session.
        sid_members = [p.pid for p in psutil.process_iter() if _in_session(p, fake.head.pid)]
        assert late is None or late not in sid_members
        assert not sid_members, f"left running after `{how}`: {sid_members}"
        assert not any(_alive(pid) for pid in fake.pids)
    finally:
        for pid in [p.pid for p in psutil.process_iter() if _in_session(p, fake.head.pid)]:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def _in_session(proc: psutil.Process, sid: int) -> bool:
    try:
        return os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):
        return False


def test_a_recycled_pid_in_the_marker_is_never_taken(
        isolated_env: Path, fakes: list[FakeCluster], terminals: list[Terminal]) -> None:
    fake = FakeCluster(isolated_env, "own-recycled", record=True)
    fakes.append(fake)
    term = Terminal(fake.dir.path / "rtui-head.log")
    terminals.append(term)
    # The marker says the shell was a root, but with another start time: its pid was reused.
    shell = psutil.Process(term.shell.pid)
    lc.record_root(fake.dir, "idle-watcher", ProcRef(pid=shell.pid, create_time=shell.create_time() - 100))
    family = {p.pid for p in lc.cluster_family(fake.dir.path)}
    assert fake.pids <= family and not family & term.pids
    assert not ProcRef(pid=fake.head.pid, create_time=fake.head.create_time + 100).alive()


def test_the_session_of_a_dead_root_is_still_the_clusters(
        isolated_env: Path, fakes: list[FakeCluster]) -> None:
    """`ray start` killed on its own (SIGKILL) leaves its raylet and agents behind, renamed
    (`ray::DashboardAgent`) and re-parented: they are still ours by the root's session."""
    fake = FakeCluster(isolated_env, "own-orphaned", record=True)
    fakes.append(fake)
    head = fake.head.process()
    assert head is not None
    head.kill()
    eventually("the fake head to die", lambda: not fake.head.alive(), timeout=30)
    family = {p.pid for p in lc.cluster_family(fake.dir.path)}
    assert {fake.child, fake.daemon} <= family


def test_a_process_naming_the_dir_in_its_own_session_is_not_ours(
        isolated_env: Path, fakes: list[FakeCluster]) -> None:
    """Naming the exact ray dir (`--temp-dir=<dir>/r`) does not make a process ours; nor a sibling's."""
    fake = FakeCluster(isolated_env, "own-named", record=True)
    fakes.append(fake)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]  # models time: lives until stopped
    named = subprocess.Popen([*sleeper, "start", f"--temp-dir={fake.dir.ray_dir}"], start_new_session=True)
    try:
        look_alike = psutil.Process(named.pid)
        eventually("the look-alike to exec", lambda: f"--temp-dir={fake.dir.ray_dir}" in look_alike.cmdline(),
                   timeout=30)
        family = {p.pid for p in lc.cluster_family(fake.dir.path)}
        assert fake.pids <= family and named.pid not in family
        head = lc.node_procs(fake.dir).head
        assert head is not None and head.pid == fake.head.pid
        node = {p.pid for p in lc.session_family(head)}  # one node, as a worker node is stopped
        assert fake.pids <= node and named.pid not in node
    finally:
        named.kill()
        named.wait(timeout=10)


def _spoof(argv_tail: list[str]) -> subprocess.Popen[bytes]:
    # `sh -c 'sleep 120; :' sh ARGS...`: ARGS stay in sh's command line; the `; :` keeps sh from
    # replacing itself with sleep.
    return subprocess.Popen(["/bin/sh", "-c", "sleep 120; :", "sh", *argv_tail], user=NOBODY, group=NOBODY,
                            start_new_session=True, cwd="/", stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@needs_root
def test_a_process_of_another_uid_with_our_command_line_is_never_ours(isolated_env: Path) -> None:
    cluster = lc.make_cluster_dir("r20261204-spoof01", "spoof", {"state_dir": str(isolated_env)})
    spoofed = _spoof(["start", "--head", f"--temp-dir={cluster.ray_dir}", "--node-name=spoof-head",
                      f"--storage={cluster.path}/x"])
    try:
        proc = psutil.Process(spoofed.pid)
        eventually("the spoofed command line", lambda: f"--temp-dir={cluster.ray_dir}" in proc.cmdline(), timeout=30)
        assert proc.uids().real == NOBODY
        assert lc.node_procs(cluster).head is None, "a process of another uid was taken for the head"
        assert spoofed.pid not in {p.pid for p in lc.cluster_family(cluster.path)}
        down = run_rtui("down", "--yes", "--cluster-name", "spoof", timeout=120)
        assert down.returncode == 0, down.stderr
        assert spoofed.poll() is None, "rtui down signalled a process of another user"
        assert not cluster.path.exists()
    finally:
        spoofed.kill()
        spoofed.wait(timeout=10)
        lc.remove_cluster_dir(cluster.path) if cluster.path.exists() else None
