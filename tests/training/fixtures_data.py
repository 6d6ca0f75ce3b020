"""Small local data for the training tests: a learnable text corpus and a tokenizer trained on it."""

from __future__ import annotations

import json
from pathlib import Path

# Two sentences in a fixed order: every next word is (nearly) determined by the last, so a tiny
# model's loss falls fast; both files formats and the tokenizer are built from this text.
SENTENCES = ("the quick brown fox jumps over the lazy dog .", "a small red hen pecks at seven grey stones .")


def documents(n: int = 120) -> list[str]:
    return [" ".join(SENTENCES[(i + j) % 2] for j in range(6)) for i in range(n)]


def write_jsonl(path: Path, n: int = 120) -> Path:
    path.write_text("".join(json.dumps({"text": doc, "id": i}) + "\n" for i, doc in enumerate(documents(n))))
    return path


def write_parquet(path: Path, n: int = 120) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": documents(n)}), path)
    return path


def build_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer trained on the corpus, saved as a PreTrainedTokenizerFast dir."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(documents(), trainers.WordLevelTrainer(special_tokens=["<unk>", "<eos>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.save_pretrained(str(directory))
    return directory
