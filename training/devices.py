"""What the hardware can do: peak bf16 FLOP/s per device, memory available to a rank, MFU.

Stdlib only at import time (torch is imported inside the functions that need a device), so the
arithmetic is unit-testable and cheap to import.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Dense (no 2:4 sparsity) bf16 tensor-core peak per GPU, FLOP/s. Sources: NVIDIA data sheets.
#   L4    121 TFLOP/s  (L4 data sheet: 242 with sparsity, halved)
#   A10G   70 TFLOP/s  approx.: NVIDIA publishes no A10G sheet; it is a lower-clocked A10 (A10 sheet: 125
#                      dense), and AWS g5 material and public measurements put it near 70
#   L40S  362 TFLOP/s  (L40S data sheet: 733 with sparsity, halved)
#   A100  312 TFLOP/s  (A100 data sheet, SXM and PCIe alike)
#   H100  989 TFLOP/s  (H100 SXM data sheet: 1979 with sparsity, halved; the PCIe card is lower, 756)
#   H200  989 TFLOP/s  (H200 SXM data sheet: same compute as H100 SXM, more HBM)
# Keys are matched as whole words of the name torch.cuda.get_device_name() returns
# (e.g. "NVIDIA L40S", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3").
GPU_PEAK_BF16_FLOPS: dict[str, float] = {
    "L4": 121e12,
    "A10G": 70e12,
    "L40S": 362e12,
    "A100": 312e12,
    "H100": 989e12,
    "H200": 989e12,
}
H100_PCIE_PEAK_BF16_FLOPS = 756e12
CPU_PEAK_REASON = "no dense bf16 peak is known for CPUs (it depends on cores, clocks and AMX); MFU not computed"


@dataclass(frozen=True)
class DevicePeak:
    name: str
    flops: float | None  # dense bf16 FLOP/s of one device, None when unknown
    reason: str | None  # why flops is None


def peak_for_name(name: str) -> DevicePeak:
    """Peak for a device name as torch/NVML reports it; longest key first so L40S is not read as L4."""
    words = name.upper().replace("-", " ").replace("_", " ").split()
    if "H100" in words and "PCIE" in words:
        return DevicePeak(name, H100_PCIE_PEAK_BF16_FLOPS, None)
    for key in sorted(GPU_PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in words:
            return DevicePeak(name, GPU_PEAK_BF16_FLOPS[key], None)
    if name == "cpu":
        return DevicePeak(name, None, CPU_PEAK_REASON)
    return DevicePeak(name, None, f"no dense bf16 peak known for {name!r}; MFU not computed")


def detect_peak(device: Any) -> DevicePeak:
    """The peak of the device this rank trains on (a ``torch.device``)."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return peak_for_name(torch.cuda.get_device_name(device))
    return peak_for_name("cpu")


def training_flops_per_token(n_params: float, n_layers: int, hidden: int, seq_len: int) -> float:
    """Model FLOPs of one training token: 6·N for the weight matmuls (forward 2N + backward 4N) plus
    attention's scores and weighted sum, 12·layers·hidden·seq (forward 4·L·h·s, backward twice that;
    Chowdhery et al. 2022, PaLM, appendix B, the usual MFU convention, counting the full s×s matrix).
    At seq 2048 on Qwen2.5-1.5B the attention term is ~11 % of 6·N: leaving it out understates MFU."""
    return 6.0 * n_params + 12.0 * n_layers * hidden * seq_len


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops_per_device: float | None,
        n_devices: int) -> float | None:
    """Model FLOPs utilisation: ``training_flops_per_token`` × tokens/s over the summed dense bf16 peak."""
    if not peak_flops_per_device or n_devices <= 0 or tokens_per_s <= 0 or flops_per_token <= 0:
        return None
    return flops_per_token * tokens_per_s / (peak_flops_per_device * n_devices)


def meminfo_available_bytes(meminfo: str | None = None) -> int | None:
    """MemAvailable from /proc/meminfo (what the kernel can give without swapping), no psutil needed."""
    if meminfo is None:
        try:
            meminfo = Path("/proc/meminfo").read_text()
        except OSError:
            return None
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * (1024 if len(parts) < 3 or parts[2].lower() == "kb" else 1)
    return None


def memory_budget_bytes(device: Any, ranks_on_device_host: int) -> tuple[int | None, str]:
    """Bytes one rank may use, and where the figure came from.

    On a GPU: free memory of this rank's device. On CPU all ranks of the node share RAM, so the
    node's available memory is split between them.
    """
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return int(free), "cuda.mem_get_info free"
    available = meminfo_available_bytes()
    if available is None:
        return None, "unknown (/proc/meminfo unreadable)"
    return available // max(1, ranks_on_device_host), f"MemAvailable / {max(1, ranks_on_device_host)} ranks"


def peak_memory_bytes(device: Any) -> tuple[int, str]:
    """This rank's peak memory so far: CUDA allocator peak on GPU, process peak RSS on CPU."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "max_rss"  # Linux: KiB


def reset_peak_memory(device: Any) -> None:
    """Start the CUDA allocator's peak over (after sharding, so the moment the unsharded model sat on
    the device does not count). A process's peak RSS on CPU cannot be reset: there it stays the process's."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(device)
