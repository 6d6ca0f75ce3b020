"""The Target protocol every backend implements, and the shared machinery around it.

A target turns a RunConfig into checks, a plan, apply steps and teardown steps, and
gives access to the live cluster's Ray Jobs API. Running the steps, persisting their
state and following the job are the same for every target and live here.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator

from backend.config import RunConfig
from backend.model import CheckResult, Plan, StepEvent
from backend.rayjobs import RayJobs
from backend.runner import Runner, Step, select_until
from backend.store import RunRecord, RunStatus, RunStore, StepState


class Target(abc.ABC):
    name: str = "abstract"

    def __init__(self, config: RunConfig, record: RunRecord, store: RunStore) -> None:
        self.config = config
        self.record = record
        self.store = store

    # --- what each target provides ----------------------------------------------------
    @abc.abstractmethod
    async def preflight(self) -> list[CheckResult]: ...

    @abc.abstractmethod
    async def plan(self) -> Plan: ...

    @abc.abstractmethod
    def apply_steps(self, plan: Plan) -> list[Step]: ...

    @abc.abstractmethod
    def teardown_steps(self) -> list[Step]: ...

    @abc.abstractmethod
    def jobs(self) -> RayJobs | None:
        """The live cluster's Jobs API, or None when no cluster is up."""

    @abc.abstractmethod
    async def cluster_alive(self) -> bool: ...

    # --- shared machinery --------------------------------------------------------------
    def save(self) -> None:
        self.store.save(self.record)

    def _persist_step(self, prefix: str) -> object:
        def on_state(step_id: str, state: StepState) -> None:
            self.record.steps[f"{prefix}{step_id}"] = state
            self.save()

        return on_state

    async def apply(self, plan: Plan, *, until: str | None = None) -> AsyncIterator[StepEvent]:
        steps = select_until(self.apply_steps(plan), until)
        self.record.plan = plan.model_dump(mode="json")
        self.record.status = RunStatus.APPLYING
        self.save()
        runner = Runner(steps, on_state=self._persist_step(""))  # type: ignore[arg-type]
        try:
            async for event in runner.events():
                yield event
        finally:
            self.record.status = RunStatus.FAILED if runner.failed else RunStatus.UP
            self.save()

    async def teardown(self) -> AsyncIterator[StepEvent]:
        self.record.status = RunStatus.TEARING_DOWN
        self.save()
        runner = Runner(self.teardown_steps(), on_state=self._persist_step("teardown:"))  # type: ignore[arg-type]
        try:
            async for event in runner.events():
                yield event
        finally:
            self.record.status = RunStatus.FAILED if runner.failed else RunStatus.DOWN
            self.save()
