"""The aws target's backend: preflight feasibility matrix (more to come: plan, apply, teardown).

No Textual, no tui/ or screens/ imports here (DESIGN.md §1).
"""

from backend.aws.check_command import check_command
from backend.aws.preflight import run_preflight
from backend.aws.quota import QuotaIncreaseRequest, request_quota_increase
from backend.aws.report import (
    PreflightReport,
    PreflightRequest,
    QuotaStatus,
    Recommendation,
    RegionReport,
    Reservation,
    ZoneReport,
)

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
