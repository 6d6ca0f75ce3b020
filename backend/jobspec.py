"""What the training job is, as submitted to the Ray Jobs API on every target.

The spec hash decides whether a second ``up`` must submit a new job: the same config
on the same target gives the same hash, so applying twice is a no-op.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import training
from backend import targets
from backend.config import RunConfig
from backend.delivery import run_storage_uri
from backend.errors import UserError
from backend.stepfit import estimate_for, fit_note, known_gpu, model_shape
from training.checkpoint_interval import (
    SECONDS_PER_HOUR,
    choose_interval,
    estimated_checkpoint_s,
    optimum_interval_s,
    rate_text,
    seconds_text,
)

if TYPE_CHECKING:
    from backend.targets import InterruptionRate

# The job's expected interruptions per hour, for --checkpoint-every auto: an estimate of the world, not a
# property of the job, so it stays out of the spec hash (a new estimate never replaces a running job).
RATE_FLAG = "--interruptions-per-hour"
# The share of a GPU's dense bf16 peak the plan assumes a training step reaches, to turn --checkpoint-every
# auto's interval into steps before any step is measured (docs/perf-model.md: 20-40 % on L4, 35 % the middle).
ASSUMED_MFU = 0.35


@dataclass(frozen=True)
class JobSpec:
    entrypoint: str
    runtime_env: dict[str, Any]
    workers: int
    # Names only: their values (credentials) join the job at submission and are never kept.
    passed_env: tuple[str, ...] = ()
    step_plan: str = ""  # what one optimizer step is (shown by `rtui plan`; not part of the hash)
    checkpoint_plan: str = ""  # what --checkpoint-every auto means for this job (`rtui plan`; not hashed)

    @property
    def spec_hash(self) -> str:
        env = {k: v for k, v in self.runtime_env.items() if k != "py_modules"}
        # Only when there are any: a run without them keeps the hash older rtui versions gave it.
        passed = {"passed": list(self.passed_env)} if self.passed_env else {}
        blob = json.dumps({"entrypoint": _without_rate(self.entrypoint), "env": env, **passed}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"entrypoint": self.entrypoint, "workers": self.workers}
        if self.step_plan:
            out["step"] = self.step_plan
        if self.checkpoint_plan:
            out["checkpoint"] = self.checkpoint_plan
        if self.passed_env:
            out["job_env"] = ", ".join(self.passed_env)
        return out


CPU_HEALTH_CHECK_INTERVAL_S = "0.5"  # Ray Train's own default: 2.0 (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S)

# RunConfig fields the program takes under the same name, and the program's default for each.
_KNOB_DEFAULTS = {"lr_schedule": "constant", "warmup_steps": 0, "weight_decay": 0.0, "max_grad_norm": 1.0, "seed": 0,
                  "eval_tokens": 2048, "keep_checkpoints": 2}


def _without_rate(entrypoint: str) -> str:
    """The entrypoint without ``RATE_FLAG`` and its value (the same string when it has none)."""
    if RATE_FLAG not in entrypoint:
        return entrypoint
    args = shlex.split(entrypoint)
    at = args.index(RATE_FLAG)
    return shlex.join(args[:at] + args[at + 2:])


def training_package_dir() -> Path:
    return Path(training.__file__).resolve().parent


def build_job_spec(config: RunConfig, model_revision: str | None = None, *, run_id: str | None = None,
                   data: str | None = None, interruption_rate: InterruptionRate | None = None) -> JobSpec:
    """The job of this config; ``model_revision``: the hub commit the plan resolved (backend.hub);
    ``run_id``: the run whose own prefix under ``--storage-path`` the job writes to; ``data``: the Hub
    dataset pinned to the commit the plan resolved (``hf://datasets/ID@SHA/PATH``), else what the
    config says; ``interruption_rate``: the target's for this run (``Target.interruption_rate`` with the
    run's facts), for ``--checkpoint-every auto`` (None: the target's with no facts yet)."""
    workers = config.effective_workers()
    args = [
        "python", "-m", "training.train",
        "--steps", str(config.steps),
        "--seq-len", str(config.effective_seq_len()),
        # With a token budget and no explicit micro-batch, the program picks the largest that fits.
        "--batch-size", "auto" if config.tokens_per_step and not config.batch_size
        else str(config.effective_batch_size()),
        "--lr", repr(config.effective_learning_rate()),
        "--num-workers", str(workers),
        "--precision", config.effective_precision(),
        "--shard", config.shard,
        "--data", data or config.effective_data(),
    ]
    on_gpus = targets.get(config.target).on_gpus
    if config.shard == "hybrid" and (config.shard_size or on_gpus):
        # Locally the program groups the workers Ray placed on each node itself.
        args += ["--shard-size", str(config.effective_shard_size())]
    if config.reduce_dtype != "fp32":
        args += ["--reduce-dtype", config.reduce_dtype]
    if config.reshard_after_forward != "auto":
        args += ["--reshard-after-forward", config.reshard_after_forward]
    if config.optimizer != "auto":
        args += ["--optimizer", config.optimizer]
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
    checkpoint_plan = ""
    if config.checkpoint_every == "auto":
        rate = interruption_rate or targets.get(config.target).interruption_rate(config, _no_facts())
        per_hour = job_interruptions_per_hour(config, rate)
        args += ["--checkpoint-every", "auto", RATE_FLAG, f"{per_hour:.4g}"]
        checkpoint_plan = describe_auto_checkpoint(config, rate)
    elif config.checkpoint_every:
        args += ["--checkpoint-every", str(config.checkpoint_every)]
    if config.export_every:
        args += ["--export-every", str(config.export_every)]
    if config.storage_path:
        args += ["--storage-path",
                 run_storage_uri(config.storage_path, run_id) if run_id else config.storage_path]
    elif run_id and (own := targets.get(config.target).job_storage_path(config, run_id)):
        args += ["--storage-path", own]
    if config.resume_from:
        args += ["--resume-from", config.resume_from]
    if config.max_failures:
        args += ["--max-failures", str(config.max_failures)]
    # The training knobs pass only when set: a config that leaves them keeps the spec hash it had.
    for field, default in _KNOB_DEFAULTS.items():
        value = getattr(config, field)
        if value != default:
            args += ["--" + field.replace("_", "-"), str(value)]
    env_vars = {
        # Ray Train patches print() and doubles every worker line otherwise (DESIGN.md §3).
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    model_id = config.effective_model_id()
    if model_revision:
        args += ["--model-revision", model_revision]
    if not on_gpus:
        args += ["--device", "cpu"]
        if model_id:  # a model directory on this machine, loaded as on a cluster (from_pretrained)
            args += ["--model-id", model_id]
        else:
            tiny = config.target_defaults().tiny
            args += [
                "--tiny-hidden-size", str(tiny.hidden_size),
                "--tiny-layers", str(tiny.layers),
                "--tiny-heads", str(tiny.heads),
                "--tiny-vocab-size", str(tiny.vocab_size),
            ]
        env_vars.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                         # Ray Train's controller looks at its workers every 2 s by default, so a job
                         # that has finished training waits up to that long (measured: 3.7 s from the
                         # last step to the workers' shutdown) before it ends; a seconds-long CPU run
                         # feels every one of them. A look costs one small RPC per worker.
                         "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": CPU_HEALTH_CHECK_INTERVAL_S})
    else:
        assert model_id is not None  # the hub default on every cluster target
        args += ["--device", "cuda", "--model-id", model_id,
                 "--require-transport", config.effective_require_transport()]
        env_vars.update({"NCCL_DEBUG": "INFO"})
    runtime_env = {"py_modules": [str(training_package_dir())], "env_vars": env_vars}
    return JobSpec(entrypoint=shlex.join(args), runtime_env=runtime_env, workers=workers,
                   passed_env=config.job_env_names(), step_plan=describe_step_plan(config),
                   checkpoint_plan=checkpoint_plan)


def _no_facts() -> Any:
    from backend.record import RunFacts  # lazy: the record's models only when a rate is asked without a run

    return RunFacts()


def job_interruptions_per_hour(config: RunConfig, rate: InterruptionRate) -> float:
    """The whole job's expected interruptions per hour: the rate per node times the job's nodes (a target
    that does not settle its node count is counted as one node)."""
    return rate.per_node_hour * (targets.get(config.target).job_nodes(config) or 1)


def estimated_step_s(config: RunConfig, shape: Any) -> float | None:
    """One optimizer step's time before any is measured, on a GPU the plan knows: the step's training FLOPs
    over the workers' dense bf16 peak at ``ASSUMED_MFU`` (None: no GPU known here, or CPUs, whose peak
    depends on the machine)."""
    from training.devices import peak_for_name, training_flops_per_token  # lazy: stdlib, but off the first frame
    from training.stepplan import StepPlanError, plan_step

    gpu = known_gpu(config) if targets.get(config.target).on_gpus else None
    peak = peak_for_name(gpu[0]).flops if gpu else None
    if not peak:
        return None
    micro = config.batch_size or (None if config.tokens_per_step else config.effective_batch_size())
    try:
        step = plan_step(tokens_per_step=config.tokens_per_step, seq_len=config.effective_seq_len(),
                         world=config.effective_workers(), micro_batch=micro)
    except StepPlanError:
        return None
    flops = step.tokens_per_step * training_flops_per_token(shape.n_params, shape.n_layers, shape.hidden,
                                                             step.seq_len)
    return flops / (config.effective_workers() * peak * ASSUMED_MFU)


def describe_auto_checkpoint(config: RunConfig, rate: InterruptionRate) -> str:
    """What ``--checkpoint-every auto`` means for this job, for the plan: the program's own arithmetic
    (``training.checkpoint_interval``) on the plan's estimates of a checkpoint's time (the state's size at
    the assumed write rate) and a step's (the step's FLOPs at ``ASSUMED_MFU`` of the GPUs' peak)."""

    per_hour = job_interruptions_per_hour(config, rate)
    nodes = targets.get(config.target).job_nodes(config) or 1
    at = f"{rate_text(per_hour)} interruptions/h: {rate.source}" + (f", × {nodes} nodes" if nodes > 1 else "")
    shape = model_shape(config)
    if shape is None:
        return f"every auto (at {at}; from the measured checkpoint and step times)"
    checkpoint_s = estimated_checkpoint_s(shape.n_params, nodes)
    step_s = estimated_step_s(config, shape)
    estimates = f"est. {seconds_text(checkpoint_s)} per checkpoint"
    if step_s is None:
        tau = optimum_interval_s(checkpoint_s, per_hour / SECONDS_PER_HOUR)
        every = "only at the end: no interruption expected" if math.isinf(tau) else \
            f"≈ every {seconds_text(tau)} of training"
        return f"every auto ({every} at {at}; {estimates}; steps from the measured step time)"
    interval = choose_interval(checkpoint_s=checkpoint_s, step_s=step_s, interruptions_per_hour=per_hour,
                               job_steps=config.steps)
    estimates += f", {seconds_text(step_s)} per step"
    if interval.steps is None:
        return (f"every auto (only at the end: the optimum interval, {seconds_text(interval.interval_s)}, is longer "
                f"than the job's ≈ {seconds_text(interval.job_s)}, at {at}; {estimates})")
    return f"every auto (≈{interval.steps} steps at {at}; {estimates})"


def describe_step_plan(config: RunConfig) -> str:
    """One line for the plan: micro-batch × seq × ranks × accumulation, shard groups, expected memory per rank."""
    # lazy: the step planner only when a plan is described; not on the first frame
    from training.stepplan import GIB, StepPlanError, plan_step

    world = config.effective_workers()
    seq = config.effective_seq_len()
    micro = config.batch_size or (None if config.tokens_per_step else config.effective_batch_size())
    try:
        plan = plan_step(tokens_per_step=config.tokens_per_step, seq_len=seq, world=world, micro_batch=micro)
    except StepPlanError as exc:  # resolve_config refused these already; say it rather than fail
        return str(exc)
    shard = config.effective_shard_size()
    groups = (f"hybrid: {world // shard} replicas × shard groups of {shard}" if config.shard == "hybrid"
              else f"full: one shard group of {world}")
    micro_text = f"{plan.micro_batch}" if micro is not None else f"auto (≤ {plan.micro_batch}, by free memory)"
    line = (f"micro-batch {micro_text} × seq {plan.seq_len} × {world} ranks × accum {plan.grad_accum} = "
            f"{plan.tokens_per_step} tokens/step; FSDP2 {groups}")
    reduces_every_micro_step = config.effective_precision() == "bf16" and config.reduce_dtype == "bf16"
    if plan.grad_accum > 1 and reduces_every_micro_step:
        line += "; bf16 reduce with accumulation: gradients reduced every micro-step (fp32 sums)"
    if config.data_is_hub():
        line += "; data: a Hub dataset, read by the job at the commit this plan pins (see data)"
    elif config.data_is_file():
        from backend.datacheck import check_data  # lazy: pyarrow/transformers only for data files

        facts = check_data(config.data, text_field=config.text_field, tokenizer=config.tokenizer or config.model_id,
                           seq_len=seq, cwd=Path.cwd())
        line += "; data: " + facts.describe(seq, plan.tokens_per_step)
    shape = model_shape(config)
    if shape is None:
        return line + "; memory per rank: estimated on the cluster"
    gpu = targets.get(config.target).on_gpus
    estimate = estimate_for(config, shape, plan)
    line += f"; est. {estimate.total / GIB:.1f} GiB per {'GPU' if gpu else 'worker'}"
    return line + fit_note(config, estimate.total / GIB) if gpu else line


def passed_env_values(spec: JobSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of the variables the user named for the job, read at submission, never stored."""
    source = os.environ if environ is None else environ
    missing = [name for name in spec.passed_env if name not in source]
    if missing:
        raise UserError(f"--job-env names {missing[0]}, which is not set in rtui's environment",
                        remedy=f"export {missing[0]}=… first, or drop it from --job-env")
    return {name: source[name] for name in spec.passed_env}
