"""The local-ray layer: a Ray head and optional worker nodes as our own processes on this machine.

Each node runs as ``ray start --block`` in its own session, bound to 127.0.0.1 on free
ports inside the cluster's marked dir, so it outlives the TUI (detach/resume), never
collides with another run, and is found again from the world (``local_cluster``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import psutil

from backend.delivery import local_data_dir
from backend.errors import OperationError, TransientError, UserError
from backend.layers.base import Context, Handler, Layer
from backend.procs import ProcRef, check_port_free, free_ports, start_detached, stop_group
from backend.rayjobs import RayJobs
from backend.resources import Action, CheckResult, CheckStatus, NodeLoss, Observed, Resource, Spec
from backend.runner import Progress
from backend.waiting import Look, wait_until
from targets.local import cluster as lc
from targets.local.config import local_config
from training.passed_env import JOB_ENV_FILE
from training.protocol import NODE_ENV
from training.raytrain import RENDEZVOUS_DIR_ENV

HEAD = "local.ray-head"
OBJECT_STORE_BYTES = 512 * 1024 * 1024
PORT_NAMES = ("gcs", "dashboard", "client", "agent_listen", "agent_grpc", "runtime_env", "metrics",
              "node_manager", "object_manager")
WORKER_PORT_NAMES = ("agent_listen", "agent_grpc", "runtime_env", "metrics", "node_manager", "object_manager")
DASHBOARD_TIMEOUT_S = 90.0
DASHBOARD_EXPECTED_S = 10.0  # a head's dashboard answers in ~4 s here; polls settle at half a second
_PORT_FLAGS = {
    "agent_listen": "--dashboard-agent-listen-port", "agent_grpc": "--dashboard-agent-grpc-port",
    "runtime_env": "--runtime-env-agent-port", "metrics": "--metrics-export-port",
    "node_manager": "--node-manager-port", "object_manager": "--object-manager-port",
}


IDLE_KEY = "idle_stop_s"


def _idle_words(idle_s: object) -> str:
    return f"after {idle_s}s without a job or an rtui" if idle_s else "none"


def worker_address(index: int) -> str:
    return f"local.ray-worker.{index}"


def head_cpus(ctx: Context) -> int:
    # Ray Data's tokenising tasks need a CPU beyond the training workers' one each.
    config = local_config(ctx)
    needed = config.effective_workers() + (1 if config.data_is_file() else 0)
    return config.local_cpus or max(os.cpu_count() or 1, needed)


def _port_flags(ports: Mapping[str, int]) -> list[str]:
    return [f"{flag}={ports[name]}" for name, flag in _PORT_FLAGS.items() if name in ports]


# What Ray's processes (and so the job) get from rtui's environment: never credentials.
_ENV_NAMES = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "PYTHONPATH",
                        "PYTHONHASHSEED", "VIRTUAL_ENV", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"})
_ENV_PREFIXES = ("LC_", "RAY_", "OMP_", "MKL_", "OPENBLAS_", "GLOO_", "TORCH_")
# Ours to set: a user's own would point Ray at another cluster or another token.
_ENV_OURS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
TOKEN_FILE = "auth_token"
NO_PORT = "-1"  # outside 0-65535: bind() refuses it, so a server given it is never started
PRESTART_ENV = "RAY_prestart_worker_first_driver"  # Ray's default: on (src/ray/common/ray_config_def.h)
DASHBOARD_MODULE_READY_ENV = "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT"  # Ray's default: 30 s
DASHBOARD_MODULE_READY_S = "180"


def cluster_tmp(cluster: lc.ClusterDir) -> Path:
    """The cluster's temporary dir, made (0700) if it is not there: Python's tempfile passes over a
    TMPDIR that does not exist and falls back to /tmp."""
    path = cluster.path / "tmp"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def ray_env(cluster: lc.ClusterDir, *, loopback: bool = True,
            environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A minimal environment for the cluster's processes, pinned to this cluster and its token, with
    their temporary files in its dir."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items()
           if (k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)) and k not in _ENV_OURS}
    # A job's `python` is whatever is first on the PATH `ray start` saw: make it ours.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), source.get("PATH", os.defpath)])
    env.update({
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray otherwise swaps 127.0.0.1 for the host's address and binds its servers there. A
        # cluster with extra worker nodes cannot keep it: Ray refuses to start a worker node so,
        # and a worker looks for the head at the host's address. Those clusters bind the host's
        # address, behind the token like everything else.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0" if loopback else "1",
        # What the job and Ray write to the system's temporary dir (Ray Train's checkpoint copies and
        # ray.air's _ray_lockfiles, torch's torchinductor_<user> cache, the training program's own) lands
        # in the cluster's dir, which `down` removes: /tmp keeps nothing of a run. Ray reads RAY_TMPDIR
        # first (ray/_common/utils.get_default_system_temp_dir): a user's own stays theirs.
        "TMPDIR": str(cluster_tmp(cluster)),
        # Every Ray entry point (Ray Train's helpers too) talks to this cluster, never "the latest" one.
        "RAY_ADDRESS": str(cluster.facts["gcs_address"]),
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(cluster.path / TOKEN_FILE),
        # No Prometheus endpoint: Ray's metrics servers know no token and would answer anyone on the
        # host (issue 23; tests/test_local_finished_run.py). rtui reads its metrics from the job's log.
        # The node agent's exporter is not started when metrics collection is off (the raylet
        # then starts the agent with --disable-metrics-collection).
        "RAY_enable_metrics_collection": "0",
        # The dashboard's and the autoscaler's are started unconditionally (prometheus_client's
        # start_http_server, in a try that logs and carries on): a port no socket can bind
        # leaves them unstarted. Ray's fixed defaults (44217, 44227) also collided between two
        # clusters on one host.
        "AUTOSCALER_METRIC_PORT": NO_PORT,
        "DASHBOARD_METRIC_PORT": NO_PORT,
    })
    # The dashboard starts each of its modules in a process and gives up on `ray start --head` when one
    # is not ready in 30 s (ray/dashboard/subprocesses/handle.py). A busy laptop (a build, a browser, a
    # CPU-bound process beside it) took longer: "Module MetricsHead failed to start. Timeout after 30.0
    # seconds". A bound, not a pace: a quiet machine is ready in a few seconds. A user's own value stays.
    env.setdefault(DASHBOARD_MODULE_READY_ENV, DASHBOARD_MODULE_READY_S)
    # When a job's driver is the node's first, the raylet starts a worker per CPU for it ahead of need,
    # with no runtime env; a job's actors all run in its runtime env (the uploaded training package), so
    # those processes only import Ray, idle and are reaped: CPU taken from the job's own start.
    env.setdefault(PRESTART_ENV, "0")
    return env


def read_token(cluster: lc.ClusterDir) -> str | None:
    try:
        return (cluster.path / TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def jobs_for(cluster: lc.ClusterDir) -> RayJobs | None:
    """The cluster's Jobs API client, carrying its token."""
    if not cluster.dashboard_url:
        return None
    token = read_token(cluster)
    return RayJobs(cluster.dashboard_url, headers={"Authorization": f"Bearer {token}"} if token else None)


def ray_start(*args: str) -> list[str]:
    return [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", *args]


def head_argv(cluster: lc.ClusterDir, ports: Mapping[str, int], *, cpus: int) -> list[str]:
    """How rtui starts a local head: every port its own (a default one, such as the job agent's 52365,
    is taken by whichever cluster on the host came first), loopback only, no usage stats."""
    return ray_start(
        "--head", f"--node-name={lc.node_name(cluster.cluster_name, None)}", f"--temp-dir={cluster.ray_dir}",
        "--node-ip-address=127.0.0.1", f"--port={ports['gcs']}", f"--num-cpus={cpus}",
        "--num-gpus=0", f"--object-store-memory={OBJECT_STORE_BYTES}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={ports['dashboard']}",
        f"--ray-client-server-port={ports['client']}", "--min-worker-port=0", "--max-worker-port=0",
        "--disable-usage-stats", *_port_flags(ports))


class HeadSpec(Spec):
    """The head node: its CPUs and object store, loopback only or open to worker nodes, the idle stop."""

    cpus: int
    object_store_mib: int
    loopback: bool  # worker nodes need the head on the host's address (see ray_env)
    idle_stop_s: int  # IDLE_KEY: the idle stop's timeout, 0 for none; its watcher changes in place
    dashboard_port: int | None = None  # --local-dashboard-port; else one of its own


class WorkerSpec(Spec):
    cpus: int


class HeadHandler(Handler):
    kind = "ray-head"
    spec_model = HeadSpec
    title = "Start the Ray head"
    delete_title = "Stop the Ray cluster and remove its dir"
    expected_s = 15.0
    retries = 2
    backoff_s = 0.5

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = local_config(ctx)
        ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
        if config.local_dashboard_port:
            check_port_free(config.local_dashboard_port, what="dashboard port")
            ports["dashboard"] = config.local_dashboard_port
        dashboard_url = f"http://127.0.0.1:{ports['dashboard']}"
        # The state dir says which rtui owns the cluster, so another one never calls it an orphan.
        facts: dict[str, Any] = {"ports": ports, "gcs_address": f"127.0.0.1:{ports['gcs']}",
                                 "dashboard_url": dashboard_url, "shape": dict(want.spec),
                                 "state_dir": str(ctx.store.root)}
        cluster = await asyncio.to_thread(lc.make_cluster_dir, ctx.record.run_id, config.cluster_name, facts)
        ctx.record.facts.stopped_while_idle = None  # a new head: the last one's idle stop is history
        # The one secret rtui writes: a fresh token, 0600 inside the 0700 dir, gone with it at teardown.
        token_fd = os.open(cluster.path / TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(token_fd, "w") as fh:
            fh.write(secrets.token_hex(32))
        log = cluster.path / "rtui-head.log"
        ctx.ledger.update(want.address, id=str(cluster.path), outputs={**facts, "head_log": str(log)})
        spec = HeadSpec.of(want)
        argv = head_argv(cluster, ports, cpus=spec.cpus)
        yield Progress(f"starting ray head on 127.0.0.1:{ports['gcs']}", 0.05)
        env = {**ray_env(cluster, loopback=spec.loopback),
               NODE_ENV: lc.node_name(cluster.cluster_name, None)}
        ref = start_detached(argv, log_path=log, env=env, cwd=cluster.path)
        lc.record_root(cluster, lc.node_name(cluster.cluster_name, None), ref)  # only what rtui started is stopped
        jobs = jobs_for(cluster)
        assert jobs is not None
        info: dict[str, Any] = {}

        async def answering() -> Look:
            if not ref.alive():  # said at once, and the half-started cluster goes
                tail = _tail(log)
                retry = _bind_failed(tail) or await asyncio.to_thread(_a_ray_log_says_bind_failed, cluster)
                await _stop_and_remove(cluster.path)
                err = TransientError if retry else OperationError
                raise err(f"ray head exited while starting: {_last_error_line(tail)}", remedy=f"see {log}")
            try:
                info.update(await jobs.version(timeout_s=1.0))
            except TransientError:
                return Look(False, "waiting for the dashboard")
            return Look(True, "dashboard up")

        async for waiting in wait_until(answering, what="the Ray head", timeout_s=DASHBOARD_TIMEOUT_S,
                                        expected_s=DASHBOARD_EXPECTED_S, remedy=f"see {log}"):
            if not info:  # the last word is the one below
                yield Progress(waiting.message, waiting.fraction)
        await asyncio.to_thread(lc.tighten, cluster.path)
        idle_s = spec.idle_stop_s
        if idle_s or not spec.loopback:  # worker nodes: the watcher replaces a lost one
            _start_idle_watcher(cluster, idle_s)
        yield Progress(f"dashboard up at {jobs.address} (Ray {info.get('ray_version', '?')})"
                       + (f"; stops after {idle_s}s without a job or an rtui" if idle_s else ""), 1.0)

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        """A running head whose only change is the idle stop's timeout is updated in place: its watcher
        is started anew, the cluster and its job stay (a new head for that would end the job)."""
        action, why = super().compare(want, have)
        changed = [k for k, v in want.spec.items() if have.state.get(k) != v]
        if action is Action.REPLACE and have.healthy and changed == [IDLE_KEY]:
            was, now = _idle_words(have.state.get(IDLE_KEY)), _idle_words(HeadSpec.of(want).idle_stop_s)
            return Action.UPDATE, f"idle stop: {was} → {now}"
        return action, why

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        cluster = lc.read_marker(Path(have.id))
        if cluster is None:
            raise OperationError(f"{have.id} is no longer a cluster dir of rtui's", remedy="run `rtui up --yes` again")
        old = [proc for root in cluster.roots if root.role == lc.IDLE_WATCHER
               if (proc := root.ref.process()) is not None]
        await _terminate(lambda: [p for p in old if p.is_running()])
        spec = HeadSpec.of(want)
        idle_s = spec.idle_stop_s
        if idle_s or not spec.loopback:
            _start_idle_watcher(cluster, idle_s)
        yield Progress(f"idle stop: {_idle_words(idle_s)}", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        yield Progress("stopping Ray processes")
        count = await _stop_and_remove(Path(have.id))
        yield Progress(f"stopped {count} processes, removed {have.id}", 1.0)


class WorkerHandler(Handler):
    kind = "ray-worker"
    spec_model = WorkerSpec
    title = "Start a Ray worker node"
    expected_s = 8.0
    retries = 1
    backoff_s = 0.5

    def step_title(self, address: str, action: Action) -> str:
        if action is Action.CREATE:
            return f"Start Ray worker node {address.rsplit('.', 1)[1]}"
        return super().step_title(address, action)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        index = int(want.address.rsplit(".", 1)[1])
        cluster = _live_cluster(ctx)
        if cluster is None:
            raise OperationError("no Ray head of this run is running to join")
        yield Progress(f"starting worker node {index}", 0.1)
        ref, log = start_worker_node(cluster, index, WorkerSpec.of(want).cpus)
        ctx.ledger.update(want.address, id=str(cluster.path), outputs={"log": str(log), "pid": ref.pid})
        await asyncio.sleep(2.0)
        if not ref.alive():
            raise OperationError(f"ray worker node {index} exited: {_last_error_line(_tail(log))}",
                                 remedy=f"see {log}")
        # From here the cluster's watcher replaces it should it stop (targets.local.idle).
        await asyncio.to_thread(want_worker_node, cluster.path, index, WorkerSpec.of(want).cpus)
        yield Progress(f"worker node {index} joined", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        index = int(have.address.rsplit(".", 1)[1])
        await asyncio.to_thread(want_worker_node, Path(have.id), index, None)  # not to be replaced
        cluster = lc.read_marker(Path(have.id))
        proc = lc.node_procs(cluster).workers.get(index) if cluster else None
        if proc is None:
            yield Progress("not running", 1.0)
            return
        count = await _terminate(lc.node_family(proc))
        yield Progress(f"stopped worker node {index} ({count} processes)", 1.0)


# The worker nodes the run wants, {index: cpus}, in the cluster's marker: the cluster's watcher starts one
# anew when its processes end (as a node group replaces a lost node), and says so under NODE_LOSSES.
WORKER_NODES = "worker_nodes"
NODE_LOSSES = "node_losses"


def start_worker_node(cluster: lc.ClusterDir, index: int, cpus: int) -> tuple[ProcRef, Path]:
    """``ray start`` of worker node ``index`` joining the cluster's head, recorded as one of its roots."""
    name = lc.node_name(cluster.cluster_name, index)
    ports = dict(zip(WORKER_PORT_NAMES, free_ports(len(WORKER_PORT_NAMES)), strict=True))
    argv = ray_start(
        f"--address={cluster.facts['gcs_address']}", f"--node-name={name}", f"--temp-dir={cluster.ray_dir}",
        "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", "--num-gpus=0",
        f"--object-store-memory={OBJECT_STORE_BYTES}", "--min-worker-port=0", "--max-worker-port=0",
        "--disable-usage-stats", *_port_flags(ports))
    log = cluster.path / f"rtui-worker-{index}.log"
    env = {**ray_env(cluster, loopback=False), NODE_ENV: name}
    ref = start_detached(argv, log_path=log, env=env, cwd=cluster.path)
    lc.record_root(cluster, name, ref)
    return ref, log


def want_worker_node(path: Path, index: int, cpus: int | None) -> None:
    """Note in the marker that worker node ``index`` is wanted with ``cpus`` (None: no longer)."""
    cluster = lc.read_marker(path)
    if cluster is None:
        return
    wanted = dict(cluster.facts.get(WORKER_NODES) or {})
    if cpus is None:
        wanted.pop(str(index), None)
    else:
        wanted[str(index)] = cpus
    cluster.facts[WORKER_NODES] = wanted
    lc.write_marker(cluster)


class LocalRay(Layer):
    name = "local-ray"
    title = "Ray on this machine"
    _handlers: ClassVar[dict[str, Handler]] = {h.kind: h for h in (HeadHandler(), WorkerHandler())}

    @property
    def handlers(self) -> Mapping[str, Handler]:
        return self._handlers

    def desired(self, ctx: Context, below: Sequence[Resource]) -> list[Resource]:
        config = local_config(ctx)
        spec = HeadSpec(cpus=head_cpus(ctx), object_store_mib=OBJECT_STORE_BYTES // 2**20,
                        loopback=not config.local_worker_nodes, idle_stop_s=int(config.idle_timeout_s() or 0),
                        **({"dashboard_port": config.local_dashboard_port} if config.local_dashboard_port else {}))
        out = [Resource(address=HEAD, layer=self.name, kind="ray-head", spec=spec.as_spec(), cost_per_hour=0.0)]
        for i in range(config.local_worker_nodes):
            out.append(Resource(address=worker_address(i), layer=self.name, kind="ray-worker",
                                spec=WorkerSpec(cpus=head_cpus(ctx)).as_spec(), depends_on=(HEAD,), cost_per_hour=0.0))
        return out

    async def node_losses(self, ctx: Context, *, since: float, now: float) -> list[NodeLoss]:
        """Worker nodes whose processes ended and that the cluster's watcher started anew."""
        clusters = await asyncio.to_thread(lc.find_clusters, run_id=ctx.record.run_id)
        return sorted((NodeLoss(float(x["at"]), str(x["node"]), str(x["cause"]))
                       for cluster in clusters for x in cluster.facts.get(NODE_LOSSES) or []
                       if since <= float(x["at"]) <= now), key=lambda loss: loss.at)

    async def discover(self, ctx: Context) -> list[Observed]:
        clusters = await asyncio.to_thread(lc.find_clusters, run_id=ctx.record.run_id)
        observed: list[Observed] = []
        for n, cluster in enumerate(clusters):
            procs = await asyncio.to_thread(lc.node_procs, cluster)
            healthy = procs.head is not None and await _answers(cluster)
            address = HEAD if n == 0 else f"local.stale-cluster.{cluster.path.name}"
            ports = cluster.facts.get("ports", {})
            state = {**cluster.facts.get("shape", {}), "dashboard_port": ports.get("dashboard"),
                     "dir": str(cluster.path), IDLE_KEY: await asyncio.to_thread(lc.idle_watch_s, cluster)}
            stopped = "stopped while idle: a new head replaces it" if cluster.facts.get("stopped_while_idle") else ""
            observed.append(Observed(
                address=address, layer=self.name, kind="ray-head", id=str(cluster.path), state=state,
                healthy=healthy and n == 0, reason="running" if healthy else stopped or "its head is not running"))
            if n == 0:
                for index, _proc in sorted(procs.workers.items()):
                    observed.append(Observed(
                        address=worker_address(index), layer=self.name, kind="ray-worker", id=str(cluster.path),
                        state={"cpus": cluster.facts.get("shape", {}).get("cpus")}, depends_on=(HEAD,),
                        healthy=healthy, reason="running" if healthy else "its head is not running"))
        return observed

    async def preflight(self, ctx: Context) -> list[CheckResult]:
        config = local_config(ctx)
        results = []
        try:
            ray_ok = importlib.util.find_spec("ray") is not None and importlib.util.find_spec("torch") is not None
        except (ImportError, ValueError):
            ray_ok = False
        results.append(CheckResult(
            id="local.deps", title="Ray and PyTorch installed", status=CheckStatus.OK if ray_ok else CheckStatus.FAIL,
            detail="ray[default,train] 2.58.0 and torch 2.13.0" if ray_ok else "missing",
            remedy=None if ray_ok else "install with `make run` (or pip install -e '.[local]')",
        ))
        free_gib = shutil.disk_usage(tempfile.gettempdir()).free / 2**30
        results.append(CheckResult(
            id="local.disk", title="Free space for Ray's temp dir", data={"free_gib": round(free_gib, 1)},
            status=CheckStatus.OK if free_gib > 2 else CheckStatus.WARN, detail=f"{free_gib:.1f} GiB free",
        ))
        cores, workers = os.cpu_count() or 1, config.effective_workers()
        if workers > cores:
            results.append(CheckResult(
                id="local.cores", title="Cores for the training workers", status=CheckStatus.WARN,
                detail=f"{workers} workers on {cores} cores: they will take turns and train slowly",
                remedy=f"use --num-workers {cores} or fewer", data={"workers": workers, "cores": cores}))
        port = config.local_dashboard_port
        if port:
            try:
                check_port_free(port, what="dashboard port")
                results.append(CheckResult(id="local.port", title=f"Dashboard port {port}", status=CheckStatus.OK))
            except UserError as exc:
                if await self.jobs(ctx) is None:
                    results.append(CheckResult(id="local.port", title=f"Dashboard port {port}",
                                               status=CheckStatus.FAIL, detail=exc.message, remedy=exc.remedy))
        return results

    # --- ClusterAccess -------------------------------------------------------------------
    def access(self) -> LocalRay:
        return self

    async def jobs(self, ctx: Context) -> RayJobs | None:
        """The Jobs API of this run's cluster, when its head runs and its dashboard answers."""
        cluster = await asyncio.to_thread(_live_cluster, ctx)
        if cluster is None or not await _answers(cluster):
            return None
        return jobs_for(cluster)

    def job_finished(self, ctx: Context) -> None:
        cluster = _live_cluster(ctx)
        if cluster is not None:
            lc.tighten(cluster.path)

    def carry_job_secrets(self, ctx: Context, submission_id: str, values: Mapping[str, str]) -> dict[str, str]:
        """The values in a 0600 file of the cluster's 0700 dir (beside the auth token, removed with it at
        teardown); the job's entrypoint reads it (training.passed_env). Only the file's path is in
        ``runtime_env``, which Ray's Jobs API and runtime-env agent log show."""
        cluster = _cluster_for_job(ctx)
        folder = cluster.path / "job-env"
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / f"{submission_id}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(dict(values), f)
        return {JOB_ENV_FILE: str(path)}

    def job_env(self, ctx: Context) -> dict[str, str]:
        # Checkpoints and the model go to the run's data dir under the state dir (0700): `down` keeps
        # them (backend.delivery); only `down --delete-data` removes them.
        data = local_data_dir(ctx.store.root, ctx.record.run_id)
        data.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        data.mkdir(mode=0o700, exist_ok=True)
        return {"RTUI_STORAGE_PATH": str(data), **_closed_rendezvous(ctx)}


def _cluster_for_job(ctx: Context) -> lc.ClusterDir:
    """The run's live local cluster, which a job is about to be given to: an OperationError when it is not up."""
    cluster = _live_cluster(ctx)
    if cluster is None:
        raise OperationError("no Ray cluster of this run is up to take the job",
                             remedy="apply the whole plan (`rtui up --yes`)")
    return cluster


def _closed_rendezvous(ctx: Context) -> dict[str, str]:
    """Every worker of a local job is on this machine: they form torch's process group through a file
    in the cluster's 0700 dir (training.rendezvous), where Ray Train's TCPStore would listen on every
    interface without a token (issue 33). gloo's own connections stay on loopback too: unpinned, it
    binds whatever address the host's name resolves to, often the host's network address."""
    cluster = _cluster_for_job(ctx)
    rendezvous = cluster.path / "rendezvous"
    rendezvous.mkdir(mode=0o700, exist_ok=True)
    return {RENDEZVOUS_DIR_ENV: str(rendezvous), "GLOO_SOCKET_IFNAME": _loopback_interface()}


def _loopback_interface() -> str:
    """The interface holding 127.0.0.1 (``lo`` on Linux, ``lo0`` on macOS)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addresses):
            return str(name)  # psutil leaves the mapping unannotated
    raise OperationError("this machine has no interface with 127.0.0.1 for the local job's workers")


def _start_idle_watcher(cluster: lc.ClusterDir, idle_s: int) -> None:
    """targets.local.idle beside the head: it stops the cluster after ``idle_s`` without a job or an
    rtui attached (issue 26; 0: never), and starts anew a worker node whose processes ended (issue 41).
    Detached like the Ray processes, and recorded as a root of the cluster's."""
    root = str(Path(__file__).resolve().parents[2])  # where `backend` is, for the new interpreter
    path = os.environ.get("PYTHONPATH")
    # Ray's minimal environment (never the user's credentials: tests/test_local_security.py), plus
    # where to import rtui from.
    env = {**ray_env(cluster), "PYTHONPATH": os.pathsep.join([root, *([path] if path else [])])}
    ref = start_detached([sys.executable, "-m", "targets.local.idle", str(cluster.path), str(idle_s)],
                         log_path=cluster.path / "rtui-idle.log", env=env, cwd=cluster.path)
    lc.record_root(cluster, lc.IDLE_WATCHER, ref)


def _live_cluster(ctx: Context) -> lc.ClusterDir | None:
    for cluster in lc.find_clusters(run_id=ctx.record.run_id):
        if lc.node_procs(cluster).head is not None:
            return cluster
    return None


async def _answers(cluster: lc.ClusterDir) -> bool:
    jobs = jobs_for(cluster)
    return jobs is not None and await jobs.answers()


async def _terminate(find: Callable[[], Sequence[psutil.Process]]) -> int:
    """Stop what ``find`` sees until it sees nothing (``stop_group``); how many were stopped."""
    count, survivors = await asyncio.to_thread(stop_group, find, grace_s=lc.STOP_GRACE_S)
    if survivors:
        raise OperationError(f"{len(survivors)} Ray processes would not stop (pids "
                             f"{', '.join(str(p.pid) for p in survivors[:5])})")
    return count


async def _stop_and_remove(path: Path) -> int:
    """Stop every process rtui started for the cluster (``lc.cluster_family``), then remove the marked dir."""
    cluster = lc.read_marker(path)
    if cluster is None:
        return 0
    count = await _terminate(lambda: lc.cluster_family(cluster))
    await asyncio.to_thread(lc.remove_cluster_dir, path)
    return count


def _bind_failed(text: str) -> bool:
    return "address already in use" in text.lower() or "failed to bind" in text.lower()


def _a_ray_log_says_bind_failed(cluster: lc.ClusterDir) -> bool:
    """Whether one of the head's processes (the GCS, the raylet, an agent: each writes its own log, and
    `ray start` says only that it exited) could not bind its port: another process took it first, and a
    start with other ports will do."""
    logs = cluster.ray_dir / "session_latest" / "logs"
    try:
        files = [p for p in logs.iterdir() if p.suffix in (".err", ".out", ".log") and p.is_file()]
    except OSError:
        return False
    return any(_bind_failed(_tail(p, 4096)) for p in files)


def _tail(path: Path, limit: int = 8192) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - limit))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _last_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if any(word in line.lower() for word in ("error", "exception", "failed")):
            return line[:200]
    return lines[-1][:200] if lines else "no output"
