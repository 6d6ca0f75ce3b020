"""Stdlib-only log parsing shared by the training program, the CLI and the TUI."""

from training.logparse.lines import LineSplitter, iter_file_lines
from training.logparse.nccl import NcclAnalyzer, classify_lines
from training.logparse.normalize import LogLine, normalize
from training.logparse.verdict import TRANSPORTS, Verdict

__all__ = [
    "TRANSPORTS", "LineSplitter", "LogLine", "NcclAnalyzer", "Verdict", "classify_lines",
    "iter_file_lines", "normalize",
]
