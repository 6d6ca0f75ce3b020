"""``procs.terminate`` stops a group as soon as its processes are gone, zombies included.

A Ray worker that exits on SIGTERM stays a zombie while its raylet (which ignores SIGTERM) is alive to
not reap it; ``psutil.wait_procs`` takes such a process for alive (``wait_pid`` polls ``pid_exists`` for a
process that is not our child), so every `rtui down` waited out its whole grace. Here the parent is a
``sleep`` that never reaps its child, the grace is ten minutes, and a deadline turns that wait into a failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator

import psutil

from backend.procs import stop_group, terminate
from tests.eventually import eventually

HANG_S = 600.0


@contextlib.contextmanager
def an_unreaped_child() -> Iterator[psutil.Process]:
    """A ``sleep`` whose parent (another ``sleep``) never reaps it: once it exits it stays a zombie."""
    parent = subprocess.Popen(["sh", "-c", "sleep 300 & exec sleep 300"], start_new_session=True)
    try:
        yield eventually("the parent's child", lambda: psutil.Process(parent.pid).children())[0]
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_a_process_that_exited_on_sigterm_but_was_never_reaped_is_not_waited_for() -> None:
    with an_unreaped_child() as child:
        survivors: list[list[psutil.Process]] = []
        stopper = threading.Thread(target=lambda: survivors.append(terminate([child], grace_s=HANG_S)), daemon=True)
        stopper.start()
        stopper.join(60)
        assert not stopper.is_alive(), "terminate waited out the grace for a process that had exited"
        assert survivors == [[]]
        assert child.status() == psutil.STATUS_ZOMBIE  # exited on SIGTERM; its parent never reaped it


def test_a_group_whose_listing_still_shows_a_zombie_has_stopped() -> None:
    """A listing by pid (the idle watcher's root) keeps a zombie while nobody reaps it: `up` that
    restarted the watcher failed with "1 Ray processes would not stop" when that counted as running."""
    with an_unreaped_child() as child:
        stopped, survivors = stop_group(lambda: [child] if child.is_running() else [], grace_s=HANG_S)
        assert (stopped, survivors) == (1, [])
        assert child.status() == psutil.STATUS_ZOMBIE
