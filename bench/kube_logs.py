"""Lines/s and memory of the kube target's log paths, against a local-file baseline.

    PYTHONPATH=. .venv/bin/python bench/kube_logs.py [--lines 1000000]

A child process runs the emulated API server (tests/kube/conftest.py ``KubeCluster``)
and a fake Ray head behind its service proxy (``BigLogRayHead``, which tails the job's log as
Ray does: 10 lines per websocket message), so this process's memory is the client's only.
Measured here, each as ``flows`` runs it:

- baseline: the same log read from a local file in Ray-sized chunks, appended to a spool and
  fed to ``Telemetry.feed_from`` after every chunk (no network);
- job log: ``JobFollower.updates()`` over the real ``RayJobs`` (the kubeconfig's token provider
  and CA) through the proxy into the spool, ``Telemetry.feed_from`` after every update, as
  ``flows._train_progress`` does;
- full-log fetch (follow's fallback when a tail broke): ``JobsApi.logs_from`` streamed, and
  ``JobsApi.logs`` (the whole body at once, what follow used to do after every job);
- head pod: ``KubeApi.read_pod_log(follow=True)`` into a spool, a line at a time, as
  ``flows.head_log`` does.

Each runs twice: once for time and RSS (sampled every 5 ms), once under tracemalloc.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.follow import JobFollower  # noqa: E402
from backend.rayjobs import RayJobs  # noqa: E402
from backend.resolve import resolve_config  # noqa: E402
from backend.session import RunSession  # noqa: E402
from backend.spool import LogSpool  # noqa: E402
from backend.store import JobRecord, RunStore  # noqa: E402
from backend.telemetry import Telemetry  # noqa: E402
from targets.kube.api import KubeApi  # noqa: E402

NS, SVC, POD = "default", "rtui-ray-head-svc", "rtui-ray-head-abcde"
CHUNK_LINES = 10  # Ray's tail message


# ---- the child: cluster, proxy and head -------------------------------------------------------

def serve(lines: int, workdir: Path) -> None:
    from tests.kube.conftest import KubeCluster
    from tests.kube.fake_ray import BigLogRayHead, TrainingLog

    log = TrainingLog(lines)
    with (workdir / "job.log").open("w") as f:  # the baseline's input, written here, not by the measurer
        for line in log:
            f.write(line + "\n")
    cluster = KubeCluster()
    cluster.start()
    head = BigLogRayHead(log).start()
    try:
        cluster.require_token(lambda token: token == cluster.token)
        kubeconfig = cluster.write_kubeconfig(workdir / "kubeconfig")
        cluster.proxy_to(NS, SVC, "dashboard", head.url)
        printed = list(log)
        for pod in (POD + tag for tag in ("", "-traced", "-count", "-count-traced")):
            cluster.add_pod(NS, pod, phase="Running")
            cluster.feed_log(NS, pod, printed)
            cluster.set_pod_phase(NS, pod, "Succeeded")
        print(json.dumps({"kubeconfig": str(kubeconfig)}), flush=True)
        for command in sys.stdin:  # the parent says when a pod's log was read to its end
            if command.strip() == "drop":
                cluster.drop_log_streams()
    finally:
        head.stop()
        cluster.stop()


# ---- measuring ---------------------------------------------------------------------------------

class RssPeak:
    """The process's RSS sampled in a thread: its peak during a pass."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def mib(n: float) -> float:
    return round(n / 2**20, 2)


Pass = Callable[[str], Awaitable[int]]  # a pass gets a tag (fresh names per pass) and counts lines


async def measure(name: str, run: Pass, expected: int) -> dict[str, object]:
    proc = psutil.Process()
    before = proc.memory_info().rss
    with RssPeak() as sampler:
        started = time.perf_counter()
        lines = await run("")
        elapsed = time.perf_counter() - started
    after = proc.memory_info().rss
    assert lines == expected, (name, lines, expected)
    tracemalloc.start()
    traced_lines = await run("-traced")
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert traced_lines == expected, (name, traced_lines, expected)
    return {"what": name, "lines_per_s": round(lines / elapsed), "seconds": round(elapsed, 2),
            "rss_before_mib": mib(before), "rss_after_mib": mib(after),
            "rss_peak_growth_mib": mib(sampler.peak - before),
            "tracemalloc_peak_mib": mib(traced_peak)}


def session_for(state: Path, sid: str) -> RunSession:
    config = resolve_config({}, environ={}).config.model_copy(update={"target": "kube"})
    store = RunStore(state)
    record = store.create(config)
    record.jobs.append(JobRecord(submission_id=sid, submitted_at=0.0, spec_hash="h"))
    return RunSession(store, record, config)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.lines, args.serve)
        return

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        child = subprocess.Popen([sys.executable, __file__, "--serve", str(work), "--lines", str(args.lines)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert child.stdout is not None and child.stdin is not None
            kubeconfig = json.loads(child.stdout.readline())["kubeconfig"]
            stdin = child.stdin
            results = await run_all(args.lines, work, kubeconfig, lambda: (stdin.write("drop\n"), stdin.flush()))
        finally:
            if child.stdin is not None:
                child.stdin.close()
            child.wait(timeout=30)
        log_mib = mib((work / "job.log").stat().st_size) if (work / "job.log").exists() else None
    base = results[0]
    for r in results:
        r["vs_baseline_speed"] = round(float(r["lines_per_s"]) / float(base["lines_per_s"]), 3)  # type: ignore[arg-type]
    print(json.dumps({"lines": args.lines, "log_mib": log_mib, "results": results}, indent=1))
    print_table(results)


async def run_all(lines: int, work: Path, kubeconfig: str, drop: Callable[[], object]) -> list[dict[str, object]]:
    api = KubeApi.from_kubeconfig(kubeconfig)
    url = api.proxy_url(NS, SVC, "dashboard")
    results = []

    async def baseline(tag: str) -> int:
        spool = LogSpool(work / f"baseline{tag}.spool")
        telemetry = Telemetry()
        count = 0
        with (work / "job.log").open() as f:
            while True:
                chunk = "".join(f.readline() for _ in range(CHUNK_LINES))
                if not chunk:
                    break
                spool.append(chunk)
                count += chunk.count("\n")
                telemetry.feed_from(spool.path)
        assert telemetry.lines == lines
        return count

    results.append(await measure("baseline: local file -> spool -> telemetry", baseline, lines))

    async with RayJobs(url, header_provider=api.headers, ssl=api.ssl_context()) as jobs:
        await jobs.version()

        async def job_log(tag: str) -> int:
            sid = f"bench{tag}"
            await jobs.submit(entrypoint="python train.py", submission_id=sid, runtime_env={}, metadata={})
            follower = JobFollower(session_for(work / f"state{tag}", sid), jobs)
            telemetry = Telemetry()
            count = 0
            async for update in follower.updates():
                count += len(update.lines)
                if update.lines:
                    telemetry.feed_from(follower.spool.path)
            assert telemetry.lines == lines
            return count

        results.append(await measure("job log: proxy tail -> JobFollower -> spool -> telemetry", job_log, lines))

        async def fetch_streamed(tag: str) -> int:
            return sum([text.count("\n") async for text in jobs.api.logs_from(f"bench{tag}", 0)])

        async def fetch_whole(tag: str) -> int:
            return (await jobs.api.logs(f"bench{tag}")).count("\n")

        results.append(await measure("full-log fetch, streamed (follow's fallback now)", fetch_streamed, lines))
        results.append(await measure("full-log fetch, whole body (what follow did before)", fetch_whole, lines))

    async def head_pod(tag: str) -> int:
        spool = LogSpool(work / f"head{tag}.spool")
        count = 0
        async for line in api.read_pod_log(NS, POD + tag, "ray-head", follow=True):
            spool.append(line + "\n")
            count += 1
            if count == lines:
                drop()  # the emulated kubelet never ends a followed log by itself
        return count

    async def head_pod_count(tag: str) -> int:
        count = 0
        async for _line in api.read_pod_log(NS, f"{POD}-count{tag}", "ray-head", follow=True):
            count += 1
            if count == lines:
                drop()
        return count

    results.append(await measure("head pod: read_pod_log(follow) -> spool", head_pod, lines))
    results.append(await measure("head pod: read_pod_log(follow), lines counted only", head_pod_count, lines))
    api.close()
    return results


def print_table(results: list[dict[str, object]]) -> None:
    print(f"\n{'path':58} {'lines/s':>10} {'x base':>7} {'RSS before':>10} {'after':>7} {'peak +':>7} "
          f"{'tracemalloc':>11}")
    for r in results:
        print(f"{r['what']!s:58} {r['lines_per_s']:>10,} {r['vs_baseline_speed']:>7} {r['rss_before_mib']:>10} "
              f"{r['rss_after_mib']:>7} {r['rss_peak_growth_mib']:>7} {r['tracemalloc_peak_mib']:>11}")


if __name__ == "__main__":
    asyncio.run(main())
