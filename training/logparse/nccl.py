"""Which transport NCCL really uses, read from its INFO log as the lines stream in.

This half records what each line says, per process (host, pid): the channels it connected
(``via NET/<net>`` or P2P/SHM), the network it announced (``Using network X``, ``Assigned NET
plugin X``; without those, the nets it initialised, ranked the way NCCL tries them: plugin,
then ``NET/IB : Using [..]``, then ``NET/Socket : Using [..]``), the libfabric provider the OFI
plugin selected and every other clue to its fabric (``nccl_evidence``), a plugin or provider
failure, the node and rank counts (comm lines, hosts, nccl-tests' rank table), and whether
NCCL's ring/tree graphs end at NET endpoints. ``nccl_verdict`` ranks those facts into a verdict
on demand.

State is kept per process, never per line, so memory stays bounded however long the log
is. Stdlib only: the training program's strict check imports this.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from training.logparse import nccl_evidence
from training.logparse.nccl_evidence import RankRow
from training.logparse.nccl_verdict import MAX_RANK, OFI_PLUGIN_NETWORK, Proc, VerdictRules, net_kind
from training.logparse.normalize import LogLine, normalize, strip_ansi
from training.logparse.verdict import Verdict, provider_transport

MAX_EVIDENCE = 32
MAX_EVIDENCE_PER_KIND = 4  # so the lines that decide still fit when there are many hosts
MAX_WARNINGS = 16
MAX_WARN_SITES = 3
MAX_PROCESSES = 4096
MAX_IPS_PER_HOST = 16
MAX_RANK_HOSTS = 4096
_MAX_TEXT = 4096
MAX_PREFIX_CACHE = 4096

# Dispatch on the first word after "NCCL INFO " (or "NCCL WARN "): one dict lookup rejects
# the topology, affinity and tuning chatter that makes up most NCCL output before any regex.
_HANDLERS = {
    "Channel": "_channel_line", "Ring": "_channel_line", "Trees": "_trees",
    "NET/OFI": "_ofi", "OFI": "_ofi",
    # NCCL src/graph/topo.cc: "NET/%s : GPU Direct RDMA %s for HCA %d '%s'" names the plugin's NIC.
    "NET/Libfabric": "_clue", "NET/AWS": "_clue",
    "NET/Plugin": "_net_plugin", "NET/Plugin:": "_net_plugin", "Plugin": "_net_plugin", "Loaded": "_net_plugin",
    "Initialized": "_net_plugin", "Failed": "_net_plugin", "Successfully": "_net_plugin", "External": "_net_plugin",
    "P2P": "_net_plugin",
    "NET/IB": "_net_device", "NET/IB:": "_net_device", "NET/Socket": "_net_device", "NET/Socket:": "_net_device",
    "Bootstrap": "_bootstrap", "Bootstrap:": "_bootstrap",
    "Using": "_using", "Assigned": "_using",
    "NCCL": "_version", "NCCL_NET": "_forced",
    "comm": "_ranks", "ncclCommInitRank": "_ranks", "ncclCommInitRankConfig": "_ranks", "[Rank": "_ranks",
}

_VERSION = re.compile(r"NCCL version (\d+\.\d+(?:\.\d+)?(?:[+\-][\w.]+)?)")
# "Using network X" (2.6+), "Using internal Network X" (2.3), "Assigned NET plugin X to comm" (2.27+).
_NETWORK = re.compile(
    r"\b(?:Using (?:internal )?[Nn]etwork|Assigned NET plugin) (?!plugin\b)(\S.*?)(?: to comm)?"
    r"(?:\s*\[repeated \d+x across cluster\])?\s*$"
)
# NCCL 2.4-2.5 name their network only by initialising it: the device line says which.
_NET_DEVICE = re.compile(r"\bNET/(IB|Socket) ?: ?Using ?\[\d+\]")
# The first address NCCL binds (bootstrap, socket net, IB out-of-band): one per machine.
_ADDRESS = re.compile(r"\b(?:Using|OOB) ?(?:\[\d+\])?[^\s:<\[]+:([^\s<]+)<\d+>")
_PROVIDER = re.compile(r"\bSelected [Pp]rovider is ([^\s,]+)")
_OFI_VERSION = re.compile(r"\baws-ofi-nccl (?:version )?v?(\d+\.\d+[\w.\-]*)")
_LOADED_PLUGIN = re.compile(r"\bLoaded (?:net|NET) plugin (\S.*?)(?: \((v\d+)\))?\s*$")
_INIT_PLUGIN = re.compile(r"\bInitialized NET plugin (\S.*?)\s*$")
_P2P_PLUGIN = re.compile(r"\bP2P plugin (\S+)")
# A searched graph (NCCL_DEBUG_SUBSYS=GRAPH): " 0 : NET/0 GPU/0 ... GPU/7 NET/0". NCCL drops the NET
# nodes from its topology when every rank of the communicator is on this machine
# (ncclTopoTrimSystem in src/graph/topo.cc), so a graph without NET endpoints is one node.
_GRAPH = re.compile(r"^ +\d+ : ((?:(?:GPU|NET|NVS|CPU|NIC)/\S+ ?)+)$")
# The plugin is starting on this process (aws-ofi-nccl: "Initializing aws-ofi-nccl %s" in
# src/nccl_ofi_net.cpp, "Using aws-ofi-nccl %s" in 1.x, "Using Libfabric version %u.%u"): NCCL tries
# a plugin before its own nets, so unless it fails this is the network.
_OFI_STARTING = ("Initializing aws-ofi-nccl", "Using aws-ofi-nccl", "Using Libfabric version",
                 "Configuring AWS-specific options", "Using aws-ofi-rccl")
_COMM_RANKS = re.compile(r"\brank (\d+) nRanks (\d+)(?: nNodes (\d+))?(?: localRanks (\d+))?")
_COMM_RANKS_OLD = re.compile(r"\brank (\d+) nranks (\d+)\b")
_NET_FORCED = re.compile(r"\bNCCL_NET set by environment to (\S+)")
_TREE_SELF = re.compile(r"->(\d+)->")
_PEERS = re.compile(r"(\d+)(?:\[[^\]\s]*\])? -> (\d+)")
# The OFI plugin could not start (or found no usable provider): NCCL moves on to its own nets.
_OFI_FAILED = re.compile(
    r"initiali[sz]ation failed|Initiali[sz]ing plugin failed|Failing initiali[sz]ation|Only EFA provider is supported"
    r"|No eligible providers|[Cc]ould(?:n't| not) find any (?:optimal )?provider|[Uu]nable to find (?:a )?provider"
    r"|fi_getinfo(?:\(\))? call failed|[Cc]ould(?:n't| not) open (?:a fabric provider|AV)"
    r"|Failed to initiali[sz]e \w+ protocol|requires at least libfabric|Invalid type of PCI bus"
)
# Words every line _OFI_FAILED matches contains one of: most NET/OFI lines are chatter.
_OFI_FAILURE_HINTS = ("ail", "rovider", "AV", "nvalid", "requires")
# NCCL itself gave up on the external plugin it found.
_PLUGIN_FAILED = re.compile(
    r"Failed to initiali[sz]e NET plugin|External network plugin .* is unsupported"
    r"|Failed to find ncclNetPlugin symbol|ncclNetPlugin symbols v\d+ and lower are not supported"
)
_PLUGIN_MISSING = re.compile(
    r"No plugin found|Plugin load \(?\S+\)? returned|NET/Plugin ?: ?dlerror|Could not find: ?libnccl-net"
)
# An error return inside NCCL's net plugin loader ("net.cc:56 -> 2", "plugin/net.cc:118 -> 2"),
# not the net transport's ("transport/net.cc"), which fails a connection, not a plugin.
_LOADER_ERROR = re.compile(r"(?:^|[\s\]])(?:plugin/)?net\.cc:\d+ -> [1-9]")
_ERROR_RETURN = re.compile(r"(\S+\.(?:cc|h|cu):\d+) -> (\d+)")
_API_FILES = ("init.cc", "group.cc", "enqueue.cc", "collectives.cc")
_WARN_SITE = re.compile(r"(\S+:\d+) NCCL WARN")
_BENIGN_WARNINGS = ("falling back to simple order",)
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]")
_INTRA_VIA = ("P2P", "SHM", "direct shared memory", "NVLS", "CUMEM", "IPC")
_ERROR_NAMES = {"1": "unhandled CUDA error", "2": "system error", "3": "internal error", "4": "invalid argument",
                "5": "invalid usage", "6": "remote error", "7": "in progress", "8": "timeout"}


class NcclAnalyzer(VerdictRules):
    """Streaming NCCL transport detector: feed it lines in any order, ask for ``verdict()``."""

    def __init__(self, *, job_nodes: int | None = None) -> None:
        # rtui's own runs know how many nodes the job has: that settles single-node or not.
        self._job_nodes = job_nodes if job_nodes and job_nodes > 0 else None
        self._graph_net = False  # a searched graph ended at NET endpoints: the comm spans nodes
        self._graph_local = False  # a searched graph had GPUs only
        self._clues: dict[str, str] = {}  # nccl_evidence rule name -> the first line it matched
        self._table: dict[int, RankRow] = {}  # nccl-tests' rank table: rank -> its row
        self._table_hosts: set[str] = set()
        self._table_open = False  # rows came and nothing else yet: the table may go on past the fragment
        self._ring_size = 0  # ranks in the longest ring order seen: the communicator's size
        self._host_ranks: dict[str, set[int]] = {}  # host -> the ranks its own lines (Trees) are of
        self._forced_net: str | None = None  # NCCL_NET: NCCL takes only the net of that name
        self._procs: dict[tuple[str, int | None], Proc] = {}
        # Raw text before " NCCL " -> its process: most lines that matter are channel lines
        # of a few processes, so normalising each of them again would dominate the cost.
        self._by_prefix: dict[str, Proc] = {}
        self._handlers: dict[str, Callable[[str], None]] = {w: getattr(self, n) for w, n in _HANDLERS.items()}
        self._kinds: dict[str, str] = {}
        self._versions: list[str] = []
        self._plugin: str | None = None
        self._plugin_version: str | None = None
        self._providers: list[str] = []
        self._ofi_seen = False
        self._evidence: dict[tuple[str, str], str] = {}
        self._per_kind: dict[str, int] = {}
        self._notes: dict[str, str] = {}  # warning key -> message, first come
        self._failures: dict[str, str] = {}
        self._first_failure_at = 0
        self._failed_lines = 0
        self._hosts: set[str] = set()
        self._host_ips: dict[str, set[str]] = {}
        self._rank_hosts: dict[int, dict[int, str]] = {}  # nranks -> rank -> host, from comm lines
        self._parent: dict[int, int] = {}  # union-find over ranks joined by P2P/SHM channels
        self._max_rank = -1
        self._intra_seen = False
        self._cached: Verdict | None = None
        self.nccl_lines = 0

    @property
    def job_nodes(self) -> int | None:
        return self._job_nodes

    def set_job_nodes(self, nodes: int | None) -> None:
        """The job's node count learnt after the analyser started (from the job's own records)."""
        nodes = nodes if nodes and nodes > 0 else None
        if nodes != self._job_nodes:
            self._job_nodes = nodes
            self._changed()

    # -- feeding -----------------------------------------------------------------------
    def feed(self, line: str) -> None:
        # Colour in the prefix is normalize's business; in the text only Ray's coloured
        # "[repeated Nx]" marker and pasted codes without their escape byte get in the way.
        if "[repeated" in line or "ESC[" in line or ("[0m" in line and "\x1b" not in line):
            line = strip_ansi(line)
        if self._table_open and "Rank" not in line:
            self._table_open = False  # the line after the table: it is complete
            self._changed()
        start = line.find("NCCL INFO ")
        if start >= 0:
            self.nccl_lines += 1
            self._dispatch(line, start + 10)
        elif "NCCL" in line:
            self._other(line)
        elif any(marker in line for marker in FOREIGN_MARKERS):
            self._foreign(line[:_MAX_TEXT])

    def _dispatch(self, line: str, start: int) -> None:
        end = line.find(" ", start)
        word = line[start:end] if end > 0 else line[start:].rstrip()
        handler = self._handlers.get(word)
        if handler is not None:
            handler(line[:_MAX_TEXT])
        elif not word:
            self._graph(line, line[start:])
        elif ".cc:" in word and " -> " in line:
            self._error_return(line[:_MAX_TEXT])

    def _other(self, line: str) -> None:
        """WARN lines, and lines that lost NCCL's prefix (``NCCL version`` printed bare)."""
        self.nccl_lines += 1
        at = line.find("NCCL WARN ")
        if at >= 0:
            failed_lines = self._failed_lines
            self._dispatch(line, at + 10)
            if self._failed_lines == failed_lines:  # not a plugin failure: an NCCL warning of its own
                self._warned(line[:_MAX_TEXT], at + 10)
        elif "NCCL version" in line:
            self._version(line[:_MAX_TEXT])
        elif " via " in line and "->" in line:
            self._channel(line[:_MAX_TEXT])

    def feed_normalized(self, ln: LogLine) -> None:
        """For callers that already normalised: re-attach the prefix fields and feed."""
        prefix = f"{ln.host}:{ln.pid}:0 [{ln.device or 0}] " if ln.host and ln.pid is not None else ""
        self.feed(prefix + ln.text)

    # -- channels ------------------------------------------------------------------------
    def _channel_line(self, line: str) -> None:
        if " via " in line:
            if "->" in line:
                self._channel(line)
        elif "->" not in line:
            self._ring_order(line)

    def _channel(self, line: str) -> None:
        via = line.find(" via ")
        target = line[via + 5 :]
        peers = _PEERS.search(line, 0, via)
        a, b = (int(peers.group(1)), int(peers.group(2))) if peers else (-1, -1)
        self._saw_rank(max(a, b))
        if target.startswith("NET/"):
            name, slash, _ = target[4:].partition("/")
            if not slash:
                return  # cut off inside the network's name
            kind = self._kinds.get(name)
            if kind is None:
                kind = self._kinds[name] = net_kind(name)
            proc = self._proc_of(line)
            gdr = "GDRDMA" in target
            all_gdr = proc.net.get(kind)
            if all_gdr is None:
                proc.net[kind] = gdr
                self._keep("channel", f"{kind} {proc.host}", line)
                self._changed()
            elif all_gdr and not gdr:
                proc.net[kind] = False
                self._keep("channel", f"{kind} {proc.host} no-gdr", line)
                self._changed()
        elif target.startswith(_INTRA_VIA):
            proc = self._proc_of(line)
            if not proc.intra:
                proc.intra = True
                self._intra_seen = True
                self._keep("channel", f"intra {proc.host}", line)
                self._changed()
            if peers and a != b:
                self._join(a, b)

    def _ring_order(self, line: str) -> None:
        """``Channel 00/16 :    0   7   6 ...``: the ring lists every rank of the communicator."""
        colon = line.find(" : ")
        ranks = line[colon + 3 :].split() if colon > 0 else []
        if ranks and all(r.isdigit() for r in ranks):
            self._proc_of(line)
            self._saw_rank(max(int(r) for r in ranks))
            if len(ranks) > self._ring_size:
                self._ring_size = len(ranks)
                self._changed()

    def _trees(self, line: str) -> None:
        """``Trees [0] 3/-1/-1->1->0``: every rank prints its place in the trees (its own rank in the middle)."""
        m = _TREE_SELF.search(line)
        if m:
            proc, rank = self._proc_of(line), int(m.group(1))
            self._saw_rank(rank)
            ranks = self._host_ranks.setdefault(proc.host, set()) if len(self._host_ranks) < 64 else None
            if ranks is not None and rank not in ranks and rank < MAX_RANK_HOSTS:
                ranks.add(rank)
                self._changed()

    def _graph(self, line: str, text: str) -> None:
        m = _GRAPH.match(text.rstrip())
        if m is None:
            return
        if "NET/" in m.group(1):
            if not self._graph_net:
                self._graph_net = True
                self._keep("nodes", "graph net", line)
                self._changed()
        elif not self._graph_local:
            self._graph_local = True
            self._keep("nodes", "graph local", line)
            self._changed()

    def _saw_rank(self, rank: int) -> None:
        if self._max_rank < rank < MAX_RANK:
            self._max_rank = rank
            self._changed()

    def _join(self, a: int, b: int) -> None:
        if a >= MAX_RANK or b >= MAX_RANK:
            return
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)
            self._changed()

    # -- what NCCL announced ------------------------------------------------------------------
    def _using(self, line: str) -> None:
        m = _NETWORK.search(line)
        if m:
            self._announce(line, m.group(1))

    def _net_device(self, line: str) -> None:
        m = _NET_DEVICE.search(line)
        if m:
            self._address(line)
            # NCCL 2.4.2-2.4.7 bring up the socket net first, for bootstrap, before even looking
            # for a plugin: a NET/Socket line before any NET/Plugin line may be only that.
            early = m.group(1) == "Socket" and not self._proc_of(line).plugin_seen
            self._announce(line, m.group(1), tentative="bootstrap" if early else "device")
            if "rxe" in line:
                self._note("soft-roce", "the IB device is soft-RoCE (rxe): verbs emulated over an ordinary "
                           "Ethernet NIC, at about TCP speed")
        elif "No device found" in line:
            # IB comes after any plugin and before Socket in NCCL's list: no IB device leaves Socket.
            self._announce(line, "Socket", tentative="device", shown_as="Socket (no IB device)")

    def _announce(self, line: str, network: str, *, tentative: str = "", shown_as: str = "") -> None:
        """Record the network a process chose (``tentative`` empty) or may yet choose.

        ``Using network X`` says it outright and always wins. Without it NCCL tries its nets in a
        fixed order (src/net.cc: the plugin, then IB, then Socket) and takes the first that
        initialises, so an initialised net never gives way to one later in that order, whatever
        order the lines come in.
        """
        proc = self._proc_of(line)
        if tentative == "device" and self._forced_net == network.lower():
            tentative = ""  # NCCL_NET names it: of the nets it initialised, NCCL takes this one
        if tentative and proc.network is not None and _rank(tentative, network) < _rank(proc.tentative,
                                                                                         proc.network):
            return
        proc.network_line = _shown(line)  # the latest says it most plainly ("Using network X")
        if proc.network != network:
            proc.network = network
            if tentative not in ("provider", "plugin"):  # those lines are kept as what they are
                self._keep("network", shown_as or network, line)
        proc.network_at = self.nccl_lines
        proc.tentative = tentative
        self._changed()

    def _withdraw(self, proc: Proc, tentative: str) -> None:
        """An announcement that a later line showed was not the network NCCL chose."""
        if proc.network and proc.tentative == tentative:
            proc.network, proc.tentative = None, ""
            self._changed()

    def _bootstrap(self, line: str) -> None:
        self._address(line)

    def _address(self, line: str) -> None:
        m = _ADDRESS.search(line)
        proc = self._proc_of(line)
        if not m or not proc.host:
            return
        ips = self._host_ips.setdefault(proc.host, set())
        if m.group(1) not in ips and len(ips) < MAX_IPS_PER_HOST:
            ips.add(m.group(1))
            if len(ips) == 2:
                self._keep("nodes", "addresses " + proc.host, line)
            self._changed()

    def _forced(self, line: str) -> None:
        m = _NET_FORCED.search(line)
        if m:
            self._keep("forced", "", line)
            self._note("forced", f"NCCL_NET is forced to '{m.group(1)}' by the environment")
            self._forced_net = m.group(1).strip(".").lower()
            self._changed()

    # -- plugins, providers and their failures -------------------------------------------------
    def _ofi(self, line: str) -> None:
        self._ofi_seen = True
        self._clue(line)
        if "rovider" in line:
            m = _PROVIDER.search(line)
            if m:
                self._on_provider(line, m.group(1))
                return
        if any(marker in line for marker in _OFI_STARTING):
            proc = self._proc_of(line)
            if proc.network is None or proc.tentative:  # _announce keeps a surer one
                self._announce(line, OFI_PLUGIN_NETWORK, tentative="plugin")
        if "aws-ofi-nccl" in line:
            m = _OFI_VERSION.search(line)
            if m:
                if self._plugin_version is None:
                    self._plugin_version = "aws-ofi-nccl " + m.group(1)
                    self._plugin = self._plugin or "aws-ofi-nccl"
                    self._keep("plugin", "ofi", line)
                    self._changed()
                return
        # The plugin warns before it gives up ("Creating new endpoint ... failed", "Initializing
        # plugin failed"); what follows it (a fallback or not) says whether it was fatal.
        if any(hint in line for hint in _OFI_FAILURE_HINTS) and (
                _OFI_FAILED.search(line) or ("NCCL WARN" in line and "fail" in line.lower())):
            self._fail(line, "the OFI plugin (aws-ofi-nccl) failed to initialise")

    def _clue(self, line: str) -> None:
        """Keep the first line of each kind of clue to the OFI plugin's fabric (``nccl_evidence``)."""
        for rule in nccl_evidence.clues(line):
            if rule.name not in self._clues:
                self._clues[rule.name] = _shown(line)
                self._keep("clue", rule.name, line)
                self._changed()

    def _foreign(self, line: str) -> None:
        """A line NCCL did not print that still says something: a row of nccl-tests' rank table,
        or libfabric's own log line naming its provider."""
        row = nccl_evidence.rank_row(line)
        if row is not None:
            self._rank_row(row, line)
        elif "libfabric:" in line:
            self._clue(line)

    def _rank_row(self, row: RankRow, line: str) -> None:
        old = self._table.get(row.rank)
        if old == row or row.rank >= MAX_RANK_HOSTS:
            return
        if old is not None:  # a second table (another test in the same log): the newest counts
            self._table.clear()
            self._table_hosts.clear()
        self._table[row.rank] = row
        self._table_open = True
        if row.host not in self._table_hosts:
            self._table_hosts.add(row.host)
            self._keep("nodes", "table " + str(len(self._table_hosts)), line)
        self._saw_rank(row.rank)
        self._changed()

    def _net_plugin(self, line: str) -> None:
        proc = self._proc_of(line)
        if not proc.plugin_seen and "lugin" in line:
            proc.plugin_seen = True
            self._withdraw(proc, "bootstrap")
        if "symbol" in line and not _PLUGIN_FAILED.search(line):
            return  # probing for older plugin API versions: harmless
        m = _LOADED_PLUGIN.search(line) or _P2P_PLUGIN.search(line)
        if m:
            name = m.group(1)
            plugin = f"{name} ({m.group(2)})" if m.re is _LOADED_PLUGIN and m.group(2) else name
            if plugin != self._plugin:
                self._plugin = plugin
                self._keep("plugin", "", line)
                self._changed()
            return
        m = _INIT_PLUGIN.search(line)
        if m:
            if net_kind(m.group(1)) == "ofi":
                if self._plugin is None:
                    self._plugin = m.group(1)
                    self._changed()
                # NCCL 2.27+ src/plugin/net.cc (ncclNetPluginInit): the plugin initialised and found
                # devices, so it is the one assigned to the comm ("Assigned NET plugin %s to comm").
                if proc.network is None or proc.tentative:
                    self._announce(line, OFI_PLUGIN_NETWORK, tentative="plugin")
            return
        if _PLUGIN_FAILED.search(line):
            self._fail(line, "the network plugin failed to initialise")
        elif _PLUGIN_MISSING.search(line):
            self._proc_of(line).plugin_missing = True
            self._keep("plugin-missing", "", line)
            self._changed()

    def _on_provider(self, line: str, provider: str) -> None:
        proc = self._proc_of(line)
        if proc.network is None or proc.tentative:
            # The plugin found devices for this provider, so NCCL will use it (unless it fails
            # later): NCCL 2.4-2.5 print nothing else about a plugin they chose.
            self._announce(line, f"OFI (provider {provider})", tentative="provider")
        if proc.provider == provider:
            return
        proc.provider = provider
        if provider not in self._providers and len(self._providers) < 8:
            self._providers.append(provider)
        self._keep("provider", provider, line)
        if provider_transport(provider) != "efa":
            self._note("provider:" + provider,
                       f"the OFI plugin selected libfabric provider '{provider}', which is not EFA")
        self._changed()

    def _fail(self, line: str, what: str) -> None:
        proc = self._proc_of(line)
        proc.failed_at = self.nccl_lines
        self._failed_lines += 1
        self._withdraw(proc, "provider")
        self._withdraw(proc, "plugin")
        if not self._first_failure_at:
            self._first_failure_at = self.nccl_lines
        message = f"{what}: {_msg(line)}"
        if not self._failures:  # the first failure is the cause; what follows is its echo
            self._note("failure", message)
        self._failures.setdefault(what, message)
        self._keep("failure", what, line)
        self._changed()

    def _error_return(self, line: str) -> None:
        if _LOADER_ERROR.search(line):
            self._fail(line, "the network plugin failed to initialise")
            return
        m = _ERROR_RETURN.search(line)
        # Only an error that reached the caller (init or a group call) matters: NCCL also
        # returns errors internally that it handles itself (a NIC without a sysfs path).
        if m and m.group(1).startswith(_API_FILES) and "error-return" not in self._notes:
            code = m.group(2)
            self._keep("warn", "error-return", line)
            self._note("error-return", f"an NCCL call failed with error {code} "
                       f"({_ERROR_NAMES.get(code, 'unknown')}) at {m.group(1)}")
            self._changed()

    def _warned(self, line: str, start: int) -> None:
        text = line[start:].strip()
        if any(benign in text for benign in _BENIGN_WARNINGS):
            return
        m = _WARN_SITE.search(line, 0, start)
        site = m.group(1) if m else text[:40]
        key = "warn:" + site
        shown = sum(1 for k in self._notes if k.startswith("warn:"))
        if key not in self._notes and shown < MAX_WARN_SITES:
            self._keep("warn", site, line)
            self._note(key, f"NCCL WARN: {text[:200]}")
            self._changed()

    # -- versions, ranks, nodes --------------------------------------------------------------
    def _version(self, line: str) -> None:
        m = _VERSION.search(line)
        if m and m.group(1) not in self._versions and len(self._versions) < 8:
            self._versions.append(m.group(1))
            self._keep("version", m.group(1), line)
            self._changed()

    def _ranks(self, line: str) -> None:
        m = _COMM_RANKS.search(line) if "nRanks" in line else None
        old = _COMM_RANKS_OLD.search(line) if m is None and "nranks" in line else None
        found = m or old
        if found is None:
            return
        proc = self._proc_of(line)
        rank, n_ranks = int(found.group(1)), int(found.group(2))
        n_nodes = 0
        if m is not None:
            local = int(m.group(4) or 0)
            n_nodes = int(m.group(3) or 0) or (-(-n_ranks // local) if local else 0)
        self._saw_rank(rank)
        hosts = self._rank_hosts.get(n_ranks)
        if hosts is None and len(self._rank_hosts) < 8 and n_ranks <= MAX_RANK_HOSTS:
            hosts = self._rank_hosts[n_ranks] = {}
        if hosts is not None and proc.host and hosts.get(rank) != proc.host and hosts.get(rank) != "":
            # Two communicators of this size put the rank on different hosts: no proof either way.
            hosts[rank] = "" if rank in hosts else proc.host
            self._changed()
        if proc.rank != rank or proc.n_ranks < n_ranks or proc.n_nodes < n_nodes:
            proc.rank, proc.n_ranks = rank, max(proc.n_ranks, n_ranks)
            if n_nodes > proc.n_nodes:
                proc.n_nodes = n_nodes
                self._keep("nodes", str(n_nodes), line)
            self._changed()

    # -- bookkeeping ---------------------------------------------------------------------------
    def _proc_of(self, line: str) -> Proc:
        cut = line.find(" NCCL ")
        prefix = line[:cut] if cut > 0 else ""
        proc = self._by_prefix.get(prefix)
        if proc is None:
            proc = self._proc(normalize(prefix + " NCCL INFO" if prefix else line), line)
            if len(self._by_prefix) >= MAX_PREFIX_CACHE:
                self._by_prefix.clear()  # timestamped prefixes never repeat: keep memory flat
            self._by_prefix[prefix] = proc
        return proc

    def _proc(self, ln: LogLine, line: str) -> Proc:
        host = ln.host or ""
        key = (host, ln.pid if ln.pid is not None else ln.rank)
        proc = self._procs.get(key)
        if proc is None:
            if len(self._procs) >= MAX_PROCESSES:
                key = ("", None)  # a pathological stream: fold the rest into one bucket
                proc = self._procs.get(key)
            if proc is None:
                if host and host not in self._hosts:
                    self._hosts.add(host)
                    if len(self._hosts) == 2:
                        self._keep("nodes", "hosts", line)  # the line that shows a second machine
                proc = self._procs[key] = Proc(host=host)
            self._changed()
        if ln.rank is not None:
            self._saw_rank(ln.rank)
            if proc.rank is None:
                proc.rank = ln.rank
        return proc

    def _keep(self, kind: str, detail: str, line: str) -> None:
        key = (kind, detail)
        if key in self._evidence or len(self._evidence) >= MAX_EVIDENCE:
            return
        group = kind + (detail.split(" ", 1)[0] if kind == "channel" else "")
        if self._per_kind.get(group, 0) >= MAX_EVIDENCE_PER_KIND:
            return
        self._per_kind[group] = self._per_kind.get(group, 0) + 1
        self._evidence[key] = _shown(line)

    def _note(self, key: str, message: str) -> None:
        if key not in self._notes and len(self._notes) < MAX_WARNINGS:
            self._notes[key] = message

    def _changed(self) -> None:
        self._cached = None


# How sure an announcement is, by NCCL's order of trying nets: an explicit line (tentative ""), the
# plugin's provider, the plugin starting, an initialised IB device, an initialised Socket, the
# bootstrap interface.
_RANKS = {"": 6, "provider": 5, "plugin": 4, "device:IB": 3, "device:Socket": 2, "bootstrap": 1}
# Lines without NCCL's name that the analyser still reads (``_foreign``): nccl-tests' rank table
# and libfabric's own log lines. Callers that route lines by content route these too.
FOREIGN_MARKERS = ("Rank", "libfabric:")


def _rank(tentative: str, network: str) -> int:
    if tentative == "device":
        return _RANKS["device:IB"] if network == "IB" else _RANKS["device:Socket"]
    return _RANKS.get(tentative, 0)


def _shown(line: str) -> str:
    shown = strip_ansi(line).strip()
    return shown if len(shown) <= 300 else shown[:300] + "…"


def _msg(text: str) -> str:
    for level in ("NCCL INFO ", "NCCL WARN "):
        idx = text.find(level)
        if idx >= 0:
            text = text[idx + len(level) :]
            break
    return _REPEATED.sub("", text)[:200].strip()


def classify_lines(lines: Any, *, job_nodes: int | None = None) -> Verdict:
    """Convenience: run a whole iterable of lines through a fresh analyzer."""
    analyzer = NcclAnalyzer(job_nodes=job_nodes)
    for line in lines:
        analyzer.feed(line)
    return analyzer.verdict()
