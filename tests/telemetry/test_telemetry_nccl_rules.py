"""Hand-made NCCL lines for each rule, NCCL eras 2.4 .. 2.29, and look-alikes."""

from __future__ import annotations

import pytest

from training.logparse import NcclAnalyzer, classify_lines
from training.logparse.verdict import provider_transport


def at(host: str, pid: int, dev: int, msg: str) -> str:
    return f"{host}:{pid}:{pid + 7} [{dev}] NCCL INFO {msg}"


def two_node(net_channel: str, *, provider: str | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    lines = [at("a", 1, 0, "NCCL version 2.18.5+cuda12.2")]
    if provider:
        lines += [at(h, p, 0, f"NET/OFI Selected provider is {provider}, fabric is x (found 1 nics)")
                  for h, p in (("a", 1), ("b", 2))]
    lines += [at("a", 1, 0, "comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0"),
              at("b", 2, 0, "comm 0x2 rank 1 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0"),
              at("a", 1, 0, f"Channel 00/0 : 1[0] -> 0[0] [receive] via {net_channel}"),
              at("b", 2, 0, f"Channel 00/0 : 0[0] -> 1[0] [receive] via {net_channel}"),
              *extra]
    return lines


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (two_node("NET/Libfabric/0", provider="efa"), "efa"),
        (two_node("NET/AWS Libfabric/1/GDRDMA", provider="efa"), "efa_gdr"),
        (two_node("NET/Libfabric/0/GDRDMA", provider="efa-direct"), "efa_gdr"),
        (two_node("NET/Socket/0"), "socket"),
        (two_node("NET/IB/0/GDRDMA"), "ib"),
        (two_node("NET/IBext_v8/0/GDRDMA"), "ib"),
        (two_node("NET/IB/0(1)/GDRDMA"), "ib"),
        # libfabric look-alikes: the OFI plugin carrying TCP, verbs or Slingshot is not EFA, and it is
        # not NCCL's own Socket or IB transport either (the verdict names the provider instead)
        (two_node("NET/Libfabric/0", provider="tcp;ofi_rxm"), "unknown"),
        (two_node("NET/AWS Libfabric/0", provider="sockets"), "unknown"),
        (two_node("NET/Libfabric/0", provider="verbs;ofi_rxm"), "unknown"),
        (two_node("NET/Libfabric/0/GDRDMA", provider="cxi"), "unknown"),
        # OFI traffic but the provider line never made it into the log (issue 39): traffic through the
        # plugin is EFA evidence, and nothing names another fabric
        (two_node("NET/Libfabric/0"), "efa"),
        (two_node("NET/AWS Libfabric/0/GDRDMA"), "efa_gdr"),
        # ... unless a line names another fabric in its own words (Slingshot's NICs, ofi_rxm)
        (two_node("NET/AWS Libfabric/0/GDRDMA", extra=(
            at("a", 1, 0, "NET/AWS Libfabric : GPU Direct RDMA Enabled for HCA 0 'cxi0'"),)), "unknown"),
        (two_node("NET/AWS Libfabric/0", extra=(
            "libfabric:9:1700000000:ofi_rxm:ep_ctrl:rxm_conn_connect():449<warn> connect failed",)), "unknown"),
    ],
)
def test_channel_transport(lines: list[str], expected: str) -> None:
    verdict = classify_lines(lines)
    assert verdict.transport == expected, verdict.reason
    assert verdict.nodes == 2 and verdict.ranks == 2
    assert verdict.hosts == {"a": expected, "b": expected}


def test_efa_with_some_channels_without_gdr_is_plain_efa() -> None:
    lines = two_node("NET/Libfabric/0/GDRDMA", provider="efa",
                     extra=(at("a", 1, 0, "Channel 01/0 : 1[0] -> 0[0] [receive] via NET/Libfabric/0"),))
    assert classify_lines(lines).transport == "efa"


def test_single_node_announcing_a_network_is_intra_node() -> None:
    lines = [at("h", 1, 0, "Using network Socket"), at("h", 1, 0, "Using network AWS Libfabric"),
             at("h", 1, 0, "NET/OFI Selected provider is efa, fabric is efa (found 4 nics)"),
             at("h", 1, 0, "comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0"),
             at("h", 1, 0, "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"),
             at("h", 2, 1, "Channel 00 : 1[1] -> 0[0] via SHM/direct/direct")]
    verdict = classify_lines(lines)
    assert verdict.transport == "intra_node"
    assert "never used" in verdict.reason


def test_multi_node_with_only_p2p_seen_yet_is_unknown() -> None:
    lines = [at("a", 1, 0, "comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0"),
             at("a", 1, 0, "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read")]
    verdict = classify_lines(lines)
    assert verdict.transport == "unknown" and "2 nodes" in verdict.reason


def test_nccl_2_4_era_ring_lines() -> None:
    lines = ["NCCL version 2.4.8+cuda10.1",
             "ip-1:100:100 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).",
             "ip-1:100:100 [0] NCCL INFO NET/IB : No device found.",
             "ip-1:100:100 [0] NCCL INFO NET/Socket : Using [0]ib0:172.31.12.210<0>",
             "ip-1:100:120 [0] NCCL INFO Ring 00 :    0   1",
             "ip-1:100:120 [0] NCCL INFO Ring 00 : 1 -> 0 [receive] via NET/Socket/0",
             "ip-2:200:220 [0] NCCL INFO Ring 00 : 0 -> 1 [receive] via NET/Socket/0",
             "ip-1:100:120 [0] NCCL INFO comm 0x7f rank 0 nranks 2 cudaDev 0 nvmlDev 0 - Init COMPLETE"]
    verdict = classify_lines(lines)
    assert verdict.transport == "socket"
    assert verdict.nccl_version == "2.4.8+cuda10.1" and verdict.nodes == 2 and verdict.ranks == 2
    assert any("plugin" in w for w in verdict.warnings)


def test_nccl_2_5_era_direct_shared_memory_is_intra_node() -> None:
    lines = ["h:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via direct shared memory",
             "h:1:1 [0] NCCL INFO comm 0x7f rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE"]
    assert classify_lines(lines).transport == "intra_node"


def test_interface_named_ib0_is_not_infiniband() -> None:
    lines = [at("a", 1, 0, "Bootstrap : Using ib0:10.0.0.1<0>"),
             at("a", 1, 0, "NET/Socket : Using [0]ib0:10.0.0.1<0> [1]ibp12s0:10.0.1.1<0>"),
             at("a", 1, 0, "NCCL_SOCKET_IFNAME set by environment to ib0"),
             *two_node("NET/Socket/0")]
    assert classify_lines(lines).transport == "socket"


def test_simple_order_and_tuner_fallbacks_are_not_network_fallbacks() -> None:
    lines = two_node("NET/Libfabric/0/GDRDMA", provider="efa", extra=(
        at("a", 1, 0, "NET/OFI NCCL_OFI_TUNER is not available for platform : g6e.48xlarge, "
                      "Fall back to NCCL's tuner"),
        at("a", 1, 0, "TUNER/Plugin: Failed to find ncclTunerPlugin_v2 symbol, using internal tuner "
                      "instead."),
        at("a", 1, 0, "NVLS comm 0x1 headRank 0 nHeads 1 buffSize 4194304, falling back to simple order"),
        at("a", 1, 0, "NET/Plugin: Failed to find ncclCollNetPlugin_v8 symbol."),
    ))
    verdict = classify_lines(lines)
    assert verdict.transport == "efa_gdr"
    assert verdict.warnings == ()


def test_socket_after_ofi_failure_warns_fallback_and_failure() -> None:
    lines = [at("a", 1, 0, "NET/OFI Initializing aws-ofi-nccl 1.7.4-aws"),
             "a:1:8 [0] nccl_net_ofi_create_plugin:335 NCCL WARN NET/OFI aws-ofi-nccl initialization failed",
             at("a", 1, 0, "NET/OFI No eligible providers were found"),
             *two_node("NET/Socket/0")]
    verdict = classify_lines(lines)
    assert verdict.transport == "socket"
    text = " | ".join(verdict.warnings)
    assert "fell back to TCP sockets" in text
    assert "failed to initialise" in text or "no usable provider" in text
    assert verdict.plugin_version == "aws-ofi-nccl 1.7.4-aws"


def test_forced_nccl_net_is_warned() -> None:
    lines = [at("a", 1, 0, "NCCL_NET set by environment to Socket"), *two_node("NET/Socket/0")]
    verdict = classify_lines(lines)
    assert any("NCCL_NET is forced" in w for w in verdict.warnings)
    lookalike = [at("a", 1, 0, "NCCL_NET_GDR_LEVEL set by environment to 5"), *two_node("NET/IB/0")]
    assert classify_lines(lookalike).warnings == ()


def test_mixed_transports_across_ranks() -> None:
    lines = [at("a", 1, 0, "NET/OFI Selected provider is efa, fabric is efa (found 1 nics)"),
             at("b", 2, 0, "NET/OFI Selected provider is efa, fabric is efa (found 1 nics)"),
             at("a", 1, 0, "comm 0x1 rank 0 nRanks 3 nNodes 3 localRanks 1 localRank 0 MNNVL 0"),
             at("a", 1, 0, "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Libfabric/0"),
             at("b", 2, 0, "Channel 00/0 : 0[0] -> 1[0] [receive] via NET/Libfabric/0"),
             at("c", 3, 0, "Channel 00/0 : 0[0] -> 2[0] [receive] via NET/Socket/0")]
    verdict = classify_lines(lines)
    assert verdict.transport == "socket"  # the job runs at the pace of its slowest link
    assert verdict.hosts == {"a": "efa", "b": "efa", "c": "socket"}
    assert any("mixed transports" in w for w in verdict.warnings)


def test_truncated_and_interleaved_lines() -> None:
    lines = [at("a", 1, 0, "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Libf"),  # cut mid-word
             "a:1:8 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NEa:1:8 [0] NCCL INFO Trees",
             at("a", 1, 0, "NCCL vers"), at("a", 1, 0, "Selected provider is"), "NCCL INFO",
             "a:1:8 [0] NCCL INFO Using network"]
    verdict = classify_lines(lines)
    assert verdict.transport == "unknown" and verdict.nccl_version is None
    # two ranks' output spliced into one physical line still yields the complete record
    spliced = at("a", 1, 0, "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0") + "b:2:9 [0] NCCL IN"
    assert classify_lines([*two_node("NET/Socket/0")[:3], spliced]).transport == "socket"


def test_binary_garbage_and_empty_input() -> None:
    assert classify_lines([]).transport == "unknown"
    assert classify_lines([]).reason == "no NCCL output seen"
    garbage = ["\x00\xff\ufffdNCCL\x1b[31m via NET/\x00 ->", "NCCL INFO \x00" * 500, "NCCL" * 10_000]
    assert classify_lines(garbage).transport in ("unknown", "socket", "ib", "efa")


def test_state_is_bounded_per_process_not_per_line() -> None:
    analyzer = NcclAnalyzer()
    for i in range(20_000):
        channel = f"Channel {i % 32:02d}/0 : 1[0] -> 0[0] [receive] via NET/Socket/{i % 4}"
        analyzer.feed(at("a", 1, 0, channel))
        analyzer.feed(at(f"ts-{i}", 1, 0, "Using network Socket"))  # a new process every line
    verdict = analyzer.verdict()
    assert len(verdict.evidence) <= 24 and len(analyzer._procs) <= 4096 + 1
    assert len(analyzer._by_prefix) <= 4096


def test_verdict_is_cached_until_something_changes() -> None:
    analyzer = NcclAnalyzer()
    analyzer.feed(at("a", 1, 0, "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0"))
    first = analyzer.verdict()
    analyzer.feed(at("a", 1, 0, "Channel 01/0 : 1[0] -> 0[0] [receive] via NET/Socket/0"))
    assert analyzer.verdict() is first
    analyzer.feed(at("b", 2, 0, "Channel 01/0 : 1[0] -> 0[0] [receive] via NET/IB/0"))
    assert analyzer.verdict() is not first


@pytest.mark.parametrize(("provider", "expected"), [
    ("efa", "efa"), ("efa-direct", "efa"), ("tcp;ofi_rxm", "unknown"), ("tcp", "unknown"),
    ("verbs;ofi_rxm", "unknown"), ("verbs", "unknown"), ("cxi", "unknown"), ("shm", "unknown"), (None, "unknown")])
def test_provider_transport(provider: str | None, expected: str) -> None:
    assert provider_transport(provider) == expected


def test_to_dict_is_json_ready() -> None:
    import json
    data = classify_lines(two_node("NET/Socket/0")).to_dict()
    assert json.loads(json.dumps(data))["transport"] == "socket"
