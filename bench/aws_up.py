"""`up` on the aws target (AWS + Kubernetes layers), simulated: rtui's plan vs the seed's sequential order.

    .venv/bin/python bench/aws_up.py [--minute 0.1] [--reps 3]

Both orders run the real aws and Kubernetes layers: boto3 against the moto server (tests/aws)
with AWS's typical durations scaled down (one minute -> ``--minute`` seconds): EKS control plane
10 min, a nodegroup 4 min, an add-on 1 min, the NAT gateway 1.5 min; and the Kubernetes client
against the emulated API server the new EKS cluster points at (tests/kube), whose nodes
join when their nodegroup turns active, with the test playing the device plugins, KubeRay, the
scheduler and the kubelets (a plugin or the operator 1 min, the image's first pull 5 min).

- seed: deploy_all.sh's order, each step after the one before: network, IAM, cluster, system
  nodes, GPU nodes, device plugins, KubeRay, namespace, RayCluster, workers (no pre-pull).
- rtui: the plan's steps as the runner schedules them.
Prints each wall time, rtui's critical path (the longest chain of its measured step times
through the plan's dependencies), the API calls of each run by service (and how many were
polls of a wait), and the ratios: rtui / seed (goal <= 0.75), rtui / critical path (<= 1.1).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import logging
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.hub import default_dataset_uri  # noqa: E402
from backend.planner import apply_steps, select_until  # noqa: E402
from backend.runner import Runner, Step  # noqa: E402
from backend.session import RunSession  # noqa: E402
from backend.store import RunStore  # noqa: E402
from targets.aws.config import AwsConfig  # noqa: E402
from targets.kube.handlers import kuberay_crds  # noqa: E402
from tests.aws.bench_world import serve_aws_double  # noqa: E402
from tests.aws.moto_ext import SCRIPT  # noqa: E402
from tests.kube.conftest import KubeCluster  # noqa: E402
from tests.kube.crds import crd_dir  # noqa: E402
from tests.kube.fake_control import FakeControlPlane, Timings  # noqa: E402
from tests.kube.fake_registry import FakeRegistry  # noqa: E402

# The run's Secrets and NetworkPolicy (issue 23) come with the namespace, before the pods that need them.
# Since: the S3 gateway endpoint and the control plane's log group (issue 34), cluster-autoscaler and its
# tags (issue 26), the netpol probe after the head (issue 33).
SEED_ORDER = [
    "aws.vpc", "aws.subnet", "aws.internet-gateway", "aws.nat-gateway", "aws.route-table", "aws.vpc-endpoint",
    "aws.security-group.nodes", "aws.iam-role", "aws.s3-bucket", "aws.log-group", "aws.eks-cluster", "aws.addon",
    "aws.pod-identity", "aws.access-entry.admin", "aws.kubeconfig", "aws.launch-template.system",
    "aws.nodegroup.system", "aws.placement-group.gpu", "aws.launch-template.gpu",
    "aws.nodegroup.gpu", "aws.asg-tags", "aws.cluster-autoscaler", "kube.device-plugin.nvidia",
    "kube.device-plugin.efa", "kube.kuberay-operator", "kube.namespace", "kube.serviceaccount", "kube.secret.ray-token",
    "kube.secret.job-env", "kube.networkpolicy.ray", "kube.raycluster", "kube.gpu-workers", "kube.probe"]


def sequential(steps: list[Step]) -> list[Step]:
    """The seed's order: every step waits for the one before; the pre-pull is not part of it."""
    def rank(step: Step) -> int:
        found = next((i for i, prefix in enumerate(SEED_ORDER)
                      if step.id == prefix or step.id.startswith(prefix + ".")), None)
        if found is None:
            raise SystemExit(f"bench/aws_up.py: the plan has a step the seed's order does not place: {step.id} "
                             "(add it to SEED_ORDER)")
        return found

    chain = sorted((s for s in steps if s.id != "kube.image-prepull"), key=rank)
    for before, step in zip([None, *chain], chain, strict=False):
        step.deps = (before.id,) if before is not None else ()
    return chain


def critical_path(steps: list[Step], runner: Runner) -> float:
    """The longest chain of measured step durations through the dependencies."""
    took = {sid: (st.ended_at or 0) - (st.started_at or 0) for sid, st in runner.states.items()}
    by_id = {s.id: s for s in steps}
    memo: dict[str, float] = {}

    def longest(sid: str) -> float:
        if sid not in memo:
            memo[sid] = took.get(sid, 0.0) + max((longest(d) for d in by_id[sid].deps), default=0.0)
        return memo[sid]

    return max(longest(s.id) for s in steps)


def join_nodes(cluster: KubeCluster) -> Any:
    """Nodes join the emulated cluster when their nodegroup turns active (GPUs advertised by the plugin)."""
    def joined(_cluster: str, nodegroup: str, info: dict[str, Any]) -> None:
        count = int(info.get("desired_size") or info.get("size") or 1)
        gpu = "gpu" in nodegroup
        for i in range(count):
            name = f"{nodegroup}-{i}"
            node = cluster.add_node(name, gpus=4 if gpu else 0, efa=1 if gpu else 0,
                                    labels={"node.kubernetes.io/instance-type": "g6.12xlarge" if gpu else "m7i.xlarge",
                                            **({} if gpu else {"role": "system"})},
                                    taints=[{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
                                    if gpu else None)
            if gpu:  # the device plugins make it advertise them
                allocatable = {**node["status"]["allocatable"], "nvidia.com/gpu": None, "vpc.amazonaws.com/efa": None}
                cluster.set_status("Node", name, None, {**node["status"], "allocatable": allocatable})

    return joined


async def one(order: str, minute: float, work: Path, crds: Path) -> tuple[float, float, collections.Counter[str]]:
    work.mkdir(parents=True)
    os.environ["KUBECONFIG"] = str(work / "kubeconfig")
    SCRIPT.reset()
    # A fresh account for each run: the seed's order is never torn down, and its roles (same names at
    # every repetition) would be another run's at the next one.
    reset = urllib.request.Request(f"{os.environ['AWS_ENDPOINT_URL']}/moto-api/reset", method="POST")
    urllib.request.urlopen(reset, timeout=10).close()
    SCRIPT.default_quotas.update({"L-DB2E81BA": 192, "L-417A185B": 0, "L-1216C47A": 640})
    t = SCRIPT.timings
    t.cluster_create, t.nodegroup_create, t.addon_create, t.nat_create = 10 * minute, 4 * minute, minute, 1.5 * minute
    cluster = KubeCluster()
    cluster.start()
    try:
        SCRIPT.cluster_endpoint = cluster.url
        SCRIPT.cluster_ca = base64.b64encode(cluster.ca_pem).decode()
        SCRIPT.on_nodegroup_active = join_nodes(cluster)
        timings = Timings(addon_s=minute, pull_s=5 * minute, start_s=minute, stop_s=0.0)
        with FakeRegistry() as registry, FakeControlPlane(cluster, timings=timings):
            config = AwsConfig(target="aws", region="us-east-1", image=registry.image(),
                               addon_registry=registry.host, kuberay_crds=str(crds), cluster_name=f"bench-{order}",
                               model_revision="0" * 40, data=default_dataset_uri("0" * 40),  # commits: no Hub asked
                               operator_scope="cluster")  # as the seed installs KubeRay (before the namespace)
            store = RunStore(work / "state")
            record = store.new(config)
            session = RunSession(store, record, config)
            plan = await session.plan()
            for layer in session.stack.layers:
                layer.applying(session.ctx)
            steps = select_until(apply_steps(session.stack, session.ctx, plan), plan, "kube")
            if order == "seed":
                steps = sequential(steps)
            before = len(SCRIPT.calls)
            started = time.perf_counter()
            runner = Runner(steps)
            async for event in runner.events():
                if os.environ.get("RTUI_BENCH_VERBOSE") or event.kind.value == "failed":
                    print(f"  {time.perf_counter() - started:6.2f}s {event.step} {event.kind.value} {event.message}"
                          f"{' — ' + event.cause if event.cause else ''}", flush=True)
            elapsed = time.perf_counter() - started
            if runner.failed:
                raise SystemExit(f"{order}: a step failed")
            from targets.aws.infra.common import aws_api

            counted = aws_api(session.ctx).counts
            calls = collections.Counter({f"up:{k}": v for k, v in counted.items()})
            counted.clear()
            del before
            if order == "rtui":  # and what tearing it all down costs in calls
                async for event in session.teardown():
                    if event.kind.value == "failed":
                        raise SystemExit(f"teardown: {event.step}: {event.message}")
                calls.update({f"down:{k}": v for k, v in counted.items()})
                counted.clear()
            await session.aclose()
            return elapsed, critical_path(steps, runner), calls
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minute", type=float, default=0.1, help="seconds that stand for one minute")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = serve_aws_double()
    times: dict[str, list[float]] = {"seed": [], "rtui": []}
    paths: list[float] = []
    calls: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="rtui-aws-bench-") as tmp:
        os.environ["RTUI_STATE_DIR"] = str(Path(tmp) / "state")
        os.environ["RTUI_CONFIG_DIR"] = str(Path(tmp) / "config")  # where crd_dir vouches for its RayService CRD
        crds = crd_dir(Path(tmp))
        kuberay_crds(str(crds), "1.7.0")
        for rep in range(args.reps):
            for order in ("seed", "rtui"):  # interleaved: drift hits both alike
                elapsed, path, counted = asyncio.run(one(order, args.minute, Path(tmp) / f"{rep}-{order}", crds))
                times[order].append(elapsed)
                if order == "rtui":
                    paths.append(path)
                    calls = counted
                print(f"{order}: {elapsed:.2f}s" + (f" (critical path {path:.2f}s)" if order == "rtui" else ""),
                      flush=True)
    server.stop()
    seed, rtui, path = (statistics.median(times["seed"]), statistics.median(times["rtui"]),
                        statistics.median(paths))
    for phase in ("up", "down"):
        mine = {k.split(":", 1)[1]: v for k, v in calls.items() if k.startswith(phase + ":")}
        sent = {k: v for k, v in mine.items() if not k.startswith("wait:")}
        by_service: collections.Counter[str] = collections.Counter()
        for name, n in sent.items():
            by_service[name.split(":")[0]] += n
        waits = sum(v for k, v in mine.items() if k.startswith("wait:"))
        print(f"AWS API calls of one `{phase}`: {sum(sent.values())} {dict(sorted(by_service.items()))}, "
              f"of which {waits} are polls of a wait")
    print(f"seed order median {seed:.2f}s, rtui plan median {rtui:.2f}s: ratio {rtui / seed:.2f}; "
          f"critical path {path:.2f}s: ratio {rtui / path:.2f} ({args.reps} runs each, 1 min = {args.minute}s)")


if __name__ == "__main__":
    main()
