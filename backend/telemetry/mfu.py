"""Model FLOPs utilisation as the dashboard shows it.

The peak table and the MFU formula live in one place, ``training.devices`` (stdlib-only at import):
the job computes MFU with them and so does the backend, so the two can never disagree. A metric
record carries ``flops_per_token`` (6·N plus attention's 12·layers·hidden·seq); records from older
jobs do not, and then 6·N is what is known.
"""

from __future__ import annotations

from training.devices import GPU_PEAK_BF16_FLOPS, mfu, peak_for_name

__all__ = ["GPU_PEAK_BF16_FLOPS", "estimate_mfu", "peak_flops_for"]


def peak_flops_for(gpu_name: str | None) -> float | None:
    """Peak for a GPU product name as NVML reports it (e.g. ``NVIDIA L40S``), if known."""
    if not gpu_name:
        return None
    return peak_for_name(gpu_name).flops


def estimate_mfu(tokens_per_s: float | None, n_params: float | None,
                 peak_flops_per_gpu: float | None, n_gpus: int | None,
                 flops_per_token: float | None = None) -> float | None:
    """Fraction of peak (0..1) for the job-wide token rate, or None when an input is unknown."""
    if not tokens_per_s or not peak_flops_per_gpu or not n_gpus:
        return None
    per_token = flops_per_token or (6.0 * n_params if n_params else None)
    if not per_token or tokens_per_s < 0 or per_token < 0 or peak_flops_per_gpu <= 0 or n_gpus <= 0:
        return None
    return mfu(per_token, tokens_per_s, peak_flops_per_gpu, n_gpus)
