"""Issue 36, item 6 / memory: the plan's parameter count and memory estimate for any model family.

The parameter counts are the published totals of each model's config.json (values copied below with
their source); the memory formula is the one written in ``docs/perf-model.md`` ("Memory per L4"):
state 16 B/param over the shard group + the gathered bf16 layers (two with reshard after forward)
and root unit + activations + logits, against the L4's ~22 GiB free × 85 % headroom.
"""

from __future__ import annotations

import json
from pathlib import Path

from backend.jobspec import describe_step_plan
from backend.stepfit import model_shape
from targets.aws.config import AwsConfig
from targets.kube.config import KubeConfig

GIB = 2**30

# huggingface.co/Qwen/Qwen2.5-7B config.json; 7,615,616,512 parameters (its safetensors index total / 2 bytes).
QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False}
# huggingface.co/meta-llama/Llama-3.2-1B config.json (no attention biases: attention_bias false);
# 1,235,814,400 parameters as the model card's safetensors total says.
LLAMA32_1B = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
              "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False}
# huggingface.co/google/gemma-2b config.json: head_dim 256 with 8 heads (not hidden / heads), one kv head,
# tied embeddings (GemmaConfig's default); 2,506,172,416 parameters.
GEMMA_2B = {"model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 18,
            "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 256000}


def _dir(tmp_path: Path, name: str, config: dict[str, object]) -> str:
    model = tmp_path / name
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return str(model)


def test_the_parameter_count_reads_each_familys_config(tmp_path: Path) -> None:
    for name, config, published in (("qwen", QWEN25_7B, 7_615_616_512), ("llama", LLAMA32_1B, 1_235_814_400),
                                    ("gemma", GEMMA_2B, 2_506_172_416)):
        shape = model_shape(KubeConfig(target="kube", model_id=_dir(tmp_path, name, config)))
        assert shape is not None and shape.n_params == published, name


def _perf_model_estimate(micro: int, seq: int, shard: int) -> float:
    """docs/perf-model.md's memory per GPU for Qwen2.5-7B, computed here from the config values above."""
    h, i, layers, heads, kv_heads, vocab = 3584, 18944, 28, 28, 4, 152064
    kv = h // heads * kv_heads
    layer = 2 * h * h + 2 * h * kv + h + 2 * kv + 3 * h * i + 2 * h  # q, o, k, v (+ biases), SwiGLU, 2 norms
    n = layers * layer + 2 * vocab * h + h
    root = n - layers * layer  # embedding, lm_head (untied), final norm: gathered for the whole step
    tokens = micro * seq
    state = 16 * n / shard
    gathered = (2 * layer + root) * 2  # bf16, reshard after forward (the GPU default)
    activations = layers * tokens * (15 * h + 6 * i)
    logits = tokens * vocab * (2 + 8)
    return (state + gathered + activations + logits) / GIB


def test_the_7b_estimate_on_eight_l4s_follows_the_perf_model_and_says_whether_it_fits() -> None:
    config = AwsConfig(target="aws", model_id="Qwen/Qwen2.5-7B", model_revision="0" * 40, data="cycle")
    line = describe_step_plan(config)
    micro, seq = config.effective_batch_size(), config.effective_seq_len()
    expected = _perf_model_estimate(micro, seq, shard=8)
    shown = float(line.split("est. ")[1].split(" GiB")[0])
    assert abs(shown - expected) < 0.1, (shown, expected, line)
    budget = 22.0 * 0.85  # the L4's ~22 GiB free (docs/perf-model.md) × stepplan.MEMORY_HEADROOM
    assert ("fits" in line) == (expected <= budget), line
    assert "L4" in line, line
    # A step that cannot fit is said in the plan, with what to change.
    big = AwsConfig(target="aws", model_id="Qwen/Qwen2.5-7B", model_revision="0" * 40, data="cycle", seq_len=4096,
                    batch_size=4)
    assert _perf_model_estimate(4, 4096, 8) > budget
    warned = describe_step_plan(big)
    assert "does not fit" in warned and "--activation-checkpointing" in warned, warned
