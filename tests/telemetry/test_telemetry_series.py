"""Metric series, MFU, Telemetry entry point and spool replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.telemetry import MetricSeries, Telemetry, estimate_mfu, peak_flops_for
from training.protocol import METRIC_TAG, SUMMARY_TAG, format_record


def metric(step: int, **extra: float) -> str:
    record = {"step": step, "loss": 7.0 - step / 10, "tokens_per_s": 1000.0 + step, "step_time_s": 0.5,
              "world_size": 8, "ts": 1000.0 + step, **extra}
    return "(RayTrainWorker pid=3, ip=10.0.0.1) " + format_record(METRIC_TAG, record)


def test_tagged_metric_lines_become_points() -> None:
    series = MetricSeries()
    assert series.feed(metric(1)) and series.feed(metric(2))
    assert [p.step for p in series.points] == [1, 2]
    latest = series.latest
    assert latest is not None and latest.steps_per_s == 2.0 and latest.tokens_per_s == 1002.0
    assert series.column("loss") == [6.9, 6.8]


def test_summary_line_is_kept() -> None:
    series = MetricSeries()
    assert series.feed(format_record(SUMMARY_TAG, {"steps": 20, "tokens_per_s_mean": 790.1}))
    assert series.summary == {"steps": 20, "tokens_per_s_mean": 790.1} and len(series) == 0


def test_reference_throughput_style() -> None:
    series = MetricSeries()
    assert series.feed("(RayTrainWorker pid=1) THROUGHPUT step=12 steps_per_sec=0.5173 tokens_per_sec=2118.9 "
                       "loss=6.25")
    point = series.latest
    assert point is not None and point.step == 12 and point.steps_per_s == 0.5173
    assert point.step_time_s == pytest.approx(1 / 0.5173) and point.tokens_per_s == 2118.9
    assert not series.feed("THROUGHPUT nothing useful here")


def test_malformed_and_unrelated_lines_are_ignored() -> None:
    series = MetricSeries()
    for line in ("RTUI_METRIC {broken", "RTUI_METRIC [1, 2]", 'RTUI_METRIC {"step": "x", "loss": "nan"}',
                 "hello", "RTUI_METRIC"):
        series.feed(line)
    assert all(p.step is None and p.loss is None for p in series.points)
    assert series.feed('RTUI_METRIC {"step": 1, "loss": NaN, "tokens_per_s": Infinity}')
    assert series.latest is not None and series.latest.loss is None and series.latest.tokens_per_s is None


def test_series_is_bounded_and_duplicates_are_dropped() -> None:
    series = MetricSeries(max_points=10)
    for step in range(1, 101):
        series.feed(metric(step))
        series.feed(metric(step))  # Ray printing the worker's line twice
    assert len(series) == 10 and series.records == 100
    assert [p.step for p in series.points] == list(range(91, 101))


def test_mfu_from_params_and_peak() -> None:
    assert estimate_mfu(1000.0, 1e9, 100e12, 2) == pytest.approx(6 * 1e9 * 1000 / 200e12)
    assert estimate_mfu(None, 1e9, 1e12, 1) is None and estimate_mfu(1.0, 1e9, None, 1) is None
    series = MetricSeries(peak_flops_per_gpu=121e12)
    series.feed(metric(1, params=494_032_768.0))
    point = series.latest
    assert point is not None and point.mfu == pytest.approx(6 * 494_032_768 * 1001 / (121e12 * 8))
    assert MetricSeries().feed(metric(1)) and MetricSeries().latest is None


def test_peak_lookup_by_gpu_name() -> None:
    assert peak_flops_for("NVIDIA L40S") == 362e12
    assert peak_flops_for("NVIDIA L4") == 121e12
    assert peak_flops_for("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_for("Quadro K600") is None and peak_flops_for(None) is None


def nccl_socket_lines() -> list[str]:
    return [f"{h}:{p}:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0"
            for h, p in (("a", 1), ("b", 2))]


def test_telemetry_routes_lines_and_snapshot_is_json() -> None:
    telemetry = Telemetry()
    telemetry.feed_lines([*nccl_socket_lines(), metric(1), "noise"])
    telemetry.feed(metric(2))
    assert telemetry.transport.transport == "socket" and len(telemetry.series) == 2
    snap = json.loads(telemetry.snapshot().model_dump_json())
    assert snap["transport"]["transport"] == "socket" and snap["lines"] == 5
    assert [p["step"] for p in snap["metrics"]["points"]] == [1, 2]


def test_feed_bytes_holds_partial_lines() -> None:
    telemetry = Telemetry()
    data = ("\n".join([*nccl_socket_lines(), metric(1)]) + "\n").encode()
    for i in range(0, len(data), 7):
        telemetry.feed_bytes(data[i : i + 7])
    assert telemetry.transport.transport == "socket" and len(telemetry.series) == 1
    telemetry.feed_bytes(metric(2).encode())  # no newline yet
    assert len(telemetry.series) == 1
    telemetry.end_of_stream()
    assert len(telemetry.series) == 2


def test_replay_then_follow_never_counts_twice(tmp_path: Path) -> None:
    spool = tmp_path / "job.log"
    spool.write_text("\n".join([*nccl_socket_lines(), metric(1), metric(2)]) + "\n" + metric(3)[:20])
    telemetry = Telemetry()
    consumed = telemetry.replay_file(spool)
    assert consumed == telemetry.spool_offset == spool.stat().st_size - 20
    assert [p.step for p in telemetry.series.points] == [1, 2]  # the half-written step 3 waits
    assert telemetry.feed_from(spool) == 0
    with open(spool, "a", encoding="utf-8") as out:
        out.write(metric(3)[20:] + "\n" + metric(4) + "\n")
    telemetry.feed_from()
    assert [p.step for p in telemetry.series.points] == [1, 2, 3, 4]
    telemetry.replay_file(spool)  # a second replay of the same spool continues, not restarts
    telemetry.feed_from(spool)
    assert [p.step for p in telemetry.series.points] == [1, 2, 3, 4]
    assert telemetry.spool_offset == spool.stat().st_size
    assert telemetry.snapshot().spool.model_dump() == {"path": str(spool), "offset": spool.stat().st_size}


def test_resumed_session_matches_live_session(tmp_path: Path) -> None:
    lines = [*nccl_socket_lines(), *(metric(s) for s in range(1, 50))]
    live = Telemetry()
    live.feed_lines(lines)
    spool = tmp_path / "spool.log"
    spool.write_text("\n".join(lines[:30]) + "\n")
    resumed = Telemetry()
    resumed.replay_file(spool)
    with open(spool, "a", encoding="utf-8") as out:
        out.write("\n".join(lines[30:]) + "\n")
    resumed.feed_from(spool)
    assert resumed.series.points == live.series.points
    assert resumed.transport == live.transport and resumed.lines == live.lines


def test_shrunken_spool_is_not_reread(tmp_path: Path) -> None:
    spool = tmp_path / "s.log"
    spool.write_text(metric(1) + "\n" + metric(2) + "\n")
    telemetry = Telemetry()
    telemetry.replay_file(spool)
    spool.write_text(metric(1) + "\n")
    assert telemetry.feed_from(spool) == 0 and len(telemetry.series) == 2


def test_feed_from_needs_a_spool() -> None:
    with pytest.raises(ValueError):
        Telemetry().feed_from()
