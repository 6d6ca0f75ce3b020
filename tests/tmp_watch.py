"""What the test suite may leave in /tmp, and the short dirs that must live there (issue 37).

Every file a test makes belongs under its ``tmp_path``. Two things cannot follow that rule and are
watched here instead: a local cluster, whose marked dir rtui always makes under /tmp
(``targets.local.cluster.ROOT``), and Ray's temp dir, which holds unix sockets (a path of at
most 107 bytes, ``sun_path`` in unix(7)) that pytest's tmp paths under xdist come close to. The
session snapshots the rtui- and Ray-made entries of /tmp when it starts and fails if any is new when
it ends (tests/conftest.py); only new entries count, since other sessions share the host.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

# Ray's default temp root on Linux is /tmp itself, not tempfile.gettempdir()
# (ray._common.utils.get_default_system_temp_dir: RAY_TMPDIR, else TMPDIR, else "/tmp").
TMP = Path("/tmp")

# The names a run of the suite could leave: rtui's own (cluster dirs rtui-<run id>-*, bench and
# sandbox dirs rtui-*), the Kubernetes double's emulated volumes (vol-<claim>-*), Ray's default temp
# dir and the sessions it puts in it when it already exists, Ray Train's checkpoint copies under
# tempfile.gettempdir() (Checkpoint.as_directory's checkpoint_tmp_<id>) and the locks ray.air takes
# there (_ray_lockfiles/<hash>.lock: a dir any Ray Train run on the host shares, so its new locks are
# what is watched), torch's compile cache there, and the sockets of the tmux servers the tests and
# bench/first_frame.py start (tmux -L rtui-…). A local cluster's processes keep their temporary files
# in its own dir (targets/local/layer.ray_env), which `down` removes.
WATCHED = ("rtui*", "vol-*", "ray", "ray/session_2*", "checkpoint_tmp_*", "_ray_lockfiles/*", "torchinductor_*",
           "tmux-*/rtui-*")


# The run's token, in the names of what its tests make right under /tmp (short dirs, tmux sockets), so a
# run tells its own entries from those of another run on the same host. Set by the controller before
# xdist starts its workers, which inherit it; not RTUI_*, which isolated_env clears for each test.
RUN_ENV = "TESTS_RTUI_RUN"
_TOKENED = re.compile(r"(?:^|/)rtui-(?:t|ray|test)-([0-9a-f]{8})-")


def run_token() -> str:
    """This run's token (one made now, for a process started outside pytest)."""
    return os.environ.setdefault(RUN_ENV, secrets.token_hex(4))


def new_run_token() -> None:
    os.environ[RUN_ENV] = secrets.token_hex(4)


def watched_entries(root: Path = TMP) -> set[str]:
    """The watched entries under ``root``, as paths relative to it."""
    return {str(p.relative_to(root)) for pattern in WATCHED for p in root.glob(pattern)}


def made_by_another_session(path: Path, basetemp: Path) -> bool:
    """An entry another run's tests named with their own token, or a local cluster dir whose marker
    names a state dir outside this session's tmp paths: another rtui's on this host (a user's, or a
    suite running beside this one), never this run's to report."""
    from targets.local.cluster import read_marker

    tokened = _TOKENED.search(str(path))
    if tokened:
        return tokened.group(1) != run_token()

    cluster = read_marker(path)
    state = cluster.facts.get("state_dir") if cluster is not None else None
    return bool(state) and not Path(str(state)).is_relative_to(basetemp)


def reap_clusters_under(base: Path) -> list[Path]:
    """Stop and remove each local cluster whose marker names a state dir under ``base`` (a test's
    tmp_path, or the session's base temp), whatever became of the test or its ``rtui down``.

    Only clusters of this test or session: never another rtui's (its marker names another state dir)."""
    from backend.procs import stop_group
    from targets.local.cluster import STOP_GRACE_S, cluster_family, find_clusters, remove_cluster_dir

    reaped = []
    for cluster in find_clusters():
        state = cluster.facts.get("state_dir")
        if state and Path(str(state)).is_relative_to(base):
            stop_group(partial(cluster_family, cluster.path), grace_s=STOP_GRACE_S)  # as `rtui down` stops it
            remove_cluster_dir(cluster.path)
            reaped.append(cluster.path)
    return reaped


@contextmanager
def short_tmp_dir(kind: str = "t") -> Iterator[Path]:
    """A fresh dir right under /tmp (``rtui-<kind>-<run token>-*``) for what needs a short path (Ray's
    temp dir: its sockets sit under ``<dir>/session_<date>_<pid>/sockets/``), removed on the way out
    whatever happened."""
    path = Path(tempfile.mkdtemp(prefix=f"rtui-{kind}-{run_token()}-", dir=TMP))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
