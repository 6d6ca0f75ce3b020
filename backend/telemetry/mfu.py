"""Model FLOPs utilisation: how much of the GPUs' peak the training step turns into work.

Uses the standard dense-transformer estimate of 6 FLOPs per parameter per token
(forward + backward), ignoring attention's sequence-length term, which is small at the
short sequence lengths rtui trains with.
"""

from __future__ import annotations

# Dense BF16 tensor-core peak per GPU, FLOP/s, from the vendors' data sheets (no sparsity).
GPU_PEAK_BF16_FLOPS: dict[str, float] = {
    "A100": 312e12,
    "H100": 989e12,
    "H200": 989e12,
    "L4": 121e12,
    "L40S": 362e12,
}


def peak_flops_for(gpu_name: str | None) -> float | None:
    """Peak for a GPU product name as NVML reports it (e.g. ``NVIDIA L40S``), if known."""
    if not gpu_name:
        return None
    words = gpu_name.upper().replace("-", " ").split()
    # Longest key first so that "L40S" is not read as "L4".
    for key in sorted(GPU_PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in words:
            return GPU_PEAK_BF16_FLOPS[key]
    return None


def estimate_mfu(tokens_per_s: float | None, n_params: float | None,
                 peak_flops_per_gpu: float | None, n_gpus: int | None) -> float | None:
    """Fraction of peak (0..1) for the job-wide token rate, or None when an input is unknown."""
    if not tokens_per_s or not n_params or not peak_flops_per_gpu or not n_gpus:
        return None
    if tokens_per_s < 0 or n_params < 0 or peak_flops_per_gpu <= 0 or n_gpus <= 0:
        return None
    return 6.0 * n_params * tokens_per_s / (peak_flops_per_gpu * n_gpus)
