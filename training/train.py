"""The Ray Train program: Qwen2 causal-LM fine-tuning with FSDP2, on CPU (gloo) or GPU (NCCL).

Runs as a Ray job entrypoint on every target (``python -m training.train ...``). It
knows nothing of rtui's backend or TUI; it speaks to them only through its log:
one tagged JSON metric line per step (``training.protocol``) and a summary at the end.
The pieces: ``config`` (the validated TrainConfig), ``data`` (synthetic tokens or a Ray Data text
pipeline), ``stepplan`` (micro-batch, accumulation, memory check), ``sharding`` (FSDP2 full or
hybrid), ``metrics``, ``checkpoint`` (DCP through Ray Train), ``loop`` (the per-worker loop).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, get_args

from training.config import (
    Device,
    LrSchedule,
    OptimizerImpl,
    Precision,
    ReduceDtype,
    RequiredTransport,
    Reshard,
    ShardMode,
    TrainConfig,
    TrainConfigError,
)
from training.loop import TransportMismatch, build_model, train_loop_per_worker
from training.passed_env import load_passed_env
from training.raytrain import RENDEZVOUS_DIR_ENV, quiet_ray_train

__all__ = ["TransportMismatch", "build_model", "main", "parse_args", "train_loop_per_worker"]

DEFAULT = TrainConfig()


def _batch_size(text: str) -> int | None:
    if text == "auto":
        return None
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1, or auto")
    return value


def _parser() -> argparse.ArgumentParser:
    d = DEFAULT
    p = argparse.ArgumentParser(prog="training.train", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps in total (a resumed run stops here too)")
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--batch-size", type=_batch_size, default=d.batch_size,
                   help="micro-batch per worker (sequences per forward/backward); auto: the largest that "
                        "divides the per-rank share of --tokens-per-step and passes the memory check")
    p.add_argument("--tokens-per-step", type=int, default=d.tokens_per_step,
                   help="tokens per optimizer step over all workers; sets gradient accumulation = N / "
                        "(batch × seq-len × workers). 0: one micro-batch per step")
    p.add_argument("--no-memory-check", dest="memory_check", action="store_false",
                   help="skip the per-rank memory estimate (params+grads+optimizer+activations vs free memory)")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--lr-schedule", choices=get_args(LrSchedule), default=d.lr_schedule,
                   help="after warmup: constant, or cosine or linear decay to 10%% of --lr at --steps")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay,
                   help="AdamW weight decay on weight matrices (never norms, biases or embeddings)")
    p.add_argument("--max-grad-norm", type=float, default=d.max_grad_norm,
                   help="clip the global gradient norm; 0: off")
    p.add_argument("--optimizer", choices=get_args(OptimizerImpl), default=d.optimizer,
                   help="AdamW implementation (auto: fused on CUDA, foreach on CPU)")
    p.add_argument("--num-workers", type=int, default=d.num_workers)
    p.add_argument("--precision", choices=get_args(Precision), default=d.precision)
    p.add_argument("--reduce-dtype", choices=get_args(ReduceDtype), default=d.reduce_dtype,
                   help="gradient reduce-scatter/all-reduce dtype under --precision bf16 (bf16 halves the bytes)")
    p.add_argument("--device", choices=get_args(Device), default=d.device)
    p.add_argument("--model-id", default=d.model_id,
                   help="Hugging Face model id or local model directory, loaded with fp32 master weights in "
                        "training mode (default: a tiny random Qwen2 from the --tiny-* fields)")
    p.add_argument("--model-revision", default=d.model_revision,
                   help="the hub revision (a commit sha) of --model-id to load (default: the hub's main)")
    p.add_argument("--tiny-hidden-size", type=int, default=d.tiny_hidden_size)
    p.add_argument("--tiny-layers", type=int, default=d.tiny_layers)
    p.add_argument("--tiny-heads", type=int, default=d.tiny_heads)
    p.add_argument("--tiny-vocab-size", type=int, default=d.tiny_vocab_size)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--shard", choices=get_args(ShardMode), default=d.shard,
                   help="full: FSDP over all workers; hybrid: shard within a group of --shard-size workers "
                        "(one node), replicate across groups, so only gradients cross nodes")
    p.add_argument("--shard-size", type=int, default=d.shard_size,
                   help="workers per shard group for --shard hybrid (0: the workers on one node)")
    p.add_argument("--reshard-after-forward", choices=get_args(Reshard), default=d.reshard_after_forward,
                   help="free gathered layers after forward (auto: yes on GPUs to save memory, no on CPU)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each decoder layer in backward instead of storing its activations")
    p.add_argument("--compile", action="store_true", help="torch.compile each decoder layer (one graph for all: "
                                                             "training runs without the KV cache)")
    p.add_argument("--data", default=d.data,
                   help="random (uniform ids, the reference), cycle (a learnable synthetic pattern), or a "
                        "path / s3:// URI of JSONL or Parquet text files")
    p.add_argument("--text-field", default=d.text_field, help="the text column of --data files")
    p.add_argument("--tokenizer", default=d.tokenizer,
                   help="tokenizer for --data files: hub id or local dir (default: --model-id)")
    p.add_argument("--data-cpus", type=float, default=d.data_cpus,
                   help="CPUs each Ray Data read/tokenise task asks for")
    p.add_argument("--tokenize-actors", type=int, default=d.tokenize_actors,
                   help="Ray Data actors tokenising and packing text")
    p.add_argument("--storage-path", default=os.environ.get("RTUI_STORAGE_PATH"),
                   help="where Ray Train keeps results and checkpoints: a local dir or s3:// URI")
    p.add_argument("--rendezvous-dir", default=os.environ.get(RENDEZVOUS_DIR_ENV),
                   help="a private dir all workers share, where they form torch's process group through a file "
                        "(no socket); unset: over TCP, as a multi-node cluster needs")
    p.add_argument("--run-name", default=d.run_name, help="Ray Train run name (default rtui-<unix time>)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                   help="save a checkpoint every N steps and at the end; 0: no checkpoints")
    p.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints,
                   help="checkpoints kept per run (oldest deleted)")
    p.add_argument("--resume-from", default=d.resume_from,
                   help="latest (the complete checkpoint written last under --storage-path: --run-name's newest "
                        "when it has one; a fresh start when there is none), or a checkpoint dir / run dir, "
                        "local or s3://")
    p.add_argument("--eval-tokens", type=int, default=d.eval_tokens,
                   help="held-out tokens (never trained on) evaluated before the first step and after the last; "
                        "0: none")
    p.add_argument("--export-every", type=int, default=d.export_every,
                   help="also write the Hugging Face model directory every N steps (it is always written at the end)")
    p.add_argument("--max-failures", type=int, default=d.max_failures,
                   help="worker-group restarts Ray Train may do when a worker dies; each resumes from the "
                        "run's newest complete checkpoint (or --resume-from's, or the start)")
    p.add_argument("--require-transport", default=d.require_transport, choices=get_args(RequiredTransport),
                   help="stop after the first collective unless NCCL uses this network")
    return p


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The validated config; a bad value exits with status 2 and one line saying what to fix."""
    p = _parser()
    args = p.parse_args(argv)
    try:
        return TrainConfig(**vars(args))
    except TrainConfigError as exc:
        p.error(str(exc))


def _cluster_cpus() -> float:
    import ray

    # Ray leaves this function unannotated; the annotation here is what it documents.
    cluster_resources: Callable[[], dict[str, float]] = ray.cluster_resources
    return float(cluster_resources().get("CPU", 0.0))


def _text_dataset(cfg: TrainConfig) -> tuple[TrainConfig, dict[str, Any]]:
    """The Ray Data pipeline, after checking what can be checked before any worker starts; the
    config comes back with the tiny model's vocabulary raised to the tokenizer's when it is larger."""
    from transformers import AutoTokenizer

    from training.data import build_text_dataset, detect_data_mode

    tokenizer = cfg.tokenizer_source
    assert tokenizer is not None  # TrainConfig refuses data files without one
    vocab = len(AutoTokenizer.from_pretrained(tokenizer, revision=cfg.tokenizer_revision))
    if not cfg.model_id and vocab > cfg.tiny_vocab_size:
        print(f"rtui-train: tiny model vocab raised to the tokenizer's {vocab}", flush=True)
        cfg = cfg.replace(tiny_vocab_size=vocab)
    cpus = _cluster_cpus()
    train_cpus = 0 if cfg.use_gpu else cfg.num_workers
    data_cpus = cfg.data_cpus * (1 + cfg.tokenize_actors)
    if cpus < train_cpus + data_cpus:
        raise RuntimeError(
            f"Ray Data needs {data_cpus:g} CPUs beside the {train_cpus} the training workers hold, but the "
            f"cluster has {cpus:g}: start Ray with more CPUs (ray start --num-cpus) or lower --data-cpus")
    mode = detect_data_mode(cfg.data, cfg.text_field)
    print(f"rtui-train: data {cfg.data}: {mode} records", flush=True)
    # Two pipelines over the same files; each record goes to exactly one of them (training.sft.in_split).
    return cfg, {split: build_text_dataset(cfg.data, tokenizer=tokenizer, text_field=cfg.text_field,
                                           seq_len=cfg.seq_len, data_cpus=cfg.data_cpus,
                                           tokenize_actors=cfg.tokenize_actors,
                                           tokenizer_revision=cfg.tokenizer_revision, split=split, mode=mode)
                 for split in (("train", "eval") if cfg.eval_tokens else ("train",))}


def export_root(storage: str, run_name: str) -> str:
    """Where rank 0 writes the model directories: beside the run's checkpoints when the storage is a
    directory (a local one, or a volume every node mounts at the same path)."""
    return os.path.join(storage, run_name)


def _init_ray(cfg: TrainConfig) -> None:
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()  # a job on a running cluster (the local target and EKS both submit this way)
        return
    # Alone on this machine: a private Ray with room for the workers and the data pipeline.
    needed = cfg.num_workers + (0 if cfg.synthetic_data else 1)
    ray.init(num_cpus=max(os.cpu_count() or 1, needed), include_dashboard=False)


def main(argv: list[str] | None = None) -> int:
    passed = load_passed_env()  # before anything reads the environment (HF_TOKEN for the hub)
    if passed:
        print(f"rtui-train: variables from --job-env: {', '.join(passed)}", flush=True)
    cfg = parse_args(argv)
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from training.checkpoint import resolve_resume
    from training.rendezvous import torch_config

    quiet_ray_train()
    cfg = cfg.replace(nccl_dir=os.path.join(tempfile.gettempdir(), f"rtui-nccl-{os.getpid()}-{int(time.time())}"))
    storage = cfg.storage_path or os.path.join(tempfile.gettempdir(), "rtui-train-results")
    run_name = cfg.run_name or f"rtui-{int(time.time())}"
    cfg = cfg.replace(run_name=run_name, export_root=export_root(storage, run_name))
    started_ray = not ray.is_initialized()
    try:
        cfg = cfg.replace(resume_path=resolve_resume(cfg.resume_from, storage, run_name))
        if cfg.resume_from:
            print(f"rtui-train: --resume-from {cfg.resume_from}: "
                  f"{cfg.resume_path or 'no checkpoint yet, starting fresh'}", flush=True)
        _init_ray(cfg)
        datasets: dict[str, Any] = {}
        if not cfg.synthetic_data:
            cfg, datasets = _text_dataset(cfg)  # the held-out documents are never trained on
        print(f"rtui-train: {cfg.num_workers} workers on {cfg.device}, {cfg.steps} steps, seq {cfg.seq_len}, "
              f"batch {cfg.batch_size or 'auto'}, {cfg.precision}, shard {cfg.shard}, data {cfg.data}, lr {cfg.lr:g}",
              flush=True)
        trainer = TorchTrainer(
            train_loop_per_worker, train_loop_config=cfg.as_dict(), datasets=datasets,
            torch_config=torch_config(cfg.rendezvous_dir),
            scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                         resources_per_worker=None if cfg.use_gpu else {"CPU": 1}),
            run_config=RunConfig(name=run_name, storage_path=storage,
                                 checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
                                 failure_config=FailureConfig(max_failures=cfg.max_failures)),
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
