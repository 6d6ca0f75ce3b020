"""How the NCCL analyser turns what it has gathered per process into a ``Verdict``.

The feeding half (``nccl.py``) only records facts per process (host, pid): the networks its
channels used, the network it announced, the provider it selected, a plugin failure. Deciding
happens here, on demand, the way a careful reader ranks what a log shows:

1. ``channels``: a channel that connected ``via NET/<net>`` is proof of use. A single host
   whose channels go through the NIC (P2P and SHM disabled) is on that network too.
2. Single-node proof: ``intra_node``, whatever network was announced, because no NIC carries
   traffic. The node estimate says what it rests on (``_node_count``): the job's own node count
   when rtui runs it, ``nNodes``, host prefixes and bootstrap addresses, P2P/SHM/NVLS channels
   joining every rank, every rank placed on one host (comm lines, or as many processes on the
   one host as the communicator has ranks), ring/tree graphs without NET endpoints.
3. ``failure``: a plugin/provider failure followed by NCCL announcing one of its own
   networks (``Socket``, ``IB``) is a fallback, and the failure is its reason.
4. ``announced``: the network NCCL chose is the one that crosses nodes; a fragment that does
   not show the node count still names it, unless something shows a single node. A process
   whose only announcement is its bootstrap interface (NCCL 2.4-2.5) has not chosen yet.

The OFI plugin is EFA only when its provider line says ``efa`` (or the plugin took a path it
takes only on EFA); without that line the verdict is ``unknown`` and says the line is missing.

Anything that contradicts the winner (ranks on different transports, a channel that is not
the announced network) becomes a warning. The job runs at the pace of its slowest link.
Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from training.logparse.verdict import SLOWEST_FIRST, Verdict, provider_transport

# Past this a rank number is more likely garbage than a real job; it is not tracked.
MAX_RANK = 1 << 16


def net_kind(name: str) -> str:
    """The family of a network name (``via NET/<name>``, ``Using network <name>``)."""
    low = name.lower().strip()
    if "libfabric" in low or "ofi" in low or low.startswith("aws"):
        return "ofi"
    if low == "socket":
        return "socket"
    if low.startswith(("ib", "gib")) or low in ("rdma", "verbs"):
        return "ib"  # IB, IBext, IBext_v8 (HPC-X), gIB (Google): verbs over InfiniBand or RoCE
    return "other:" + name


def family(transport: str) -> str:
    return "efa" if transport == "efa_gdr" else transport


@dataclass(slots=True)
class Proc:
    """What one NCCL process (host, pid) has shown so far."""

    host: str
    rank: int | None = None
    n_ranks: int = 0
    n_nodes: int = 0
    network: str | None = None  # the network it announced last
    network_at: int = 0  # the analyser's line clock when it did
    network_line: str = ""  # the line that announced it
    tentative: str = ""  # why a later line may withdraw that announcement ("provider", "bootstrap")
    plugin_seen: bool = False
    failed_at: int = 0  # ... and when its plugin or provider last failed
    provider: str | None = None
    plugin_missing: bool = False
    net: dict[str, bool] = field(default_factory=dict)  # kind -> every channel had GDRDMA
    intra: bool = False


@dataclass(frozen=True, slots=True)
class Judgement:
    transport: str
    basis: str | None
    reason: str


class VerdictRules:
    """The deciding half of ``NcclAnalyzer``: reads the state its feeding half keeps."""

    _procs: dict[tuple[str, int | None], Proc]
    _versions: list[str]
    _plugin: str | None
    _plugin_version: str | None
    _providers: list[str]
    _ofi_seen: bool
    _evidence: dict[tuple[str, str], str]
    _notes: dict[str, str]
    _failures: dict[str, str]  # failure kind -> the message
    _first_failure_at: int
    _host_ips: dict[str, set[str]]
    _rank_hosts: dict[int, dict[int, str]]
    _parent: dict[int, int]
    _max_rank: int
    _intra_seen: bool
    _cached: Verdict | None
    _job_nodes: int | None
    _graph_net: bool
    _graph_local: bool
    _efa_only_seen: bool
    _ring_size: int
    _host_ranks: dict[str, set[int]]
    nccl_lines: int

    def verdict(self) -> Verdict:
        if self._cached is None:
            self._cached = self._decide()
        return self._cached

    # -- facts about the whole job ------------------------------------------------------
    def _node_count(self, procs: list[Proc]) -> tuple[int | None, bool, str | None]:
        """(nodes, proven single node, what the count rests on), strongest evidence first."""
        if self._job_nodes:
            return self._job_nodes, self._job_nodes == 1, f"the job itself runs on {self._job_nodes} " \
                f"node{'s' if self._job_nodes != 1 else ''}"
        stated = max((p.n_nodes for p in procs), default=0)
        if stated:
            return stated, stated == 1, f"NCCL's comm line says nNodes {stated}"
        # One hostname with two bootstrap IPs is two machines (containers named alike).
        hosts = {p.host for p in procs if p.host}
        seen = sum(max(1, len(self._host_ips.get(host, ()))) for host in hosts)
        if seen >= 2:
            why = f"{len(hosts)} hosts in the line prefixes" if len(hosts) >= 2 else \
                f"host {next(iter(hosts))} bootstraps from {seen} addresses"
            return seen, False, why
        if self._graph_net:
            return None, False, None  # the graphs reach NICs: more than one node, how many unknown
        known = self._known_ranks(procs)
        if self._intra_joins_every_rank(procs):
            return 1, True, f"P2P/SHM/NVLS channels join all {known} ranks"
        placed = self._every_rank_on_one_host(procs)
        if placed:
            return 1, True, placed
        if self._graph_local:
            return 1, True, "NCCL's ring/tree graphs have no NET endpoint (it drops the NICs when every rank is local)"
        return None, False, None

    def _every_rank_on_one_host(self, procs: list[Proc]) -> str | None:
        """Every rank of the communicator is placed on one host: by the comm lines (which say
        where each rank runs, before NCCL 2.20 printed nNodes), or because the one host seen
        runs as many processes as the communicator has ranks."""
        n_ranks = max((p.n_ranks for p in procs), default=0)
        hosts = self._rank_hosts.get(n_ranks, {})
        if n_ranks >= 2 and len(hosts) == n_ranks and len(set(hosts.values())) == 1:
            return f"all {n_ranks} ranks' comm lines come from host {next(iter(hosts.values()))}"
        # The size must be stated (comm line, ring order): the highest rank seen may be a fragment's.
        size = max(n_ranks, self._ring_size)
        names = {p.host for p in procs}
        if len(names) != 1 or "" in names or size < 2 or self._max_rank >= size:
            return None
        host = next(iter(names))
        if self._host_ranks.get(host, set()) >= set(range(size)):  # one process may hold them all (-g N)
            return f"every rank of the {size}-rank communicator prints its tree from the one host {host}"
        if len([key for key in self._procs if key[1] is not None]) == size:
            return f"{size} processes on the one host {host} for a {size}-rank communicator"
        return None

    def _known_ranks(self, procs: list[Proc]) -> int:
        return max(max((p.n_ranks for p in procs), default=0), self._max_rank + 1)

    def _intra_joins_every_rank(self, procs: list[Proc]) -> bool:
        """P2P/SHM only connect ranks of one machine: if they join every rank known, that is all."""
        known = self._known_ranks(procs)
        if not self._intra_seen or known < 2 or known > MAX_RANK:
            return False
        root = self._find(0)
        return all(self._find(rank) == root for rank in range(1, known))

    def _find(self, rank: int) -> int:
        parent = self._parent
        root = rank
        while parent.get(root, root) != root:
            root = parent[root]
        return root

    def _rank_count(self, procs: list[Proc]) -> int | None:
        with_pid = sum(1 for key in self._procs if key[1] is not None)
        return self._known_ranks(procs) or with_pid or None

    def _job_provider(self) -> str | None:
        return self._providers[0] if len(self._providers) == 1 else None

    # -- one group of processes (the job, or one host) ------------------------------------
    def _ofi_transport(self, provider: str | None) -> str:
        provider = provider or self._job_provider()
        if provider is None:
            # The plugin has the same name on every provider (efa, cxi, tcp, verbs): only its
            # provider line, or a path it takes only on EFA, tells.
            return "efa" if self._efa_only_seen else "unknown"
        return provider_transport(provider)

    def _ofi_without_provider(self, procs: list[Proc]) -> bool:
        uses_ofi = any("ofi" in p.net or net_kind(p.network or "") == "ofi" for p in procs)
        return uses_ofi and self._job_provider() is None and not any(p.provider for p in procs) \
            and not self._efa_only_seen

    def _channel_transports(self, proc: Proc, host_provider: str | None) -> set[str]:
        found: set[str] = set()
        for kind, all_gdr in proc.net.items():
            if kind == "ofi":
                base = self._ofi_transport(proc.provider or host_provider)
                found.add("efa_gdr" if base == "efa" and all_gdr else base)
            elif kind.startswith("other:"):
                found.add("unknown")
            else:
                found.add(kind)
        return found

    def _announced_transport(self, proc: Proc, host_provider: str | None) -> str:
        kind = net_kind(proc.network or "")
        if kind == "ofi":
            return self._ofi_transport(proc.provider or host_provider)
        return "unknown" if kind.startswith("other:") else kind

    def _fell_back(self, proc: Proc) -> bool:
        """A failure earlier in the log, then NCCL announced a network other than the plugin."""
        failed_at = proc.failed_at or self._first_failure_at
        return 0 < failed_at < proc.network_at and net_kind(proc.network or "") != "ofi"

    def _judge(self, procs: list[Proc], single: bool, providers: dict[str, str],
               warnings: dict[str, str] | None) -> Judgement:
        used: dict[str, set[str]] = {}
        for p in procs:
            for transport in self._channel_transports(p, providers.get(p.host)):
                used.setdefault(transport, set()).add(p.host)
        if used:
            transport = next(t for t in SLOWEST_FIRST if t in used)
            if warnings is not None:
                self._channel_warnings(procs, used, providers, warnings)
            return Judgement(transport, "channels", self._reason_used(transport))
        if single:
            network = self._announced()
            why = f"a single node ({self._node_count(procs)[2]}): no network is used"
            if network:
                why += f"; the announced network '{network}' is never used"
            return Judgement("intra_node", "channels" if self._intra_seen else "announced", why)
        announced: dict[str, bool] = {}  # transport -> some process got there by a fallback
        # A bootstrap interface is no choice when another process shows the one it made.
        chosen = any(p.network and p.tentative != "bootstrap" for p in procs)
        for p in procs:
            if p.network and not (chosen and p.tentative == "bootstrap"):
                transport = self._announced_transport(p, providers.get(p.host))
                announced[transport] = announced.get(transport, False) or self._fell_back(p)
        if announced:
            transport = next(t for t in SLOWEST_FIRST if t in announced)
            if warnings is not None and len({family(t) for t in announced}) > 1:
                warnings["mixed-announced"] = "ranks announced different networks: " + ", ".join(sorted(announced))
            if announced[transport]:
                return Judgement(transport, "failure", self._reason_fallback(transport))
            return Judgement(transport, "announced", self._reason_announced(transport, procs))
        return Judgement("unknown", None, self._reason_unknown(procs))

    def _channel_warnings(self, procs: list[Proc], used: dict[str, set[str]], providers: dict[str, str],
                          warnings: dict[str, str]) -> None:
        bases = {family(t) for t in used}
        if len(bases) > 1:
            warnings["mixed"] = "mixed transports across ranks: " + ", ".join(
                f"{t} ({', '.join(sorted(h or '?' for h in hosts))})" for t, hosts in sorted(used.items()))
        elif len(used) > 1:
            warnings["mixed-gdr"] = "GPUDirect RDMA is used by some ranks only"
        for p in procs:
            if not p.network:
                continue
            said = family(self._announced_transport(p, providers.get(p.host)))
            own = {family(t) for t in self._channel_transports(p, providers.get(p.host))}
            if own and said not in own:
                warnings.setdefault("contradiction", f"{p.host or 'a rank'} announced '{p.network}' but its "
                                    f"channels connect over {', '.join(sorted(own))}")
            elif not own and said not in bases:
                warnings.setdefault("contradiction", f"{p.host or 'a rank'} announced '{p.network}' ({said}), "
                                    f"unlike the channels seen ({', '.join(sorted(bases))})")
        if "ofi" in {kind for p in procs for kind in p.net} and not self._providers and self._efa_only_seen:
            warnings.setdefault("no-provider", _EFA_INFERRED)

    # -- the verdict -------------------------------------------------------------------------
    def _decide(self) -> Verdict:
        procs = list(self._procs.values())
        nodes, single, nodes_basis = self._node_count(procs)
        providers: dict[str, str] = {}
        by_host: dict[str, list[Proc]] = {}
        for p in procs:
            if p.provider:
                providers.setdefault(p.host, p.provider)
            by_host.setdefault(p.host, []).append(p)
        warnings = dict(self._notes)
        job = self._judge(procs, single, providers, warnings)
        if job.transport == "unknown":  # a network we cannot name decides nothing
            reason = _MISSING_PROVIDER if self._ofi_without_provider(procs) else job.reason
            job = Judgement("unknown", None, reason)
        host_verdicts = {host: self._judge(group, single, providers, None).transport
                         for host, group in sorted(by_host.items()) if host}
        if job.basis == "announced" and job.transport == "efa" and not self._providers:
            warnings.setdefault("no-provider", _EFA_INFERRED)
        if job.transport == "socket":
            # Every NCCL looks for libnccl-net.so, so "No plugin found" alone is no attempt.
            tried = self._ofi_seen or self._plugin or self._failures
            warnings.setdefault("fallback", "NCCL fell back to TCP sockets although a network plugin was "
                                "configured or attempted" if tried
                                else "NCCL is using TCP sockets: no EFA/IB transport was set up")
        missing = any(p.plugin_missing for p in procs) and self._plugin is None
        if job.transport in ("socket", "unknown") and missing:
            warnings.setdefault("plugin-missing", "no external network plugin (libnccl-net.so) was loaded")
        announcing = list(dict.fromkeys(
            p.network_line for p in procs if p.network and p.network_line and (
                self._fell_back(p) if job.basis == "failure"
                else self._announced_transport(p, providers.get(p.host)) == job.transport)))[:3]
        decided_by, context = self._ranked_evidence(job, announcing)
        if len(self._versions) > 1:
            warnings["versions"] = "several NCCL versions in one job: " + ", ".join(self._versions)
        return Verdict(
            transport=job.transport, basis=job.basis, reason=job.reason,
            nccl_version=self._versions[0] if self._versions else None,
            plugin=self._plugin, plugin_version=self._plugin_version,
            provider=self._job_provider() or (";".join(self._providers) or None),
            network=self._announced(), nodes=nodes, nodes_basis=nodes_basis, ranks=self._rank_count(procs),
            hosts=host_verdicts,
            decided_by=tuple(decided_by), evidence=tuple(decided_by + context),
            warnings=tuple(warnings.values()),
        )

    def _announced(self) -> str | None:
        """The network chosen: a process's own choice before a bootstrap interface."""
        fallback = None
        for p in self._procs.values():
            if p.network and p.tentative != "bootstrap":
                return p.network
            fallback = fallback or p.network
        return fallback

    def _reason_used(self, transport: str) -> str:
        if transport in ("efa", "efa_gdr"):
            return "channels connect via the OFI plugin on EFA" + (
                " with GPUDirect RDMA" if transport == "efa_gdr" else "")
        if transport == "socket":
            return "channels connect via NET/Socket or a TCP libfabric provider"
        if transport == "ib":
            return "channels connect via NCCL's IB verbs transport" + self._provider_words()
        return "channels use a network whose kind we cannot tell"

    def _provider_words(self) -> str:
        provider = self._job_provider()
        if provider is None or provider_transport(provider) == "efa":
            return ""
        core = provider.lower().split(";", 1)[0]
        return f" or the OFI plugin on libfabric provider '{provider}' ({_PROVIDER_KINDS.get(core, 'RDMA')}, not EFA)"

    def _reason_fallback(self, transport: str) -> str:
        failure = next(iter(self._failures.values()), "a network plugin failed")
        return f"{failure}; NCCL then chose its own {transport} network"

    def _reason_announced(self, transport: str, procs: list[Proc]) -> str:
        nodes, _, _ = self._node_count(procs)
        where = (f"across {nodes} nodes" if nodes else
                 "and nothing shows a single node (the node count is not in the log)")
        provider = self._job_provider()
        kind = f"libfabric provider '{provider}' is not EFA, " if provider and transport != "efa" else ""
        core = (provider or "").lower().split(";", 1)[0]
        if kind and core in _PROVIDER_KINDS:
            kind = f"libfabric provider '{provider}' ({_PROVIDER_KINDS[core]}) is not EFA, "
        return f"NCCL announced '{self._announced()}' ({kind}{transport}) {where}; no channel line seen yet"

    def _reason_unknown(self, procs: list[Proc]) -> str:
        if not self.nccl_lines:
            return "no NCCL output seen"
        if self._failures:
            return "a network plugin failed and no network was chosen after it"
        nodes, _, _ = self._node_count(procs)
        if nodes and nodes > 1:
            return (f"{nodes} nodes, but no channel has connected over a network yet "
                    "(only intra-node P2P/SHM channels seen)")
        if self._intra_seen:
            return "only intra-node P2P/SHM channels seen, and the log shows ranks they do not reach"
        return "no line shows which network NCCL chose, nor a channel"

    def _ranked_evidence(self, job: Judgement, announcing: list[str]) -> tuple[list[str], list[str]]:
        """(the lines the verdict rests on, the context after them)."""
        by_kind: dict[str, list[str]] = {"announcing": announcing}
        for (kind, detail), line in self._evidence.items():
            kind = "intra" if kind == "channel" and detail.startswith("intra") else kind
            by_kind.setdefault(kind, []).append(line)
        if job.transport == "intra_node":
            first: tuple[str, ...] = ("nodes", "intra")
        elif job.basis == "channels":
            first = ("channel", "provider")
        elif job.basis == "failure":
            first = ("failure", "announcing")
        elif job.basis == "announced":
            first = ("announcing", "nodes", "provider")
        else:
            first = ("failure", "warn", "intra", "nodes")
        decided = list(dict.fromkeys(line for kind in first for line in by_kind.get(kind, ())))
        later = ("failure", "network", "nodes", "provider", "forced", "warn", "plugin", "plugin-missing",
                 "version", "intra", "channel")
        context = [line for line in dict.fromkeys(line for kind in later for line in by_kind.get(kind, ()))
                   if line not in decided]
        return decided, context


_MISSING_PROVIDER = ("NCCL uses the OFI plugin (libfabric), but no line names its libfabric provider: "
                     "'NET/OFI Selected provider is …' is missing, and without it EFA cannot be told from "
                     "cxi (Slingshot), tcp or verbs. It is printed at NCCL_DEBUG=INFO (subsystems INIT or NET)")
_EFA_INFERRED = ("the libfabric provider line is not in the log: EFA inferred from the plugin's EFA-only "
                 "lines (getCudaPath)")
# What a libfabric provider that is not EFA runs on, for the reason a person reads.
_PROVIDER_KINDS = {"cxi": "HPE Slingshot", "tcp": "TCP", "sockets": "TCP", "udp": "UDP", "net": "TCP",
                   "verbs": "InfiniBand/RoCE verbs", "psm2": "Omni-Path", "opx": "Omni-Path", "psm3": "Ethernet"}
