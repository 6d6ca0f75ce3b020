"""Baseline for the local throughput benchmark: the same model and step in one plain process."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.config import TrainConfig  # noqa: E402
from training.loop import build_model  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=2, help="global batch: workers × per-worker batch")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="clip like the training program (0 = off)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build_model(TrainConfig(tiny_vocab_size=a.vocab, tiny_hidden_size=a.hidden, tiny_layers=a.layers,
                                    tiny_heads=a.heads, seq_len=a.seq_len, num_workers=1, batch_size=a.batch_size))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(a.steps):
        start = time.perf_counter()
        ids = torch.randint(0, a.vocab, (a.batch_size, a.seq_len), generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if a.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    steady = times[2:] or times
    mean = sum(steady) / len(steady)
    print(json.dumps({"tokens_per_s_mean": a.batch_size * a.seq_len / mean, "step_time_s_mean": mean}))


if __name__ == "__main__":
    main()
