"""Supervised fine-tuning data: chat or prompt/completion records into (input_ids, labels) rows.

The format is read from a record's fields (``detect_format``):

* ``messages``: a list of ``{"role", "content"}`` turns, the chat format of transformers' chat
  templates and TRL's "conversational" datasets. Rendered with the tokenizer's own chat template;
  the loss is on the assistant turns only.
* ``prompt`` + ``completion``: TRL's "prompt-completion" format, as strings (the loss is on the
  completion and the EOS after it) or as lists of messages (the loss is on the completion's turns).
* the text field (``text`` unless ``--text-field`` says otherwise): raw text, continued
  pre-training; every token trains (``training.data.TokenizeAndPack`` packs it).

Where the assistant's tokens are: the template is rendered for the conversation up to each
assistant turn with ``add_generation_prompt=True`` and up to the end of that turn; the text between
the two renderings is the turn, as the model will generate it at inference (the prompt ends with the
generation prompt, the answer starts after it). Each segment is tokenised on its own, so no token
straddles a prompt/answer boundary, and a template whose earlier turns change as the conversation
grows (no prefix of the next rendering) is refused rather than mislabelled.

No packing across documents: each example is padded on the right to ``seq_len`` with labels -100.
Under causal attention a real token never attends to the padding after it, so no attention mask
and no position-id reset is needed, and no example sees another. Each micro-batch is cut after its
longest example (``trimmed_width``), so padding costs compute only up to that row's length
(``bench/sft_step.py`` measures both).

The held-out split is decided here, per raw record, from a stable hash of its content
(``document_key``): before tokenising or packing, hence the same whatever Ray Data's block order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

DataMode = Literal["text", "messages", "prompt_completion"]
IGNORE = -100  # the label torch's cross_entropy (and transformers' loss) skips
HELD_OUT_EVERY = 20  # 5 % of the documents go to evaluation
ROLES = ("system", "user", "assistant", "tool", "developer")


class DataFormatError(ValueError):
    """A record the program cannot train on; the message is one line saying what to fix."""


def detect_format(record: Mapping[str, Any], text_field: str = "text") -> DataMode:
    """The data mode a record's fields say (messages wins over prompt/completion over raw text)."""
    if "messages" in record:
        return "messages"
    if "prompt" in record and "completion" in record:
        return "prompt_completion"
    if text_field in record:
        return "text"
    fields = ", ".join(sorted(str(k) for k in record)) or "none"
    raise DataFormatError(f"a record has neither `messages`, `prompt`+`completion` nor `{text_field}` "
                          f"(its fields: {fields}); give chat data, prompt/completion pairs, or set --text-field")


def _turns(value: Any, where: str) -> list[dict[str, str]]:
    """A list of role/content turns, checked (a Parquet/Arrow struct arrives as a dict too)."""
    if not isinstance(value, Sequence) or isinstance(value, str | bytes) or not value:
        raise DataFormatError(f"`{where}` must be a non-empty list of {{role, content}} turns")
    turns = []
    for turn in value:
        if not isinstance(turn, Mapping) or "role" not in turn or "content" not in turn:
            raise DataFormatError(f"each turn of `{where}` needs `role` and `content`")
        if turn["role"] not in ROLES:
            raise DataFormatError(f"`{where}` has a turn with role {turn['role']!r}; roles are {', '.join(ROLES)}")
        if not isinstance(turn["content"], str):
            raise DataFormatError(f"`{where}` has a turn whose content is not a string")
        turns.append({"role": str(turn["role"]), "content": turn["content"]})
    return turns


def document_key(record: Mapping[str, Any], mode: DataMode, text_field: str = "text") -> bytes:
    """The record's content in a canonical form: equal documents give equal keys on any worker."""
    if mode == "messages":
        content: Any = _turns(record["messages"], "messages")
    elif mode == "prompt_completion":
        content = [record["prompt"], record["completion"]]
    else:
        content = str(record[text_field])
    return json.dumps(content, sort_keys=True, ensure_ascii=False).encode()


def is_held_out_document(key: bytes) -> bool:
    """One in ``HELD_OUT_EVERY`` documents, by a hash that is the same in every process (Python's
    ``hash`` is salted per process, so it cannot decide this)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % HELD_OUT_EVERY == 0


def in_split(record: Mapping[str, Any], mode: DataMode, split: str, text_field: str = "text") -> bool:
    held = is_held_out_document(document_key(record, mode, text_field))
    return held if split == "eval" else not held


@dataclass(frozen=True)
class Example:
    """One tokenised document: ids and labels of equal length (labels -100 where no loss)."""

    ids: list[int]
    labels: list[int]

    @property
    def loss_tokens(self) -> int:
        # transformers shifts the labels: the first position is never predicted.
        return sum(1 for label in self.labels[1:] if label != IGNORE)


def _render(tokenizer: Any, turns: list[dict[str, str]], generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=generation_prompt)
    return str(text)


def chat_segments(tokenizer: Any, turns: list[dict[str, str]], trained: Iterable[int]) -> list[tuple[str, bool]]:
    """The rendered conversation cut into (text, is_trained) segments: each trained turn (an index
    into ``turns``, an assistant turn) is the text its rendering adds after the generation prompt."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataFormatError("chat data needs a tokenizer with a chat template (tokenizer_config.json "
                              "`chat_template`); this one has none: use an instruct model's tokenizer")
    segments: list[tuple[str, bool]] = []
    done = ""
    for index in sorted(trained):
        prompt = _render(tokenizer, turns[:index], generation_prompt=True)
        through = _render(tokenizer, turns[: index + 1], generation_prompt=False)
        if not prompt.startswith(done) or not through.startswith(prompt):
            raise DataFormatError("the tokenizer's chat template renders earlier turns differently as the "
                                  "conversation grows, so the assistant's tokens cannot be found; train on "
                                  "single-answer conversations or use another template")
        segments += [(prompt[len(done):], False), (through[len(prompt):], True)]
        done = through
    full = _render(tokenizer, turns, generation_prompt=False)
    if not full.startswith(done):
        raise DataFormatError("the tokenizer's chat template does not render a conversation as the "
                              "concatenation of its turns; the assistant's tokens cannot be found")
    segments.append((full[len(done):], False))
    return [(text, trained_) for text, trained_ in segments if text]


def encode_record(tokenizer: Any, record: Mapping[str, Any], mode: DataMode) -> Example:
    """A chat or prompt/completion record as ids with labels on the trained tokens only."""
    if mode == "messages":
        turns = _turns(record["messages"], "messages")
        trained = [i for i, t in enumerate(turns) if t["role"] == "assistant"]
        if not trained:
            raise DataFormatError("a `messages` record has no assistant turn: nothing to learn from it")
        segments = chat_segments(tokenizer, turns, trained)
    elif isinstance(record["prompt"], str) and isinstance(record["completion"], str):
        eos = tokenizer.eos_token or ""  # the model must learn to stop after the completion
        segments = [(record["prompt"], False), (record["completion"] + eos, True)]
    else:
        prompt = _turns(record["prompt"], "prompt")
        completion = _turns(record["completion"], "completion")
        turns = prompt + completion
        segments = chat_segments(tokenizer, turns, range(len(prompt), len(turns)))
    ids: list[int] = []
    labels: list[int] = []
    for text, is_trained in segments:
        part = [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
        ids += part
        labels += part if is_trained else [IGNORE] * len(part)
    return Example(ids, labels)


# Widths a trimmed batch is rounded up to: few distinct shapes (torch.compile's graphs, the allocator's cache).
TRIM_MULTIPLE = 64


def trimmed_width(labels: Any, multiple: int = TRIM_MULTIPLE) -> int:
    """The columns of a right-padded batch (numpy [rows, seq_len]) that one training step needs: up to the
    last labelled token of any row, rounded up to ``multiple``, at most the full width.

    Under causal attention the columns after it change no earlier position's logits, and their labels
    are ignored, so the step's loss and every gradient are those of the full batch; a batch of short
    conversations padded to --seq-len otherwise computes mostly padding. Raw text is labelled to its
    last column and keeps its width."""
    import numpy as np

    labelled = np.flatnonzero((np.asarray(labels) != IGNORE).any(axis=0))
    last = int(labelled[-1]) + 1 if labelled.size else 1
    return int(min(labels.shape[1], -(-last // multiple) * multiple))


def pad_id(tokenizer: Any) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def pad_examples(examples: Iterable[Example], seq_len: int, pad: int) -> tuple[list[list[int]], list[list[int]],
                                                                               dict[str, int]]:
    """Right-padded rows of exactly ``seq_len``, and counts (truncated, dropped, real, loss tokens)."""
    ids_rows: list[list[int]] = []
    label_rows: list[list[int]] = []
    counts = {"truncated": 0, "dropped": 0, "real_tokens": 0, "loss_tokens": 0, "rows": 0}
    for ex in examples:
        ids, labels = ex.ids[:seq_len], ex.labels[:seq_len]
        if len(ex.ids) > seq_len:
            counts["truncated"] += 1
        cut = Example(ids, labels)
        if not cut.loss_tokens:
            counts["dropped"] += 1
            continue
        fill = seq_len - len(ids)
        ids_rows.append(ids + [pad] * fill)
        label_rows.append(labels + [IGNORE] * fill)
        counts["real_tokens"] += len(ids)
        counts["loss_tokens"] += cut.loss_tokens
        counts["rows"] += 1
    return ids_rows, label_rows, counts
