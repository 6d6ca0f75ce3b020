"""Any decoder-only causal LM whose blocks are a layer list trains, shards and exports (issue 36, item 6).

Tiny configs of three families are built here and saved like hub checkpoints (no download). The job
loads them through ``AutoModelForCausalLM`` (transformers picks the class from ``config.json``'s
``model_type``, models/auto/modeling_auto.py ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``); the program
then finds the decoder layer list itself to shard each layer with FSDP2. Qwen2 and Llama share
tensor names except Qwen2's q/k/v biases, so loading a Llama directory as Qwen2 (what the program
did) gave a model with random biases that no longer computed the saved model's logits.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch


def _tiny(family: str) -> Any:
    import transformers

    common: dict[str, Any] = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    if family == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    if family == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**common, sliding_window=None))
    raise AssertionError(family)


FAMILIES = ["qwen2", "llama", "mistral"]


def _saved(tmp_path: Path, family: str) -> tuple[Path, Any]:
    torch.manual_seed(0)
    model = _tiny(family)
    directory = tmp_path / family
    model.save_pretrained(directory)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(3))
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return directory, (ids, logits)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_loads_as_itself_trains_shards_each_layer_and_exports(tmp_path: Path, family: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from transformers import AutoModelForCausalLM

    from training.export import export_model
    from training.sharding import build_mesh, decoder_layers
    from training.step import load_pretrained, prepare_model, train_step

    directory, (ids, logits) = _saved(tmp_path, family)
    model = load_pretrained(str(directory))
    assert model.config.model_type == family and model.training
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, logits, atol=1e-5)
    model.train()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        cpu = torch.device("cpu")
        model = prepare_model(model, device=cpu, mesh=build_mesh("cpu", "full", 1, 1), precision="fp32",
                              reduce_dtype="fp32", reshard_after_forward=False, activation_checkpointing=False,
                              compile_layers=False)
        layers = decoder_layers(model)
        assert len(layers) == 3 and all(isinstance(layer, FSDPModule) for layer in layers)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(5))
        out = train_step(model, optimizer, lambda: batch, device=cpu, grad_accum=1, max_grad_norm=1.0,
                         reshard_after_forward=False, sync_every_micro_step=False)
        assert torch.isfinite(out.loss_sum)
        model.eval()
        with torch.no_grad():
            trained = model(input_ids=ids).logits
        info = export_model(model, str(tmp_path / "out"), rank=0, step=1, final=True, dtype=torch.float32)
    finally:
        dist.destroy_process_group()
    assert info is not None
    loaded = AutoModelForCausalLM.from_pretrained(info.uri)
    assert type(loaded).__name__ == type(_tiny(family)).__name__
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, trained, atol=1e-5)


def test_a_model_without_a_decoder_layer_list_is_refused_in_one_line() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from training.sharding import UnsupportedModel, decoder_layers

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    with pytest.raises(UnsupportedModel, match="decoder layer list") as caught:
        decoder_layers(model)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("config", "refused"), [
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, False),
    ({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]}, False),
    ({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, False),
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, True),
    ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}, True),
    ({"model_type": "bert", "architectures": ["BertForMaskedLM"]}, True),
])
def test_the_plan_refuses_a_local_model_of_another_shape(tmp_path: Path, config: dict[str, Any],
                                                         refused: bool) -> None:
    import json

    from backend.errors import UserError
    from backend.resolve import resolve_config

    directory = tmp_path / "m"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1, "hidden_size": 8,
                                                       "intermediate_size": 16, "vocab_size": 64,
                                                       "num_attention_heads": 2}))
    if refused:
        with pytest.raises(UserError, match="decoder-only causal LM") as caught:
            resolve_config({"target": "local", "model_id": str(directory)}, environ={})
        assert "\n" not in str(caught.value) and caught.value.remedy
    else:
        resolve_config({"target": "local", "model_id": str(directory)}, environ={})
