"""The expected cost to finish a seed-sized job On-Demand vs on Spot (issue 41), from rtui's own plans.

    .venv/bin/python bench/spot_cost.py [--job-hours 2] [--checkpoint-minutes 10] [--replace-minutes 8]

The prices are the plans' own: `rtui plan --target aws` for the seed (2x g6.12xlarge and the system
node in us-east-1) against the AWS double (boto3 against the moto server, tests/aws), once On-Demand
and once with ``--spot``; each plan's total per hour, the GPU nodes at the chosen AZ's Spot price in
effect now (``DescribeSpotPriceHistory``). The double's Spot prices are its own model, a share of the
On-Demand price that differs by AZ (tests/aws/moto_spot.py), not AWS's market: the ratio says what
rtui makes of a price, not what Spot costs this week.

Time on Spot: a job of ``--job-hours`` of training loses, at each interruption, the wait for a
replacement node (``--replace-minutes``: an instance, its node joining, the image, Ray Train's restart;
the local drill's restart alone took about 22 s on two cores, tests/test_local_e2e.py) and the steps
since the last complete checkpoint (half of ``--checkpoint-minutes`` on average); the whole cluster
bills meanwhile. Interruptions come at a rate per GPU node-hour; AWS does not publish one per type
(the Spot Instance Advisor gives buckets of instances interrupted per month), so the table is over a
range of rates, with the rate at which Spot stops paying.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.hub import default_dataset_uri  # noqa: E402
from backend.resolve import resolve_config  # noqa: E402
from backend.session import RunSession  # noqa: E402
from targets.aws.cloud.spot_advisor import CHECKPOINT_MINUTES, REPLACE_MINUTES, time_stretch  # noqa: E402
from tests.aws.bench_world import serve_aws_double  # noqa: E402
from tests.aws.moto_ext import SCRIPT  # noqa: E402

RATES = (0.0, 0.01, 0.05, 0.1, 0.2, 0.5)  # interruptions per GPU node-hour
GPU_NODES = 2


async def plan_per_hour(spot: bool) -> tuple[float, float]:
    """(the plan's total per hour, its GPU nodes' share)."""
    config = resolve_config({"target": "aws", "region": "us-east-1", "spot": str(spot).lower(),
                             "allow_unpinned": "true", "model_revision": "0" * 40,
                             "data": default_dataset_uri("0" * 40)},  # commits: no Hub asked
                            environ=dict(os.environ))
    async with RunSession.for_config(config) as session:
        plan = await session.plan()
    gpu = next(c for c in plan.changes if c.address == "aws.nodegroup.gpu")
    return plan.cost_per_hour, gpu.cost_per_hour or 0.0


def expected_hours(job_h: float, rate: float, lost_h: float) -> float:
    """Wall hours to finish ``job_h`` of training when each interruption costs ``lost_h`` and comes at
    ``rate`` per GPU node-hour of wall time (the lost time is exposed too: a geometric series)."""
    return job_h * time_stretch(rate, GPU_NODES, lost_h)  # inf: every hour loses more than an hour


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-hours", type=float, default=2.0, help="hours of training without interruption")
    parser.add_argument("--checkpoint-minutes", type=float, default=CHECKPOINT_MINUTES,
                        help="time between checkpoints")
    parser.add_argument("--replace-minutes", type=float, default=REPLACE_MINUTES,
                        help="from an interruption to the job training again on a replacement node")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = serve_aws_double()
    try:
        with tempfile.TemporaryDirectory(prefix="rtui-spot-bench-") as tmp:
            os.environ["RTUI_STATE_DIR"] = str(Path(tmp) / "state")
            os.environ["RTUI_CONFIG_DIR"] = str(Path(tmp) / "config")
            reset = urllib.request.Request(f"{os.environ['AWS_ENDPOINT_URL']}/moto-api/reset", method="POST")
            urllib.request.urlopen(reset, timeout=30).close()
            SCRIPT.default_quotas.update({"L-DB2E81BA": 192, "L-417A185B": 0, "L-1216C47A": 640,
                                          "L-3819A6DF": 192, "L-34B43A08": 640})
            on_demand, od_gpu = asyncio.run(plan_per_hour(spot=False))
            spot, spot_gpu = asyncio.run(plan_per_hour(spot=True))
    finally:
        server.stop()
    lost_h = (args.replace_minutes + args.checkpoint_minutes / 2) / 60
    od_cost = on_demand * args.job_hours
    print(f"plans (the double's prices): On-Demand ${on_demand:.4f}/h (GPU nodes ${od_gpu:.4f}/h), "
          f"Spot ${spot:.4f}/h (GPU nodes ${spot_gpu:.4f}/h): Spot/On-Demand per hour {spot / on_demand:.3f}")
    print(f"a {args.job_hours:g} h job; each interruption costs {lost_h * 60:.1f} min "
          f"({args.replace_minutes:g} min to a replacement + half of {args.checkpoint_minutes:g} min redone)")
    print(f"{'rate /node-h':>12} {'interruptions':>13} {'hours':>7} {'Spot $':>9} {'On-Demand $':>12} {'ratio':>6}")
    for rate in RATES:
        hours = expected_hours(args.job_hours, rate, lost_h)
        cost = spot * hours
        print(f"{rate:>12g} {rate * GPU_NODES * hours:>13.2f} {hours:>7.2f} {cost:>9.2f} {od_cost:>12.2f} "
              f"{cost / od_cost:>6.3f}")
    # Spot stops paying where spot / (1 - rate * nodes * lost) = on_demand.
    even = (1 - spot / on_demand) / (GPU_NODES * lost_h)
    print(f"Spot costs as much as On-Demand at {even:.2f} interruptions per GPU node-hour "
          f"(one every {60 / (even * GPU_NODES):.0f} min of the cluster's time)")


if __name__ == "__main__":
    main()
