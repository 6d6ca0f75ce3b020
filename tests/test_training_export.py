"""The model export and the held-out evaluation of the training program, on CPU with gloo, without Ray.

Two real processes form a gloo group, shard a tiny Qwen2 with FSDP2 exactly as the job does, train a
few steps, evaluate and export; the parent then loads the directory with ``from_pretrained`` and
compares its logits with the ones the sharded model gave.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from training.config import TrainConfig
from training.export import CHECK_FILE, INCOMPLETE, MODEL_MARKER, ExportInfo, find_models

TINY = TrainConfig(tiny_vocab_size=256, tiny_hidden_size=64, tiny_layers=2, tiny_heads=4, seq_len=32,
                   data="cycle", lr=3e-3, num_workers=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def export_one_rank(root: str, *, step: int, evaluation: Any, **kwargs: Any) -> ExportInfo | None:
    """training.export's export of the tiny fp32 model, FSDP2-sharded in a gloo world of one rank."""
    import torch
    import torch.distributed as dist

    from training.export import export_model, reference_logits
    from training.loop import build_model
    from training.sharding import build_mesh, shard_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = shard_model(build_model(TINY.replace(precision="fp32")), "fp32", reshard_after_forward=False,
                            mesh=build_mesh("cpu", "full", 1, 1))
        return export_model(model, root, rank=0, step=step, final=True, dtype=torch.float32,
                            check=reference_logits(model, torch.device("cpu")), evaluation=evaluation, **kwargs)
    finally:
        dist.destroy_process_group()


def _worker(rank: int, world: int, port: int, root: str, precision: str, steps: int, shard_size: Any,
            interrupt: bool) -> None:
    import torch
    import torch.distributed as dist

    from training.data import SyntheticTokens
    from training.evaluate import eval_stream, evaluate, take_batches
    from training.export import export_model, reference_logits
    from training.loop import build_model
    from training.sharding import build_mesh, shard_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        cfg = TINY.replace(precision=precision)
        model = build_model(cfg)
        model = shard_model(model, precision, reshard_after_forward=False, mesh=build_mesh("cpu", "full", world, world))
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        data = SyntheticTokens("cycle", cfg.tiny_vocab_size, 2, cfg.seq_len, 0, rank)
        held_out = take_batches(SyntheticTokens("cycle", cfg.tiny_vocab_size, 2, cfg.seq_len, 0,
                                                eval_stream(rank)).next_batch, 4)
        before = evaluate(model, held_out, torch.device("cpu"))
        for _ in range(steps):
            ids = data.next_batch()
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        after = evaluate(model, held_out, torch.device("cpu"))

        def fail(_tmp: str) -> None:
            raise KeyboardInterrupt("teardown")

        check = reference_logits(model, torch.device("cpu"))
        with contextlib.suppress(KeyboardInterrupt):
            export_model(model, root, rank=rank, step=steps, final=True,
                         dtype=torch.bfloat16 if precision == "bf16" else torch.float32, check=check,
                         evaluation={"before": before, "after": after}, max_shard_size=shard_size,
                         before_publish=fail if interrupt else None)
        # Rank 0 writes the files after the gather while rank 1 is done: the ranks leave the group
        # together, so no rank tears gloo down (and exits) while its peer still holds the group.
        dist.barrier()
        del model, optimizer
    finally:
        dist.destroy_process_group()


def _run(tmp_path: Path, *, world: int, precision: str = "fp32", steps: int = 30, shard_size: Any = "5GB",
         interrupt: bool = False) -> Path:
    from torch.multiprocessing.spawn import spawn

    root = tmp_path / "export"
    args = (str(root), precision, steps, shard_size, interrupt)
    if world == 1:  # in this process: no interpreter to start
        _worker(0, 1, _free_port(), *args)
    else:
        spawn(_worker, args=(world, _free_port(), *args), nprocs=world, join=True)
    return root


def _loaded_logits(directory: Path) -> tuple[Any, Any]:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory)
    check = load_file(str(directory / CHECK_FILE))
    with torch.no_grad():
        logits = model(input_ids=check["input_ids"]).logits.float()
    return logits, check["logits"]


@pytest.mark.slow
def test_export_from_two_fsdp_ranks_loads_and_gives_the_trained_logits(tmp_path: Path) -> None:
    """fp32, world 2, shards of at most 100 kB: the index layout from_pretrained reads; eval after < before."""
    import torch

    root = _run(tmp_path, world=2, shard_size="100KB")
    [info] = find_models(str(root))
    directory = Path(info.uri)
    assert directory == root / "model" and directory.stat().st_mode & 0o777 == 0o700
    names = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", MODEL_MARKER} <= names
    assert sum(n.endswith(".safetensors") and n.startswith("model-") for n in names) > 1
    assert set(info.files) == names
    assert info.bytes == sum((directory / n).stat().st_size for n in names if n != MODEL_MARKER)
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["use_cache"] is True
    logits, trained = _loaded_logits(directory)
    assert torch.allclose(logits, trained, atol=1e-5, rtol=1e-4), (logits - trained).abs().max()
    before, after = info.eval["before"], info.eval["after"]
    assert before["tokens"] == 2 * 4 * 2 * 31  # ranks × batches × micro-batch × predicted tokens
    assert after["loss"] < before["loss"] - 1.0, (before, after)
    print(f"export: {info.export_s}s for {info.state_bytes:,} bytes of state; eval {before['loss']} → {after['loss']}")


@pytest.mark.slow
def test_bf16_run_of_one_rank_exports_one_bf16_file_with_the_same_logits(tmp_path: Path) -> None:
    import torch

    root = _run(tmp_path, world=1, precision="bf16", steps=5)
    [info] = find_models(str(root))
    directory = Path(info.uri)
    assert info.dtype == "bfloat16" and "model.safetensors" in info.files
    assert "model.safetensors.index.json" not in info.files
    logits, trained = _loaded_logits(directory)
    # The loaded model computes in bf16 like FSDP's mixed-precision forward did.
    assert torch.allclose(logits, trained, atol=2e-2, rtol=2e-2), (logits - trained).abs().max()


def test_an_interrupted_export_is_marked_incomplete_and_never_offered(tmp_path: Path) -> None:
    root = _run(tmp_path, world=1, steps=1, interrupt=True)
    leftovers = os.listdir(root)
    assert len(leftovers) == 1 and INCOMPLETE in leftovers[0], leftovers
    assert (root / leftovers[0] / MODEL_MARKER).is_file()  # written, yet still not offered
    assert find_models(str(root)) == []


@pytest.mark.parametrize("name", ["model", "model-step-00000010"])
def test_a_directory_missing_a_listed_file_is_not_a_model(tmp_path: Path, name: str) -> None:
    directory = tmp_path / name
    directory.mkdir()
    (directory / MODEL_MARKER).write_text(json.dumps({
        "format": "hf", "step": 10, "final": name == "model", "dtype": "float32", "files": ["config.json"],
        "bytes": 1, "export_s": 0.1, "state_bytes": 1, "tokenizer": False}))
    assert find_models(str(tmp_path)) == []
    (directory / "config.json").write_text("{}")
    [info] = find_models(str(tmp_path))
    assert info.uri == str(directory)


def test_a_full_volume_is_one_line_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC while writing the shards (huggingface_hub raises the OSError the write got)."""
    import errno

    import huggingface_hub

    from training.export import ExportError

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(huggingface_hub, "save_torch_state_dict", full)
    with pytest.raises(ExportError, match=r"the volume holding .* is full: the model needs about [\d,]+ bytes"):
        _run(tmp_path, world=1, steps=1)
    assert os.listdir(tmp_path / "export") == []


def test_tied_embeddings_are_gathered_and_saved_once_and_tied_again_on_load(tmp_path: Path) -> None:
    """Qwen2.5 ties lm_head to the embedding: the export skips the second name (gathering it would hold
    the embedding twice) and from_pretrained ties it back."""
    import torch
    import torch.distributed as dist
    from safetensors import safe_open
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from training.export import export_model, reference_logits
    from training.sharding import build_mesh, shard_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                             tie_word_embeddings=True))
        model = shard_model(model, "fp32", reshard_after_forward=False, mesh=build_mesh("cpu", "full", 1, 1))
        info = export_model(model, str(tmp_path), rank=0, step=1, final=True, dtype=torch.float32,
                            check=reference_logits(model, torch.device("cpu")))
    finally:
        dist.destroy_process_group()
    assert info is not None
    directory = Path(info.uri)
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    logits, trained = _loaded_logits(directory)
    assert torch.allclose(logits, trained, atol=1e-5)


def test_the_log_never_names_the_incomplete_directory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The job's log says where the model is, once: the hub's own "saved to .<name>.incomplete-…!" line
    (at INFO, which the job's log showed) named the staging directory the export renames away."""
    import logging

    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger="huggingface_hub")
    info = export_one_rank(str(tmp_path), step=1, evaluation=None)
    assert info is not None and INCOMPLETE not in info.uri
    staged = [r.getMessage() for r in caplog.records if INCOMPLETE in r.getMessage()]
    assert not staged, staged


def test_the_model_dir_holds_only_what_vllm_and_transformers_load(tmp_path: Path) -> None:
    """vLLM's default loader globs ``*.safetensors`` in the model directory itself (not below it) and,
    without an index, loads every file it found (vllm/model_executor/model_loader/default_loader.py,
    ``_prepare_weights``), then refuses a tensor name the model does not have. The check data rtui
    keeps beside the weights must not be one of those files: every top-level ``*.safetensors`` holds
    the model's own tensors only, and the check data lives in a subdirectory no loader reads."""
    import glob

    from safetensors import safe_open

    info = export_one_rank(str(tmp_path), step=1, evaluation=None)
    assert info is not None
    directory = Path(info.uri)
    names: set[str] = set()
    for path in glob.glob(os.path.join(directory, "*.safetensors")):
        with safe_open(path, "pt") as f:
            names |= set(f.keys())
    assert names and all(n.startswith(("model.", "lm_head.")) for n in names), sorted(names)
    assert (directory / CHECK_FILE).is_file() and os.path.dirname(CHECK_FILE)
    assert CHECK_FILE in info.files
    on_disk = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}
    assert on_disk == set(info.files)
