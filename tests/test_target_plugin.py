"""A fourth target, defined in this file alone, through the real `rtui` binary (issue 24).

Nothing in the product names it: an installed package's entry point in the ``rtui.targets``
group registers it (README, "Targets"). Here that package is a ``.dist-info`` on PYTHONPATH whose
entry point names ``ToyTarget`` below; its one layer writes a marker file into a folder the test
gives it (``TOY_WORLD``), and tearing down removes it. ``rtui plan``, ``up --yes``, ``status`` and
``down --yes`` then run it as they run the built-in targets.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import ConfigDict, Field
from textual.binding import Binding

import targets
from backend import flows
from backend.config import RunConfig
from backend.delivery import DataStore, LocalDirStore
from backend.errors import NoCapacity
from backend.layers.base import Context, Handler, Layer
from backend.ledger import ResourceStatus
from backend.planner import Stack
from backend.record import Facts
from backend.resolve import resolve_config
from backend.resources import EventKind, Observed, Resource
from backend.runner import Progress
from backend.session import RunSession
from targets import Defaults, Target
from tests.conftest import REPO, run_rtui
from tui.target_panel import Reconfigure, TargetPanel

MARKER = "toyfile.marker"


class ToyConfig(RunConfig):
    """The toy's own settings: a flag (--toy-world), a RTUI_TOY_WORLD variable and a rtui.toml key, made by rtui
    from this model; no file of rtui's names them."""

    toy_world: str = Field(default="", description="The toy's cloud: a folder its marker files go to")


def world(config: RunConfig) -> Path:
    """The toy's "cloud": the folder its own setting names (the environment's when a test sets none)."""
    return Path(ToyConfig.of(config).toy_world or os.environ["TOY_WORLD"])


def toy_data(config: RunConfig, run_id: str) -> Path:
    """Where a toy run's data goes: its world's data folder (what its data store reads, keeps and deletes)."""
    return world(config) / "data" / run_id


class ToyStore(LocalDirStore):
    """The toy's data store: a folder of its world, kept by `rtui down`, deleted with --delete-data."""


class MarkerHandler(Handler):
    kind = "toy-marker"
    title = "Write the marker file"

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        path = Path(want.spec["path"])
        path.write_text(ctx.record.run_id + "\n")
        data = toy_data(ctx.config, ctx.record.run_id)  # what a job leaves: the run's data
        data.mkdir(parents=True, exist_ok=True)
        (data / "weights.bin").write_bytes(b"\0" * 4096)
        ctx.ledger.update(want.address, status=ResourceStatus.CREATING, id=str(path))
        yield Progress("written", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        Path(have.id).unlink(missing_ok=True)
        yield Progress("removed", 1.0)


class MarkerLayer(Layer):
    name = "toyfile"
    _handlers: ClassVar[dict[str, Handler]] = {MarkerHandler.kind: MarkerHandler()}

    @property
    def handlers(self) -> Mapping[str, Handler]:
        return self._handlers

    def desired(self, ctx: Context, below: Sequence[Resource]) -> list[Resource]:
        path = world(ctx.config) / f"{ctx.config.cluster_name}.marker"
        return [Resource(address=MARKER, layer=self.name, kind=MarkerHandler.kind, spec={"path": str(path)})]

    async def discover(self, ctx: Context) -> list[Observed]:
        path = world(ctx.config) / f"{ctx.config.cluster_name}.marker"
        if not path.is_file() or path.read_text().strip() != ctx.record.run_id:
            return []
        return [Observed(address=MARKER, layer=self.name, kind=MarkerHandler.kind, id=str(path),
                         state={"path": str(path)})]


class ToyPanel(TargetPanel):
    """The toy's part of the first screen: its world beside the configuration, and a key that moves the run
    to the world next door (the App re-checks the run so configured: one generic message)."""

    bindings = (Binding("w", "panel('next_world')", "Next world", id="next_world"),)

    def config_rows(self) -> list[tuple[str, str]]:
        return [("toy world", str(world(self.screen.session.config)))]

    def act(self, action: str) -> None:
        here = world(self.screen.session.config)
        self.screen.post_message(Reconfigure({"toy_world": str(here.with_name(here.name + "-next"))},
                                             f"world {here}", "or start rtui with --toy-world"))


class ToyTarget(Target[ToyConfig]):
    name = "toy"
    config_model = ToyConfig
    panel = f"{__name__}:ToyPanel"
    label = "Toy — a marker file in a folder (tests/test_target_plugin.py)"
    on_gpus = False
    offline = True
    shared_disk = True
    bench_variants = ("gloo",)

    def stack(self, config: ToyConfig) -> Stack:
        return Stack(self.name, [MarkerLayer()])

    def data_store(self, state_root: Path, run_id: str, config: ToyConfig, *,
                   ctx: Context | None = None) -> DataStore | None:
        return ToyStore(toy_data(config, run_id))

    def defaults(self, config: ToyConfig) -> Defaults:
        return Defaults(batch_size=4, precision="fp32", learning_rate=1e-3, model_id=None, workers=1, shard_size=1,
                        require_transport="any")


def install_plugin(site: Path) -> None:
    """What `pip install` of a package declaring the entry point leaves on the path."""
    info = site / "rtui_toy_target-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rtui-toy-target\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[rtui.targets]\ntoy = {__name__}:ToyTarget\n")


@pytest.mark.slow
def test_a_fourth_target_is_a_folder_and_an_entry_point(tmp_path: Path) -> None:
    site, toy_world = tmp_path / "site", tmp_path / "world"
    install_plugin(site)
    toy_world.mkdir()
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "RTUI_TOY_WORLD": str(toy_world)}
    marker = toy_world / "rtui-ray.marker"

    unknown = run_rtui("plan", "--target", "nope", env=env)
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1, unknown.stderr
    assert "expected one of local, aws, kube, toy" in unknown.stderr

    help_text = run_rtui("plan", "--help", env=env, check=True).stdout
    assert "toy target:" in help_text and "--toy-world" in help_text, help_text  # its own flag, from its model
    elsewhere = run_rtui("plan", "--target", "local", "--toy-world", str(toy_world), env=env)
    assert elsewhere.returncode == 2 and "--toy-world is a setting of the toy target" in elsewhere.stderr

    plan = run_rtui("plan", "--target", "toy", env=env, check=True)
    assert f"+ {MARKER}" in plan.stdout and "1 to create" in plan.stdout, plan.stdout
    assert not marker.exists()

    up = run_rtui("up", "--yes", "--target", "toy", env=env, check=True)
    run_id = marker.read_text().strip()
    assert run_id and run_id in up.stdout, up.stdout

    status = json.loads(run_rtui("status", "--json", "--target", "toy", env=env, check=True).stdout)
    assert status["run_id"] == run_id and status["target"] == "toy" and status["status"] == "up"
    assert status["resources"][MARKER]["status"] == "ready"

    again = run_rtui("plan", "--target", "toy", env=env, check=True)
    assert "0 to create" in again.stdout and "1 unchanged" in again.stdout, again.stdout

    # Without the package its name is unknown again, and its live run says what is missing in one line.
    without = {"PYTHONPATH": str(REPO)}
    gone = run_rtui("plan", "--target", "toy", env=without)
    assert gone.returncode == 2 and "expected one of local, aws, kube" in gone.stderr, gone.stderr
    for args in (("status",), ("down", "--yes")):
        orphaned = run_rtui(*args, env=without)
        assert orphaned.returncode == 1 and orphaned.stderr.count("\n") == 1, orphaned.stderr
        assert f"run {run_id} is on the toy target" in orphaned.stderr and "Traceback" not in orphaned.stderr
    assert marker.exists()

    down = run_rtui("down", "--yes", "--target", "toy", env=env, check=True)
    assert not marker.exists()
    status = json.loads(run_rtui("status", "--json", run_id, env=env, check=True).stdout)
    assert status["status"] == "down"
    # Its data store: kept by `down` and said so, deleted on request.
    data = toy_world / "data" / run_id
    assert (data / "weights.bin").is_file() and "kept on purpose" in down.stdout, down.stdout
    run_rtui("down", run_id, "--yes", "--delete-data", env=env, check=True)
    assert not data.exists()


# --- a target's own failover policy, caught by the error's type --------------------------------------
FULL_ZONES = {"zone-a"}


class ZonedMarkerHandler(MarkerHandler):
    kind = "toy-zoned-marker"

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        zone = want.spec["zone"]
        if zone in FULL_ZONES:  # what a provider says when it has no machines there
            raise NoCapacity(f"no room for the marker in {zone}", az=zone, code="ToyFull")
        async for p in super().create(ctx, want):
            yield p


class ToyFacts(Facts):
    """The zoned toy's own facts in the run's record: where its marker went."""

    model_config = ConfigDict(extra="forbid")

    zone: str | None = None


class ZonedMarkerLayer(MarkerLayer):
    _handlers: ClassVar[dict[str, Handler]] = {ZonedMarkerHandler.kind: ZonedMarkerHandler()}

    def desired(self, ctx: Context, below: Sequence[Resource]) -> list[Resource]:
        zone = ToyFacts.of(ctx.record.facts).zone or "zone-a"
        path = world(ctx.config) / f"{ctx.config.cluster_name}.marker"
        return [Resource(address=MARKER, layer=self.name, kind=ZonedMarkerHandler.kind,
                         spec={"path": str(path), "zone": zone})]


class ZonedToyTarget(ToyTarget):
    name = "zonedtoy"
    facts_model = ToyFacts

    def stack(self, config: ToyConfig) -> Stack:
        return Stack(self.name, [ZonedMarkerLayer()])

    def fail_over(self, stack: Stack, ctx: Context, error: NoCapacity, *, elsewhere: bool = True,
                  on_demand: bool | None = True) -> str | None:
        if not elsewhere:
            return None
        ToyFacts.of(ctx.record.facts).zone = "zone-b"
        ctx.store.save(ctx.record)
        return f"{error.code} in {error.az}: the marker moves to zone-b"


@pytest.fixture
def zoned_toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The zoned toy registered in this process, as a built-in line would register it."""
    monkeypatch.setitem(targets.BUILTIN, ZonedToyTarget.name, f"{__name__}:ZonedToyTarget")
    monkeypatch.setenv("TOY_WORLD", str(tmp_path))
    targets.get.cache_clear()
    yield tmp_path
    targets.get.cache_clear()


async def test_no_capacity_is_caught_by_type_and_the_target_fails_over(zoned_toy: Path) -> None:
    session = RunSession.for_config(resolve_config({"target": ZonedToyTarget.name}))
    events = [e async for e in flows.up(session, az_failover=True)]
    failed = [e for e in events if e.kind is EventKind.FAILED and e.step == MARKER]
    assert len(failed) == 1 and isinstance(failed[0].error, NoCapacity) and failed[0].error.az == "zone-a"
    assert "error" not in failed[0].model_dump(mode="json")  # the error object is never written anywhere
    moved = [e.data["failover"] for e in events if "failover" in e.data]
    assert moved == ["ToyFull in zone-a: the marker moves to zone-b"]
    assert events[-1].kind is EventKind.DONE
    assert (zoned_toy / "rtui-ray.marker").read_text().strip() == session.run_id
    assert session.record.resources[MARKER].status is ResourceStatus.READY


async def test_a_message_that_names_no_capacity_is_not_a_capacity_failure(zoned_toy: Path) -> None:
    """Only the type counts: a failure whose text merely names a capacity code does not move anything."""
    FULL_ZONES.clear()
    try:
        session = RunSession.for_config(resolve_config({"target": ZonedToyTarget.name}))

        async def refuse(ctx: Context, want: Resource) -> AsyncIterator[Progress]:
            from backend.errors import OperationError

            raise OperationError("InsufficientInstanceCapacity was in the text of an unrelated failure")
            yield Progress("never")

        handler = session.stack.layers[0].handlers[ZonedMarkerHandler.kind]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(handler, "create", refuse)
            events = [e async for e in flows.up(session, az_failover=True)]
        assert not [e for e in events if "failover" in e.data] and events[-1].kind is EventKind.FAILED
        assert ToyFacts.of(session.record.facts).zone is None
    finally:
        FULL_ZONES.add("zone-a")


async def test_the_toy_panel_shows_its_world_and_its_key_reconfigures_the_run(zoned_toy: Path) -> None:
    """Its panel on the first screen, from its module: its row beside the configuration, its key in the
    footer, and the run checked afresh with its own setting changed (Reconfigure through the App)."""
    from screens.target import TargetScreen
    from tests.pilot_wait import screen_text, wait_for
    from tui.app import RtuiApp

    session = RunSession.for_config(resolve_config({"target": ZonedToyTarget.name, "toy_world": str(zoned_toy)},
                                                   environ={}))
    app = RtuiApp(session)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, TargetScreen) and app.screen.checks is not None, 15,
                       "the first screen's checks")
        first = app.screen
        assert isinstance(first, TargetScreen) and isinstance(first.panel, ToyPanel)
        def shown() -> bool:  # its row and its key, once the screen has drawn them
            text = "\n".join(screen_text(pilot))
            return "toy world" in text and "w Next world" in text

        await wait_for(pilot, shown, 15, lambda: "the toy panel's row and its key in the footer; the screen shows:\n"
                       + "\n".join(screen_text(pilot)))
        await pilot.press("w")
        await wait_for(pilot, lambda: app.screen is not first and isinstance(app.screen, TargetScreen), 15,
                       "the run checked again in the next world")
        moved = ToyConfig.of(app.session.config)
        assert moved.toy_world == f"{zoned_toy}-next" and app.session.run_id == session.run_id
