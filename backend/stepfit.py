"""Whether one training step fits the GPUs, by the plan's estimate (docs/perf-model.md), from what is
known before anything runs: the model's shape (a hub model rtui proposes, or a local config.json) and
the node type's GPU. It decides ``--batch-size`` left on auto on a GPU cluster, and refuses at plan
time a step that cannot fit even one sequence, with the sizes that would.

``backend.config`` asks it for the auto batch size; it reads a ``RunConfig`` and never imports that
module when it runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.errors import UserError

if TYPE_CHECKING:
    from backend.config import RunConfig

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
    from training.stepplan import ModelShape  # lazy: the step planner loads when a step is sized

    n, layer = count_params(c)
    return ModelShape(n, int(c["num_hidden_layers"]), int(c["hidden_size"]), int(c["intermediate_size"]),
                      int(c["vocab_size"]), per_layer=layer)


def model_shape(config: RunConfig) -> Any:
    """The ModelShape the step plan needs, when it can be known here (None: on the cluster only)."""
    model_id = config.effective_model_id()
    if model_id is None:  # the tiny model (training.loop.build_model)
        tiny = config.target_defaults().tiny
        h, heads = tiny.hidden_size, tiny.heads
        return _shape({"model_type": "qwen2", "hidden_size": h, "intermediate_size": 4 * h,
                       "num_hidden_layers": tiny.layers, "num_attention_heads": heads,
                       "num_key_value_heads": max(1, heads // 2), "vocab_size": tiny.vocab_size,
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


# --batch-size left on auto on a GPU cluster (without --tokens-per-step): the largest of these that fits.
AUTO_MICRO_BATCHES = (16, 8, 4, 2, 1)
# Ways out named when a model does not fit: shorter sequences, and GPU nodes up to this many.
FITTING_SEQ_LENS = (2048, 1024, 512, 256, 128)
MAX_NODES_SUGGESTED = 16


def known_gpu(config: RunConfig) -> tuple[str, float] | None:
    """(name, GiB free) of the node type's GPU, when the target knows it (``GpuNodes.gpu``)."""
    nodes = config.target_traits().gpu_nodes(config)
    return None if nodes is None else nodes.gpu


def gpu_budget_gib(config: RunConfig) -> float | None:
    """GiB of one GPU the step's estimate may use (the rest is headroom), or None when not known here."""
    from training.stepplan import MEMORY_HEADROOM  # lazy: the step planner loads when a step is sized

    known = known_gpu(config)
    return None if known is None else known[1] * MEMORY_HEADROOM


def _step(config: RunConfig) -> Any:
    """The StepPlan of ``config``; with --tokens-per-step and the batch on auto, its micro-batch 1 (the
    smallest the job may choose)."""
    from training.stepplan import plan_step  # lazy: the step planner loads when a step is sized

    micro = config.batch_size or (1 if config.tokens_per_step else config.effective_batch_size())
    return plan_step(tokens_per_step=config.tokens_per_step, seq_len=config.effective_seq_len(),
                     world=config.effective_workers(), micro_batch=micro)


def estimate_for(config: RunConfig, shape: Any, plan: Any) -> Any:
    """The plan's MemoryEstimate per rank of one step of ``plan`` (docs/perf-model.md)."""
    from training.stepplan import estimate_memory  # lazy: the step planner loads when a step is sized

    gpu = config.target_traits().on_gpus
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
    from training.stepplan import GIB  # lazy: the step planner loads when a step is sized

    shape = model_shape(config)
    if shape is None:
        raise ValueError(f"the shape of {config.effective_model_id()} is not known here")
    return float(estimate_for(config, shape, _step(config)).total / GIB)


def fitting_micro_batch(config: RunConfig) -> int:
    """--batch-size auto on a GPU cluster: the largest of AUTO_MICRO_BATCHES whose estimate fits the node
    type's GPU (and, with --tokens-per-step, divides each rank's sequences); 1 where the GPU or the model's
    shape is not known here (the job's own check decides)."""
    budget = gpu_budget_gib(config)
    if budget is None or model_shape(config) is None:
        return 1
    from training.stepplan import StepPlanError  # lazy: the step planner loads when a step is sized

    def fits(batch: int) -> bool:
        try:
            return step_memory_gib(config.model_copy(update={"batch_size": batch})) <= budget
        except StepPlanError:  # with --tokens-per-step, a batch that does not divide each rank's sequences
            return False

    return next((b for b in AUTO_MICRO_BATCHES if fits(b)), 1)


def memory_refusal(config: RunConfig) -> UserError | None:
    """Why the step cannot fit the node type's GPU by the plan's estimate, with sizes that would (None:
    it fits, or the GPU or model is not known here). Said at plan time: the job would stop at its own
    memory check after the cluster was paid for."""
    budget = gpu_budget_gib(config)
    known = known_gpu(config)
    if budget is None or known is None or model_shape(config) is None:
        return None
    from training.stepplan import StepPlanError  # lazy: the step planner loads when a step is sized

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
    nodes = config.target_traits().gpu_nodes(config)
    more = None if nodes is None else next(
        (n for n in range(nodes.count + 1, MAX_NODES_SUGGESTED + 1) if fits(**{nodes.count_field: n})), None)
    if nodes is not None and more and config.shard == "full":
        ways.append(f"--{nodes.count_field.replace('_', '-')} {more} (its shards spread over more GPUs)")
    elif config.shard == "hybrid" and fits(shard="full"):
        ways.append("--shard full")
    ways.append("a smaller --model-id")
    name, free = known
    size = f"micro-batch {batch or config.effective_batch_size()} × seq {seq}"
    return UserError(f"{config.effective_model_id()} does not fit an {name}: ~{need:.1f} GiB per GPU at {size} "
                     f"on {config.effective_workers()} GPUs, {budget:.1f} GiB usable of ~{free:g} free",
                     remedy="pass " + ", or ".join(ways))


def fit_note(config: RunConfig, estimate_gib: float) -> str:
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
