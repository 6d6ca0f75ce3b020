"""A run's locks in one process: taken by the first of the session's holders, let go by the last.

The holders are tasks whose lives overlap without nesting (the TUI while attached, a flow, a follow that
is still unwinding after the app let go of the run): the first to leave used to free the flock under
the others, so a second rtui could take the run, or its cluster, while this one still wrote to it."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from backend.errors import OperationError
from backend.resolve import resolve_config
from backend.session import RunSession


def _session() -> RunSession:
    return RunSession.for_config(resolve_config({"local_cpus": "2"}, environ={}))


@pytest.mark.parametrize("lock", ["locked", "changing"])
def test_the_lock_stays_until_the_last_overlapping_holder_leaves(isolated_env: Path, lock: str) -> None:
    session = _session()
    store, run_id = session.store, session.run_id
    cluster = (session.config.target, session.config.cluster_name, run_id)
    first, second = contextlib.ExitStack(), contextlib.ExitStack()
    first.enter_context(getattr(session, lock)())
    second.enter_context(getattr(session, lock)())
    first.close()  # the first holder leaves while the second is still in
    assert store.is_locked(run_id), "the run's lock went with the first holder"
    with pytest.raises(OperationError, match="in use by another rtui"), store.lock(run_id):
        pass
    if lock == "changing":
        with pytest.raises(OperationError, match="being changed by run"), store.cluster_lock(*cluster):
            pass
    assert not session.attached_elsewhere()
    second.close()
    assert not store.is_locked(run_id)
    with store.lock(run_id), store.cluster_lock(*cluster):
        pass


def test_a_lock_another_process_holds_is_refused_and_counts_no_holder(isolated_env: Path) -> None:
    session = _session()
    with session.store.lock(session.run_id):  # as another rtui would: its own open file
        with pytest.raises(OperationError, match="in use by another rtui"), session.locked():
            pass
        assert session.attached_elsewhere()
    with session.locked():
        assert not session.attached_elsewhere() and session.store.is_locked(session.run_id)
    assert not session.store.is_locked(session.run_id)
