"""The transport verdict: what NCCL uses, and the evidence for it (plain data, stdlib only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TRANSPORTS = ("efa", "efa_gdr", "socket", "ib", "intra_node", "gloo", "unknown")
# What a verdict rests on, strongest first: channels that connected over a network, a plugin
# failure followed by a fallback, or only the network NCCL announced. None for ``unknown``.
BASES = ("channels", "failure", "announced", "backend")
# When ranks disagree the job runs at the pace of its slowest link.
SLOWEST_FIRST = ("socket", "unknown", "ib", "efa", "efa_gdr")
LABELS = {
    "efa": "EFA (libfabric efa provider)",
    "efa_gdr": "EFA with GPUDirect RDMA",
    "socket": "TCP sockets",
    "ib": "InfiniBand / RoCE verbs",
    "intra_node": "intra-node only (P2P/SHM/NVLS), no network used",
    "gloo": "gloo (no NCCL)",
    "unknown": "unknown (not enough evidence yet)",
}

def provider_transport(provider: str | None) -> str:
    """What the OFI plugin's libfabric provider means for the verdict: ``efa`` (``efa``, ``efa-direct``)
    or ``unknown``. Another provider (HPE Slingshot's ``cxi``, ``tcp;ofi_rxm``, ``verbs;ofi_rxm``) is none
    of the transports the badge names (not NCCL's Socket or IB transport either): the verdict's
    reason and its ``provider`` field name it instead."""
    if not provider:
        return "unknown"
    return "efa" if provider.lower().split(";", 1)[0].startswith("efa") else "unknown"


@dataclass(frozen=True)
class Verdict:
    """The transport verdict for a whole job, plus why we believe it."""

    transport: str
    reason: str
    basis: str | None = None
    nccl_version: str | None = None
    plugin: str | None = None
    plugin_version: str | None = None
    provider: str | None = None
    network: str | None = None
    nodes: int | None = None
    nodes_basis: str | None = None  # what the node count rests on ("NCCL's comm line: nNodes 1", ...)
    ranks: int | None = None
    hosts: dict[str, str] = field(default_factory=dict)
    evidence: tuple[str, ...] = ()  # decided_by first, then context
    decided_by: tuple[str, ...] = ()  # the lines the verdict rests on
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

    def describe(self, *, max_evidence: int = 6) -> list[str]:
        """Indented human lines: why, versions, size, warnings, the top evidence."""
        out = [f"  basis: {self.basis or 'none'} — {self.reason}"]
        versions = [f"NCCL {self.nccl_version or '?'}"]
        if self.plugin or self.plugin_version:
            versions.append("plugin " + " / ".join(x for x in (self.plugin, self.plugin_version) if x))
        if self.provider:
            versions.append(f"provider {self.provider}")
        out.append("  " + ", ".join(versions))
        size = f"  nodes {'?' if self.nodes is None else self.nodes}, ranks {'?' if self.ranks is None else self.ranks}"
        out.append(size + (f" (nodes: {self.nodes_basis})" if self.nodes_basis else ""))
        if len(set(self.hosts.values()) - {"unknown"}) > 1:  # a host that showed nothing is no contradiction
            out.append("  per host: " + ", ".join(f"{h}={t}" for h, t in self.hosts.items()))
        out.extend(f"  warning: {w}" for w in self.warnings)
        if self.decided_by and max_evidence:
            out.append("  rests on:")
            out.extend(f"    {line}" for line in self.decided_by[:max_evidence])
        context = self.evidence[len(self.decided_by):][: max(0, max_evidence - len(self.decided_by))]
        if context:
            out.append("  context:")
            out.extend(f"    {line}" for line in context)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "transport": self.transport, "basis": self.basis, "label": self.label, "reason": self.reason,
            "nccl_version": self.nccl_version, "plugin": self.plugin,
            "plugin_version": self.plugin_version, "provider": self.provider,
            "network": self.network, "nodes": self.nodes, "nodes_basis": self.nodes_basis, "ranks": self.ranks,
            "hosts": dict(self.hosts), "warnings": list(self.warnings),
            "evidence": list(self.evidence), "decided_by": list(self.decided_by),
        }
