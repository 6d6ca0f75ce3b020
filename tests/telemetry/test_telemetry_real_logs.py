"""Every real NCCL log in shared/nccl_logs is classified as its MANIFEST says."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from backend.telemetry.classify import classify_command
from tests.telemetry.tel_support import NCCL_LOGS, manifest_entries
from training.logparse import classify_lines, iter_file_lines

ENTRIES = manifest_entries()
ids = [e["file"][:2] for e in ENTRIES]


def _leading_int(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    m = re.match(r"\d+", str(value or ""))
    return int(m.group()) if m else None


# A version the manifest took from outside the lines is marked: "2.9.9 (issue title; ...)".
_PLAIN_VERSION = re.compile(r"\d+\.\d+(\.\d+)?(\+cuda[\d.]+)?$")


@pytest.mark.parametrize("entry", list[dict[str, Any] | None](ENTRIES) or [None], ids=ids or ["no-logs"])
def test_real_log_matches_manifest(entry: dict[str, Any] | None, nccl_logs: Path) -> None:
    assert entry is not None
    lines = list(iter_file_lines(nccl_logs / entry["file"]))
    verdict = classify_lines(lines)
    expected = entry["expected_transport"]
    # The manifest names the family; every NET channel carrying /GDRDMA refines efa to efa_gdr.
    assert verdict.transport == expected or (expected == "efa" and verdict.transport == "efa_gdr"), (
        verdict.reason, verdict.evidence)
    assert verdict.satisfies(expected)
    if expected == "unknown":
        assert verdict.basis is None
    elif any(re.search(r" via NET/[^/\s]+/", line) for line in lines):
        assert verdict.basis == "channels", verdict.reason  # nothing outranks a channel
    else:
        assert verdict.basis in ("announced", "failure", "channels"), verdict.reason
    assert verdict.decided_by and verdict.evidence[: len(verdict.decided_by)] == verdict.decided_by

    version = entry["nccl_version"]
    assert verdict.nccl_version == (version if version and _PLAIN_VERSION.match(version) else None)
    # Counts are what the lines prove: never more than the manifest knows from the source, and
    # the node count, when the lines give one, is the manifest's.
    nodes, ranks = _leading_int(entry["nodes"]), _leading_int(entry["ranks"])
    if verdict.nodes is not None:
        assert verdict.nodes == nodes
    if ranks is not None and verdict.ranks is not None:
        assert verdict.ranks <= ranks
    ofi = re.search(r"aws-ofi-nccl (\d+\.\d+\.\d+)", entry["plugin_version"] or "")
    if ofi and any(ofi.group(1) in line for line in lines):
        assert (verdict.plugin_version or "").startswith(f"aws-ofi-nccl {ofi.group(1)}")
    # The manifest marks a run that failed even when the failing line is not in the excerpt;
    # when a WARN is there, the verdict must say so.
    if entry["failure"] and any("NCCL WARN" in line for line in lines):
        assert verdict.warnings, "a failure shown in the lines must raise a warning"
    assert verdict.evidence


def test_first_batch_counts_are_exact(nccl_logs: Path) -> None:
    # Files 01-23 are whole runs: their node and rank counts are all in the lines.
    for entry in ENTRIES:
        if entry["file"] < "30":
            verdict = classify_lines(iter_file_lines(nccl_logs / entry["file"]))
            assert (verdict.nodes, verdict.ranks) == (_leading_int(entry["nodes"]), entry["ranks"]), entry["file"]


def test_gdr_refinement_and_plugin_failure_details(nccl_logs: Path) -> None:
    gdr = classify_lines(iter_file_lines(next(nccl_logs.glob("01_*.log"))))
    assert gdr.transport == "efa_gdr" and gdr.provider == "efa" and gdr.plugin_version is None
    no_gdr = classify_lines(iter_file_lines(next(nccl_logs.glob("02_*.log"))))
    assert no_gdr.transport == "efa"
    ib = classify_lines(iter_file_lines(next(nccl_logs.glob("15_*.log"))))
    assert ib.provider == "verbs;ofi_rxm"
    assert any("not EFA" in w for w in ib.warnings)
    assert any("failed to initialise" in w for w in ib.warnings)
    for intra in ("21_*.log", "22_*.log", "23_*.log"):
        verdict = classify_lines(iter_file_lines(next(nccl_logs.glob(intra))))
        assert "never used" in verdict.reason and verdict.network


def test_classify_json_one_object_per_file(nccl_logs: Path) -> None:
    paths = sorted(str(p) for p in nccl_logs.glob("*.log"))
    out = io.StringIO()
    code = classify_command(paths, as_json=True, stdout=out, stdin=io.StringIO(""))
    assert code == 0
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["file"] for r in records] == paths
    by_name = {Path(r["file"]).name: r for r in records}
    for entry in manifest_entries():
        record = by_name[entry["file"]]
        for key in ("file", "transport", "basis", "nccl_version", "plugin", "provider", "nodes", "ranks",
                    "warnings", "evidence", "decided_by"):
            assert key in record
        assert record["transport"].startswith(entry["expected_transport"])


def test_nccl_logs_path_is_relative_to_repo() -> None:
    assert NCCL_LOGS.name == "nccl_logs" and NCCL_LOGS.parent.name == "shared"


def test_every_cut_of_every_log_gives_what_a_reader_says(nccl_logs: Path) -> None:
    # Cut to its first 10, 20, 50 lines, each shared log gives what a careful reader of those
    # lines says (fragment_sweep.READER: the label, unless the deciding lines come later).
    from tests.telemetry.fragment_sweep import sweep

    wrong = [(row.file[:2], cell.n, cell.transport) for row in sweep([10, 20, 50, None])
             for cell in row.cuts if not cell.reader]
    assert wrong == []
