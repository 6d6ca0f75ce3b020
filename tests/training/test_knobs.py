"""The training knobs of issue 36 item 6, from rtui's config to the optimizer the job builds.

Before: the program had --lr-schedule, --warmup-steps, --weight-decay, --max-grad-norm, --seed,
--eval-tokens and --keep-checkpoints, but rtui had no field for any of them (unknown fields), so a
rtui run always trained with the program's defaults; weight decay (AdamW's decoupled decay,
torch.optim.AdamW ``weight_decay``) went to every parameter, norms, biases and embeddings included,
which pulls RMSNorm gains toward 0 (the usual practice, e.g. transformers' Trainer
``get_decay_parameter_names``, leaves norms and biases out); and the local target refused a data file
without --tokenizer although the README says the tokenizer defaults to --model-id.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from backend.config import RunConfig, free_fields
from backend.jobspec import build_job_spec
from backend.resolve import resolve_config
from training.config import TrainConfig
from training.train import parse_args

KNOBS = {"lr_schedule": "cosine", "warmup_steps": 10, "weight_decay": 0.1, "max_grad_norm": 0.5, "seed": 7,
         "eval_tokens": 4096, "keep_checkpoints": 3}


@pytest.mark.parametrize("target", ["local", "kube"])
def test_each_knob_reaches_the_program_from_rtuis_config(target: str) -> None:
    config = resolve_config({"target": target, **KNOBS}, environ={}).config
    cfg = parse_args(build_job_spec(config).entrypoint.split()[3:])
    assert {k: getattr(cfg, k) for k in KNOBS} == KNOBS
    assert set(KNOBS) <= free_fields()  # how the job trains: a checkout's rtui.toml may set them


def test_the_defaults_are_the_programs_and_leave_the_entrypoint_as_it_was() -> None:
    """Unset knobs pass nothing: the job's spec hash of an existing run's config stays the same."""
    config = resolve_config({"target": "local"}, environ={}).config
    entrypoint = build_job_spec(config).entrypoint
    assert not any(f"--{k.replace('_', '-')}" in entrypoint for k in KNOBS)
    defaults = TrainConfig()
    assert {k: getattr(config, k) for k in KNOBS} == {k: getattr(defaults, k) for k in KNOBS}


def test_a_linear_schedule_warms_up_then_decays_to_a_tenth() -> None:
    from training.loop import lr_at

    cfg = TrainConfig(lr=1.0, lr_schedule="linear", warmup_steps=10, steps=110)
    assert lr_at(5, cfg) == pytest.approx(0.5) and lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55) and lr_at(110, cfg) == pytest.approx(0.1)


def test_bad_knobs_are_one_line() -> None:
    from backend.errors import UserError

    for bad in ({"lr_schedule": "step"}, {"weight_decay": -0.1}, {"warmup_steps": -1}, {"keep_checkpoints": 0}):
        with pytest.raises(UserError) as caught:
            resolve_config({"target": "local", **bad}, environ={})
        assert "\n" not in str(caught.value)


def test_weight_decay_goes_to_the_matrices_only() -> None:
    from training.loop import build_model
    from training.sharding import build_optimizer, param_groups

    torch.manual_seed(0)
    model = build_model(TrainConfig(tiny_layers=1, tiny_hidden_size=32, tiny_heads=4, tiny_vocab_size=64))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = build_optimizer(param_groups(model, 0.5), 0.1, "foreach", "cpu", 0.5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # zero gradients: only the decoupled decay moves a weight
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    expected = {n for n, p in model.named_parameters() if p.ndim == 2 and "embed_tokens" not in n}
    assert moved == expected, sorted(moved ^ expected)
    assert any("norm" in n for n in before) and any(n.endswith(".bias") for n in before)
    assert "lm_head.weight" in moved  # an untied output projection is a matrix like any other


def test_the_local_tokenizer_defaults_to_the_model_directory(tmp_path: Path) -> None:
    from tests.training.fixtures_data import build_tokenizer, write_jsonl
    from tests.training.fixtures_model import save_tiny_qwen2

    model_dir = save_tiny_qwen2(tmp_path / "model", torch.float32)
    build_tokenizer(model_dir)
    data = write_jsonl(tmp_path / "corpus.jsonl")
    config = resolve_config({"target": "local", "model_id": str(model_dir), "data": str(data)}, environ={}).config
    cfg = parse_args(build_job_spec(config).entrypoint.split()[3:])
    assert cfg.tokenizer_source == str(model_dir)
    assert json.loads((model_dir / "config.json").read_text())["model_type"] == "qwen2"


def test_runconfig_fields_match_the_programs_names() -> None:
    assert set(KNOBS) <= set(RunConfig.model_fields)
