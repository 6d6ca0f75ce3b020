"""One real local job left training with nobody attached, looked at from two sides.

`rtui up` of a long job is SIGKILLed at its first training step (the user's laptop closed, the terminal
gone): the cluster and the job train on. First, while it trains, every socket of its cluster listens
on loopback only (issue 33 item 5). Then, last in this module, `status`, `logs` and the wizard's
resume find it and `down` stops it.

Both need *a* running job and the first changes nothing, so they share one: starting a cluster and a
job costs most of a minute on two cores (issue 37), and each test's checks are as they were.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from backend.store import RunStore
from screens.run import RunScreen
from targets.local.cluster import cluster_family, find_clusters
from tests.conftest import json_lines, run_rtui
from tests.eventually import eventually, eventually_async
from tests.shared_run import SharedRun, own_env
from tests.test_local_e2e import _up_until, metric_steps, our_processes
from tests.test_local_security import is_loopback, job_status, listening

pytestmark = pytest.mark.ray

NAME = "running"


@dataclass(frozen=True)
class RunningJob(SharedRun):
    submission_id: str


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningJob]:
    env = own_env(tmp_path_factory.mktemp("running-job"))
    try:
        run_id = _up_until(lambda e: e["step"] == "train" and e["kind"] == "progress"
                           and e["message"].startswith("step"), "--steps", "5000", "--cluster-name", NAME, env=env)
        (cluster,) = find_clusters(run_id=run_id)
        current = RunStore(Path(env["RTUI_STATE_DIR"])).load(run_id).current_job
        assert current is not None
        yield RunningJob(env, run_id, cluster, current.submission_id)
    finally:  # whatever the last test did: nothing of the run stays up
        run_rtui("down", "--yes", "--cluster-name", NAME, env=env, timeout=180)


def test_no_socket_of_a_running_local_job_listens_off_loopback(job: RunningJob) -> None:
    """While a local job trains, every socket of its cluster listens on loopback only.

    A check after the job cannot see what lives only as long as the job. torch's TCPStore, which Ray
    Train's TorchConfig makes rank 0 host for init_process_group (``env://`` or ``tcp://``,
    ray/train/torch/config.py), binds its server to ``::`` (else ``0.0.0.0``) whatever host it is
    given and asks no token: c10d's TCPStoreLibUvBackend.cpp (``UvTcpServer::makeWithPort``) and
    TCPStore.cpp's non-libuv server alike, torch 2.13. A default local cluster is loopback only
    (Ray itself binds 127.0.0.1 there, ``ray_env``), so no listener off loopback is allowed at all.
    """
    assert job_status(job.cluster, job.submission_id) == "RUNNING"
    sockets = listening(job.cluster.path)
    assert any(name == "ray::RayTrainWorker" for _, _, name in sockets), "the training workers were not seen"
    off_loopback = [s for s in sockets if not is_loopback(s[0])]
    assert not off_loopback, f"listening off loopback while the job runs: {off_loopback}"
    # The workers met through a file in the cluster's private dir, and gloo's own connections are
    # pinned to loopback: unpinned, gloo binds what the host's name resolves to (here 127.0.0.1,
    # on many hosts their network address), which this host alone could not show.
    assert list((job.cluster.path / "rendezvous").glob("torch-store-*")), "no FileStore in the cluster's dir"
    inet = {name: [a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
            for name, addrs in psutil.net_if_addrs().items()}
    loopback_ifs = {name for name, ips in inet.items() if ips and all(is_loopback(ip) for ip in ips)}
    for proc in cluster_family(job.cluster.path):
        with contextlib.suppress(psutil.Error):
            if proc.name() == "ray::RayTrainWorker":
                assert proc.environ().get("GLOO_SOCKET_IFNAME") in loopback_ifs, proc.environ().get(
                    "GLOO_SOCKET_IFNAME")
    # Still running after the look: what was seen was the job's, not its teardown.
    assert job_status(job.cluster, job.submission_id) == "RUNNING"


async def test_sigkill_mid_job_then_status_resume_and_down(job: RunningJob, monkeypatch: pytest.MonkeyPatch) -> None:
    """Last in this module: it ends the shared job."""
    monkeypatch.setenv("RTUI_STATE_DIR", job.env["RTUI_STATE_DIR"])
    monkeypatch.setenv("RTUI_CONFIG_DIR", job.env["RTUI_CONFIG_DIR"])
    run_id = job.run_id
    status = json_lines(run_rtui("status", run_id, "--json", check=True).stdout)[0]
    assert status["cluster"]["alive"] is True and status["attached"] is False
    assert status["job"]["status"] == "RUNNING"

    spool = Path(RunStore().load(run_id).spool_path)
    before = metric_steps(spool)

    def caught_up() -> list[int] | None:
        """The job trains on with nobody following: `rtui logs` catches up on it."""
        run_rtui("logs", run_id, check=True)
        after = metric_steps(spool)
        assert after == sorted(set(after)), "catch-up must extend, never duplicate"
        return after if len(after) > len(before) else None

    after = eventually("the spool to grow through `rtui logs`", caught_up, timeout=120)

    # The wizard reattaches to the running job and shows it live.
    from backend.session import RunSession
    from tui.app import RtuiApp

    app = RtuiApp(RunSession.open(None), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        def live_past_the_catch_up() -> bool:
            metric = getattr(app.screen, "metric", None)
            return bool(metric and metric.step is not None and metric.step > after[-1])

        def waited_for() -> str:  # built when the wait fails: did the job stall, or the screen's follow?
            metric = getattr(app.screen, "metric", None)
            shown = metric.step if metric is not None else None
            spooled = metric_steps(spool)
            return (f"a live metric past step {after[-1]} on {type(app.screen).__name__} (the screen shows step "
                    f"{shown}; the job's spool has reached step {spooled[-1] if spooled else None})")

        await eventually_async(waited_for, live_past_the_catch_up, timeout=90, interval=0.25, pause=pilot.pause)
        assert isinstance(app.screen, RunScreen)
        await pilot.press("q")
    # Textual cancels the app's workers on exit without waiting for them: the follow lets go of the
    # run's lock as it unwinds (closing its log tail first), on this loop. The real binary exits.
    await eventually_async("the wizard's follow to let go of the run", lambda: not RunStore().is_locked(run_id))
    resumed = metric_steps(spool)
    assert resumed == sorted(set(resumed)) and resumed[: len(after)] == after

    down = run_rtui("down", run_id, "--yes", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not our_processes(run_id)
    current = RunStore().load(run_id).current_job
    assert current is not None and current.status == "STOPPED"
    assert not find_clusters(run_id=run_id)
