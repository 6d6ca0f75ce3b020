from __future__ import annotations

import io
import json
from pathlib import Path

from backend.telemetry.classify import classify_command

SOCKET = "".join(f"{h}:{p}:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
                 for h, p in (("a", 1), ("b", 2)))
VERSION = "a:1:9 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"


def run(paths: list[str], *, as_json: bool, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = classify_command(paths, as_json=as_json, stdout=out, stdin=io.StringIO(stdin), stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_socket_verdict_is_a_report_not_an_error(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(VERSION + SOCKET)
    code, out, err = run([str(log)], as_json=False)
    assert code == 0 and err == ""
    assert out.startswith(f"{log}: socket — TCP sockets")
    assert "NCCL 2.21.5+cuda12.4" in out and "nodes 2, ranks 2" in out
    assert "basis: channels" in out and "warning: NCCL is using TCP sockets" in out and "rests on:" in out


def test_json_one_object_per_line_with_required_keys(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text(SOCKET)
    (tmp_path / "empty.log").write_text("")
    code, out, _ = run([str(tmp_path / "a.log"), str(tmp_path / "empty.log")], as_json=True)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2
    first, empty = (json.loads(line) for line in lines)
    for key in ("file", "transport", "nccl_version", "plugin", "provider", "nodes", "ranks", "warnings",
                "evidence"):
        assert key in first and key in empty
    assert first["transport"] == "socket" and empty["transport"] == "unknown"
    assert empty["nodes"] is None and empty["evidence"] == []


def test_unreadable_input_exits_2_but_reports_the_rest(tmp_path: Path) -> None:
    good = tmp_path / "good.log"
    good.write_text(SOCKET)
    code, out, err = run([str(tmp_path / "missing.log"), str(tmp_path), str(good)], as_json=True)
    assert code == 2
    assert err.splitlines()[0].startswith(f"rtui: cannot read {tmp_path / 'missing.log'}: ")
    assert len(err.splitlines()) == 2  # the directory is unreadable as a log too
    assert json.loads(out)["transport"] == "socket"


def test_dash_reads_stdin_text_and_binary() -> None:
    code, out, _ = run(["-"], as_json=True, stdin=SOCKET)
    assert code == 0 and json.loads(out)["file"] == "<stdin>" and json.loads(out)["transport"] == "socket"

    class BinaryStdin(io.StringIO):
        buffer = io.BytesIO(SOCKET.encode())

    out_io = io.StringIO()
    assert classify_command(["-"], as_json=False, stdout=out_io, stdin=BinaryStdin()) == 0
    assert out_io.getvalue().startswith("<stdin>: socket")
