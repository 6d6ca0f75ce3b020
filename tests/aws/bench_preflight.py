"""Benchmark: all-region preflight scan vs the slowest single region vs a sequential scan.

Every AWS call gets ``--latency`` seconds of injected latency (default 100 ms) in front of
moto. Prints measured figures and ratios from this run; nothing is hard-coded.

    cd <repo> && python tests/aws/bench_preflight.py [--latency 0.1] [--server-process]

``--server-process`` runs moto in a child process, so the server's CPU work does not share
the client's GIL (closer to real AWS, where the server is somebody else's machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]  # the child process below imports moto_ext from here

from moto_ext import SCRIPT, ScriptedMotoServer, install  # noqa: E402

from backend.aws import PreflightRequest, run_preflight  # noqa: E402
from backend.aws.session import AwsSession  # noqa: E402

CHILD = """
import sys, time
sys.path[:0] = [{here!r}]
from moto_ext import SCRIPT, ScriptedMotoServer, install
install()
SCRIPT.default_quotas.update({{"L-DB2E81BA": 192, "L-1216C47A": 640}})
SCRIPT.latency_s = {latency!r}
server = ScriptedMotoServer(SCRIPT)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
"""


def start_server(latency: float, in_process: bool) -> tuple[str, subprocess.Popen[str] | None]:
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


async def timed(request: PreflightRequest, session: AwsSession | None) -> tuple[float, int]:
    started = time.perf_counter()
    report = await run_preflight(request, session=session)
    return time.perf_counter() - started, len(report.regions)


async def measure(label: str, regions: list[str], shared: AwsSession | None) -> None:
    """One round: all regions at once, each region alone, all regions one call at a time."""
    all_wall, count = await timed(PreflightRequest(all_regions=True), shared)
    singles = {}
    for region in regions:
        singles[region], _ = await timed(PreflightRequest(regions=[region]), shared)
    sequential, _ = await timed(PreflightRequest(all_regions=True, max_concurrency=1), shared)
    slowest_region = max(singles, key=lambda r: singles[r])
    slowest = singles[slowest_region]
    print(f"-- {label}")
    print(f"   all-region concurrent scan: {all_wall:.2f} s ({count} regions, {len(regions)} enabled)")
    print(
        f"   slowest single region:      {slowest:.2f} s ({slowest_region}); median single "
        f"{sorted(singles.values())[len(singles) // 2]:.2f} s"
    )
    print(f"   sequential scan:            {sequential:.2f} s (one AWS call in flight)")
    print(f"   ratio all-region / slowest single region: {all_wall / slowest:.2f}x (goal <= 2x)")
    print(f"   ratio sequential / all-region:            {sequential / all_wall:.1f}x")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--server-process", action="store_true")
    args = parser.parse_args()
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_CONFIG_FILE="/nonexistent",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
    )
    os.environ.pop("AWS_PROFILE", None)
    endpoint, child = start_server(args.latency, in_process=not args.server_process)
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        warm = await run_preflight(PreflightRequest(all_regions=True))  # warm moto's lazy backends
        regions = [r.region for r in warm.regions if r.enabled]
        mode = "a child process" if child else "this process"
        print(f"latency per AWS call: {args.latency * 1000:.0f} ms; moto in {mode}")
        await measure("cold: a new boto3 session per scan (what `rtui check` pays)", regions, None)
        shared = AwsSession()
        await run_preflight(PreflightRequest(all_regions=True), session=shared)  # its clients exist now
        await measure("warm: one session shared by all scans (the TUI re-checking)", regions, shared)
    finally:
        if child is not None:
            child.kill()


if __name__ == "__main__":
    asyncio.run(main())
