"""`rtui bench fabric|ab` and the fabric check job: arithmetic, parsing, job handling, one real run."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backend import bench
from backend.errors import OperationError, UserError
from backend.layers.base import Context
from backend.planner import PlanResult
from backend.rayjobs import JobStatus, RayJobs
from backend.resolve import resolve_config
from backend.resources import Action, Change, EventKind, StepEvent
from backend.session import RunSession
from backend.store import JobState, RunStore
from tests.conftest import REPO
from training import fabric
from training.protocol import FABRIC_TAG, format_record

MIB = 2**20
PREFIX = "\x1b[36m(RayTrainWorker pid=4242, ip=10.0.0.5)\x1b[0m "


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """This worktree's CLI (the venv's `rtui` script may import another checkout's code)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def sweep_record(world: int, sizes: list[int], *, transport: str | None, time_s: float = 0.01) -> dict[str, Any]:
    return {"transport": transport, "world_size": world, "nodes": 2, "iters": 20, "warmup": 5,
            "results": [fabric.result_row(s, time_s * s / MIB, world) for s in sizes]}


def nccl_lines(channel: str, *, provider: str | None = None) -> list[str]:
    lines = [f"{h}:{p}:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] [send] via NET/{channel}/0"
             for h, p in (("gpu-a", 11), ("gpu-b", 22))]
    if provider:
        lines += [f"{h}:{p}:9 [0] NCCL INFO NET/OFI Selected provider is {provider}, fabric is {provider} "
                  "(found 1 nics)" for h, p in (("gpu-a", 11), ("gpu-b", 22))]
    return lines


# --- arithmetic -------------------------------------------------------------------------------
def test_busbw_follows_nccl_tests_all_reduce_convention() -> None:
    assert fabric.bus_factor(1) == 0 and fabric.bus_factor(2) == 1 and fabric.bus_factor(8) == 1.75
    algbw, busbw = fabric.bandwidths(2**30, 0.1, 8)
    assert algbw == pytest.approx(2**30 / 0.1 / 1e9) and busbw == pytest.approx(algbw * 1.75)
    row = fabric.result_row(64 * MIB, 0.0123456, 16)
    assert row == {"size_bytes": 64 * MIB, "time_us": 12345.6, "algbw_gbps": round(64 * MIB / 0.0123456 / 1e9, 4),
                   "busbw_gbps": round(64 * MIB / 0.0123456 / 1e9 * 30 / 16, 4)}


def test_sweep_doubles_and_cpu_default_is_capped() -> None:
    assert fabric.sweep_sizes(MIB, 2**30) == [MIB << i for i in range(11)]
    assert fabric.sweep_sizes(MIB, 3 * MIB) == [MIB, 2 * MIB]
    cpu, gpu = fabric.parse_args(["--device", "cpu"]), fabric.parse_args(["--device", "cuda"])
    assert (cpu.max_bytes, cpu.iters, cpu.warmup) == (64 * MIB, 5, 2)
    assert (gpu.max_bytes, gpu.iters, gpu.warmup) == (2**30, 20, 5)
    for bad in (["--min-bytes", "6"], ["--min-bytes", "8", "--max-bytes", "4"], ["--iters", "0"]):
        with pytest.raises(SystemExit):
            fabric.parse_args(bad)


# --- parsing ----------------------------------------------------------------------------------
def test_gloo_record_is_found_behind_ray_prefixes() -> None:
    record = sweep_record(2, [MIB, 2 * MIB], transport="gloo")
    lines = ["noise", PREFIX + format_record(FABRIC_TAG, record), "rtui-fabric: done"]
    run = bench.parse_fabric_log(lines, variant="gloo")
    assert (run.transport, run.world_size, run.nodes) == ("gloo", 2, 2)
    assert [r["size_bytes"] for r in run.results] == [MIB, 2 * MIB]


def test_gpu_transport_comes_from_the_nccl_log() -> None:
    record = sweep_record(8, [MIB], transport=None)
    lines = [*nccl_lines("Socket"), PREFIX + format_record(FABRIC_TAG, record)]
    assert bench.parse_fabric_log(lines, variant="tcp").transport == "socket"
    efa = [*nccl_lines("Libfabric", provider="efa"), format_record(FABRIC_TAG, record)]
    assert bench.parse_fabric_log(efa, variant="efa").transport == "efa"


@pytest.mark.parametrize("lines", [
    ["rtui-fabric: sweep failed"],
    [format_record(FABRIC_TAG, {"results": []})],
    [format_record(FABRIC_TAG, {"results": [{"size_bytes": MIB, "time_us": "x", "algbw_gbps": 1,
                                             "busbw_gbps": 1}]})],
    [format_record(FABRIC_TAG, {"results": [{"size_bytes": MIB, "time_us": 1, "algbw_gbps": float("nan"),
                                             "busbw_gbps": 1}]})],
])
def test_missing_or_malformed_record_is_an_operation_error(lines: list[str]) -> None:
    with pytest.raises(OperationError):
        bench.parse_fabric_log(lines, variant="gloo")


def runs(efa_transport: str, tcp_transport: str = "socket") -> dict[str, bench.FabricRun]:
    sizes = [MIB, 2 * MIB, 4 * MIB]
    efa = bench.FabricRun("efa", efa_transport, 8, 2, sweep_record(8, sizes, transport=None, time_s=0.001)["results"])
    tcp = bench.FabricRun("tcp", tcp_transport, 8, 2, sweep_record(8, sizes, transport=None, time_s=0.004)["results"])
    return {"efa": efa, "tcp": tcp}


def test_ratio_at_the_largest_size_only_when_both_ran_as_meant() -> None:
    report = bench.fabric_report(runs("efa"))
    assert report["transport"] == "efa" and set(report["variants"]) == {"efa", "tcp"}
    assert report["ratio"] == pytest.approx(4.0, rel=1e-3) and report["ratio_size_bytes"] == 4 * MIB
    assert report["reason"] is None and len(report["ratio_by_size"]) == 3
    fallback = bench.fabric_report(runs("socket"))
    assert fallback["ratio"] is None and fallback["raw_ratio"] == pytest.approx(4.0, rel=1e-3)
    assert "efa run used socket" in fallback["reason"]
    single = bench.fabric_report(runs("intra_node", "intra_node"))
    assert single["ratio"] is None and "two or more nodes" in single["reason"]
    local = bench.fabric_report({"gloo": bench.FabricRun("gloo", "gloo", 2, 1, runs("efa")["efa"].results)})
    assert local["ratio"] is None and "no EFA" in local["reason"]


def test_ab_speedup_from_summary_lines() -> None:
    def log(tps: float, channel: str) -> list[str]:
        return [*nccl_lines(channel, provider="efa" if channel == "Libfabric" else None),
                PREFIX + format_record("RTUI_SUMMARY", {"steps": 20, "tokens_per_s_mean": tps,
                                                        "step_time_s_mean": 2.0, "world_size": 8})]
    a = bench.parse_ab_log(log(1059.5, "Libfabric"), variant="efa", local=False)
    b = bench.parse_ab_log(log(514.7, "Socket"), variant="tcp", local=False)
    assert (a["transport"], b["transport"], a["steps_per_s"]) == ("efa", "socket", 0.5)
    report = bench.ab_report({"efa": a, "tcp": b})
    assert report["speedup"] == pytest.approx(2.06, abs=0.005) and report["reason"] is None
    swapped = bench.ab_report({"efa": b, "tcp": a})
    assert swapped["speedup"] is None and "efa run used socket" in swapped["reason"]
    with pytest.raises(OperationError, match="RTUI_SUMMARY"):
        bench.parse_ab_log(nccl_lines("Socket"), variant="tcp", local=False)


def test_variants_and_specs_per_target() -> None:
    local = resolve_config({}, environ={}).config
    aws = resolve_config({"target": "aws"}, environ={}).config
    assert [v.name for v in bench.select_variants(local)] == ["gloo"]
    assert [v.name for v in bench.select_variants(aws)] == ["efa", "tcp"]
    with pytest.raises(UserError, match="not available on the local target"):
        bench.select_variants(local, ["efa"])
    assert bench.VARIANTS["tcp"].env["NCCL_NET"] == "Socket" and bench.VARIANTS["tcp"].env["NCCL_NET_PLUGIN"] == "none"
    spec = bench.fabric_spec(local, iters=3)
    assert spec.entrypoint.startswith("python -m training.fabric --num-workers 2 --device cpu")
    assert "--iters 3" in spec.entrypoint and spec.runtime_env["py_modules"]
    gpu = bench.fabric_spec(aws)
    assert "--num-workers 8 --device cuda" in gpu.entrypoint and gpu.runtime_env["env_vars"]["NCCL_DEBUG"] == "INFO"


# --- bring-up and job handling, with fakes ------------------------------------------------------
class FakeJobs(RayJobs):
    def __init__(self, chunks: list[str], final: str = "SUCCEEDED", hang: bool = False) -> None:
        super().__init__("http://fake")
        self.chunks, self.final, self.hang = chunks, final, hang
        self.submitted: list[dict[str, Any]] = []
        self.stopped: list[str] = []

    async def submit(self, *, entrypoint: str, submission_id: str, runtime_env: dict[str, Any],
                     metadata: dict[str, str]) -> str:
        self.submitted.append({"entrypoint": entrypoint, "submission_id": submission_id, "runtime_env": runtime_env,
                               "metadata": metadata})
        return submission_id

    async def follow(self, submission_id: str, *, skip_chars: int = 0,
                     ended: asyncio.Event | None = None) -> AsyncIterator[str]:
        for chunk in self.chunks:
            yield chunk
        if self.hang:
            await asyncio.sleep(3600)  # models time: lives until stopped

    async def status(self, submission_id: str) -> JobStatus:
        return JobStatus(submission_id, JobState(self.final), "boom" if self.final == "FAILED" else "")

    async def stop(self, submission_id: str) -> bool:
        self.stopped.append(submission_id)
        return True


class ResultsCluster:
    """A cluster whose jobs write their results under ``results``."""

    def __init__(self, results: Path) -> None:
        self.results = results

    async def jobs(self, ctx: Context) -> RayJobs | None:
        return None

    def job_env(self, ctx: Context) -> dict[str, str]:
        return {"RTUI_STORAGE_PATH": str(self.results)}

    def job_finished(self, ctx: Context) -> None:
        pass


def fake_session(tmp_path: Path) -> RunSession:
    """A real local run's session (a record in ``state``) on a cluster that is not there."""
    config = resolve_config({}, environ={}).config
    store = RunStore(tmp_path / "state")
    session = RunSession(store, store.create(config.model_copy(update={"cluster_name": "c"})), config)
    session.ctx.cluster = ResultsCluster(tmp_path / "ray" / "results")
    return session


async def test_run_job_logs_to_a_file_and_reports_progress(tmp_path: Path) -> None:
    record = format_record(FABRIC_TAG, sweep_record(2, [MIB], transport="gloo"))
    jobs = FakeJobs([PREFIX + "rtui-fabric: 1 MiB done\n" + PREFIX + record[:20], record[20:] + "\n"])
    events: list[StepEvent] = []
    spec = bench.fabric_spec(resolve_config({}, environ={}).config)
    session = fake_session(tmp_path)
    lines, log = await bench.run_job(session, jobs, spec, label="fabric-gloo",
                                     variant=bench.VARIANTS["gloo"], on_event=events.append)
    assert bench.parse_fabric_log(lines, variant="gloo").results[0]["size_bytes"] == MIB
    assert log.read_text().endswith(record[20:] + "\n") and log.parent == tmp_path / "state" / "bench" / session.run_id
    assert log.stat().st_mode & 0o777 == 0o600 and log.parent.stat().st_mode & 0o777 == 0o700
    assert [e.kind for e in events] == [EventKind.STARTED, EventKind.PROGRESS, EventKind.DONE]
    assert events[1].message == "swept 1 MiB"
    env = jobs.submitted[0]["runtime_env"]["env_vars"]
    assert env["RTUI_STORAGE_PATH"] == str(tmp_path / "ray" / "results") and env["RAY_TRAIN_ENABLE_PRINT_PATCH"] == "0"


async def test_failed_and_stuck_jobs(tmp_path: Path) -> None:
    spec = bench.fabric_spec(resolve_config({}, environ={}).config)
    failed = FakeJobs(["rtui-fabric: sweep failed: RuntimeError: wrong sum\n"], final="FAILED")
    with pytest.raises(OperationError, match="fabric-gloo job failed: rtui-fabric: sweep failed"):
        await bench.run_job(fake_session(tmp_path), failed, spec, label="fabric-gloo",
                            variant=bench.VARIANTS["gloo"], on_event=lambda e: None)
    stuck = FakeJobs(["starting\n"], final="RUNNING", hang=True)
    session = fake_session(tmp_path)
    with pytest.raises(OperationError, match="did not finish within 0s; stopped it"):
        await bench.run_job(session, stuck, spec, label="fabric-gloo",
                            variant=bench.VARIANTS["gloo"], on_event=lambda e: None, timeout_s=0.2)
    assert stuck.stopped and stuck.stopped[0].startswith(f"rtui-{session.run_id}-fabric-gloo-")


async def test_bring_up_runs_the_up_flow_until_the_cluster_layer(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from backend import flows

    def plan(head: Action) -> PlanResult:
        return PlanResult(target="local", changes=[
            Change(address="local.ray-head", layer="local-ray", kind="ray-head", action=head),
            Change(address="ray.job.train", layer="ray-job", kind="ray-job", action=Action.CREATE)])

    calls: list[tuple[str | None, bool]] = []

    async def fake_up(session: RunSession, *, until: str | None = None,
                      follow: bool = True) -> AsyncIterator[StepEvent]:
        calls.append((until, follow))
        yield StepEvent(step="local.ray-head", kind=EventKind.DONE)

    monkeypatch.setattr(flows, "up", fake_up)
    plans = iter([plan(Action.CREATE), plan(Action.NOOP)])

    async def planned() -> PlanResult:
        return next(plans)

    async def jobs() -> RayJobs | None:
        return FakeJobs([])

    session = fake_session(tmp_path)
    session.plan, session.jobs = planned, jobs
    await bench.bring_up(session, lambda e: None)
    assert calls == [("local-ray", False)]
    # A cluster already up as configured is not applied again.
    events: list[StepEvent] = []
    await bench.bring_up(session, events.append)
    assert calls == [("local-ray", False)] and events[0].message == "cluster already up"


# --- the CLI ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "needle"), [
    (["bench"], "required: {fabric,ab}"),
    (["bench", "fabric"], "needs --yes"),
    (["bench", "ab", "--json"], "needs --yes"),
    (["bench", "fabric", "--yes", "--iters", "0"], "--iters must be at least 1"),
    (["bench", "fabric", "--yes", "--variant", "efa"], "not available on the local target"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    proc = run_cli(*args, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.strip().count("\n") == 0 and needle in proc.stderr and proc.stdout == ""


@pytest.mark.ray
def test_fabric_then_ab_on_a_local_cluster() -> None:
    """Fabric check runs on gloo and prints a sane busbw table; the A/B trains and tears down."""
    proc = run_cli("bench", "fabric", "--yes", "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # exactly one object on stdout; progress went to stderr
    assert {"transport", "world_size", "nodes", "results"} <= set(report)
    assert (report["transport"], report["world_size"], report["nodes"]) == ("gloo", 2, 1)
    sizes = [r["size_bytes"] for r in report["results"]]
    assert sizes == [MIB << i for i in range(7)]  # 1 MiB → 64 MiB, the CPU cap
    for r in report["results"]:
        assert set(r) == {"size_bytes", "time_us", "algbw_gbps", "busbw_gbps"}
        assert all(math.isfinite(v) and v > 0 for v in r.values())
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / (r["time_us"] / 1e6) / 1e9, rel=1e-3, abs=1e-4)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (2 - 1) / 2, abs=1e-4)
    assert report["ratio"] is None and "no EFA" in report["reason"] and report["cluster"] == "up"
    assert "swept 64 MiB" in proc.stderr and "fabric-gloo finished" in proc.stderr

    ab = run_cli("bench", "ab", "--yes", "--steps", "4", "--down")
    assert ab.returncode == 0, ab.stdout[-2000:] + ab.stderr[-3000:]
    assert "a  gloo  on gloo" in ab.stdout and "speedup: n/a — the local target has no EFA" in ab.stdout
    status = json.loads(run_cli("status", report["run_id"], "--json", timeout=60).stdout)
    assert status["status"] == "down" and status["cluster"]["alive"] is False
    saved = json.loads((Path(os.environ["RTUI_STATE_DIR"]) / "bench" / report["run_id"] / "ab.json").read_text())
    assert saved["steps"] == 4 and saved["a"]["tokens_per_s"] > 0 and saved["b"] is None
