"""The Kubernetes half of `up`, simulated: rtui's plan vs the seed's sequential order, same run.

    .venv/bin/python bench/kube_up.py [--minute 0.1] [--reps 3]

Both orders run the real Kubernetes layer against the emulated API server (tests/kube),
with the test playing KubeRay, the device plugins, the scheduler and the kubelets at the seed's
typical durations scaled down (one minute -> ``--minute`` seconds): a device plugin or the
operator ~1 min, the Ray image's first pull on a node ~5 min, a pod's start ~1 min.

- seed: the sample's bash order, each waiting for the one before: NVIDIA plugin, EFA plugin,
  KubeRay operator, namespace, RayCluster (head), workers. No pre-pull.
- rtui: the plan's steps as the runner schedules them (the plugins, the operator and the image
  pre-pull at once; the RayCluster once the operator is up; the workers once the plugins are).
Prints each time and the ratio rtui / seed (the issue's goal: <= 0.75).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.hub import default_dataset_uri  # noqa: E402
from backend.planner import apply_steps, select_until  # noqa: E402
from backend.runner import Runner, Step  # noqa: E402
from backend.session import RunSession  # noqa: E402
from backend.store import RunStore  # noqa: E402
from targets.kube.config import KubeConfig  # noqa: E402
from targets.kube.handlers import kuberay_crds  # noqa: E402
from tests.kube.conftest import KubeCluster  # noqa: E402
from tests.kube.crds import crd_dir  # noqa: E402
from tests.kube.fake_control import FakeControlPlane, Timings  # noqa: E402
from tests.kube.fake_registry import FakeRegistry  # noqa: E402

# The Ray token's Secret (issue 23) comes with the namespace: the RayCluster's pods cannot start without it.
# The workers' own service account (issue 33) too: their pods are refused without it.
SEED_ORDER = ["kube.device-plugin.nvidia", "kube.device-plugin.efa", "kube.kuberay-operator", "kube.namespace",
              "kube.secret.ray-token", "kube.serviceaccount.ray-workers", "kube.raycluster", "kube.gpu-workers"]


def sequential(steps: list[Step]) -> list[Step]:
    """The seed's order: each step waits for the one before; the pre-pull is not part of it."""
    by_id = {s.id: s for s in steps}
    out: list[Step] = []
    for address in SEED_ORDER:
        step = by_id[address]
        step.deps = (out[-1].id,) if out else ()
        out.append(step)
    return out


def gpu_cluster(cluster: KubeCluster, nodes: int) -> None:
    cluster.add_node("system-0", gpus=0, efa=0)
    for i in range(nodes):
        node = cluster.add_node(f"gpu-{i}", gpus=4, efa=1, labels={"node.kubernetes.io/instance-type": "g6.12xlarge"})
        # A merge patch keeps a key that is left out: None takes it away.
        allocatable = {**node["status"]["allocatable"], "nvidia.com/gpu": None, "vpc.amazonaws.com/efa": None}
        cluster.set_status("Node", f"gpu-{i}", None, {**node["status"], "allocatable": allocatable})


async def one(order: str, minute: float, work: Path, crds: Path) -> float:
    work.mkdir(parents=True)
    cluster = KubeCluster()
    cluster.start()
    try:
        cluster.kubeconfig = cluster.write_kubeconfig(work / f"kubeconfig-{order}")
        timings = Timings(addon_s=minute, pull_s=5 * minute, start_s=minute, stop_s=0.0)
        with FakeRegistry() as registry, FakeControlPlane(cluster, timings=timings):
            gpu_cluster(cluster, 2)
            config = KubeConfig(target="kube", kubeconfig=str(cluster.kubeconfig), image=registry.image(),
                               addon_registry=registry.host, kuberay_crds=str(crds),
                               model_revision="0" * 40, data=default_dataset_uri("0" * 40),  # commits: no Hub asked
                               operator_scope="cluster")  # as the seed installs KubeRay (before the namespace)
            store = RunStore(work / f"state-{order}")
            record = store.new(config)
            session = RunSession(store, record, config)
            plan = await session.plan()
            steps = select_until(apply_steps(session.stack, session.ctx, plan), plan, "kube")
            if order == "seed":
                steps = sequential(steps)
            started = time.perf_counter()
            runner = Runner(steps)
            async for event in runner.events():
                if os.environ.get("RTUI_BENCH_VERBOSE") or event.kind.value == "failed":
                    print(f"  {time.perf_counter() - started:6.2f}s {event.step} {event.kind.value} {event.message}"
                          f"{' — ' + event.cause if event.cause else ''}", flush=True)
            elapsed = time.perf_counter() - started
            if runner.failed:
                raise SystemExit(f"{order}: a step failed")
            await session.aclose()
            return elapsed
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minute", type=float, default=0.1, help="seconds that stand for one minute")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    os.environ.pop("KUBECONFIG", None)
    times: dict[str, list[float]] = {"seed": [], "rtui": []}
    # Parsing KubeRay's 2 MB of CRDs takes about a second of real CPU on either path and does not
    # scale with the simulated minutes: done once here, outside both timings.
    with tempfile.TemporaryDirectory(prefix="rtui-kube-bench-") as tmp:
        os.environ["RTUI_CONFIG_DIR"] = str(Path(tmp) / "config")  # where crd_dir vouches for its RayService CRD
        crds = crd_dir(Path(tmp))
        kuberay_crds(str(crds), "1.7.0")
        for rep in range(args.reps):
            for order in ("seed", "rtui"):  # interleaved: drift hits both alike
                times[order].append(asyncio.run(one(order, args.minute, Path(tmp) / f"{rep}-{order}", crds)))
                print(f"{order}: {times[order][-1]:.2f}s", flush=True)
    seed, rtui = statistics.median(times["seed"]), statistics.median(times["rtui"])
    print(f"seed order median {seed:.2f}s, rtui plan median {rtui:.2f}s: ratio {rtui / seed:.2f} "
          f"({args.reps} runs each, 1 min = {args.minute}s)")


if __name__ == "__main__":
    main()
