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

import targets
import training
from backend.config import RunConfig
from backend.delivery import run_storage_uri
from backend.errors import UserError


@dataclass(frozen=True)
class JobSpec:
    entrypoint: str
    runtime_env: dict[str, Any]
    workers: int
    # Names only: their values (credentials) join the job at submission and are never kept.
    passed_env: tuple[str, ...] = ()
    step_plan: str = ""  # what one optimizer step is (shown by `rtui plan`; not part of the hash)

    @property
    def spec_hash(self) -> str:
        env = {k: v for k, v in self.runtime_env.items() if k != "py_modules"}
        # Only when there are any: a run without them keeps the hash older rtui versions gave it.
        passed = {"passed": list(self.passed_env)} if self.passed_env else {}
        blob = json.dumps({"entrypoint": self.entrypoint, "env": env, **passed}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"entrypoint": self.entrypoint, "workers": self.workers}
        if self.step_plan:
            out["step"] = self.step_plan
        if self.passed_env:
            out["job_env"] = ", ".join(self.passed_env)
        return out


# RunConfig fields the program takes under the same name, and the program's default for each.
_KNOB_DEFAULTS = {"lr_schedule": "constant", "warmup_steps": 0, "weight_decay": 0.0, "max_grad_norm": 1.0, "seed": 0,
                  "eval_tokens": 2048, "keep_checkpoints": 2}


def training_package_dir() -> Path:
    return Path(training.__file__).resolve().parent


def build_job_spec(config: RunConfig, model_revision: str | None = None, *, run_id: str | None = None,
                   data: str | None = None) -> JobSpec:
    """The job of this config; ``model_revision``: the hub commit the plan resolved (backend.hub);
    ``run_id``: the run whose own prefix under ``--storage-path`` the job writes to; ``data``: the Hub
    dataset pinned to the commit the plan resolved (``hf://datasets/ID@SHA/PATH``), else what the
    config says."""
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
    if config.checkpoint_every:
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
            args += [
                "--tiny-hidden-size", str(config.local_hidden_size),
                "--tiny-layers", str(config.local_layers),
                "--tiny-heads", str(config.local_heads),
                "--tiny-vocab-size", str(config.local_vocab_size),
            ]
        env_vars.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    else:
        assert model_id is not None  # the hub default on every cluster target
        args += ["--device", "cuda", "--model-id", model_id,
                 "--require-transport", config.effective_require_transport()]
        env_vars.update({"NCCL_DEBUG": "INFO"})
    runtime_env = {"py_modules": [str(training_package_dir())], "env_vars": env_vars}
    return JobSpec(entrypoint=shlex.join(args), runtime_env=runtime_env, workers=workers,
                   passed_env=config.job_env_names(), step_plan=describe_step_plan(config))


# config.json values of the hub models rtui proposes (huggingface.co/<id>/blob/main/config.json), so
# their plan needs no download.
_QWEN25 = {"model_type": "qwen2", "vocab_size": 151936, "tie_word_embeddings": True}
KNOWN_MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B": {**_QWEN25, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                          "num_attention_heads": 14, "num_key_value_heads": 2},
    "Qwen/Qwen2.5-1.5B": {**_QWEN25, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                          "num_attention_heads": 12, "num_key_value_heads": 2},
    "Qwen/Qwen2.5-3B": {**_QWEN25, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                        "num_attention_heads": 16, "num_key_value_heads": 2},
    "Qwen/Qwen2.5-7B": {**_QWEN25, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                        "tie_word_embeddings": False},
}
# Families whose MLP is two matrices with biases and whose norms are LayerNorms with a bias (GELU MLP),
# read in transformers 5.x models/<type>/modeling_*.py; the rest of training.families' list is SwiGLU.
_GELU_MLP = frozenset({"gpt_neox", "phi", "starcoder2"})
_QKV_BIAS = frozenset({"qwen2", "qwen2_moe"})  # biases on q, k, v (not o) whatever the config says
_FOUR_NORMS = frozenset({"gemma2", "gemma3_text"})  # norms before and after attention and MLP
_TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3_text"})  # their config classes default to tied


def count_params(c: Mapping[str, Any]) -> tuple[int, int]:
    """(all parameters, one decoder layer's) from a decoder-only config.json's fields, for the families
    ``training.families`` accepts: attention with its own head_dim and GQA, the biases each family
    has, SwiGLU or GELU MLP (and experts), the norms, tied or untied embeddings. KeyError/ValueError
    when a field is missing."""
    model_type = str(c.get("model_type") or "")
    h, layers, vocab = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or h // heads)
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = 2 * h * q + 2 * h * kv  # q and o, k and v
    gelu = model_type in _GELU_MLP
    if model_type in _QKV_BIAS:
        attention += q + 2 * kv
    elif c.get("attention_bias") or gelu:
        attention += q + 2 * kv + h
    if model_type.startswith("qwen3"):
        attention += 2 * head_dim  # q_norm and k_norm
    inter = int(c["intermediate_size"])
    experts = int(c.get("num_local_experts") or c.get("num_experts") or 0)
    if experts:
        expert = int(c.get("moe_intermediate_size") or inter)
        mlp = experts * 3 * h * expert + h * experts  # the experts and the router
        shared = int(c.get("shared_expert_intermediate_size") or 0)
        mlp += 3 * h * shared + h if shared else 0
    elif gelu:
        mlp = 2 * h * inter + inter + h
    else:
        mlp = 3 * h * inter + (2 * inter + h if c.get("mlp_bias") else 0)
    norm = 2 * h if gelu else h  # LayerNorm weight and bias, or RMSNorm weight
    layer = attention + mlp + norm * (4 if model_type in _FOUR_NORMS else 2)
    tied = bool(c.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT))
    return layers * layer + vocab * h * (1 if tied else 2) + norm, layer


def _shape(c: Mapping[str, Any]) -> Any:
    from training.stepplan import ModelShape  # lazy: see model_shape

    n, layer = count_params(c)
    return ModelShape(n, int(c["num_hidden_layers"]), int(c["hidden_size"]), int(c["intermediate_size"]),
                      int(c["vocab_size"]), per_layer=layer)


def model_shape(config: RunConfig) -> Any:
    """The ModelShape the step plan needs, when it can be known here (None: on the cluster only)."""
    model_id = config.effective_model_id()
    if model_id is None:  # the tiny local model (training.loop.build_model)
        h, heads = config.local_hidden_size, config.local_heads
        return _shape({"model_type": "qwen2", "hidden_size": h, "intermediate_size": 4 * h,
                       "num_hidden_layers": config.local_layers, "num_attention_heads": heads,
                       "num_key_value_heads": max(1, heads // 2), "vocab_size": config.local_vocab_size,
                       "tie_word_embeddings": False})
    if model_id in KNOWN_MODEL_CONFIGS:
        return _shape(KNOWN_MODEL_CONFIGS[model_id])
    path = Path(model_id) / "config.json"
    try:
        c = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        c = None
    if not isinstance(c, dict):
        return None
    try:
        return _shape(c)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


# GPU memory a rank may use, by instance family (docs/perf-model.md: "the L4's ~22 GiB free" of 24 GB;
# g6 = NVIDIA L4 per the AWS G6 instance specifications). Other types: the job's own check decides.
GPU_FREE_GIB = {"g6.": ("L4", 22.0)}
# --batch-size left on auto on a GPU cluster (without --tokens-per-step): the largest of these that fits.
AUTO_MICRO_BATCHES = (16, 8, 4, 2, 1)
# Ways out named when a model does not fit: shorter sequences, and GPU nodes up to this many.
FITTING_SEQ_LENS = (2048, 1024, 512, 256, 128)
MAX_NODES_SUGGESTED = 16


def known_gpu(config: RunConfig) -> tuple[str, float] | None:
    """(name, GiB free) of the node type's GPU, when the target names a type rtui knows."""
    if "gpu_node_type" not in targets.get(config.target).own_fields:
        return None
    return next((v for k, v in GPU_FREE_GIB.items() if config.gpu_node_type.startswith(k)), None)


def gpu_budget_gib(config: RunConfig) -> float | None:
    """GiB of one GPU the step's estimate may use (the rest is headroom), or None when not known here."""
    from training.stepplan import MEMORY_HEADROOM  # lazy: see describe_step_plan

    known = known_gpu(config)
    return None if known is None else known[1] * MEMORY_HEADROOM


def _step(config: RunConfig) -> Any:
    """The StepPlan of ``config``; with --tokens-per-step and the batch on auto, its micro-batch 1 (the
    smallest the job may choose)."""
    from training.stepplan import plan_step  # lazy: see describe_step_plan

    micro = config.batch_size or (1 if config.tokens_per_step else config.effective_batch_size())
    return plan_step(tokens_per_step=config.tokens_per_step, seq_len=config.effective_seq_len(),
                     world=config.effective_workers(), micro_batch=micro)


def _estimate(config: RunConfig, shape: Any, plan: Any) -> Any:
    """The plan's MemoryEstimate per rank of one step of ``plan`` (docs/perf-model.md)."""
    from training.stepplan import estimate_memory  # lazy: see describe_step_plan

    gpu = targets.get(config.target).on_gpus
    reshard = config.reshard_after_forward == "yes" or (config.reshard_after_forward == "auto" and gpu)
    reduces_every_micro_step = config.effective_precision() == "bf16" and config.reduce_dtype == "bf16"
    return estimate_memory(shape, micro_batch=plan.micro_batch, seq_len=plan.seq_len,
                           shard_size=config.effective_shard_size(),
                           compute_bytes=2 if config.effective_precision() == "bf16" else 4,
                           grad_accum=plan.grad_accum, reshard_after_forward=reshard,
                           activation_checkpointing=config.activation_checkpointing,
                           grad_accum_bytes=0 if reduces_every_micro_step else 4)


def step_memory_gib(config: RunConfig) -> float:
    """GiB per rank the plan's estimate gives one step of ``config`` (ValueError: model not known here)."""
    from training.stepplan import GIB  # lazy: see describe_step_plan

    shape = model_shape(config)
    if shape is None:
        raise ValueError(f"the shape of {config.effective_model_id()} is not known here")
    return float(_estimate(config, shape, _step(config)).total / GIB)


def fitting_micro_batch(config: RunConfig) -> int:
    """--batch-size auto on a GPU cluster: the largest of AUTO_MICRO_BATCHES whose estimate fits the node
    type's GPU; 1 where the GPU or the model's shape is not known here (the job's own check decides)."""
    budget = gpu_budget_gib(config)
    if budget is None or model_shape(config) is None:
        return 1
    return next((b for b in AUTO_MICRO_BATCHES
                 if step_memory_gib(config.model_copy(update={"batch_size": b})) <= budget), 1)


def memory_refusal(config: RunConfig) -> UserError | None:
    """Why the step cannot fit the node type's GPU by the plan's estimate, with sizes that would (None:
    it fits, or the GPU or model is not known here). Said at plan time: the job would stop at its own
    memory check after the cluster was paid for."""
    budget = gpu_budget_gib(config)
    known = known_gpu(config)
    if budget is None or known is None or model_shape(config) is None:
        return None
    from training.stepplan import StepPlanError  # lazy: see describe_step_plan

    def fits(**update: Any) -> bool:
        try:
            return step_memory_gib(config.model_copy(update=update)) <= budget
        except StepPlanError:  # e.g. --tokens-per-step no longer divides: not a way out
            return False

    try:
        need = step_memory_gib(config)
    except StepPlanError:
        return None  # resolve_config said it already
    if need <= budget:
        return None
    seq, batch = config.effective_seq_len(), config.batch_size or (1 if config.tokens_per_step else 0)
    ways = []
    if batch > 1 and fits(batch_size=1):
        ways.append("--batch-size 1")
    shorter = next((s for s in FITTING_SEQ_LENS if s < seq and fits(seq_len=s)), None)
    if shorter:
        ways.append(f"--seq-len {shorter}")
    if not config.activation_checkpointing and fits(activation_checkpointing=True):
        ways.append("--activation-checkpointing")
    more = next((n for n in range(config.gpu_node_count + 1, MAX_NODES_SUGGESTED + 1) if fits(gpu_node_count=n)),
                None)
    if more and config.shard == "full":
        ways.append(f"--gpu-node-count {more} (its shards spread over more GPUs)")
    elif config.shard == "hybrid" and fits(shard="full"):
        ways.append("--shard full")
    ways.append("a smaller --model-id")
    name, free = known
    size = f"micro-batch {batch or config.effective_batch_size()} × seq {seq}"
    return UserError(f"{config.effective_model_id()} does not fit an {name}: ~{need:.1f} GiB per GPU at {size} "
                     f"on {config.effective_workers()} GPUs, {budget:.1f} GiB usable of ~{free:g} free",
                     remedy="pass " + ", or ".join(ways))


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
    estimate = _estimate(config, shape, plan)
    line += f"; est. {estimate.total / GIB:.1f} GiB per {'GPU' if gpu else 'worker'}"
    return line + _fit(config, estimate.total / GIB) if gpu else line


def _fit(config: RunConfig, estimate_gib: float) -> str:
    """Whether the estimate fits the GPUs of the node type, when the target names one rtui knows."""
    known, budget = known_gpu(config), gpu_budget_gib(config)
    if known is None or budget is None:
        return ""
    name, free = known
    if estimate_gib <= budget:
        return f": fits an {name} ({budget:.1f} GiB usable of ~{free:g} free)"
    return (f": WARNING does not fit an {name} ({budget:.1f} GiB usable of ~{free:g} free); the job stops at its "
            "memory check: lower --batch-size or --seq-len, add --activation-checkpointing, or use more GPUs "
            "(--gpu-node-count)")


def passed_env_values(spec: JobSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of the variables the user named for the job, read at submission, never stored."""
    source = os.environ if environ is None else environ
    missing = [name for name in spec.passed_env if name not in source]
    if missing:
        raise UserError(f"--job-env names {missing[0]}, which is not set in rtui's environment",
                        remedy=f"export {missing[0]}=… first, or drop it from --job-env")
    return {name: source[name] for name in spec.passed_env}
