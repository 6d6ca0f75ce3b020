"""Shared helpers for the telemetry tests (a unique module name: tests/ has no __init__.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
NCCL_LOGS = REPO_ROOT.parent / "shared" / "nccl_logs"


def manifest_entries() -> list[dict[str, Any]]:
    manifest = NCCL_LOGS / "MANIFEST.json"
    if not manifest.is_file():
        return []
    return list(json.loads(manifest.read_text(encoding="utf-8")))
