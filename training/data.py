"""Training data: synthetic tokens generated on each rank, or a Ray Data pipeline over text files.

``--data random`` is the reference's default (uniform random ids: the point is the collective
traffic; the loss cannot fall below ln(vocab)). ``--data cycle`` walks one fixed cycle of a few token
ids from a random phase per sequence, which a model learns within a few dozen steps: a smoke test
that training trains.
Anything else is a path, ``s3://`` URI or Hub dataset (``hf://datasets/ID@COMMIT/PATH``: read through
huggingface_hub's ``HfFileSystem`` at that commit, which Ray Data's docs advise for Hub datasets:
``read_parquet`` with ``filesystem=HfFileSystem()``) of JSONL or Parquet files, read with Ray Data, split by
document into training and held-out records, tokenised with the model's tokenizer in
``map_batches`` (raw text packed into fixed-length sequences; chat and prompt/completion records
through the chat template, one padded row each, labelled on the answers: ``training.sft``) and fed
to each rank with ``iter_torch_batches`` as ``{"input_ids", "labels"}``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from training.sft import (
    DataFormatError,
    DataMode,
    detect_format,
    encode_record,
    in_split,
    pad_examples,
    pad_id,
    trimmed_width,
)

SYNTHETIC = ("random", "cycle")
CYCLE_LENGTH = 8  # eight bigrams to learn: a tiny model gets them within ~20 steps


def is_synthetic(data: str) -> bool:
    return data in SYNTHETIC


class SyntheticTokens:
    """Per-rank generator of (micro_batch, seq_len) id batches; its state is checkpointable."""

    def __init__(self, kind: str, vocab: int, micro_batch: int, seq_len: int, seed: int, rank: int) -> None:
        import torch

        self.kind, self.vocab, self.micro_batch, self.seq_len = kind, vocab, micro_batch, seq_len
        # The cycle is the same on every rank (it is the thing to learn); the stream is per rank.
        self.cycle = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:CYCLE_LENGTH]
        self.generator = torch.Generator().manual_seed(seed * 1000 + rank)

    def next_batch(self) -> Any:
        import torch

        shape = (self.micro_batch, self.seq_len)
        if self.kind == "random":
            return torch.randint(0, self.vocab, shape, generator=self.generator)
        phase = torch.randint(0, CYCLE_LENGTH, (self.micro_batch, 1), generator=self.generator)
        positions = (phase + torch.arange(self.seq_len)) % CYCLE_LENGTH
        return self.cycle[positions]

    def state(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])


# -- Ray Data ------------------------------------------------------------------------------------

HF_SCHEME = "hf://"


def _filesystem(path: str) -> tuple[Any, str]:
    """The pyarrow file system of ``path`` and the path within it."""
    import pyarrow.fs as pafs

    if path.startswith(HF_SCHEME):
        import os

        from huggingface_hub import HfFileSystem

        # HF_ENDPOINT read now (huggingface_hub reads it once, at import): a mirror, or a test's Hub.
        hub = HfFileSystem(endpoint=os.environ.get("HF_ENDPOINT") or None)
        return pafs.PyFileSystem(pafs.FSSpecHandler(hub)), path[len(HF_SCHEME):]
    if "://" in path:
        fs, root = pafs.FileSystem.from_uri(path)
        return fs, str(root)
    return pafs.LocalFileSystem(), path


def data_format(path: str) -> str:
    """parquet or json, from the path (a file, or a directory/prefix whose files say it)."""
    lowered = path.lower().rstrip("/")
    if lowered.endswith((".parquet", ".pq")):
        return "parquet"
    if lowered.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return "json"
    import pyarrow.fs as pafs

    fs, root = _filesystem(path)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    except (OSError, FileNotFoundError) as exc:
        raise ValueError(f"--data {path}: cannot list it ({exc})") from None
    names = [i.path.lower() for i in infos if i.type == pafs.FileType.File]
    if any(n.endswith((".parquet", ".pq")) for n in names):
        return "parquet"
    if any(n.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")) for n in names):
        return "json"
    raise ValueError(f"--data {path}: no .jsonl/.json or .parquet files found")


def _data_files(path: str) -> tuple[Any, list[str]]:
    """The file system and the data files under ``path`` (itself when it is a file), sorted."""
    import pyarrow.fs as pafs

    fs, root = _filesystem(path)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        return fs, [root]
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    suffixes = (".parquet", ".pq", ".jsonl", ".json", ".jsonl.gz", ".json.gz")
    return fs, sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.lower().endswith(suffixes))


def peek_records(path: str, n: int = 8) -> list[dict[str, Any]]:
    """The first ``n`` records of the first data file (a few kB read, also from s3://): enough to tell
    the format and check it before a job starts."""
    import json

    fs, files = _data_files(path)
    if not files:
        raise ValueError(f"--data {path}: no .jsonl/.json or .parquet files found")
    first = files[0]
    if data_format(first) == "parquet":
        import pyarrow.parquet as pq

        with fs.open_input_file(first) as handle:
            batch = next(pq.ParquetFile(handle).iter_batches(batch_size=n), None)
            return [] if batch is None else list(batch.to_pylist())
    records: list[dict[str, Any]] = []
    with fs.open_input_stream(first, compression="detect") as stream:
        buffered = b""
        while len(records) < n:
            chunk = stream.read(1 << 16)
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for number, line in enumerate(lines, start=len(records) + 1):
                if line.strip() and len(records) < n:
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"--data {first}: line {number} is not JSON ({exc.msg})") from None
            if not chunk:
                if buffered.strip() and len(records) < n:
                    records.append(json.loads(buffered))
                break
    return records


def detect_data_mode(path: str, text_field: str) -> DataMode:
    """The data mode of a file set, from its first record's fields."""
    records = peek_records(path, 1)
    if not records:
        raise ValueError(f"--data {path}: the first data file holds no records")
    return detect_format(records[0], text_field)


class TokenizeAndPack:
    """Ray Data callable: raw records in, rows of exactly ``seq_len`` ids and labels out.

    Each record first goes to its split (``training.sft.in_split``: a hash of the raw record, so the
    held-out documents are the same whatever the block order, and never reach the training split).
    Then by mode: raw text is joined with the EOS token and cut into fixed-length sequences (packing,
    labels = ids: continued pre-training trains on every token); chat and prompt/completion records
    become one right-padded row each, labelled on the assistant's tokens only (``training.sft``).
    A class, not a function, so that each data actor loads the tokenizer once and carries the
    unfinished tail of one batch into the next instead of dropping it.
    """

    def __init__(self, tokenizer: str, text_field: str, seq_len: int, revision: str | None = None,
                 mode: DataMode = "text", split: str = "train") -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer, revision=revision)
        self.text_field, self.seq_len, self.mode, self.split = text_field, seq_len, mode, split
        eos = self.tokenizer.eos_token_id
        self.separator = [] if eos is None else [int(eos)]
        self.pad = pad_id(self.tokenizer)
        self.tail: list[int] = []

    def _records(self, batch: Any) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = batch.to_pylist() if hasattr(batch, "to_pylist") else [
            dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
        for row in rows:
            if detect_format(row, self.text_field) != self.mode:
                raise DataFormatError(f"the data mixes formats: a {detect_format(row, self.text_field)} record "
                                      f"in {self.mode} data; keep one format per --data")
        return [r for r in rows if in_split(r, self.mode, self.split, self.text_field)]

    def __call__(self, batch: Any) -> dict[str, Any]:
        import numpy as np

        records = self._records(batch)
        if self.mode != "text":
            ids, labels, _ = pad_examples((encode_record(self.tokenizer, r, self.mode) for r in records),
                                          self.seq_len, self.pad)
            shaped = (len(ids), self.seq_len)
            return {"input_ids": np.asarray(ids, dtype=np.int64).reshape(shaped),
                    "labels": np.asarray(labels, dtype=np.int64).reshape(shaped)}
        texts = [str(r[self.text_field]) for r in records]
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        stream = self.tail
        for ids_ in encoded:
            stream.extend(ids_)
            stream.extend(self.separator)
        n = len(stream) // self.seq_len
        packed = np.asarray(stream[: n * self.seq_len], dtype=np.int64).reshape(n, self.seq_len)
        self.tail = stream[n * self.seq_len:]
        return {"input_ids": packed, "labels": packed.copy()}


def build_text_dataset(path: str, *, tokenizer: str, text_field: str, seq_len: int, data_cpus: float,
                       tokenize_actors: int, tokenizer_revision: str | None = None, split: str = "train",
                       mode: DataMode | None = None, override_num_blocks: int | None = None) -> Any:
    """The lazy Ray Data pipeline of one split (read → split by document → tokenise+pack/pad); Ray
    Train splits it across the ranks. Train and eval read the file each; each record goes to one."""
    import ray.data

    mode = mode or detect_data_mode(path, text_field)
    remote = {"num_cpus": data_cpus}
    # A Hub dataset goes to Ray Data as its file system and files (each read task reads its own, at the commit).
    fs, files = _data_files(path) if path.startswith(HF_SCHEME) else (None, [path])
    if data_format(path) == "parquet":
        columns = {"messages": ["messages"], "prompt_completion": ["prompt", "completion"]}.get(mode, [text_field])
        ds = ray.data.read_parquet(files, filesystem=fs, ray_remote_args=remote,
                                   override_num_blocks=override_num_blocks).select_columns(columns)
    else:
        ds = ray.data.read_json(files, filesystem=fs, lines=True, ray_remote_args=remote,
                                override_num_blocks=override_num_blocks)
    return ds.map_batches(
        TokenizeAndPack, fn_constructor_kwargs={"tokenizer": tokenizer, "text_field": text_field, "seq_len": seq_len,
                                                "revision": tokenizer_revision, "mode": mode, "split": split},
        batch_size=256, batch_format="pyarrow", num_cpus=data_cpus, concurrency=tokenize_actors)


class ShardBatches:
    """Micro-batches from this rank's dataset shard, epoch after epoch, with a resumable position.

    The position is (epoch, batches taken in that epoch). Ray Data's streaming split does not
    promise the same rows to the same rank on a rerun, so a resume skips the right *number* of
    batches on each rank (the step count and the tokens seen are exact, the row identity is not).
    """

    def __init__(self, shard: Any, micro_batch: int, device: Any, prefetch: int = 2) -> None:
        self.shard, self.micro_batch, self.device, self.prefetch = shard, micro_batch, device, prefetch
        self.epoch = 0
        self.taken = 0
        self._iter: Iterator[Any] | None = None
        self._skip = 0

    def _open(self) -> Iterator[Any]:
        return iter(self.shard.iter_torch_batches(
            batch_size=self.micro_batch, collate_fn=trimming_collate(), device=self.device, drop_last=True,
            prefetch_batches=self.prefetch))

    def next_batch(self) -> Any:
        for _attempt in range(2):
            if self._iter is None:
                self._iter = self._open()
                while self._skip:
                    if next(self._iter, None) is None:
                        raise RuntimeError("the dataset has fewer batches than the checkpoint's data position")
                    self._skip -= 1
            batch = next(self._iter, None)
            if batch is not None:
                self.taken += 1
                return batch
            self.epoch += 1  # every rank's shard holds the same number of rows, so they roll over together
            self.taken = 0
            self._iter = None
        raise RuntimeError("the dataset yields no full micro-batch: it holds fewer than "
                           "micro_batch × seq_len tokens per rank")

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "taken": self.taken}

    def load_state(self, state: dict[str, Any]) -> None:
        # Ray Data restarts each epoch from the top; earlier epochs need no replay.
        self.epoch, self.taken, self._skip = int(state["epoch"]), int(state["taken"]), int(state["taken"])


def trim_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """A numpy ``{"input_ids", "labels"}`` batch as long tensors, cut after its longest example
    (``training.sft.trimmed_width``): same loss and gradients, less padding computed."""
    import torch

    width = trimmed_width(batch["labels"])
    return {key: torch.as_tensor(batch[key][:, :width], dtype=torch.long) for key in ("input_ids", "labels")}


def trimming_collate() -> Any:
    """``trim_batch`` as Ray Data's collate function: it runs on the CPU in Ray's prefetch thread, before
    the batch is moved to the device, so the width is known without a device sync."""
    from ray.data.collate_fn import NumpyBatchCollateFn

    class TrimmingCollate(NumpyBatchCollateFn):
        # Ray annotates the return with an unbound TypeVar (ray.data.dataset.CollatedData): any output is allowed.
        def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
            return trim_batch(batch)

    return TrimmingCollate()

