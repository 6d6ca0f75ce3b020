"""What the training job is, as submitted to the Ray Jobs API on every target.

The spec hash decides whether a second ``up`` must submit a new job: the same config
on the same target gives the same hash, so applying twice is a no-op.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import training
from backend.config import RunConfig
from backend.errors import UserError


@dataclass(frozen=True)
class JobSpec:
    entrypoint: str
    runtime_env: dict[str, Any]
    workers: int
    # Names only: their values (credentials) join the job at submission and are never kept.
    passed_env: tuple[str, ...] = ()

    @property
    def spec_hash(self) -> str:
        env = {k: v for k, v in self.runtime_env.items() if k != "py_modules"}
        # Only when there are any: a run without them keeps the hash older rtui versions gave it.
        passed = {"passed": list(self.passed_env)} if self.passed_env else {}
        blob = json.dumps({"entrypoint": self.entrypoint, "env": env, **passed}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"entrypoint": self.entrypoint, "workers": self.workers}
        if self.passed_env:
            out["job_env"] = ", ".join(self.passed_env)
        return out


def training_package_dir() -> Path:
    return Path(training.__file__).resolve().parent


def build_job_spec(config: RunConfig) -> JobSpec:
    workers = config.effective_workers()
    args = [
        "python", "-m", "training.train",
        "--steps", str(config.steps),
        "--seq-len", str(config.seq_len),
        # With a token budget and no explicit micro-batch, the program picks the largest that fits.
        "--batch-size", "auto" if config.tokens_per_step and not config.batch_size
        else str(config.effective_batch_size()),
        "--lr", repr(config.effective_learning_rate()),
        "--num-workers", str(workers),
        "--precision", config.effective_precision(),
        "--shard", config.shard,
        "--data", config.data,
    ]
    if config.data_is_file():
        args += ["--text-field", config.text_field]
        if config.tokenizer:
            args += ["--tokenizer", config.tokenizer]
    if config.tokens_per_step:
        args += ["--tokens-per-step", str(config.tokens_per_step)]
    if config.activation_checkpointing:
        args.append("--activation-checkpointing")
    if config.compile:
        args.append("--compile")
    if config.checkpoint_every:
        args += ["--checkpoint-every", str(config.checkpoint_every)]
    if config.storage_path:
        args += ["--storage-path", config.storage_path]
    if config.resume_from:
        args += ["--resume-from", config.resume_from]
    env_vars = {
        # Ray Train patches print() and doubles every worker line otherwise (DESIGN.md §3).
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if config.target == "local":
        args += [
            "--device", "cpu",
            "--tiny-hidden-size", str(config.local_hidden_size),
            "--tiny-layers", str(config.local_layers),
            "--tiny-heads", str(config.local_heads),
            "--tiny-vocab-size", str(config.local_vocab_size),
        ]
        env_vars.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    else:
        args += ["--device", "cuda", "--model-id", config.model_id,
                 "--require-transport", config.effective_require_transport()]
        env_vars.update({"NCCL_DEBUG": "INFO"})
    runtime_env = {"py_modules": [str(training_package_dir())], "env_vars": env_vars}
    return JobSpec(entrypoint=shlex.join(args), runtime_env=runtime_env, workers=workers,
                   passed_env=config.job_env_names())


def passed_env_values(spec: JobSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of the variables the user named for the job, read at submission, never stored."""
    source = os.environ if environ is None else environ
    missing = [name for name in spec.passed_env if name not in source]
    if missing:
        raise UserError(f"--job-env names {missing[0]}, which is not set in rtui's environment",
                        remedy=f"export {missing[0]}=… first, or drop it from --job-env")
    return {name: source[name] for name in spec.passed_env}
