"""The Ray Train program: Qwen2 causal-LM fine-tuning with FSDP2, on CPU (gloo) or GPU (NCCL).

Runs as a Ray job entrypoint on every target (``python -m training.train ...``). It
knows nothing of rtui's backend or TUI; it speaks to them only through its log:
one tagged JSON metric line per step (``training.protocol``) and a summary at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

from training.protocol import METRIC_TAG, SUMMARY_TAG, format_record

REPORT_EVERY_S = 5.0  # ray.train.report is slow (the controller polls every ~2 s): report rarely


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="training.train", description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--model-id", default=None, help="Hugging Face model id (weights loaded on the cluster)")
    p.add_argument("--tiny-hidden-size", type=int, default=64)
    p.add_argument("--tiny-layers", type=int, default=2)
    p.add_argument("--tiny-heads", type=int, default=4)
    p.add_argument("--tiny-vocab-size", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reshard-after-forward", choices=("auto", "yes", "no"), default="auto",
                   help="free gathered layers after forward (auto: yes on GPUs to save memory, no on CPU)")
    p.add_argument("--storage-path", default=os.environ.get("RTUI_STORAGE_PATH"))
    p.add_argument("--require-transport", default="any",
                   choices=("any", "efa", "efa_gdr", "socket", "ib", "intra_node"),
                   help="stop after the first collective unless NCCL uses this network")
    args = p.parse_args(argv)
    if args.require_transport != "any" and args.device != "cuda":
        p.error("--require-transport needs --device cuda: on CPU the collectives run on gloo, not NCCL")
    for name in ("steps", "seq_len", "batch_size", "num_workers", "tiny_hidden_size", "tiny_layers",
                 "tiny_heads", "tiny_vocab_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.tiny_hidden_size % args.tiny_heads:
        p.error("--tiny-hidden-size must be a multiple of --tiny-heads")
    return args


def build_model(cfg: dict[str, Any]) -> Any:
    """Qwen2 from the hub on a cluster, or a tiny random one built from a config (no download)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if cfg.get("model_id"):
        return Qwen2ForCausalLM.from_pretrained(cfg["model_id"])
    heads = cfg["tiny_heads"]
    config = Qwen2Config(
        vocab_size=cfg["tiny_vocab_size"], hidden_size=cfg["tiny_hidden_size"],
        intermediate_size=cfg["tiny_hidden_size"] * 4, num_hidden_layers=cfg["tiny_layers"],
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=max(512, cfg["seq_len"]), tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config)


def shard_model(model: Any, precision: str, reshard_after_forward: bool = True) -> Any:
    """FSDP2: shard each decoder layer, then the root (so layers gather one at a time)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if precision == "bf16" else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return model


class TransportMismatch(RuntimeError):
    """NCCL is not on the network the run requires; the message carries the evidence."""


def _guard_transport(cfg: dict[str, Any]) -> Any:
    """Before any collective: make this rank's NCCL write its INFO log where the guard reads it."""
    if cfg["require_transport"] == "any":
        return None
    from training.transport_guard import capture_nccl_debug

    return capture_nccl_debug(cfg["nccl_dir"])


def _enforce_transport(cfg: dict[str, Any], nccl_dir: Any) -> None:
    from training.transport_guard import enforce_transport

    try:
        verdict = enforce_transport(cfg["require_transport"], nccl_dir, echo=sys.stdout)
    except SystemExit as exc:  # a Ray worker must fail with a message, not exit
        raise TransportMismatch(str(exc.code)) from None
    print(f"rtui-train: NCCL transport {verdict.transport} satisfies --require-transport "
          f"{cfg['require_transport']}", flush=True)


def train_loop_per_worker(cfg: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    nccl_dir = _guard_transport(cfg)  # NCCL creates communicators lazily: this is early enough
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg["seed"])
    model = build_model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    model.to(device)
    reshard = cfg["reshard_after_forward"]
    model = shard_model(model, cfg["precision"], reshard == "yes" or (reshard == "auto" and device.type == "cuda"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + rank)
    tokens_per_step = cfg["batch_size"] * cfg["seq_len"] * world
    last_report = time.monotonic()
    times: list[float] = []
    loss_value = float("nan")
    for step in range(1, cfg["steps"] + 1):
        start = time.perf_counter()
        # Random token ids, as in the reference: the point is the collective traffic.
        ids = torch.randint(0, vocab, (cfg["batch_size"], cfg["seq_len"]), generator=gen).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        reduced = loss.detach().float().clone()
        dist.all_reduce(reduced, op=dist.ReduceOp.AVG if device.type == "cuda" else dist.ReduceOp.SUM)
        if device.type != "cuda":
            reduced /= world  # gloo has no AVG
        loss_value = float(reduced)
        step_time = time.perf_counter() - start
        if step == 1 and nccl_dir is not None:
            _enforce_transport(cfg, nccl_dir)
        times.append(step_time)
        if rank == 0:
            print(format_record(METRIC_TAG, {
                "step": step, "loss": round(loss_value, 5), "tokens_per_s": round(tokens_per_step / step_time, 2),
                "tokens_per_s_per_worker": round(tokens_per_step / step_time / world, 2),
                "step_time_s": round(step_time, 5), "world_size": world, "ts": round(time.time(), 3),
                "params": n_params,
            }), flush=True)
        now = time.monotonic()
        if now - last_report >= REPORT_EVERY_S or step == cfg["steps"]:
            ray.train.report({"step": step, "loss": loss_value})
            last_report = now
    if rank == 0:
        steady = times[1:] or times
        mean = sum(steady) / len(steady)
        print(format_record(SUMMARY_TAG, {
            "steps": cfg["steps"], "final_loss": round(loss_value, 5), "world_size": world,
            "step_time_s_mean": round(mean, 5), "tokens_per_s_mean": round(tokens_per_step / mean, 2),
            "params": n_params,
        }), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    cfg = {
        "steps": args.steps, "seq_len": args.seq_len, "batch_size": args.batch_size, "lr": args.lr,
        "precision": args.precision, "model_id": args.model_id, "seed": args.seed,
        "tiny_hidden_size": args.tiny_hidden_size, "tiny_layers": args.tiny_layers,
        "tiny_heads": args.tiny_heads, "tiny_vocab_size": args.tiny_vocab_size,
        "reshard_after_forward": args.reshard_after_forward,
        "require_transport": args.require_transport,
        "nccl_dir": os.path.join(tempfile.gettempdir(), f"rtui-nccl-{os.getpid()}-{int(time.time())}"),
    }
    use_gpu = args.device == "cuda"
    storage = args.storage_path or os.path.join(tempfile.gettempdir(), "rtui-train-results")
    print(f"rtui-train: {args.num_workers} workers on {args.device}, {args.steps} steps, "
          f"seq {args.seq_len}, batch {args.batch_size}, {args.precision}", flush=True)
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config=cfg,
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=use_gpu,
                                     resources_per_worker=None if use_gpu else {"CPU": 1}),
        run_config=RunConfig(name=f"rtui-{int(time.time())}", storage_path=storage),
    )
    try:
        trainer.fit()
    except Exception as exc:  # Ray wraps worker errors; say what failed in one line, then exit non-zero
        root: BaseException = exc
        while root.__cause__ is not None:
            root = root.__cause__
        text = str(root)
        if not isinstance(root, TransportMismatch):  # the transport evidence is worth every line
            text = text.splitlines()[0] if text else ""
        print(f"rtui-train: training failed: {type(root).__name__}: {text}", file=sys.stderr, flush=True)
        return 1
    finally:
        if ray.is_initialized():
            ray.shutdown()
    print("rtui-train: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
