"""The single entry point for log telemetry: every log line goes through ``Telemetry.feed_lines``.

The TUI, the CLI and the run store read the NCCL transport verdict and the metric series
from here and never parse logs themselves (DESIGN.md §1). A resumed session rebuilds the
same state by replaying the run's spool with ``replay_file`` and then keeps up with
``feed_from``, which continues at the byte offset already consumed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from backend.record import TelemetrySnapshot
from backend.telemetry.metrics import DEFAULT_MAX_POINTS, MetricSeries
from training.logparse.lines import LineSplitter, read_chunks
from training.logparse.nccl import NcclAnalyzer
from training.logparse.verdict import Verdict


class Telemetry:
    """NCCL transport verdict + bounded metric series, fed line by line from any source."""

    def __init__(self, *, max_points: int = DEFAULT_MAX_POINTS, model_params: float | None = None,
                 peak_flops_per_gpu: float | None = None, n_gpus: int | None = None,
                 job_nodes: int | None = None) -> None:
        # job_nodes: the run's node count when rtui knows it (its own runs): one node is intra-node.
        self.nccl = NcclAnalyzer(job_nodes=job_nodes)
        self.series = MetricSeries(max_points=max_points, model_params=model_params,
                                   peak_flops_per_gpu=peak_flops_per_gpu, n_gpus=n_gpus)
        self.lines = 0
        self._live = LineSplitter()
        self._spool: Path | None = None
        self._spool_splitter = LineSplitter()
        self._spool_offset = 0

    @property
    def job_nodes(self) -> int | None:
        return self.nccl.job_nodes

    @job_nodes.setter
    def job_nodes(self, nodes: int | None) -> None:
        """The run's node count, learnt after this object was made (a screen learns its session late)."""
        self.nccl.set_job_nodes(nodes)

    # -- feeding -------------------------------------------------------------------------
    def feed(self, line: str) -> None:
        self.feed_lines((line,))

    def feed_lines(self, lines: Iterable[str]) -> int:
        """Hand each line to the analyser it concerns and count it; returns how many lines.

        A line holding ``NCCL`` goes to the NCCL analyser, any other line holding ``RTUI_``
        or ``THROUGHPUT`` to the metric series, a row of nccl-tests' rank table or a libfabric
        log line to the NCCL analyser too (``nccl.FOREIGN_MARKERS``), and the rest (nearly all
        of a log) is only counted. Live bytes and spool replay arrive here too, as decoded lines: 1M lines
        cost about 0.3 s, which DESIGN.md §6 calls fast enough (tests/telemetry/bench_parser.py).
        """
        count = 0
        for line in lines:
            count += 1
            if "NCCL" in line:
                self.nccl.feed(line)
            elif "RTUI_" in line or "THROUGHPUT" in line:
                self.series.feed(line)
            elif "Rank" in line or "libfabric:" in line:  # nccl-tests' rank table, libfabric's own lines
                self.nccl.feed(line)
        self.lines += count
        return count

    def feed_bytes(self, chunk: bytes) -> int:
        """Feed raw bytes from a stream (pod log, pipe); a partial line waits for the rest."""
        return self.feed_lines(self._live.push(chunk))

    def end_of_stream(self) -> int:
        """The stream is finished: its unterminated last line is a line after all."""
        return self.feed_lines(self._live.flush())

    # -- results ---------------------------------------------------------------------------
    @property
    def transport(self) -> Verdict:
        """NCCL's verdict; a job whose metric records say it runs on gloo, with no NCCL line at all, is gloo.

        A node count the job's records state (``"nodes"``) is the job's own: it settles single-node.
        """
        if self.series.nodes and self.nccl.job_nodes != self.series.nodes:
            self.nccl.set_job_nodes(self.series.nodes)
        verdict = self.nccl.verdict()
        if verdict.transport == "unknown" and not verdict.evidence and self.series.backend == "gloo":
            return replace(verdict, transport="gloo", basis="backend",
                           reason="the job's collectives run on torch.distributed's gloo backend (its metric "
                                  "records say so); NCCL is not used")
        return verdict

    def snapshot(self, *, tail: int = 240) -> TelemetrySnapshot:
        """What the run store keeps (the spool, not this, is the source of truth)."""
        return TelemetrySnapshot.model_validate({
            "lines": self.lines,
            "transport": self.transport.to_dict(),
            "metrics": self.series.to_dict(tail=tail),
            "spool": {"path": str(self._spool) if self._spool else None, "offset": self._spool_offset},
        })

    # -- spool replay ------------------------------------------------------------------------
    @property
    def spool_offset(self) -> int:
        """Bytes of the spool consumed so far: always the end of a complete line."""
        return self._spool_offset

    def replay_file(self, path: str | os.PathLike[str]) -> int:
        """Consume a whole spool from its start; returns the bytes consumed.

        Replaying the spool this object already follows does not start over (that would
        count every metric twice); it just continues like ``feed_from``.
        """
        spool = Path(path)
        if self._spool is None or self._spool != spool:
            self._spool = spool
            self._spool_offset = 0
            self._spool_splitter = LineSplitter()
        return self.feed_from()

    def feed_from(self, path: str | os.PathLike[str] | None = None) -> int:
        """Consume what was appended to the spool since the last call; returns bytes consumed.

        A last line without its newline is left for the next call. A spool that shrank
        (replaced behind our back) is not re-read, so nothing is ever counted twice.
        """
        if path is not None and Path(path) != self._spool:
            return self.replay_file(path)
        if self._spool is None:
            raise ValueError("feed_from() needs a path before replay_file() has been called")
        splitter = self._spool_splitter
        before = splitter.consumed
        with open(self._spool, "rb") as stream:
            stream.seek(self._spool_offset)
            for chunk in read_chunks(stream):
                self.feed_lines(splitter.push(chunk))
        splitter.discard_pending()
        gained = splitter.consumed - before
        self._spool_offset += gained
        return gained
