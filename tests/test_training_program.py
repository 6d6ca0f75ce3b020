"""The training program's own contract: arguments, the transport guard wiring, the model, one real step."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from backend.jobspec import build_job_spec
from backend.resolve import resolve_config
from tests.conftest import REPO
from training import loop, train
from training.config import TrainConfig
from training.transport_guard import TransportMismatch


@pytest.mark.slow
def test_require_transport_is_refused_on_cpu() -> None:
    proc = subprocess.run([sys.executable, "-m", "training.train", "--require-transport", "efa"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert "--require-transport needs --device cuda" in proc.stderr


def test_the_driver_imports_what_only_a_rank_runs_when_a_rank_runs_it() -> None:
    """The job's driver names the worker function; importing its program loads neither torch nor the
    loop (FSDP, DTensor, the model code), which cost the driver 0.7 s of its start (issue 40)."""
    probe = ("import sys, training.train\n"
             "print(sorted(m for m in ('torch', 'transformers', 'training.loop') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    assert proc.stdout.strip() == "[]"


def test_bad_tiny_shape_is_refused() -> None:
    with pytest.raises(SystemExit):
        train.parse_args(["--tiny-hidden-size", "30", "--tiny-heads", "4"])


def test_job_spec_per_target() -> None:
    local = build_job_spec(resolve_config({"steps": "3"}, environ={}).config)
    assert "--device cpu" in local.entrypoint and "--require-transport" not in local.entrypoint
    assert "--batch-size 32" in local.entrypoint and "--precision fp32" in local.entrypoint
    # The first local run learns something visible (tests/training/test_ray_train.py measures it).
    assert "--data cycle" in local.entrypoint and "--lr 0.001" in local.entrypoint
    aws = build_job_spec(resolve_config({"target": "aws"}, environ={}).config)
    assert "--require-transport efa" in aws.entrypoint and "--model-id Qwen/Qwen2.5-1.5B" in aws.entrypoint
    assert "--num-workers 8" in aws.entrypoint and "--precision bf16" in aws.entrypoint
    assert "--lr 1e-05" in aws.entrypoint  # fine-tuning a pretrained model
    explicit = build_job_spec(resolve_config({"learning_rate": "0.02"}, environ={}).config)
    assert "--lr 0.02" in explicit.entrypoint
    assert aws.runtime_env["env_vars"]["RAY_TRAIN_ENABLE_PRINT_PATCH"] == "0"
    # A CPU run's controller looks at its workers every 0.5 s, not Ray's 2 s: a seconds-long job
    # ends seconds sooner. GPU jobs keep Ray's own pace.
    assert local.runtime_env["env_vars"]["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.5"
    assert "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S" not in aws.runtime_env["env_vars"]
    # Same config, same hash: a second `up` is a no-op; a changed knob is a new job.
    assert local.spec_hash == build_job_spec(resolve_config({"steps": "3"}, environ={}).config).spec_hash
    assert local.spec_hash != build_job_spec(resolve_config({"steps": "4"}, environ={}).config).spec_hash


def _fake_rank_log(directory: Path, host: str, channel: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"nccl.{host}.1.log").write_text(
        f"{host}:1:1 [0] NCCL INFO NCCL version 2.29.7+cuda13.0\n"
        f"{host}:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 8 nNodes 2 localRanks 4 localRank 0 MNNVL 0\n"
        f"{host}:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] [send] via {channel}\n")


def test_guard_fails_the_run_with_evidence_on_tcp_fallback(tmp_path: Path) -> None:
    _fake_rank_log(tmp_path, "gpu-a", "NET/Socket/0")
    cfg = TrainConfig(device="cuda", require_transport="efa")
    with pytest.raises(TransportMismatch) as info, redirect_stdout(io.StringIO()):
        loop.enforce_transport(cfg, tmp_path)
    assert "socket" in str(info.value) and "NET/Socket" in str(info.value)


def test_guard_passes_on_efa(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    _fake_rank_log(tmp_path, "gpu-a", "NET/Libfabric/0")
    (tmp_path / "nccl.gpu-a.1.log").write_text(
        (tmp_path / "nccl.gpu-a.1.log").read_text()
        + "gpu-a:1:1 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 1 nics)\n")
    out = io.StringIO()
    with redirect_stdout(out):
        loop.enforce_transport(TrainConfig(device="cuda", require_transport="efa"), tmp_path)
    assert "satisfies --require-transport efa" in out.getvalue()


def test_tiny_model_is_qwen2_from_config_without_download() -> None:
    model = loop.build_model(TrainConfig(tiny_vocab_size=128, tiny_hidden_size=32, tiny_layers=2, tiny_heads=4,
                                          seq_len=16))
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == 128


def test_training_knobs_reach_the_entrypoint(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hello"}\n')
    tok = tmp_path / "tok"
    tok.mkdir()
    cfg = resolve_config({"data": "train.jsonl", "tokenizer": str(tok), "shard": "hybrid",
                          "tokens_per_step": "16384", "checkpoint_every": "5", "activation_checkpointing": "true",
                          "resume_from": "latest", "export_every": "3"}, environ={}, cwd=tmp_path).config
    assert cfg.data == str(data)  # made absolute: the job does not run in this directory
    entry = build_job_spec(cfg).entrypoint
    for part in (f"--data {data}", f"--tokenizer {tok}", "--shard hybrid", "--tokens-per-step 16384",
                 "--batch-size auto", "--checkpoint-every 5", "--activation-checkpointing", "--resume-from latest",
                 "--export-every 3"):
        assert part in entry, part
    parsed = train.parse_args(entry.split()[3:])
    assert parsed.shard == "hybrid" and parsed.tokens_per_step == 16384 and parsed.checkpoint_every == 5
    assert parsed.export_every == 3


def test_data_file_errors_are_one_line(tmp_path: Path) -> None:
    from backend.errors import UserError

    with pytest.raises(UserError, match="no such file"):
        resolve_config({"data": "missing.jsonl"}, environ={}, cwd=tmp_path)
    (tmp_path / "d.jsonl").write_text("{}\n")
    with pytest.raises(UserError, match="needs --tokenizer on the local target"):
        resolve_config({"data": "d.jsonl"}, environ={}, cwd=tmp_path)
    with pytest.raises(UserError, match="not a multiple of --batch-size 32"):
        resolve_config({"tokens_per_step": "4096", "batch_size": "32"}, environ={}, cwd=tmp_path)
    with pytest.raises(UserError, match="not a multiple of seq_len"):
        resolve_config({"tokens_per_step": "1000"}, environ={}, cwd=tmp_path)


def test_step_knobs_reach_the_job_command_line(tmp_path: Path) -> None:
    """Every knob of the step plan, from flags, RTUI_* and rtui.toml, ends on the job's command line
    and parses back into the program's config."""
    (tmp_path / "rtui.toml").write_text('reduce_dtype = "bf16"\noptimizer = "fused"\n')
    flags = {"target": "kube", "shard": "hybrid", "shard_size": "4", "reshard_after_forward": "no",
             "activation_checkpointing": "true", "compile": "true", "tokens_per_step": "65536",
             "seq_len": "2048", "batch_size": "2", "num_workers": "8"}
    cfg = resolve_config(flags, environ={"RTUI_RESHARD_AFTER_FORWARD": "yes"}, cwd=tmp_path).config
    entry = build_job_spec(cfg).entrypoint
    for part in ("--shard hybrid", "--shard-size 4", "--reduce-dtype bf16", "--reshard-after-forward no",
                 "--optimizer fused", "--activation-checkpointing", "--compile", "--tokens-per-step 65536"):
        assert part in entry, part
    parsed = train.parse_args(entry.split()[3:])
    assert (parsed.shard, parsed.shard_size, parsed.reduce_dtype, parsed.reshard_after_forward, parsed.optimizer,
            parsed.activation_checkpointing, parsed.compile) == ("hybrid", 4, "bf16", "no", "fused", True, True)
    # Hybrid on a cluster without --shard-size: one node's GPUs per shard group.
    cluster = resolve_config({"target": "aws", "shard": "hybrid"}, environ={}).config
    assert "--shard-size 4" in build_job_spec(cluster).entrypoint


def test_plan_shows_the_step_plan_and_the_knobs(tmp_path: Path) -> None:
    """`rtui plan` (the CLI, local target) shows the job's step: micro-batch, accumulation, shard groups, memory."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RTUI_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "plan", "--json", "--reduce-dtype", "bf16",
                           "--precision", "bf16", "--optimizer", "foreach", "--reshard-after-forward", "yes",
                           "--tokens-per-step", "8192", "--seq-len", "128", "--num-workers", "2"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout.splitlines()[-1])
    job = next(c for c in plan["changes"] if c["address"] == "ray.job.train")["after"]
    for part in ("--reduce-dtype bf16", "--optimizer foreach", "--reshard-after-forward yes", "--batch-size auto"):
        assert part in job["entrypoint"], part
    assert job["step"].startswith("micro-batch auto (≤ 32, by free memory) × seq 128 × 2 ranks × accum 1 = 8192")
    assert "FSDP2 full: one shard group of 2" in job["step"] and "GiB per worker" in job["step"]


def test_checkpoints_on_a_cluster_need_shared_storage(tmp_path: Path) -> None:
    from backend.errors import UserError

    for extra in ({}, {"storage_path": "/tmp/ckpt"}):
        with pytest.raises(UserError, match="no node holds a whole checkpoint") as info:
            resolve_config({"target": "aws", "checkpoint_every": "10", **extra}, environ={})
        assert "--storage-path s3://" in (info.value.remedy or "")
    with pytest.raises(UserError, match="--resume-from on kube"):
        resolve_config({"target": "kube", "resume_from": "latest"}, environ={})
    ok = resolve_config({"target": "aws", "checkpoint_every": "10", "storage_path": "s3://bucket/runs"}, environ={})
    assert "--storage-path s3://bucket/runs" in build_job_spec(ok.config).entrypoint
    # The CLI: one line, exit 2, before anything is planned.
    env = {**os.environ, "PYTHONPATH": str(REPO), "RTUI_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "plan", "--target", "aws", "--checkpoint-every", "10"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--storage-path s3://" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_local_model_id_is_a_directory_the_job_loads(tmp_path: Path) -> None:
    from backend.errors import UserError

    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "vocab_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True}))
    cfg = resolve_config({"model_id": "my-model"}, environ={}, cwd=tmp_path).config
    spec = build_job_spec(cfg)
    assert f"--model-id {model}" in spec.entrypoint and "--tiny-" not in spec.entrypoint
    assert "GiB per worker" in spec.step_plan
    assert "--model-id" not in build_job_spec(resolve_config({}, environ={}).config).entrypoint
    with pytest.raises(UserError, match="not a Hugging Face model directory"):
        resolve_config({"model_id": "Qwen/Qwen2.5-1.5B"}, environ={}, cwd=tmp_path)
