"""Shared helpers for the telemetry tests (a unique module name: tests/ has no __init__.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
NCCL_LOGS = REPO_ROOT.parent / "shared" / "nccl_logs"


def manifest_entries() -> list[dict[str, Any]]:
    manifest = NCCL_LOGS / "MANIFEST.json"
    if not manifest.is_file():
        return []
    return list(json.loads(manifest.read_text(encoding="utf-8")))


# The logs of tests/telemetry/public_logs added after issue 39's rules were written ("added_after_rules"),
# which the classifier reads unlike their labels, measured once and not tuned on (the closing
# note gives the figure). Each stays a strict xfail: fixing one shows, and the figure is then re-stated.
HELD_OUT_MISSES = {
    "nccl1706_one_process_comm_init_all_two_gpus.log":
        "one process holds both ranks, but its only complete comm line is 'ncclCommInitAll' (no handler) and "
        "rank 0's was cut: no rule places every rank: unknown",
    "nccl1773_one_process_eight_gpus_p2p_direct_pointer.log":
        "one process drives devices 0-7, but the P2P lines shown do not join every rank and no line states "
        "the communicator's size: unknown",
    "nccl300_one_container_four_ranks_loopback_socket.log":
        "NCCL bootstraps on lo:127.0.0.1 only; no rule reads a loopback-only job as one machine: unknown",
    "nccl676_two_hosts_nccl_net_socket_forced_announced.log":
        "the second host (gpu02) shows only on 'NCCL_SOCKET_IFNAME set' lines, which no handler reads, so "
        "its prefix is never counted: one host seen, Socket announced: unknown (a bug: hosts are counted "
        "only from the lines the analyser handles)",
    "nccl1267_one_rank_communicator_socket_announced.log":
        "a 1-rank communicator ('nranks 1') has no peer, but no rule reads one rank as one node: unknown",
}
