"""TrainConfig: built once from the command line, validated there, and the same value on every worker."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from backend.jobspec import build_job_spec
from backend.resolve import resolve_config
from training import checkpoint as ckpt
from training.config import TrainConfig, TrainConfigError
from training.loop import train_loop_per_worker
from training.train import parse_args


def test_command_line_defaults_are_the_dataclass_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RTUI_STORAGE_PATH", raising=False)
    assert parse_args([]) == TrainConfig()


@pytest.mark.parametrize("target", ["local", "aws", "kube"])
def test_every_job_spec_parses_into_a_config(target: str) -> None:
    entry = build_job_spec(resolve_config({"target": target}, environ={}).config).entrypoint
    cfg = parse_args(entry.split()[3:])
    assert isinstance(cfg, TrainConfig) and cfg.num_workers >= 1
    assert cfg.device == ("cpu" if target == "local" else "cuda")


@pytest.mark.parametrize(("argv", "message"), [
    (["--steps", "0"], "--steps must be at least 1"),
    (["--max-grad-norm", "-1"], "--max-grad-norm must not be negative"),
    (["--lr", "0"], "--lr must be positive"),
    (["--tiny-hidden-size", "30"], "--tiny-hidden-size must be a multiple of --tiny-heads"),
    (["--shard", "hybrid", "--shard-size", "3"], "--shard-size 3 must divide --num-workers 2"),
    (["--data", "corpus.jsonl"], "--data with files needs --tokenizer"),
])
def test_a_bad_value_is_one_line_before_ray_starts(argv: list[str], message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"training.train: error: {message}"), last


def test_the_config_is_frozen_and_revalidated_on_replace() -> None:
    cfg = TrainConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.steps = 3  # type: ignore[misc]  # the assignment a frozen config refuses, on purpose
    with pytest.raises(TrainConfigError, match="--precision must be one of bf16, fp32, not 'fp16'"):
        cfg.replace(precision="fp16")
    with pytest.raises(TrainConfigError, match="--require-transport needs --device cuda"):
        cfg.replace(require_transport="efa")
    assert cfg.replace(steps=7).steps == 7 and cfg.steps == 20


def test_the_workers_get_the_same_config_and_a_typo_fails_at_once() -> None:
    cfg = TrainConfig(data="cycle", nccl_dir="/tmp/x", resume_path=None, batch_size=None, tokens_per_step=512,
                      seq_len=128)
    assert TrainConfig.from_dict(cfg.as_dict()) == cfg
    with pytest.raises(TypeError, match="stesp"):
        TrainConfig.from_dict({**cfg.as_dict(), "stesp": 3})
    with pytest.raises(TypeError, match="stesp"):  # the worker entry refuses it before touching Ray
        train_loop_per_worker({**cfg.as_dict(), "stesp": 3})


def test_checkpoint_marker_round_trip_and_older_markers() -> None:
    meta = ckpt.CheckpointMeta(step=6, world_size=2, tokens_seen=1024, data="cycle", ts=1.5)
    assert ckpt.CheckpointMeta.from_json(meta.to_json()) == meta
    assert ckpt.CheckpointMeta.from_json('{"step": 3}') == ckpt.CheckpointMeta(step=3, world_size=1)
    with pytest.raises(ValueError):
        ckpt.CheckpointMeta.from_json('{"world_size": 2}')
    with pytest.raises(ValueError):
        ckpt.CheckpointMeta.from_json("[1]")


def test_the_model_revision_reaches_the_program_and_from_pretrained(monkeypatch: pytest.MonkeyPatch) -> None:
    sha = "a" * 40
    config = resolve_config({"target": "kube", "model_revision": sha}, environ={}).config
    cfg = parse_args(build_job_spec(config, sha).entrypoint.split()[3:])
    assert cfg.model_revision == sha and cfg.model_id == config.effective_model_id()
    import transformers

    from training import step

    seen: dict[str, object] = {}

    def fake_from_pretrained(model_id: str, **kwargs: object) -> object:
        seen.update(kwargs, model_id=model_id)
        raise RuntimeError("stop here")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    with pytest.raises(RuntimeError, match="stop here"):
        step.load_pretrained("Qwen/Qwen2.5-1.5B", revision=sha)
    assert seen["revision"] == sha and seen["model_id"] == "Qwen/Qwen2.5-1.5B"


@pytest.mark.slow
def test_the_tokenizer_of_the_model_loads_at_the_models_pinned_revision(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    """Issue 23 item 6: the tokenizer files are code the job loads too (a tokenizer.json or a custom
    class), so when they are the model's own they come from the commit the plan showed, like the weights."""
    import transformers

    from training.data import TokenizeAndPack

    sha = "b" * 40
    config = resolve_config({"target": "kube", "model_revision": sha, "data": "s3://b/corpus.jsonl"},
                            environ={}).config
    cfg = parse_args(build_job_spec(config, sha).entrypoint.split()[3:])
    assert cfg.tokenizer_source == cfg.model_id and cfg.tokenizer_revision == sha
    assert cfg.replace(tokenizer="/opt/tok").tokenizer_revision is None  # a separate tokenizer is loaded as named
    seen: list[tuple[str, object]] = []

    def fake_from_pretrained(name: str, **kwargs: object) -> object:
        seen.append((name, kwargs.get("revision")))
        raise RuntimeError("stop here")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_from_pretrained)
    with pytest.raises(RuntimeError, match="stop here"):
        TokenizeAndPack(cfg.tokenizer_source or "", "text", 8, revision=cfg.tokenizer_revision)
    from tests.test_training_export import export_one_rank

    with pytest.raises(RuntimeError, match="stop here"):  # the tokenizer files saved beside the exported model
        export_one_rank(str(tmp_path), step=1, evaluation={}, tokenizer=cfg.tokenizer_source,
                        tokenizer_revision=cfg.tokenizer_revision)
    assert seen == [(cfg.model_id, sha)] * 2
