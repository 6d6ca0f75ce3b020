"""The aws target's backend: preflight feasibility matrix, quota requests, pricing.

No Textual, no tui/ or screens/ imports here (DESIGN.md §1). The names below load on first use:
importing a light submodule (``targets.aws.cloud.report`` for the matrix widget) must not pull in boto3,
which costs the local target's first frame ~80 ms.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from targets.aws.cloud.check_command import check_command
    from targets.aws.cloud.preflight import run_preflight
    from targets.aws.cloud.quota import QuotaIncreaseRequest, request_quota_increase
    from targets.aws.cloud.report import (
        PreflightReport,
        PreflightRequest,
        QuotaStatus,
        Recommendation,
        RegionReport,
        Reservation,
        ZoneReport,
    )

_HOME = {
    "check_command": "check_command", "run_preflight": "preflight",
    "QuotaIncreaseRequest": "quota", "request_quota_increase": "quota",
    **{name: "report" for name in ("PreflightReport", "PreflightRequest", "QuotaStatus", "Recommendation",
                                   "RegionReport", "Reservation", "ZoneReport")},
}

__all__ = [
    "PreflightReport",
    "PreflightRequest",
    "QuotaIncreaseRequest",
    "QuotaStatus",
    "Recommendation",
    "RegionReport",
    "Reservation",
    "ZoneReport",
    "check_command",
    "request_quota_increase",
    "run_preflight",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'targets.aws.cloud' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"targets.aws.cloud.{_HOME[name]}"), name)
    globals()[name] = value
    return value
