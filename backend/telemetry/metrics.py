"""Bounded time series of training throughput, fed from the training program's log lines.

Two line styles are understood: the tagged JSON records of ``training.protocol``
(``RTUI_METRIC {...}`` / ``RTUI_SUMMARY {...}``) and the reference program's
``THROUGHPUT key=value ...`` lines (``steps_per_sec=``, ``tokens_per_sec=``, ``loss=``).
"""

from __future__ import annotations

import math
import re
from collections import deque
from typing import Any, NamedTuple

from backend.restarts import Restarts
from backend.telemetry.mfu import estimate_mfu
from training.protocol import METRIC_TAG, RESUME_TAG, SUMMARY_TAG, parse_record

DEFAULT_MAX_POINTS = 4096
_RECENT_KEYS = 256
_TAGS = (METRIC_TAG, SUMMARY_TAG, RESUME_TAG)
_KV = re.compile(r"(\w+)=([-+0-9.eE]+|nan|inf)")


class MetricPoint(NamedTuple):
    """One step; a tuple because replay creates millions of them and tuples are cheapest."""

    step: int | None
    ts: float | None
    loss: float | None
    tokens_per_s: float | None
    steps_per_s: float | None
    step_time_s: float | None
    mfu: float | None

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


def _num(value: Any) -> float | None:
    if value.__class__ is float:
        return value if math.isfinite(value) else None
    if value.__class__ is int:
        return float(value)
    return None  # missing, text, bool, or anything else JSON may hold


class MetricSeries:
    """The last ``max_points`` steps; MFU is filled in when model size and GPU peak are known."""

    def __init__(self, *, max_points: int = DEFAULT_MAX_POINTS, model_params: float | None = None,
                 peak_flops_per_gpu: float | None = None, n_gpus: int | None = None) -> None:
        self.points: deque[MetricPoint] = deque(maxlen=max_points)
        self.model_params = model_params
        self.peak_flops_per_gpu = peak_flops_per_gpu
        self.n_gpus = n_gpus
        self.summary: dict[str, Any] | None = None
        self.world_size: int | None = None  # the job's number of workers, as its records say
        self.records = 0
        self.backend: str | None = None  # the job's torch.distributed backend, as its records say
        self.nodes: int | None = None  # the job's node count, when its records say it ("nodes")
        self.restarts = Restarts()  # where the job stopped and went on from a checkpoint
        # Ray can print a worker's line twice; a step seen recently is not a new point.
        self._recent: deque[tuple[Any, ...]] = deque(maxlen=_RECENT_KEYS)
        self._recent_set: set[tuple[Any, ...]] = set()

    def __len__(self) -> int:
        return len(self.points)

    @property
    def latest(self) -> MetricPoint | None:
        return self.points[-1] if self.points else None

    def feed(self, line: str) -> bool:
        """Take one raw log line; True when it added a point or a summary."""
        if "RTUI_" in line:
            parsed = parse_record(line, _TAGS)
            if parsed is None:
                return False
            tag, record = parsed
            if tag == SUMMARY_TAG:
                self.summary = record
                return True
            if tag == RESUME_TAG:
                self.restarts.resumed(record)
                return True
            return tag == METRIC_TAG and self.add_record(record)
        if "THROUGHPUT" in line:
            return self._feed_throughput(line)
        return False

    def _feed_throughput(self, line: str) -> bool:
        tail = line[line.find("THROUGHPUT") + 10 :]
        values = {k: float(v) for k, v in _KV.findall(tail)}
        steps_per_s = values.get("steps_per_sec", values.get("steps_per_s"))
        tokens_per_s = values.get("tokens_per_sec", values.get("tokens_per_s"))
        if steps_per_s is None and tokens_per_s is None:
            return False
        record: dict[str, Any] = {"steps_per_s": steps_per_s, "tokens_per_s": tokens_per_s}
        for key in ("step", "loss", "step_time_s", "world_size", "ts"):
            if key in values:
                record[key] = values[key]
        if "step" in record:
            record["step"] = int(record["step"])
        return self.add_record(record)

    def add_record(self, record: dict[str, Any]) -> bool:
        step = record.get("step")
        step = step if step.__class__ is int else None
        ts = _num(record.get("ts"))
        key = (step, ts, record.get("loss"))
        if step is not None and key in self._recent_set:
            return False
        step_time = _num(record.get("step_time_s"))
        steps_per_s = _num(record.get("steps_per_s"))
        if steps_per_s is None and step_time:
            steps_per_s = 1.0 / step_time
        if step_time is None and steps_per_s:
            step_time = 1.0 / steps_per_s
        tokens_per_s = _num(record.get("tokens_per_s"))
        params = self.model_params or _num(record.get("params"))
        world = self.n_gpus or record.get("world_size")
        point = MetricPoint(
            step=step, ts=ts, loss=_num(record.get("loss")), tokens_per_s=tokens_per_s,
            steps_per_s=steps_per_s, step_time_s=step_time,
            mfu=estimate_mfu(tokens_per_s, params, self.peak_flops_per_gpu,
                             world if isinstance(world, int) else None, _num(record.get("flops_per_token")))
            if self.peak_flops_per_gpu else None,
        )
        if step is not None:
            if len(self._recent) == self._recent.maxlen:
                self._recent_set.discard(self._recent[0])
            self._recent.append(key)
            self._recent_set.add(key)
        self.points.append(point)
        self.records += 1
        self.restarts.point(step, ts, step_time)
        workers = record.get("world_size")
        if workers.__class__ is int and workers > 0:
            self.world_size = workers
        backend = record.get("backend")
        if isinstance(backend, str) and backend != "?":
            self.backend = backend
        nodes = record.get("nodes")
        if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1:
            self.nodes = nodes
        return True

    def column(self, name: str) -> list[float | None]:
        """One field across the series (for charts): ``series.column("tokens_per_s")``."""
        return [getattr(p, name) for p in self.points]

    def to_dict(self, *, tail: int = 240) -> dict[str, Any]:
        points = list(self.points)[-tail:] if tail else []
        latest = self.latest
        return {
            "records": self.records,
            "latest": latest.to_dict() if latest else None,
            "points": [p.to_dict() for p in points],
            "summary": self.summary,
        }
