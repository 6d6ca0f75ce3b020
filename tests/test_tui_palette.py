"""The command palette (ctrl+p) is built from the bindings the footer shows (issue 24 item 5): one list of
actions, each screen's BINDINGS, feeds the footer, `?` and the palette, so they cannot drift apart."""

from __future__ import annotations

from pathlib import Path

from textual.app import App, SystemCommand
from textual.widgets._footer import FooterKey

from screens.plan import PlanScreen
from screens.target import TargetScreen
from tests.pilot_wait import wait_for
from tests.test_tui import fixed_session
from tests.test_tui_app_keys import with_resources
from tests.test_tui_plan import PlanApp, every_kind, planned
from tui.app import RtuiApp
from tui.help import HelpScreen

# The app's commands that no key runs: how to see the config and how to come back.
PALETTE_ONLY = {"Show config", "Resume command"}


def footer(app: RtuiApp) -> tuple[set[tuple[str, str]], set[str]]:
    """What the footer shows now: (description, tooltip) of the keys that act, and the dimmed keys' descriptions."""
    keys = [k for k in app.screen.query(FooterKey) if not k.has_class("-command-palette")]
    acting = {(k.description, str(k.tooltip or k.description)) for k in keys if not k.has_class("-disabled")}
    return acting, {k.description for k in keys if k.has_class("-disabled")}


def palette(app: RtuiApp) -> tuple[set[tuple[str, str]], list[SystemCommand]]:
    """The palette's own commands as (title, help), less Textual's (theme, screenshot, keys…) and the two no key
    runs, and all of them. Textual's are told by title and help: its Quit and ours share a title."""
    textuals = {(c.title, c.help) for c in App.get_system_commands(app, app.screen)}
    commands = list(app.get_system_commands(app.screen))
    return {(c.title, c.help) for c in commands
            if (c.title, c.help) not in textuals and c.title not in PALETTE_ONLY}, commands


def assert_palette_is_the_footer(app: RtuiApp) -> None:
    acting, dimmed = footer(app)
    ours, commands = palette(app)
    assert acting, "no keys in the footer: the scan is broken"
    assert ours == acting, f"footer only: {sorted(acting - ours)}; palette only: {sorted(ours - acting)}"
    assert not dimmed & {title for title, _ in ours}, "a key that does nothing now is not a command either"
    titles = [c.title for c in commands]
    assert set(titles) >= PALETTE_ONLY
    assert titles.count("Quit") == 1  # ours (asks before detaching), not Textual's too
    # Ours (every key of the screen, `?`), not also Textual's "Keys" panel: one help (issue 40 item 8).
    assert titles.count("Help") == 1 and "Keys" not in titles, titles


async def test_the_target_screen_palette_is_its_footer(isolated_env: Path) -> None:
    app = RtuiApp(with_resources(fixed_session()))
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, TargetScreen) and app.screen.query(FooterKey),
                       5, "target screen")
        await pilot.pause()  # the footer recomposes after the bindings settle
        assert_palette_is_the_footer(app)
        titles = [c.title for c in palette(app)[1]]
        assert {"Re-check", "Tear down", "Help", "Quit"} <= set(titles)


async def test_the_plan_screen_palette_follows_what_is_possible(isolated_env: Path) -> None:
    app = PlanApp(fixed_session(), every_kind())
    async with app.run_test(size=(120, 30)) as pilot:
        await planned(pilot)
        await pilot.pause()
        assert_palette_is_the_footer(app)
        assert ("Apply", "Create what the plan says and start the job") in palette(app)[0]
    read_only = PlanApp(fixed_session(), every_kind(), read_only=True)
    async with read_only.run_test(size=(120, 30)) as pilot:
        await planned(pilot)
        await pilot.pause()
        assert_palette_is_the_footer(read_only)
        assert "Apply" not in {title for title, _ in palette(read_only)[0]}


async def test_a_palette_command_runs_its_bindings_action(isolated_env: Path) -> None:
    app = PlanApp(fixed_session(), every_kind())
    async with app.run_test(size=(120, 30)) as pilot:
        screen = await planned(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"Unchanged")
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.show_unchanged, 5, "the unchanged changes shown")
        await pilot.press("ctrl+p")
        await pilot.press(*"Help")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), 5, "the help screen")
        assert isinstance(app.screen_stack[-2], PlanScreen)
