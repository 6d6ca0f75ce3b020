"""SVG snapshots of the real app (``RtuiApp``) on the aws target, each at 120x40 and 80x24.

1. A failed apply: the GPU nodegroup found no capacity (``InsufficientInstanceCapacity`` in its AZ).
   The VPC, the cluster IAM role, the EKS control plane, the system nodes and the RayCluster are done,
   the GPU nodegroup failed with the capacity message and its remedy, the GPU workers were cancelled
   because of it, and the training job was never reached (pending). The outcome line offers ``m``
   (move the GPU nodes to the next feasible AZ) and ``r`` (retry), and so does the footer.
2. The teardown modal, opened with ``D`` over that failed apply: what the run made, by layer
   (``aws: …`` and ``k8s: …``), what it costs per hour and has cost so far, and the cluster-name prompt.

The provisioning screen is ``ProvisionScreen`` with its worker replaced by a script of the runner's
events (fixed timestamps); the app opens on it with a frozen clock. Nothing here reaches AWS (a
connection attempt fails the test), and no time shown depends on the wall clock.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from textual import work
from textual.pilot import Pilot
from textual.screen import Screen

from backend.layers.base import Handler
from backend.layers.ray_job import JOB, JobHandler
from backend.ledger import BILLING, ResourceRecord, ResourceStatus
from backend.resolve import resolve_config
from backend.resources import Action, Change, EventKind, Plan, StepEvent
from backend.runner import Progress, Step
from backend.session import RunSession
from backend.store import RunStatus, RunStore
from screens.confirm import ConfirmTeardown
from screens.provision import ProvisionScreen
from targets.aws.infra.cluster import EksClusterHandler
from targets.aws.infra.common import (
    ACCESS_ENTRY,
    CLUSTER_ROLE,
    EKS_CLUSTER,
    GPU_NODES,
    IGW,
    KUBECONFIG,
    LAUNCH_TEMPLATE,
    NAT,
    NODE_ROLE,
    NODE_SG,
    PLACEMENT_GROUP,
    PRIVATE_RT,
    PUBLIC_RT,
    SYSTEM_NODES,
    VPC,
    addon_address,
    subnet_address,
)
from targets.aws.infra.iam import RoleHandler
from targets.aws.infra.network import VpcHandler
from targets.aws.infra.nodes import CapacityError, NodegroupHandler
from targets.kube.handlers import NAMESPACE, OPERATOR, PREPULL, RAYCLUSTER, WORKERS
from targets.kube.raycluster import RayClusterHandler, WorkersHandler
from tests.pilot_wait import wait_for
from tests.snap import SnapCompare
from tests.test_tui import FIXED_RUN_ID
from tui.app import RtuiApp
from tui.widgets import StepPane

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the apply starts
NOW = T0 + 3600.0  # the frozen clock: an hour in, the user presses D
SIZES = pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])

GPU_GROUP = "rtui-ray-gpu"  # Names("rtui-ray").gpu_nodegroup
CAPACITY_CAUSE = f"nodegroup {GPU_GROUP}: InsufficientInstanceCapacity in us-east-1a (AsgInstanceLaunchFailures)"
CAPACITY_REMEDY = "`rtui up --az-failover` moves the GPU nodes to the next feasible AZ"


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aws session is built from its config alone: any connection (AWS, IMDS, a cluster) fails the test."""
    def refuse(_sock: socket.socket, address: object) -> None:
        raise AssertionError(f"a snapshot test tried to connect to {address!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)


# --- the failed apply ---------------------------------------------------------------------------
async def _scripted() -> AsyncIterator[Progress]:
    raise AssertionError("the snapshot's steps are scripted, never run")
    yield Progress()  # pragma: no cover - makes this an async generator


def _step(handler: Handler, address: str, *deps: str) -> Step:
    """A step as ``planner.apply_steps`` makes it for a create: the real handler's title and duration."""
    return Step(address, handler.step_title(address, Action.CREATE), _scripted, deps=deps,
                expected_s=handler.expected_s)


def outline() -> list[Step]:
    nodegroups = NodegroupHandler()
    return [
        _step(VpcHandler(), VPC),
        _step(RoleHandler(), CLUSTER_ROLE),
        _step(EksClusterHandler(), EKS_CLUSTER, VPC, CLUSTER_ROLE),
        _step(nodegroups, SYSTEM_NODES, EKS_CLUSTER),
        _step(nodegroups, GPU_NODES, EKS_CLUSTER),
        _step(RayClusterHandler(), RAYCLUSTER, SYSTEM_NODES),
        _step(WorkersHandler(), WORKERS, RAYCLUSTER, GPU_NODES),
        _step(JobHandler(), JOB, WORKERS),
    ]


def _event(step: str, kind: EventKind, at: float, message: str = "", **more: object) -> StepEvent:
    return StepEvent.model_validate({"step": step, "kind": kind, "message": message, "ts": T0 + at, **more})


S, P, D = EventKind.STARTED, EventKind.PROGRESS, EventKind.DONE
# What the runner reports, in order, with the times a real apply takes (seconds after T0).
FAILED_APPLY = [
    _event(VPC, S, 0.0),
    _event(CLUSTER_ROLE, S, 0.0),
    _event(CLUSTER_ROLE, P, 2.4, "rtui-rtui-ray-cluster: AmazonEKSClusterPolicy attached"),
    _event(CLUSTER_ROLE, P, 3.1, "rtui-rtui-ray-cluster with AmazonEKSClusterPolicy", fraction=1.0),
    _event(CLUSTER_ROLE, D, 3.1),
    _event(VPC, P, 4.2, "vpc-0c1d2e3f4a5b6c7d8 (10.0.0.0/16, DNS on)", fraction=1.0),
    _event(VPC, D, 4.2),
    _event(EKS_CLUSTER, S, 4.3),
    _event(EKS_CLUSTER, P, 64.3, "control plane creating (about 9 min left)", fraction=0.1),
    _event(EKS_CLUSTER, P, 611.9, "control plane active after 10 min", fraction=1.0),
    _event(EKS_CLUSTER, D, 611.9),
    _event(SYSTEM_NODES, S, 612.0),
    _event(GPU_NODES, S, 612.0),
    _event(SYSTEM_NODES, P, 642.0, "nodegroup creating (about 4 min left)", fraction=0.12),
    _event(GPU_NODES, P, 642.0, "nodegroup creating (about 4 min left)", fraction=0.12),
    _event(SYSTEM_NODES, P, 801.7, "nodegroup active after 3 min", fraction=1.0),
    _event(SYSTEM_NODES, D, 801.7),
    _event(RAYCLUSTER, S, 812.0),
    _event(RAYCLUSTER, P, 813.1, "applied RayCluster/rtui/rtui-ray", fraction=0.2),
    _event(RAYCLUSTER, P, 838.5, "head ready", fraction=1.0),
    _event(RAYCLUSTER, D, 838.5),
    _event(GPU_NODES, P, 852.0, "nodegroup creating (taking longer than the usual 4 min)", fraction=0.95),
    _event(GPU_NODES, EventKind.FAILED, 918.6, CAPACITY_CAUSE, cause=CAPACITY_CAUSE, remedy=CAPACITY_REMEDY,
           error=CapacityError(CAPACITY_CAUSE, az="us-east-1a", remedy=CAPACITY_REMEDY)),
    _event(WORKERS, EventKind.CANCELLED, 918.6, f"needs {GPU_NODES}, which did not finish",
           cause=f"needs {GPU_NODES}, which did not finish"),
    # JOB: never reached (the runner stopped before it; no event, its pane stays pending).
]


class ScriptedApply(ProvisionScreen):
    """ProvisionScreen as the failed apply leaves it: the runner's events come from a script."""

    @work(exclusive=True, group="steps")
    async def run_steps(self) -> None:
        for event in FAILED_APPLY:
            self.post_message(self.StepEventPosted(event))
        self.post_message(self.Finished("apply", False))


class FailedApplyApp(RtuiApp):
    """The real app, opening on the scripted failed apply; its clock (and the panes') is frozen."""

    def get_default_screen(self) -> Screen[None]:
        return ScriptedApply(outline=outline(), clock=self.clock)


def _made(kind: str, rid: str, at: float, status: ResourceStatus = ResourceStatus.READY,
          outputs: dict[str, Any] | None = None, layer: str = "aws") -> ResourceRecord:
    return ResourceRecord(kind=kind, layer=layer, id=rid, status=status, created_at=T0 + at, updated_at=T0 + at,
                          outputs=outputs or {})


def failed_apply_session() -> RunSession:
    """A run on aws (built from its config: no AWS call) whose apply stopped at the GPU nodegroup,
    with the ledger and the priced plan that apply left behind."""
    session = RunSession.for_config(resolve_config({"target": "aws", "region": "us-east-1"}, environ={}))
    record = session.record
    record.run_id = FIXED_RUN_ID
    record.spool_path = str(RunStore().spool_dir / f"{FIXED_RUN_ID}.log")
    record.created_at = record.updated_at = T0
    record.status = RunStatus.FAILED
    azs = ("us-east-1a", "us-east-1b")
    record.resources = {
        VPC: _made("aws-vpc", "vpc-0c1d2e3f4a5b6c7d8", 1.0),
        **{subnet_address(role, az): _made("aws-subnet", f"subnet-0{role[:3]}{i}", 6.0)
           for role in ("private", "public") for i, az in enumerate(azs)},
        IGW: _made("aws-internet-gateway", "igw-0a1b2c3d", 9.0),
        NAT: _made("aws-nat-gateway", "nat-0a1b2c3d4e5f", 12.0),
        PUBLIC_RT: _made("aws-route-table", "rtb-0pub", 14.0),
        PRIVATE_RT: _made("aws-route-table", "rtb-0priv", 105.0),
        NODE_SG: _made("aws-security-group", "sg-0a1b2c3d", 6.0),
        CLUSTER_ROLE: _made("aws-iam-role", "rtui-rtui-ray-cluster", 1.0),
        NODE_ROLE: _made("aws-iam-role", "rtui-rtui-ray-nodes", 1.0),
        EKS_CLUSTER: _made("aws-eks-cluster", "rtui-ray", 5.0),
        ACCESS_ENTRY: _made("aws-access-entry", "rtui-ray/admin", 612.0),
        KUBECONFIG: _made("aws-kubeconfig", "rtui-ray", 614.0),
        **{addon_address(a): _made("aws-eks-addon", f"rtui-ray/{a}", 612.0) for a in ("vpc-cni", "kube-proxy")},
        PLACEMENT_GROUP: _made("aws-placement-group", "rtui-rtui-ray-gpu-us-east-1a", 2.0),
        LAUNCH_TEMPLATE: _made("aws-launch-template", "lt-0a1b2c3d", 8.0),
        SYSTEM_NODES: _made("aws-nodegroup", "rtui-ray/rtui-ray-system", 612.0),
        # Made, then CREATE_FAILED for want of capacity: live in the ledger until teardown deletes it,
        # billing nothing (no instance was launched), as the nodegroup handler leaves it.
        GPU_NODES: _made("aws-nodegroup", f"rtui-ray/{GPU_GROUP}", 612.0, ResourceStatus.CREATING,
                         outputs={BILLING: False}),
        NAMESPACE: _made("kube-namespace", "Namespace/rtui", 615.0, layer="kube"),
        OPERATOR: _made("kuberay-operator", "Deployment/kuberay-operator", 801.8, layer="kube"),
        PREPULL: _made("kube-image-prepull", "DaemonSet/rtui/rtui-ray-prepull", 615.0, layer="kube"),
        RAYCLUSTER: _made("raycluster", "RayCluster/rtui/rtui-ray", 813.1, layer="kube"),
    }
    record.plan = Plan(target="aws", changes=[
        Change(address=address, layer="aws", kind=record.resources[address].kind, action=Action.CREATE,
               cost_per_hour=cost)
        for address, cost in ((EKS_CLUSTER, 0.10), (NAT, 0.05), (SYSTEM_NODES, 0.2016), (GPU_NODES, 9.2032))])
    return session


async def _failed(pilot: Pilot[None]) -> ProvisionScreen:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ScriptedApply) and not pilot.app.screen.running,
                   10, "the scripted apply to finish")
    screen = pilot.app.screen
    assert isinstance(screen, ScriptedApply)
    return screen


@SIZES
def test_failed_gpu_nodegroup_snapshot(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    async def failed(pilot: Pilot[None]) -> None:
        screen = await _failed(pilot)
        assert {pane.step_id: pane.status for pane in screen.query(StepPane)} == {
            VPC: "done", CLUSTER_ROLE: "done", EKS_CLUSTER: "done", SYSTEM_NODES: "done", GPU_NODES: "failed",
            RAYCLUSTER: "done", WORKERS: "cancelled", JOB: "pending"}
        assert screen.no_capacity is not None and screen.no_capacity.az == "us-east-1a"
        assert screen.check_action("fail_over", ()) is True and screen.check_action("retry", ()) is True
        assert "m moves them" in str(screen.query_one("#outcome").render())

    assert snap_compare(FailedApplyApp(failed_apply_session(), clock=lambda: NOW), run_before=failed,
                        terminal_size=size)


@SIZES
@pytest.mark.slow
def test_teardown_modal_snapshot(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    async def teardown(pilot: Pilot[None]) -> None:
        await _failed(pilot)
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmTeardown), 5, "the teardown modal")
        modal = pilot.app.screen
        assert isinstance(modal, ConfirmTeardown)
        details = modal.details
        assert details[0].startswith("aws: aws.vpc, ") and details[1].startswith("kube: kube.namespace, ")
        assert details[-1] == "These cost $0.35/hour now ($0.32 so far)."

    assert snap_compare(FailedApplyApp(failed_apply_session(), clock=lambda: NOW), run_before=teardown,
                        terminal_size=size)
