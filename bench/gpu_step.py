"""One GPU, the production step: does fine-tuning Qwen2.5-1.5B fine-tune, and how fast?

Builds Qwen2.5-1.5B's architecture from its config (random weights, nothing downloaded), saves it
in bfloat16 with ``save_pretrained`` like the hub checkpoint, loads it through the training
program's own loading path (``training.step.load_pretrained``), shards it with FSDP2 over a world of
one (a process group on loopback: NCCL on a GPU, gloo on CPU), and runs the production step
(``training.step.train_step``: bf16 compute, fp32 master weights and AdamW states) on the cycle data.
Prints, and writes to ``--out`` as JSON: tokens/s, MFU (6·N + attention over the device's dense bf16
peak from ``training.devices``), peak memory after sharding, the share of weights that moved and
the loss curve.

Needs only torch, transformers and the standard library (no Ray, no pydantic).

    python bench/gpu_step.py --out gpu_step.json          # one GPU: seq 2048 × 8, compile, 30 steps
    python bench/gpu_step.py --tiny --out tiny.json       # CPU smoke run in seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

# Qwen2.5-1.5B's config.json (hub: Qwen/Qwen2.5-1.5B), the values that shape compute and memory.
QWEN25_15B: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
    "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 131072,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "hidden_act": "silu", "use_sliding_window": False, "sliding_window": 131072,
    "max_window_layers": 28, "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "initializer_range": 0.02, "use_cache": True,  # as on the hub: the loading path must turn it off
}
TINY: dict[str, Any] = {
    **QWEN25_15B, "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512, "max_window_layers": 3,
    "sliding_window": 512, "bos_token_id": None, "eos_token_id": None,
}
GOAL_TOKENS_PER_S = 47_000  # one H200, seq 2048 × 8, compile (issue 22)


def say(text: str) -> None:
    print(f"gpu_step: {text}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def save_bf16_model(config: dict[str, Any], directory: Path, device: Any, seed: int) -> None:
    """Random weights in Qwen2's own initialisation, saved in bf16 like the hub's checkpoint."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):  # initialising 1.5B weights is far quicker on a GPU
        model = Qwen2ForCausalLM(Qwen2Config(**config))
    # nn.Module.to converts in place; transformers' own .to (a functools.wraps wrapper mypy reads as
    # unbound) only adds checks for quantized models, which this is not.
    torch.nn.Module.to(model, device="cpu", dtype=torch.bfloat16)
    model.save_pretrained(directory)
    del model


def run(args: argparse.Namespace, model_dir: Path, device: Any, use_compile: bool) -> dict[str, Any]:
    import torch

    from training.data import SyntheticTokens
    from training.devices import detect_peak, mfu, peak_memory_bytes, reset_peak_memory, training_flops_per_token
    from training.sharding import build_mesh, build_optimizer
    from training.step import load_pretrained, norm_value, prepare_model, train_step
    from training.stepplan import ModelShape, estimate_memory

    t0 = time.perf_counter()
    model = load_pretrained(str(model_dir))  # the production path: fp32 master weights, train mode
    loaded_dtype = str(next(model.parameters()).dtype)
    say(f"loaded in {time.perf_counter() - t0:.1f} s: params {loaded_dtype}, training={model.training}, "
        f"use_cache={model.config.use_cache}")
    c = model.config
    n_params = sum(p.numel() for p in model.parameters())
    mesh = build_mesh(device.type, "full", 1, 1)
    model = prepare_model(model, device=device, mesh=mesh, precision="bf16", reduce_dtype="fp32",
                          reshard_after_forward=True, activation_checkpointing=args.activation_checkpointing,
                          compile_layers=use_compile)
    optimizer = build_optimizer(model.parameters(), args.lr, "auto", device.type, 0.0)
    reset_peak_memory(device)
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    initial = [p.detach().to(torch.bfloat16).clone() for p in local]  # exact: the weights came from bf16
    data = SyntheticTokens("cycle", c.vocab_size, args.batch, args.seq, args.seed, 0)
    tokens_per_step = args.batch * args.seq
    losses: list[float] = []
    times: list[float] = []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        out = train_step(model, optimizer, data.next_batch, device=device, grad_accum=1, max_grad_norm=1.0,
                         reshard_after_forward=True, sync_every_micro_step=False)
        loss = float(out.loss_sum)  # the step's one synchronisation, as in the training loop
        elapsed = time.perf_counter() - start
        out.finish()
        losses.append(loss)
        times.append(elapsed)
        if step <= 3 or step % 5 == 0 or step == args.steps:
            say(f"step {step}/{args.steps}: loss {loss:.4f}, {elapsed:.3f} s, {tokens_per_step / elapsed:,.0f} "
                f"tokens/s, grad norm {norm_value(out.grad_norm) or 0:.3f}")
    warmup = min(3, max(1, args.steps // 3))
    steady = times[warmup:] or times
    tokens_per_s = tokens_per_step * len(steady) / sum(steady)
    moved = sum(int((p.detach() != i.float()).sum()) for p, i in zip(local, initial, strict=True))
    total = sum(p.numel() for p in local)
    states = {str(v.dtype) for s in optimizer.state.values() for v in s.values()
              if isinstance(v, torch.Tensor) and v.dim() > 0}
    peak = detect_peak(device)
    flops = training_flops_per_token(n_params, c.num_hidden_layers, c.hidden_size, args.seq)
    peak_bytes, mem_kind = peak_memory_bytes(device)
    shape = ModelShape(n_params, c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.vocab_size)
    estimate = estimate_memory(shape, micro_batch=args.batch, seq_len=args.seq, shard_size=1, compute_bytes=2,
                               reshard_after_forward=True, activation_checkpointing=args.activation_checkpointing)
    head = max(1, len(losses) // 5)
    result: dict[str, Any] = {
        "device": peak.name, "torch": torch.__version__, "compile": use_compile,
        "activation_checkpointing": args.activation_checkpointing,
        "params": n_params, "seq_len": args.seq, "batch": args.batch, "steps": args.steps, "lr": args.lr,
        "loaded_param_dtype": loaded_dtype, "param_dtype": str(local[0].dtype),
        "optimizer_state_dtypes": sorted(states), "model_training": bool(model.training),
        "use_cache": bool(model.config.use_cache),
        "first_step_s": round(times[0], 3), "step_time_s_mean": round(sum(steady) / len(steady), 4),
        "tokens_per_s": round(tokens_per_s, 1), "flops_per_token": flops,
        "mfu": mfu(flops, tokens_per_s, peak.flops, 1), "mfu_6n": mfu(6.0 * n_params, tokens_per_s, peak.flops, 1),
        "peak_flops": peak.flops, "peak_mem_gib": round(peak_bytes / 2**30, 2), "peak_mem_kind": mem_kind,
        "estimated_mem_gib": round(estimate.total / 2**30, 2),
        "weights_moved_share": moved / total, "losses": [round(x, 4) for x in losses],
        "loss_fell": sum(losses[-head:]) / head < sum(losses[:head]) / head,
    }
    if use_compile:
        from torch._dynamo.utils import counters

        result["compiled_graphs"] = int(counters["stats"]["unique_graphs"])
    del model, optimizer, local, initial
    return result


def main(argv: list[str] | None = None) -> int:
    """Runs the bench; any failure still prints one clear line and leaves a JSON result naming it."""
    out = _out_path(argv)
    try:
        return bench(argv)
    except Exception as exc:
        traceback.print_exc()
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(f"gpu_step: FAILED {message}", file=sys.stderr, flush=True)
        if out is not None:
            out.write_text(json.dumps({"error": message}, indent=2) + "\n")
        return 1


def _out_path(argv: list[str] | None) -> Path | None:
    args = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(args):
        if arg == "--out" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--out="):
            return Path(arg.split("=", 1)[1])
    return None


def bench(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a tiny Qwen2 on CPU, a few steps: a smoke run in seconds")
    p.add_argument("--steps", type=int, help="default 30 (tiny: 8)")
    p.add_argument("--seq", type=int, help="default 2048 (tiny: 64)")
    p.add_argument("--batch", type=int, help="default 8 (tiny: 2)")
    p.add_argument("--lr", type=float, help="default 1e-5, fine-tuning's (tiny: 1e-3)")
    p.add_argument("--no-compile", dest="compile", action="store_false", default=None,
                   help="eager (default: compile on a GPU, eager with --tiny)")
    p.add_argument("--compile", dest="compile", action="store_true")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    args = p.parse_args(argv)
    tiny = args.tiny
    for name, full, small in (("steps", 30, 8), ("seq", 2048, 64), ("batch", 8, 2), ("lr", 1e-5, 1e-3)):
        if getattr(args, name) is None:
            setattr(args, name, small if tiny else full)
    if min(args.steps, args.seq, args.batch) < 1 or not args.lr > 0:
        p.error("--steps, --seq and --batch must be at least 1 and --lr positive")

    import torch
    import torch.distributed as dist

    if args.device == "auto":
        if not tiny and not torch.cuda.is_available():
            print("gpu_step: torch sees no GPU; run with --tiny for the CPU smoke run (or --device cpu to train "
                  "the full 1.5B model on CPU, slowly, with ~40 GiB of memory)", file=sys.stderr, flush=True)
            return 2
        args.device = "cpu" if tiny else "cuda"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_step: --device cuda but torch sees no GPU; run with --tiny (CPU) or on a GPU machine",
              file=sys.stderr, flush=True)
        return 2
    use_compile = args.compile if args.compile is not None else not tiny
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    import transformers

    transformers.utils.logging.disable_progress_bar()
    say(f"torch {torch.__version__}, transformers {transformers.__version__}, device "
        f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; "
        f"{'tiny' if tiny else 'Qwen2.5-1.5B'} seq {args.seq} × batch {args.batch}, {args.steps} steps, "
        f"compile {use_compile}")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}",
                            rank=0, world_size=1)
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-step-") as tmp:
            model_dir = Path(tmp) / "model"
            t0 = time.perf_counter()
            save_bf16_model(TINY if tiny else QWEN25_15B, model_dir, device, args.seed)
            name = "tiny Qwen2" if tiny else "Qwen2.5-1.5B"
            say(f"saved a random {name} in bf16 in {time.perf_counter() - t0:.1f} s")
            compile_error = None
            try:
                result = run(args, model_dir, device, use_compile)
            except Exception as exc:
                if not use_compile:
                    raise
                compile_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                say(f"compiled run failed ({compile_error}); running again without compile. Traceback:")
                traceback.print_exc()
                sys.stdout.flush()
                import torch._dynamo

                torch._dynamo.reset()
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                result = run(args, model_dir, device, False)
            result["compile_requested"] = use_compile
            result["compile_error"] = compile_error
    finally:
        dist.destroy_process_group()
    result["total_s"] = round(time.perf_counter() - started, 1)
    result["goal_tokens_per_s"] = GOAL_TOKENS_PER_S if not tiny and device.type == "cuda" else None
    mfu_text = f"{result['mfu']:.1%} (6N only {result['mfu_6n']:.1%})" if result["mfu"] is not None else "n/a"
    say(f"RESULT tokens/s {result['tokens_per_s']:,.0f}, MFU {mfu_text}, peak memory {result['peak_mem_gib']} GiB "
        f"(estimate {result['estimated_mem_gib']} GiB), weights moved {result['weights_moved_share']:.2%}, "
        f"loss {result['losses'][0]:.4f} -> {result['losses'][-1]:.4f}, params {result['param_dtype']}, "
        f"AdamW states {result['optimizer_state_dtypes']}, first step {result['first_step_s']} s, "
        f"total {result['total_s']} s")
    print(json.dumps(result), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
