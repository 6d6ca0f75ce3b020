"""Every shared NCCL log cut to its first N lines: the verdict and its basis at each N (a script).

    python tests/telemetry/fragment_sweep.py [--cuts 10,20,50] [--json]

Real logs are mostly fragments, so this shows how the verdict holds up as a log shrinks.
Each cell is ``transport/basis``; ``=`` marks a cell that already gives the manifest's label
(efa_gdr counts as efa). The last line counts those per cut.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

for _path in (Path(__file__).resolve().parents[2], Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from tests.telemetry.tel_support import NCCL_LOGS, manifest_entries  # noqa: E402
from training.logparse import classify_lines, iter_file_lines  # noqa: E402

BASIS_SHORT = {"channels": "ch", "announced": "ann", "failure": "fail", None: "-"}


def matches(transport: str, expected: str) -> bool:
    return transport == expected or (expected == "efa" and transport == "efa_gdr")


def sweep(cuts: list[int | None]) -> list[dict[str, object]]:
    rows = []
    for entry in manifest_entries():
        lines = list(iter_file_lines(NCCL_LOGS / entry["file"]))
        cells = []
        for n in cuts:
            verdict = classify_lines(lines[:n])
            cells.append({"n": n if n is not None else len(lines), "transport": verdict.transport,
                          "basis": verdict.basis, "ok": matches(verdict.transport, entry["expected_transport"])})
        rows.append({"file": entry["file"], "expected": entry["expected_transport"], "lines": len(lines),
                     "cuts": cells})
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
            print(json.dumps(row))
        return 0
    names = [f"N={c}" if c is not None else "all" for c in cuts]
    print(f"{'log':<4} {'label':<10} {'lines':>5}  " + "  ".join(f"{n:<17}" for n in names))
    for row in rows:
        cells = [f"{'=' if c['ok'] else ' '}{c['transport']}/{BASIS_SHORT[c['basis']]}"  # type: ignore[index]
                 for c in row["cuts"]]  # type: ignore[attr-defined]
        print(f"{str(row['file'])[:2]:<4} {row['expected']!s:<10} {row['lines']:>5}  "
              + "  ".join(f"{c:<17}" for c in cells))
    totals = [sum(1 for row in rows if row["cuts"][i]["ok"]) for i in range(len(cuts))]  # type: ignore[index]
    print(f"{'':<4} {'right':<10} {len(rows):>5}  " + "  ".join(f"{t:<17}" for t in totals))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
