"""Log telemetry: NCCL transport verdict and training metric series (no Textual here)."""

from backend.telemetry.metrics import MetricPoint, MetricSeries
from backend.telemetry.mfu import estimate_mfu, peak_flops_for
from backend.telemetry.telemetry import Telemetry
from training.logparse.verdict import TRANSPORTS, Verdict

__all__ = [
    "TRANSPORTS", "MetricPoint", "MetricSeries", "Telemetry", "Verdict", "estimate_mfu",
    "peak_flops_for",
]
