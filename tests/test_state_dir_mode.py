"""An existing state dir is private before rtui trusts it (issue 33, item 6).

The state dir holds run records, spools (job logs), locks and the trust list of ``rtui.toml`` files.
rtui makes a new one 0700 (``RunStore.ensure_writable``), but one that already exists was taken as it
was: a dir left group- or world-readable lets other users read the job logs, and one another user
owns lets that user rewrite the trust list or a run's record (mkdir(2) with ``exist_ok`` changes
neither the mode nor the owner of a dir that is there). Ours with loose bits is tightened to 0700;
someone else's is refused in one line.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from backend.errors import UserError
from backend.paths import state_dir
from tests.conftest import run_rtui

NOBODY = 65534


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_existing_state_dir_open_to_others_is_tightened_to_0700(isolated_env: Path) -> None:
    isolated_env.mkdir(mode=0o755)
    os.chmod(isolated_env, 0o775)  # group-writable: what a umask of 002 leaves
    assert state_dir() == isolated_env
    assert mode_of(isolated_env) == 0o700


def test_a_missing_state_dir_is_left_for_the_store_to_make(isolated_env: Path) -> None:
    assert state_dir() == isolated_env and not isolated_env.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a dir another uid owns needs root")
def test_a_state_dir_another_user_owns_is_refused_in_one_line(isolated_env: Path) -> None:
    isolated_env.mkdir(mode=0o700)
    os.chown(isolated_env, NOBODY, NOBODY)
    with pytest.raises(UserError) as refused:
        state_dir()
    assert f"state dir {isolated_env} belongs to another user" in refused.value.message
    assert refused.value.remedy and "RTUI_STATE_DIR" in refused.value.remedy
    assert mode_of(isolated_env) == 0o700 and isolated_env.stat().st_uid == NOBODY  # left as it was

    proc = run_rtui("runs")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "belongs to another user" in proc.stderr and "Traceback" not in proc.stderr
