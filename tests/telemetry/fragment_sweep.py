"""Every shared NCCL log cut to its first N lines: the verdict and its basis at each N (a script).

    python tests/telemetry/fragment_sweep.py [--cuts 10,20,50] [--json]

Real logs are mostly fragments, so this shows how the verdict holds up as a log shrinks.
Each cell is ``transport/basis``; ``=`` marks a cell that already gives the manifest's label
(efa_gdr counts as efa), ``~`` one that differs from the label but is what a careful reader
says from those N lines alone (``READER``). The last lines count both per cut.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

for _path in (Path(__file__).resolve().parents[2], Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from tests.telemetry.tel_support import NCCL_LOGS, manifest_entries  # noqa: E402
from training.logparse import classify_lines, iter_file_lines  # noqa: E402

BASIS_SHORT = {"channels": "ch", "announced": "ann", "failure": "fail", None: "-"}
# What a careful reader says from only the first N lines, where that differs from the label
# of the whole file (read by hand; the lines that would decide have not appeared yet):
# e.g. 22's first 50 lines load the OFI plugin but never say which network NCCL chose,
# 23's first 10 announce Libfabric before any line shows the job is on one node, and with no
# provider line, so they cannot tell EFA from another libfabric provider (issue 27); 37's first 10
# show one laptop announcing Socket, which a single node does too, and not yet the second (issue 39).
# (21's first 10 hold nccl-tests' rank table, both ranks in one process on one host: one node.)
READER = {
    "01": {10: "unknown", 20: "unknown"}, "02": {10: "unknown", 20: "unknown"}, "03": {10: "unknown"},
    "15": {10: "unknown", 20: "unknown"}, "22": {10: "unknown", 20: "unknown", 50: "unknown"},
    "23": {10: "unknown"}, "31": {10: "unknown"}, "35": {10: "unknown"}, "37": {10: "unknown"},
    "38": {10: "unknown", 20: "unknown"}, "40": {10: "unknown"}, "42": {10: "unknown"}, "44": {10: "unknown"},
}


def matches(transport: str, expected: str) -> bool:
    return transport == expected or (expected == "efa" and transport == "efa_gdr")


@dataclass
class Cell:
    n: int
    transport: str
    basis: str | None
    label: bool  # gives the manifest's label
    reader: bool  # gives what a reader says from these n lines


@dataclass
class Row:
    file: str
    expected: str
    lines: int
    cuts: list[Cell]


def sweep(cuts: list[int | None]) -> list[Row]:
    rows = []
    for entry in manifest_entries():
        lines = list(iter_file_lines(NCCL_LOGS / entry["file"]))
        expected = entry["expected_transport"]
        cells = []
        for n in cuts:
            verdict = classify_lines(lines[:n])
            reader = READER.get(entry["file"][:2], {}).get(n or 0, expected)
            cells.append(Cell(n if n is not None else len(lines), verdict.transport, verdict.basis,
                              matches(verdict.transport, expected), matches(verdict.transport, reader)))
        rows.append(Row(entry["file"], expected, len(lines), cells))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cuts", default="10,20,50", help="comma-separated line counts; the whole log is added")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    cuts: list[int | None] = [int(c) for c in args.cuts.split(",") if c] + [None]
    rows = sweep(cuts)
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row)))
        return 0
    names = [f"N={c}" if c is not None else "all" for c in cuts]
    print(f"{'log':<4} {'label':<10} {'lines':>5}  " + "  ".join(f"{n:<17}" for n in names))
    for row in rows:
        cells = [f"{'=' if c.label else ('~' if c.reader else ' ')}{c.transport}/{BASIS_SHORT[c.basis]}"
                 for c in row.cuts]
        print(f"{row.file[:2]:<4} {row.expected:<10} {row.lines:>5}  " + "  ".join(f"{c:<17}" for c in cells))
    label = [sum(row.cuts[i].label for row in rows) for i in range(len(cuts))]
    reader = [sum(row.cuts[i].reader for row in rows) for i in range(len(cuts))]
    print(f"{'= label':<15} {len(rows):>5}  " + "  ".join(f"{t:<17}" for t in label))
    print(f"{'= reader':<15} {len(rows):>5}  " + "  ".join(f"{t:<17}" for t in reader))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
