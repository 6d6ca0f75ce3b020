"""What a line says about the fabric under NCCL's OFI plugin, and nccl-tests' rank table.

The OFI plugin (aws-ofi-nccl) is named "AWS Libfabric" or "Libfabric" whatever libfabric
provider it runs on (efa, HPE Slingshot's cxi, tcp, verbs), and its ``Selected provider is …``
line is printed only at INFO from some versions on, and is often cut from excerpts. So the
verdict weighs every clue a log gives, per family:

- ``STRONG`` (one settles it when nothing contradicts): a line only EFA hardware or the plugin's
  EFA/AWS code paths print.
- ``WEAK`` (two are needed, or one with traffic through the plugin): a line that is usually
  EFA but not only (the plugin's own lines, the EC2 instance family, a libfabric
  address-vector error). NCCL choosing the plugin counts as one; traffic through it as two.
- ``CONTRARY``: a non-EFA fabric named in its own words (a provider, a libfabric log line of
  that provider, a Slingshot NIC). It outweighs every EFA clue but an explicit provider line.

Each rule names the public source of the string it matches. Stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STRONG, WEAK, CONTRARY = 2, 1, -1
EFA_SCORE = 2  # what the clues (and the plugin's own traffic) must add up to for EFA


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    weight: int
    words: str  # what the clue shows, for the verdict's reason
    pattern: re.Pattern[str]


RULES: tuple[Rule, ...] = (
    # aws-ofi-nccl v1.3.0-aws src/nccl_ofi_net.c: "Forcing AWS OFI ndev %d" and "[%d] getCudaPath dev %d
    # busId %s path %s" are printed on the EFA_NIC_DUP path, taken only when IS_EFA_PROVIDER(prov_name).
    Rule("efa-path", STRONG, "a path the plugin takes only on the efa provider",
         re.compile(r"\bgetCudaPath\b|\bForcing AWS OFI ndev\b")),
    # aws-ofi-nccl src/platform-aws.cpp, PlatformAWS::init: "Configuring AWS-specific options", then
    # "Setting provider_filter to efa" (the AWS build forces the efa provider on EC2; without EFA the
    # plugin fails and NCCL falls back, which the failure rules see), and "Running on %s platform, ..."
    # (1.4.0aws: "Running on P4d platform, Setting NCCL_TOPO_FILE ...").
    Rule("aws-platform", STRONG, "the plugin's AWS platform setup (it forces the efa provider)",
         re.compile(r"Configuring AWS-specific options|Setting provider_filter to efa"
                    r"|\bRunning on \S+ platform\b")),
    # aws-ofi-nccl src/nccl_ofi_net.cpp: "Selected provider is %s, fabric is %s (found %d nics)": the
    # fabric name alone (a line cut before the provider, or the provider misread) still says efa.
    Rule("efa-fabric", STRONG, "the libfabric fabric is efa", re.compile(r"\bfabric is efa\b")),
    # Linux drivers/infiniband/hw/efa/efa_main.c registers EFA devices as "efa_%d"; rdma-core's
    # kernel-boot/rdma_rename.c names an RDMA device of no known link layer (EFA's) "rdma" + its PCI
    # path when it renames by PCI: "rdmap16s27", as EC2 AMIs show it.
    Rule("efa-device", STRONG, "an EFA device name",
         re.compile(r"\brdmap\d+s\d+(?:f\d+)?\b|\befa_\d+\b")),
    # libfabric src/log.c prefixes each message "libfabric:<pid>:<time>:<provider>:<subsystem>:<func>():
    # <line><<level>>": the provider field says efa. EFA's own functions and options (prov/efa: efa_*,
    # rxr_*, FI_EFA_*, FI_OPT_EFA_*) name it too.
    Rule("efa-libfabric", STRONG, "libfabric's efa provider named in its own lines or options",
         re.compile(r"\blibfabric:\d+:\d+:efa:|\b(?:efa|rxr)_[a-z]\w*\(|\bFI_(?:OPT_)?EFA_[A-Z_0-9]+")),
    # aws-ofi-nccl include/nccl_ofi_log.h prefixes every message of the plugin "NET/OFI ": it is loaded and
    # talking. The plugin is AWS's, built for EFA; other fabrics' runs name themselves (CONTRARY below).
    Rule("ofi-plugin", WEAK, "the aws-ofi-nccl plugin's own lines", re.compile(r"\bNET/OFI ")),
    # aws-ofi-nccl src/nccl_ofi_ofiutils.cpp: "Couldn't open AV. RC: %d, ERROR: %s" after fi_av_open:
    # the plugin's own address-vector step, on any provider; most often reported from EFA clusters.
    Rule("av-error", WEAK, "a libfabric address-vector error (fi_av_open)",
         re.compile(r"\bfi_av_open\b|Couldn't open AV\b")),
    # The EC2 instance families that carry EFA (AWS "Supported instance types" for EFA), named by the
    # plugin ("NCCL_OFI_TUNER is not available for platform : g6e.48xlarge") or anywhere else.
    Rule("efa-instance", WEAK, "an EC2 instance family with EFA",
         re.compile(r"\b(?:p3dn|p4de?|p5e?n?|p6e?(?:-[a-z0-9]+)?|g4dn|g5|g6e?|g7e|gr6|trn1n?|trn2|dl1|dl2q|hpc\d\w*"
                    r"|c5n|c6in|c7gn|m5dn|m5n|r5dn|r5n)\.\d*x?large\b", re.IGNORECASE)),
    # A non-EFA fabric in its own words. libfabric src/log.c's provider field (cxi, tcp, verbs, psm3,
    # ...; "shm" and "core" are not fabrics: efa itself logs through them), the rxm utility provider
    # that tcp and verbs run under ("tcp;ofi_rxm"), and HPE Slingshot's NICs (libfabric prov/cxi names
    # its domains cxi0, cxi1, ...).
    Rule("not-efa", CONTRARY, "a libfabric fabric that is not EFA",
         re.compile(r"\blibfabric:\d+:\d+:(?:cxi|tcp|verbs|psm2|psm3|opx|sockets|udp|ucx|ofi_rxm):"
                    r"|\bofi_rxm\b|\bfabric is (?!efa\b)\w+|\bcxi\d+\b")),
)
# One of these must be in a line for any rule to match: most plugin lines are chatter.
HINTS = ("NET/OFI", "getCudaPath", "Forcing", "AWS", "provider_filter", "platform", "fabric is", "rdmap", "efa", "EFA",
         "rxr_", "av_open", "open AV", "large", "LARGE", "rxm", "cxi", "libfabric:")


def clues(line: str) -> list[Rule]:
    """The rules ``line`` matches (usually none)."""
    if not any(hint in line for hint in HINTS):
        return []
    return [rule for rule in RULES if rule.pattern.search(line)]


# nccl-tests (src/common.cu, later src/util.cu) lists every rank before the first test, one line each:
#   "#   Rank %2d on %10s device %2d [0x%02x] %s"                      (2017)
#   "#   Rank %2d Pid %6d on %10s device %2d [0x%02x] %s"              (2019)
#   "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s"   (2025)
# The MPI build gathers the table to rank 0, so one process prints every rank's host.
RANK_ROW = re.compile(r"#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?(?:Pid\s+(\d+)\s+)?on\s+(\S+)\s+device\s+(\d+)"
                      r"\s+\[([^\]]*)\]")


@dataclass(frozen=True, slots=True)
class RankRow:
    rank: int
    pid: int | None
    host: str
    gpu: str  # the bus id when the row has one, else the device index


def rank_row(text: str) -> RankRow | None:
    if "Rank" not in text or " on " not in text:
        return None
    m = RANK_ROW.search(text)
    if m is None:
        return None
    bus = m.group(5).strip()
    return RankRow(int(m.group(1)), int(m.group(2)) if m.group(2) else None, m.group(3),
                   bus if ":" in bus else f"device {m.group(4)}")


def table_nodes(rows: dict[int, RankRow]) -> tuple[int, str] | None:
    """(nodes, why) from a complete rank table (ranks 0..n-1), or None when it proves nothing.

    NCCL refuses two ranks of one communicator on the same GPU of one machine ("Duplicate GPU
    detected", src/init.cc), so one host name with every GPU distinct is one machine; a GPU that
    comes back under the same host name is a second machine named alike (containers, redactions
    such as "<ip>").
    """
    if len(rows) < 2 or set(rows) != set(range(len(rows))):
        return None
    hosts = {row.host for row in rows.values()}
    if len(hosts) > 1:
        return len(hosts), f"nccl-tests' rank table places the {len(rows)} ranks on {len(hosts)} hosts"
    host = next(iter(hosts))
    gpus = [(row.gpu, row.pid) for row in rows.values()]
    per_gpu: dict[str, int] = {}
    for gpu, _ in gpus:
        per_gpu[gpu] = per_gpu.get(gpu, 0) + 1
    repeats = max(per_gpu.values())
    if repeats == 1:
        pids = {pid for _, pid in gpus}
        held = "one process" if len(pids) == 1 and None not in pids else f"{len(pids)} processes"
        return 1, f"nccl-tests' rank table places all {len(rows)} ranks on host {host} ({held}, each on its own GPU)"
    return repeats, (f"nccl-tests' rank table lists the same GPU {repeats} times under host name {host}: "
                     f"{repeats} machines named alike")
