"""A log flood into the run dashboard: event-loop lag, memory, spool completeness, idle CPU.

The real RunScreen (headless, 120x40) on a saved run whose cluster is gone; a producer in the
app's loop plays the follower: every 10 ms it appends what is due at ``--rate`` lines/s to the
spool (one write) and posts one ``LinesArrived``; one line in ``--metric-every`` is a metric
record (default 10,000: 10 steps/s, already far more than a real run reports). A probe sleeps
10 ms in a loop and records how late it wakes: the UI lag a key press or a frame would see.
Before the flood, the dashboard's idle CPU (no new lines) is taken with ``time.process_time()``.
Headless: Textual lays out and renders every frame, the driver writes it nowhere.

Run: PYTHONPATH=. .venv/bin/python bench/tui_flood.py [--rate 100000] [--seconds 10] [--idle 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PROBE_S = 0.01
TICK_S = 0.01
PREFIX = "(RayTrainWorker pid=1000, ip=10.0.1.11)"


@dataclass
class FloodResult:
    rate: int
    metric_every: int
    seconds: float
    produced: int
    spooled: int
    shown_total: int
    dropped_from_ring: int
    window_lines: int
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    rss_start_mib: float
    rss_peak_mib: float
    rss_growth_mib: float
    idle_cpu_percent: float
    idle_after_cpu_percent: float

    @property
    def lost(self) -> int:
        return self.produced - self.spooled


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def line_at(i: int, metric_every: int) -> str:
    if i % metric_every == 0:
        record = {"step": i // metric_every, "loss": 6.0, "tokens_per_s": 4000.0, "step_time_s": 2.0,
                  "world_size": 2, "ts": i}
        return f"{PREFIX} RTUI_METRIC {json.dumps(record, separators=(',', ':'))}"
    return f"{PREFIX} [rank0] iteration {i}: data loader batch ready, grad norm 0.{i % 997}"


async def idle_cpu(seconds: float) -> float:
    start_cpu, start = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    return 100 * (time.process_time() - start_cpu) / (time.perf_counter() - start)


async def flood(rate: int = 100_000, seconds: float = 10.0, idle_s: float = 5.0, *,
                priced: bool = True, size: tuple[int, int] = (120, 40),
                metric_every: int = 10_000, load_like_rtui: bool = False) -> FloodResult:
    """Run the flood in this process (its state dir must be private: see ``main``).

    ``load_like_rtui``: the modules load as the wizard loads them: the CLI and the app inside
    ``tui.heap.loading`` (the collector paused, then what is loaded frozen), the run screen later,
    when first shown. ``main`` asks for it, being a process of its own like rtui; a test inside
    pytest's process leaves that process's collector alone."""
    from tui.heap import loading

    with loading() if load_like_rtui else contextlib.nullcontext():
        import tui.cli  # noqa: F401 - loaded before the app, as `rtui` does
        from tui.app import RtuiApp
    from backend.resolve import resolve_config
    from backend.resources import Action, Change, Plan
    from backend.session import RunSession
    from backend.store import JobRecord, JobState, RunStatus
    from screens.run import RunScreen
    from tui.logtail import LogTail

    session = RunSession.for_config(resolve_config({"local_cpus": "2"}, environ={}))
    session.record.jobs.append(JobRecord(submission_id="rtui-flood-1", submitted_at=time.time(), spec_hash="h",
                                         status=JobState.RUNNING))
    session.record.status = RunStatus.UP
    if priced:  # the cost meter runs: the stats change every refresh tick
        session.record.plan = Plan(target="local", changes=[Change(address="aws.nodegroup.gpu", layer="aws",
                                                                   kind="nodegroup", action=Action.CREATE,
                                                                   cost_per_hour=4.6)])
    session.store.save(session.record)
    session = RunSession.resume(session.run_id)

    class FloodApp(RtuiApp):
        def get_default_screen(self) -> RunScreen:
            return RunScreen()

    app = FloodApp(session, resume=True)
    async with app.run_test(size=size) as pilot:
        deadline = time.monotonic() + 20
        while not (isinstance(app.screen, RunScreen)
                   and "cluster not running" in str(app.screen.query_one("#job-status").render())):
            assert time.monotonic() < deadline, "the dashboard never settled"
            await pilot.pause(0.1)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        tail = screen.query_one("#tail", LogTail)
        spool = session.spool()
        await pilot.pause(0.5)
        idle = await idle_cpu(idle_s)

        lags: list[float] = []
        running = True

        async def probe() -> None:
            while running:
                start = time.perf_counter()
                await asyncio.sleep(PROBE_S)
                lags.append(time.perf_counter() - start - PROBE_S)

        produced = 0

        def produce(due: int) -> None:
            nonlocal produced
            if due > produced:
                lines = [line_at(i, metric_every) for i in range(produced, due)]
                spool.append("".join(line + "\n" for line in lines))
                screen.post_message(RunScreen.LinesArrived(lines))
                produced = due

        rss_start = rss_peak = rss_mib()
        prober = asyncio.create_task(probe())
        start = time.perf_counter()
        total = int(rate * seconds)
        while (elapsed := time.perf_counter() - start) < seconds:
            produce(min(int(rate * elapsed), total))
            rss_peak = max(rss_peak, rss_mib())
            await asyncio.sleep(TICK_S)
        produce(total)  # a late last tick (a loaded machine) still delivers the whole flood, at once
        await pilot.pause(0.5)  # the last drain
        running = False
        await prober
        rss_end = rss_mib()
        idle_after = await idle_cpu(min(idle_s, 2.0))
        spooled = sum(1 for _ in spool.iter_lines())
        lags_ms = sorted(1000 * x for x in lags)
        p99 = lags_ms[min(len(lags_ms) - 1, int(0.99 * len(lags_ms)))] if lags_ms else 0.0
        return FloodResult(
            rate=rate, metric_every=metric_every, seconds=seconds, produced=produced, spooled=spooled,
            shown_total=tail.total,
            dropped_from_ring=tail.dropped, window_lines=len(tail.lines),
            lag_p50_ms=round(statistics.median(lags_ms), 2) if lags_ms else 0.0, lag_p99_ms=round(p99, 2),
            lag_max_ms=round(max(lags_ms, default=0.0), 2), rss_start_mib=round(rss_start, 1),
            rss_peak_mib=round(max(rss_peak, rss_end), 1),
            rss_growth_mib=round(max(rss_peak, rss_end) - rss_start, 1),
            idle_cpu_percent=round(idle, 2), idle_after_cpu_percent=round(idle_after, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=100_000, help="lines per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU measurement")
    parser.add_argument("--metric-every", type=int, default=10_000,
                        help="one line in N is a metric record (each is a graph point)")
    parser.add_argument("--collector-as-is", action="store_true",
                        help="load the app without tui.heap's paused-then-frozen collector (the baseline)")
    parser.add_argument("--size", default="120x40", help="terminal size, COLUMNSxROWS (below 100 columns no graph)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rtui-flood-") as tmp:
        for key in [k for k in os.environ if k.startswith("RTUI_")]:
            del os.environ[key]
        os.environ["RTUI_STATE_DIR"] = str(Path(tmp) / "state")
        os.environ["RTUI_CONFIG_DIR"] = str(Path(tmp) / "config")
        width, height = (int(n) for n in args.size.split("x"))
        result = asyncio.run(flood(args.rate, args.seconds, args.idle, size=(width, height),
                                   metric_every=args.metric_every, load_like_rtui=not args.collector_as_is))
    print(json.dumps({**asdict(result), "lost_in_spool": result.lost}, indent=2))


if __name__ == "__main__":
    main()
