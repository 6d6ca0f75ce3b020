"""The SFT step on CPU: loss tokens per second and the share of padding (issue 36, item 1).

Chat records are padded one per row to --seq-len (training.sft: no packing, so no document attends
to another), and each micro-batch is cut after its longest example; this measures what the padding
costs, both ways, on the same batches (the whole rows are the baseline). Without --data/--tokenizer
it writes its own chat file (user turns and answers of random lengths) and a word-level tokenizer
with a ChatML-like template.
The step is the training program's own (training.data.TokenizeAndPack, training.step.train_step)
on the tiny Qwen2, unsharded, in this process. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = [f"w{i}" for i in range(200)]
SPECIALS = ["<unk>", "<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|> {% endif %}")


def own_data(directory: Path, records: int, seed: int) -> tuple[Path, Path]:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    data = directory / "chat.jsonl"
    with data.open("w") as out:
        for _ in range(records):
            user = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))
            answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
            out.write(json.dumps({"messages": [{"role": "user", "content": user},
                                               {"role": "assistant", "content": answer}]}) + "\n")
    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", pad_token="<pad>",
                                   additional_special_tokens=SPECIALS[3:])
    fast.chat_template = TEMPLATE
    fast.save_pretrained(str(directory / "tok"))
    return data, directory / "tok"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a chat/prompt-completion JSONL (default: one written here)")
    p.add_argument("--tokenizer", help="a tokenizer dir with a chat template (needed with --data)")
    p.add_argument("--records", type=int, default=400, help="records of the generated file")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch threads (tiny matmuls: more only contend)")
    args = p.parse_args()
    if bool(args.data) != bool(args.tokenizer):
        p.error("--data and --tokenizer go together")

    import torch

    from training import train
    from training.data import TokenizeAndPack, detect_data_mode, peek_records, trim_batch
    from training.loop import build_model
    from training.step import train_step

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        data, tok = (Path(args.data), Path(args.tokenizer)) if args.data else own_data(Path(tmp), args.records, 0)
        mode = detect_data_mode(str(data), "text")
        records = peek_records(str(data), 10**9)
        encode = TokenizeAndPack(str(tok), "text", args.seq_len, mode=mode, split="train")
        t0 = time.perf_counter()
        rows = encode({key: [r[key] for r in records] for key in records[0]})
        encode_s = time.perf_counter() - t0
        ids, labels = torch.as_tensor(rows["input_ids"]), torch.as_tensor(rows["labels"])
        real = int((ids != encode.pad).sum())
        loss_tokens = int((labels[:, 1:] != -100).sum())
        vocab = len(encode.tokenizer)
        cfg = train.parse_args(["--tokenizer", str(tok), "--data", str(data), "--device", "cpu", "--num-workers", "1",
                                "--precision", "fp32", "--seq-len", str(args.seq_len), "--batch-size",
                                str(args.batch_size), "--tiny-vocab-size", str(max(vocab, 64)), "--lr", "1e-3"])
        def measure(cut: bool) -> dict[str, Any]:
            """The steps on the same picks, each batch whole (padded to --seq-len) or cut after its longest
            example as the job cuts it (training.data.trim_batch)."""
            torch.manual_seed(0)
            model = build_model(cfg)
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95))
            gen = torch.Generator().manual_seed(0)
            seen: list[int] = []
            computed: list[int] = []

            def next_batch() -> dict[str, Any]:
                pick = torch.randint(0, len(ids), (args.batch_size,), generator=gen)
                batch = {"input_ids": ids[pick], "labels": labels[pick]}
                if cut:
                    batch = trim_batch({k: v.numpy() for k, v in batch.items()})
                seen.append(int((batch["labels"][:, 1:] != -100).sum()))
                computed.append(batch["input_ids"].numel())
                return batch

            train_step(model, optimizer, next_batch, device=torch.device("cpu"), grad_accum=1, max_grad_norm=1.0,
                       reshard_after_forward=True, sync_every_micro_step=False).finish()  # warm-up
            seen.clear()
            computed.clear()
            t0 = time.perf_counter()
            losses = []
            for _ in range(args.steps):
                out = train_step(model, optimizer, next_batch, device=torch.device("cpu"), grad_accum=1,
                                 max_grad_norm=1.0, reshard_after_forward=True, sync_every_micro_step=False)
                losses.append(float(out.loss_sum))
                out.finish()
            seconds = time.perf_counter() - t0
            return {"step_s_mean": round(seconds / args.steps, 4),
                    "computed_tokens_per_s": round(sum(computed) / seconds, 1),
                    "loss_tokens_per_s": round(sum(seen) / seconds, 1),
                    "computed_not_loss_share": round(1 - sum(seen) / max(1, sum(computed)), 4),
                    "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4)}

        whole, cut = measure(cut=False), measure(cut=True)
    print(json.dumps({
        "mode": mode, "rows": len(ids), "seq_len": args.seq_len, "encode_s": round(encode_s, 3),
        "padding_share": round(1 - real / ids.numel(), 4), "loss_token_share": round(loss_tokens / ids.numel(), 4),
        "steps": args.steps, "padded_to_seq_len": whole, "cut_per_batch": cut,
        "loss_tokens_per_s_cut_over_padded": round(cut["loss_tokens_per_s"] / whole["loss_tokens_per_s"], 3),
        # What packing with a per-document mask could reach at best: only real tokens computed, no
        # padding at all (the mask's own cost left out). The cut batches' share above is the price
        # of not packing.
        "packed_bound_computed_not_loss_share": round(1 - loss_tokens / max(1, real), 4),
    }, indent=1))


if __name__ == "__main__":
    main()
