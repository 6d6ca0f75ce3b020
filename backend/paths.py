"""Where rtui keeps its files (XDG base directories; overridable for power users)."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_cache_path, user_config_path, user_state_path

APP = "rtui"


def state_dir() -> Path:
    """Run records, spools and locks. ``RTUI_STATE_DIR`` wins over ``XDG_STATE_HOME``."""
    override = os.environ.get("RTUI_STATE_DIR")
    return Path(override).expanduser() if override else user_state_path(APP)


def config_dir() -> Path:
    override = os.environ.get("RTUI_CONFIG_DIR")
    return Path(override).expanduser() if override else user_config_path(APP)


def cache_dir() -> Path:
    """Downloads worth keeping between runs (KubeRay's CRDs). ``RTUI_CACHE_DIR`` wins."""
    override = os.environ.get("RTUI_CACHE_DIR")
    return Path(override).expanduser() if override else user_cache_path(APP)
