"""Measure what each rank reads of a checkpoint when it resumes (training.checkpoint.load).

``--world`` gloo ranks (processes) shard the tiny model with FSDP2 as the job does, take one AdamW
step (so the optimizer moments exist), save a checkpoint with the program's own ``save_local``, put
every rank's files in one directory as Ray Train's upload does (a local dir, or with ``--s3`` a bucket
on a moto S3 server on loopback) and mark it complete; then every rank loads it into a fresh model.
Printed: the checkpoint's size, the bytes each rank read, and (``--s3``) what Ray's
``Checkpoint.as_directory()``, which the resume used before, downloads on each rank: all of it.

    python bench/resume_bytes.py [--world 2] [--s3] [--hidden 64 --layers 2 --vocab 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from torch.multiprocessing.spawn import spawn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--world", type=int, default=2, help="ranks that save, then load")
    p.add_argument("--s3", action="store_true", help="keep the checkpoint in a bucket on a local moto S3 server")
    add_model_args(p, hidden=64, layers=2, vocab=1024)
    args = p.parse_args()
    local_rendezvous()
    server = None
    with tempfile.TemporaryDirectory(prefix="rtui-resume-bytes-") as root:
        if args.s3:
            server = _moto()
            where = "s3://resume-bytes/run/checkpoint_step_00000001"
        else:
            where = os.path.join(root, "run", "checkpoint_step_00000001")
        results = os.path.join(root, "results")
        os.mkdir(results)
        try:
            spawn(measure, args=(args, where, root, results), nprocs=args.world, join=True)
        finally:
            if server is not None:
                server.stop()
        read = [json.loads(Path(results, f"{r}.json").read_text()) for r in range(args.world)]
    total = read[0]["checkpoint_bytes"]
    print(json.dumps({"world": args.world, "store": "s3 (moto)" if args.s3 else "local dir",
                      "checkpoint_bytes": total, "per_rank_read_bytes": [r["bytes_read"] for r in read],
                      "as_directory_bytes_per_rank": [r["as_directory_bytes"] for r in read],
                      "max_rank_share": round(max(r["bytes_read"] for r in read) / total, 3)}))


def add_model_args(p: argparse.ArgumentParser, *, hidden: int, layers: int, vocab: int) -> None:
    """The tiny model's sizes, with these defaults."""
    p.add_argument("--hidden", type=int, default=hidden)
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--vocab", type=int, default=vocab)


def local_rendezvous() -> None:
    """torch.distributed's env:// rendezvous on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def _moto() -> Any:
    """moto's S3 over real HTTP; pyarrow's S3 filesystem reads ``AWS_ENDPOINT_URL`` as boto3 does."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per ranged GET otherwise

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    boto3.client("s3").create_bucket(Bucket="resume-bytes")
    return server


def measure(rank: int, args: argparse.Namespace, where: str, root: str, results: str) -> None:
    import pyarrow.fs as pafs
    import torch
    import torch.distributed as dist

    from training import checkpoint as ckpt
    from training.config import TrainConfig
    from training.data import SyntheticTokens
    from training.loop import build_model, prepare_for_training
    from training.sharding import build_mesh
    from training.step import train_step

    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    cpu = torch.device("cpu")
    cfg = TrainConfig(tiny_hidden_size=args.hidden, tiny_layers=args.layers, tiny_vocab_size=args.vocab,
                      tiny_heads=4, precision="fp32", seq_len=32)

    def fresh() -> tuple[Any, Any]:
        torch.manual_seed(0)
        return prepare_for_training(build_model(cfg), cfg, cpu, build_mesh("cpu", "full", args.world, args.world),
                                    reshard=True)

    model, optimizer = fresh()
    data = SyntheticTokens("cycle", args.vocab, 2, 32, 0, rank)
    train_step(model, optimizer, data.next_batch, device=cpu, grad_accum=1, max_grad_norm=1.0,
               reshard_after_forward=True, sync_every_micro_step=False).finish()
    meta = ckpt.CheckpointMeta(step=1, world_size=args.world)
    local = ckpt.save_local(model, optimizer, rank, {"data": data.state(), "torch_rng": torch.get_rng_state()}, meta)
    fs, directory = ckpt._fs(where)
    fs.create_dir(directory)
    dist.barrier()  # as Ray does: every rank copies its own files into the checkpoint's dir
    pafs.copy_files(local, directory, destination_filesystem=fs)
    shutil.rmtree(local)
    dist.barrier()
    if rank == 0:
        ckpt.mark_complete(directory, meta, fs=fs)
    dist.barrier()
    total = sum(i.size or 0 for i in fs.get_file_info(pafs.FileSelector(directory)))
    model, optimizer = fresh()
    restored = ckpt.load(where, model, optimizer, rank)
    Path(results, f"{rank}.json").write_text(json.dumps({"bytes_read": restored.bytes_read, "checkpoint_bytes": total,
                                                         "as_directory_bytes": _as_directory_bytes(where)}))
    dist.destroy_process_group()


def _as_directory_bytes(where: str) -> int | None:
    """What the old resume path fetched on this rank: Ray copies a remote checkpoint whole into a temp
    dir; a local one it hands over in place (None: nothing fetched)."""
    if "://" not in where:
        return None
    from ray.train import Checkpoint

    with Checkpoint(where).as_directory() as local:
        return sum(f.stat().st_size for f in Path(local).rglob("*") if f.is_file())


if __name__ == "__main__":
    main()
