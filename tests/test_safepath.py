"""Names from a remote listing land under ``--to`` or nowhere (issue 33, item 2): ``backend.safepath``.

An S3 key is any UTF-8 string up to 1,024 bytes (Amazon S3 user guide, "Naming Amazon S3 objects"),
and a marker or a reader pod's listing is text someone else wrote; POSIX resolves ``..`` and follows
symlinks on every component of a path (open(2): ``O_NOFOLLOW`` refuses only a final symlink), so each
name is checked as a path of plain segments and every directory on its way is looked at.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from backend.delivery import LocalDirStore, copy_model_dir
from backend.safepath import UnsafeName, name_problem, plan_writes
from training.export import MODEL_MARKER, ExportInfo


@pytest.mark.parametrize(("name", "why"), [
    ("", "empty"), ("/etc/passwd", "absolute"), ("../x", "'..'"), ("a/../../x", "'..'"), ("a/..", "'..'"),
    ("./x", "'.'"), ("a//b", "empty segment"), ("a/", "empty segment"), ("a\\..\\b", "backslash"),
    ("a\0b", "NUL"), ("a\nb", "control"), ("a\x7fb", "control"), ("a\x9bb", "control"), ("\udc80", "UTF-8"),
    ("x" * 256, "longer than 255"), (7, "not a string"),
])
def test_a_name_that_is_not_plain_relative_segments_is_refused(name: object, why: str) -> None:
    problem = name_problem(name)
    assert problem is not None and why in problem


@pytest.mark.parametrize("name", ["model.safetensors", ".hidden", "..dots", "a..b", "sub/dir/tokenizer.json",
                                  "ünïcode €.bin", "x" * 255])
def test_a_plain_name_passes(name: str) -> None:
    assert name_problem(name) is None


def test_a_name_that_is_also_a_directory_of_another_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeName, match='"a" is listed both as a file and as a directory'):
        plan_writes(tmp_path, ["a/b", "a"], source="s3://b/p")


def _source(tmp_path: Path, files: dict[str, bytes]) -> tuple[Path, ExportInfo]:
    source = tmp_path / "data" / "job" / "model"
    source.mkdir(parents=True)
    for name, data in files.items():
        (source / name).write_bytes(data)
    info = ExportInfo(format="hf", step=1, final=True, dtype="bf16", files=sorted(files), bytes=1, export_s=0.0,
                      state_bytes=0, tokenizer=False, uri=str(source))
    return source, info


def test_a_stale_part_file_that_is_a_symlink_is_replaced_not_written_through(tmp_path: Path) -> None:
    """The copy writes ``.NAME.part`` first: a link left there must not carry the bytes elsewhere."""
    source, info = _source(tmp_path, {"config.json": b'{"a": 1}'})
    victim = tmp_path / "victim"
    victim.write_bytes(b"mine")
    to = tmp_path / "to"
    to.mkdir()
    (to / ".config.json.part").symlink_to(victim)
    assert copy_model_dir(source, info, to) == ["config.json"]
    assert victim.read_bytes() == b"mine"
    assert (to / "config.json").read_bytes() == b'{"a": 1}' and not (to / "config.json").is_symlink()
    assert sorted(p.name for p in to.iterdir()) == ["config.json"]


def test_a_local_runs_marker_is_checked_as_a_buckets(tmp_path: Path) -> None:
    """The local target's data dir is written by the job, i.e. by the repository's code."""
    root = tmp_path / "data"
    source, _ = _source(tmp_path, {"config.json": b"{}"})
    (source.parent / "x").write_bytes(b"pwned")
    marker = {"format": "hf", "step": 1, "final": True, "dtype": "bf16", "files": ["config.json", "../x"],
              "bytes": 7, "export_s": 0.0, "state_bytes": 0, "tokenizer": False}
    (source / MODEL_MARKER).write_text(json.dumps(marker))
    store = LocalDirStore(root)
    model = store.newest_model()
    assert model is not None and "../x" in model.files
    home = tmp_path / "home"
    with pytest.raises(UnsafeName, match=r'its file "\.\./x" has a \'\.\.\' segment; nothing was written'):
        asyncio.run(store.fetch(model, home / "to"))
    assert not home.exists()
