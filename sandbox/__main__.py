"""The real rtui wizard against the project's doubles: ``python -m sandbox aws|kube``.

rtui runs unchanged, as its own process on this terminal. What it talks to is what the test suite
uses: for ``aws`` the moto server with the extensions in ``tests/aws`` (quotas, EKS clusters and
nodegroups that take their time, add-ons, access entries) reached through ``AWS_ENDPOINT_URL``
with throwaway credentials; for both, the emulated Kubernetes API in ``tests/kube`` (the
new EKS cluster's endpoint, or a kubeconfig context named ``sandbox``) whose controllers play
KubeRay, the device plugins and the kubelets, and a Ray head whose job prints real NCCL lines of
a two-node EFA run (from ``../shared/nccl_logs`` when that folder is there) and a metric line
per step. KubeRay's CRDs are the v1.7.0 files in ``../shared/schemas/kuberay``, else stand-ins
that accept any spec: the sandbox needs no network. Durations are AWS's typical ones scaled
down: ``SANDBOX_MINUTE`` seconds stand for a minute (default 1: the EKS control plane takes 10 s).

Nothing in rtui knows it is a sandbox: it sees endpoints and a kubeconfig. The cluster is named
``sandbox`` (``RTUI_CLUSTER_NAME``: the subtitle and the teardown prompt say so), and so is the
kube context. Everything lives in a temporary directory removed on exit: state, kubeconfig, the
doubles' data.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The project's shared data, when this checkout sits beside it (SANDBOX_SHARED: another folder to look in).
SHARED = Path(os.environ.get("SANDBOX_SHARED") or ROOT.parent / "shared")
SHARED_NCCL = SHARED / "nccl_logs" / "02_efa_nccl2.29.2_ofi1.18.0_g7e_slurm_2node.log"
SHARED_CRDS = SHARED / "schemas" / "kuberay"
NAME = "sandbox"
STEPS = 60


def nccl_lines() -> list[str]:
    """A two-node EFA run's NCCL lines: the real log when this checkout sits beside ``shared/``."""
    if SHARED_NCCL.is_file():
        return [line for line in SHARED_NCCL.read_text().splitlines() if line and not line.startswith("#")]
    from tests.kube.fake_ray import NCCL_EFA_LINES

    # These carry a Ray worker's prefix already; job_script adds the sandbox's own.
    return [line.split(") ", 1)[1] if line.startswith("(") else line for line in NCCL_EFA_LINES]


def job_script(entrypoint: str, *, step_s: float) -> list[str]:
    """What the sandbox's job prints: NCCL's setup, then one metric line a step (the loss falls), for the
    job rtui submitted: its steps and its step's tokens from the program's own arguments and step plan
    (``training.config.parse_args``, ``training.stepplan.plan_step``), at the pace the lines are printed."""
    import shlex

    from training.config import parse_args
    from training.protocol import METRIC_TAG, format_record
    from training.stepplan import plan_step

    argv = shlex.split(entrypoint)
    cfg = parse_args(argv[argv.index("training.train") + 1:] if "training.train" in argv else [])
    # An auto micro-batch (--batch-size auto) is what fits the GPU's memory: the sandbox has none, one it is.
    plan = plan_step(tokens_per_step=cfg.tokens_per_step, seq_len=cfg.seq_len, world=cfg.num_workers,
                     micro_batch=cfg.batch_size or 1)
    prefix = "(RayTrainWorker pid=210, ip=10.0.1.5)"
    lines = [f"{prefix} {line}" for line in nccl_lines()]
    for step in range(1, cfg.steps + 1):
        record = {"step": step, "loss": round(0.2 + 6.7 * 0.93 ** step, 4), "step_time_s": step_s,
                  "tokens_per_step": plan.tokens_per_step, "tokens_per_s": plan.tokens_per_step / step_s,
                  "world_size": cfg.num_workers}
        lines.append(f"{prefix} {format_record(METRIC_TAG, record)}")
    return lines


class PacedHead:
    """The fake Ray head, its NCCL lines at once and its steps at a readable pace."""

    @staticmethod
    def start(step_s: float) -> Any:
        from tests.kube.fake_ray import FakeRayHead

        class Head(FakeRayHead):
            async def _run(self, job: Any) -> None:
                import asyncio

                await asyncio.sleep(step_s)
                await self._set(job, status="RUNNING")
                for line in job_script(job.entrypoint, step_s=step_s):
                    if job.status != "RUNNING":
                        return
                    await self._set(job, log=job.log + line + "\n")
                    await asyncio.sleep(step_s if "RTUI_METRIC" in line else 0.002)
                await self._set(job, status="SUCCEEDED", message="Job finished successfully.")

        return Head(steps=0).start()


def kube_world(stack: ExitStack, tmp: Path, minute: float, env: dict[str, str], *, nodes: bool) -> Any:
    """The emulated API server with its controllers, registry and Ray head; ``nodes``: a GPU cluster
    that is already there (kube), else nodes join as EKS nodegroups turn active (aws)."""
    from tests.fake_hub import FakeHub
    from tests.kube.conftest import KubeCluster
    from tests.kube.crds import crd_dir, standin_crd_dir
    from tests.kube.fake_control import FakeControlPlane, Timings
    from tests.kube.fake_registry import FakeRegistry
    from tests.kube.kube_world import gpu_cluster

    cluster = KubeCluster()
    cluster.start()
    stack.callback(cluster.stop)
    if nodes:
        gpu_cluster(cluster)
    head = PacedHead.start(step_s=max(minute / 3, 0.05))
    stack.callback(head.stop)
    registry = stack.enter_context(FakeRegistry())  # the Ray image and the add-ons', as a mirror serves them
    hub = stack.enter_context(FakeHub())  # the model's revision is pinned to a commit at plan time
    timings = Timings(addon_s=minute, pull_s=2 * minute, start_s=minute / 2, stop_s=minute / 4)
    stack.enter_context(FakeControlPlane(cluster, timings=timings, jobs_url=head.url, volume_root=tmp))
    env.update({"RTUI_IMAGE": registry.image(), "RTUI_ADDON_REGISTRY": registry.host, "HF_ENDPOINT": hub.url,
                "RTUI_CLUSTER_NAME": NAME, "RTUI_STEPS": str(STEPS)})
    # KubeRay's CRDs: the shared v1.7.0 files when this checkout sits beside them, else stand-ins (the
    # sandbox needs no network, so rtui never downloads them here). Stand-ins are vouched for in the
    # sandbox's own config dir, as a user vouches for CRDs of their own.
    config = Path(env["RTUI_CONFIG_DIR"])
    if (SHARED_CRDS / "ray.io_rayclusters.yaml").is_file():
        crds = crd_dir(tmp, config=config, shared=SHARED_CRDS)
    else:
        crds = standin_crd_dir(tmp, config=config)
    env["RTUI_KUBERAY_CRDS"] = str(crds)
    return cluster


def aws_world(stack: ExitStack, tmp: Path, minute: float, env: dict[str, str]) -> None:
    from bench.aws_up import join_nodes
    from tests.aws.checkip import CheckIp
    from tests.aws.moto_ext import SCRIPT, ScriptedMotoServer, install
    from tests.aws.moto_provision import install_provisioning

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    stack.callback(install())
    stack.callback(install_provisioning())
    SCRIPT.reset()
    SCRIPT.default_quotas.update({"L-DB2E81BA": 192, "L-417A185B": 0, "L-1216C47A": 640})
    t = SCRIPT.timings
    t.cluster_create, t.nodegroup_create, t.addon_create, t.nat_create = 10 * minute, 4 * minute, minute, 1.5 * minute
    cluster = kube_world(stack, tmp, minute, env, nodes=False)
    cluster.require_token(lambda token: token.startswith("k8s-aws-v1."))  # EKS tokens only, as EKS
    SCRIPT.cluster_endpoint = cluster.url
    SCRIPT.cluster_ca = base64.b64encode(cluster.ca_pem).decode()
    SCRIPT.on_nodegroup_active = join_nodes(cluster)
    server = ScriptedMotoServer(SCRIPT)
    server.start()
    stack.callback(server.stop)
    checkip = CheckIp()  # the caller's public address (the EKS API's default allow-list), never the internet's
    checkip.start()
    stack.callback(checkip.stop)
    host, port = server.get_host_and_port()
    env.update({"RTUI_CHECKIP_URL": checkip.url, "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": NAME,
                "AWS_SECRET_ACCESS_KEY": NAME, "AWS_SESSION_TOKEN": NAME, "AWS_REGION": "us-east-1",
                "AWS_CONFIG_FILE": str(tmp / "no-aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-creds"),
                "AWS_EC2_METADATA_DISABLED": "true", "RTUI_REGION": "us-east-1",
                "KUBECONFIG": str(tmp / "kube" / "config")})
    env.pop("AWS_PROFILE", None)


def left_up(state: Path) -> str | None:
    """The newest run in the sandbox's state not torn down (rtui quit, detached from it), if any."""
    live = [run["run_id"] for path in sorted((state / "runs").glob("*.json"))
            if (run := json.loads(path.read_text())).get("status") != "down"]
    return live[-1] if live else None


def ask_resume(run: str) -> bool:
    """Say what ending the sandbox does to ``run``; True when the user asks to resume it here."""
    print(f"\nRun {run} is still up in this sandbox, but the command above works only while this sandbox runs:\n"
          "ending it stops the AWS and Kubernetes doubles and deletes the run with everything it made.\n"
          "Enter resumes it here · q then Enter ends the sandbox: ", end="", flush=True)
    answer = sys.stdin.readline()
    if answer and answer.strip().lower() not in ("q", "n", "quit"):
        return True
    print(f"Sandbox ended: run {run} and everything it made in the doubles are deleted.", flush=True)
    return False


def main(argv: list[str]) -> int:
    if len(argv) < 1 or argv[0] not in ("aws", "kube"):
        print("usage: python -m sandbox aws|kube [rtui flags…]", file=sys.stderr)
        return 2
    target, flags = argv[0], argv[1:]
    minute = float(os.environ.get("SANDBOX_MINUTE", "1"))
    rtui = os.environ.get("SANDBOX_RTUI") or str(Path(sys.executable).parent / "rtui")
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix=f"rtui-sandbox-{target}-") as tmpdir:
        tmp = Path(tmpdir)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RTUI_", "AWS_"))}
        env.update({"RTUI_STATE_DIR": str(tmp / "state"), "RTUI_CONFIG_DIR": str(tmp / "config"),
                    "RTUI_CACHE_DIR": str(tmp / "cache"), "RTUI_TARGET": target})
        print(f"Starting the {target} sandbox (AWS and Kubernetes doubles on 127.0.0.1)…", flush=True)
        if target == "aws":
            aws_world(stack, tmp, minute, env)
        else:
            cluster = kube_world(stack, tmp, minute, env, nodes=True)
            kubeconfig = cluster.write_kubeconfig(tmp / "kubeconfig", context=NAME)
            env["KUBECONFIG"] = str(kubeconfig)
        done = subprocess.run([rtui, *flags], env=env, check=False)
        # rtui, detached, printed how to come back; that holds only while the doubles it ran on do.
        while done.returncode == 0 and (run := left_up(tmp / "state")) is not None:
            if not ask_resume(run):
                break
            done = subprocess.run([rtui, "--resume", run], env=env, check=False)
        # The doubles stop with the sandbox: connections rtui left open may complain as they close.
        logging.disable(logging.CRITICAL)
        threading.excepthook = lambda _args: None
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - until exit, over the doubles' threads
        if os.environ.get("SANDBOX_REPORT"):  # for the test: what the run left in the sandbox's state
            runs = sorted((tmp / "state" / "runs").glob("*.json"))
            Path(os.environ["SANDBOX_REPORT"]).write_text(json.dumps([json.loads(r.read_text()) for r in runs]))
        return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
