"""``rtui logs classify`` speed vs a bare line loop over the same file (a script, not a test).

    python tests/telemetry/bench_classify.py [--lines 1000000] [--runs 5] [--log PATH]

The log is the 16-rank run of ``nccl_synth.run_log`` (what ``bench_parser.py`` replays). Timed
in one process, best of ``--runs``, each right after a bare ``for line in f`` loop: the bare
loop, ``classify_command`` on the file (what the CLI runs after its imports), and the
throughput ratio of the two. ``--log`` keeps the generated file for other tools.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

for _path in (Path(__file__).resolve().parents[2], Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from backend.telemetry.classify import classify_command  # noqa: E402
from tests.telemetry.bench_parser import _best_of, bare_loop  # noqa: E402
from tests.telemetry.nccl_synth import run_log  # noqa: E402


def classify(path: Path) -> str:
    out = io.StringIO()
    classify_command([str(path)], as_json=True, stdout=out, stdin=io.StringIO(""))
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--log", type=Path, help="write the generated log here and keep it")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.log or Path(tmp) / "run.log"
        with open(path, "w", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in run_log(args.lines))
        n_lines = bare_loop(path)
        bare = _best_of(args.runs, lambda: bare_loop(path))
        took = _best_of(args.runs, lambda: classify(path))
        verdict = classify(path)
    print(f"{n_lines:,} lines: bare loop {bare:.3f} s, classify {took:.3f} s, "
          f"classify/bare throughput {bare / took:.2f}x")
    print(verdict.strip()[:300])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
