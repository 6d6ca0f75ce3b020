"""How fast the Jobs API client follows a job log, and whether its memory stays flat.

    PYTHONPATH=. .venv/bin/python bench/jobs_follow.py [--lines 200000] [--chunk-chars 660]

The fake Jobs API of tests/test_jobsapi.py runs in a child process (so its copy of the log is
not counted in our memory) and sends the log over the websocket tail in chunks of
``--chunk-chars`` (default: 10 lines, as Ray's tail sends at most; 20000 characters is its
largest message). Measured in this process: the raw tail (``JobsApi.tail``), ``RayJobs.follow``
(the tail plus its closing full-log fetch), and, as the baseline, reading the same text from a
local file in chunks of the same size. Memory: RSS before/after and the process's peak RSS
(ru_maxrss) growth, then a second pass under tracemalloc for the peak of Python allocations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.rayjobs import RayJobs  # noqa: E402

JOB = "bench-job"


def log_text(lines: int) -> str:
    return "".join(f"(RayTrainWorker pid=4242) step {i:07d} loss=1.2345 tokens/s=98765\n" for i in range(lines))


async def serve(lines: int, chunk_chars: int, baseline: Path) -> None:
    from tests.test_jobsapi import FakeRay
    from tests.test_jobsapi import serve as run_fake

    fake = FakeRay(tail_chunk_chars=chunk_chars)
    text = log_text(lines)
    baseline.write_text(text)  # written here so the measuring process never holds the whole text
    fake.add_job(JOB, text, status="SUCCEEDED")
    async with run_fake(fake):
        print(json.dumps({"port": fake.port}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent is done


def rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def count_lines(chunks: AsyncIterator[str]) -> tuple[int, int]:
    lines = chars = 0
    async for chunk in chunks:
        lines += chunk.count("\n")
        chars += len(chunk)
    return lines, chars


def read_file(path: Path, chunk_chars: int) -> tuple[int, int]:
    lines = chars = 0
    with path.open() as f:
        while chunk := f.read(chunk_chars):
            lines += chunk.count("\n")
            chars += len(chunk)
    return lines, chars


Counted = tuple[int, int]  # lines and characters read


async def measure(name: str, run: Callable[[], Counted | Awaitable[Counted]], expected_lines: int) -> dict[str, object]:
    before, peak_before = rss_mb(), peak_rss_mb()
    started = time.perf_counter()
    made = run()
    lines, _chars = made if isinstance(made, tuple) else await made
    elapsed = time.perf_counter() - started
    assert lines == expected_lines, (name, lines, expected_lines)
    return {"what": name, "lines": lines, "seconds": round(elapsed, 3), "lines_per_s": round(lines / elapsed),
            "rss_mb_before": round(before, 1), "rss_mb_after": round(rss_mb(), 1),
            "peak_rss_growth_mb": round(peak_rss_mb() - peak_before, 1)}


async def traced_peak_mb(run: Callable[[], object]) -> float:
    tracemalloc.start()
    result = run()
    if asyncio.iscoroutine(result):
        await result
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return round(peak / 2**20, 2)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200_000)
    # Ray's tail sends up to 10 lines per message.
    parser.add_argument("--chunk-chars", type=int, default=10 * len(log_text(1)))
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        await serve(args.lines, args.chunk_chars, args.serve)
        return

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.log"
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(path), "--lines", str(args.lines),
                                   "--chunk-chars", str(args.chunk_chars)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert server.stdout is not None
            port = json.loads(server.stdout.readline())["port"]
            url = f"http://127.0.0.1:{port}"
            async with RayJobs(url) as jobs:
                # Warm up the connection and the code paths, then measure.
                await jobs.version()
                runs: list[tuple[str, Callable[[], Counted | Awaitable[Counted]]]] = [
                    ("local file read (baseline)", lambda: read_file(path, args.chunk_chars)),
                    ("JobsApi.tail (websocket)", lambda: count_lines(jobs.api.tail(JOB))),
                    ("RayJobs.follow (tail + final full-log fetch)", lambda: count_lines(jobs.follow(JOB))),
                ]
                results = [await measure(name, run, args.lines) for name, run in runs]
                for result, (_name, run) in zip(results, runs, strict=True):
                    result["tracemalloc_peak_mb"] = await traced_peak_mb(run)
            print(json.dumps({"lines": args.lines, "chunk_chars": args.chunk_chars,
                              "log_mb": round(path.stat().st_size / 2**20, 1), "results": results}, indent=1))
        finally:
            if server.stdin is not None:
                server.stdin.close()
            server.wait(timeout=10)


if __name__ == "__main__":
    asyncio.run(main())
