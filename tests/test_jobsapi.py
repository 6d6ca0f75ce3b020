"""The Jobs API client against a fake Jobs API: a small aiohttp app on 127.0.0.1 that answers as
Ray 2.58's job_head.py does (bodies, statuses, tracebacks) and records what it was sent.
The real-Ray tests (test_local_e2e, test_follow, test_local_security) prove the same client end to end."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import ssl
import subprocess
import time
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from backend import jobsapi, rayjobs, raypackage
from backend.errors import OperationError, TransientError
from backend.jobsapi import JobsApi
from backend.rayjobs import RayJobs
from backend.store import JobState
from tests.clock import TestClock
from tests.eventually import eventually_async

KUBE_PREFIX = "/api/v1/namespaces/ns/services/x-head-svc:dashboard/proxy"
ALREADY = ("Traceback (most recent call last):\n  File \"job_head.py\", line 406, in submit_job\n"
           "RuntimeError: Request failed with status code 400: Traceback (most recent call last):\n"
           "ValueError: Job with submission_id {sid} already exists. Please use a different submission_id.\n.")


@dataclass
class FakeJob:
    details: dict[str, Any]
    log: str = ""
    tail_misses: int = 0  # the tail never sends the log's last so many characters (a lost tail)


@dataclass
class FakeRay:
    """The fake Jobs API. ``token`` set: every request must carry ``Bearer <token>``."""

    prefix: str = ""
    token: str | None = None
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, Authorization
    packages: dict[str, bytes] = field(default_factory=dict)
    puts: list[str] = field(default_factory=list)
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    submit_answers: list[tuple[int, str]] = field(default_factory=list)  # scripted answers, first first
    tail_drops_after: list[int] = field(default_factory=list)  # per connection: chunks before an abrupt drop
    tail_chunk_chars: int = 4096
    peers: set[Any] = field(default_factory=set)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    def add_job(self, sid: str, log: str = "", status: str = "RUNNING") -> FakeJob:
        job = FakeJob({"type": "SUBMISSION", "submission_id": sid, "status": status, "message": "",
                       "start_time": 1_700_000_000_000, "end_time": None, "metadata": {"rtui": "1"},
                       "entrypoint": "python x.py", "job_id": None}, log)
        self.jobs[sid] = job
        return job

    @web.middleware
    async def record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        self.requests.append((request.method, request.path, auth))
        self.peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        if self.token is not None and auth != f"Bearer {self.token}":
            return web.Response(status=401, text="Unauthorized: missing or invalid token")
        return await handler(request)

    def app(self) -> web.Application:
        api = web.Application()
        r = api.router
        r.add_get("/api/version", self.version)
        r.add_get("/api/packages/{protocol}/{name}", self.get_package)
        r.add_put("/api/packages/{protocol}/{name}", self.put_package)
        r.add_post("/api/jobs/", self.submit)
        r.add_get("/api/jobs/", self.list_jobs)
        r.add_get("/api/jobs/{sid}", self.job_info)
        r.add_post("/api/jobs/{sid}/stop", self.stop)
        r.add_get("/api/jobs/{sid}/logs", self.logs)
        r.add_get("/api/jobs/{sid}/logs/tail", self.tail)
        if not self.prefix:
            api.middlewares.append(self.record)
            return api
        root = web.Application(middlewares=[self.record])
        root.add_subapp(self.prefix, api)
        return root

    def _job(self, request: web.Request) -> FakeJob:
        job = self.jobs.get(request.match_info["sid"])
        if job is None:
            raise web.HTTPNotFound(text=f"Job {request.match_info['sid']} does not exist")
        return job

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.1", "ray_version": "2.58.0", "ray_commit": "x", "session_name": "s"})

    async def list_jobs(self, request: web.Request) -> web.Response:
        driver = {"type": "DRIVER", "submission_id": None, "status": "RUNNING"}  # a bare `ray.init` job
        return web.json_response([j.details for j in self.jobs.values()] + [driver])

    async def get_package(self, request: web.Request) -> web.Response:
        uri = f"{request.match_info['protocol']}://{request.match_info['name']}"
        if uri not in self.packages:
            return web.Response(status=404, text=f"Package {uri} does not exist")
        return web.Response()

    async def put_package(self, request: web.Request) -> web.Response:
        uri = f"{request.match_info['protocol']}://{request.match_info['name']}"
        self.puts.append(uri)
        self.packages[uri] = await request.read()
        return web.Response()

    async def submit(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.submit_answers:
            status, text = self.submit_answers.pop(0)
            return web.Response(status=status, text=text.format(sid=body["submission_id"]))
        job = self.add_job(body["submission_id"], status="PENDING")
        job.details.update(runtime_env=body["runtime_env"], metadata=body["metadata"], entrypoint=body["entrypoint"])
        return web.json_response({"job_id": body["submission_id"], "submission_id": body["submission_id"]})

    async def job_info(self, request: web.Request) -> web.Response:
        return web.json_response(self._job(request).details)

    async def stop(self, request: web.Request) -> web.Response:
        job = self._job(request)
        was_running = job.details["status"] in ("PENDING", "RUNNING")
        job.details["status"] = "STOPPED"
        return web.json_response({"stopped": was_running})

    async def logs(self, request: web.Request) -> web.Response:
        return web.json_response({"logs": self._job(request).log})

    async def tail(self, request: web.Request) -> web.StreamResponse:
        """Like Ray's: the log from its beginning, then what is added, until the job ends."""
        job = self._job(request)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        drop_after = self.tail_drops_after.pop(0) if self.tail_drops_after else None
        sent, chunks = 0, 0
        while True:
            terminal = job.details["status"] in ("SUCCEEDED", "FAILED", "STOPPED")
            while sent < len(job.log) - job.tail_misses:
                if drop_after is not None and chunks >= drop_after:
                    assert request.transport is not None
                    request.transport.abort()  # no close frame: the client sees a dropped connection
                    return ws
                piece = job.log[sent:min(sent + self.tail_chunk_chars, len(job.log) - job.tail_misses)]
                await ws.send_str(piece)
                sent += len(piece)
                chunks += 1
            if terminal:
                return ws  # aiohttp closes it normally (1000), as Ray's handler does
            await asyncio.sleep(0.01)  # models time: the agent's tail polls the log file for new lines


@pytest.fixture
async def fake(request: pytest.FixtureRequest) -> AsyncIterator[FakeRay]:
    server = FakeRay(**getattr(request, "param", {}))
    async with serve(server):
        yield server


class serve:  # noqa: N801 - reads as a verb at the call site: `async with serve(fake)`
    def __init__(self, fake: FakeRay, tls: ssl.SSLContext | None = None) -> None:
        self.fake = fake
        self.tls = tls
        self.runner = web.AppRunner(fake.app())

    async def __aenter__(self) -> FakeRay:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.tls)
        await site.start()
        self.fake.port = self.runner.addresses[0][1]
        return self.fake

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


async def test_the_header_provider_is_asked_for_every_request(fake: FakeRay) -> None:
    tokens = iter(["t1", "t2", "t3"])
    current = {"token": ""}

    def provider() -> dict[str, str]:
        return {"Authorization": f"Bearer {current['token']}"}

    fake.add_job("j1", "hello\n", status="SUCCEEDED")
    async with JobsApi(fake.url, headers=provider) as api:
        for _ in range(2):
            current["token"] = next(tokens)
            await api.version()
        current["token"] = next(tokens)
        assert [c async for c in api.tail("j1")] == ["hello\n"]
    assert [auth for _, _, auth in fake.requests] == ["Bearer t1", "Bearer t2", "Bearer t3"]


@pytest.mark.parametrize("fake", [{"prefix": KUBE_PREFIX}], indirect=True)
async def test_a_path_prefix_is_kept_for_every_endpoint(fake: FakeRay, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.py").write_text("x = 1\n")
    jobs = RayJobs(fake.url + "/")
    assert (await jobs.version())["ray_version"] == "2.58.0"
    await jobs.submit(entrypoint="python a.py", submission_id="j1", runtime_env={"py_modules": [str(tmp_path / "m")]},
                      metadata={"rtui": "1"})
    fake.jobs["j1"].log = "line\n"
    fake.jobs["j1"].details["status"] = "SUCCEEDED"
    assert (await jobs.status("j1")).state is JobState.SUCCEEDED
    assert [j.submission_id for j in await jobs.list()] == ["j1"]  # the bare driver is left out
    assert await jobs.logs("j1") == "line\n"
    assert "".join([c async for c in jobs.follow("j1")]) == "line\n"
    assert not await jobs.stop("j1")
    paths = {p for _, p, _ in fake.requests}
    assert all(p.startswith(KUBE_PREFIX + "/api/") for p in paths), paths
    assert KUBE_PREFIX + "/api/jobs/j1/logs/tail" in paths and KUBE_PREFIX + "/api/jobs/j1/stop" in paths


def make_tree(root: Path) -> None:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "mod.py").write_text("VALUE = 1\n")
    (root / "pkg" / "empty").mkdir()
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0junk")
    (root / "pkg" / ".git").mkdir()
    (root / "pkg" / ".git" / "HEAD").write_text("ref\n")


async def test_a_package_is_uploaded_once_per_content(fake: FakeRay, tmp_path: Path) -> None:
    make_tree(tmp_path)
    jobs = RayJobs(fake.url)
    module = str(tmp_path / "pkg")
    for sid in ("j1", "j2"):
        await jobs.submit(entrypoint="python -m pkg", submission_id=sid, runtime_env={"py_modules": [module],
                          "env_vars": {"A": "1"}}, metadata={})
    assert len(fake.puts) == 1
    uri = fake.puts[0]
    assert uri.startswith("gcs://_ray_pkg_") and uri.endswith(".zip") and len(uri) == len("gcs://_ray_pkg_.zip") + 16
    sent_env = fake.jobs["j2"].details["runtime_env"]
    assert sent_env == {"py_modules": [uri], "env_vars": {"A": "1"}}
    names = set(zipfile.ZipFile(io.BytesIO(fake.packages[uri])).namelist())
    assert names == {"pkg/__init__.py", "pkg/sub/mod.py", "pkg/empty/", f"pkg/{jobsapi.NONCE_FILE}"}, names
    # Not the name anyone can compute from the code alone (a package planted there would be used).
    assert uri != raypackage.package_uri(tmp_path / "pkg")
    assert RayJobs(fake.url).api._nonce != jobs.api._nonce

    # A cache directory changing does not make a new package; a source file does.
    (tmp_path / "pkg" / "__pycache__" / "other.pyc").write_bytes(b"1")
    await jobs.submit(entrypoint="x", submission_id="j3", runtime_env={"py_modules": [module]}, metadata={})
    assert len(fake.puts) == 1
    (tmp_path / "pkg" / "sub" / "mod.py").write_text("VALUE = 2\n")
    await jobs.submit(entrypoint="x", submission_id="j4", runtime_env={"working_dir": module}, metadata={})
    assert len(fake.puts) == 2 and fake.puts[1] != uri
    # A working_dir is zipped without its own folder name.
    names = set(zipfile.ZipFile(io.BytesIO(fake.packages[fake.puts[1]])).namelist())
    assert "sub/mod.py" in names and "__init__.py" in names


def test_the_package_name_is_the_one_ray_computes(tmp_path: Path) -> None:
    packaging = pytest.importorskip("ray._private.runtime_env.packaging")
    make_tree(tmp_path)
    ours = raypackage.package_uri(tmp_path / "pkg")
    assert ours == packaging.get_uri_for_directory(str(tmp_path / "pkg"), include_gitignore=True,
                                                   excludes=list(raypackage.DEFAULT_EXCLUDES))


async def test_submission_answers_keep_their_meaning(fake: FakeRay) -> None:
    clock = TestClock()
    jobs = RayJobs(fake.url, clock=clock)
    fake.submit_answers = [(500, "No available agent to submit job, please try again later.")] * 2 + [(500, ALREADY)]
    waits = [w async for w in rayjobs.submit_when_ready(jobs, first_delay_s=0.01, entrypoint="x", submission_id="j1",
                                                         runtime_env={}, metadata={})]
    assert len(waits) == 2 and "waiting for the job agent" in waits[0] and not fake.submit_answers
    assert clock.slept == [0.01, 0.02]

    fake.submit_answers = [(400, "Traceback (most recent call last):\n  File x\nValueError: bad runtime_env\n")]
    with pytest.raises(OperationError, match="ValueError: bad runtime_env") as info:
        [w async for w in rayjobs.submit_when_ready(jobs, entrypoint="x", submission_id="j2", runtime_env={},
                                                     metadata={})]
    assert not isinstance(info.value, TransientError)


@pytest.mark.parametrize("fake", [{"token": "good"}], indirect=True)
async def test_a_refused_token_is_a_clear_error_not_a_retry(fake: FakeRay) -> None:
    jobs = RayJobs(fake.url, headers={"Authorization": "Bearer stale"})
    fake.add_job("j1", "x")
    for call in (jobs.version(), jobs.status("j1"), jobs.submit(entrypoint="x", submission_id="j2", runtime_env={},
                                                                metadata={})):
        with pytest.raises(OperationError, match="refused our token") as info:
            await call
        assert not isinstance(info.value, TransientError)
    with pytest.raises(OperationError, match=r"refused our token \(HTTP 401"):
        [c async for c in jobs.follow("j1")]
    assert await RayJobs(fake.url, header_provider=lambda: {"Authorization": "Bearer good"}).answers()


async def test_a_dead_port_is_transient_and_quick() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    jobs = RayJobs(f"http://127.0.0.1:{port}")
    # Quick: the refusal itself ends it, not a read deadline (the reason says which; no stopwatch asserted).
    with pytest.raises(TransientError, match="not answering") as info:
        await jobs.status("j1")
    assert "timed out" not in str(info.value), info.value
    assert not await jobs.answers()
    with pytest.raises(TransientError):
        [c async for c in jobs.api.tail("j1")]


def numbered(n: int) -> str:
    return "".join(f"line {i:06d} of the job log\n" for i in range(n))


async def test_follow_survives_dropped_tails_without_a_duplicate_or_a_gap(fake: FakeRay) -> None:
    fake.tail_chunk_chars = 1000  # not a multiple of a line: drops land mid-line
    log = numbered(2000)
    job = fake.add_job("j1", log[:20_000])
    fake.tail_drops_after = [5, 12]  # two connections die mid-stream, the third runs to the end

    async def finish() -> None:
        await eventually_async(  # the third tail, the one that drops no more, is open
            "the client to open its third tail",
            lambda: not fake.tail_drops_after and sum(p.endswith("/logs/tail") for _, p, _ in fake.requests) >= 3,
            timeout=20)
        # The last tail closes normally without the end: Ray's head does that when it loses its
        # agent. The job's end time, after that close, tells; the end reaches only the full log.
        job.log, job.tail_misses = log, 500
        job.details.update(status="SUCCEEDED", end_time=int((time.time() + 60) * 1000))

    finisher = asyncio.create_task(finish())
    async with RayJobs(fake.url, clock=TestClock()) as jobs:
        got = "".join([c async for c in jobs.follow("j1", skip_chars=3000)])
    await finisher
    tails = [p for m, p, _ in fake.requests if p.endswith("/logs/tail")]
    assert len(tails) >= 3
    assert got == log[3000:]
    assert len(fake.peers) < len(fake.requests), "an opened client reuses its connection"


async def test_a_tail_closed_after_the_end_is_the_whole_log_and_is_not_fetched_again(fake: FakeRay) -> None:
    log = numbered(500)
    job = fake.add_job("j1", log, status="SUCCEEDED")
    job.details["end_time"] = int(time.time() * 1000) - 1000
    async with RayJobs(fake.url) as jobs:
        assert "".join([c async for c in jobs.follow("j1", skip_chars=100)]) == log[100:]
    assert not [p for _, p, _ in fake.requests if p.endswith("/logs")]


async def test_a_dropped_tail_of_a_finished_job_takes_only_the_rest_from_the_full_log(
        fake: FakeRay, monkeypatch: pytest.MonkeyPatch) -> None:
    """Non-ASCII and astral characters count as one character each, as in the tail."""
    monkeypatch.setattr(jobsapi, "LOGS_READ_BYTES", 7)  # escapes and surrogate pairs cut in two
    log = "".join(f"r\u00e9sum\u00e9 {i} \N{GRINNING FACE} \"q\" \\ tab\t\n" for i in range(300))
    job = fake.add_job("j1", log, status="FAILED")
    job.details["end_time"] = int(time.time() * 1000) - 1000
    fake.tail_chunk_chars = 100
    fake.tail_drops_after = [3, 5]  # both connections drop before the end
    async with RayJobs(fake.url, clock=TestClock()) as jobs:
        got = [c async for c in jobs.follow("j1", skip_chars=50)]
    assert "".join(got) == log[50:]
    assert len([p for _, p, _ in fake.requests if p.endswith("/logs")]) == 1


async def test_follow_yields_nothing_twice_when_the_spool_holds_it_all(fake: FakeRay) -> None:
    fake.add_job("j1", "abc\ndef\n", status="FAILED")
    jobs = RayJobs(fake.url)
    assert [c async for c in jobs.follow("j1", skip_chars=8)] == []
    assert "".join([c async for c in jobs.follow("j1", skip_chars=5)]) == "ef\n"


def test_importing_the_client_does_not_import_ray() -> None:
    import sys

    code = ("import sys, backend.rayjobs, backend.jobsapi\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parent.parent)
    assert json.loads(out.stdout.replace("'", '"')) == []


async def test_a_dropped_tail_is_transient_and_a_finished_one_is_not(fake: FakeRay) -> None:
    fake.add_job("j1", numbered(100), status="SUCCEEDED")
    fake.tail_chunk_chars = 100
    fake.tail_drops_after = [3]
    api = JobsApi(fake.url)
    got: list[str] = []
    with pytest.raises(TransientError, match="dropped"):
        async for chunk in api.tail("j1"):
            got.append(chunk)
    assert "".join(got) == numbered(100)[:300]
    assert "".join([c async for c in api.tail("j1")]) == numbered(100)


async def test_a_kubeconfig_ca_is_used_for_requests_and_the_tail(tmp_path: Path) -> None:
    """A cluster behind a certificate of its own CA: refused (not retried) without it, trusted with it."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    fake = FakeRay(prefix=KUBE_PREFIX)
    fake.add_job("j1", "over tls\n", status="SUCCEEDED")
    async with serve(fake, tls=server_tls):
        url = fake.url.replace("http://", "https://")
        with pytest.raises(OperationError, match="not trusted") as info:
            await RayJobs(url).version()
        assert not isinstance(info.value, TransientError)
        jobs = RayJobs(url, ssl=ssl.create_default_context(cafile=str(cert)),
                       header_provider=lambda: {"Authorization": "Bearer k8s-aws-v1.x"})
        assert (await jobs.version())["ray_version"] == "2.58.0"
        assert "".join([c async for c in jobs.follow("j1")]) == "over tls\n"
    assert {auth for _, _, auth in fake.requests} == {"Bearer k8s-aws-v1.x"}
