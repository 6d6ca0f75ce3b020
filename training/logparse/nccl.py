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

from training.logparse.normalize import LogLine, normalize
from training.logparse.verdict import SLOWEST_FIRST, Verdict, provider_transport

MAX_EVIDENCE = 24
MAX_WARNINGS = 16
MAX_PROCESSES = 4096
_MAX_TEXT = 4096

# Cheap substring gates, checked before any regex: a NCCL line without one of these
# cannot change the verdict (most NCCL lines are topology, affinity and tuning chatter).
_INTERESTING = (" via ", "version", "etwork", "NET/", "lugin", "nNodes", "nranks", "nRanks",
                "WARN", "NCCL_NET", "ovider")

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
    low = name.lower()
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
    ofi_seen: bool = False
    plugin_missing: bool = False
    plugin_failed: bool = False
    net: dict[str, list[int]] = field(default_factory=dict)  # kind -> [channels, with GDRDMA]
    intra: int = 0


class NcclAnalyzer:
    """Streaming NCCL transport detector: feed it lines in any order, ask for ``verdict()``."""

    def __init__(self) -> None:
        self._procs: dict[tuple[str, int | None], _Proc] = {}
        self._versions: list[str] = []
        self._plugin: str | None = None
        self._plugin_version: str | None = None
        self._providers: list[str] = []
        self._forced: str | None = None
        self._evidence: dict[tuple[str, ...], str] = {}
        self._notes: dict[str, str] = {}  # warning key -> message, first come
        self._cached: Verdict | None = None
        self.nccl_lines = 0

    # -- feeding -----------------------------------------------------------------------
    def feed(self, line: str) -> None:
        if "NCCL" not in line:
            return
        for marker in _INTERESTING:
            if marker in line:
                break
        else:
            return
        self.feed_normalized(normalize(line[:_MAX_TEXT]), line)

    def feed_normalized(self, ln: LogLine, raw: str | None = None) -> None:
        text = ln.text
        self.nccl_lines += 1
        proc = self._proc(ln)
        shown = (raw if raw is not None else text).strip()
        if len(shown) > 300:
            shown = shown[:300] + "…"
        via = text.find(" via ")
        if via >= 0 and "->" in text:
            self._channel(proc, text[via + 5 :], shown)
            return
        if "NET/OFI" in text or "aws-ofi-nccl" in text:
            proc.ofi_seen = True
        m = _VERSION.search(text)
        if m:
            if m.group(1) not in self._versions and len(self._versions) < 8:
                self._versions.append(m.group(1))
                self._keep(("version", m.group(1)), shown)
            self._changed()
            return
        m = _PROVIDER.search(text)
        if m:
            provider = m.group(1)
            proc.provider = provider
            if provider not in self._providers and len(self._providers) < 8:
                self._providers.append(provider)
            self._keep(("provider", provider), shown)
            if provider_transport(provider) != "efa":
                self._note("provider:" + provider,
                           f"the OFI plugin selected libfabric provider '{provider}', which is not EFA")
            self._changed()
            return
        m = _NETWORK.search(text)
        if m:
            proc.network = m.group(1)
            self._keep(("network", m.group(1)), shown)
            self._changed()
            return
        m = _OFI_VERSION.search(text)
        if m:
            self._plugin_version = "aws-ofi-nccl " + m.group(1)
            self._plugin = self._plugin or "aws-ofi-nccl"
            self._keep(("plugin",), shown)
            self._changed()
            return
        m = _LOADED_PLUGIN.search(text) or _P2P_PLUGIN.search(text)
        if m:
            name = m.group(1)
            self._plugin = f"{name} ({m.group(2)})" if m.re is _LOADED_PLUGIN and m.group(2) else name
            self._keep(("plugin",), shown)
            self._changed()
            return
        m = _INIT_PLUGIN.search(text)
        if m:
            if _net_kind(m.group(1)) == "ofi" and self._plugin is None:
                self._plugin = m.group(1)
            return
        m = _COMM_RANKS.search(text)
        if m:
            proc.rank, proc.n_ranks = int(m.group(1)), max(proc.n_ranks, int(m.group(2)))
            proc.n_nodes = max(proc.n_nodes, int(m.group(3)))
            self._keep(("nodes", str(proc.n_nodes)), shown)
            self._changed()
            return
        m = _COMM_RANKS_OLD.search(text)
        if m:
            proc.rank, proc.n_ranks = int(m.group(1)), max(proc.n_ranks, int(m.group(2)))
            self._changed()
            return
        m = _NET_FORCED.search(text)
        if m:
            self._forced = m.group(1)
            self._keep(("forced",), shown)
            self._note("forced", f"NCCL_NET is forced to '{m.group(1)}' by the environment")
            self._changed()
            return
        if _PROVIDER_MISSING.search(text):
            proc.plugin_failed = True
            self._keep(("provider-missing",), shown)
            self._note("provider-missing", "libfabric found no usable provider: " + _msg(text))
            self._changed()
        elif _PLUGIN_FAILED.search(text):
            proc.plugin_failed = True
            self._keep(("plugin-failed",), shown)
            self._note("plugin-failed", "the network plugin failed to initialise: " + _msg(text))
            self._changed()
        elif _PLUGIN_MISSING.search(text):
            proc.plugin_missing = True
            self._keep(("plugin-missing",), shown)
            self._changed()

    def _channel(self, proc: _Proc, target: str, shown: str) -> None:
        if target.startswith("NET/"):
            name = target[4:].split("/", 1)[0].strip()
            kind = _net_kind(name)
            counts = proc.net.get(kind)
            if counts is None:
                counts = proc.net[kind] = [0, 0]
                self._keep(("channel", kind, proc.host), shown)
                self._changed()
            counts[0] += 1
            if "GDRDMA" in target:
                counts[1] += 1
            return
        if target.startswith(_INTRA_VIA):
            if proc.intra == 0:
                self._keep(("channel", "intra", proc.host), shown)
                self._changed()
            proc.intra += 1

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
            self._evidence[key] = line

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
        for kind, (channels, gdr) in proc.net.items():
            if kind == "ofi":
                base = provider_transport(proc.provider or host_provider or self._job_provider())
                if base == "efa" and gdr == channels:
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
            host_intra[p.host] = host_intra.get(p.host, False) or p.intra > 0
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
        if transport == "unknown" and any(p.net.get("ofi") for p in procs) and not self._providers:
            warnings.setdefault("no-provider",
                                "the OFI plugin carried traffic but its provider was never logged")
        if transport == "socket":
            tried = any(p.ofi_seen or p.plugin_failed or p.plugin_missing for p in procs) or self._plugin
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
