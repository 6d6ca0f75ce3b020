"""``rtui logs classify FILE... [--json]``: which transport NCCL used, file by file.

It is a report, so a ``socket`` verdict still exits 0; only unreadable input exits 2
(the other files are still reported).
"""

from __future__ import annotations

import json
import sys
from typing import Any, BinaryIO, TextIO

from backend.telemetry.telemetry import Telemetry
from training.logparse.verdict import Verdict

EXIT_OK = 0
EXIT_UNREADABLE = 2
_HUMAN_EVIDENCE = 6


def classify_stream(stream: BinaryIO) -> Verdict:
    """The verdict ``Telemetry`` gives the same lines: what `rtui status` and the dashboard say
    (a local job's gloo comes from its metric records, not from NCCL)."""
    telemetry = Telemetry()
    while chunk := stream.read(1 << 20):
        telemetry.feed_bytes(chunk)
    telemetry.end_of_stream()
    return telemetry.transport


def _classify_stdin(stdin: TextIO) -> Verdict:
    buffer = getattr(stdin, "buffer", None)
    if buffer is not None:
        return classify_stream(buffer)
    telemetry = Telemetry()
    for line in stdin:
        telemetry.feed(line.rstrip("\r\n"))
    return telemetry.transport


def verdict_record(name: str, verdict: Verdict) -> dict[str, Any]:
    record: dict[str, Any] = {"file": name}
    record.update(verdict.to_dict())
    return record


def format_human(name: str, verdict: Verdict) -> str:
    head = f"{name}: {verdict.transport} — {verdict.label}"
    return "\n".join([head, *verdict.describe(max_evidence=_HUMAN_EVIDENCE)])


def classify_command(paths: list[str], *, as_json: bool, stdout: TextIO, stdin: TextIO,
                     stderr: TextIO | None = None) -> int:
    """Report the verdict for each path (``-`` is stdin); returns the exit code."""
    err = stderr if stderr is not None else sys.stderr
    code = EXIT_OK
    first = True
    for path in paths:
        try:
            if path == "-":
                verdict = _classify_stdin(stdin)
            else:
                with open(path, "rb") as stream:
                    verdict = classify_stream(stream)
        except OSError as exc:
            print(f"rtui: cannot read {path}: {exc.strerror or exc}", file=err)
            code = EXIT_UNREADABLE
            continue
        name = "<stdin>" if path == "-" else path
        if as_json:
            stdout.write(json.dumps(verdict_record(name, verdict), ensure_ascii=False) + "\n")
        else:
            stdout.write(("" if first else "\n") + format_human(name, verdict) + "\n")
        first = False
    stdout.flush()
    return code
