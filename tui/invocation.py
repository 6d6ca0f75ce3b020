"""How this rtui was started: the run's configuration from its flags, and the command that runs it again.

Shared by the command line (``tui.cli``), its commands (``tui.commands``) and the wizard (``tui.app``),
below all three so none of them imports another to get it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from backend.config import field_owners
from backend.resolve import ResolvedConfig, Untrusted, resolve_config


def _flags(ns: argparse.Namespace) -> dict[str, Any]:
    flags = {f: getattr(ns, f"cfg_{f}") for f in field_owners() if hasattr(ns, f"cfg_{f}")}
    if isinstance(flags.get("region"), list):
        flags["region"] = flags["region"][-1]
    return flags


def resolved_from(ns: argparse.Namespace, untrusted: Untrusted = "refuse") -> ResolvedConfig:
    return resolve_config(_flags(ns), config_file=getattr(ns, "config_file", None), untrusted=untrusted)


def rtui_command() -> str:
    """How to run this rtui again from the user's shell: `rtui` when that is what the PATH finds,
    else the path it was started by (e.g. `.venv/bin/rtui`), relative to the current directory."""
    started = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    on_path = shutil.which("rtui")
    if started is None or started.name != "rtui" or (on_path and Path(on_path).resolve() == started):
        return "rtui"
    try:
        relative = os.path.relpath(started)
    except ValueError:
        return str(started)
    if relative.startswith(".."):  # outside the current directory: the full path reads better
        return str(started)
    return relative if os.sep in relative else f"./{relative}"
