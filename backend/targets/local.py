"""The local target: a real Ray cluster of our own child processes on this machine.

The head (and optional extra worker nodes) run as ``ray start --block`` in their own
session, bound to 127.0.0.1 on free ports with a private temp dir, so they outlive the
TUI (detach/resume), never collide with another run, and teardown can find exactly
our processes. The job goes through the Ray Jobs API, as on a cluster.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from backend.errors import OperationError, TransientError, UserError
from backend.jobspec import JobSpec, build_job_spec
from backend.model import Action, Change, CheckResult, CheckStatus, Plan
from backend.procs import ProcRef, check_port_free, family, free_ports, start_detached, terminate
from backend.rayjobs import RayJobs, submit_when_ready
from backend.runner import Progress, Step
from backend.store import JobRecord
from backend.targets.base import Target
from backend.targets.follow import follow_job_step

OBJECT_STORE_BYTES = 512 * 1024 * 1024
PORT_NAMES = ("gcs", "dashboard", "client", "agent_listen", "agent_grpc", "runtime_env", "metrics",
              "node_manager", "object_manager")
WORKER_PORT_NAMES = ("agent_listen", "agent_grpc", "runtime_env", "metrics", "node_manager", "object_manager")
DASHBOARD_TIMEOUT_S = 90.0


def _port_flags(ports: dict[str, int]) -> list[str]:
    flags = {
        "agent_listen": "--dashboard-agent-listen-port", "agent_grpc": "--dashboard-agent-grpc-port",
        "runtime_env": "--runtime-env-agent-port", "metrics": "--metrics-export-port",
        "node_manager": "--node-manager-port", "object_manager": "--object-manager-port",
    }
    return [f"{flag}={ports[name]}" for name, flag in flags.items() if name in ports]


class LocalTarget(Target):
    name = "local"

    # --- shape -------------------------------------------------------------------------
    def head_cpus(self) -> int:
        # Ray Data's tokenising tasks need a CPU beyond the training workers' one each.
        needed = self.config.effective_workers() + (1 if self.config.data_is_file() else 0)
        return self.config.local_cpus or max(os.cpu_count() or 1, needed)

    def shape(self) -> dict[str, Any]:
        return {"cpus": self.head_cpus(), "worker_nodes": self.config.local_worker_nodes,
                "object_store_mib": OBJECT_STORE_BYTES // 2**20}

    @property
    def res(self) -> dict[str, Any]:
        return self.record.resources

    def head_ref(self) -> ProcRef | None:
        head = self.res.get("head")
        return ProcRef.from_dict(head) if head else None

    def worker_refs(self) -> list[ProcRef]:
        return [ProcRef.from_dict(w) for w in self.res.get("workers", [])]

    def jobs(self) -> RayJobs | None:
        url = self.res.get("dashboard_url")
        return RayJobs(url) if url else None

    async def cluster_alive(self) -> bool:
        head = self.head_ref()
        jobs = self.jobs()
        if head is None or jobs is None or not head.alive():
            return False
        try:
            await jobs.version(timeout_s=2.0)
        except TransientError:
            return False
        return True

    # --- preflight & plan --------------------------------------------------------------
    async def preflight(self) -> list[CheckResult]:
        results = []
        try:
            import importlib.util

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
        port = self.config.local_dashboard_port
        if port:
            try:
                check_port_free(port, what="dashboard port")
                results.append(CheckResult(id="local.port", title=f"Dashboard port {port}", status=CheckStatus.OK))
            except UserError as exc:
                if not await self.cluster_alive():
                    results.append(CheckResult(id="local.port", title=f"Dashboard port {port}",
                                               status=CheckStatus.FAIL, detail=exc.message, remedy=exc.remedy))
        return results

    async def plan(self) -> Plan:
        alive = await self.cluster_alive()
        want = self.shape()
        have = self.res.get("shape")
        if not alive:
            head_action = Action.CREATE
            reason = "no cluster of this run is running" if not have else "the cluster of this run is gone"
        elif have != want:
            head_action, reason = Action.REPLACE, "the cluster shape changed"
        else:
            head_action, reason = Action.NOOP, "running"
        changes = [Change(action=head_action, kind="ray-head", name=self.config.cluster_name,
                          before=have if alive else None, after=want, cost_per_hour=0.0, reason=reason)]
        live_workers = [w for w in self.worker_refs() if w.alive()]
        for i in range(self.config.local_worker_nodes):
            up = head_action is Action.NOOP and i < len(live_workers)
            changes.append(Change(action=Action.NOOP if up else Action.CREATE, kind="ray-worker-node",
                                  name=f"{self.config.cluster_name}-worker-{i}", after={"cpus": self.head_cpus()},
                                  cost_per_hour=0.0, reason="running" if up else "not running"))
        changes.append(await self._job_change(head_action))
        return Plan(target=self.name, changes=changes)

    async def _job_change(self, head_action: Action) -> Change:
        spec = build_job_spec(self.config)
        job = self.record.current_job
        after = spec.summary()
        if job is None or head_action is not Action.NOOP:
            return Change(action=Action.CREATE, kind="ray-job", name="train", after=after, cost_per_hour=0.0,
                          reason="no job submitted on this cluster yet")
        if job.spec_hash == spec.spec_hash and job.status in ("PENDING", "RUNNING", "SUCCEEDED"):
            return Change(action=Action.NOOP, kind="ray-job", name=job.submission_id, after=after,
                          reason=f"same job already {job.status.lower()}")
        if job.status in ("PENDING", "RUNNING"):
            return Change(action=Action.REPLACE, kind="ray-job", name=job.submission_id, after=after,
                          reason="the job changed: the running one will be stopped")
        return Change(action=Action.CREATE, kind="ray-job", name="train", after=after,
                      reason="the job changed" if job.spec_hash != spec.spec_hash else f"last job {job.status.lower()}")

    # --- apply -------------------------------------------------------------------------
    def apply_steps(self, plan: Plan) -> list[Step]:
        by_kind = {c.kind: c for c in plan.changes}
        head = by_kind["ray-head"]
        job = by_kind["ray-job"]
        steps = [
            Step("head", "Start the Ray head", self._start_head if head.action is not Action.NOOP else _noop,
                 expected_s=15, retries=2, backoff_s=0.5),
        ]
        worker_changes = [c for c in plan.changes if c.kind == "ray-worker-node"]
        for i, change in enumerate(worker_changes):
            action = self._worker_starter(i) if change.action is not Action.NOOP else _noop
            steps.append(Step(f"worker-{i}", f"Start Ray worker node {i}", action, deps=("head",),
                              expected_s=8, retries=1, backoff_s=0.5))
        workers = tuple(s.id for s in steps[1:])
        spec = build_job_spec(self.config)
        steps.append(Step("job", "Submit the training job",
                          self._submitter(spec, replace=job.action is Action.REPLACE)
                          if job.action is not Action.NOOP else _noop,
                          deps=("head", *workers), expected_s=3, retries=2, backoff_s=1.0))
        steps.append(Step("train", "Train", follow_job_step(self), deps=("job",), expected_s=60))
        return steps

    async def _start_head(self) -> AsyncIterator[Progress]:
        # A replaced or half-started head: stop it and drop its temp dir before starting afresh.
        await self._stop_everything()
        old_tmp = self.res.get("temp_dir")
        if old_tmp:
            await asyncio.to_thread(shutil.rmtree, old_tmp, True)
        tmp = Path(tempfile.mkdtemp(prefix="rtui-", dir="/tmp"))
        ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
        if self.config.local_dashboard_port:
            check_port_free(self.config.local_dashboard_port, what="dashboard port")
            ports["dashboard"] = self.config.local_dashboard_port
        argv = [
            sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
            "--node-ip-address=127.0.0.1", f"--port={ports['gcs']}", f"--num-cpus={self.head_cpus()}",
            "--num-gpus=0", f"--temp-dir={tmp}", f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={ports['dashboard']}",
            f"--ray-client-server-port={ports['client']}", "--min-worker-port=0", "--max-worker-port=0",
            "--disable-usage-stats", *_port_flags(ports),
        ]
        log = tmp / "rtui-head.log"
        yield Progress(f"starting ray head on 127.0.0.1:{ports['gcs']}", 0.05)
        ref = start_detached(argv, log_path=log, env=_ray_env(), cwd=tmp)
        self.res.update({
            "temp_dir": str(tmp), "ports": ports, "head": ref.to_dict(), "workers": [],
            "gcs_address": f"127.0.0.1:{ports['gcs']}", "dashboard_url": f"http://127.0.0.1:{ports['dashboard']}",
            "shape": self.shape(), "head_log": str(log),
        })
        self.save()
        async for update in self._wait_dashboard(ref, log):
            yield update

    async def _wait_dashboard(self, ref: ProcRef, log: Path) -> AsyncIterator[Progress]:
        jobs = self.jobs()
        assert jobs is not None
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            if not ref.alive():
                tail = _tail(log)
                retry = "address already in use" in tail.lower() or "failed to bind" in tail.lower()
                err = TransientError if retry else OperationError
                raise err(f"ray head exited while starting: {_last_error_line(tail)}",
                          remedy=f"see {log}")
            try:
                info = await jobs.version(timeout_s=1.0)
                yield Progress(f"dashboard up at {jobs.address} (Ray {info.get('ray_version', '?')})", 1.0)
                return
            except TransientError:
                pass
            if elapsed > DASHBOARD_TIMEOUT_S:
                raise OperationError(f"Ray dashboard did not answer within {DASHBOARD_TIMEOUT_S:.0f}s",
                                     remedy=f"see {log}")
            yield Progress(f"waiting for the dashboard ({elapsed:.0f}s)", min(0.9, 0.1 + elapsed / 30))
            await asyncio.sleep(0.5)

    def _worker_starter(self, index: int):  # type: ignore[no-untyped-def]
        async def start() -> AsyncIterator[Progress]:
            tmp = Path(self.res["temp_dir"])
            ports = dict(zip(WORKER_PORT_NAMES, free_ports(len(WORKER_PORT_NAMES)), strict=True))
            argv = [
                sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
                f"--address={self.res['gcs_address']}", "--node-ip-address=127.0.0.1",
                f"--num-cpus={self.head_cpus()}", "--num-gpus=0", f"--object-store-memory={OBJECT_STORE_BYTES}",
                "--min-worker-port=0", "--max-worker-port=0", "--disable-usage-stats", *_port_flags(ports),
            ]
            log = tmp / f"rtui-worker-{index}.log"
            yield Progress(f"starting worker node {index}", 0.1)
            ref = start_detached(argv, log_path=log, env=_ray_env(), cwd=tmp)
            workers = [w for w in self.res.get("workers", []) if ProcRef.from_dict(w).alive()]
            workers.append(ref.to_dict())
            self.res["workers"] = workers
            self.save()
            await asyncio.sleep(2.0)
            if not ref.alive():
                raise OperationError(f"ray worker node {index} exited: {_last_error_line(_tail(log))}",
                                     remedy=f"see {log}")
            yield Progress(f"worker node {index} joined", 1.0)

        return start

    def _submitter(self, spec: JobSpec, *, replace: bool):  # type: ignore[no-untyped-def]
        async def submit() -> AsyncIterator[Progress]:
            jobs = self.jobs()
            assert jobs is not None
            current = self.record.current_job
            if replace and current is not None:
                yield Progress(f"stopping {current.submission_id}")
                await jobs.stop(current.submission_id)
            submission_id = f"rtui-{self.record.run_id}-{len(self.record.jobs) + 1}"
            yield Progress(f"submitting {submission_id}", 0.3)
            # Results go inside the run's temp dir, so teardown leaves nothing behind.
            runtime_env = dict(spec.runtime_env)
            runtime_env["env_vars"] = {**spec.runtime_env["env_vars"],
                                       "RTUI_STORAGE_PATH": str(Path(self.res["temp_dir"]) / "results")}
            async for waiting in submit_when_ready(
                    jobs, entrypoint=spec.entrypoint, submission_id=submission_id,
                    runtime_env=runtime_env, metadata={"rtui_run": self.record.run_id}):
                yield Progress(waiting, 0.3)
            self.record.jobs.append(JobRecord(submission_id=submission_id, submitted_at=time.time(),
                                              spec_hash=spec.spec_hash))
            self.save()
            yield Progress(f"submitted {submission_id}", 1.0)

        return submit

    # --- teardown ----------------------------------------------------------------------
    def teardown_steps(self) -> list[Step]:
        return [
            Step("stop-job", "Stop the training job", self._stop_job, expected_s=3),
            Step("stop-cluster", "Stop the Ray processes of this run", self._stop_cluster, deps=("stop-job",),
                 expected_s=10),
            Step("remove-temp", "Remove the run's temp dir", self._remove_temp, deps=("stop-cluster",), expected_s=1),
        ]

    async def _stop_job(self) -> AsyncIterator[Progress]:
        job = self.record.current_job
        jobs = self.jobs()
        if job is None or jobs is None or not await self.cluster_alive():
            yield Progress("no live job")
            return
        status = await jobs.status(job.submission_id)
        if status.terminal:
            yield Progress(f"job already {status.status.lower()}")
            return
        yield Progress(f"stopping {job.submission_id}")
        await jobs.stop(job.submission_id)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (status := await jobs.status(job.submission_id)).terminal:
            await asyncio.sleep(0.5)
        job.status = status.status
        self.save()
        yield Progress(f"job {status.status.lower()}", 1.0)

    async def _stop_everything(self) -> int:
        roots = [r for r in [self.head_ref(), *self.worker_refs()] if r is not None]
        marker = self.res.get("temp_dir")
        procs = await asyncio.to_thread(family, roots, marker)
        if not procs:
            return 0
        survivors = await asyncio.to_thread(terminate, procs)
        if survivors:
            raise OperationError(f"{len(survivors)} Ray processes would not stop (pids "
                                 f"{', '.join(str(p.pid) for p in survivors[:5])})")
        return len(procs)

    async def _stop_cluster(self) -> AsyncIterator[Progress]:
        yield Progress("stopping Ray processes")
        count = await self._stop_everything()
        self.res.pop("head", None)
        self.res["workers"] = []
        self.save()
        yield Progress(f"stopped {count} processes", 1.0)

    async def _remove_temp(self) -> AsyncIterator[Progress]:
        tmp = self.res.get("temp_dir")
        if tmp and Path(tmp).exists():
            await asyncio.to_thread(shutil.rmtree, tmp, True)
            if Path(tmp).exists():
                raise OperationError(f"could not remove {tmp}")
        self.res.pop("temp_dir", None)
        self.save()
        yield Progress("temp dir removed", 1.0)


async def _noop() -> AsyncIterator[Progress]:
    yield Progress("already in place", 1.0)


def _ray_env() -> dict[str, str]:
    env = dict(os.environ)
    # A job's `python` is whatever is first on the PATH `ray start` saw: make it ours.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.pop("RAY_ADDRESS", None)
    return env


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
