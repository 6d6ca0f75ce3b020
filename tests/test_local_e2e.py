"""End to end on a real local Ray cluster, through the real `rtui` binary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from backend.procs import ProcRef, family
from backend.store import RunStore
from tests.conftest import RTUI, json_lines, run_rtui
from training.protocol import METRIC_TAG, parse_record

pytestmark = pytest.mark.ray


def metric_steps(spool: Path) -> list[int]:
    steps = []
    for line in spool.read_text().splitlines():
        parsed = parse_record(line) if METRIC_TAG in line else None
        if parsed:
            steps.append(parsed[1]["step"])
    return steps


def our_processes(run_id: str) -> list[psutil.Process]:
    rec = RunStore().load(run_id)
    roots = [ProcRef.from_dict(rec.resources["head"])] if rec.resources.get("head") else []
    return family(roots, rec.resources.get("temp_dir"))


def _listening(proc: psutil.Process) -> list:
    try:
        return [c for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        return []


def test_up_status_noop_second_up_and_down() -> None:
    started = time.monotonic()
    proc = run_rtui("up", "--yes", "--json", "--steps", "6", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = json_lines(proc.stdout)
    run_id = events[0]["data"]["run_id"]
    assert events[0]["data"]["plan"]["changes"][0]["action"] == "create"
    assert events[-1]["kind"] == "done" and events[-1]["data"]["job_status"] == "SUCCEEDED"
    assert {e["step"] for e in events} >= {"head", "job", "train", "run"}
    first_metric = next(e for e in events if e["step"] == "train" and e["kind"] == "progress")
    to_metric = first_metric["ts"] - events[0]["ts"]
    print(f"up → first metric event: {to_metric:.1f}s; whole up {time.monotonic() - started:.1f}s")

    rec = RunStore().load(run_id)
    spool = Path(rec.spool_path)
    assert metric_steps(spool) == [1, 2, 3, 4, 5, 6]
    temp_dir = Path(rec.resources["temp_dir"])
    assert temp_dir.is_dir()

    status = json_lines(run_rtui("status", run_id, "--json", check=True).stdout)[0]
    assert status["status"] == "up" and status["cluster"]["alive"] is True
    assert status["job"]["status"] == "SUCCEEDED" and status["last_metric"]["step"] == 6
    assert status["summary"]["steps"] == 6

    # The Jobs API (it runs arbitrary code) listens on loopback only. Ray 2.58's own gRPC
    # servers bind wider whatever --node-ip-address says; see the README's security note.
    dashboard_port = rec.resources["ports"]["dashboard"]
    listeners = [c.laddr for p in our_processes(run_id) for c in _listening(p) if c.laddr.port == dashboard_port]
    assert listeners and all(addr.ip == "127.0.0.1" for addr in listeners), listeners

    plan = json_lines(run_rtui("plan", "--json", "--steps", "6", check=True).stdout)[0]
    assert plan["noop"] is True and plan["run_id"] == run_id
    again = run_rtui("up", "--yes", "--json", "--steps", "6", timeout=120)
    assert again.returncode == 0, again.stderr
    again_events = json_lines(again.stdout)
    assert again_events[0]["data"]["noop"] is True
    assert not [e for e in again_events if e["step"] == "job" and e["kind"] == "progress"
                and "submitting" in e["message"]]
    assert metric_steps(spool) == [1, 2, 3, 4, 5, 6], "the second up must not duplicate the spool"

    logs = run_rtui("logs", run_id, check=True).stdout
    assert logs.count(METRIC_TAG) == 6

    down = run_rtui("down", run_id, "--yes", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not our_processes(run_id)
    assert not temp_dir.exists()
    final = json_lines(run_rtui("status", run_id, "--json", check=True).stdout)[0]
    assert final["status"] == "down" and final["cluster"]["alive"] is False


def test_sigkill_mid_job_then_status_resume_and_down() -> None:
    up = subprocess.Popen([RTUI, "up", "--yes", "--json", "--steps", "5000"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    run_id = None
    try:
        assert up.stdout is not None
        deadline = time.monotonic() + 300
        for line in up.stdout:
            event = json.loads(line)
            run_id = run_id or event["data"].get("run_id")
            if event["step"] == "train" and event["kind"] == "progress":
                break
            assert time.monotonic() < deadline, "no training progress"
        up.send_signal(signal.SIGKILL)
        up.wait()
    finally:
        if up.poll() is None:
            up.kill()
    assert run_id

    status = json_lines(run_rtui("status", run_id, "--json", check=True).stdout)[0]
    assert status["cluster"]["alive"] is True and status["attached"] is False
    assert status["job"]["status"] == "RUNNING"

    rec = RunStore().load(run_id)
    before = metric_steps(Path(rec.spool_path))
    time.sleep(2)
    run_rtui("logs", run_id, check=True)
    after = metric_steps(Path(rec.spool_path))
    assert len(after) > len(before) and after == sorted(set(after)), "catch-up must extend, never duplicate"

    # The wizard reattaches to the running job and shows it live.
    import asyncio

    from backend.session import RunSession
    from tui.app import RtuiApp

    async def resume() -> tuple[str, int]:
        app = RtuiApp(RunSession.open(None), resume=True)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(360):  # generous: CI machines can be loaded
                await pilot.pause(0.25)
                metric = getattr(app.screen, "metric", None)
                if metric and metric.step > after[-1]:
                    break
            screen_name = type(app.screen).__name__
            step = app.screen.metric.step  # type: ignore[attr-defined]
            await pilot.press("q")
        return screen_name, step

    screen_name, step = asyncio.run(resume())
    assert screen_name == "RunScreen" and step > after[-1]
    resumed = metric_steps(Path(rec.spool_path))
    assert resumed == sorted(set(resumed)) and resumed[: len(after)] == after

    down = run_rtui("down", run_id, "--yes", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not our_processes(run_id)
    job = RunStore().load(run_id).current_job
    assert job is not None and job.status == "STOPPED"


def test_two_runs_on_one_machine_do_not_collide() -> None:
    ups = [subprocess.Popen([RTUI, "up", "--yes", "--json", "--until", "head", "--cluster-name", name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for name in ("first", "second")]
    outs = [p.communicate(timeout=240) for p in ups]
    assert [p.returncode for p in ups] == [0, 0], outs
    run_ids = [json_lines(out)[0]["data"]["run_id"] for out, _ in outs]
    records = [RunStore().load(r) for r in run_ids]
    ports = [set(r.resources["ports"].values()) for r in records]
    assert not ports[0] & ports[1], "the two clusters share a port"
    assert records[0].resources["temp_dir"] != records[1].resources["temp_dir"]
    second_procs = {p.pid for p in our_processes(run_ids[1])}

    assert run_rtui("down", run_ids[0], "--yes", timeout=120).returncode == 0
    assert not our_processes(run_ids[0])
    # Ray may have started more workers meanwhile; none of the second run's processes may be gone.
    assert second_procs <= {p.pid for p in our_processes(run_ids[1])}, "tearing down one run touched the other"
    status = json_lines(run_rtui("status", run_ids[1], "--json", check=True).stdout)[0]
    assert status["cluster"]["alive"] is True
    assert run_rtui("down", run_ids[1], "--yes", timeout=120).returncode == 0
    assert not our_processes(run_ids[1])
