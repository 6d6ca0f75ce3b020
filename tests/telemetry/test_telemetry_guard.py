"""The strict --require-transport check, against fake per-rank NCCL debug files."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from training import transport_guard
from training.transport_guard import (
    DEBUG_FILE_PATTERN,
    capture_nccl_debug,
    check_transport,
    enforce_transport,
    read_verdict,
)


def rank_file(directory: Path, host: str, pid: int, channel: str, *, provider: str | None = "efa",
              n_nodes: int = 2) -> Path:
    lines = [f"{host}:{pid}:{pid} [0] NCCL INFO NCCL version 2.27.3+cuda12.9"]
    if provider:
        lines.append(f"{host}:{pid}:{pid} [0] NCCL INFO NET/OFI Selected provider is {provider}, fabric is x")
    lines += [f"{host}:{pid}:{pid} [0] NCCL INFO comm 0x1 rank 0 nRanks {2 * n_nodes} nNodes {n_nodes} "
              "localRanks 2 localRank 0 MNNVL 0",
              f"{host}:{pid}:{pid + 1} [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via {channel}"]
    path = directory / f"nccl.{host}.{pid}.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_capture_sets_env_for_per_process_files(tmp_path: Path) -> None:
    env: dict[str, str] = {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "COLL"}
    directory = capture_nccl_debug(tmp_path / "nccl", env)
    assert directory.is_dir()
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl" / DEBUG_FILE_PATTERN)
    assert env["NCCL_DEBUG_SUBSYS"].split(",") == ["COLL", "INIT", "NET", "ENV"]
    excluded = {"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "^INIT,GRAPH"}
    capture_nccl_debug(tmp_path, excluded)
    assert excluded["NCCL_DEBUG"] == "TRACE" and excluded["NCCL_DEBUG_SUBSYS"] == "^GRAPH"
    untouched: dict[str, str] = {}
    capture_nccl_debug(tmp_path, untouched)
    assert "NCCL_DEBUG_SUBSYS" not in untouched


def test_efa_and_efa_gdr_satisfy_efa(tmp_path: Path) -> None:
    rank_file(tmp_path, "a", 10, "NET/Libfabric/0/GDRDMA")
    rank_file(tmp_path, "a", 11, "NET/Libfabric/1/GDRDMA")
    verdict = enforce_transport("efa", tmp_path, wait_s=0)
    assert verdict.transport == "efa_gdr"
    assert enforce_transport("any", tmp_path, wait_s=0) is not None


def test_socket_fallback_exits_with_evidence(tmp_path: Path) -> None:
    rank_file(tmp_path, "a", 10, "NET/Socket/0", provider=None)
    with pytest.raises(SystemExit) as info:
        enforce_transport("efa", tmp_path, wait_s=0)
    message = str(info.value.code)
    assert message.startswith("rtui: NCCL transport check failed: required efa, but NCCL uses TCP sockets")
    assert "rests on:" in message and "via NET/Socket/0" in message
    assert enforce_transport("socket", tmp_path, wait_s=0).transport == "socket"


def test_libfabric_tcp_provider_is_not_efa(tmp_path: Path) -> None:
    rank_file(tmp_path, "a", 10, "NET/Libfabric/0", provider="tcp;ofi_rxm")
    with pytest.raises(SystemExit, match="libfabric provider 'tcp;ofi_rxm', which is not EFA"):
        enforce_transport("efa", [tmp_path / "nccl.a.10.log"], wait_s=0)


def test_single_node_passes_whatever_is_required(tmp_path: Path) -> None:
    # Its ranks talk over P2P/SHM/NVLS: the network it was asked to prove is not used at all.
    rank_file(tmp_path, "a", 10, "P2P/CUMEM/read", n_nodes=1)
    echo = io.StringIO()
    for required in ("efa", "efa_gdr", "socket", "ib", "intra_node"):
        assert enforce_transport(required, tmp_path, wait_s=0, echo=echo).transport == "intra_node"
    assert "intra_node (basis channels) passes (a single node uses no network) --require-transport efa" \
        in echo.getvalue()


class GuardClock:
    """The guard's ``time`` (monotonic, sleep) on a clock that moves only when slept on: how long it
    waited is read back exactly, and ``on_sleep`` plays what happens meanwhile (a rank flushing late)."""

    def __init__(self, on_sleep: Callable[[float], None] | None = None) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.on_sleep = on_sleep

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self.now)


def guard_clock(monkeypatch: pytest.MonkeyPatch, on_sleep: Callable[[float], None] | None = None) -> GuardClock:
    clock = GuardClock(on_sleep)
    monkeypatch.setattr(transport_guard, "time", clock)
    return clock


def test_multi_node_without_network_evidence_fails_after_waiting(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    rank_file(tmp_path, "a", 10, "P2P/IPC/read", n_nodes=2, provider=None)
    clock = guard_clock(monkeypatch)
    with pytest.raises(SystemExit, match="no network evidence was seen"):
        enforce_transport("efa", tmp_path, wait_s=0.3, poll_s=0.05)
    assert sum(clock.slept) >= 0.3, clock.slept  # it re-read the logs for its whole wait first


def test_no_nccl_output_at_all(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no NCCL output was captured"):
        enforce_transport("socket", tmp_path / "nothing-here", wait_s=0)


def test_waits_for_a_late_rank_to_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rank_file(tmp_path, "a", 10, "P2P/IPC/read")

    def flush_late(now: float) -> None:  # the other rank's log appears 0.2 s into the wait
        if now >= 0.2 and not (tmp_path / "nccl.a.11.log").exists():
            rank_file(tmp_path, "a", 11, "NET/Libfabric/0")

    clock = guard_clock(monkeypatch, flush_late)
    assert enforce_transport("efa", tmp_path, wait_s=5, poll_s=0.05).transport == "efa"
    assert 0.2 <= sum(clock.slept) < 5, clock.slept  # it waited for the late rank, not to its deadline


def test_lines_and_echo(tmp_path: Path) -> None:
    lines = rank_file(tmp_path, "b", 5, "NET/IB/0/GDRDMA").read_text().splitlines()
    echo = io.StringIO()
    verdict = enforce_transport("ib", lines=lines, echo=echo)
    assert verdict.transport == "ib"
    assert read_verdict(lines=echo.getvalue().splitlines()) == verdict  # the TUI sees the same thing


def test_unknown_requirement_is_rejected() -> None:
    with pytest.raises(ValueError):
        check_transport("unknown", read_verdict(lines=[]))


def test_guard_imports_no_backend_or_heavy_modules() -> None:
    code = ("import sys, training.transport_guard, training.logparse\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('backend', 'tui', 'screens', 'pydantic', 'torch', 'ray', 'textual')]\n"
            "print(bad); sys.exit(1 if bad else 0)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd(),
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_announcement_alone_is_never_acted_on(tmp_path: Path) -> None:
    (tmp_path / "nccl.a.10.log").write_text(
        "a:10:10 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 1 nics)\n"
        "a:10:10 [0] NCCL INFO Using network AWS Libfabric\n"
        "a:10:10 [0] NCCL INFO comm 0x1 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0\n")
    assert read_verdict(tmp_path).basis == "announced"
    # Neither a pass nor a mismatch: the check says it had only the announcement.
    for required in ("efa", "socket"):
        with pytest.raises(SystemExit, match="only announced 'AWS Libfabric' .* never on an announcement alone"):
            enforce_transport(required, tmp_path, wait_s=0)
    assert enforce_transport("any", tmp_path, wait_s=0).transport == "efa"


def test_a_plugin_failure_and_its_fallback_are_acted_on_at_once(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nccl.a.10.log").write_text(
        "a:10:11 [0] nccl_net_ofi_create_plugin:1067 NCCL WARN NET/OFI aws-ofi-nccl initialization failed\n"
        "a:10:11 [0] NCCL INFO NET/IB : No device found.\n"
        "a:10:11 [0] NCCL INFO Using network Socket\n")
    clock = guard_clock(monkeypatch)
    # The training loop passes the job's node count (job_nodes()): two nodes, so Socket crosses them.
    with pytest.raises(SystemExit, match="NCCL uses TCP sockets \\(socket\\), after a network plugin failure"):
        enforce_transport("efa", tmp_path, wait_s=5, poll_s=0.05, nodes=2)
    assert clock.slept == []  # decisive: no waiting for channels
    assert enforce_transport("socket", tmp_path, wait_s=0, nodes=2).basis == "failure"
    # Without it, a Socket announced on one host is no proof of TCP traffic (issue 39).
    assert enforce_transport("any", tmp_path, wait_s=0).transport == "unknown"


def test_echo_ends_with_what_the_check_decided_on(tmp_path: Path) -> None:
    lines = rank_file(tmp_path, "b", 5, "NET/IB/0/GDRDMA").read_text().splitlines()
    echo = io.StringIO()
    enforce_transport("ib", lines=lines, echo=echo)
    assert echo.getvalue().splitlines()[-1] == ("rtui: transport check: ib (basis channels) satisfies "
                                                "--require-transport ib")
