"""A Ray head's Jobs API as the service proxy reaches it, for tests: real HTTP on loopback.

It answers the REST routes Ray 2.58's dashboard serves for jobs (submit, get, list, stop, logs,
the websocket tail, package upload) and "runs" each job by emitting scripted log lines, so the
ray-job layer, the follower and telemetry run unchanged against it.

Token auth as Ray 2.58 does it (``auth_token`` set: the head was started with ``RAY_AUTH_MODE=token``
and that ``RAY_AUTH_TOKEN``; the test's control plane sets it from the head pod's env, as KubeRay's
pod does). Ray's ``token_auth_middleware`` (ray/_private/authentication/http_token_authentication.py,
wired in dashboard/http_server_head.py ``run``) lets only the public paths through (``/``,
``/favicon.ico``, ``/api/authentication_mode``, ``/api/authenticate``, the health checks,
``/static/``); it reads ``Authorization``, then ``X-Ray-Authorization`` (the header meant for proxies
and KubeRay), then the ``ray-authentication-token`` cookie; none: 401 ``Unauthorized: Missing
authentication token``; one that is not ``Bearer <token>``: 403 ``Forbidden: Invalid authentication
token`` (both ``text/plain``). ``/api/version`` is not public.

Packages as Ray's ``job_head`` serves them (dashboard/modules/job/job_head.py
``get_package``/``upload_package``): ``GET /api/packages/{protocol}/{name}`` answers 200 when the URI
exists in the GCS store and 404 otherwise; a client (Ray's SDK: ``_upload_package_if_needed`` in
dashboard/modules/dashboard_sdk.py) uploads only after a 404, so a package planted under a URI the
client computes is what the job gets. ``PUT`` of an existing URI overwrites it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, overload

import aiohttp
import aiohttp.web
from aiohttp.typedefs import Handler

from backend.resolve import resolve_config
from backend.session import RunSession
from backend.store import JobRecord, RunStore
from training.protocol import METRIC_TAG, RESUME_TAG, format_record

NCCL_EFA_LINES = [
    "(RayTrainWorker pid=210, ip=10.0.1.5) gpu-0:210:240 [0] NCCL INFO NET/OFI Selected provider is efa",
    "(RayTrainWorker pid=210, ip=10.0.1.5) gpu-0:210:240 [0] NCCL INFO Using network AWS Libfabric",
    "(RayTrainWorker pid=210, ip=10.0.1.5) gpu-0:210:240 [0] NCCL INFO comm 0x1 rank 0 nRanks 8 nNodes 2",
    "(RayTrainWorker pid=210, ip=10.0.1.5) gpu-0:210:240 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] "
    "via NET/AWS Libfabric/0",
]


# Ray 2.58 dashboard/modules/job/job_manager.py ``tail_job_logs``: at every end of the log file the
# agent sleeps LOG_TAIL_SLEEP_S (1 s), asking the job's status between reads, and returns only after a
# read past a terminal status found nothing more, so an ended job's tail stays open at least that long
# (3.4 s after the job's end time on a local 2-core head, measured).
TAIL_CLOSES_AFTER_S = 1.0

# Ray 2.58 dashboard/http_server_head.py ``run``: what the token middleware lets through without a token.
RAY_PUBLIC_PATHS = frozenset({"/", "/favicon.ico", "/api/authentication_mode", "/api/authenticate", "/api/healthz",
                              "/api/gcs_healthz", "/api/local_raylet_healthz", "/-/healthz"})


def metric_line(step: int) -> str:
    return "RTUI_METRIC " + json.dumps({"step": step, "loss": 5.0 / step, "tokens_per_s": 1000.0 + step,
                                        "world_size": 8})


@dataclass
class FakeJob:
    submission_id: str
    entrypoint: str
    metadata: dict[str, str]
    runtime_env: dict[str, Any]
    status: str = "PENDING"
    message: str = ""
    log: str = ""
    start_time: int = field(default_factory=lambda: int(time.time() * 1000))
    end_time: int | None = None

    def details(self) -> dict[str, Any]:
        return {"type": "SUBMISSION", "job_id": None, "submission_id": self.submission_id,
                "status": self.status, "entrypoint": self.entrypoint, "message": self.message,
                "error_type": None, "start_time": self.start_time, "end_time": self.end_time,
                "metadata": self.metadata, "runtime_env": self.runtime_env, "driver_info": None}


class FakeRayHead:
    """The Jobs API of one head; ``script`` is the log a job prints, one line per ``line_every_s``."""

    # Heads by URL: the test's control plane finds the one a head service leads to, to start it
    # with the token its pod's environment names (as ``ray start`` reads RAY_AUTH_TOKEN).
    running: dict[str, FakeRayHead] = {}

    def __init__(self, *, steps: int = 5, line_every_s: float = 0.01, fail: bool = False,
                 tail_closes_after_s: float = TAIL_CLOSES_AFTER_S) -> None:
        self.auth_token: str | None = None  # None: RAY_AUTH_MODE is not "token" (Ray's default)
        self.refused: list[tuple[str, int]] = []  # (path, status) of every request the middleware refused
        self.jobs: dict[str, FakeJob] = {}
        self.packages: dict[str, bytes] = {}
        self.headers_seen: list[dict[str, str]] = []
        self.paths_seen: list[str] = []  # of every request, in order
        self.script: Sequence[str] = [*NCCL_EFA_LINES, *(metric_line(s) for s in range(1, steps + 1))]
        self.line_every_s = line_every_s
        self.fail = fail
        self.tail_closes_after_s = tail_closes_after_s
        # Ray Train's driver runs at once but trains only once its placement group is placed: a test
        # that scales the workers sets this to "are the GPU workers up" (None: they always are).
        self.workers_ready: Callable[[], bool] | None = None
        self.url = ""
        self._changed: asyncio.Condition
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),),
                                        name="fake-ray-head", daemon=True)

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Self:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake Ray head did not start")
        return self

    def stop(self) -> None:
        FakeRayHead.running.pop(self.url, None)
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self._changed = asyncio.Condition()
        app = aiohttp.web.Application(middlewares=[self._token_auth])
        app.add_routes([
            aiohttp.web.get("/api/version", self._version),
            aiohttp.web.post("/api/jobs/", self._submit),
            aiohttp.web.get("/api/jobs/", self._list),
            aiohttp.web.get("/api/jobs/{sid}", self._get),
            aiohttp.web.post("/api/jobs/{sid}/stop", self._stop_job),
            aiohttp.web.get("/api/jobs/{sid}/logs", self._logs),
            aiohttp.web.get("/api/jobs/{sid}/logs/tail", self._tail),
            aiohttp.web.get("/api/packages/{protocol}/{name}", self._package_exists),
            aiohttp.web.put("/api/packages/{protocol}/{name}", self._package_upload),
        ])
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        FakeRayHead.running[self.url] = self
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    # ---- Ray's token auth middleware --------------------------------------------------------------
    @aiohttp.web.middleware
    async def _token_auth(self, request: aiohttp.web.Request, handler: Handler) -> aiohttp.web.StreamResponse:
        token = self.auth_token
        if token is None or request.path in RAY_PUBLIC_PATHS or request.path.startswith("/static/"):
            return await handler(request)
        header = request.headers.get("Authorization", "") or request.headers.get("X-Ray-Authorization", "")
        if not header and (cookie := request.cookies.get("ray-authentication-token")):
            header = "Bearer " + cookie
        if not header:
            self.refused.append((request.path, 401))
            return aiohttp.web.Response(status=401, text="Unauthorized: Missing authentication token")
        if header != f"Bearer {token}":
            self.refused.append((request.path, 403))
            return aiohttp.web.Response(status=403, text="Forbidden: Invalid authentication token")
        return await handler(request)

    # ---- routes -----------------------------------------------------------------------------------
    def _seen(self, request: aiohttp.web.Request) -> None:
        self.headers_seen.append(dict(request.headers))
        self.paths_seen.append(request.path)

    async def _version(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self._seen(request)
        return aiohttp.web.json_response({"version": "4", "ray_version": "2.58.0", "ray_commit": "fake",
                                          "session_name": "session_fake"})

    async def _submit(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self._seen(request)
        body = await request.json()
        sid = body.get("submission_id") or f"raysubmit_{len(self.jobs) + 1}"
        if sid in self.jobs:
            return aiohttp.web.Response(status=400, text=f"Job with submission_id {sid} already exists. "
                                                         "Please use a different submission_id.")
        job = FakeJob(sid, body["entrypoint"], body.get("metadata") or {}, body.get("runtime_env") or {})
        self.jobs[sid] = job
        asyncio.create_task(self._run(job))
        return aiohttp.web.json_response({"job_id": sid, "submission_id": sid})

    async def _run(self, job: FakeJob) -> None:
        await asyncio.sleep(0.05)  # models time: the job's driver starting before it is RUNNING
        await self._set(job, status="RUNNING")
        while self.workers_ready is not None and job.status == "RUNNING" and not self.workers_ready():
            await asyncio.sleep(0.05)  # models time: the driver waiting for its workers, as Ray Train does
        for line in self.script:
            if job.status != "RUNNING":
                return
            await self._set(job, log=job.log + line + "\n")
            await asyncio.sleep(self.line_every_s)  # models time: the job's pace of printing
        end = int(time.time() * 1000)
        if self.fail:
            await self._set(job, status="FAILED", message="Job entrypoint command failed with exit code 1",
                            end_time=end)
        else:
            await self._set(job, status="SUCCEEDED", message="Job finished successfully.", end_time=end)

    async def _set(self, job: FakeJob, **changes: Any) -> None:
        async with self._changed:
            for key, value in changes.items():
                setattr(job, key, value)
            self._changed.notify_all()

    async def _tail_closing(self) -> None:
        """Models time: Ray's agent closing an ended job's tail (cut short when the head stops)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), self.tail_closes_after_s)

    def _job(self, request: aiohttp.web.Request) -> FakeJob:
        job = self.jobs.get(request.match_info["sid"])
        if job is None:
            raise aiohttp.web.HTTPNotFound(text=f"Job {request.match_info['sid']} does not exist.")
        return job

    async def _list(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self._seen(request)
        return aiohttp.web.json_response([j.details() for j in self.jobs.values()])

    async def _get(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self._seen(request)
        return aiohttp.web.json_response(self._job(request).details())

    async def _stop_job(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self._seen(request)
        job = self._job(request)
        stopped = job.status in ("PENDING", "RUNNING")
        if stopped:
            await self._set(job, status="STOPPED", message="Job was intentionally stopped.",
                            end_time=int(time.time() * 1000))
        return aiohttp.web.json_response({"stopped": stopped})

    async def _logs(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self._seen(request)
        return aiohttp.web.json_response({"logs": self._job(request).log})

    async def _tail(self, request: aiohttp.web.Request) -> aiohttp.web.WebSocketResponse:
        self._seen(request)
        job = self._job(request)
        ws = aiohttp.web.WebSocketResponse()
        await ws.prepare(request)
        sent = 0

        def news() -> bool:
            return len(job.log) > sent or job.status not in ("PENDING", "RUNNING")

        while True:
            async with self._changed:
                await self._changed.wait_for(news)
            if len(job.log) > sent:
                await ws.send_str(job.log[sent:])
                sent = len(job.log)
            if job.status not in ("PENDING", "RUNNING"):
                break
        await self._tail_closing()
        await ws.close()
        return ws

    async def _package_exists(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self._seen(request)
        if request.match_info["name"] in self.packages:
            return aiohttp.web.Response(status=200)
        uri = f"{request.match_info['protocol']}://{request.match_info['name']}"
        return aiohttp.web.Response(status=404, text=f"Package {uri} does not exist")

    async def _package_upload(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self._seen(request)
        self.packages[request.match_info["name"]] = await request.read()
        return aiohttp.web.Response(status=200)


class RestartingRayHead(FakeRayHead):
    """A head whose job loses a node mid-run: it prints steps 1..``stop_at``, then stops until the test
    says the node was replaced (``go_on``), then prints what Ray Train's restart of the worker group
    prints (training/loop.py: rank 0's resume line and ``RTUI_RESUME`` record, naming its node) and
    steps ``checkpoint + 1``..``steps`` from that checkpoint. Each metric carries the time it was printed
    and its step time, as the training program's do."""

    def __init__(self, *, steps: int, stop_at: int, checkpoint: int, step_s: float = 0.01) -> None:
        super().__init__(steps=0, line_every_s=step_s)
        self.steps, self.stop_at, self.checkpoint = steps, stop_at, checkpoint
        self.stopped = threading.Event()  # the job printed ``stop_at`` and waits for its node
        self._node: str | None = None
        self._go_on: asyncio.Event

    def go_on(self, node: str) -> None:
        def release() -> None:
            self._node = node
            self._go_on.set()
        self._loop.call_soon_threadsafe(release)

    def _metric(self, step: int) -> str:
        return format_record(METRIC_TAG, {"step": step, "loss": 5.0 / step, "tokens_per_s": 1000.0,
                                          "step_time_s": self.line_every_s, "world_size": 8, "ts": time.time()})

    async def _print(self, job: FakeJob, line: str) -> None:
        await self._set(job, log=job.log + line + "\n")
        await asyncio.sleep(self.line_every_s)  # models time: a step

    async def _run(self, job: FakeJob) -> None:
        self._go_on = asyncio.Event()
        await self._set(job, status="RUNNING")
        for line in NCCL_EFA_LINES:
            await self._print(job, line)
        for step in range(1, self.stop_at + 1):
            await self._print(job, self._metric(step))
        self.stopped.set()
        await self._go_on.wait()
        where = f"s3://rtui-bucket/{job.submission_id}/checkpoint_{self.checkpoint:06d}"
        await self._print(job, f"rtui-train: resumed from {where} at step {self.checkpoint} on {self._node}")
        await self._print(job, format_record(RESUME_TAG, {"step": self.checkpoint, "from": where,
                                                          "node": self._node, "ts": time.time()}))
        for step in range(self.checkpoint + 1, self.steps + 1):
            await self._print(job, self._metric(step))
        await self._set(job, status="SUCCEEDED", message="Job finished successfully.",
                        end_time=int(time.time() * 1000))


# Ray's tail (dashboard/modules/job/utils.py file_tail_iterator) sends at most 10 lines, or a
# little over 20000 characters, per websocket message.
RAY_TAIL_LINES = 10
RAY_TAIL_CHARS = 20_000


class BigLogRayHead(FakeRayHead):
    """A head whose jobs print a long ``script`` fast: ``write_lines`` lines per write, every
    ``line_every_s``. ``script`` may be any sequence, e.g. one that makes line i when asked,
    and the log is never held whole here (only ``GET /logs`` builds it, as Ray's does), so a
    test's memory measure in the same process sees the client. The tail is sent as Ray's is."""

    def __init__(self, script: Sequence[str], *, write_lines: int = 10_000, line_every_s: float = 0.0,
                 **kwargs: Any) -> None:
        super().__init__(line_every_s=line_every_s, **kwargs)
        self.script = script  # any sequence of lines will do
        self.write_lines = write_lines
        self.printed: dict[str, int] = {}  # lines of the script each job has printed so far

    async def _run(self, job: FakeJob) -> None:
        await asyncio.sleep(0.05)  # models time: the job's driver starting before it is RUNNING
        await self._set(job, status="RUNNING")
        for start in range(0, len(self.script), self.write_lines):
            if job.status != "RUNNING":
                return
            async with self._changed:
                self.printed[job.submission_id] = min(start + self.write_lines, len(self.script))
                self._changed.notify_all()
            await asyncio.sleep(self.line_every_s)  # models time: the job's pace of printing
        outcome = ("FAILED", "Job entrypoint command failed with exit code 1") if self.fail else (
            "SUCCEEDED", "Job finished successfully.")
        await self._set(job, status=outcome[0], message=outcome[1], end_time=int(time.time() * 1000))

    def log_text(self, sid: str) -> str:
        return "".join(line + "\n" for line in itertools.islice(self.script, self.printed.get(sid, 0)))

    async def _logs(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self._seen(request)
        return aiohttp.web.json_response({"logs": self.log_text(self._job(request).submission_id)})

    async def _tail(self, request: aiohttp.web.Request) -> aiohttp.web.WebSocketResponse:
        self._seen(request)
        job = self._job(request)
        sid = job.submission_id
        ws = aiohttp.web.WebSocketResponse()
        await ws.prepare(request)
        sent = 0
        while True:
            async with self._changed:
                def more(seen: int = sent) -> bool:
                    return self.printed.get(sid, 0) > seen or job.status not in ("PENDING", "RUNNING")

                await self._changed.wait_for(more)
            # The status first: a job seen ended has printed everything it will.
            ended = job.status not in ("PENDING", "RUNNING")
            printed = self.printed.get(sid, 0)
            while sent < printed:
                lines: list[str] = []
                chars = 0
                while sent < printed and len(lines) < RAY_TAIL_LINES and chars <= RAY_TAIL_CHARS:
                    lines.append(self.script[sent] + "\n")
                    chars += len(lines[-1])
                    sent += 1
                await ws.send_str("".join(lines))
            if ended:
                break
        await self._tail_closing()
        await ws.close()
        return ws


class TrainingLog(Sequence[str]):
    """``count`` lines of a training job's log, line i made when asked (never held whole):
    worker lines of 60-80 characters, NCCL lines now and then, and a metric record
    (training/protocol.py's format) every ``metric_every`` lines."""

    def __init__(self, count: int, *, metric_every: int = 100, nccl_every: int = 5000) -> None:
        self.total, self.metric_every, self.nccl_every = count, metric_every, nccl_every

    def __len__(self) -> int:
        return self.total

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.total))]
        if not 0 <= i < self.total:
            raise IndexError(i)
        if i < len(NCCL_EFA_LINES):
            return NCCL_EFA_LINES[i]
        if i % self.nccl_every == 0:
            return NCCL_EFA_LINES[-1]
        if i % self.metric_every == 0:
            step = i // self.metric_every
            record = {"loss": round(5.0 / step, 6), "step": step, "step_time_s": 0.25, "tokens_per_s": 1000.0 + step,
                      "ts": 1_700_000_000.0 + step, "world_size": 8}
            return "(RayTrainWorker pid=210, ip=10.0.1.5) RTUI_METRIC " + json.dumps(
                record, separators=(",", ":"), sort_keys=True)
        return f"(RayTrainWorker pid=210, ip=10.0.1.5) step {i // self.metric_every} batch {i:08d}" + "." * (i % 21)


def session_following(tmp_path: Path, sid: str) -> RunSession:
    """A run of the default config whose current job is ``sid``, its state under ``tmp_path``: what a
    follower of a job on this head needs."""
    config = resolve_config({}, environ={}).config
    store = RunStore(tmp_path / "state")
    record = store.create(config)
    record.jobs.append(JobRecord(submission_id=sid, submitted_at=0.0, spec_hash="h"))
    return RunSession(store, record, config)
