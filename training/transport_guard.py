"""``--require-transport``: stop a training run whose NCCL is not on the network asked for.

Call ``capture_nccl_debug(dir)`` before the process group starts, so every rank writes its
NCCL INFO log to ``dir/nccl.<host>.<pid>.log``; after the first collective call
``enforce_transport(required, dir, nodes=job_nodes())``. It reads every rank's file in that
directory (the ranks of this node), and raises ``SystemExit`` with the evidence when the
verdict is not the one required. A single-node job passes whatever is required: its ranks
talk over P2P/SHM/NVLS and the network it was asked to prove is not used. Stdlib only (runs
inside the cluster image).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import TextIO

from training.logparse.lines import iter_stream_marked
from training.logparse.nccl import NcclAnalyzer
from training.logparse.verdict import TRANSPORTS, Verdict, provider_transport

# Requiring "unknown" makes no sense, and "gloo" is not NCCL's to report.
REQUIREMENTS = ("any", *(t for t in TRANSPORTS if t not in ("unknown", "gloo")))
DEBUG_FILE_PATTERN = "nccl.%h.%p.log"
# Subsystems that print the lines the verdict needs (init, plugin and channel setup).
_NEEDED_SUBSYS = ("INIT", "NET", "ENV")

PathLike = str | os.PathLike[str]


class TransportMismatch(RuntimeError):
    """NCCL is not on the network the run requires; the message carries the evidence."""


def capture_nccl_debug(log_dir: PathLike, env: MutableMapping[str, str] | None = None) -> Path:
    """Make NCCL log at INFO level into one file per process under ``log_dir``."""
    env = os.environ if env is None else env
    directory = Path(log_dir)
    directory.mkdir(parents=True, exist_ok=True)
    if env.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        env["NCCL_DEBUG"] = "INFO"
    subsys = env.get("NCCL_DEBUG_SUBSYS", "").strip()
    if subsys:
        parts = [p.strip() for p in subsys.lstrip("^").split(",") if p.strip()]
        if subsys.startswith("^"):
            kept = [p for p in parts if p.upper() not in _NEEDED_SUBSYS]
            env["NCCL_DEBUG_SUBSYS"] = "^" + ",".join(kept) if kept else "ALL"
        elif "ALL" not in (p.upper() for p in parts):
            missing = [s for s in _NEEDED_SUBSYS if s not in (p.upper() for p in parts)]
            env["NCCL_DEBUG_SUBSYS"] = ",".join(parts + missing)
    env["NCCL_DEBUG_FILE"] = str(directory / DEBUG_FILE_PATTERN)
    return directory


def _files(sources: PathLike | Iterable[PathLike]) -> list[Path]:
    items = [sources] if isinstance(sources, str | os.PathLike) else list(sources)
    files: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.is_file()))
        elif path.exists():
            files.append(path)
    return files


def job_nodes(env: Mapping[str, str] | None = None) -> int | None:
    """The job's node count from torch.distributed's variables (Ray Train sets them on each
    worker): WORLD_SIZE ranks, LOCAL_WORLD_SIZE of them per node. None when they are not set."""
    env = os.environ if env is None else env
    try:
        world, local = int(env["WORLD_SIZE"]), int(env["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return -(-world // local) if world > 0 and local > 0 else None


def read_verdict(sources: PathLike | Iterable[PathLike] | None = None, *,
                 lines: Iterable[str] | None = None, nodes: int | None = None) -> Verdict:
    """The verdict over NCCL debug files (a directory, files) and/or lines already in hand;
    ``nodes`` is the job's node count when the caller knows it."""
    analyzer = NcclAnalyzer(job_nodes=nodes)
    if sources is not None:
        for path in _files(sources):
            try:
                with open(path, "rb") as stream:
                    for line in iter_stream_marked(stream, (b"NCCL",)):
                        analyzer.feed(line)
            except OSError:
                continue  # a rank's file can vanish or be unreadable; the others still count
    for line in lines or ():
        analyzer.feed(line)
    return analyzer.verdict()


# Only proof is acted on: traffic seen on the channels, or a plugin failure and its fallback.
# An announced network is what NCCL meant to use, which a single node never does.
DECISIVE = ("channels", "failure")


def _settled(verdict: Verdict) -> bool:
    """Proof of the network used, or proof that no network is used (a single node)."""
    return verdict.basis in DECISIVE or verdict.transport == "intra_node"
_BASIS_WORDS = {"channels": "seen on its channels", "failure": "after a network plugin failure"}


def check_transport(required: str, verdict: Verdict) -> str | None:
    """None when ``verdict`` satisfies ``required``, else the one-line reason it does not."""
    if required not in REQUIREMENTS:
        raise ValueError(f"unknown transport requirement {required!r}; use one of {', '.join(REQUIREMENTS)}")
    if required == "any" or verdict.transport == "intra_node":
        return None  # a single node uses no network: there is nothing to stop it for
    if verdict.basis in DECISIVE:
        if verdict.satisfies(required):
            return None
        return (f"required {required}, but NCCL uses {verdict.label} ({verdict.transport}), "
                f"{_BASIS_WORDS[verdict.basis or '']}")
    if verdict.basis == "announced":
        return (f"required {required}, but NCCL only announced '{verdict.network or 'a network'}' "
                f"({verdict.transport}) and no channel has connected over it yet; the strict check acts "
                "on channels or a plugin failure, never on an announcement alone")
    if verdict.provider and provider_transport(verdict.provider) != "efa":
        return (f"required {required}, but NCCL's network plugin runs on libfabric provider "
                f"'{verdict.provider}', which is not EFA ({verdict.reason})")
    if verdict.nccl_version is None and not verdict.evidence:
        return (f"required {required}, but no NCCL output was captured: is the backend NCCL, and "
                "were NCCL_DEBUG=INFO and NCCL_DEBUG_FILE set before the process group started?")
    return (f"required {required}, but no network evidence was seen after the first collective "
            f"({verdict.reason})")


def enforce_transport(required: str, sources: PathLike | Iterable[PathLike] | None = None, *,
                      lines: Iterable[str] | None = None, wait_s: float = 10.0, poll_s: float = 0.5,
                      echo: TextIO | None = None, nodes: int | None = None) -> Verdict:
    """Return the verdict when it satisfies ``required``; otherwise exit with the evidence.

    ``nodes`` is the job's node count (``job_nodes()``): one node passes whatever is required.
    Other ranks may still be flushing their logs, so a verdict that is not yet decisive
    (only announced, or unknown) is re-read for up to ``wait_s`` seconds before it counts as
    a failure. With ``echo`` (e.g. sys.stdout) the evidence lines are printed, so the job log
    (captured NCCL output no longer goes there) still lets the TUI reach the same verdict,
    followed by the one line that says what the check decided on.
    """
    line_list = list(lines) if lines is not None else None
    deadline = time.monotonic() + max(wait_s, 0.0)
    while True:
        verdict = read_verdict(sources, lines=line_list, nodes=nodes)
        if _settled(verdict) or sources is None or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    failure = check_transport(required, verdict)
    if echo is not None:
        for line in verdict.evidence:
            echo.write(line + "\n")
        outcome = "satisfies" if failure is None else "does not satisfy"
        if failure is None and verdict.transport == "intra_node" and required != "any":
            outcome = "passes (a single node uses no network)"
        echo.write(f"rtui: transport check: {verdict.transport} (basis {verdict.basis or 'none'}) "
                   f"{outcome} --require-transport {required}\n")
        echo.flush()
    if failure is None:
        return verdict
    message = "\n".join(["rtui: NCCL transport check failed: " + failure,
                         *verdict.describe(max_evidence=12)])
    raise SystemExit(message)  # Python prints a string exit code to stderr and exits 1
