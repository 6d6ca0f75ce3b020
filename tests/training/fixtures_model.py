"""A tiny Qwen2 with Qwen2.5's traits that matter to fine-tuning, saved like a hub checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

LAYERS = 4


def save_tiny_qwen2(directory: Path, dtype: torch.dtype) -> Path:
    """Tied embeddings, use_cache on, weights rounded to bf16 then saved in ``dtype`` (so a bf16 and
    an fp32 copy hold the same values)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, use_cache=True)
    model = Qwen2ForCausalLM(config)
    # nn.Module.to converts in place; transformers' own .to (a functools.wraps wrapper mypy reads as
    # unbound) only adds checks for quantized models, which this is not.
    torch.nn.Module.to(model, torch.bfloat16)
    torch.nn.Module.to(model, dtype)
    model.save_pretrained(directory)
    return directory
