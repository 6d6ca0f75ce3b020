"""Measure what a checkpoint step keeps the training loop waiting for, before and after async uploads.

One gloo rank shards a tiny model with FSDP2 as the job does and takes an AdamW step; then, ``--rounds``
times, it saves a checkpoint with the program's own ``save_local`` and uploads it with the program's
own ``Uploader`` through Ray Train's real ``StorageContext`` (a local dir, or with ``--s3`` a bucket on a
moto S3 server on loopback). The step used to wait for both (``report`` uploaded synchronously, then a
barrier); with ``checkpoint_upload_mode=ASYNC`` it waits for the save only, the upload runs on Ray's
upload thread. Printed: median save and upload seconds, the checkpoint's size, and the stall ratio
after/before (save / (save + upload)).

    python bench/checkpoint_stall.py [--s3] [--rounds 5] [--hidden 256 --layers 4 --vocab 8192]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.resume_bytes import _moto, add_model_args, local_rendezvous  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--s3", action="store_true", help="upload to a bucket on a local moto S3 server")
    p.add_argument("--rounds", type=int, default=5)
    add_model_args(p, hidden=256, layers=4, vocab=8192)
    args = p.parse_args()
    local_rendezvous()
    server = None
    with tempfile.TemporaryDirectory(prefix="rtui-bench-stall-") as root:
        os.environ["TMPDIR"] = root  # save_local's dirs too
        tempfile.tempdir = None
        if args.s3:
            server = _moto()
            storage_path = "s3://resume-bytes/stall"
        else:
            storage_path = os.path.join(root, "store")
        try:
            result = measure(args, storage_path)
        finally:
            if server is not None:
                server.stop()
    print(json.dumps(result))


def measure(args: argparse.Namespace, storage_path: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from ray.train import Checkpoint
    from ray.train.v2._internal.execution.storage import StorageContext

    from training import checkpoint as ckpt
    from training.config import TrainConfig
    from training.data import SyntheticTokens
    from training.loop import build_model, prepare_for_training
    from training.sharding import build_mesh
    from training.step import train_step

    dist.init_process_group("gloo", rank=0, world_size=1)
    cpu = torch.device("cpu")
    cfg = TrainConfig(tiny_hidden_size=args.hidden, tiny_layers=args.layers, tiny_vocab_size=args.vocab,
                      tiny_heads=4, precision="fp32", seq_len=32)
    torch.manual_seed(0)
    model, optimizer = prepare_for_training(build_model(cfg), cfg, cpu, build_mesh("cpu", "full", 1, 1), reshard=True)
    data = SyntheticTokens("cycle", args.vocab, 2, 32, 0, 0)
    train_step(model, optimizer, data.next_batch, device=cpu, grad_accum=1, max_grad_norm=1.0,
               reshard_after_forward=True, sync_every_micro_step=False).finish()
    storage = StorageContext(storage_path=storage_path, experiment_dir_name="stall")
    saves, uploads, size = [], [], 0
    for step in range(1, args.rounds + 1):
        meta = ckpt.CheckpointMeta(step=step, world_size=1)
        started = time.perf_counter()
        local = ckpt.save_local(model, optimizer, 0, {"data": data.state(), "torch_rng": torch.get_rng_state()}, meta)
        saved = time.perf_counter()
        size = sum(f.stat().st_size for f in Path(local).iterdir())
        ckpt.Uploader(storage, 0, meta, local)(Checkpoint.from_directory(local), ckpt.checkpoint_dir_name(step))
        uploads.append(time.perf_counter() - saved)
        saves.append(saved - started)
    dist.destroy_process_group()
    save, upload = statistics.median(saves), statistics.median(uploads)
    return {"store": "s3 (moto)" if args.s3 else "local dir", "rounds": args.rounds, "checkpoint_bytes": size,
            "median_save_s": round(save, 4), "median_upload_s": round(upload, 4),
            "stall_before_s": round(save + upload, 4), "stall_after_s": round(save, 4),
            "stall_after_over_before": round(save / (save + upload), 3),
            "complete": [s for s, _ in ckpt.find_checkpoints(storage_path)] == list(range(1, args.rounds + 1))}


if __name__ == "__main__":
    main()
