"""A job without NCCL says so through its own records, not through a special case in the UI."""

from __future__ import annotations

import json

from backend.telemetry import Telemetry


def record(step: int, backend: str) -> str:
    data = {"step": step, "loss": 1.0, "tokens_per_s": 10.0, "step_time_s": 0.1, "world_size": 2, "ts": step,
            "backend": backend}
    return f"(RayTrainWorker pid=1) RTUI_METRIC {json.dumps(data)}"


def test_gloo_records_without_nccl_lines_give_a_gloo_verdict() -> None:
    telemetry = Telemetry()
    assert telemetry.transport.transport == "unknown"
    telemetry.feed_lines([record(1, "gloo")])
    verdict = telemetry.transport
    assert (verdict.transport, verdict.basis, verdict.label) == ("gloo", "backend", "gloo (no NCCL)")
    assert telemetry.snapshot().transport.transport == "gloo"


def test_nccl_records_or_nccl_lines_never_read_as_gloo() -> None:
    nccl = Telemetry()
    nccl.feed_lines([record(1, "nccl")])
    assert nccl.transport.transport == "unknown"
    mixed = Telemetry()
    mixed.feed_lines([record(1, "gloo"), "host:1:1 [0] NCCL INFO Using network Socket",
                      "host:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0"])
    assert mixed.transport.transport == "socket"
