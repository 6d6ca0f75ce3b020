"""Where rtui keeps its files (XDG base directories; overridable for power users)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from platformdirs import user_cache_path, user_config_path, user_state_path

from backend.errors import UserError

APP = "rtui"


def state_dir() -> Path:
    """Run records, spools and locks. ``RTUI_STATE_DIR`` wins over ``XDG_STATE_HOME``.

    One that exists already is made private first (``private_dir``): it holds the job logs and the
    trust list of ``rtui.toml`` files, and ``mkdir(exist_ok=True)`` keeps whatever mode and owner it had."""
    override = os.environ.get("RTUI_STATE_DIR")
    path = Path(override).expanduser() if override else user_state_path(APP)
    return private_dir(path, what="state dir", remedy="set RTUI_STATE_DIR or XDG_STATE_HOME to a folder of your own")


def private_dir(path: Path, *, what: str, remedy: str) -> Path:
    """``path`` as it is when missing (its maker creates it 0700), else checked: one of ours with group or
    other bits is tightened to 0700; one another uid owns is refused (we could not tighten it, and its
    owner can rewrite what we read from it)."""
    try:
        found = path.stat()  # a symlinked dir is judged by the dir it leads to
    except FileNotFoundError:
        return path
    except OSError:
        return path  # unreadable: the store's own check says so in its words
    if not stat.S_ISDIR(found.st_mode):
        return path  # not a dir: the store's mkdir fails and says it is not writable
    if found.st_uid != os.geteuid():
        raise UserError(f"{what} {path} belongs to another user (uid {found.st_uid})", remedy=remedy)
    if stat.S_IMODE(found.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def config_dir() -> Path:
    override = os.environ.get("RTUI_CONFIG_DIR")
    return Path(override).expanduser() if override else user_config_path(APP)


def cache_dir() -> Path:
    """Downloads worth keeping between runs (KubeRay's CRDs). ``RTUI_CACHE_DIR`` wins."""
    override = os.environ.get("RTUI_CACHE_DIR")
    return Path(override).expanduser() if override else user_cache_path(APP)


def private_cache_dir(name: str, *, what: str) -> Path:
    """A 0700 folder of rtui's cache for files it must keep from others (a cluster's CA, a kubeconfig's
    key): made if missing, else checked by ``private_dir``."""
    folder = cache_dir() / name
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return private_dir(folder, what=what, remedy="remove it, or set RTUI_CACHE_DIR to a folder of your own")
