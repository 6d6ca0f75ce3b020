"""A plugin target whose cluster has no private channel for ``--job-env`` values is refused at plan time
(issue 33, item 6).

Ray's Jobs API answers ``GET /api/jobs/`` with every job's ``runtime_env`` (``JobDetails`` /
``JobInfo.runtime_env`` in ``ray.dashboard.modules.job.common``), so a value put in
``runtime_env["env_vars"]`` is read by anyone who may list jobs, and the runtime-env agent logs it.
The built-in clusters hand the values over another way (``JobSecretCarrier``: a 0600 file locally, a
mounted Secret on Kubernetes). A target from a plugin that offers no such channel used to get the
values put in ``runtime_env`` anyway, silently; now ``rtui plan`` says in one line that it cannot.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import pytest

import targets
from backend.config import RunConfig
from backend.errors import UserError
from backend.layers.base import Context, Handler, JobSecretCarrier, Layer, job_secret_env
from backend.layers.ray_job import RayJobLayer
from backend.planner import Stack
from backend.rayjobs import RayJobs
from backend.resolve import resolve_config
from backend.resources import Observed, Resource
from backend.runner import Progress
from backend.session import RunSession
from targets import Defaults, Target
from tests.conftest import REPO, run_rtui

SECRET = "hf_plugin_secret_value"


class BareAccess:
    """A cluster reached through the Jobs API only: no ``carry_job_secrets``."""

    async def jobs(self, ctx: Context) -> RayJobs | None:
        return None  # nothing is up: plan only

    def job_env(self, ctx: Context) -> dict[str, str]:
        return {}

    def job_finished(self, ctx: Context) -> None:
        return None


class NothingHandler(Handler):
    kind = "bare-nothing"
    title = "Nothing"

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        yield Progress("done", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        yield Progress("done", 1.0)


class BareClusterLayer(Layer):
    name = "bare-cluster"
    _handlers: ClassVar[dict[str, Handler]] = {NothingHandler.kind: NothingHandler()}

    @property
    def handlers(self) -> Mapping[str, Handler]:
        return self._handlers

    def desired(self, ctx: Context, below: Sequence[Resource]) -> list[Resource]:
        return []

    async def discover(self, ctx: Context) -> list[Observed]:
        return []

    def access(self) -> BareAccess:
        return BareAccess()


class BareTarget(Target[RunConfig]):
    name = "bare"
    label = "Bare — a Ray cluster reached through its Jobs API only (tests/test_target_plugin_job_env.py)"
    on_gpus = False
    offline = True
    shared_disk = True
    bench_variants = ("gloo",)

    def stack(self, config: RunConfig) -> Stack:
        return Stack(self.name, [BareClusterLayer(), RayJobLayer()])

    def defaults(self, config: RunConfig) -> Defaults:
        return Defaults(batch_size=4, precision="fp32", learning_rate=1e-3, model_id=None, workers=1, shard_size=1,
                        require_transport="any")


@pytest.fixture
def bare(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(targets.BUILTIN, BareTarget.name, f"{__name__}:BareTarget")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    targets.get.cache_clear()
    yield
    targets.get.cache_clear()


def test_the_bare_cluster_has_no_private_channel() -> None:
    assert not isinstance(BareAccess(), JobSecretCarrier)


async def test_job_env_on_a_target_without_a_private_channel_is_refused_at_plan(bare: None) -> None:
    session = RunSession.for_config(resolve_config({"target": BareTarget.name, "job_env": "HF_TOKEN"}))
    with pytest.raises(UserError) as refused:
        await session.plan()
    assert "--job-env" in refused.value.message and "the bare target" in refused.value.message
    assert refused.value.remedy and "--job-env" in refused.value.remedy
    assert SECRET not in str(refused.value)


async def test_without_job_env_the_same_target_plans(bare: None) -> None:
    session = RunSession.for_config(resolve_config({"target": BareTarget.name}))
    plan = await session.plan()
    assert "ray.job.train" in [c.address for c in plan.changes]


async def test_the_submission_never_falls_back_to_runtime_env(bare: None) -> None:
    """Also where the job is built (and `rtui bench`): no values in ``env_vars`` without a carrier."""
    session = RunSession.for_config(resolve_config({"target": BareTarget.name, "job_env": "HF_TOKEN"}))
    with pytest.raises(UserError):
        job_secret_env(session.ctx, "rtui-x-1", {"HF_TOKEN": SECRET})


def test_rtui_plan_says_so_in_one_line(tmp_path: Path) -> None:
    """Through the real binary, the target installed as a plugin (an ``rtui.targets`` entry point)."""
    site = tmp_path / "site"
    info = site / "rtui_bare_target-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rtui-bare-target\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[rtui.targets]\nbare = {__name__}:BareTarget\n")
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "HF_TOKEN": SECRET}
    proc = run_rtui("plan", "--target", "bare", "--job-env", "HF_TOKEN", env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--job-env" in proc.stderr and "Traceback" not in proc.stderr and SECRET not in proc.stderr
