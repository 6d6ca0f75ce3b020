"""A cluster run's own node count reaches the NCCL badge and `rtui status` (issue 39).

NCCL announces its Socket net on every machine without IB or EFA, single-node jobs included, and
real logs are fragments: without the job's own node count a single-node run on a cluster could show
a TCP alarm, or stay UNKNOWN, until a line proves the node count. The kube/aws targets know it from
the config (one GPU per worker, ``gpus_per_node`` per GPU node, Ray Train packs them), and the
run screen and `rtui status` hand it to the verdict.

The log replayed is a real one: shared/nccl_logs' single-node Ray job that announces Socket (file
45; its P2P channel line comes last), read at test time from ``../shared`` beside the repository.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.resolve import resolve_config
from backend.session import RunSession
from backend.store import JobRecord, JobState, RunStatus, RunStore
from screens.run import RunScreen
from targets.kube.config import KubeConfig
from tests.conftest import run_rtui
from tests.pilot_wait import wait_for
from tests.telemetry.tel_support import NCCL_LOGS
from tests.test_tui_dashboard import T0, DashboardApp, badge_text, feed, metric_lines, settle
from training.logparse import classify_lines, iter_file_lines
from tui.transport_badge import TransportBadge, TransportSnapshot

RUN_ID = "r20260101-000000-b0de"
SOCKET_ANNOUNCED_SINGLE_NODE = "45_"  # a Ray job on one machine: Socket announced, then a P2P channel
SINGLE_NODE_EFA_PLUGIN = "22_"  # 4 processes on one g6e: the EFA plugin loaded, nNodes 1, SHM channels


def shared_log(prefix: str) -> list[str]:
    if not (NCCL_LOGS / "MANIFEST.json").is_file():
        pytest.skip(f"real NCCL logs not available at {NCCL_LOGS} (../shared/nccl_logs from the repo root)")
    entry = next(e for e in json.loads((NCCL_LOGS / "MANIFEST.json").read_text()) if e["file"].startswith(prefix))
    return list(iter_file_lines(NCCL_LOGS / entry["file"]))


def before_the_channels(lines: list[str]) -> list[str]:
    """The lines a live badge has before the first channel connects (a single node proves itself there)."""
    first = next(i for i, line in enumerate(lines) if " via " in line)
    return lines[:first]


def cluster_session(*, gpu_nodes: int) -> RunSession:
    """A saved kube run with a running job, 4 GPUs per node and one worker per GPU, as `rtui --resume`
    finds it: no kubeconfig reaches its cluster, so nothing is followed live."""
    config = resolve_config({"target": "kube", "gpu_node_count": str(gpu_nodes), "gpus_per_node": "4",
                             "steps": "40"}, environ={})
    session = RunSession.for_config(config)
    session.record.run_id = RUN_ID
    session.record.spool_path = str(RunStore().spool_dir / f"{RUN_ID}.log")
    session.record.jobs.append(JobRecord(submission_id="rtui-x-1", submitted_at=T0, spec_hash="h",
                                         status=JobState.RUNNING))
    session.record.status = RunStatus.UP
    session.store.save(session.record)
    return RunSession.resume(RUN_ID)


async def badge_after(session: RunSession, lines: list[str]) -> tuple[str, str]:
    """(the badge line, its expanded why) once the run screen has shown ``lines``."""
    app = DashboardApp(session, resume=True)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), 5, "run screen")
        await settle(pilot)
        await feed(pilot, [*lines, *metric_lines(1, 3)])
        badge = app.screen.query_one(TransportBadge)
        line = badge_text(badge)
        await pilot.press("t")
        await wait_for(pilot, lambda: badge.expanded, 5, "the badge's why")
        return line, " ".join(badge_text(badge).split())  # the why, unwrapped


def test_cluster_targets_know_their_job_node_count() -> None:
    def nodes(**flags: str) -> int | None:
        return RunSession.for_config(resolve_config(flags, environ={})).job_nodes()

    assert nodes(target="kube", gpu_node_count="1", gpus_per_node="4") == 1
    assert nodes(target="kube", gpu_node_count="2", gpus_per_node="4") == 2  # 8 workers by default
    assert nodes(target="aws", gpu_node_count="2", gpus_per_node="4", num_workers="4") == 1  # PACK: one node
    assert nodes(target="aws", gpu_node_count="3", gpus_per_node="4", num_workers="5") == 2
    assert nodes(target="local") == 1  # the head and its worker nodes are processes of this machine


async def test_single_node_cluster_run_badge_says_intra_node_before_the_log_proves_it(isolated_env: Path) -> None:
    lines = before_the_channels(shared_log(SOCKET_ANNOUNCED_SINGLE_NODE))
    assert any("Using network Socket" in line for line in lines)
    badge, why = await badge_after(cluster_session(gpu_nodes=1), lines)
    assert badge.startswith(" INTRA-NODE (no network used)"), badge
    assert "1 node" in badge and "TCP" not in badge
    assert "the job itself runs on 1 node" in why and "'Socket' is never used" in why


async def test_the_same_lines_on_a_two_node_run_are_a_tcp_alarm(isolated_env: Path) -> None:
    # The count is the job's, both ways: on two GPU nodes the Socket NCCL chose carries the traffic.
    badge, why = await badge_after(cluster_session(gpu_nodes=2), before_the_channels(
        shared_log(SOCKET_ANNOUNCED_SINGLE_NODE)))
    assert badge.startswith(" TCP FALLBACK (Socket)  announced"), badge
    assert "across 2 nodes" in why


async def test_a_whole_single_node_log_replayed_on_a_cluster_run_stays_intra_node(isolated_env: Path) -> None:
    badge, _ = await badge_after(cluster_session(gpu_nodes=1), shared_log(SINGLE_NODE_EFA_PLUGIN))
    assert badge.startswith(" INTRA-NODE (no network used)  channels"), badge


def saved_cluster_run(gpu_nodes: int, lines: list[str]) -> str:
    store = RunStore()
    record = store.create(KubeConfig(target="kube", gpu_node_count=gpu_nodes, gpus_per_node=4))
    record.status = RunStatus.DOWN  # nothing live to ask: what the record and the spool hold
    record.jobs = [JobRecord(submission_id=f"rtui-{record.run_id}-1", submitted_at=T0, spec_hash="h",
                             status=JobState.SUCCEEDED)]
    spool = Path(record.job_spool_path())
    spool.parent.mkdir(parents=True, exist_ok=True)
    spool.write_text("".join(line + "\n" for line in lines))
    store.save(record)
    return record.run_id


def test_rtui_status_of_a_single_node_cluster_run_says_intra_node(isolated_env: Path) -> None:
    lines = before_the_channels(shared_log(SOCKET_ANNOUNCED_SINGLE_NODE))
    run_id = saved_cluster_run(1, lines)
    status = json.loads(run_rtui("status", run_id, "--json", check=True).stdout)
    transport = status["transport"]
    assert (transport["transport"], transport["nodes"]) == ("intra_node", 1), transport["reason"]
    assert transport["nodes_basis"] == "the job itself runs on 1 node"
    text = run_rtui("status", run_id, check=True).stdout
    assert "transport intra-node only (P2P/SHM/NVLS), no network used" in text and "TCP" not in text
    two = saved_cluster_run(2, lines)
    assert json.loads(run_rtui("status", two, "--json", check=True).stdout)["transport"]["transport"] == "socket"


def test_a_libfabric_provider_that_is_not_efa_is_named_on_the_badge() -> None:
    # The shared labels call it unknown (none of efa/ib/socket); the badge says which fabric it is.
    lines = ["nid000019:51404:52019 [0] NCCL INFO NET/OFI Selected Provider is cxi",
             "nid000019:51404:52019 [0] NCCL INFO Using network AWS Libfabric"]
    snap = TransportSnapshot.from_verdict(classify_lines(lines))
    assert snap.transport == "unknown" and snap.words == "NOT EFA (libfabric cxi)"
    assert TransportSnapshot.from_verdict(classify_lines(lines[1:])).words == "UNKNOWN"
