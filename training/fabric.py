"""The fabric check: an all-reduce bus-bandwidth sweep across every Ray Train worker.

Runs as a Ray job entrypoint (``python -m training.fabric --num-workers N --device cuda``)
on the same cluster and with the same environment as the training job, so what it
measures is the network training will get. Message sizes double from ``--min-bytes`` to
``--max-bytes``; each size runs ``--warmup`` untimed all-reduces, then ``--iters`` timed
ones between barriers (and ``torch.cuda.synchronize`` on GPUs).

The numbers follow nccl-tests' all_reduce_perf, so they compare with published tables:
time is the mean per-iteration time averaged over ranks, algbw = size / time, and
busbw = algbw · 2(n−1)/n — the share of the data each rank's link must carry in a
ring all-reduce, which makes busbw comparable across world sizes.

Rank 0 prints a human table and one ``RTUI_FABRIC {json}`` line (``training.protocol``).
On CPU the collectives run on gloo and the transport is "gloo". On GPUs the transport is
left null here: NCCL prints its INFO log to the job log (``NCCL_DEBUG=INFO``) and the
reader of that log decides efa/socket/... from it. Stdlib at import time; torch and Ray
are imported only where they run.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from training.protocol import FABRIC_TAG, format_record
from training.raytrain import RENDEZVOUS_DIR_ENV, quiet_ray_train

MIB = 1 << 20
GIB = 1 << 30
DTYPE_BYTES = 4  # float32, as nccl-tests' default
# gloo over loopback on a laptop moves ~1 GB/s: a 1 GiB sweep would take minutes there.
CPU_DEFAULT_MAX_BYTES = 64 * MIB
GPU_DEFAULT_MAX_BYTES = GIB
DEFAULTS = {"cpu": {"iters": 5, "warmup": 2}, "cuda": {"iters": 20, "warmup": 5}}


def bus_factor(world_size: int) -> float:
    """nccl-tests' all_reduce bus-bandwidth factor, 2(n−1)/n (0 for a single rank)."""
    return 2.0 * (world_size - 1) / world_size if world_size > 0 else 0.0


def bandwidths(size_bytes: int, time_s: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes, as nccl-tests reports)."""
    algbw = size_bytes / time_s / 1e9
    return algbw, algbw * bus_factor(world_size)


def sweep_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Message sizes doubling from ``min_bytes`` while they stay within ``max_bytes``."""
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


def result_row(size_bytes: int, time_s: float, world_size: int) -> dict[str, Any]:
    algbw, busbw = bandwidths(size_bytes, time_s, world_size)
    return {"size_bytes": size_bytes, "time_us": round(time_s * 1e6, 2),
            "algbw_gbps": round(algbw, 4), "busbw_gbps": round(busbw, 4)}


def human_size(n: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def format_table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'size':>10}  {'time (us)':>12}  {'algbw (GB/s)':>12}  {'busbw (GB/s)':>12}"]
    for r in results:
        lines.append(f"{human_size(r['size_bytes']):>10}  {r['time_us']:>12.1f}  "
                     f"{r['algbw_gbps']:>12.3f}  {r['busbw_gbps']:>12.3f}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="training.fabric", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--min-bytes", type=int, default=MIB)
    p.add_argument("--max-bytes", type=int, default=None,
                   help=f"largest message (default {human_size(GPU_DEFAULT_MAX_BYTES)} on cuda, "
                        f"{human_size(CPU_DEFAULT_MAX_BYTES)} on cpu, where gloo is slow)")
    p.add_argument("--iters", type=int, default=None, help="timed all-reduces per size (default 20 cuda, 5 cpu)")
    p.add_argument("--warmup", type=int, default=None, help="untimed all-reduces per size (default 5 cuda, 2 cpu)")
    p.add_argument("--storage-path", default=os.environ.get("RTUI_STORAGE_PATH"))
    args = p.parse_args(argv)
    if args.max_bytes is None:
        args.max_bytes = GPU_DEFAULT_MAX_BYTES if args.device == "cuda" else CPU_DEFAULT_MAX_BYTES
    for name in ("iters", "warmup"):
        if getattr(args, name) is None:
            setattr(args, name, DEFAULTS[args.device][name])
    if args.num_workers < 1 or args.iters < 1 or args.warmup < 0:
        p.error("--num-workers and --iters must be at least 1, --warmup at least 0")
    if args.min_bytes < DTYPE_BYTES or args.min_bytes % DTYPE_BYTES:
        p.error(f"--min-bytes must be a positive multiple of {DTYPE_BYTES} (float32 elements)")
    if args.max_bytes < args.min_bytes:
        p.error("--max-bytes must be at least --min-bytes")
    return args


@dataclass(frozen=True)
class Sweep:
    """What every worker sweeps; crosses to the workers as a dict (Ray Train's train_loop_config)."""

    min_bytes: int
    max_bytes: int
    iters: int
    warmup: int
    capped: bool  # on CPU the sweep stops short of the GPU sweep's largest size


def sweep_per_worker(config: dict[str, Any]) -> None:
    cfg = Sweep(**config)
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.set_device(device)  # object collectives and barriers use the current device

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    def barrier() -> None:
        sync()
        if on_gpu:
            dist.barrier(device_ids=[device.index])
        else:
            dist.barrier()
        sync()

    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    # A wrong sum means a broken fabric, not a slow one: check once before timing anything.
    probe = torch.full((cfg.min_bytes // DTYPE_BYTES,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(probe)
    expected = world * (world + 1) / 2
    if not bool(torch.all(probe == expected)):
        raise RuntimeError(f"all_reduce returned a wrong sum on rank {rank} (expected {expected})")
    del probe

    results = []
    for size in sweep_sizes(cfg.min_bytes, cfg.max_bytes):
        # Zeros: the sum stays finite over any number of iterations, and the bytes moved
        # are the same as with any other values.
        buf = torch.zeros(size // DTYPE_BYTES, dtype=torch.float32, device=device)
        for _ in range(cfg.warmup):
            dist.all_reduce(buf)
        barrier()
        start = time.perf_counter()
        for _ in range(cfg.iters):
            dist.all_reduce(buf)
        sync()
        elapsed = torch.tensor([(time.perf_counter() - start) / cfg.iters], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed)  # nccl-tests reports the time averaged over ranks
        results.append(result_row(size, float(elapsed.item()) / world, world))
        del buf
        if rank == 0:
            print(f"rtui-fabric: {human_size(size)} done", flush=True)
    if rank == 0:
        record = {
            "transport": None if on_gpu else "gloo", "backend": "nccl" if on_gpu else "gloo",
            "device": device.type, "world_size": world, "nodes": len(set(hosts)), "hosts": sorted(set(hosts)),
            "iters": cfg.iters, "warmup": cfg.warmup, "max_bytes": cfg.max_bytes,
            "capped": cfg.capped, "results": results,
        }
        print(format_table(results), flush=True)
        print(format_record(FABRIC_TAG, record), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from training.rendezvous import torch_config

    quiet_ray_train()
    use_gpu = args.device == "cuda"
    capped = not use_gpu and args.max_bytes < GPU_DEFAULT_MAX_BYTES
    sizes = sweep_sizes(args.min_bytes, args.max_bytes)
    print(f"rtui-fabric: all_reduce sweep on {'nccl' if use_gpu else 'gloo'}, {args.num_workers} workers, "
          f"{human_size(sizes[0])} → {human_size(sizes[-1])} ({len(sizes)} sizes), "
          f"{args.iters} iters after {args.warmup} warmup", flush=True)
    if capped:
        print(f"rtui-fabric: on CPU the sweep stops at {human_size(args.max_bytes)} (gloo over TCP is slow); "
              f"GPUs sweep to {human_size(GPU_DEFAULT_MAX_BYTES)}. Raise it with --max-bytes.", flush=True)
    sweep = Sweep(min_bytes=args.min_bytes, max_bytes=sizes[-1], iters=args.iters, warmup=args.warmup, capped=capped)
    storage = args.storage_path or os.path.join(tempfile.gettempdir(), "rtui-fabric-results")
    trainer = TorchTrainer(
        sweep_per_worker, train_loop_config=asdict(sweep),
        torch_config=torch_config(os.environ.get(RENDEZVOUS_DIR_ENV)),  # the target's choice, as in training.train
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=use_gpu,
                                     resources_per_worker=None if use_gpu else {"CPU": 1}),
        run_config=RunConfig(name=f"rtui-fabric-{int(time.time())}", storage_path=storage),
    )
    try:
        trainer.fit()
    except Exception as exc:  # Ray wraps worker errors: one line saying what failed, then exit non-zero
        root: BaseException = exc
        while root.__cause__ is not None:
            root = root.__cause__
        text = str(root).splitlines()[0] if str(root) else ""
        print(f"rtui-fabric: sweep failed: {type(root).__name__}: {text}", file=sys.stderr, flush=True)
        return 1
    finally:
        if ray.is_initialized():
            ray.shutdown()
    print("rtui-fabric: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["bandwidths", "bus_factor", "format_table", "main", "result_row", "sweep_sizes"]
