"""App-wide keys and commands: `D` from any screen of a run with resources (with what it deletes and
its cost), the palette's own commands, --read-only, the resume picker, and the detach command."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from textual import work
from textual.app import SystemCommand

from backend.ledger import ResourceStatus
from backend.resources import Action, Change, Plan
from backend.session import RunSession
from backend.store import RunStatus
from screens.confirm import ConfirmTeardown, PickRun
from tests.pilot_wait import wait_for
from tests.test_tui import fixed_session
from tui.app import RtuiApp
from tui.config_view import ConfigScreen
from tui.invocation import rtui_command


def with_resources(session: RunSession) -> RunSession:
    """A run that made two priced resources about an hour ago (as an aws apply records them).

    3,597 s ago, so the GPU nodes' $9.2032/hour has cost $9.1955 and reads "$9.20 so far" for the next
    3.8 s of the test; made exactly an hour ago it read "$9.21" once 0.7 s had passed, which a loaded
    machine took (a `make test-fast` run failed so). The cost meter reads the real clock."""
    session.store.save(session.record)
    ledger = session.ctx.ledger
    ledger.set("aws.nodegroup.gpu", "aws-nodegroup", ResourceStatus.READY, layer="aws", id="c/gpu")
    ledger.set("aws.vpc", "aws-vpc", ResourceStatus.READY, layer="aws", id="vpc-1")
    for entry in session.record.resources.values():
        entry.created_at = time.time() - 3597
    session.record.plan = Plan(target="aws", changes=[
        Change(address="aws.nodegroup.gpu", layer="aws", kind="aws-nodegroup", action=Action.CREATE,
               cost_per_hour=9.2032),
        Change(address="aws.vpc", layer="aws", kind="aws-vpc", action=Action.CREATE, cost_per_hour=0)])
    session.record.status = RunStatus.UP
    session.store.save(session.record)
    return session


async def test_teardown_key_is_hidden_without_resources_and_in_read_only(isolated_env: Path) -> None:
    app = RtuiApp(fixed_session())
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "target screen")
        assert app.check_action("teardown", ()) is False
        await pilot.press("D")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()  # the key handled and the app idle: no modal came (waits on idle, not a fixed time)
        assert not isinstance(app.screen, ConfirmTeardown)
    read_only = RtuiApp(with_resources(fixed_session()), read_only=True)
    async with read_only.run_test(size=(100, 30)) as pilot:
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()  # the app idle: mounted and checked (waits on idle, not a fixed time)
        assert read_only.check_action("teardown", ()) is False
        titles = [c.title for c in read_only.get_system_commands(read_only.screen)]
        assert "Tear down" not in titles


async def test_teardown_from_the_first_screen_lists_what_goes_and_its_cost(isolated_env: Path) -> None:
    app = RtuiApp(with_resources(fixed_session()))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "target screen")
        assert app.check_action("teardown", ()) is True
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmTeardown), 5, "the teardown modal")
        modal = app.screen
        assert isinstance(modal, ConfirmTeardown)
        text = "\n".join(modal.details)
        assert "aws: aws.nodegroup.gpu, aws.vpc" in text  # grouped by the layer each resource records
        assert "$9.20/hour now ($9.20 so far)" in text
        await pilot.press("escape")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()  # the key handled and the app idle: the modal is gone (waits on idle, not a fixed time)
        assert not isinstance(app.screen, ConfirmTeardown)


async def test_the_palette_holds_the_apps_own_commands(isolated_env: Path) -> None:
    app = RtuiApp(with_resources(fixed_session()))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "target screen")
        commands: list[SystemCommand] = list(app.get_system_commands(app.screen))
        titles = [c.title for c in commands]
        assert {"Tear down", "Re-check", "Show config", "Resume command", "Quit"} <= set(titles)
        assert titles.index("Tear down") < titles.index("Theme")  # Textual's own stay, after ours


async def test_resume_with_several_live_runs_asks_which(isolated_env: Path) -> None:
    older = with_resources(fixed_session())
    newer = fixed_session(cluster_name="second")
    newer.record.run_id = "r20260102-000000-cafe"
    newer.record.status = RunStatus.UP
    newer.store.save(newer.record)
    app = RtuiApp(newer, resume=True, choose_from=[newer.run_id, older.run_id])
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, PickRun), 5, "the run picker")
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: app.session.run_id == older.run_id, 5, "the older run")
        assert older.run_id in app.sub_title


def test_the_detach_command_works_from_where_the_user_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv_bin = tmp_path / "proj" / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "rtui").write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path / "proj")
    monkeypatch.setattr(sys, "argv", [str(venv_bin / "rtui")])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert rtui_command() == os.path.join(".venv", "bin", "rtui")
    monkeypatch.setenv("PATH", str(venv_bin))
    os.chmod(venv_bin / "rtui", 0o755)
    assert rtui_command() == "rtui"


async def show_config(pilot: Any) -> ConfigScreen:
    app = pilot.app
    await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "target screen")
    command = next(c for c in app.get_system_commands(app.screen) if c.title == "Show config")
    command.callback()
    await wait_for(pilot, lambda: isinstance(app.screen, ConfigScreen), 5, "the config shown")
    screen = app.screen
    assert isinstance(screen, ConfigScreen)
    return screen


@pytest.mark.slow
async def test_show_config_is_what_the_job_runs_with(isolated_env: Path) -> None:
    """The palette's Show config: effective values with their source, only the run target's fields (item 3)."""
    app = RtuiApp(fixed_session())
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await show_config(pilot)
        text = screen.text()
        assert not app._notifications  # a screen of its own, not a toast that hides itself
    assert "learning_rate  0.001  auto on local" in text, text
    assert "batch_size  32  auto on local" in text and "precision  fp32  auto on local" in text
    assert "learning_rate  0.0 " not in text and "precision  auto" not in text
    assert "region" not in text and "gpu_node_type" not in text and "kubernetes_version" not in text


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_show_config_fits_the_terminal_and_escape_closes_it(isolated_env: Path, size: tuple[int, int]) -> None:
    """Issue 40 item 4: it opened as a 20 s toast that escape did not close, its title and first ~15 fields
    above an 80×24 screen. Now its heading is on screen, the fields scroll under it, escape closes it."""
    app = RtuiApp(fixed_session())
    async with app.run_test(size=size) as pilot:
        screen = await show_config(pilot)
        await pilot.pause()
        heading = screen.query_one("#config-heading")
        assert 0 <= heading.region.y < size[1] and heading.region.height >= 1, heading.region
        assert "Config of run" in str(heading.render())
        body = screen.query_one("#config-fields")
        assert body.region.bottom <= size[1] and body.region.y > heading.region.y
        first = screen.rows[0][0]
        assert first in screen.text().splitlines()[0]  # the first field is the first line shown
        await pilot.press("end")
        # `end` animates the scroll: one pause was not always enough in a loaded run of `make test-fast`.
        await wait_for(pilot, lambda: body.scroll_y == body.max_scroll_y, 5, "end to scroll to the last field")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfigScreen), 5, "escape closes it")


async def test_no_key_is_offered_while_steps_run_that_would_be_refused(isolated_env: Path) -> None:
    """While steps run: no `r Retry` (it retries only after a failure); `D` stays during an apply (it
    stops it and tears down) but not during a teardown already running (issue 21, item 5)."""
    from screens.provision import Mode, ProvisionScreen

    class Running(ProvisionScreen):
        @work(exclusive=True, group="steps")
        async def run_steps(self) -> None:
            """Steps that never finish: the screen stays running."""

    modes: tuple[tuple[Mode, bool], ...] = (("apply", True), ("teardown", False))
    for mode, teardown_offered in modes:
        class RunningApp(RtuiApp):
            def get_default_screen(self) -> Running:
                return Running(mode=mode)  # noqa: B023 - used in this iteration

        app = RunningApp(with_resources(fixed_session()))
        async with app.run_test(size=(100, 30)) as pilot:
            shown = app
            await wait_for(pilot, lambda: isinstance(shown.screen, Running), 5, "the running steps")  # noqa: B023
            screen = app.screen
            assert isinstance(screen, Running) and screen.running
            assert screen.check_action("retry", ()) is False, mode
            assert app.check_action("teardown", ()) is teardown_offered, mode


async def test_no_capacity_on_a_target_that_cannot_move_offers_only_a_retry(isolated_env: Path) -> None:
    """The steps screen's `m` and its words come from the run's target (``Target.fail_over_words``): the
    local target moves nothing, so a NoCapacity there offers r only and names no provider (issue 38)."""
    from backend.errors import NoCapacity
    from screens.provision import ProvisionScreen

    app = RtuiApp(fixed_session())
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "the target screen")
        screen = ProvisionScreen(mode="apply")
        screen.running, screen.ok = False, False
        screen.no_capacity = NoCapacity("no capacity for the machines", az="here")
        assert app.session.target.fail_over_words is None
        assert screen.check_action("fail_over", ()) is False
        assert screen.check_action("retry", ()) is True


async def test_a_torn_down_run_says_so_in_the_header_at_80_columns(isolated_env: Path) -> None:
    """Issue 40 item 8: at 80 columns the title lost its "· down" marker (cut off after the run's id)."""
    from textual.widgets._header import HeaderTitle

    session = fixed_session(target="aws", region="us-east-1")
    session.record.status = RunStatus.DOWN
    session.store.save(session.record)
    app = RtuiApp(session)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        title = app.screen.query_one(HeaderTitle)
        text = str(title.render())
        shown = text[:title.region.width] if len(text) <= title.region.width else text[:title.region.width - 1]
        assert "· down" in shown, (shown, text)
