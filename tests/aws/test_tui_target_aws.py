"""The aws target screen against moto over real HTTP: the feasibility matrix, the AZ choice, the quota request."""

from __future__ import annotations

import pytest
from textual.message import Message
from textual.pilot import Pilot
from textual.widgets import Static

from backend.resolve import resolve_config
from backend.session import RunSession
from screens.target import TargetScreen
from targets.aws.config import AwsConfig
from targets.aws.matrix import AzMatrix, FeasibilityPanel
from targets.aws.panel import MatrixPanel
from targets.aws.quota_modal import ConfirmQuotaIncrease
from tests.aws.conftest import G, World, image_env
from tests.pilot_wait import wait_for
from tests.snap import SnapCompare
from tui.app import RtuiApp
from tui.target_panel import Reconfigure

FIXED_RUN_ID = "r20260101-000000-a2a2"


def aws_session(**flags: str) -> RunSession:
    session = RunSession.for_config(resolve_config({"target": "aws", "region": "us-east-1", "allow_unpinned": "true",
                                                    "model_revision": "0" * 40, **flags}, environ=image_env()))
    session.record.run_id = FIXED_RUN_ID
    return session




def checked(app: RtuiApp) -> TargetScreen | None:
    """The TargetScreen once its checks (and so its matrix) have finished."""
    screen = app.screen
    return screen if isinstance(screen, TargetScreen) and screen.checks is not None else None


def matrix(app: RtuiApp) -> AzMatrix:
    return app.screen.query_one(AzMatrix)


def prompt(app: RtuiApp, option_id: str) -> str:
    return str(matrix(app).get_option(option_id).prompt)


async def test_the_matrix_fills_live_shows_why_an_az_is_blocked_and_preselects_the_recommendation(
        world: World) -> None:
    seen: list[str] = []

    def hook(message: Message) -> None:
        seen.append(type(message).__name__)

    app = RtuiApp(aws_session())
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        await wait_for(pilot, lambda: checked(app), 30, "the matrix")
        screen = checked(app)
        assert screen is not None and isinstance(screen.panel, MatrixPanel)
        assert screen.panel.report is not None  # the typed report, not a list of checks
        # The region arrived on its own, before the checks finished.
        assert seen.index("RegionsListed") < seen.index("RegionChecked") < seen.index("ChecksFinished")
        snapshot = matrix(app).snapshot
        assert [name for name, _ in snapshot.regions] == ["us-east-1"] and snapshot.finished
        blocked = matrix(app).get_option("us-east-1/us-east-1e")
        assert blocked.disabled and "g6.12xlarge is not offered in us-east-1e" in str(blocked.prompt)
        assert snapshot.recommended == ("us-east-1", "us-east-1a")
        highlighted = matrix(app).highlighted_option
        assert highlighted is not None and highlighted.id == "us-east-1/us-east-1a"
        assert matrix(app).has_focus
        row = prompt(app, "us-east-1/us-east-1a")
        # The Pricing API is denied: the built-in table's figure, marked and labelled an estimate.
        assert "★" in row and "use1-az6" in row and "~$9.61" in row and "+96" in row  # 192 - 0 used - 96 needed
        panel = screen.query_one(FeasibilityPanel)
        assert "~ estimate, us-east-1 prices" in str(panel.border_subtitle)
        # The legend fits the border of an 80-column screen's panel (it ended "us-east-1 pric…").
        assert len(str(panel.border_subtitle)) <= 80 - 2 * 2 - 2 - 4, panel.border_subtitle
        # The region's own line is in the matrix, not repeated among the checks.
        assert "Region us-east-1" not in str(screen.query_one("#checks", Static).render())
        assert "Recommended placement" in str(screen.query_one("#checks", Static).render())
        # No quota is short: nothing to request.
        assert screen.check_action("panel", ("request_quota",)) is False
        await pilot.press("q")


async def test_the_matrix_shows_the_pricing_apis_figure_where_it_answers(world: World) -> None:
    from tests.aws.test_plan_costs import LONDON_TOTAL, _quote_london

    _quote_london(world)
    session = RunSession.for_config(resolve_config({"target": "aws", "region": "eu-west-2"}, environ=image_env()))
    app = RtuiApp(session)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: checked(app), 30, "the matrix")
        recommended = matrix(app).snapshot.recommended
        assert recommended is not None
        row = prompt(app, "/".join(recommended))
        assert f"${LONDON_TOTAL:.2f}" in row and "~" not in row
        assert "estimate" not in str(app.screen.query_one(FeasibilityPanel).border_subtitle)
        await pilot.press("q")


async def test_choosing_another_az_makes_a_session_with_it(world: World) -> None:
    chosen: list[Reconfigure] = []

    def hook(message: Message) -> None:
        if isinstance(message, Reconfigure):
            chosen.append(message)

    app = RtuiApp(aws_session())
    async with app.run_test(size=(80, 24), message_hook=hook) as pilot:
        await wait_for(pilot, lambda: checked(app), 30, "the matrix")
        first, session = app.screen, app.session
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: chosen, 5, "Reconfigure")
        assert chosen[0].update == {"region": "us-east-1", "availability_zone": "us-east-1b"}
        await wait_for(pilot, lambda: checked(app) not in (None, first), 30, "the new target screen")
        assert app.session is not session and AwsConfig.of(app.session.config).availability_zone == "us-east-1b"
        recorded = AwsConfig.of(app.session.record.config)
        assert app.session.run_id == FIXED_RUN_ID and recorded.availability_zone == "us-east-1b"
        assert "@ us-east-1b" in str(app.sub_title)
        highlighted = matrix(app).highlighted_option
        assert highlighted is not None and highlighted.id == "us-east-1/us-east-1b"
        assert "●" in prompt(app, "us-east-1/us-east-1b")
        assert matrix(app).snapshot.recommended == ("us-east-1", "us-east-1a")
        assert len(app.screen_stack) <= 2
        await pilot.press("q")


async def test_a_short_quota_is_requested_only_after_confirmation(world: World) -> None:
    world.quota("us-east-1", G, 48)  # half of what 2 × g6.12xlarge need
    app = RtuiApp(aws_session())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: checked(app), 30, "the matrix")
        screen = checked(app)
        assert screen is not None
        option = matrix(app).get_option("us-east-1/us-east-1a")
        assert option.disabled and "quota" in str(option.prompt) and "short by 48" in str(
            matrix(app).get_option_at_index(0).prompt)
        assert screen.check_action("panel", ("request_quota",)) is True
        await pilot.press("i")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmQuotaIncrease), 5, "the confirmation")
        assert "limit 48 → 96 vCPUs" in str(app.screen.query_one("#quota-text", Static).render())
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, TargetScreen), 5, "back")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()  # idle; the one request after 'y' below shows 'n' made none
        assert world.script.quota_requests == []
        await pilot.press("i")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmQuotaIncrease), 5, "the confirmation")
        await pilot.press("y")
        await wait_for(pilot, lambda: world.script.quota_requests, 30, "the request")
        (request,) = world.script.quota_requests
        assert (request["Region"], request["QuotaCode"], request["DesiredValue"]) == ("us-east-1", G, 96)
        await wait_for(pilot, lambda: any("requested" in n.message for n in app._notifications), 10, "the notice")
        await pilot.press("q")


async def test_read_only_offers_no_quota_request(world: World) -> None:
    world.quota("us-east-1", G, 48)
    app = RtuiApp(aws_session(), read_only=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: checked(app), 30, "the matrix")
        assert app.screen.check_action("panel", ("request_quota",)) is False
        await pilot.press("i")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()  # the key handled and the app idle: nothing asked (waits on idle, not a fixed time)
        assert isinstance(app.screen, TargetScreen) and world.script.quota_requests == []


async def test_other_targets_say_why_they_cannot_be_chosen(world: World) -> None:
    app = RtuiApp(aws_session())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: checked(app), 30, "the matrix")
        targets = app.screen.query_one("#targets")
        from textual.widgets import OptionList

        assert isinstance(targets, OptionList)
        assert not targets.get_option("aws").disabled
        assert targets.get_option("local").disabled and targets.get_option("kube").disabled
        assert targets.border_subtitle == "greyed: this is an aws run; use `rtui --target local|kube`"
        await pilot.press("q")


async def test_a_key_checks_every_region_and_they_fill_in(world: World) -> None:
    app = RtuiApp(aws_session())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: checked(app), 30, "the matrix")
        first = checked(app)
        await pilot.press("a")
        await wait_for(pilot, lambda: checked(app) and len(matrix(app).snapshot.regions) > 1, 60, "every region")
        snapshot = matrix(app).snapshot
        assert all(region is not None for _, region in snapshot.regions) and checked(app) is first
        assert "every enabled region" in str(app.screen.query_one("#feasibility").border_title)
        west = next(i for i in range(matrix(app).option_count)
                    if str(matrix(app).get_option_at_index(i).prompt).startswith("us-west-1"))
        first_az = matrix(app).get_option_at_index(west + 1)  # us-west-1 has no g6: every AZ blocked, saying so
        assert first_az.disabled and "g6.12xlarge is not offered in us-west-1" in str(first_az.prompt)
        await pilot.press("q")


async def test_the_matrix_heading_is_inside_its_box_and_the_config_fits_or_scrolls(world: World) -> None:
    """Issue 21 item 7: the column heading sits inside the matrix's border, and at 80x24 the
    configuration panel is whole on screen or scrolls inside itself."""
    from textual.containers import ScrollableContainer

    from targets.aws.matrix import FeasibilityPanel

    for size in ((120, 40), (80, 24)):
        app = RtuiApp(aws_session())
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: checked(app), 30, "the matrix")  # noqa: B023 - awaited here
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()  # the app idle: laid out (waits on idle, not a fixed time)
            panel = app.screen.query_one(FeasibilityPanel)
            heading = panel.query_one("#matrix-heading")
            assert panel.styles.border_top[0] and "Feasibility" in str(panel.border_title), size
            assert panel.region.y < heading.region.y < matrix(app).region.y < panel.region.bottom - 1, size
            summary = app.screen.query_one("#config-summary", Static)
            box = summary.parent
            assert isinstance(box, ScrollableContainer), box
            shown = box.region.intersection(app.screen.region)
            assert box.region.height >= 3 and shown == box.region and box.region.bottom <= size[1] - 1, size
            assert summary.region.height <= box.scrollable_content_region.height or box.max_scroll_y > 0
            checks = app.screen.query_one("#checks", Static).parent
            assert isinstance(checks, ScrollableContainer) and checks.region.bottom <= size[1] - 1
            await pilot.press("q")


def _snapshot(snap_compare: SnapCompare, size: tuple[int, int]) -> bool:
    async def loaded(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, RtuiApp)
        await wait_for(pilot, lambda: checked(app), 30, "the matrix")

    return bool(snap_compare(RtuiApp(aws_session()), run_before=loaded, terminal_size=size))


def test_aws_matrix_with_a_blocked_az_120x40_snapshot(snap_compare: SnapCompare, world: World) -> None:
    assert _snapshot(snap_compare, (120, 40))


def test_aws_matrix_with_a_blocked_az_80x24_snapshot(snap_compare: SnapCompare, world: World) -> None:
    assert _snapshot(snap_compare, (80, 24))


async def test_no_credentials_is_said_once_and_enter_is_not_offered(world: World,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS credentials anywhere: the first screen says so once (in the matrix box, where the AZs
    would be), neither the checks panel nor a notification repeats it, and the footer offers no
    Enter that would be refused (issue 21, item 5)."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    app = RtuiApp(aws_session())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: checked(app), 30, "the checks")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()  # the app idle: the checks drawn (waits on idle, not a fixed time)
        screen = checked(app)
        assert screen is not None
        box = "\n".join(str(matrix(app).get_option_at_index(i).prompt) for i in range(matrix(app).option_count))
        panel = str(screen.query_one("#checks", Static).render())
        notes = [n.message for n in app._notifications]
        said = [where for where, text in (("matrix", box), ("panel", panel), *(("note", n) for n in notes))
                if "no AWS credentials found" in text]
        assert said == ["matrix"], (said, box, panel, notes)
        assert "rejected" not in box and "aws configure" in box  # what to do next, in the same place
        assert screen.check_action("next", ()) is False
        await pilot.press("enter")  # still refused with its reason, though the footer does not offer it
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()  # the key handled and the app idle: still refused (waits on idle, not a fixed time)
        assert isinstance(app.screen, TargetScreen)


async def test_a_spot_matrix_prices_each_az_at_its_spot_price_and_stars_the_cheapest(world: World) -> None:
    from tests.aws.test_spot import GPU, NOW

    world.script.spot_prices[("us-east-1", GPU)] = NOW
    app = RtuiApp(aws_session(spot="true"))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: checked(app), 30, "the matrix")
        screen = checked(app)
        assert screen is not None and isinstance(screen.panel, MatrixPanel) and screen.panel.report is not None
        (region,) = screen.panel.report.regions
        shown = {}
        for zone in region.zones:
            if zone.feasible:
                assert zone.price_per_hour is not None
                shown[zone.zone] = f"~${zone.price_per_hour:.2f}"
                assert shown[zone.zone] in prompt(app, f"us-east-1/{zone.zone}")
        assert len(set(shown.values())) > 1  # not the region's one figure on every row
        cheapest = min(NOW, key=lambda z: NOW[z])
        assert matrix(app).snapshot.recommended == ("us-east-1", cheapest)
        assert "★" in prompt(app, f"us-east-1/{cheapest}")
        await pilot.press("q")
