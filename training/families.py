"""Which models the program fine-tunes: decoder-only causal LMs whose blocks are one layer list.

Stdlib only: the backend reads a model directory's ``config.json`` with it at plan time, so a model
the job would refuse is one line before anything starts. The job itself finds the list on the
loaded model (``training.sharding.decoder_layers``), which is what decides on the cluster.

These are the ``model_type`` values whose transformers causal-LM class keeps its decoder blocks in
``<base model>.layers`` (an ``nn.ModuleList``), read in transformers 5.x ``models/<type>/modeling_*.py``;
FSDP2 shards each of those blocks. GPT-2 (``transformer.h``), Falcon (``transformer.h``), OPT
(``model.decoder.layers``) and encoder-decoder models keep them elsewhere or have two stacks.
"""

from __future__ import annotations

from typing import Any

LAYER_LIST_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "phi", "phi3", "olmo", "olmo2", "granite", "starcoder2", "cohere", "smollm3", "gpt_neox",
})


def refusal(config: dict[str, Any]) -> str | None:
    """Why a model with this ``config.json`` cannot be fine-tuned here, in a few words; None when it can."""
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if model_type is None or model_type in LAYER_LIST_MODEL_TYPES:
        return None  # without a model_type transformers cannot load it at all: the job says so, with its reason
    arch = architectures[0] if architectures and isinstance(architectures[0], str) else "?"
    return (f"its config says model_type {model_type!r} ({arch}), not a decoder-only causal LM whose blocks are "
            "one layer list")
