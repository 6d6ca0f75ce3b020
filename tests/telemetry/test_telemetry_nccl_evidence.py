"""Each kind of evidence a careful reader uses, as hand-made fragments in each NCCL era.

Formats follow NCCL's own print statements: 2.4/2.5 name the network only through the
device line of the net they initialised (``NET/IB : Using [0]...``); 2.6+ print ``Using
network X``; 2.20+ add ``nNodes`` to the comm line; 2.27+ add ``Assigned NET plugin X``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from training.logparse import NcclAnalyzer, classify_lines
from training.logparse.verdict import Verdict


def at(host: str, pid: int, msg: str, dev: int = 0, level: str = "INFO") -> str:
    return f"{host}:{pid}:{pid + 7} [{dev}] NCCL {level} {msg}"


@dataclass(frozen=True)
class Era:
    name: str
    has_using_network: bool
    has_nnodes: bool

    def announce(self, host: str, pid: int, network: str) -> list[str]:
        """What a process prints when NCCL picks ``network`` (IB, Socket or an OFI name)."""
        if not self.has_using_network:
            device = ("NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>" if network == "IB"
                      else "NET/Socket : Using [0]eth0:10.0.0.1<0>")
            return [at(host, pid, device)]
        lines = []
        if self.name >= "2.27":
            lines.append(at(host, pid, f"Assigned NET plugin {network} to comm"))
        return [*lines, at(host, pid, f"Using network {network}")]

    def comm(self, host: str, pid: int, rank: int, n_ranks: int, n_nodes: int) -> str:
        if self.has_nnodes:
            return at(host, pid, f"comm 0x55{pid} rank {rank} nRanks {n_ranks} nNodes {n_nodes} "
                                 f"localRanks {n_ranks // n_nodes} localRank {rank % (n_ranks // n_nodes)} MNNVL 0")
        return at(host, pid, f"comm 0x55{pid} rank {rank} nranks {n_ranks} cudaDev {rank % 8} busId 1000 "
                             "- Init COMPLETE")

    def channel(self, host: str, pid: int, src: int, dst: int, via: str) -> str:
        if self.name < "2.7":
            return at(host, pid, f"Ring 00 : {src} -> {dst} [receive] via {via}")
        if self.name < "2.9":
            return at(host, pid, f"Channel 00 : {src}[1000] -> {dst}[2000] [receive] via {via}")
        return at(host, pid, f"Channel 00/0 : {src}[0] -> {dst}[0] [receive] via {via}")


ERAS = [Era("2.4", False, False), Era("2.7", True, False), Era("2.18", True, False),
        Era("2.21", True, True), Era("2.29", True, True)]
NEW_ERAS = [e for e in ERAS if e.has_using_network]


def two_nodes(era: Era, network: str, *, provider: str | None = None) -> list[str]:
    """Two hosts (one rank each) announcing ``network``, with the era's node count."""
    lines: list[str] = []
    for rank, host in enumerate(("a", "b")):
        if provider:
            lines.append(at(host, rank + 1, f"NET/OFI Selected provider is {provider}, fabric is x (found 1 nics)"))
        lines += era.announce(host, rank + 1, network)
        lines.append(era.comm(host, rank + 1, rank, 2, 2))
    return lines


def check(verdict: Verdict, transport: str, basis: str | None) -> None:
    assert (verdict.transport, verdict.basis) == (transport, basis), (verdict.reason, verdict.evidence)


# -- channels ------------------------------------------------------------------------------
@pytest.mark.parametrize("era", ERAS, ids=lambda e: e.name)
@pytest.mark.parametrize(("via", "provider", "expected"), [
    ("NET/IB/0/GDRDMA", None, "ib"),
    ("NET/Socket/0", None, "socket"),
    ("NET/AWS Libfabric/0/GDRDMA", "efa", "efa_gdr"),
    ("NET/Libfabric/1", "efa", "efa"),
])
def test_channels_decide_in_every_era(era: Era, via: str, provider: str | None, expected: str) -> None:
    lines = [*two_nodes(era, "Socket"), era.channel("a", 1, 1, 0, via)]
    if provider:
        lines.insert(0, at("a", 1, f"NET/OFI Selected provider is {provider}, fabric is x (found 1 nics)"))
    verdict = classify_lines(lines)
    check(verdict, expected, "channels")
    assert verdict.decided_by[0].endswith(via)
    if expected != "socket":  # the announcement said Socket: the channel contradicts it
        assert any("announced 'Socket'" in w for w in verdict.warnings)


@pytest.mark.parametrize("era", ERAS, ids=lambda e: e.name)
@pytest.mark.parametrize(("provider", "kind"),
                         [("tcp;ofi_rxm", "TCP"), ("verbs;ofi_rxm", "verbs"), ("cxi", "Slingshot")])
def test_channels_over_another_libfabric_provider_name_it(era: Era, provider: str, kind: str) -> None:
    # Not EFA, and not NCCL's own Socket or IB transport either: unknown, with the provider named.
    lines = [at("a", 1, f"NET/OFI Selected provider is {provider}, fabric is x (found 1 nics)"),
             *two_nodes(era, "Socket"), era.channel("a", 1, 1, 0, "NET/Libfabric/0")]
    verdict = classify_lines(lines)
    check(verdict, "unknown", None)
    assert f"'{provider}'" in verdict.reason and kind in verdict.reason and "not EFA" in verdict.reason
    assert verdict.provider == provider and verdict.decided_by[0] == lines[0]


@pytest.mark.parametrize("era", ERAS, ids=lambda e: e.name)
def test_libfabric_channels_without_a_provider_line_weigh_the_other_clues(era: Era) -> None:
    # Traffic through the plugin is EFA evidence (issue 39) and the verdict says what it inferred it from.
    lines = [*two_nodes(era, "Socket"), era.channel("a", 1, 1, 0, "NET/AWS Libfabric/0")]
    verdict = classify_lines(lines)
    check(verdict, "efa", "channels")
    assert "no provider line" in verdict.reason and "traffic through the plugin" in verdict.reason
    assert any("EFA inferred from traffic through the plugin" in w for w in verdict.warnings)
    # A path the plugin takes only on EFA is named with it, and the line is in the evidence.
    efa_path = at("a", 1, "NET/OFI [0] getCudaPath dev 0 busId 0000:00:16.0 path /sys/devices/pci0000:00/")
    verdict = classify_lines([efa_path, *lines])
    check(verdict, "efa", "channels")
    assert "only on the efa provider" in verdict.reason and efa_path in verdict.decided_by
    # Another fabric named in its own words outweighs them all.
    slingshot = at("a", 1, "NET/AWS Libfabric : GPU Direct RDMA Enabled for HCA 0 'cxi0'")
    verdict = classify_lines([efa_path, *lines, slingshot])
    check(verdict, "unknown", None)
    assert "not EFA" in verdict.reason and "cxi0" in verdict.reason


@pytest.mark.parametrize("era", ERAS, ids=lambda e: e.name)
def test_a_channel_outranks_a_single_node(era: Era) -> None:
    # P2P and SHM disabled on one host: the ranks talk through the NIC (loopback).
    lines = [era.comm("h", 1, 0, 2, 1), era.comm("h", 2, 1, 2, 1), era.channel("h", 1, 1, 0, "NET/IB/0/GDRDMA")]
    check(classify_lines(lines), "ib", "channels")


# -- announced network + node count -----------------------------------------------------------
@pytest.mark.parametrize("era", ERAS, ids=lambda e: e.name)
@pytest.mark.parametrize(("network", "expected"), [("IB", "ib"), ("Socket", "socket")])
def test_announced_network_across_nodes(era: Era, network: str, expected: str) -> None:
    verdict = classify_lines(two_nodes(era, network))
    check(verdict, expected, "announced")
    assert verdict.nodes == 2 and verdict.hosts == {"a": expected, "b": expected}


@pytest.mark.parametrize("era", NEW_ERAS, ids=lambda e: e.name)
@pytest.mark.parametrize(("network", "provider", "expected"), [
    ("AWS Libfabric", "efa", "efa"), ("Libfabric", None, "unknown"),
    ("AWS Libfabric", "tcp;ofi_rxm", "unknown"), ("Libfabric", "verbs;ofi_rxm", "unknown"),
    ("IBext_v8", None, "ib"), ("gIB", None, "ib"), ("SomethingNew", None, "unknown"),
])
def test_announced_plugin_networks(era: Era, network: str, provider: str | None, expected: str) -> None:
    verdict = classify_lines(two_nodes(era, network, provider=provider))
    check(verdict, expected, "announced" if expected != "unknown" else None)
    if network == "Libfabric" and provider is None:  # the provider line is what is missing
        assert "Selected provider is" in verdict.reason
    if provider and provider != "efa":
        assert f"'{provider}'" in verdict.reason and "not EFA" in verdict.reason


@pytest.mark.parametrize(("clue", "words"), [
    (at("a", 1, "NET/OFI Configuring AWS-specific options"), "AWS platform setup"),
    (at("a", 1, "NET/OFI Setting provider_filter to efa"), "AWS platform setup"),
    (at("a", 1, "NET/OFI Running on p4d.24xlarge platform, Setting NCCL_TOPO_FILE environment variable to x"),
     "AWS platform setup"),
    (at("a", 1, "NET/OFI Forcing AWS OFI ndev 2"), "only on the efa provider"),
    (at("a", 1, "NET/Libfabric : GPU Direct RDMA Enabled for HCA 0 'rdmap16s27'"), "EFA device"),
    (at("a", 1, "NET/AWS Libfabric : GPU Direct RDMA Disabled for HCA 0 'efa_0'"), "EFA device"),
    ("libfabric:462:1673041636:efa:core:rxr_info_to_rxr():506<warn> FI_HMEM capability requires RDMA",
     "efa provider named in its own lines"),
])
def test_a_strong_clue_makes_an_announced_plugin_efa(clue: str, words: str) -> None:
    announced = two_nodes(ERAS[-1], "Libfabric")
    check(classify_lines(announced), "unknown", None)
    verdict = classify_lines([clue, *announced])
    check(verdict, "efa", "announced")
    assert words in verdict.reason and clue in verdict.decided_by


def test_weak_clues_need_company() -> None:
    announced = two_nodes(ERAS[-1], "Libfabric")
    family = at("a", 1, "NET/OFI NCCL_OFI_TUNER is not available for platform : g6e.48xlarge, "
                        "Fall back to NCCL's tuner")
    av = at("a", 1, "NET/OFI Couldn't open AV. RC: -12, ERROR: Cannot allocate memory", level="WARN")
    check(classify_lines([family]), "unknown", None)  # an instance family and no plugin in use
    verdict = classify_lines([family, *announced])  # ... with the plugin chosen: weak + weak
    check(verdict, "efa", "announced")
    assert "instance family" in verdict.reason
    check(classify_lines([av, family]), "unknown", None)


def test_plugin_setup_alone_is_efa_until_it_fails() -> None:
    # aws-ofi-nccl's AWS build forces the efa provider (platform-aws.cpp): once it starts, EFA it is,
    # unless it fails and NCCL falls back.
    setup = [at("algo-1", 9, "NET/OFI Initializing aws-ofi-nccl 1.11.0-aws"),
             at("algo-1", 9, "NET/OFI Configuring AWS-specific options"),
             at("algo-1", 9, "NET/OFI Setting provider_filter to efa")]
    verdict = classify_lines(setup)
    check(verdict, "efa", "announced")
    failed = [*setup, at("algo-1", 9, "NET/OFI OFI fi_getinfo() call failed: No data available", level="WARN")]
    check(classify_lines(failed), "unknown", None)
    fell = [*failed, at("algo-1", 9, "Using network Socket"),
            at("algo-1", 9, "comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0")]
    check(classify_lines(fell), "socket", "failure")


def test_minimal_two_line_fragments() -> None:
    # An announcement and a node count, in each shape the count comes in.
    nnodes = [at("h", 1, "Using network Socket"),
              at("h", 1, "comm 0x1 rank 3 nRanks 16 nNodes 2 localRanks 8 localRank 3 MNNVL 0")]
    check(classify_lines(nnodes), "socket", "announced")
    two_hosts = [at("a", 1, "Using network IB"), at("b", 2, "Using network IB")]
    assert classify_lines(two_hosts).nodes == 2
    check(classify_lines(two_hosts), "ib", "announced")
    two_addresses = [at("node", 1, "NET/Socket : Using [0]eth0:10.0.0.1<0>"),
                     at("node", 2, "NET/Socket : Using [0]eth0:10.0.0.2<0>")]  # same hostname, two machines
    verdict = classify_lines(two_addresses)
    check(verdict, "socket", "announced")
    assert verdict.nodes == 2
    one_node = [at("h", 1, "Using network AWS Libfabric"),
                at("h", 1, "comm 0x1 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 0")]
    check(classify_lines(one_node), "intra_node", "announced")


def test_announced_without_node_count_still_names_the_network() -> None:
    # A fragment that shows the choice but not the node count: the reader names the network.
    verdict = classify_lines([at("algo-1", 9, "NET/OFI Selected Provider is efa"),
                              at("algo-1", 9, "Using network AWS Libfabric")])
    check(verdict, "efa", "announced")
    assert verdict.nodes is None and "node count is not in the log" in verdict.reason


def test_the_last_device_line_of_nccl_2_4_decides() -> None:
    # 2.4 tries IB, then falls back to Socket; each prints its own device line.
    ib = [at("a", 1, "NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>"),
          at("b", 2, "NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.2<0>")]
    check(classify_lines(ib), "ib", "announced")
    fell = [at("a", 1, "NET/IB : No device found."), at("a", 1, "NET/Socket : Using [0]eth0:10.0.0.1<0>"),
            at("b", 2, "NET/Socket : Using [0]eth0:10.0.0.2<0>")]
    check(classify_lines(fell), "socket", "announced")


def test_nccl_2_4_early_bootstrap_socket_line_is_not_the_choice() -> None:
    # 2.4.2-2.4.7 bring up the socket net for bootstrap before looking for a plugin or IB.
    boot = at("a", 1, "NET/Socket : Using [0]ib0:192.168.11.1<0>")
    no_plugin = at("a", 1, "NET/Plugin : No plugin found (libnccl-net.so).")
    ib = at("a", 1, "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>")
    check(classify_lines([boot, no_plugin, ib]), "ib", "announced")
    # IB absent: NCCL keeps the socket net and prints nothing more than the missing device; the net
    # is announced on one host only, and a single node announces it too (issue 39): no socket yet.
    socket = [boot, no_plugin, at("a", 1, "NET/IB : No device found.")]
    check(classify_lines(socket), "unknown", None)
    assert classify_lines(socket).network == "Socket (no IB device)" or classify_lines(socket).network == "Socket"
    check(classify_lines([*socket, at("b", 2, "NET/Socket : Using [0]ib0:192.168.11.2<0>")]), "socket", "announced")
    # A plugin that loads prints no NET/Plugin line; the OFI plugin names its provider.
    ofi = [boot, at("a", 1, "NET/OFI Selected Provider is efa")]
    verdict = classify_lines(ofi)
    check(verdict, "efa", "announced")
    assert verdict.decided_by == (ofi[1],)


def test_a_provider_selection_withdrawn_by_a_failure() -> None:
    chosen = at("a", 1, "NET/OFI Selected Provider is verbs;ofi_rxm (found 58 nics)")
    check(classify_lines([chosen]), "unknown", None)
    assert "'verbs;ofi_rxm'" in classify_lines([chosen]).reason
    failed = [chosen, at("a", 1, "NET/OFI Invalid type of PCI bus returned 0")]
    check(classify_lines(failed), "unknown", None)
    # An explicit announcement is not withdrawn by a later error: NCCL did choose it.
    explicit = [at("a", 1, "NET/OFI Selected provider is efa, fabric is efa (found 1 nics)"),
                at("a", 1, "Using network AWS Libfabric"),
                at("a", 1, "NET/OFI Couldn't open AV. RC: -12, ERROR: Cannot allocate memory", level="WARN")]
    check(classify_lines(explicit), "efa", "announced")


def test_nccl_2_3_internal_network_line() -> None:
    lines = [at("a", 1, "Using internal Network Socket"), at("b", 2, "Using internal Network Socket")]
    check(classify_lines(lines), "socket", "announced")


# -- single node --------------------------------------------------------------------------------
@pytest.mark.parametrize("era", ERAS, ids=lambda e: e.name)
def test_announced_network_on_one_node_is_intra_node(era: Era) -> None:
    lines = [*era.announce("h", 1, "Socket"), *era.announce("h", 2, "Socket"),
             era.channel("h", 1, 1, 0, "P2P/IPC/read"), era.channel("h", 2, 0, 1, "P2P/IPC/read")]
    verdict = classify_lines(lines)
    check(verdict, "intra_node", "channels")
    assert "never used" in verdict.reason and verdict.nodes == 1


@pytest.mark.parametrize("era", ERAS, ids=lambda e: e.name)
def test_every_rank_on_one_host_is_a_single_node(era: Era) -> None:
    lines = [*era.announce("h", 1, "IB"), *(era.comm("h", 1 + r, r, 4, 1) for r in range(4))]
    check(classify_lines(lines), "intra_node", "announced")
    # Three of four ranks shown: the fourth could be anywhere.
    partial = [*era.announce("h", 1, "IB"), *(era.comm("h", 1 + r, r, 4, 1) for r in range(3))]
    if not era.has_nnodes:
        check(classify_lines(partial), "ib", "announced")


def test_p2p_that_does_not_reach_every_rank_is_not_single_node() -> None:
    # A 16-rank ring, and P2P channels among ranks 0-7 only: the others are on another node.
    lines = [at("w0", 1, "Channel 01/16 :    0   8  15  14  13  12  11  10   9   1   2   3   4   5   6   7"),
             *(at("w0", 1 + r, f"Channel 07/0 : {r}[{r}] -> {r + 1}[{r + 1}] via P2P/CUMEM", dev=r) for r in range(7))]
    verdict = classify_lines(lines)
    check(verdict, "unknown", None)
    assert verdict.ranks == 16 and "ranks they do not reach" in verdict.reason
    # The same channels with no sign of more ranks: all 8 ranks share a machine.
    check(classify_lines(lines[1:]), "intra_node", "channels")


def test_stated_nnodes_beats_hostnames() -> None:
    # Two hosts each ran their own single-node job (nNodes 1): no network carried anything.
    lines = [at(h, 1, "Using network IB") for h in ("hw14", "hw15")]
    lines += [at(h, 1, "comm 0x1 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0") for h in ("hw14", "hw15")]
    check(classify_lines(lines), "intra_node", "announced")


# -- failure followed by a fallback --------------------------------------------------------------
FAILURES = [
    at("a", 1, "NET/OFI aws-ofi-nccl initialization failed", level="WARN"),
    "a:1:9 [0] nccl_net_ofi_create_plugin:1067 NCCL WARN NET/OFI aws-ofi-nccl initialization failed",
    at("a", 1, "NET/OFI Only EFA provider is supported", level="WARN"),
    at("a", 1, "NET/OFI Couldn't open AV. RC: -22, ERROR: Invalid argument", level="WARN"),
    at("a", 1, "NET/OFI No eligible providers were found"),
    at("a", 1, "NET/OFI Couldn't find any optimal provider", level="WARN"),
    at("a", 1, "NET/OFI OFI fi_getinfo() call failed: No data available", level="WARN"),
    at("a", 1, "NET/OFI Unable to find a protocol that worked.  Failing initialization.", level="WARN"),
    at("a", 1, "NET/Plugin: Failed to find ncclNetPlugin symbol (>= v5). ncclNetPlugin symbols v4 and lower "
               "are not supported."),
    at("a", 1, "Failed to initialize NET plugin Libfabric"),
    at("a", 1, "net.cc:56 -> 2"),
    at("a", 1, "plugin/net.cc:118 -> 2"),
]


@pytest.mark.parametrize("failure", FAILURES)
def test_plugin_failure_then_socket_is_a_fallback(failure: str) -> None:
    lines = [failure, at("a", 1, "NET/IB : No device found."), at("a", 1, "Using network Socket")]
    # One host's fallback, the node count not shown: Socket is what every such machine announces.
    one = classify_lines(lines)
    check(one, "unknown", None)
    assert "a network plugin failed, then NCCL announced its Socket network" in one.reason
    lines.append(at("a", 1, "comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0"))
    verdict = classify_lines(lines)
    check(verdict, "socket", "failure")
    assert verdict.decided_by[0] == failure and "failed to initialise" in verdict.reason
    assert any("fell back to TCP sockets" in w for w in verdict.warnings)
    # With nothing after it, a failure decides nothing.
    alone = classify_lines([failure])
    check(alone, "unknown", None)
    assert any("failed to initialise" in w for w in alone.warnings)


@pytest.mark.parametrize("era", NEW_ERAS, ids=lambda e: e.name)
def test_fallback_to_ib_and_to_one_node(era: Era) -> None:
    failed = at("a", 1, "NET/OFI Selected Provider is verbs;ofi_rxm (found 58 nics)")
    pci = at("a", 1, "NET/OFI Invalid type of PCI bus returned 0")
    verdict = classify_lines([failed, pci, *era.announce("a", 1, "IB")])
    check(verdict, "ib", "failure")
    single = classify_lines([pci, *era.announce("a", 1, "Socket"), era.comm("a", 1, 0, 2, 1),
                             era.comm("a", 2, 1, 2, 1)])
    check(single, "intra_node", "announced")
    assert any("failed to initialise" in w for w in single.warnings)


def test_ofi_recovering_after_a_failure_is_not_a_fallback() -> None:
    # aws-ofi-nccl tries the rdma protocol, then sendrecv; NCCL keeps the plugin.
    lines = [at("a", 1, "NET/OFI Failed to initialize rdma protocol", level="WARN"),
             at("a", 1, "NET/OFI Selected provider is efa, fabric is efa (found 4 nics)"),
             at("a", 1, "Using network Libfabric"), at("b", 2, "Using network Libfabric")]
    verdict = classify_lines(lines)
    check(verdict, "efa", "announced")
    assert any("failed to initialise" in w for w in verdict.warnings)


# -- look-alikes ----------------------------------------------------------------------------------
def test_lookalikes_never_decide() -> None:
    noise = [
        at("a", 1, "NET/Plugin: Failed to find ncclNetPlugin_v8 symbol."),  # probing older API versions
        at("a", 1, "NET/Plugin: Failed to find ncclCollNetPlugin_v6 symbol."),
        at("a", 1, "NET/Plugin: Using internal network plugin."),
        at("a", 1, "Using non-device net plugin version 0"),
        at("a", 1, "Bootstrap : Using ib0:10.0.0.1<0>"),
        at("a", 1, "NCCL_SOCKET_IFNAME set by environment to ib0"),
        at("a", 1, "TUNER/Plugin: Failed to find ncclTunerPlugin_v2 symbol, using internal tuner instead."),
        "a:1:9 [0] graph/search.cc:765 NCCL WARN Could not find a path for pattern 4, falling back to simple order",
        at("a", 1, "NVLS comm 0x1 headRank 0 nHeads 1 buffSize 4194304, falling back to simple order"),
        at("a", 1, "Loaded net plugin Libfabric (v10)"),
        at("a", 1, "Initialized NET plugin Libfabric"),
        "a:1:9 [0] transport/net.cc:644 NCCL INFO transport/net.cc:644 -> 6",
    ]
    verdict = classify_lines(noise[:-1])
    check(verdict, "unknown", None)
    assert verdict.warnings == ()
    # A connection that failed in the net transport is an error worth a warning, not a plugin failure.
    with_error = classify_lines(noise)
    check(with_error, "unknown", None)
    assert not any("failed to initialise" in w for w in with_error.warnings)
    # The initialised plugin (NCCL 2.27+ assigns it to the comm) on an EC2 instance family that has EFA:
    # two weak clues, which together are EFA (issue 39).
    family = at("a", 1, "NET/OFI NCCL_OFI_TUNER is not available for platform : p5.48xlarge, Fall back to NCCL's tuner")
    check(classify_lines([*noise[:-1], family]), "efa", "announced")


def test_ib0_interface_is_not_infiniband() -> None:
    lines = [at("a", 1, "NET/IB : No device found."), at("a", 1, "NET/Socket : Using [0]ib0:10.0.0.1<0>"),
             at("b", 2, "NET/Socket : Using [0]ib0:10.0.0.2<0>"), at("a", 1, "Using network Socket")]
    check(classify_lines(lines), "socket", "announced")


def test_ray_dedup_suffix_is_not_part_of_the_network_name() -> None:
    lines = ["(RayTrainWorker pid=9, ip=10.0.0.1) h:9:10 [0] NCCL INFO Using network Socket "
             "[repeated 15x across cluster]",
             "(RayTrainWorker pid=9, ip=10.0.0.1) h:9:10 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 2 "
             "localRanks 8 localRank 0 MNNVL 0"]
    verdict = classify_lines(lines)
    check(verdict, "socket", "announced")
    assert verdict.network == "Socket"


def test_colour_codes_in_the_message_do_not_hide_the_network() -> None:
    # Ray colours its dedup marker; pasted logs keep the codes without the escape byte.
    for reset in ("\x1b[32m", " [32m"):
        line = (f"(RayWorkerVllm pid=5) [pod-name]:5:9 [7] NCCL INFO Using network Socket{reset} "
                "[repeated 6x across cluster]")
        two = line.replace("[pod-name]", "[pod-2]").replace("pid=5", "pid=6")
        verdict = classify_lines([line + ("\x1b[0m" if "\x1b" in reset else " [0m"), two])
        check(verdict, "socket", "announced")
        assert verdict.network == "Socket"


def test_soft_roce_is_ib_with_a_warning() -> None:
    lines = [at("m", 1, "NET/IB : Using [0]rxe0:1/RoCE [RO]; OOB ens1:192.168.10.13<0>")]
    verdict = classify_lines(lines)
    check(verdict, "ib", "announced")
    assert any("soft-RoCE" in w for w in verdict.warnings)


# -- contradictions -------------------------------------------------------------------------------
def test_mixed_announcements_take_the_slowest_and_warn() -> None:
    lines = [*two_nodes(ERAS[3], "IB"), at("c", 3, "Using network Socket")]  # nNodes 2: Socket crosses nodes
    verdict = classify_lines(lines)
    check(verdict, "socket", "announced")
    assert verdict.hosts == {"a": "ib", "b": "ib", "c": "socket"}
    assert any("different networks" in w for w in verdict.warnings)


# -- live -----------------------------------------------------------------------------------------
def test_live_announced_then_channels() -> None:
    analyzer = NcclAnalyzer()
    for line in [at("a", 1, "NET/OFI Selected provider is efa, fabric is efa (found 4 nics)"),
                 at("a", 1, "Using network Libfabric"),
                 at("a", 1, "comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0")]:
        analyzer.feed(line)
    check(analyzer.verdict(), "efa", "announced")
    analyzer.feed(at("a", 1, "Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Libfabric/0/GDRDMA"))
    check(analyzer.verdict(), "efa_gdr", "channels")


def test_live_efa_then_a_fallback_appears() -> None:
    analyzer = NcclAnalyzer()
    for line in [at("a", 1, "NET/OFI Selected provider is efa, fabric is efa (found 1 nics)"),
                 at("a", 1, "Using network AWS Libfabric"),
                 at("a", 1, "comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0")]:
        analyzer.feed(line)
    check(analyzer.verdict(), "efa", "announced")
    for line in ["b:2:3 [0] nccl_net_ofi_create_plugin:1067 NCCL WARN NET/OFI aws-ofi-nccl initialization failed",
                 at("b", 2, "NET/IB : No device found."), at("b", 2, "NET/Socket : Using [0]eth0:10.0.0.2<0>"),
                 at("b", 2, "Using network Socket")]:
        analyzer.feed(line)
    verdict = analyzer.verdict()
    check(verdict, "socket", "failure")
    assert verdict.hosts == {"a": "efa", "b": "socket"}
    analyzer.feed(at("b", 2, "Channel 00/0 : 0[0] -> 1[0] [receive] via NET/Socket/0"))
    check(analyzer.verdict(), "socket", "channels")
