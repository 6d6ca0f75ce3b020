"""How the NCCL analyser turns what it has gathered per process into a ``Verdict``.

The feeding half (``nccl.py``) only records facts per process (host, pid): the networks its
channels used, the network it announced, the provider it selected, a plugin failure. Deciding
happens here, on demand, the way a careful reader ranks what a log shows:

1. ``channels``: a channel that connected ``via NET/<net>`` is proof of use. A single host
   whose channels go through the NIC (P2P and SHM disabled) is on that network too.
2. Single-node proof: ``intra_node``, whatever network was announced, because no NIC carries
   traffic. The node estimate says what it rests on (``_node_count``): the job's own node count
   when rtui runs it, ``nNodes``, nccl-tests' rank table, host prefixes and bootstrap addresses,
   P2P/SHM/NVLS channels joining every rank, every rank placed on one host (comm lines, or as
   many processes on the one host as the communicator has ranks), graphs without NET endpoints.
3. ``failure``: a plugin/provider failure followed by NCCL announcing one of its own
   networks (``Socket``, ``IB``) is a fallback, and the failure is its reason.
4. ``announced``: the network NCCL chose is the one that crosses nodes; a fragment that does
   not show the node count still names it, unless something shows a single node. A process
   whose only announcement is its bootstrap interface (NCCL 2.4-2.5) has not chosen yet.

``socket`` needs more than an announcement: NCCL initialises its Socket net (``NET/Socket :
Using …``, ``Using network Socket``) on every machine without IB or a plugin, single-node jobs
included, so only a channel ``via NET/Socket`` or a job shown to span nodes makes a run socket;
an announced Socket with the node count unknown is ``unknown`` and says so.

The OFI plugin has the same name on every libfabric provider. Its provider line (``efa``, or
another fabric) settles which; without it the clues of ``nccl_evidence`` are weighed: a
non-EFA fabric named in its own words is not EFA (``unknown``, the provider named); otherwise
EFA needs a score of ``EFA_SCORE`` from the clues plus the plugin's own use (a channel through
it counts as a strong clue, an announcement as a weak one). The verdict names the clues.

Anything that contradicts the winner (ranks on different transports, a channel that is not
the announced network) becomes a warning. The job runs at the pace of its slowest link.
Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from training.logparse.nccl_evidence import CONTRARY, EFA_SCORE, RULES, STRONG, WEAK, RankRow, table_nodes
from training.logparse.verdict import SLOWEST_FIRST, Verdict, provider_transport

# Past this a rank number is more likely garbage than a real job; it is not tracked.
MAX_RANK = 1 << 16
# The network a process is on once its OFI plugin starts, before any line names it.
OFI_PLUGIN_NETWORK = "OFI (aws-ofi-nccl starting)"
_RULE_WORDS = {rule.name: rule.words for rule in RULES}
_RULE_WEIGHTS = {rule.name: rule.weight for rule in RULES}


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
    _clues: dict[str, str]
    _table: dict[int, RankRow]
    _table_hosts: set[str]
    _table_open: bool
    _ring_size: int
    _host_ranks: dict[str, set[int]]
    nccl_lines: int

    def verdict(self) -> Verdict:
        if self._cached is None:
            self._cached = self._decide()
        return self._cached

    # -- facts about the whole job ------------------------------------------------------
    def _node_count(self, procs: list[Proc]) -> tuple[int | None, bool, str | None]:
        """(nodes, proven single node, what the count rests on), strongest evidence first.

        What NCCL and nccl-tests measured (``nNodes``, the rank table) comes before the job's own
        count (what its config plans, or its records say): it is what NCCL acts on (pods of one
        machine are nodes to NCCL); a disagreement is warned about (``_decide``)."""
        stated = self._stated_nodes(procs)
        if stated is not None:
            return stated[0], stated[0] == 1, stated[1]
        if self._job_nodes:
            return self._job_nodes, self._job_nodes == 1, f"the job itself runs on {self._job_nodes} " \
                f"node{'s' if self._job_nodes != 1 else ''}"
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

    def _stated_nodes(self, procs: list[Proc]) -> tuple[int, str] | None:
        """The node count NCCL's comm line or nccl-tests' rank table states, with its words."""
        stated = max((p.n_nodes for p in procs), default=0)
        if stated:
            return stated, f"NCCL's comm line says nNodes {stated}"
        # The table proves a count once it is whole: a line came after it, or it has as many rows as
        # the communicator has ranks (a fragment may stop inside it).
        size = max(max((p.n_ranks for p in procs), default=0), self._ring_size)
        return table_nodes(self._table) if not self._table_open or len(self._table) == size else None

    def _multi_node(self, procs: list[Proc]) -> bool:
        """Whether the lines show the job spans more than one node (its count may be unknown)."""
        nodes, single, _ = self._node_count(procs)
        return not single and ((nodes or 0) > 1 or self._graph_net)

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
    def _ofi_transport(self, provider: str | None, *, use: int) -> str:
        """What the OFI plugin runs on: its provider line when there is one, else the weighed clues.
        ``use``: what the plugin's own use adds (traffic through it STRONG, NCCL's choice WEAK, the
        plugin only starting 0: its lines are clues already)."""
        provider = provider or self._job_provider()
        if provider is not None:
            return provider_transport(provider)  # efa, or "unknown" for another fabric
        return "efa" if self._efa_score(use) >= EFA_SCORE else "unknown"

    def _efa_score(self, use: int) -> int:
        """The clues to EFA plus the plugin's own use; 0 when a non-EFA fabric is named."""
        if self._contrary():
            return 0
        return sum(_RULE_WEIGHTS[name] for name in self._clues) + use

    def _contrary(self) -> bool:
        return any(_RULE_WEIGHTS[name] == CONTRARY for name in self._clues)

    def _efa_clue_words(self) -> str:
        return "; ".join(_RULE_WORDS[name] for name in self._clues if _RULE_WEIGHTS[name] > 0)

    def _ofi_without_provider(self, procs: list[Proc]) -> bool:
        uses_ofi = any("ofi" in p.net or net_kind(p.network or "") == "ofi" for p in procs)
        return uses_ofi and self._job_provider() is None and not any(p.provider for p in procs)

    def _channel_transports(self, proc: Proc, host_provider: str | None) -> set[str]:
        found: set[str] = set()
        for kind, all_gdr in proc.net.items():
            if kind == "ofi":
                base = self._ofi_transport(proc.provider or host_provider, use=STRONG)
                found.add("efa_gdr" if base == "efa" and all_gdr else base)
            elif kind.startswith("other:"):
                found.add("unknown")
            else:
                found.add(kind)
        return found

    def _announced_transport(self, proc: Proc, host_provider: str | None) -> str:
        kind = net_kind(proc.network or "")
        if kind == "ofi":
            return self._ofi_transport(proc.provider or host_provider,
                                       use=0 if proc.tentative == "plugin" else WEAK)
        return "unknown" if kind.startswith("other:") else kind

    def _fell_back(self, proc: Proc) -> bool:
        """A failure earlier in the log, then NCCL announced a network other than the plugin."""
        failed_at = proc.failed_at or self._first_failure_at
        return 0 < failed_at < proc.network_at and net_kind(proc.network or "") != "ofi"

    def _judge(self, procs: list[Proc], single: bool, multi: bool, providers: dict[str, str],
               warnings: dict[str, str] | None) -> Judgement:
        """The verdict for ``procs`` (the job's, or one host's); ``single``/``multi``: what the whole
        job's lines show about its node count."""
        used: dict[str, set[str]] = {}
        for p in procs:
            for transport in self._channel_transports(p, providers.get(p.host)):
                used.setdefault(transport, set()).add(p.host)
        if used:
            transport = next(t for t in SLOWEST_FIRST if t in used)
            if warnings is not None:
                self._channel_warnings(procs, used, providers, warnings)
            return Judgement(transport, "channels", self._reason_used(transport))
        if single and self.nccl_lines:  # no NCCL line at all: nothing to say yet (or a gloo job)
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
                if transport == "socket" and not multi:
                    continue  # announced on every machine without IB/EFA: no proof of TCP traffic
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
        multi = self._multi_node(procs)
        job = self._judge(procs, single, multi, providers, warnings)
        if job.transport == "unknown":  # a network we cannot name decides nothing
            job = Judgement("unknown", None, self._reason_ofi_unknown() or job.reason)
        host_verdicts = {host: self._judge(group, single, multi, providers, None).transport
                         for host, group in sorted(by_host.items()) if host}
        if job.transport in ("efa", "efa_gdr") and not self._providers:
            warnings.setdefault("no-provider", "the libfabric provider line ('NET/OFI Selected provider is …') "
                                f"is not in the log: EFA inferred from {self._inferred_from(job.basis)}")
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
        stated = self._stated_nodes(procs)
        if self._job_nodes and stated is not None and stated[0] != self._job_nodes:
            plural = "s" if self._job_nodes != 1 else ""
            warnings["job-nodes"] = f"the job's own count is {self._job_nodes} node{plural}, but {stated[1]}"
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

    def _inferred_from(self, basis: str | None) -> str:
        """What an EFA verdict without the provider line rests on, in words."""
        chosen = any(p.network and p.tentative != "plugin" and net_kind(p.network) == "ofi"
                     for p in self._procs.values())
        parts = []
        if basis == "channels":
            parts.append("traffic through the plugin")
        elif chosen:
            parts.append("NCCL's choice of the plugin")
        if clues := self._efa_clue_words():
            parts.append(clues)
        return "; ".join(parts)

    def _efa_words(self, basis: str) -> str:
        provider = self._job_provider() or next(iter(self._providers), None)
        if provider is not None:
            return f"libfabric provider '{provider}'"
        return f"no provider line; inferred from {self._inferred_from(basis)}"

    def _reason_used(self, transport: str) -> str:
        if transport in ("efa", "efa_gdr"):
            return "channels connect via the OFI plugin on EFA" + (
                " with GPUDirect RDMA" if transport == "efa_gdr" else "") + f" ({self._efa_words('channels')})"
        if transport == "socket":
            return "channels connect via NET/Socket (NCCL's TCP transport)"
        if transport == "ib":
            return "channels connect via NCCL's IB verbs transport (InfiniBand or RoCE)"
        return self._reason_ofi_unknown() or "channels use a network whose kind we cannot tell"

    def _reason_fallback(self, transport: str) -> str:
        failure = next(iter(self._failures.values()), "a network plugin failed")
        return f"{failure}; NCCL then chose its own {transport} network"

    def _reason_announced(self, transport: str, procs: list[Proc]) -> str:
        nodes, _, _ = self._node_count(procs)
        where = (f"across {nodes} nodes" if nodes else "across nodes (NCCL's graphs reach its NICs)"
                 if self._graph_net else "and nothing shows a single node (the node count is not in the log)")
        what = f"{transport}: {self._efa_words('announced')}" if transport == "efa" else transport
        return f"NCCL announced '{self._announced()}' ({what}) {where}; no channel line seen yet"

    def _reason_ofi_unknown(self) -> str | None:
        """Why the OFI plugin's fabric is not named, or None when the plugin is not in use."""
        procs = list(self._procs.values())
        if not any("ofi" in p.net or net_kind(p.network or "") == "ofi" for p in procs):
            return None
        provider = self._job_provider() or next(iter(self._providers), None)
        if provider is not None and provider_transport(provider) != "efa":
            core = provider.lower().split(";", 1)[0]
            return (f"the OFI plugin runs on libfabric provider '{provider}' "
                    f"({_PROVIDER_KINDS.get(core, 'another fabric')}), which is not EFA, nor NCCL's IB or "
                    "Socket transport: the badge names the provider")
        if self._contrary():
            line = self._clues[next(n for n in self._clues if _RULE_WEIGHTS[n] == CONTRARY)]
            return f"the OFI plugin's fabric is not EFA: a libfabric fabric that is not EFA is named ({line})"
        if self._ofi_without_provider(procs):
            clues = self._efa_clue_words()
            return _MISSING_PROVIDER + (f"; the other clues ({clues}) are not enough on their own" if clues else "")
        return None

    def _reason_unknown(self, procs: list[Proc]) -> str:
        if not self.nccl_lines:
            return "no NCCL output seen"
        ofi = self._reason_ofi_unknown()
        if ofi:
            return ofi
        if any(net_kind(p.network or "") == "socket" for p in procs):
            failed = "a network plugin failed, then " if self._failures else ""
            return (f"{failed}NCCL announced its Socket network, which it does on every machine without IB or "
                    "EFA, single-node jobs included; TCP traffic shows only as a channel via NET/Socket or "
                    "with a second node, and neither is in the lines")
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
            first = ("channel", "provider", "clue")
        elif job.basis == "failure":
            first = ("failure", "announcing", "nodes")
        elif job.basis == "announced":
            first = ("announcing", "nodes", "provider", "clue")
        else:
            first = ("provider", "failure", "warn", "intra", "nodes", "announcing")
        decided = list(dict.fromkeys(line for kind in first for line in by_kind.get(kind, ())))
        later = ("failure", "network", "nodes", "provider", "clue", "forced", "warn", "plugin", "plugin-missing",
                 "version", "intra", "channel")
        context = [line for line in dict.fromkeys(line for kind in later for line in by_kind.get(kind, ()))
                   if line not in decided]
        return decided, context


_MISSING_PROVIDER = ("NCCL uses the OFI plugin (libfabric), but no line names its libfabric provider "
                     "('NET/OFI Selected provider is …', printed at NCCL_DEBUG=INFO, subsystems INIT or NET) and "
                     "no other line says EFA (an EFA device, the plugin's AWS setup, libfabric's efa lines, traffic "
                     "through the plugin): EFA cannot be told from cxi (Slingshot), tcp or verbs")
# What a libfabric provider that is not EFA runs on, for the reason a person reads.
_PROVIDER_KINDS = {"cxi": "HPE Slingshot", "tcp": "TCP", "sockets": "TCP", "udp": "UDP", "net": "TCP",
                   "verbs": "InfiniBand/RoCE verbs", "psm2": "Omni-Path", "opx": "Omni-Path", "psm3": "Ethernet"}
