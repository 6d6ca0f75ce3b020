"""The transport verdict: what NCCL uses, and the evidence for it (plain data, stdlib only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TRANSPORTS = ("efa", "efa_gdr", "socket", "ib", "intra_node", "unknown")
# When ranks disagree the job runs at the pace of its slowest link.
SLOWEST_FIRST = ("socket", "unknown", "ib", "efa", "efa_gdr")
LABELS = {
    "efa": "EFA (libfabric efa provider)",
    "efa_gdr": "EFA with GPUDirect RDMA",
    "socket": "TCP sockets",
    "ib": "InfiniBand / RoCE verbs",
    "intra_node": "intra-node only (P2P/SHM/NVLS), no network used",
    "unknown": "unknown (not enough evidence yet)",
}

def provider_transport(provider: str | None) -> str:
    """What a libfabric provider string means for us: ``tcp;ofi_rxm`` is not EFA."""
    if not provider:
        return "unknown"
    core = provider.lower().split(";", 1)[0]
    if core.startswith("efa"):
        return "efa"
    if core in ("tcp", "sockets", "udp", "net"):
        return "socket"
    if core in ("verbs", "psm3", "psm2", "opx", "cxi"):
        return "ib"
    return "unknown"


@dataclass(frozen=True)
class Verdict:
    """The transport verdict for a whole job, plus why we believe it."""

    transport: str
    reason: str
    nccl_version: str | None = None
    plugin: str | None = None
    plugin_version: str | None = None
    provider: str | None = None
    network: str | None = None
    nodes: int | None = None
    ranks: int | None = None
    hosts: dict[str, str] = field(default_factory=dict)
    evidence: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return LABELS[self.transport]

    def satisfies(self, required: str) -> bool:
        """``efa_gdr`` is a kind of ``efa``; ``any`` accepts every verdict."""
        if required == "any":
            return True
        if required == "efa":
            return self.transport in ("efa", "efa_gdr")
        return self.transport == required

    def to_dict(self) -> dict[str, Any]:
        return {
            "transport": self.transport, "label": self.label, "reason": self.reason,
            "nccl_version": self.nccl_version, "plugin": self.plugin,
            "plugin_version": self.plugin_version, "provider": self.provider,
            "network": self.network, "nodes": self.nodes, "ranks": self.ranks,
            "hosts": dict(self.hosts), "warnings": list(self.warnings),
            "evidence": list(self.evidence),
        }
