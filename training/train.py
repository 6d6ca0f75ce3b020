"""The Ray Train program: Qwen2 causal-LM fine-tuning with FSDP2, on CPU (gloo) or GPU (NCCL).

Runs as a Ray job entrypoint on every target (``python -m training.train ...``). It
knows nothing of rtui's backend or TUI; it speaks to them only through its log:
one tagged JSON metric line per step (``training.protocol``) and a summary at the end.
The pieces: ``config`` (the validated TrainConfig), ``data`` (synthetic tokens or a Ray Data text
pipeline), ``stepplan`` (micro-batch, accumulation, memory check), ``sharding`` (FSDP2 full or
hybrid), ``metrics``, ``checkpoint`` (DCP through Ray Train), ``loop`` (the per-worker loop).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from training.config import TrainConfig
from training.config import parse_args as config_args
from training.passed_env import load_passed_env
from training.raytrain import quiet_ray_train
from training.transport_guard import TransportMismatch
from training.worker import train_loop_per_worker

__all__ = ["main", "parse_args"]

def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The validated config; a bad value exits with status 2 and one line saying what to fix."""
    return config_args(argv, description=__doc__)



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
