"""The data file is checked at plan time (issue 36, item 1): its format from the fields, a few records
tokenised with the tokenizer, one line with what to do when it cannot train."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.datacheck import check_data
from backend.errors import UserError
from backend.resolve import resolve_config
from tests.training.fixtures_chat import build_chat_tokenizer, write_chat_jsonl


def test_a_file_the_job_cannot_train_on_is_refused_at_plan_time(tmp_path: Path) -> None:
    """Before: planned and started; the job died with KeyError: 'text' in a Ray Data worker."""
    tok = build_chat_tokenizer(tmp_path / "tok")
    (tmp_path / "qa.jsonl").write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    with pytest.raises(UserError, match=r"--data .*qa.jsonl\"?: a record has neither `messages`") as err:
        resolve_config({"data": "qa.jsonl", "tokenizer": str(tok)}, environ={}, cwd=tmp_path)
    assert "\n" not in str(err.value)
    (tmp_path / "noanswer.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "w1"}]}) + "\n")
    with pytest.raises(UserError, match="record 1: a `messages` record has no assistant turn"):
        resolve_config({"data": "noanswer.jsonl", "tokenizer": str(tok)}, environ={}, cwd=tmp_path)
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    with pytest.raises(UserError, match="line 1 is not JSON"):
        resolve_config({"data": "broken.jsonl", "tokenizer": str(tok)}, environ={}, cwd=tmp_path)


def test_chat_data_is_tokenised_through_the_template_at_plan_time(tmp_path: Path) -> None:
    tok = build_chat_tokenizer(tmp_path / "tok")
    data = write_chat_jsonl(tmp_path / "chat.jsonl", n=40)
    resolve_config({"data": str(data), "tokenizer": str(tok)}, environ={}, cwd=tmp_path)
    facts = check_data(str(data), text_field="text", tokenizer=str(tok), seq_len=16, cwd=tmp_path)
    assert facts.mode == "messages" and facts.sampled == 16
    assert facts.loss_tokens_per_record == 2  # the answer word and the end marker
    assert facts.truncated == 16 and "longer than --seq-len" in facts.describe()
    offline = check_data(str(data), text_field="text", tokenizer="no-such/tokenizer", seq_len=64, cwd=tmp_path)
    assert offline.tokens_per_record is None and "not tokenised" in offline.describe()


def test_the_plan_says_the_data_format_its_tokens_and_the_steps_per_epoch(tmp_path: Path) -> None:
    from backend.jobspec import describe_step_plan

    tok = build_chat_tokenizer(tmp_path / "tok")
    data = write_chat_jsonl(tmp_path / "chat.jsonl", n=400)
    config = resolve_config({"data": str(data), "tokenizer": str(tok), "seq_len": "32", "batch_size": "4",
                             "num_workers": "2"}, environ={}, cwd=tmp_path).config
    line = describe_step_plan(config)
    # 400 records, 380 trained on, one padded row of 32 each; 4 × 32 × 2 = 256 tokens per step.
    assert "data: messages records, ~17 tokens each (~2 trained)" in line, line
    records = int(line.split("; ~")[-1].split(" records")[0].replace(",", ""))
    assert 360 <= records <= 440, line
    assert f"~{records * 0.95 * 32 / 256:,.0f} steps per epoch" in line, line
