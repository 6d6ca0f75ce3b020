"""When a job stopped and went on again from a checkpoint, read from its own log lines.

Ray Train restarts the worker group when a worker or its node dies (``--max-failures``); the new group
goes on from the run's newest complete checkpoint, and its rank 0 says so with an ``RTUI_RESUME``
record (``training.protocol``: the checkpoint's step, where it now runs, when). Read beside the metric
records, that gives each interruption: the last step reported before it, the step it went on from, the
node, how long no step was made, and how long the interruption cost in all (the wait plus the steps done
again), once the job is past the step it had reached.

A resume before the job's first step is the user's own ``--resume-from``, not an interruption. A group
that restarts with no checkpoint to go on from prints no resume record: its steps start over, which is
read as an interruption that went on from step 0. What took the node away is not in the log: the
session asks the target (``backend.layers.base.NodeLosses``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Restart:
    at_step: int  # the last step the job reported before it stopped
    at_ts: float | None  # when it reported that step (the job's own clock)
    resumed_step: int  # the checkpoint's step it went on from (0: from the start)
    node: str | None = None  # where its rank 0 runs since
    resumed_ts: float | None = None  # when it reported its first step since
    back_ts: float | None = None  # when it reported a step past ``at_step`` again
    back_step: int | None = None
    step_time_s: float | None = None  # of that step: the time it would have taken anyway

    @property
    def down_s(self) -> float | None:
        """From the last step before to the first step after: no training was done."""
        if self.at_ts is None or self.resumed_ts is None:
            return None
        return max(0.0, self.resumed_ts - self.at_ts)

    @property
    def lost_s(self) -> float | None:
        """What the interruption cost: the wait and the steps done again, once the job is back past
        ``at_step`` (None before)."""
        if self.at_ts is None or self.back_ts is None or self.back_step is None:
            return None
        ahead = (self.back_step - self.at_step) * (self.step_time_s or 0.0)
        return max(0.0, self.back_ts - self.at_ts - ahead)

    @property
    def redone_steps(self) -> int:
        return max(0, self.at_step - self.resumed_step)

    def to_dict(self) -> dict[str, Any]:
        return {"at_step": self.at_step, "resumed_step": self.resumed_step, "node": self.node,
                "at_ts": self.at_ts, "resumed_ts": self.resumed_ts, "down_s": self.down_s, "lost_s": self.lost_s,
                "redone_steps": self.redone_steps}


class Restarts:
    """Fed every metric point and resume record of one job, in log order."""

    def __init__(self) -> None:
        self.found: list[Restart] = []
        self._last: tuple[int, float | None] | None = None  # (step, ts) of the newest step reported
        self._open: Restart | None = None  # resumed, not yet back past its step
        self._seen: set[tuple[object, ...]] = set()  # the resume records read

    def resumed(self, record: dict[str, Any]) -> None:
        """An ``RTUI_RESUME`` record."""
        step, node = record.get("step"), record.get("node")
        if self._last is None or not isinstance(step, int) or isinstance(step, bool):
            return  # before the first step: the job's own --resume-from
        key = (step, str(record.get("from")), record.get("ts"))
        if key in self._seen:
            return  # Ray prints a worker's line twice at times: one restart
        self._seen.add(key)
        # A second restart before the first was back past its step leaves the first as it was.
        self._start(Restart(*self._last, resumed_step=step, node=node if isinstance(node, str) else None))

    def point(self, step: int | None, ts: float | None, step_time_s: float | None) -> None:
        """A metric point the series took as new."""
        if step is None:
            return
        if self._open is None and self._last is not None and step <= self._last[0]:
            self._start(Restart(*self._last, resumed_step=step - 1))  # started over with no checkpoint
        if (current := self._open) is not None:
            if current.resumed_ts is None:
                current = replace(current, resumed_ts=ts)
            if step > current.at_step:
                current = replace(current, back_ts=ts, back_step=step, step_time_s=step_time_s)
            self.found[-1] = current
            self._open = None if step > current.at_step else current
        self._last = (step, ts)

    def _start(self, restart: Restart) -> None:
        self._open = restart
        self.found.append(restart)
