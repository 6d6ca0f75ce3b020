"""Done-when of issue 36: chat data whose answers follow a rule trains to the rule on the assistant's
tokens; the same data trained on every token does not (production step code, gloo world of one)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.training.fixtures_chat import RULE, WORDS, load, write_chat_jsonl
from tests.training.test_sft import CPU, _config, tok_dir, world_of_one
from training import loop
from training.data import TokenizeAndPack
from training.evaluate import evaluate
from training.sft import IGNORE
from training.step import train_step

__all__ = ["tok_dir", "world_of_one"]  # the fixtures, shared with test_sft


# -- done when: answers by the rule ----------------------------------------------------------------

def _train_on_rule(tok_dir: Path, data: Path, every_token: bool, steps: int = 150) -> tuple[float, float]:
    """Train the tiny model on the chat file (its training split), then (held-out loss on the answers,
    share of new prompts answered by the rule)."""
    cfg = _config(tok_dir, "--lr", "3e-3", "--batch-size", "16")
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    split: dict[str, dict[str, Any]] = {}
    for name in ("train", "eval"):
        split[name] = TokenizeAndPack(str(tok_dir), "text", seq_len=24, mode="messages", split=name)(
            {"messages": [r["messages"] for r in rows]})
    train_ids = torch.as_tensor(split["train"]["input_ids"])
    train_labels = torch.as_tensor(split["train"]["labels"])
    if every_token:  # what the program did before: labels = ids (padding aside)
        train_labels = torch.where(train_ids == load(tok_dir).pad_token_id, IGNORE, train_ids)
    # The production step and loss on the plain model: FSDP's hooks (tested in test_finetune) would
    # only slow this test's few hundred tiny steps down.
    torch.manual_seed(cfg.seed)
    model = loop.build_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)

    def next_batch() -> dict[str, torch.Tensor]:
        pick = torch.randint(0, len(train_ids), (16,), generator=gen)
        return {"input_ids": train_ids[pick], "labels": train_labels[pick]}

    for _ in range(steps):
        train_step(model, optimizer, next_batch, device=CPU, grad_accum=1, max_grad_norm=1.0,
                   reshard_after_forward=True, sync_every_micro_step=False).finish()
    held = [{"input_ids": torch.as_tensor(split["eval"]["input_ids"]),
             "labels": torch.as_tensor(split["eval"]["labels"])}]
    loss = float(evaluate(model, held, CPU)["loss"])
    tok = load(tok_dir)
    rng = random.Random(99)
    right = 0
    model.eval()
    for _ in range(40):
        question = [rng.choice(WORDS) for _ in range(12)]
        prompt = tok.apply_chat_template([{"role": "user", "content": " ".join(question)}], tokenize=False,
                                         add_generation_prompt=True)
        ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            answer = tok.convert_ids_to_tokens(int(model(input_ids=ids).logits[0, -1].argmax()))
        right += answer == RULE[question[-1]]
    return loss, right / 40


@pytest.mark.slow
def test_chat_data_trains_the_answers_and_the_model_answers_by_the_rule(tok_dir: Path, tmp_path: Path) -> None:
    """Done-when of issue 36: random user turns, answers by a fixed rule. Trained on the assistant's
    tokens, the held-out answer loss is low and new prompts are answered by the rule; trained on
    every token (the user's random words dominate the loss) the same steps do not get there."""
    data = write_chat_jsonl(tmp_path / "chat.jsonl", n=600)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: more threads only contend on a shared machine (10 s vs 100 s)
    try:
        sft_loss, sft_right = _train_on_rule(tok_dir, data, every_token=False)
        all_loss, all_right = _train_on_rule(tok_dir, data, every_token=True)
    finally:
        torch.set_num_threads(threads)
    print(f"held-out answer loss: SFT {sft_loss:.3f} ({sft_right:.0%} by the rule); "
          f"every token {all_loss:.3f} ({all_right:.0%})")
    assert sft_loss < 0.3 and sft_right >= 0.9
    assert all_loss > 2 * sft_loss and all_right < sft_right
