"""`rtui logs classify` through the real binary: files, stdin, and an unreadable path."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import RTUI, run_rtui
from tests.telemetry.tel_support import HELD_OUT_MISSES, NCCL_LOGS

REQUIRED = {"file", "transport", "nccl_version", "plugin", "provider", "nodes", "nodes_basis", "ranks", "warnings",
            "evidence"}
PUBLIC_LOGS = Path(__file__).parent / "public_logs"


@pytest.mark.skipif(not (NCCL_LOGS / "MANIFEST.json").exists(), reason="../shared/nccl_logs is not present")
def test_classify_every_shared_log_in_one_call(tmp_path: Path) -> None:
    manifest = json.loads((NCCL_LOGS / "MANIFEST.json").read_text())
    files = [str(NCCL_LOGS / entry["file"]) for entry in manifest]
    proc = run_rtui("logs", "classify", *files, "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == len(files)
    for row, entry in zip(rows, manifest, strict=True):
        assert row.keys() >= REQUIRED
        expected = entry["expected_transport"]
        assert row["transport"] == expected or (expected == "efa" and row["transport"] == "efa_gdr"), row["file"]


def test_classify_stdin_and_unreadable_file(tmp_path: Path) -> None:
    socket_log = ("h1:1:1 [0] NCCL INFO NCCL version 2.29.7+cuda13.0\n"
                  "h1:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 8 nNodes 2 localRanks 4 localRank 0 MNNVL 0\n"
                  "h1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] [send] via NET/Socket/0\n")
    proc = subprocess.run([RTUI, "logs", "classify", "-", str(tmp_path / "missing.log"), "--json"],
                          input=socket_log, capture_output=True, text=True, env=os.environ.copy())
    assert proc.returncode == 2
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 1 and rows[0]["transport"] == "socket"
    assert proc.stderr.strip().startswith("rtui: cannot read") and proc.stderr.count("\n") == 1


def test_classify_public_excerpts_gives_labels_and_node_estimates_with_their_basis() -> None:
    manifest = json.loads((PUBLIC_LOGS / "MANIFEST.json").read_text())
    proc = run_rtui("logs", "classify", *(str(PUBLIC_LOGS / e["file"]) for e in manifest), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    for row, entry in zip(rows, manifest, strict=True):
        assert row.keys() >= REQUIRED
        assert (row["nodes_basis"] is None) == (row["nodes"] is None)
        if entry["file"] in HELD_OUT_MISSES:  # measured and reported, not tuned on (tel_support)
            continue
        expected = entry["expected_transport"]
        assert row["transport"] == expected or (expected == "efa" and row["transport"] == "efa_gdr"), row["file"]
        assert row["nodes"] == entry["expected_nodes"], row["file"]
