"""How the NCCL analyser turns what it has gathered per process into a ``Verdict``.

The feeding half (``nccl.py``) only records facts per process (host, pid): the networks
its channels used, the provider it selected, its rank. Deciding happens here, on demand:
the job runs at the pace of its slowest link, a single node never uses its announced
network, and the evidence shown first is what decided. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from training.logparse.verdict import SLOWEST_FIRST, Verdict, provider_transport


def net_kind(name: str) -> str:
    """The family of a ``via NET/<name>`` network; never guessed from interface names."""
    low = name.lower().strip()
    if "libfabric" in low or "ofi" in low or low.startswith("aws"):
        return "ofi"
    if low == "socket":
        return "socket"
    if low.startswith("ib") or low in ("rdma", "verbs"):
        return "ib"  # IB, IBext, IBext_v8: NCCL's verbs transport (InfiniBand or RoCE)
    return "other:" + name


@dataclass(slots=True)
class Proc:
    """What one NCCL process (host, pid) has shown so far."""

    host: str
    rank: int | None = None
    n_ranks: int = 0
    n_nodes: int = 0
    network: str | None = None
    provider: str | None = None
    plugin_missing: bool = False
    plugin_failed: bool = False
    net: dict[str, bool] = field(default_factory=dict)  # kind -> every channel had GDRDMA
    intra: bool = False


class VerdictRules:
    """The deciding half of ``NcclAnalyzer``: reads the state its feeding half keeps."""

    _procs: dict[tuple[str, int | None], Proc]
    _versions: list[str]
    _plugin: str | None
    _plugin_version: str | None
    _providers: list[str]
    _ofi_seen: bool
    _evidence: dict[tuple[str, ...], str]
    _notes: dict[str, str]
    _cached: Verdict | None
    nccl_lines: int

    def verdict(self) -> Verdict:
        if self._cached is None:
            self._cached = self._decide()
        return self._cached

    def _proc_transports(self, proc: Proc, host_provider: str | None) -> set[str]:
        found: set[str] = set()
        for kind, all_gdr in proc.net.items():
            if kind == "ofi":
                base = provider_transport(proc.provider or host_provider or self._job_provider())
                if base == "efa" and all_gdr:
                    base = "efa_gdr"
                found.add(base)
            elif kind.startswith("other:"):
                found.add("unknown")
            else:
                found.add(kind)
        return found

    def _job_provider(self) -> str | None:
        return self._providers[0] if len(self._providers) == 1 else None

    def _decide(self) -> Verdict:
        procs = list(self._procs.values())
        n_nodes = max((p.n_nodes for p in procs), default=0)
        hosts = sorted({p.host for p in procs if p.host})
        nodes = n_nodes or len(hosts) or None
        n_ranks = max((p.n_ranks for p in procs), default=0)
        ranked = {p.rank for p in procs if p.rank is not None}
        with_pid = sum(1 for key in self._procs if key[1] is not None)
        ranks = n_ranks or max(len(ranked), with_pid) or None

        host_providers: dict[str, str] = {}
        for p in procs:
            if p.provider:
                host_providers.setdefault(p.host, p.provider)
        per_host: dict[str, set[str]] = {}
        host_intra: dict[str, bool] = {}
        for p in procs:
            per_host.setdefault(p.host, set()).update(self._proc_transports(p, host_providers.get(p.host)))
            host_intra[p.host] = host_intra.get(p.host, False) or p.intra
        used = set().union(*per_host.values()) if per_host else set()
        multi_node = (nodes or 0) > 1
        warnings = dict(self._notes)

        if used:
            transport = next(t for t in SLOWEST_FIRST if t in used)
            bases = {"efa" if t == "efa_gdr" else t for t in used}
            if len(bases) > 1:
                warnings["mixed"] = "mixed transports across ranks: " + ", ".join(sorted(used))
            elif len(used) > 1:
                warnings["mixed-gdr"] = "GPUDirect RDMA is used by some ranks only"
            reason = self._reason_used(transport)
        elif any(host_intra.values()) or n_nodes == 1:
            if multi_node:
                transport = "unknown"
                reason = (f"{nodes} nodes, but no channel has connected over a network yet "
                          "(only intra-node P2P/SHM channels seen)")
            else:
                transport = "intra_node"
                announced = self._announced()
                reason = "a single node: channels use only P2P/SHM/NVLS" + (
                    f"; the announced network '{announced}' is never used" if announced else "")
        else:
            transport = "unknown"
            reason = ("no NCCL output seen" if not self.nccl_lines
                      else "no NCCL channel has connected yet")
        if transport == "unknown" and any("ofi" in p.net for p in procs) and not self._providers:
            warnings.setdefault("no-provider",
                                "the OFI plugin carried traffic but its provider was never logged")
        if transport == "socket":
            tried = self._ofi_seen or self._plugin or any(p.plugin_failed or p.plugin_missing for p in procs)
            if tried:
                warnings.setdefault("fallback", "NCCL fell back to TCP sockets although a network plugin "
                                    "was configured or attempted")
            else:
                warnings.setdefault("fallback", "NCCL is using TCP sockets: no EFA/IB transport was set up")
        missing = any(p.plugin_missing for p in procs) and self._plugin is None
        if transport in ("socket", "unknown") and missing:
            warnings.setdefault("plugin-missing", "no external network plugin (libnccl-net.so) was loaded")

        host_verdicts: dict[str, str] = {}
        for host in hosts:
            kinds = per_host.get(host, set())
            if kinds:
                host_verdicts[host] = next(t for t in SLOWEST_FIRST if t in kinds)
            else:
                host_verdicts[host] = "intra_node" if host_intra.get(host) and not multi_node else "unknown"
        return Verdict(
            transport=transport, reason=reason,
            nccl_version=self._versions[0] if self._versions else None,
            plugin=self._plugin, plugin_version=self._plugin_version,
            provider=self._job_provider() or (";".join(self._providers) or None),
            network=self._announced(), nodes=nodes, ranks=ranks, hosts=host_verdicts,
            evidence=tuple(self._ranked_evidence(transport)),
            warnings=tuple(warnings.values())
            + (("several NCCL versions in one job: " + ", ".join(self._versions),)
               if len(self._versions) > 1 else ()),
        )

    def _announced(self) -> str | None:
        for p in self._procs.values():
            if p.network:
                return p.network
        return None

    def _reason_used(self, transport: str) -> str:
        if transport in ("efa", "efa_gdr"):
            return "channels connect via the OFI plugin with the efa provider" + (
                " and GPUDirect RDMA" if transport == "efa_gdr" else "")
        if transport == "socket":
            return "channels connect via NET/Socket or a TCP libfabric provider"
        if transport == "ib":
            return "channels connect via NCCL's IB verbs transport"
        return "channels use a network whose kind we cannot tell"

    def _ranked_evidence(self, transport: str) -> list[str]:
        # The lines that decided the verdict first, context after.
        order = {"channel": 0, "provider": 1, "network": 2, "forced": 2, "plugin-failed": 2,
                 "provider-missing": 2, "plugin": 3, "plugin-missing": 3, "version": 4, "nodes": 5}

        def rank(key: tuple[str, ...]) -> int:
            if key[0] == "channel" and key[1] == "intra" and transport != "intra_node":
                return 6
            return order.get(key[0], 9)

        items = sorted(self._evidence.items(), key=lambda kv: rank(kv[0]))
        return [line for _, line in items]
