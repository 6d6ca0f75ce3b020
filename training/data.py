"""Training data: synthetic tokens generated on each rank, or a Ray Data pipeline over text files.

``--data random`` is the reference's default (uniform random ids: the point is the collective
traffic; the loss cannot fall below ln(vocab)). ``--data cycle`` walks one fixed cycle of a few token
ids from a random phase per sequence, which a model learns within a few dozen steps: a smoke test
that training trains.
Anything else is a path or ``s3://`` URI of JSONL or Parquet files, read with Ray Data, tokenised
with the model's tokenizer in ``map_batches``, packed into fixed-length sequences and fed to each
rank with ``iter_torch_batches``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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

def data_format(path: str) -> str:
    """parquet or json, from the path (a file, or a directory/prefix whose files say it)."""
    lowered = path.lower().rstrip("/")
    if lowered.endswith((".parquet", ".pq")):
        return "parquet"
    if lowered.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return "json"
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(path) if "://" in path else (pafs.LocalFileSystem(), path)
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


class TokenizeAndPack:
    """Ray Data callable: text rows in, rows of exactly ``seq_len`` token ids out.

    Documents are joined with the EOS token and cut into fixed-length sequences (packing: no
    padding, so every token trains). A class, not a function, so that each data actor loads the
    tokenizer once and carries the unfinished tail of one batch into the next instead of dropping it.
    """

    def __init__(self, tokenizer: str, text_field: str, seq_len: int, revision: str | None = None) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer, revision=revision)
        self.text_field = text_field
        self.seq_len = seq_len
        eos = self.tokenizer.eos_token_id
        self.separator = [] if eos is None else [int(eos)]
        self.tail: list[int] = []

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        texts = [str(t) for t in batch[self.text_field]]
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        stream = self.tail
        for ids in encoded:
            stream.extend(ids)
            stream.extend(self.separator)
        n = len(stream) // self.seq_len
        packed = np.asarray(stream[: n * self.seq_len], dtype=np.int64).reshape(n, self.seq_len)
        self.tail = stream[n * self.seq_len:]
        return {"input_ids": packed}


def build_text_dataset(path: str, *, tokenizer: str, text_field: str, seq_len: int, data_cpus: float,
                       tokenize_actors: int, tokenizer_revision: str | None = None) -> Any:
    """The lazy Ray Data pipeline (read → tokenise+pack); Ray Train splits it across the ranks."""
    import ray.data

    remote = {"num_cpus": data_cpus}
    if data_format(path) == "parquet":
        ds = ray.data.read_parquet(path, ray_remote_args=remote).select_columns([text_field])
    else:
        ds = ray.data.read_json(path, lines=True, ray_remote_args=remote)
    return ds.map_batches(
        TokenizeAndPack, fn_constructor_kwargs={"tokenizer": tokenizer, "text_field": text_field, "seq_len": seq_len,
                                                "revision": tokenizer_revision},
        batch_size=256, batch_format="numpy", num_cpus=data_cpus, concurrency=tokenize_actors)


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
        import torch

        return iter(self.shard.iter_torch_batches(
            batch_size=self.micro_batch, dtypes=torch.long, device=self.device, drop_last=True,
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
                return batch["input_ids"]
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
