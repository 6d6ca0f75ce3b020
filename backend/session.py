"""RunSession: one run and the operations on it, shared by the CLI and the TUI.

It finds or makes the run record, builds the target, and offers plan / apply /
follow / status / teardown. The UI layers only render what it returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from backend.config import ResolvedConfig, RunConfig
from backend.errors import OperationError, UserError
from backend.spool import LogSpool
from backend.store import RunLockedError, RunRecord, RunStatus, RunStore

if TYPE_CHECKING:
    from backend.model import CheckResult, Plan, StepEvent
    from backend.targets.base import Target
    from backend.targets.follow import JobFollower
    from backend.telemetry import Telemetry


def make_target(config: RunConfig, record: RunRecord, store: RunStore) -> Target:
    if config.target == "local":
        from backend.targets.local import LocalTarget

        return LocalTarget(config, record, store)
    if config.target == "aws":
        from backend.targets.aws import AwsTarget

        return AwsTarget(config, record, store)
    raise UserError(
        f"the {config.target} target is not in this version",
        remedy="use --target local, or `rtui check --target aws` for AWS feasibility",
    )


@dataclass
class RunSummary:
    """What `rtui status` shows: the record reconciled with what is live right now."""

    record: RunRecord
    cluster_alive: bool
    job_status: str | None
    job_message: str
    attached: bool
    last_metric: dict[str, Any] | None
    summary: dict[str, Any] | None
    transport: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        job = r.current_job
        return {
            "run_id": r.run_id, "target": r.target, "cluster_name": r.cluster_name, "status": r.status.value,
            "attached": self.attached, "created_at": r.created_at, "updated_at": r.updated_at,
            "cluster": {"alive": self.cluster_alive, "dashboard_url": r.resources.get("dashboard_url"),
                        "temp_dir": r.resources.get("temp_dir")},
            "job": None if job is None else {
                "submission_id": job.submission_id, "status": self.job_status or job.status,
                "message": self.job_message or job.message, "submitted_at": job.submitted_at,
            },
            "steps": {k: {"status": v.status.value, "message": v.message, "error": v.error,
                          "attempts": v.attempts, "duration_s": v.duration_s} for k, v in r.steps.items()},
            "last_metric": self.last_metric, "summary": self.summary, "transport": self.transport,
            "spool_path": r.spool_path,
        }


class RunSession:
    def __init__(self, store: RunStore, record: RunRecord, config: RunConfig) -> None:
        self.store = store
        self.record = record
        self.config = config
        if config.target not in ("local", "aws"):
            make_target(config, record, store)  # refuse unsupported targets now, with one clear line

    @cached_property
    def target(self) -> Target:
        # Built on first use: the target's modules (processes, telemetry) stay off the first frame.
        return make_target(self.config, self.record, self.store)

    # --- opening -----------------------------------------------------------------------
    @classmethod
    def for_config(cls, resolved: ResolvedConfig, store: RunStore | None = None) -> RunSession:
        """The active run of this target and cluster name, else a new (unsaved) one."""
        store = store or RunStore()
        config = resolved.config
        record = store.find_active(config.target, config.cluster_name)
        if record is None:
            record = store.new(target=config.target, cluster_name=config.cluster_name,
                               config=config.model_dump(mode="json"))
        return cls(store, record, config)

    @classmethod
    def open(cls, run_id: str | None, store: RunStore | None = None) -> RunSession:
        """An existing run with the config it was applied with."""
        store = store or RunStore()
        record = store.resolve(run_id)
        try:
            config = RunConfig.model_validate(record.config)
        except ValueError as exc:
            raise OperationError(f"run {record.run_id} has an unusable config: {exc}") from None
        return cls(store, record, config)

    @classmethod
    def resume(cls, run_id: str | None, store: RunStore | None = None) -> RunSession:
        """The run to reattach to: the one named, else the newest that is not torn down."""
        store = store or RunStore()
        if run_id is None:
            records, _ = store.list()
            live = [r for r in records if r.status is not RunStatus.DOWN]
            if not live:
                latest = f" (the latest, {records[0].run_id}, is down)" if records else ""
                raise UserError(f"no runs to resume{latest}", remedy="start one with `rtui`")
            run_id = live[0].run_id
        session = cls.open(run_id, store)
        if session.record.status is RunStatus.DOWN:
            raise UserError(f"run {run_id} is already down", remedy="start a new one with `rtui`")
        return session

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with self.store.lock(self.record.run_id):
            yield

    # --- operations --------------------------------------------------------------------
    async def preflight(self) -> list[CheckResult]:
        return await self.target.preflight()

    async def plan(self) -> Plan:
        return await self.target.plan()

    def adopt_config(self) -> None:
        """Applying a plan makes its config the run's config."""
        self.record.config = self.config.model_dump(mode="json")

    async def apply(self, plan: Plan, *, until: str | None = None) -> AsyncIterator[StepEvent]:
        self.adopt_config()
        async for event in self.target.apply(plan, until=until):
            yield event

    async def teardown(self) -> AsyncIterator[StepEvent]:
        async for event in self.target.teardown():
            yield event

    def follower(self) -> JobFollower:
        from backend.targets.follow import JobFollower

        return JobFollower(self.target)

    def spool(self) -> LogSpool:
        return LogSpool(self.record.spool_path)

    def telemetry(self) -> Telemetry:
        """Verdict and metric series rebuilt from the spool; keep it current with ``feed_from()``."""
        from backend.telemetry import Telemetry

        telemetry = Telemetry()
        spool = self.spool()
        if spool.exists():
            telemetry.replay_file(spool.path)
        return telemetry

    async def summary(self) -> RunSummary:
        alive = await self.target.cluster_alive() if self.record.status is not RunStatus.DOWN else False
        job = self.record.current_job
        status, message = None, ""
        jobs = self.target.jobs()
        if alive and job is not None and jobs is not None:
            with contextlib.suppress(OperationError):
                live = await jobs.status(job.submission_id)
                status, message = live.status, live.message
        attached = self.store.is_locked(self.record.run_id) if self.store.runs_dir.exists() else False
        if status and job is not None and status != job.status and not attached:
            with contextlib.suppress(RunLockedError), self.locked():
                job.status, job.message = status, message
                self.store.save(self.record)
        telemetry = self.telemetry()
        latest = telemetry.series.latest
        return RunSummary(self.record, alive, status, message, attached,
                          latest.to_dict() if latest else None, telemetry.series.summary,
                          telemetry.transport.to_dict())
