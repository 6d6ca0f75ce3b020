"""The node count from every source a log offers (issue 39), and what it decides: a single node is
never ``socket``, and an announced Socket with the count unknown is no TCP alarm.

Hand-made lines in the formats of NCCL (src/init.cc comm line, src/transport/net_socket.cc) and
nccl-tests (the rank table of src/common.cu and src/util.cu, in its three eras).
"""

from __future__ import annotations

import pytest

from training.logparse import classify_lines
from training.logparse.nccl_evidence import rank_row


def at(host: str, pid: int, msg: str, dev: int = 0) -> str:
    return f"{host}:{pid}:{pid + 7} [{dev}] NCCL INFO {msg}"


# nccl-tests' own formats: 2017 (no pid), 2019 (pid), 2025 (group, pid, bus id).
def row(era: str, rank: int, host: str, pid: int, dev: int) -> str:
    if era == "2017":
        return f"#   Rank {rank:2d} on {host:>10s} device {dev:2d} [0x{16 * dev:02x}] NVIDIA A100-SXM4-80GB"
    if era == "2019":
        return f"#   Rank {rank:2d} Pid {pid:6d} on {host:>10s} device {dev:2d} [0x{16 * dev:02x}] Tesla V100"
    return (f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10s} device {dev:2d} [0000:{16 * dev:02x}:00] "
            "NVIDIA H100 80GB HBM3")


ERAS = ("2017", "2019", "2025")
SOCKET_ANNOUNCED = ["NET/IB : No device found.", "NET/Socket : Using [0]eth0:172.17.0.2<0>", "Using network Socket"]


@pytest.mark.parametrize("era", ERAS)
def test_rank_rows_of_every_era_are_read(era: str) -> None:
    parsed = rank_row("[1,0]<stdout>:" + row(era, 3, "node-a", 812, 3))
    assert parsed is not None and parsed.rank == 3 and parsed.host == "node-a"
    assert parsed.pid == (None if era == "2017" else 812)
    assert rank_row("rank 3 on node-a: loss 1.2") is None


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("pids", [(880, 880, 880, 880), (880, 881, 882, 883)], ids=["one-process", "four-processes"])
def test_a_rank_table_on_one_host_is_a_single_node(era: str, pids: tuple[int, ...]) -> None:
    table = [row(era, r, "gpu-box", pid, r) for r, pid in enumerate(pids)]
    lines = [*table, *(at("gpu-box", pids[0], text) for text in SOCKET_ANNOUNCED)]
    verdict = classify_lines(lines)
    assert (verdict.transport, verdict.nodes) == ("intra_node", 1), verdict.reason
    assert "rank table" in (verdict.nodes_basis or "") and "gpu-box" in (verdict.nodes_basis or "")
    assert "never used" in verdict.reason


@pytest.mark.parametrize("era", ERAS)
def test_a_rank_table_over_two_hosts_makes_the_socket_announcement_count(era: str) -> None:
    table = [row(era, r, "node-a" if r < 2 else "node-b", 100 + r, r % 2) for r in range(4)]
    verdict = classify_lines([*table, *(at("node-a", 100, text) for text in SOCKET_ANNOUNCED)])
    assert (verdict.transport, verdict.basis, verdict.nodes) == ("socket", "announced", 2), verdict.reason
    assert "2 hosts" in (verdict.nodes_basis or "")


def test_one_host_name_with_a_gpu_twice_is_two_machines() -> None:
    # A redacted or shared host name ("<ip>", containers named alike): NCCL refuses two ranks on one
    # GPU of one machine, so GPU 0 twice is a second machine.
    table = [row("2019", r, "<ip>", 84254 + r, r % 2) for r in range(4)]
    verdict = classify_lines([*table, *(at("<ip>", 84254, text) for text in SOCKET_ANNOUNCED)])
    assert (verdict.transport, verdict.nodes) == ("socket", 2), verdict.reason
    assert "machines named alike" in (verdict.nodes_basis or "")


def test_a_table_cut_by_the_fragment_proves_nothing() -> None:
    # The first rows of a longer table, nothing after them: the next row may be on another host.
    table = [row("2025", r, "node-a", 100 + r, r) for r in range(4)]
    assert classify_lines(table).nodes is None
    # ... whole once a line follows it, or once it has as many rows as the communicator has ranks.
    assert classify_lines([*table, at("node-a", 100, "Bootstrap : Using eth0:10.0.0.1<0>")]).nodes == 1
    ring = "h:1:1 [0] NCCL INFO Channel 00/02 :    0   1   2   3"
    assert classify_lines([ring, *table]).nodes == 1


def test_socket_announced_on_one_host_with_the_count_unknown_is_no_alarm() -> None:
    # NCCL initialises its Socket net on every machine without IB or a plugin: the announcement
    # alone says nothing about TCP traffic between nodes.
    lines = [at("h", 1, text) for text in SOCKET_ANNOUNCED]
    verdict = classify_lines(lines)
    assert verdict.transport == "unknown" and verdict.network == "Socket"
    assert "single-node jobs included" in verdict.reason
    assert not any("TCP sockets" in w for w in verdict.warnings)
    # A second node, or a channel through the socket net, makes it socket.
    assert classify_lines([*lines, at("h2", 2, "Using network Socket")]).transport == "socket"
    channel = at("h", 1, "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0")
    verdict = classify_lines([*lines, channel])
    assert (verdict.transport, verdict.basis) == ("socket", "channels")


@pytest.mark.parametrize("source", ["nNodes", "localRanks", "hosts", "addresses", "job"])
def test_every_source_of_the_node_count_settles_the_socket_announcement(source: str) -> None:
    lines = [at("h", 1, text) for text in SOCKET_ANNOUNCED]
    job_nodes = None
    if source == "nNodes":
        lines.append(at("h", 1, "comm 0x1 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 0"))
    elif source == "localRanks":  # nRanks over localRanks, when nNodes is missing
        lines.append(at("h", 1, "comm 0x1 rank 0 nRanks 4 localRanks 4 localRank 0 MNNVL 0"))
    elif source == "hosts":
        lines.append(at("h2", 2, "Trees [0] -1/-1/-1->1->0"))
    elif source == "addresses":  # one host name, two bootstrap addresses: two machines
        lines.append(at("h", 2, "Bootstrap : Using eth0:10.0.0.9<0>"))  # the other has 172.17.0.2
    else:
        job_nodes = 1
    verdict = classify_lines(lines, job_nodes=job_nodes)
    single = source in ("nNodes", "localRanks", "job")
    assert verdict.transport == ("intra_node" if single else "socket"), (source, verdict.reason)
    assert verdict.nodes == (1 if single else 2) and verdict.nodes_basis
