"""`rtui logs classify` is a command of its own beside `rtui logs [RUN_ID] [--follow]`, on the real binary."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import RTUI, run_rtui
from tests.test_cli_errors import assert_one_line

SOCKET_LOG = (
    "h1:1:1 [0] NCCL INFO NCCL version 2.29.7+cuda13.0\n"
    "h1:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 8 nNodes 2 localRanks 4 localRank 0 MNNVL 0\n"
    "h1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] [send] via NET/Socket/0\n"
)


@pytest.fixture
def logs(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "a.log").write_text(SOCKET_LOG)
    (tmp_path / "b.log").write_text("no nccl here\n")
    return "a.log", "b.log"


@pytest.mark.parametrize(
    "args",
    [
        ["logs", "classify", "--json", "a.log", "b.log"],
        ["logs", "--json", "classify", "a.log", "b.log"],
        ["logs", "classify", "a.log", "--json", "b.log"],
        ["logs", "classify", "a.log", "b.log", "--json"],
        ["logs", "--target", "local", "classify", "a.log", "--json", "b.log"],
    ],
)
def test_json_anywhere_on_the_line(logs: tuple[str, str], args: list[str]) -> None:
    proc = run_rtui(*args)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["file"], r["transport"]) for r in rows] == [("a.log", "socket"), ("b.log", "unknown")]


def test_human_output_and_stdin() -> None:
    proc = subprocess.run([RTUI, "logs", "classify", "-"], input=SOCKET_LOG, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("<stdin>: socket")


def test_an_unreadable_file_exits_2_and_the_others_are_still_reported(logs: tuple[str, str]) -> None:
    proc = run_rtui("logs", "classify", "--json", "missing.log", "a.log")
    assert proc.returncode == 2
    assert [json.loads(line)["file"] for line in proc.stdout.splitlines()] == ["a.log"]
    assert proc.stderr.strip() == "rtui: cannot read missing.log: No such file or directory"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["logs", "classify"], "no files to classify"),
        (["logs", "classify", "--json"], "no files to classify"),
        (["logs", "classify", "--follow", "a.log"], "unrecognized arguments: --follow"),
        (["logs", "--json"], "unrecognized arguments: --json"),
        (["logs", "r-nope", "extra"], "unrecognized arguments: extra"),
    ],
)
def test_wrong_forms_are_one_line_exit_2(logs: tuple[str, str], args: list[str], needle: str) -> None:
    assert_one_line(run_rtui(*args), 2, needle)


def test_classify_has_its_own_help() -> None:
    proc = run_rtui("logs", "classify", "--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: rtui logs classify") and "--json" in proc.stdout
    assert "--follow" not in proc.stdout
    plain = run_rtui("logs", "--help")
    assert plain.returncode == 0 and plain.stdout.startswith("usage: rtui logs [")
    assert "--follow" in plain.stdout and "rtui logs classify FILE" in plain.stdout


@pytest.mark.parametrize("args", [["logs", "r-nope"], ["logs", "r-nope", "--follow"], ["logs", "-f", "r-nope"]])
def test_plain_logs_still_takes_a_run_id_and_follow(args: list[str]) -> None:
    assert_one_line(run_rtui(*args), 2, "no run r-nope")


def test_plain_logs_without_runs() -> None:
    proc = run_rtui("logs")
    assert proc.returncode == 2 and "no runs" in proc.stderr and "classify" not in proc.stderr


def test_classify_says_gloo_for_a_finished_local_log_like_status(tmp_path: Path) -> None:
    """A local job's log has no NCCL line, and its metric records say gloo: classify reads the
    same verdict as `rtui status` and the dashboard (issue 21, item 4)."""
    from tests.test_follow import metric_lines

    log = tmp_path / "local.log"
    log.write_text("Running entrypoint for job rtui-x-1: python -m training.train\n"
                   + metric_lines(3).replace('"step_time_s"', '"backend":"gloo","step_time_s"'))
    human = run_rtui("logs", "classify", str(log), check=True).stdout
    assert human.startswith(f"{log}: gloo"), human
    record = json.loads(run_rtui("logs", "classify", "--json", str(log), check=True).stdout)
    assert (record["transport"], record["basis"]) == ("gloo", "backend")
    piped = subprocess.run([RTUI, "logs", "classify", "-"], input=log.read_text(), capture_output=True, text=True,
                           timeout=60)
    assert piped.stdout.startswith("<stdin>: gloo"), piped.stdout + piped.stderr
