"""Which transport NCCL really uses, decided from its INFO log as the lines stream in.

The only proof of use is a channel connection line (``... via NET/<net>/...``); what NCCL
*announces* (``Using network X``) is also printed by single-node jobs that never touch the
network, and a loaded OFI plugin proves nothing about the libfabric provider behind it.
So the verdict rests on channel lines, refined by the provider the OFI plugin selected.

State is kept per process (host, pid), never per line, so memory stays bounded however
long the log is. Stdlib only: the training program's strict check imports this.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from training.logparse.normalize import LogLine, normalize, strip_ansi
from training.logparse.scan import InfoWords
from training.logparse.verdict import SLOWEST_FIRST, Verdict, provider_transport

MAX_EVIDENCE = 24
MAX_WARNINGS = 16
MAX_PROCESSES = 4096
_MAX_TEXT = 4096

MAX_PREFIX_CACHE = 4096
# Dispatch on the first word after "NCCL INFO ": one dict lookup rejects the topology,
# affinity and tuning chatter that makes up most NCCL output, before any regex runs.
_CHANNEL, _OFI, _PLUGIN, _DETAIL, _RANKS = 1, 2, 3, 4, 5
_FIRST_WORDS = {
    "Channel": _CHANNEL, "Ring": _CHANNEL,
    "NET/OFI": _OFI, "OFI": _OFI,
    "NET/Plugin": _PLUGIN, "NET/Plugin:": _PLUGIN, "Plugin": _PLUGIN, "TUNER/Plugin:": 0,
    "NCCL": _DETAIL, "NCCL_NET": _DETAIL, "Using": _DETAIL, "Loaded": _DETAIL,
    "Initialized": _DETAIL, "Assigned": _DETAIL, "Successfully": _DETAIL, "P2P": _DETAIL,
    "comm": _RANKS, "ncclCommInitRank": _RANKS, "ncclCommInitRankConfig": _RANKS, "[Rank": _RANKS,
    "Failed": _DETAIL, "Unable": _DETAIL, "No": _DETAIL,
}
# For block scanners: an "NCCL INFO" line starting with another word is ignored by feed().
INFO_WORDS = InfoWords(frozenset(word.encode() for word, action in _FIRST_WORDS.items() if action),
                       (b"plugin/",))
# NET/OFI lines are plentiful; only these say something about the verdict.
_OFI_INTERESTING = ("rovider", "aws-ofi-nccl", "fail", "Fail", "nvalid")
# For lines that do not carry the usual "NCCL INFO " (WARN lines, unprefixed lines).
_INTERESTING = ("version", "etwork ", "rovider", "lugin", "nNodes", "nranks", "NCCL_NET ",
                "fail", "Fail", " via ")

_VERSION = re.compile(r"\bNCCL version (\d+\.\d+(?:\.\d+)?(?:[+\-][\w.]+)?)")
_NETWORK = re.compile(r"\bUsing (?:internal )?[Nn]etwork (\S.*?)\s*$")
_PROVIDER = re.compile(r"\bSelected [Pp]rovider is ([^\s,]+)")
_OFI_VERSION = re.compile(r"\baws-ofi-nccl (?:version )?v?(\d+\.\d+[\w.\-]*)")
_LOADED_PLUGIN = re.compile(r"\bLoaded (?:net|NET) plugin (\S.*?)(?: \((v\d+)\))?\s*$")
_INIT_PLUGIN = re.compile(r"\b(?:Initialized|Assigned) NET plugin (\S.*?)(?: to comm)?\s*$")
_P2P_PLUGIN = re.compile(r"\bP2P plugin (\S+)")
_COMM_RANKS = re.compile(r"\brank (\d+) nRanks (\d+) nNodes (\d+)")
_COMM_RANKS_OLD = re.compile(r"\brank (\d+) nranks (\d+)\b")
_NET_FORCED = re.compile(r"\bNCCL_NET set by environment to (\S+)")
_PLUGIN_FAILED = re.compile(
    r"aws-ofi-nccl initialization failed|Failed to initiali[sz]e NET plugin|initNet\(\) failed"
    r"|plugin/net\.cc:\d+ -> \d+|NET/OFI .*(?:failed|Invalid type of PCI bus)"
)
_PLUGIN_MISSING = re.compile(
    r"No plugin found|Plugin load \(\S+\) returned|NET/Plugin ?: ?dlerror|Could not find: libnccl-net"
)
_PROVIDER_MISSING = re.compile(
    r"No eligible providers|Couldn't find any optimal provider|[Uu]nable to find (?:a )?provider"
    r"|[Cc]ould not find (?:any )?provider|fi_getinfo.*fail|[Nn]o (?:libfabric )?providers? (?:were )?found"
)
_INTRA_VIA = ("P2P", "SHM", "direct shared memory", "NVLS", "CUMEM", "IPC")


def _net_kind(name: str) -> str:
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
class _Proc:
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


class NcclAnalyzer:
    """Streaming NCCL transport detector: feed it lines in any order, ask for ``verdict()``."""

    def __init__(self) -> None:
        self._procs: dict[tuple[str, int | None], _Proc] = {}
        # Raw text before " NCCL " -> its process: most lines that matter are channel lines
        # of a few processes, so normalising each of them again would dominate the cost.
        self._by_prefix: dict[str, _Proc] = {}
        self._kinds: dict[str, str] = {}
        self._versions: list[str] = []
        self._plugin: str | None = None
        self._plugin_version: str | None = None
        self._providers: list[str] = []
        self._ofi_seen = False
        self._evidence: dict[tuple[str, ...], str] = {}
        self._notes: dict[str, str] = {}  # warning key -> message, first come
        self._cached: Verdict | None = None
        self.nccl_lines = 0

    # -- feeding -----------------------------------------------------------------------
    def feed(self, line: str) -> None:
        start = line.find("NCCL INFO ")
        if start < 0:
            if "NCCL" in line:
                self._unusual(line)
            return
        start += 10
        end = line.find(" ", start)
        action = _FIRST_WORDS.get(line[start:end] if end > 0 else line[start:].rstrip())
        if not action:
            if line.startswith("plugin/", start):
                self._detail(line[:_MAX_TEXT])  # "plugin/net.cc:118 -> 2": a plugin call failed
            return
        self.nccl_lines += 1
        if action == _CHANNEL:
            if " via " in line and "->" in line:
                self._channel(line)
            return
        if action == _RANKS:
            self._ranks(line)
            return
        if action == _OFI:
            self._ofi_seen = True
            for marker in _OFI_INTERESTING:
                if marker in line:
                    break
            else:
                return
        elif action == _PLUGIN and "symbol" in line:
            return  # probing for older plugin API versions: harmless
        self._detail(line[:_MAX_TEXT])

    def _unusual(self, line: str) -> None:
        self.nccl_lines += 1
        if " via " in line and "->" in line:
            self._channel(line)
            return
        if "NET/OFI" in line:
            self._ofi_seen = True
        for marker in _INTERESTING:
            if marker in line:
                self._detail(line[:_MAX_TEXT])
                return
        if "WARN" in line:
            self._detail(line[:_MAX_TEXT])

    def feed_normalized(self, ln: LogLine) -> None:
        """For callers that already normalised: re-attach the prefix fields and feed."""
        prefix = f"{ln.host}:{ln.pid}:0 [{ln.device or 0}] " if ln.host and ln.pid is not None else ""
        self.feed(prefix + ln.text)

    def _channel(self, line: str) -> None:
        target = line[line.find(" via ") + 5 :]
        if target.startswith("NET/"):
            name = target[4:].split("/", 1)[0]
            kind = self._kinds.get(name)
            if kind is None:
                kind = self._kinds[name] = _net_kind(name)
            proc = self._proc_of(line)
            gdr = "GDRDMA" in target
            all_gdr = proc.net.get(kind)
            if all_gdr is None:
                proc.net[kind] = gdr
                self._keep(("channel", kind, proc.host), line)
                self._changed()
            elif all_gdr and not gdr:
                proc.net[kind] = False
                self._changed()
        elif target.startswith(_INTRA_VIA):
            proc = self._proc_of(line)
            if not proc.intra:
                proc.intra = True
                self._keep(("channel", "intra", proc.host), line)
                self._changed()

    def _detail(self, line: str) -> None:
        if "NCCL version" in line:
            m = _VERSION.search(line)
            if m and m.group(1) not in self._versions and len(self._versions) < 8:
                self._versions.append(m.group(1))
                self._keep(("version", m.group(1)), line)
                self._changed()
            return
        if "rovider" in line:
            m = _PROVIDER.search(line)
            if m:
                self._on_provider(line, m.group(1))
                return
            if _PROVIDER_MISSING.search(line):
                self._proc_of(line).plugin_failed = True
                self._fault("provider-missing", line, "libfabric found no usable provider")
                return
        if "etwork " in line:
            m = _NETWORK.search(line)
            if m:
                proc = self._proc_of(line)
                if proc.network != m.group(1):
                    proc.network = m.group(1)
                    self._keep(("network", m.group(1)), line)
                    self._changed()
                return
        if "aws-ofi-nccl" in line:
            m = _OFI_VERSION.search(line)
            if m:
                if self._plugin_version is None:
                    self._plugin_version = "aws-ofi-nccl " + m.group(1)
                    self._plugin = self._plugin or "aws-ofi-nccl"
                    self._keep(("plugin",), line)
                    self._changed()
                return
        if "lugin" in line:
            m = _LOADED_PLUGIN.search(line) or _P2P_PLUGIN.search(line)
            if m:
                name = m.group(1)
                plugin = f"{name} ({m.group(2)})" if m.re is _LOADED_PLUGIN and m.group(2) else name
                if plugin != self._plugin:
                    self._plugin = plugin
                    self._keep(("plugin",), line)
                    self._changed()
                return
            m = _INIT_PLUGIN.search(line)
            if m:
                if self._plugin is None and _net_kind(m.group(1)) == "ofi":
                    self._plugin = m.group(1)
                    self._changed()
                return
        if ("nNodes" in line or "nranks" in line) and self._ranks(line):
            return
        if "NCCL_NET " in line:
            m = _NET_FORCED.search(line)
            if m:
                self._keep(("forced",), line)
                self._note("forced", f"NCCL_NET is forced to '{m.group(1)}' by the environment")
                self._changed()
                return
        if _PLUGIN_FAILED.search(line):
            self._proc_of(line).plugin_failed = True
            self._fault("plugin-failed", line, "the network plugin failed to initialise")
        elif _PLUGIN_MISSING.search(line):
            self._proc_of(line).plugin_missing = True
            self._keep(("plugin-missing",), line)
            self._changed()

    def _ranks(self, line: str) -> bool:
        m = _COMM_RANKS.search(line) if "nNodes" in line else None
        old = _COMM_RANKS_OLD.search(line) if m is None and "nranks" in line else None
        if m is None and old is None:
            return False
        proc = self._proc_of(line)
        rank, n_ranks = (m or old).group(1, 2)  # type: ignore[union-attr]
        n_nodes = int(m.group(3)) if m else 0
        if proc.rank != int(rank) or proc.n_ranks < int(n_ranks) or proc.n_nodes < n_nodes:
            proc.rank, proc.n_ranks = int(rank), max(proc.n_ranks, int(n_ranks))
            if n_nodes > proc.n_nodes:
                proc.n_nodes = n_nodes
                self._keep(("nodes", str(n_nodes)), line)
            self._changed()
        return True

    def _on_provider(self, line: str, provider: str) -> None:
        proc = self._proc_of(line)
        if proc.provider == provider:
            return
        proc.provider = provider
        if provider not in self._providers and len(self._providers) < 8:
            self._providers.append(provider)
        self._keep(("provider", provider), line)
        if provider_transport(provider) != "efa":
            self._note("provider:" + provider,
                       f"the OFI plugin selected libfabric provider '{provider}', which is not EFA")
        self._changed()

    def _fault(self, key: str, line: str, what: str) -> None:
        self._keep((key,), line)
        self._note(key, f"{what}: {_msg(line)}")
        self._changed()

    def _proc_of(self, line: str) -> _Proc:
        cut = line.find(" NCCL ")
        prefix = line[:cut] if cut > 0 else ""
        proc = self._by_prefix.get(prefix)
        if proc is None:
            proc = self._proc(normalize(prefix + " NCCL INFO" if prefix else line))
            if len(self._by_prefix) >= MAX_PREFIX_CACHE:
                self._by_prefix.clear()  # timestamped prefixes never repeat: keep memory flat
            self._by_prefix[prefix] = proc
        return proc

    def _proc(self, ln: LogLine) -> _Proc:
        host = ln.host or ""
        key = (host, ln.pid if ln.pid is not None else ln.rank)
        proc = self._procs.get(key)
        if proc is None:
            if len(self._procs) >= MAX_PROCESSES:
                key = ("", None)  # a pathological stream: fold the rest into one bucket
                proc = self._procs.get(key)
            if proc is None:
                proc = self._procs[key] = _Proc(host=host)
            self._changed()
        if ln.rank is not None and proc.rank is None:
            proc.rank = ln.rank
        return proc

    def _keep(self, key: tuple[str, ...], line: str) -> None:
        if key not in self._evidence and len(self._evidence) < MAX_EVIDENCE:
            shown = strip_ansi(line).strip()
            self._evidence[key] = shown if len(shown) <= 300 else shown[:300] + "…"

    def _note(self, key: str, message: str) -> None:
        if key not in self._notes and len(self._notes) < MAX_WARNINGS:
            self._notes[key] = message

    def _changed(self) -> None:
        self._cached = None

    # -- deciding ----------------------------------------------------------------------
    def verdict(self) -> Verdict:
        if self._cached is None:
            self._cached = self._decide()
        return self._cached

    def _proc_transports(self, proc: _Proc, host_provider: str | None) -> set[str]:
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


def _msg(text: str) -> str:
    for level in ("NCCL INFO ", "NCCL WARN "):
        idx = text.find(level)
        if idx >= 0:
            return text[idx + len(level) :][:200]
    return text[:200]


def classify_lines(lines: Any) -> Verdict:
    """Convenience: run a whole iterable of lines through a fresh analyzer."""
    analyzer = NcclAnalyzer()
    for line in lines:
        analyzer.feed(line)
    return analyzer.verdict()
