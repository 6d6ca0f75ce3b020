"""Benchmark: all-region preflight scan vs the slowest single region vs a sequential scan.

Every AWS call gets ``--latency`` seconds of injected latency (default 100 ms) in front of
moto. Prints measured figures and ratios from this run; nothing is hard-coded.

    cd <repo> && python tests/aws/bench_preflight.py [--latency 0.1] [--rounds 3] [--in-process]

The headline is moto in a child process (the default), because real AWS does its work on
somebody else's CPU; ``--in-process`` puts moto's CPU work under the client's GIL (the test
suite's setting), which is harsher than production. Two session states are measured:

- warm: one ``AwsSession`` shared by every scan (the TUI re-checking): clients and worker
  threads exist already.
- cold: a new ``AwsSession`` per scan (one ``rtui check`` invocation, less Python's imports):
  service models loaded, clients created and worker threads started inside the timing.

In each round the all-region scan and then every enabled region alone are timed with the
same session state. The ratio is the median all-region wall time over the slowest region's
median single-region time (per region the median over rounds, then the maximum). CPU
seconds of this process (client) and of the moto child (server) per all-region scan show
where the time goes. The sequential scan (one
AWS call in flight) is timed once per session state.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]  # the child process below imports moto_ext from here

from moto_ext import SCRIPT, ScriptedMotoServer, install  # noqa: E402

from targets.aws.cloud import PreflightRequest, run_preflight  # noqa: E402
from targets.aws.session import AwsSession  # noqa: E402

CHILD = """
import logging, sys
sys.path[:0] = [{here!r}]
from moto_ext import SCRIPT, ScriptedMotoServer, install
logging.getLogger("werkzeug").setLevel(logging.ERROR)
install()
SCRIPT.default_quotas.update({{"L-DB2E81BA": 192, "L-1216C47A": 640}})
SCRIPT.latency_s = {latency!r}
server = ScriptedMotoServer(SCRIPT)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
"""


def start_server(latency: float, in_process: bool) -> tuple[str, subprocess.Popen[str] | None]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request costs CPU
    if in_process:
        install()
        SCRIPT.default_quotas.update({"L-DB2E81BA": 192, "L-1216C47A": 640})
        SCRIPT.latency_s = latency
        server = ScriptedMotoServer(SCRIPT)
        server.start()
        return f"http://127.0.0.1:{server.get_host_and_port()[1]}", None
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(here=str(HERE), latency=latency)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert child.stdout is not None
    return f"http://127.0.0.1:{child.stdout.readline().strip()}", child


def cpu_seconds(child: subprocess.Popen[str] | None) -> float:
    """CPU time (user + system) of the moto child so far; 0 when moto runs in this process."""
    if child is None:
        return 0.0
    fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def timed(request: PreflightRequest, warm: AwsSession | None) -> tuple[float, int]:
    started = time.perf_counter()
    report = await run_preflight(request, session=warm)  # None: a new session inside the timing
    return time.perf_counter() - started, len(report.regions)


async def measure(
    label: str, regions: list[str], warm: AwsSession | None, rounds: int, child: subprocess.Popen[str] | None
) -> float:
    """Rounds of (all regions at once, then each region alone); returns the headline ratio:
    the median all-region wall time over the slowest region's median single-region time."""
    alls: list[float] = []
    client_cpu: list[float] = []
    server_cpu: list[float] = []
    singles: dict[str, list[float]] = {region: [] for region in regions}
    count = 0
    for _ in range(rounds):
        cpu, server = time.process_time(), cpu_seconds(child)
        wall, count = await timed(PreflightRequest(all_regions=True), warm)
        client_cpu.append(time.process_time() - cpu)
        server_cpu.append(cpu_seconds(child) - server)
        alls.append(wall)
        for region in regions:
            singles[region].append((await timed(PreflightRequest(regions=[region]), warm))[0])
    sequential, _ = await timed(PreflightRequest(all_regions=True, max_concurrency=1), warm)
    median = statistics.median
    all_wall = median(alls)
    # Per region the median over rounds, then the slowest region: one hiccup of a busy machine
    # in one of many single-region scans must not pass for the slowest region.
    by_region = {region: median(times) for region, times in singles.items()}
    worst = max(by_region, key=lambda r: by_region[r])
    ratio = all_wall / by_region[worst]
    print(f"-- {label}")
    print(
        f"   all-region concurrent scan: {all_wall:.2f} s median of {rounds} "
        f"({', '.join(f'{w:.2f}' for w in alls)}; {count} regions, {len(regions)} enabled)"
    )
    print(
        f"   slowest single region:      {by_region[worst]:.2f} s ({worst}, median of {rounds}: "
        f"{', '.join(f'{t:.2f}' for t in singles[worst])}); median region {median(by_region.values()):.2f} s"
    )
    cpu_line = f"client {median(client_cpu):.2f} s"
    if child is not None:
        cpu_line += f", moto server {median(server_cpu):.2f} s"
    print(f"   CPU per all-region scan:    {cpu_line}")
    print(f"   sequential scan:            {sequential:.2f} s (one AWS call in flight, once)")
    print(f"   ratio all-region / slowest single region: {ratio:.2f}x (goal <= 2x)")
    print(f"   ratio sequential / all-region:            {sequential / all_wall:.1f}x")
    return ratio


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-process", action="store_true", help="moto in this process (shares the GIL)")
    parser.add_argument("--server-process", action="store_true", help="the default; kept for old command lines")
    args = parser.parse_args()
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_CONFIG_FILE="/nonexistent",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
    )
    os.environ.pop("AWS_PROFILE", None)
    endpoint, child = start_server(args.latency, in_process=args.in_process)
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        warmup = await run_preflight(PreflightRequest(all_regions=True))  # warm moto's lazy backends
        regions = [r.region for r in warmup.regions if r.enabled]
        mode = "a child process (headline)" if child else "this process (shares the client's GIL)"
        print(f"latency per AWS call: {args.latency * 1000:.0f} ms; moto in {mode}; {os.cpu_count()} CPUs")
        shared = AwsSession()
        await run_preflight(PreflightRequest(all_regions=True), session=shared)  # its clients exist now
        warm_label = "warm: one session shared by all scans (the TUI re-checking)"
        warm = await measure(warm_label, regions, shared, args.rounds, child)
        cold_label = "cold: a new session per scan (what `rtui check` pays)"
        cold = await measure(cold_label, regions, None, args.rounds, child)
        print(f"== headline ratio (all-region / slowest single region): warm {warm:.2f}x, cold {cold:.2f}x")
    finally:
        if child is not None:
            child.kill()


if __name__ == "__main__":
    asyncio.run(main())
