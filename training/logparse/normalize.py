"""Strip the decorations that log pipelines add in front of a line, keeping what they say.

A NCCL line can reach us wrapped in any mix of: ANSI colour, a CloudWatch or
``kubectl --timestamps`` timestamp, a ``kubectl --prefix`` pod tag, a Ray prefix such as
``(RayTrainWorker pid=12, ip=10.0.0.3)``, an Open MPI ``--tag-output`` tag, a torchrun /
srun rank label, and finally NCCL's own ``host:pid:tid [dev]``. Each of these tells us
something (host, rank, process), so the normaliser returns it as fields instead of
throwing it away. Stdlib only: it also runs inside the training image.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# CSI sequences (colours, cursor moves) and OSC sequences (terminal titles, links).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# Ray's log deduplicator appends this; older versions also put it in front.
_REPEATED = re.compile(r"\s*\[repeated (\d+)x across cluster\]")
# ISO-8601 / RFC 3339 (CloudWatch, kubectl --timestamps, python logging), optionally bracketed.
# CloudWatch exports sometimes glue the timestamp straight onto the host name, so no
# separator is required after it.
_TIMESTAMP = re.compile(
    r"\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2}| ?UTC)?\]?[\s|]*"
)
# (RayTrainWorker pid=123, ip=10.0.0.1)  (TrainController pid=7)  (pid=9)  (raylet, ip=10.0.0.2)
_RAY = re.compile(
    r"\((?:(?P<actor>[A-Za-z_][\w.:<>-]*)(?: |, ))?(?:pid=(?P<pid>\d+))?(?:,? ?ip=(?P<ip>[0-9A-Fa-f.:]+))?"
    r"(?:, [^)]*)?\)\s?"
)
_MPI = re.compile(r"\[(\d+),(\d+)\]<(?:stdout|stderr|stddiag)>:\s?")
# torchrun --tee / local_ranks_filter: [default3]: or [rank3]:
_TORCHRUN = re.compile(r"\[(?:default|rank)(\d+)\]:\s?")
# kubectl logs --prefix: [pod/<name>/<container>]
_KUBECTL = re.compile(r"\[pod/([^/\]\s]+)/[^\]\s]*\]\s?")
# A bare launcher rank label: "[3] " (pdsh/mpirun wrappers) or srun --label "3: ".
_BRACKET_RANK = re.compile(r"\[(\d+)\]\s+")
_SRUN_LABEL = re.compile(r"(\d+):\s+")
# NCCL's own prefix: host:pid:tid [cudaDev]. Pasted logs redact parts of it ("<cluster_name>",
# "[pod-name]", "pod-id:num:num"): still NCCL's prefix, so a Ray prefix around it does not
# name the host.
_NCCL_PREFIX = re.compile(r"(?P<host>[^\s:()]+):(?P<pid>\w+):(?P<tid>\w+) \[(?P<dev>\d+)\] ")

_MAX_PREFIXES = 8


@dataclass(slots=True)
class LogLine:
    """One line with its decorations removed; ``text`` is what the program printed."""

    text: str
    host: str | None = None
    pid: int | None = None
    device: int | None = None
    rank: int | None = None
    actor: str | None = None
    repeated: int = 1


# Colour codes whose escape byte a copy-paste lost ("[36m(RayWorker pid=1)[0m") or spelled out
# ("ESC[36m"): what logs pasted into issues look like.
_LOST_ESCAPE = re.compile(r"(?:ESC|\^\[)?\[[0-9;]{0,12}m")


def strip_ansi(line: str) -> str:
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if "[0m" in line or "ESC[" in line:
        line = _LOST_ESCAPE.sub("", line)
    return line


def normalize(line: str) -> LogLine:
    """Peel every known prefix off ``line`` and return the text plus what the prefixes said."""
    s = strip_ansi(line).rstrip("\r\n")
    out = LogLine(text="")
    if "across cluster]" in s:
        m = _REPEATED.search(s)
        if m:
            out.repeated = int(m.group(1))
            s = s[: m.start()] + s[m.end() :]
    ray_ip: str | None = None
    ray_pid: int | None = None
    for _ in range(_MAX_PREFIXES):
        s = s.lstrip(" \t|")
        if not s:
            break
        first = s[0]
        m = None
        if first == "(":
            m = _RAY.match(s)
            if m and not (m.group("pid") or m.group("ip")):
                m = None  # an ordinary parenthesised sentence, not a Ray prefix
            if m:
                out.actor = m.group("actor") or out.actor
                ray_ip = m.group("ip") or ray_ip
                if m.group("pid"):
                    ray_pid = int(m.group("pid"))
        elif first == "[":
            m = _MPI.match(s)
            if m:
                out.rank = int(m.group(2))
            else:
                m = _TORCHRUN.match(s) or _BRACKET_RANK.match(s)
                if m and m.re is _BRACKET_RANK and s.startswith("NCCL ", m.end()):
                    m = None  # "[0] NCCL INFO": a CUDA device index, not a rank label
                if m:
                    out.rank = int(m.group(1))
                else:
                    m = _KUBECTL.match(s) or _TIMESTAMP.match(s)
                    if m and m.re is _KUBECTL:
                        out.host = m.group(1)
        elif first.isdigit():
            m = _TIMESTAMP.match(s)
            if not m:
                m = _SRUN_LABEL.match(s)
                if m:
                    out.rank = int(m.group(1))
        if m is None:
            break
        s = s[m.end() :]
    m = _NCCL_PREFIX.match(s)
    if m:
        out.host = m.group("host")
        out.pid = int(m.group("pid")) if m.group("pid").isdigit() else None
        out.device = int(m.group("dev"))
        s = s[m.end() :]
    else:
        if out.host is None:
            out.host = ray_ip
        out.pid = ray_pid
    out.text = s.rstrip()
    return out
