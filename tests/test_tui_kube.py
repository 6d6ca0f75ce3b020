"""`rtui --target kube` in the TUI, driven by Pilot against the emulated API server.

The cluster runs in a thread (like ``tests/kube/conftest.py``'s ``kube_cluster``), so the
App's async workers talk to it over real HTTP on loopback; the test plays KubeRay and the
kubelets (FakeControlPlane) and the head's Jobs API (FakeRayHead) behind the service proxy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from textual.pilot import Pilot
from textual.widgets import Label, OptionList, Static

from backend.ledger import ResourceRecord
from backend.resolve import resolve_config
from backend.resources import Action, CheckResult, CheckStatus
from backend.session import RunSession
from backend.store import RunStatus, RunStore
from screens.confirm import ConfirmApply, ConfirmTeardown
from screens.plan import PlanScreen
from screens.provision import ProvisionScreen
from screens.run import RunScreen
from screens.target import TargetScreen
from targets.kube.config import KubeConfig
from targets.kube.kubeconfig import kube_contexts
from tests.fake_hub import FakeHub
from tests.kube.conftest import CONTEXT, KubeCluster
from tests.kube.crds import crd_dir
from tests.kube.fake_control import FakeControlPlane, Timings
from tests.kube.fake_ray import FakeRayHead
from tests.kube.fake_registry import FakeRegistry
from tests.pilot_wait import wait_for
from tests.snap import SnapCompare
from tui.app import RtuiApp
from tui.widgets import StepPane

SECOND = "second"
# The steps take a moment, as on a real cluster: the Provision screen is seen before the Run screen.
SLOW_ENOUGH_TO_WATCH = Timings(addon_s=0.5, pull_s=0.3, start_s=0.2)


@dataclass
class KubeWorld:
    cluster: KubeCluster
    control: FakeControlPlane
    registry: FakeRegistry
    kubeconfig: Path
    crds: Path

    def session(self, **flags: str) -> RunSession:
        return RunSession.for_config(resolve_config({
            "target": "kube", "kubeconfig": str(self.kubeconfig), "image": self.registry.image(),
            "addon_registry": self.registry.host, "kuberay_crds": str(self.crds), "steps": "5", **flags}, environ={}))


def two_contexts(cluster: KubeCluster, path: Path) -> Path:
    """The fixture's kubeconfig plus a second context (its own cluster entry, the same server)."""
    cluster.write_kubeconfig(path)
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    doc["clusters"].append({"name": SECOND, "cluster": dict(doc["clusters"][0]["cluster"])})
    doc["users"].append({"name": SECOND, "user": dict(doc["users"][0]["user"])})
    doc["contexts"].append({"name": SECOND, "context": {"cluster": SECOND, "user": SECOND, "namespace": "default"}})
    path.write_text(yaml.safe_dump(doc))
    return path


def gpu_nodes(cluster: KubeCluster, count: int = 2) -> None:
    """A system node and GPU nodes that advertise no GPUs or EFA until the device plugins run."""
    cluster.add_node("system-0", gpus=0, efa=0)
    for i in range(count):
        cluster.add_node(f"gpu-{i}", gpus=4, efa=1, labels={"node.kubernetes.io/instance-type": "g6.12xlarge"})
        # A status write is a JSON merge patch: None removes the key.
        cluster.set_status("Node", f"gpu-{i}", None, {"allocatable": {"nvidia.com/gpu": None,
                                                                      "vpc.amazonaws.com/efa": None}})


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeWorld]:
    cluster = KubeCluster()
    cluster.start()
    try:
        cluster.require_token(lambda token: token == cluster.token)
        kubeconfig = two_contexts(cluster, tmp_path / "kubeconfig")
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))  # never the user's ~/.kube/config
        monkeypatch.setenv("RTUI_CACHE_DIR", str(tmp_path / "cache"))
        head = FakeRayHead(steps=5).start()
        try:
            with FakeRegistry() as registry, FakeHub() as hub, \
                    FakeControlPlane(cluster, SLOW_ENOUGH_TO_WATCH, jobs_url=head.url) as control:
                monkeypatch.setenv("HF_ENDPOINT", hub.url)  # the Hub the plan asks for the model's commit
                yield KubeWorld(cluster, control, registry, kubeconfig, crd_dir(tmp_path))
            assert not control.errors, control.errors[:3]
        finally:
            head.stop()
    finally:
        cluster.stop()




def steps(app: RtuiApp) -> dict[str, tuple[str, str, str | None]]:
    record = app.session.record
    return {f"{phase}{k}": (v.status.value, v.message, v.error)
            for phase, states in (("", record.steps), ("teardown ", record.teardown_steps)) for k, v in states.items()}


def target_screen(app: RtuiApp) -> TargetScreen | None:
    """The TargetScreen once its checks have finished."""
    screen = app.screen
    return screen if isinstance(screen, TargetScreen) and screen.checks is not None else None


def picker(app: RtuiApp) -> OptionList:
    return app.screen.query_one("#contexts", OptionList)


def contexts_shown(app: RtuiApp) -> int:
    return picker(app).option_count if isinstance(app.screen, TargetScreen) else 0


def checks_of(screen: TargetScreen) -> dict[str, CheckResult]:
    return {c.id: c for c in screen.checks or []}


def test_kube_contexts_lists_servers_and_the_current_one(world: KubeWorld) -> None:
    contexts, current = kube_contexts(str(world.kubeconfig))
    assert current == CONTEXT
    assert [(c.name, c.server) for c in contexts] == [(CONTEXT, world.cluster.url), (SECOND, world.cluster.url)]


@pytest.mark.slow
async def test_pilot_drives_the_kube_flow_at_80x24_and_switches_context(world: KubeWorld,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_nodes(world.cluster)
    provisioned: list[set[str]] = []
    mount = ProvisionScreen.on_mount

    def on_mount(screen: ProvisionScreen) -> None:
        provisioned.append({p.step_id for p in screen.query(StepPane)})
        mount(screen)

    monkeypatch.setattr(ProvisionScreen, "on_mount", on_mount)
    app = RtuiApp(world.session())
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: target_screen(app) and contexts_shown(app) == 2, 15, "checks and contexts")
        first = target_screen(app)
        assert first is not None
        assert picker(app).has_focus and picker(app).highlighted == 0  # the kubeconfig's current context
        checks = checks_of(first)
        assert f"context {CONTEXT} at {world.cluster.url}" in (checks["kube.access"].detail or "")
        # The allocatable check: the GPU nodes do not advertise GPUs yet (no device plugin runs there).
        assert checks["kube.gpu-nodes"].status is CheckStatus.WARN
        assert "allocatable nvidia.com/gpu is 0" in (checks["kube.gpu-nodes"].detail or "")
        assert "GPU nodes" in str(first.query_one("#checks", Static).render())
        # The keys at 80×24: c brings the picker back, r checks again.
        await pilot.press("tab")
        assert not picker(app).has_focus
        await pilot.press("c", "r")
        assert picker(app).has_focus
        await wait_for(pilot, lambda: target_screen(app), 15, "the checks again")

        await pilot.press("down", "enter")  # the second context: a new session, checked again
        await wait_for(pilot, lambda: KubeConfig.of(app.session.config).context == SECOND
                       and target_screen(app) not in (None, first) and contexts_shown(app) == 2, 15,
                       "the second context")
        second = target_screen(app)
        assert second is not None
        assert f"context {SECOND} at {world.cluster.url}" in (checks_of(second)["kube.access"].detail or "")
        assert picker(app).highlighted == 1 and len(app.screen_stack) <= 2

        await pilot.press("enter")  # Enter on the context in use goes on to the plan
        await wait_for(pilot, lambda: isinstance(app.screen, PlanScreen) and app.screen.plan, 15, "the plan")
        assert isinstance(app.screen, PlanScreen) and app.screen.plan is not None
        plan = app.screen.plan
        assert plan.layers() == ["kube", "ray-job"]
        shown = str(app.screen.query_one("#plan", Static).render())
        assert "kube" in shown and "kube.raycluster" in shown and "ray.job.train" in shown

        await pilot.press("a")
        # It installs the operator and device plugins on a cluster others share: asked twice (issue 40 item 7).
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmApply), 10, "the apply confirmation")
        assert "kube.kuberay-operator" in " ".join(str(label.render()) for label in app.screen.query(Label))
        await pilot.press("y")
        # The panes as the provision screen mounts them: on a fast fake cluster the screen can come and go
        # between two polls, so it is not looked for on screen.
        await wait_for(pilot, lambda: provisioned, 20, lambda: f"the provision screen (on {type(app.screen).__name__}; "
                                                               f"notes: {[n.message for n in app._notifications]})")
        panes = provisioned[0]
        assert panes == {c.address for c in plan.changes if c.action is not Action.NOOP}
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), 120, lambda: f"the run screen: {steps(app)}")
        run = app.screen
        assert isinstance(run, RunScreen)
        await wait_for(pilot, lambda: run.job_status == "SUCCEEDED", 60, "the job to succeed")
        await wait_for(pilot, lambda: run.metric is not None and run.metric.step == 5, 10, "the last metric")
        # The GPU side now (issue 26): the workers and their nodes, at full size while the job is fresh.
        await wait_for(pilot, lambda: run.gpu_fleet is not None, 15, "the GPU workers and nodes")
        shown = str(run.query_one("#job-status", Static).render())
        # Issue 40 item 5: "workers 2/2" beside a config of 8 workers and a badge of 8 ranks read as a
        # contradiction: these are the Ray worker pods, and the training ranks are said beside them.
        ranks = app.session.config.effective_workers()
        assert f"GPU nodes 2/2, Ray worker pods 2/2 · {ranks} training ranks" in shown, shown
        record = app.session.record
        assert KubeConfig.of(RunStore().load(record.run_id).config).context == SECOND

        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmTeardown), 5, "the confirm modal")
        await pilot.press(*"rtui-ray", "enter")
        await wait_for(pilot, lambda: "down" in str(app.sub_title), 120, lambda: f"teardown: {steps(app)}")
        assert RunStore().load(record.run_id).status is RunStatus.DOWN
        assert not world.cluster.objects("RayCluster")
        await pilot.press("q")
    assert app.return_code == 0


@pytest.mark.parametrize("kubeconfig", ["missing", "broken"])
@pytest.mark.slow
async def test_a_bad_kubeconfig_is_one_line_in_the_checks_and_enter_is_refused(
        world: KubeWorld, tmp_path: Path, kubeconfig: str) -> None:
    path = tmp_path / "bad-kubeconfig"
    if kubeconfig == "broken":
        path.write_text("clusters: [oops\n")
    app = RtuiApp(world.session(kubeconfig=str(path)))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: target_screen(app), 15, "checks")
        shown = str(app.screen.query_one("#checks", Static).render())
        expected = "no kubeconfig found" if kubeconfig == "missing" else "is malformed"
        assert "✗ Kubernetes API" in shown and expected in shown, shown
        assert "--kubeconfig" in shown  # the remedy
        await wait_for(pilot, lambda: picker(app).disabled, 5, "the picker's error")
        assert "no contexts" in str(picker(app).get_option_at_index(0).prompt)
        await pilot.press("enter")
        await wait_for(pilot, lambda: any(n.message.startswith("Kubernetes API: ") for n in app._notifications), 5,
                       "the notification")
        assert isinstance(app.screen, TargetScreen)
        await pilot.press("q")
    assert app.return_code == 0


@pytest.mark.slow
async def test_context_switch_is_refused_once_the_run_has_resources(world: KubeWorld) -> None:
    """The run's resources live in the cluster it was applied to: another context would lose them."""
    session = world.session()
    session.record.resources["kube.namespace"] = ResourceRecord(kind="kube-namespace", id="rtui")
    app = RtuiApp(session)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: target_screen(app) and contexts_shown(app) == 2, 15, "the target screen")
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: any("already has resources" in n.message for n in app._notifications), 5,
                       "the refusal")
        assert app.session is session and KubeConfig.of(session.config).context is None


SNAPSHOT_RUN_ID = "r20260101-000000-cafe"
SNAPSHOT_CHECKS = [
    CheckResult(id="kube.access", title="Kubernetes API", status=CheckStatus.OK,
                detail="context kmock at https://127.0.0.1:6443, 3 nodes"),
    CheckResult(id="kube.gpu-nodes", title="GPU nodes", status=CheckStatus.WARN,
                detail="node gpu-0: allocatable nvidia.com/gpu is 0 (the NVIDIA device plugin is not running there) "
                       "(checked again once the device plugins run)",
                remedy="--require-transport any runs without EFA"),
]


def test_kube_target_screen_snapshot(snap_compare: SnapCompare, tmp_path: Path) -> None:
    """The picker and the checks at 80×24. The checks are fixed (no server is contacted), the run id too."""
    kubeconfig = tmp_path / "kubeconfig"
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": CONTEXT,
           "clusters": [{"name": n, "cluster": {"server": "https://127.0.0.1:6443"}} for n in (CONTEXT, SECOND)],
           "users": [{"name": CONTEXT, "user": {"token": "t"}}],
           "contexts": [{"name": n, "context": {"cluster": n, "user": CONTEXT}} for n in (CONTEXT, SECOND)]}
    kubeconfig.write_text(yaml.safe_dump(doc))
    session = RunSession.for_config(resolve_config({"target": "kube", "kubeconfig": str(kubeconfig)}, environ={}))
    session.record.run_id = SNAPSHOT_RUN_ID

    async def fixed_checks() -> list[CheckResult]:
        return SNAPSHOT_CHECKS

    session.preflight = fixed_checks

    async def loaded(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, RtuiApp)
        await wait_for(pilot, lambda: target_screen(app) and contexts_shown(app) == 2, 10, "checks and contexts")

    assert snap_compare(RtuiApp(session), run_before=loaded, terminal_size=(80, 24))


@pytest.mark.parametrize("server", ["refuses", "never answers"])
@pytest.mark.slow
async def test_an_unreachable_api_server_is_one_line_in_the_checks_within_the_deadline(
        world: KubeWorld, tmp_path: Path, server: str) -> None:
    """Issue 19, item 8: the server and the context in one line, within --kube-timeout-s, no crash."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog) and never answers
    url = "https://127.0.0.1:9" if server == "refuses" else f"https://127.0.0.1:{listener.getsockname()[1]}"
    doc: dict[str, Any] = yaml.safe_load(world.kubeconfig.read_text())
    for entry in doc["clusters"]:
        entry["cluster"]["server"] = url
    path = tmp_path / "gone"
    path.write_text(yaml.safe_dump(doc))
    app = RtuiApp(world.session(kubeconfig=str(path), kube_timeout_s="1"))
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: target_screen(app), 15, "checks")
            shown = str(app.screen.query_one("#checks", Static).render())
            # One check: the server in its line, the context in its remedy (the CLI's one line, in two).
            assert shown.count("✗") == 1 and f"Kubernetes API server at {url}" in shown, shown
            assert f"context {CONTEXT!r}" in shown, shown
            assert "Traceback" not in shown
            # The 1 s deadline, not the default 10 s: the error names it, and a server that never answers
            # was given up on by urllib3's own read timeout of 1 s (its words). Wall time from the app's
            # start is no measure of it on a loaded machine (9.5 s seen on CI for a 1 s wait).
            assert "within 1s" in shown, shown
            if server == "never answers":
                assert "(read timeout=1.0)" in shown, shown
            await pilot.press("enter")
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()  # the key handled and the app idle: still on the first screen
            assert isinstance(app.screen, TargetScreen)  # nothing to go on with
            await pilot.press("q")
    finally:
        listener.close()
    assert app.return_code == 0
