"""The run's product: a Hugging Face model directory gathered from the FSDP2 shards.

Every rank calls ``export_model`` (the gather is a collective); rank 0 alone writes. What the
pieces guarantee, read in their sources (torch 2.13, huggingface_hub 1.x, transformers 5.x):

* ``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))``
  walks the state dict one tensor at a time (``torch.distributed._state_dict_utils._iterate_state_dict``):
  each DTensor is all-gathered on its device (``full_tensor``), then moved to host memory on rank 0
  only (``ranks_only=(0,)``); every other rank drops it. ``gather_full_state_dict`` does the same
  walk with DTensor's public ``full_tensor`` and two differences that matter for the memory bound:
  each rank casts its shard to the saved dtype before the gather (the gather moves, and rank 0
  holds, one copy of the model in the dtype it is saved in, never the fp32 master copy), and it skips the tied
  ``lm_head.weight`` (``get_model_state_dict`` lists it beside ``model.embed_tokens.weight`` and
  gathers the same embedding twice: 0.93 GB more for Qwen2.5-1.5B). The device holds one full
  tensor at a time beside its shards.
* ``huggingface_hub.save_torch_state_dict`` writes ``model.safetensors``, or shards of at most
  ``max_shard_size`` with ``model.safetensors.index.json`` when the model is larger: the layout
  ``from_pretrained`` reads.

A directory is written under a temporary name ending in ``.incomplete-…`` and renamed into place
only once every file and the marker ``rtui_model.json`` are written, so an export interrupted
(teardown, a full disk) leaves a directory that says it is incomplete and is never offered as the
model (``find_models`` looks for the marker in a directory without that suffix).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

MODEL_MARKER = "rtui_model.json"
# rtui's own files live in a subdirectory: vLLM's default loader globs ``*.safetensors`` in the model
# directory itself and loads every one it finds (default_loader.py ``_prepare_weights``), transformers
# reads its files by name; neither looks below. The marker stays on top: it is the commit mark every
# store looks for (a .json no loader reads), written last and renamed into place with the directory.
RTUI_DIR = "rtui"
CHECK_FILE = f"{RTUI_DIR}/check.safetensors"  # the fixed input and the logits the trained model gave for it
INCOMPLETE = ".incomplete-"
FINAL_NAME = "model"
MAX_SHARD_SIZE = "5GB"
CHECK_SEQ_LEN = 16


class ExportError(RuntimeError):
    """The model could not be written; the message says why and what to do, in one line."""


def export_name(step: int, final: bool) -> str:
    return FINAL_NAME if final else f"model-step-{step:08d}"


@dataclass(frozen=True)
class ExportInfo:
    """What ``rtui_model.json`` records (and the job's summary repeats under ``model``)."""

    format: str
    step: int
    final: bool
    dtype: str
    files: list[str]
    bytes: int
    export_s: float
    state_bytes: int  # the one full copy rank 0 held in host memory
    tokenizer: bool
    eval: dict[str, Any] = field(default_factory=dict)
    uri: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)


def check_input(vocab: int, seq_len: int = CHECK_SEQ_LEN) -> Any:
    """A fixed (1, seq_len) input: the same on every rank and in every test that checks the export."""
    import torch

    return torch.randint(0, vocab, (1, seq_len), generator=torch.Generator().manual_seed(1234))


def reference_logits(model: Any, device: Any) -> tuple[Any, Any]:
    """(input_ids, logits on CPU in fp32) of the trained model; every rank must call it (FSDP forward)."""
    import torch

    ids = check_input(int(model.config.vocab_size))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=ids.to(device)).logits.float().cpu()
    finally:
        model.train(was_training)
    return ids, logits


def gather_full_state_dict(model: Any, dtype: Any = None, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The whole model's tensors on rank 0's host, cast to ``dtype`` one at a time (an empty dict on
    the other ranks). Every rank must call it with the same ``skip``: each gather is a collective."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    keep = not dist.is_initialized() or dist.get_rank() == 0
    state: dict[str, Any] = {}
    for name, value in model.state_dict().items():
        if name in skip:
            continue
        if dtype is not None and value.is_floating_point() and value.dtype != dtype:
            # Each rank casts its own shard first: the all-gather then moves and holds the saved dtype
            # (half the bytes of the fp32 master weights for a bf16 save), on the wire and on rank 0.
            value = value.detach().to(dtype)
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if keep:
            state[name] = full.detach().to("cpu")
        del full  # the device's full copy of this tensor goes before the next is gathered
    return state


def _nbytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def _dir_files(directory: str) -> tuple[list[str], int]:
    """Every file under ``directory`` as a ``/``-separated relative name (rtui's subdirectory included)."""
    names = sorted(os.path.relpath(os.path.join(root, n), directory).replace(os.sep, "/")
                   for root, _dirs, files in os.walk(directory) for n in files)
    return names, sum(os.path.getsize(os.path.join(directory, n)) for n in names)


@contextlib.contextmanager
def _quiet(logger_name: str) -> Any:
    """The logger ``logger_name`` says warnings and errors only, for the block."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def export_model(model: Any, root: str, *, rank: int, step: int, final: bool, dtype: Any,
                 tokenizer: str | None = None, tokenizer_revision: str | None = None,
                 check: tuple[Any, Any] | None = None,
                 evaluation: dict[str, Any] | None = None, max_shard_size: str | int = MAX_SHARD_SIZE,
                 before_publish: Any = None) -> ExportInfo | None:
    """Gather the model (every rank) and write it as ``root/<name>`` (rank 0); rank 0 gets the info.

    ``check`` is (input_ids, logits) from ``reference_logits``, stored in rtui's subdirectory (not
    beside the weights, where vLLM would load it) so anyone can verify the directory reproduces the
    trained model. ``before_publish`` (tests) runs on the finished
    temporary directory just before it is renamed into place.
    """
    started = time.monotonic()
    # Tied weights are the embedding's: saved once, tied again on load.
    tied = ("lm_head.weight",) if getattr(model.config, "tie_word_embeddings", False) else ()
    state = gather_full_state_dict(model, dtype, skip=tied)
    if rank != 0:
        return None
    import copy

    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    config = copy.deepcopy(model.config)
    config.use_cache = True  # training turned the KV cache off; generation wants it
    config.dtype = dtype
    state_bytes = _nbytes(state)
    name = export_name(step, final)
    remote = root.startswith("s3://")
    if not remote:
        os.makedirs(root, mode=0o700, exist_ok=True)
    # 0700; for S3 a local staging dir, uploaded once complete
    tmp = tempfile.mkdtemp(prefix=f".{name}{INCOMPLETE}", dir=None if remote else root)
    try:
        config.save_pretrained(tmp)
        generation = getattr(model, "generation_config", None) or GenerationConfig.from_model_config(config)
        generation.save_pretrained(tmp)
        # The hub says "saved to <the staging dir>!" at INFO; the job says where the model ends up, once.
        # (Its logger is named by its module's file path, so it hangs off the root logger.)
        with _quiet(sys.modules[save_torch_state_dict.__module__].__file__ or ""):
            save_torch_state_dict(state, tmp, max_shard_size=max_shard_size, safe_serialization=True)
        del state
        if tokenizer:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(tokenizer, revision=tokenizer_revision).save_pretrained(tmp)
        if check is not None:
            os.makedirs(os.path.join(tmp, RTUI_DIR), mode=0o700, exist_ok=True)
            save_file({"input_ids": check[0].contiguous(), "logits": check[1].contiguous()},
                      os.path.join(tmp, CHECK_FILE))
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # a partial export only takes the space others need
        raise ExportError(f"the volume holding {root} is full: the model needs about {state_bytes:,} bytes; "
                          "free space there or give the run more storage (--storage-size)") from None
    files, size = _dir_files(tmp)
    info = ExportInfo(format="hf", step=step, final=final, dtype=str(dtype).removeprefix("torch."),
                      files=[*files, MODEL_MARKER], bytes=size, export_s=0.0, state_bytes=state_bytes,
                      tokenizer=bool(tokenizer), eval=dict(evaluation or {}))
    info = ExportInfo(**{**asdict(info), "export_s": round(time.monotonic() - started, 3)})
    with open(os.path.join(tmp, MODEL_MARKER), "w") as f:
        f.write(info.to_json())
        f.flush()
        os.fsync(f.fileno())
    if before_publish is not None:
        before_publish(tmp)
    if remote:
        try:
            uri = upload_dir(tmp, f"{root.rstrip('/')}/{name}", info.files)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return ExportInfo(**{**asdict(info), "uri": uri})
    final_dir = os.path.join(root, name)
    if os.path.exists(final_dir):  # an earlier export of the same name: swap, then drop the old one
        old = tempfile.mkdtemp(prefix=f".{name}.old-", dir=root)
        os.rename(final_dir, os.path.join(old, name))
        os.rename(tmp, final_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final_dir)
    return ExportInfo(**{**asdict(info), "uri": final_dir})


def split_s3(uri: str) -> tuple[str, str]:
    """(bucket, key prefix without a trailing slash) of ``s3://bucket/prefix``."""
    rest = uri.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


def upload_dir(directory: str, uri: str, files: list[str]) -> str:
    """Upload ``files`` of ``directory`` under ``uri`` with boto3 (multipart for large shards), the
    marker last: a prefix without ``rtui_model.json`` is an export that did not finish and is never
    offered. Credentials and endpoint come from boto3's own chain (a pod's service account, an
    instance role, ``AWS_ENDPOINT_URL``)."""
    import boto3

    bucket, prefix = split_s3(uri)
    s3 = boto3.client("s3")
    for name in sorted(files, key=lambda n: n == MODEL_MARKER):
        s3.upload_file(os.path.join(directory, name), bucket, f"{prefix}/{name}" if prefix else name)
    return f"s3://{bucket}/{prefix}"


def read_marker(directory: str) -> ExportInfo | None:
    """The export's info when ``directory`` is a complete rtui model directory, else None."""
    if INCOMPLETE in os.path.basename(directory.rstrip("/")):
        return None
    try:
        with open(os.path.join(directory, MODEL_MARKER)) as f:
            raw = json.load(f)
        info = ExportInfo(**raw)
    except (OSError, ValueError, TypeError):
        return None
    if not all(os.path.isfile(os.path.join(directory, n)) for n in info.files):
        return None
    return ExportInfo(**{**asdict(info), "uri": directory})


def find_models(root: str) -> list[ExportInfo]:
    """Every complete model directory directly under ``root``: the final one first, then the
    periodic exports newest first. Incomplete directories are never listed."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    found = [info for n in names if not n.startswith(".") and (info := read_marker(os.path.join(root, n)))]
    return sorted(found, key=lambda i: (not i.final, -i.step))
