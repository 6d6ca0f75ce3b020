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
from typing import Any

from training.logparse.nccl_verdict import Proc, VerdictRules, net_kind
from training.logparse.normalize import LogLine, normalize, strip_ansi
from training.logparse.verdict import Verdict, provider_transport

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


class NcclAnalyzer(VerdictRules):
    """Streaming NCCL transport detector: feed it lines in any order, ask for ``verdict()``."""

    def __init__(self) -> None:
        self._procs: dict[tuple[str, int | None], Proc] = {}
        # Raw text before " NCCL " -> its process: most lines that matter are channel lines
        # of a few processes, so normalising each of them again would dominate the cost.
        self._by_prefix: dict[str, Proc] = {}
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
                kind = self._kinds[name] = net_kind(name)
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
                if self._plugin is None and net_kind(m.group(1)) == "ofi":
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

    def _proc_of(self, line: str) -> Proc:
        cut = line.find(" NCCL ")
        prefix = line[:cut] if cut > 0 else ""
        proc = self._by_prefix.get(prefix)
        if proc is None:
            proc = self._proc(normalize(prefix + " NCCL INFO" if prefix else line))
            if len(self._by_prefix) >= MAX_PREFIX_CACHE:
                self._by_prefix.clear()  # timestamped prefixes never repeat: keep memory flat
            self._by_prefix[prefix] = proc
        return proc

    def _proc(self, ln: LogLine) -> Proc:
        host = ln.host or ""
        key = (host, ln.pid if ln.pid is not None else ln.rank)
        proc = self._procs.get(key)
        if proc is None:
            if len(self._procs) >= MAX_PROCESSES:
                key = ("", None)  # a pathological stream: fold the rest into one bucket
                proc = self._procs.get(key)
            if proc is None:
                proc = self._procs[key] = Proc(host=host)
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
