"""Chat data whose answers follow a rule, and a word-level tokenizer with a chat template built here.

The user turns are random words; the assistant answers with one word, ``RULE[last word of the
user]``. A model that learns from the answers learns the mapping; the user turns are noise that
nothing can learn, so a model trained on every token spends most of its loss on them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

WORDS = [f"w{i}" for i in range(24)]
ANSWERS = [f"a{i}" for i in range(24)]
RULE = dict(zip(WORDS, reversed(ANSWERS), strict=True))  # a fixed mapping, not an identity
SPECIALS = ["<unk>", "<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

# The template in the shape of transformers' chat templates (Jinja over `messages`, with
# `add_generation_prompt`), like ChatML: a role header, the content, an end marker per turn.
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|> {% endif %}")


def conversation(rng: random.Random, words: int = 12) -> list[dict[str, str]]:
    question = [rng.choice(WORDS) for _ in range(words)]
    return [{"role": "user", "content": " ".join(question)},
            {"role": "assistant", "content": RULE[question[-1]]}]


def write_chat_jsonl(path: Path, n: int = 400, seed: int = 0) -> Path:
    rng = random.Random(seed)
    path.write_text("".join(json.dumps({"messages": conversation(rng)}) + "\n" for _ in range(n)))
    return path


def build_chat_tokenizer(directory: Path) -> Path:
    """A word-level PreTrainedTokenizerFast with the chat template, saved as a tokenizer dir."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(SPECIALS + WORDS + ANSWERS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", pad_token="<pad>",
                                   additional_special_tokens=SPECIALS[3:])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))
    return directory


def load(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))
