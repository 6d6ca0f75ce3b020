"""Measure the model export (training.export) on CPU: wall time and rank 0's peak host memory.

``--world`` gloo ranks (processes), the tiny local model (or --hidden/--layers/--vocab), FSDP2 as the
job shards it; rank 0 samples its RSS every 5 ms while ``export_model`` runs. With one rank the
gathered tensors are the parameters themselves (no copy): use --world 2 to see the gather.

    python bench/export_measure.py [--world 2] [--hidden 64 --layers 2 --vocab 1024] [--precision fp32|bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from torch.multiprocessing.spawn import spawn

    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if args.world == 1:
        measure(0, args)
    else:
        spawn(measure, args=(args,), nprocs=args.world, join=True)


def measure(rank: int, args: argparse.Namespace) -> None:
    import psutil
    import torch
    import torch.distributed as dist

    from training.config import TrainConfig
    from training.export import export_model, reference_logits
    from training.loop import build_model
    from training.sharding import build_mesh, shard_model

    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.manual_seed(0)
    cfg = TrainConfig(tiny_hidden_size=args.hidden, tiny_layers=args.layers, tiny_vocab_size=args.vocab,
                      tiny_heads=4, precision=args.precision)
    model = shard_model(build_model(cfg), args.precision, reshard_after_forward=False,
                        mesh=build_mesh("cpu", "full", args.world, args.world))
    params = sum(p.numel() for p in model.parameters())
    check = reference_logits(model, torch.device("cpu"))
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = base
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory() as root:
        started = time.perf_counter()
        info = export_model(model, root, rank=rank, step=1, final=True,
                            dtype=torch.bfloat16 if args.precision == "bf16" else torch.float32, check=check)
        wall = time.perf_counter() - started
    done.set()
    sampler.join()
    dist.destroy_process_group()
    if rank != 0:
        return
    assert info is not None
    print(json.dumps({"world": args.world, "params": params, "precision": args.precision, "export_s": round(wall, 3),
                      "files_bytes": info.bytes, "state_bytes": info.state_bytes,
                      "rss_before_mib": round(base / 2**20, 1),
                      "peak_rss_growth_mib": round((peak - base) / 2**20, 1)}))


if __name__ == "__main__":
    main()
