"""Supervised fine-tuning (issue 36, items 1-2): chat data trains on the assistant's tokens only, the
loss is normalised by the loss tokens of the whole step, and the held-out split is by document.

Runs the production code (training.sft, training.data.TokenizeAndPack, training.step.train_step,
training.evaluate) on a gloo world of one in this process, as tests/training/test_finetune.py does.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests import gloo
from tests.training.fixtures_chat import build_chat_tokenizer, conversation, load, write_chat_jsonl
from training import loop, train
from training.data import TokenizeAndPack, detect_data_mode, peek_records, trim_batch
from training.sft import IGNORE, DataFormatError, detect_format, encode_record, in_split, trimmed_width
from training.sharding import build_mesh
from training.step import train_step

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_tokenizer(tmp_path_factory.mktemp("chat-tok"))


@pytest.fixture(scope="module", autouse=True)
def world_of_one() -> Iterator[None]:
    with gloo.world_of_one():
        yield


# -- formats and labels ----------------------------------------------------------------------------

def test_the_format_comes_from_the_fields_and_a_bad_record_is_one_line() -> None:
    assert detect_format({"messages": []}) == "messages"
    assert detect_format({"prompt": "q", "completion": "a"}) == "prompt_completion"
    assert detect_format({"body": "x"}, text_field="body") == "text"
    with pytest.raises(DataFormatError, match=r"neither `messages`.*its fields: id, question") as err:
        detect_format({"question": "q", "id": 1})
    assert "\n" not in str(err.value)


def test_chat_labels_are_the_assistant_turns_only(tok_dir: Path) -> None:
    """The loss tokens are exactly what the model generates after the template's generation prompt:
    the answer and its end marker (transformers' chat templates: add_generation_prompt)."""
    tok = load(tok_dir)
    turns = [{"role": "system", "content": "w0"}, {"role": "user", "content": "w1 w2"},
             {"role": "assistant", "content": "a1 a2"}, {"role": "user", "content": "w3"},
             {"role": "assistant", "content": "a3"}]
    ex = encode_record(tok, {"messages": turns}, "messages")
    assert tok.decode(ex.ids) == tok.apply_chat_template(turns, tokenize=False).strip()
    learnt = [tok.convert_ids_to_tokens(i) for i, label in zip(ex.ids, ex.labels, strict=True) if label != IGNORE]
    assert learnt == ["a1", "a2", "<|end|>", "a3", "<|end|>"]
    pc = encode_record(tok, {"prompt": "w1 w2", "completion": "a5"}, "prompt_completion")
    assert [tok.convert_ids_to_tokens(i) for i, lab in zip(pc.ids, pc.labels, strict=True) if lab != IGNORE] == [
        "a5", "<eos>"]
    with pytest.raises(DataFormatError, match="no assistant turn"):
        encode_record(tok, {"messages": turns[:2]}, "messages")


def test_a_messages_file_is_read_as_chat_not_a_key_error(tok_dir: Path, tmp_path: Path) -> None:
    """Before: `KeyError: 'text'` inside a Ray Data worker 25 s into the job."""
    data = write_chat_jsonl(tmp_path / "chat.jsonl", n=30)
    assert detect_data_mode(str(data), "text") == "messages"
    assert len(peek_records(str(data), 5)) == 5
    rows = TokenizeAndPack(str(tok_dir), "text", seq_len=24, mode="messages")(
        {"messages": [r["messages"] for r in map(json.loads, data.read_text().splitlines())]})
    assert rows["input_ids"].shape[1] == 24 and rows["labels"].shape == rows["input_ids"].shape
    assert ((rows["labels"] != IGNORE).sum(axis=1) == 2).all()  # one answer word and its end marker


# -- the held-out split ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["messages", "text"])
def test_held_out_documents_are_never_trained_on_whatever_the_order(tok_dir: Path, mode: str) -> None:
    """Ray Data does not keep block order by default (DataContext.execution_options.preserve_order is
    False), so the pipeline sees the records in another order and other batch boundaries on every
    run: the split must depend on the record alone. Before, packed sequences were hashed, and
    packing boundaries move with the order."""
    rng = random.Random(3)
    docs = [conversation(rng, words=6) for _ in range(400)]
    if mode == "messages":
        batch: dict[str, list[Any]] = {"messages": docs}
    else:
        batch = {"text": [" ".join(t["content"] for t in d) for d in docs]}

    def run(split: str, seed: int, size: int) -> list[list[int]]:
        order = list(range(len(docs)))
        random.Random(seed).shuffle(order)
        pack = TokenizeAndPack(str(tok_dir), "text", seq_len=16, mode=mode, split=split)  # type: ignore[arg-type]
        out: list[list[int]] = []
        for start in range(0, len(order), size):
            part = {k: [v[i] for i in order[start:start + size]] for k, v in batch.items()}
            out += pack(part)["input_ids"].tolist()
        return out

    held = {tuple(r) for r in run("eval", 0, 50)}
    if mode == "messages":  # one row per document: the held-out rows are the same set in any order
        assert held == {tuple(r) for r in run("eval", 1, 7)}
    assert 5 <= len(held) <= 50, len(held)
    tok = load(tok_dir)
    for seed, size in ((2, 64), (5, 13)):
        trained = run("train", seed, size)
        if mode == "messages":
            assert not held & {tuple(r) for r in trained}
            continue
        # Packed text: no held-out document's ids appear anywhere in the training stream.
        stream = " " + " ".join(str(i) for r in trained for i in r) + " "
        for text in batch["text"]:
            if in_split({"text": text}, "text", "eval"):
                ids = tok(text, add_special_tokens=False)["input_ids"]
                assert " " + " ".join(map(str, ids)) + " " not in stream


# -- the loss -------------------------------------------------------------------------------------

def _config(tok_dir: Path, *extra: str) -> Any:
    return train.parse_args(["--tokenizer", str(tok_dir), "--data", "chat.jsonl", "--device", "cpu",
                             "--num-workers", "1", "--precision", "fp32", "--seq-len", "24", "--batch-size", "2",
                             "--tiny-vocab-size", "64", "--tiny-hidden-size", "64", "--tiny-layers", "2",
                             "--tiny-heads", "4", *extra])


def _build(cfg: Any) -> tuple[Any, Any]:
    torch.manual_seed(cfg.seed)
    return loop.prepare_for_training(loop.build_model(cfg), cfg, CPU, build_mesh("cpu", "full", 1, 1), True)


def test_the_loss_is_the_mean_over_every_loss_token_of_the_step(tok_dir: Path) -> None:
    """Two micro-batches, one with 1 loss token and one with 20: the step's gradient is that of the sum
    of the 21 token losses over 21 (transformers' num_items_in_batch), not the mean of two means."""
    cfg = _config(tok_dir, "--max-grad-norm", "0", "--tokens-per-step", "96")
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 64, (2, 24), generator=gen) for _ in range(2)]
    labels = [torch.full((2, 24), IGNORE), ids[1].clone()]
    labels[0][0, 5] = ids[0][0, 5]
    labels[1][:, 11:] = IGNORE  # 10 predicted per row: 20 in the second micro-batch
    feed = iter([{"input_ids": i, "labels": lab} for i, lab in zip(ids, labels, strict=True)])
    model, optimizer = _build(cfg)
    seen: list[torch.Tensor] = []
    optimizer.register_step_pre_hook(lambda *_: seen.extend(p.grad.to_local().clone() for p in model.parameters()))
    out = train_step(model, optimizer, lambda: next(feed), device=CPU, grad_accum=2, max_grad_norm=0,
                     reshard_after_forward=True, sync_every_micro_step=False)
    out.finish()

    reference, _ = _build(cfg)
    total = sum(reference(input_ids=i, labels=lab, num_items_in_batch=1).loss for i, lab in zip(ids, labels,
                                                                                                strict=True))
    (total / 21).backward()
    assert float(out.loss_sum) == pytest.approx(float(total) / 21, rel=1e-5)
    for got, p in zip(seen, reference.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad.to_local(), rtol=1e-4, atol=1e-7)



# -- padding cut per micro-batch -------------------------------------------------------------------

def test_a_batch_is_cut_after_its_longest_example_rounded_up() -> None:
    labels = np.full((3, 256), IGNORE)
    labels[0, 10:40] = 1  # the longest example's last labelled token is column 69
    labels[1, 60:70] = 1
    labels[2, 5:9] = 1
    assert trimmed_width(labels) == 128 and trimmed_width(labels, multiple=8) == 72
    assert trimmed_width(np.ones((2, 100), dtype=np.int64)) == 100  # raw text: labelled to the end, kept whole
    assert trimmed_width(np.full((2, 256), IGNORE)) == 64  # nothing to learn: the smallest width
    batch = trim_batch({"input_ids": np.arange(3 * 256).reshape(3, 256), "labels": labels})
    assert batch["input_ids"].shape == batch["labels"].shape == (3, 128)
    assert batch["input_ids"].dtype == torch.long and int(batch["input_ids"][1, 5]) == 261


def test_the_cut_batch_gives_the_full_batchs_loss_and_gradients(tok_dir: Path) -> None:
    """What the cut removes is padding after every row's last labelled token: under causal attention
    no earlier position sees it and its labels are ignored, so the step is the same one."""
    cfg = _config(tok_dir, "--max-grad-norm", "0", "--seq-len", "160")
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (2, 160), generator=gen)
    labels = torch.full((2, 160), IGNORE)
    labels[0, 20:50], labels[1, 3:9] = ids[0, 20:50], ids[1, 3:9]
    ids[0, 50:], ids[1, 9:] = 0, 0  # right padding
    cut = trim_batch({"input_ids": ids.numpy(), "labels": labels.numpy()})
    assert cut["input_ids"].shape[1] == 64 < 160

    def step(batch: dict[str, torch.Tensor]) -> tuple[float, list[torch.Tensor]]:
        model, optimizer = _build(cfg)
        grads: list[torch.Tensor] = []
        optimizer.register_step_pre_hook(lambda *_: grads.extend(p.grad.to_local().clone()
                                                                 for p in model.parameters()))
        out = train_step(model, optimizer, lambda: batch, device=CPU, grad_accum=1, max_grad_norm=0,
                         reshard_after_forward=True, sync_every_micro_step=False)
        out.finish()
        return float(out.loss_sum), grads

    (full_loss, full_grads), (cut_loss, cut_grads) = step({"input_ids": ids, "labels": labels}), step(cut)
    assert cut_loss == pytest.approx(full_loss, rel=1e-5)
    for got, want in zip(cut_grads, full_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
