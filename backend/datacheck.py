"""The training data, checked at plan time: a file the job cannot train on is one line now, not a
traceback from a Ray Data worker 25 s into the job.

Reads only the first records of the first data file (a local file; an s3:// object through pyarrow,
a few kB), finds the format from their fields (``training.sft.detect_format``), and when the
tokenizer is on this machine (a local dir, or a hub id already in the cache: no download at plan
time) tokenises them as the job would: chat records through the tokenizer's chat template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.errors import UserError
from backend.safepath import shown
from training.data import peek_records  # stdlib at import (pyarrow inside, when a file is read)
from training.sft import HELD_OUT_EVERY, DataFormatError, detect_format, encode_record

SAMPLE = 16  # records read and tokenised at plan time


@dataclass(frozen=True)
class DataFacts:
    mode: str  # text, messages or prompt_completion
    sampled: int
    tokens_per_record: float | None  # None: the tokenizer is not on this machine, nothing tokenised
    loss_tokens_per_record: float | None
    truncated: int  # sampled records longer than --seq-len
    records: int | None = None  # estimated from the local files' size and the sample's bytes per record
    unread: str = ""  # a remote file this machine could not read: why (the job reads it with its own credentials)

    def train_tokens(self) -> float | None:
        """Token slots one epoch of the training split fills (held-out documents excluded): a padded
        row of ``seq_len`` per chat example, the packed tokens for raw text."""
        if self.records is None or self.tokens_per_record is None:
            return None
        return self.records * (1 - 1 / HELD_OUT_EVERY) * self.tokens_per_record

    def describe(self, seq_len: int = 0, tokens_per_step: int = 0) -> str:
        if self.unread:
            return f"not read at plan time ({self.unread}): the job reads it with the cluster's credentials"
        if self.tokens_per_record is None:
            return f"{self.mode} records (tokenizer not on this machine: not tokenised at plan time)"
        line = (f"{self.mode} records, ~{self.tokens_per_record:.0f} tokens each "
                f"(~{self.loss_tokens_per_record:.0f} trained) over {self.sampled} sampled"
                + (f"; {self.truncated} longer than --seq-len, cut" if self.truncated else ""))
        if self.records is not None and tokens_per_step:
            rows = self.records * (1 - 1 / HELD_OUT_EVERY)
            tokens = rows * seq_len if self.mode != "text" else rows * self.tokens_per_record
            line += f"; ~{self.records:,} records, ~{tokens / tokens_per_step:,.0f} steps per epoch"
        return line


def _local_tokenizer(source: str | None, cwd: Path) -> Any:
    """The tokenizer when it is on this machine, else None (plan time never downloads)."""
    if not source:
        return None
    from transformers import AutoTokenizer  # lazy: ~1 s, only when the tokenizer is looked for

    path = (cwd / Path(source).expanduser())
    try:
        if path.is_dir():
            return AutoTokenizer.from_pretrained(str(path))
        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError):
        return None


def check_data(data: str, *, text_field: str, tokenizer: str | None, seq_len: int, cwd: Path) -> DataFacts:
    """Format, fields and a few records tokenised; a UserError (one line, what to do) when wrong."""
    where = f"--data {shown(data)}"
    try:
        records = peek_records(data, SAMPLE)
    except (OSError, ValueError) as exc:
        why = str(exc).splitlines()[0]
        if "://" in data:  # this machine's network or credentials are not the cluster's: said, not refused
            return DataFacts("unknown", 0, None, None, 0, unread=why[:160])
        raise UserError(f"{where}: cannot read it ({why})",
                        remedy="give JSONL (one JSON object per line) or Parquet files") from None
    if not records:
        raise UserError(f"{where}: holds no records", remedy="give a file with at least one record")
    try:
        mode = detect_format(records[0], text_field)
        for number, record in enumerate(records, start=1):
            if detect_format(record, text_field) != mode:
                raise DataFormatError(f"record {number} is {detect_format(record, text_field)}, the first is {mode}")
    except DataFormatError as exc:
        raise UserError(f"{where}: {exc}",
                        remedy='use {"messages": [{"role", "content"}, ...]}, {"prompt", "completion"} or '
                               "a text field (--text-field)") from None
    tok = _local_tokenizer(tokenizer, cwd)
    if tok is None:
        return DataFacts(mode, len(records), None, None, 0)
    total = loss = truncated = 0
    for number, record in enumerate(records, start=1):
        try:
            if mode == "text":
                ids = tok(str(record[text_field]), add_special_tokens=False)["input_ids"]
                n, trained = len(ids), len(ids)
            else:
                example = encode_record(tok, record, mode)
                n, trained = len(example.ids), example.loss_tokens
        except DataFormatError as exc:
            raise UserError(f"{where}: record {number}: {exc}",
                            remedy="fix the record, or use a tokenizer with a chat template (--tokenizer)") from None
        total, loss, truncated = total + n, loss + trained, truncated + (n > seq_len)
    return DataFacts(mode, len(records), total / len(records), loss / len(records), truncated,
                     _records_estimate(data, records))


def _records_estimate(data: str, sample: list[dict[str, Any]]) -> int | None:
    """Records in local JSONL files, from their size over the sample's JSON bytes per record (no full
    read of a large file at plan time); None for s3, Parquet and compressed files."""
    if "://" in data:
        return None
    root = Path(data)
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.suffix in (".jsonl", ".json")]
    if not files or any(p.suffix not in (".jsonl", ".json") for p in files):
        return None
    per_record = sum(len(json.dumps(r, ensure_ascii=False)) + 1 for r in sample) / len(sample)
    return max(1, round(sum(p.stat().st_size for p in files) / per_record))
