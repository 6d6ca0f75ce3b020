"""The Ray Train program: Qwen2 causal-LM fine-tuning with FSDP2, on CPU (gloo) or GPU (NCCL).

Runs as a Ray job entrypoint on every target (``python -m training.train ...``). It
knows nothing of rtui's backend or TUI; it speaks to them only through its log:
one tagged JSON metric line per step (``training.protocol``) and a summary at the end.
The pieces: ``data`` (synthetic tokens or a Ray Data text pipeline), ``stepplan`` (micro-batch,
accumulation, memory check), ``sharding`` (FSDP2 full or hybrid), ``metrics``, ``checkpoint``
(DCP through Ray Train), ``loop`` (the per-worker loop).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

from training.loop import TransportMismatch, build_model, train_loop_per_worker
from training.stepplan import StepPlanError, plan_step

__all__ = ["TransportMismatch", "build_model", "main", "parse_args", "train_loop_per_worker"]


def _batch_size(text: str) -> int | None:
    if text == "auto":
        return None
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1, or auto")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="training.train", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="optimizer steps in total (a resumed run stops here too)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=_batch_size, default=1,
                   help="micro-batch per worker (sequences per forward/backward); auto: the largest that "
                        "divides the per-rank share of --tokens-per-step and passes the memory check")
    p.add_argument("--tokens-per-step", type=int, default=0,
                   help="tokens per optimizer step over all workers; sets gradient accumulation = N / "
                        "(batch × seq-len × workers). 0: one micro-batch per step")
    p.add_argument("--no-memory-check", action="store_true",
                   help="skip the per-rank memory estimate (params+grads+optimizer+activations vs free memory)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                   help="after warmup: constant, or cosine decay to 10%% of --lr at --steps")
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="clip the global gradient norm; 0: off")
    p.add_argument("--optimizer", choices=("auto", "fused", "foreach", "plain"), default="auto",
                   help="AdamW implementation (auto: fused on CUDA, foreach on CPU)")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--reduce-dtype", choices=("fp32", "bf16"), default="fp32",
                   help="gradient reduce-scatter/all-reduce dtype under --precision bf16 (bf16 halves the bytes)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--model-id", default=None, help="Hugging Face model id (weights loaded on the cluster)")
    p.add_argument("--tiny-hidden-size", type=int, default=64)
    p.add_argument("--tiny-layers", type=int, default=2)
    p.add_argument("--tiny-heads", type=int, default=4)
    p.add_argument("--tiny-vocab-size", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard", choices=("full", "hybrid"), default="full",
                   help="full: FSDP over all workers; hybrid: shard within a group of --shard-size workers "
                        "(one node), replicate across groups, so only gradients cross nodes")
    p.add_argument("--shard-size", type=int, default=0,
                   help="workers per shard group for --shard hybrid (0: the workers on one node)")
    p.add_argument("--reshard-after-forward", choices=("auto", "yes", "no"), default="auto",
                   help="free gathered layers after forward (auto: yes on GPUs to save memory, no on CPU)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each decoder layer in backward instead of storing its activations")
    p.add_argument("--compile", action="store_true", help="torch.compile each decoder layer")
    p.add_argument("--data", default="random",
                   help="random (uniform ids, the reference), cycle (a learnable synthetic pattern), or a "
                        "path / s3:// URI of JSONL or Parquet text files")
    p.add_argument("--text-field", default="text", help="the text column of --data files")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer for --data files: hub id or local dir (default: --model-id)")
    p.add_argument("--data-cpus", type=float, default=0.5, help="CPUs each Ray Data read/tokenise task asks for")
    p.add_argument("--tokenize-actors", type=int, default=1, help="Ray Data actors tokenising and packing text")
    p.add_argument("--storage-path", default=os.environ.get("RTUI_STORAGE_PATH"),
                   help="where Ray Train keeps results and checkpoints: a local dir or s3:// URI")
    p.add_argument("--run-name", default=None, help="Ray Train run name (default rtui-<unix time>)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="save a checkpoint every N steps and at the end; 0: no checkpoints")
    p.add_argument("--keep-checkpoints", type=int, default=2, help="checkpoints kept per run (oldest deleted)")
    p.add_argument("--resume-from", default=None,
                   help="latest (newest complete checkpoint under --storage-path, or a fresh start when there "
                        "is none), or a checkpoint dir / run dir, local or s3://")
    p.add_argument("--max-failures", type=int, default=0,
                   help="worker-group restarts Ray Train may do; each restarts from the latest checkpoint")
    p.add_argument("--require-transport", default="any",
                   choices=("any", "efa", "efa_gdr", "socket", "ib", "intra_node"),
                   help="stop after the first collective unless NCCL uses this network")
    args = p.parse_args(argv)
    if args.require_transport != "any" and args.device != "cuda":
        p.error("--require-transport needs --device cuda: on CPU the collectives run on gloo, not NCCL")
    for name in ("steps", "seq_len", "num_workers", "tiny_hidden_size", "tiny_layers",
                 "tiny_heads", "tiny_vocab_size", "tokenize_actors", "keep_checkpoints"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("tokens_per_step", "shard_size", "checkpoint_every", "warmup_steps", "max_failures"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must not be negative")
    if args.tiny_hidden_size % args.tiny_heads:
        p.error("--tiny-hidden-size must be a multiple of --tiny-heads")
    try:  # the arithmetic needs no model: refuse an impossible step shape before Ray starts
        plan_step(tokens_per_step=args.tokens_per_step, seq_len=args.seq_len, world=args.num_workers,
                  micro_batch=args.batch_size)
    except StepPlanError as exc:
        p.error(str(exc))
    if args.shard == "full" and args.shard_size:
        p.error("--shard-size applies to --shard hybrid only")
    if args.shard_size and args.num_workers % args.shard_size:
        p.error(f"--shard-size {args.shard_size} must divide --num-workers {args.num_workers}")
    if args.data not in ("random", "cycle") and not (args.tokenizer or args.model_id):
        p.error("--data with files needs --tokenizer (a hub id or local dir) or --model-id")
    return args


def _text_dataset(args: argparse.Namespace, cfg: dict[str, Any]) -> Any:
    """The Ray Data pipeline, after checking what can be checked before any worker starts."""
    import ray
    from transformers import AutoTokenizer

    from training.data import build_text_dataset

    tokenizer = args.tokenizer or args.model_id
    vocab = len(AutoTokenizer.from_pretrained(tokenizer))
    if not args.model_id and vocab > cfg["tiny_vocab_size"]:
        print(f"rtui-train: tiny model vocab raised to the tokenizer's {vocab}", flush=True)
        cfg["tiny_vocab_size"] = vocab
    cpus = ray.cluster_resources().get("CPU", 0.0)
    train_cpus = 0 if args.device == "cuda" else args.num_workers
    data_cpus = args.data_cpus * (1 + args.tokenize_actors)
    if cpus < train_cpus + data_cpus:
        raise RuntimeError(
            f"Ray Data needs {data_cpus:g} CPUs beside the {train_cpus} the training workers hold, but the "
            f"cluster has {cpus:g}: start Ray with more CPUs (ray start --num-cpus) or lower --data-cpus")
    return build_text_dataset(args.data, tokenizer=tokenizer, text_field=args.text_field, seq_len=args.seq_len,
                              data_cpus=args.data_cpus, tokenize_actors=args.tokenize_actors)


def _init_ray(args: argparse.Namespace) -> None:
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()  # a job on a running cluster (the local target and EKS both submit this way)
        return
    # Alone on this machine: a private Ray with room for the workers and the data pipeline.
    needed = args.num_workers + (0 if args.data in ("random", "cycle") else 1)
    ray.init(num_cpus=max(os.cpu_count() or 1, needed), include_dashboard=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from training.checkpoint import resolve_resume

    cfg = {name: getattr(args, name) for name in (
        "steps", "seq_len", "batch_size", "tokens_per_step", "no_memory_check", "lr", "lr_schedule",
        "warmup_steps", "weight_decay", "max_grad_norm", "optimizer", "precision", "reduce_dtype", "model_id", "seed",
        "tiny_hidden_size", "tiny_layers", "tiny_heads", "tiny_vocab_size", "shard", "shard_size",
        "reshard_after_forward", "activation_checkpointing", "compile", "data", "checkpoint_every",
        "require_transport")}
    cfg["nccl_dir"] = os.path.join(tempfile.gettempdir(), f"rtui-nccl-{os.getpid()}-{int(time.time())}")
    use_gpu = args.device == "cuda"
    storage = args.storage_path or os.path.join(tempfile.gettempdir(), "rtui-train-results")
    started_ray = not ray.is_initialized()
    try:
        cfg["resume_path"] = resolve_resume(args.resume_from, storage)
        if args.resume_from:
            print(f"rtui-train: --resume-from {args.resume_from}: "
                  f"{cfg['resume_path'] or 'no checkpoint yet, starting fresh'}", flush=True)
        _init_ray(args)
        datasets = {} if args.data in ("random", "cycle") else {"train": _text_dataset(args, cfg)}
        print(f"rtui-train: {args.num_workers} workers on {args.device}, {args.steps} steps, seq {args.seq_len}, "
              f"batch {args.batch_size or 'auto'}, {args.precision}, shard {args.shard}, data {args.data}",
              flush=True)
        trainer = TorchTrainer(
            train_loop_per_worker, train_loop_config=cfg, datasets=datasets,
            scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=use_gpu,
                                         resources_per_worker=None if use_gpu else {"CPU": 1}),
            run_config=RunConfig(name=args.run_name or f"rtui-{int(time.time())}", storage_path=storage,
                                 checkpoint_config=CheckpointConfig(num_to_keep=args.keep_checkpoints),
                                 failure_config=FailureConfig(max_failures=args.max_failures)),
        )
        trainer.fit()
    except Exception as exc:  # Ray wraps worker errors; say what failed in one line, then exit non-zero
        root: BaseException = exc
        while root.__cause__ is not None:
            root = root.__cause__
        text = str(root)
        if not isinstance(root, TransportMismatch):  # the transport evidence is worth every line
            text = text.splitlines()[0] if text else ""
        print(f"rtui-train: training failed: {type(root).__name__}: {text}", file=sys.stderr, flush=True)
        return 1
    finally:
        if started_ray and ray.is_initialized():
            ray.shutdown()
    print("rtui-train: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
