"""The dashboard's finish panel: the held-out eval, where the model is, and M copying it (Pilot)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from backend.delivery import local_data_dir
from screens.confirm import ConfirmTeardown
from tests.pilot_wait import wait_for
from tests.test_cli_model import EVAL, exported
from tests.test_tui_dashboard import DashboardApp, dashboard_session, feed, metric_lines, settle, stats_text
from training.export import MODEL_MARKER, ExportInfo
from training.metrics import eval_record, model_record
from training.protocol import SUMMARY_TAG, format_record
from tui.throughput import RunStats

# Local runs fed 2-node GPU lines: see tests.conftest.job_of_unknown_size.
pytestmark = pytest.mark.usefixtures("job_of_unknown_size")

__all__ = ["exported"]  # the module's fixture: one model directory the training program's export wrote


async def test_finish_panel_shows_eval_and_model_and_m_copies_it(isolated_env: Path, exported: Path) -> None:
    import json

    session = dashboard_session(priced=False)
    model_dir = local_data_dir(session.store.root, session.run_id) / "rtui-1" / "model"
    shutil.copytree(exported, model_dir)
    info = ExportInfo(**{**json.loads((model_dir / MODEL_MARKER).read_text()), "uri": str(model_dir)})
    summary = {"steps": 40, "tokens_per_s_mean": 4000.0, "final_loss": 0.1, **eval_record(EVAL),
               "model": model_record(info)}
    app = DashboardApp(session, resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await feed(pilot, metric_lines(1, 12))
        assert not app.screen.check_action("fetch_model", ())  # no model yet: M does nothing
        await feed(pilot, [format_record(SUMMARY_TAG, summary)])
        text = stats_text(app.screen.query_one(RunStats))
        assert "eval loss 6.93 → 0.08 on 2,048 held-out tokens" in text
        # A long path is folded, maybe after "model:" (where depends on the tmp dir's length): compared
        # without the breaks and spaces.
        folded = "".join(str(app.screen.query_one(RunStats).render()).split())
        assert f"model:{model_dir}" in folded and "M copies it" in text
        assert app.screen.check_action("fetch_model", ())
        await pilot.press("M")
        target = Path.cwd() / f"rtui-model-{session.run_id}"
        await wait_for(pilot, lambda: (target / MODEL_MARKER).is_file(), 20, "the model copied by M")
        copied = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
        assert copied == sorted(info.files)


async def open_teardown(pilot: Pilot[None], app: DashboardApp) -> ConfirmTeardown:
    """D on the settled dashboard, then the teardown modal once it is up."""
    await settle(pilot)
    await pilot.press("D")
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmTeardown), 5, "the teardown modal")
    modal = app.screen
    assert isinstance(modal, ConfirmTeardown)
    return modal


@pytest.mark.slow
async def test_d_keeps_the_data_unless_delete_data_is_typed_after_the_cluster_name(
        isolated_env: Path, exported: Path) -> None:

    session = dashboard_session(priced=False)
    data = local_data_dir(session.store.root, session.run_id)
    shutil.copytree(exported, data / "rtui-1" / "model")
    app = DashboardApp(session, resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        modal = await open_teardown(pilot, app)
        await wait_for(pilot, lambda: "1 model" in (modal.data_text or ""), 10, "the data measured")
        assert "Kept unless you say so" in str(modal.query_one("#confirm-data").render())
        await pilot.press(*f"{session.config.cluster_name} delete dat", "enter")
        await wait_for(pilot, lambda: "not the cluster name" in str(modal.query_one("#confirm-error").render()), 5,
                       "the refusal")
        await pilot.press("a", "enter")
        await wait_for(pilot, lambda: not data.exists(), 30, "the run's data deleted by the teardown")


async def test_a_teardown_that_keeps_the_data_says_so_under_its_own_heading(
        isolated_env: Path, exported: Path) -> None:
    """The walkthrough's teardown pane had "kept on purpose: <path>:" for a heading, cut, and the outcome
    said everything was gone while the data stayed."""
    from screens.provision import ProvisionScreen
    from tui.widgets import StepPane

    session = dashboard_session(priced=False)
    shutil.copytree(exported, local_data_dir(session.store.root, session.run_id) / "rtui-1" / "model")
    app = DashboardApp(session, resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_teardown(pilot, app)
        await pilot.press(*session.config.cluster_name, "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ProvisionScreen) and not app.screen.running, 30,
                       "the teardown done")
        pane = app.screen.query_one(f"#{StepPane.dom_id('data')}", StepPane)
        assert pane.title_text == "Keep the run's checkpoints and models"
        outcome = str(app.screen.query_one("#outcome").render())
        assert "everything it created is gone but its data, kept on purpose" in outcome, outcome


async def test_the_teardown_modal_measures_the_data_while_keys_still_work(isolated_env: Path, exported: Path,
                                                                          monkeypatch: Any) -> None:
    """A store that takes its time (a kube volume read by a pod, S3 listed): the modal shows "measuring…",
    keys still work meanwhile (the measure is a worker, awaited, never a wait on the event loop), and the
    line comes when the measure does."""
    import asyncio

    from backend.delivery import DataUsage

    session = dashboard_session(priced=False)
    release, asked = asyncio.Event(), asyncio.Event()

    class SlowStore:
        uri = "pvc://rtui/rtui-ray-data/r1"

        async def usage(self) -> DataUsage:
            asked.set()
            await asyncio.wait_for(release.wait(), 20)
            return DataUsage(f"{self.uri} (a 50Gi volume)", 3 * 10**9, 1, 2, monthly_cost=0.9)

    monkeypatch.setattr(session, "data_store", lambda: SlowStore())
    app = DashboardApp(session, resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        modal = await open_teardown(pilot, app)
        await wait_for(pilot, asked.is_set, 5, "the measure started")
        assert "measuring…" in str(modal.query_one("#confirm-data").render())
        await pilot.press(*"rtui")  # the event loop is free: typing goes on while the store is read
        assert modal.query_one("#confirm-input", Input).value == "rtui"
        release.set()
        await wait_for(pilot, lambda: "1 model, 2 checkpoints" in (modal.data_text or ""), 10, "the data measured")
        assert "$0.90/month" in str(modal.query_one("#confirm-data").render())
        await pilot.press("escape")
