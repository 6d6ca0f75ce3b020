"""RunSession: one run, its config and its stack of layers, shared by the CLI, the TUI and bench.

It finds or makes the run record and offers plan / apply / teardown over the target's
layers (``backend.planner``), the live Jobs API, and the status report. The flows that
string these together live in ``backend.flows``; the UI layers only render what they yield.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from backend import targets
from backend.clients import Clients
from backend.config import RunConfig
from backend.delivery import DataStore, DataUsage, data_store_for, effective_storage_path, model_summary
from backend.errors import ApiUnreachable, OperationError, UserError
from backend.layers.base import Context, GpuFleetReporter, NodeBilling, NodeHistory, NodeLosses, Unanswered
from backend.planner import (
    PlanResult,
    Stack,
    apply_steps,
    discover,
    forget_missing,
    make_plan,
    reconcile,
    select_until,
    teardown_steps,
)
from backend.resolve import ResolvedConfig, with_session_settings
from backend.resources import (
    CostItem,
    CostMeter,
    GpuFleet,
    Interruption,
    NodeLoss,
    StepEvent,
    attribute,
    interruptions_summary,
)
from backend.runner import Progress, Runner, Step
from backend.spool import LogSpool
from backend.store import JobRecord, RunRecord, RunStatus, RunStore, StepState, StepStatus

if TYPE_CHECKING:
    from backend.rayjobs import RayJobs
    from backend.resources import CheckResult, Observed
    from backend.targets import Target
    from backend.telemetry import Telemetry
    from backend.telemetry.metrics import MetricPoint
    from training.export import ExportInfo
    from training.logparse.verdict import Verdict

def target_of(name: str) -> Target[Any]:
    """The target called ``name``, or one clear line naming those this rtui knows."""
    try:
        return targets.get(name)
    except KeyError:
        raise UserError(f"the {name} target is not in this version",
                        remedy=f"use --target {' or '.join(targets.names())}") from None


@dataclass
class StatusReport:
    """What `rtui status` shows: the record reconciled with what is live right now."""

    record: RunRecord
    cluster_alive: bool
    dashboard_url: str | None
    job_status: str | None
    job_message: str
    attached: bool
    last_metric: MetricPoint | None
    world_size: int | None  # the job's ranks, as its lines say
    # The job's own summary line: its keys are the training program's (training.protocol), read as JSON.
    summary: dict[str, Any] | None
    transport: Verdict
    cost: CostMeter | None = None
    model: ExportInfo | None = None  # the run's latest model, where it is
    data: DataUsage | None = None  # what the run's data store holds
    gpu: GpuFleet | None = None  # GPU workers and nodes now, against the full size (issue 26)
    interruptions: tuple[Interruption, ...] = ()  # where the job stopped and went on (issue 41)

    def to_dict(self) -> dict[str, Any]:
        """What `rtui status --json` prints: a JSON object whose keys scripts read, built from the typed fields."""
        r = self.record
        job = r.current_job
        return {
            "run_id": r.run_id, "target": r.target, "cluster_name": r.cluster_name, "status": r.status.value,
            "attached": self.attached, "created_at": r.created_at, "updated_at": r.updated_at,
            "cluster": {"alive": self.cluster_alive, "dashboard_url": self.dashboard_url,
                        "stopped_while_idle": None if self.cluster_alive or r.facts.stopped_while_idle is None
                        else r.facts.stopped_while_idle.model_dump(mode="json")},
            "resources": _resources_dict(r),
            "job": None if job is None else {
                "number": len(r.jobs), "submission_id": job.submission_id,
                "status": self.job_status or job.status.value,
                "message": self.job_message or job.message, "submitted_at": job.submitted_at,
            },
            "steps": _steps_dict(r.steps), "teardown_steps": _steps_dict(r.teardown_steps),
            "last_metric": None if self.last_metric is None else {**self.last_metric.to_dict(),
                                                                   "world_size": self.world_size},
            "summary": self.summary, "transport": self.transport.to_dict(),
            "spool_path": r.job_spool_path(), "cost": None if self.cost is None else self.cost.to_dict(),
            "model": model_summary(self.model, self.summary),
            "data": None if self.data is None else self.data.to_dict(),
            "gpu": None if self.gpu is None else self.gpu.to_dict(),
            "interruptions": interruptions_summary(self.interruptions),
        }


def _resources_dict(record: RunRecord) -> dict[str, dict[str, str | None]]:
    """Each resource's kind, id and status; with a ``notice`` output, one line the user must see while
    it lives (an unenforced NetworkPolicy)."""
    return {address: {"kind": r.kind, "id": r.id, "status": r.status.value,
                      **({"notice": str(r.outputs["notice"])} if r.live and r.outputs.get("notice") else {})}
            for address, r in record.resources.items()}


def _steps_dict(steps: dict[str, StepState]) -> dict[str, dict[str, str | int | float | None]]:
    return {k: {"status": v.status.value, "layer": v.layer, "message": v.message, "error": v.error,
                "attempts": v.attempts, "duration_s": v.duration_s} for k, v in steps.items()}


class RunSession:
    """One run. It owns its clients (AWS, Kubernetes): made when a layer first needs one, closed when
    the session ends (``async with session:``, or ``close()`` from its owner)."""

    def __init__(self, store: RunStore, record: RunRecord, config: RunConfig) -> None:
        self.store = store
        self.record = record
        self.config = config
        self.clients = Clients()
        self.target = target_of(config.target)  # an unknown one is refused now, with one clear line
        # Each lock this session holds, with how many of its holders (the TUI, a flow, a follow) are in it.
        self._held: dict[str, tuple[int, contextlib.ExitStack]] = {}
        # Where each config value came from (ResolvedConfig.sources); a reopened run's came from its record.
        self.sources: dict[str, str] = {}

    @cached_property
    def stack(self) -> Stack:
        # Built on first use: the layers' modules (processes, telemetry) stay off the first frame.
        return self.target.stack(self.config)

    @cached_property
    def ctx(self) -> Context:
        access = next((a for layer in self.stack.layers if (a := layer.access()) is not None), None)
        return Context(self.config, self.record, self.store, cluster=access, clients=self.clients)

    # --- ending --------------------------------------------------------------------------
    async def __aenter__(self) -> RunSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the clients this session made (their connections and worker threads)."""
        await self.clients.aclose()

    def close(self) -> None:
        """``aclose`` for an owner outside the event loop (the TUI replacing its session)."""
        self.clients.close()

    # --- opening -----------------------------------------------------------------------
    @classmethod
    def for_config(cls, resolved: ResolvedConfig, store: RunStore | None = None) -> RunSession:
        """The active run of this target and cluster name, else a new (unsaved) one."""
        store = store or RunStore()
        config = resolved.config
        record = store.find_active(config.target, config.cluster_name)
        if record is None:
            record = store.new(config)
        session = cls(store, record, config)
        session.sources = dict(resolved.sources)
        return session

    @classmethod
    def open(cls, run_id: str | None, store: RunStore | None = None, *, lenient: bool = False) -> RunSession:
        """An existing run with the config it was applied with.

        ``lenient`` (teardown): a config this rtui no longer accepts falls back to the defaults
        for the run's target and cluster name, since tearing down needs neither.
        """
        store = store or RunStore()
        record = store.resolve(run_id)
        if not targets.known(record.target):  # an installed target whose package has gone since
            raise OperationError(f"run {record.run_id} is on the {record.target} target, which this rtui does not "
                                 "have now", remedy=f"install the package that provides the {record.target} target "
                                                    "again (see `rtui runs`)")
        rejected = record.rejected_config
        if rejected is not None and not lenient:
            raise OperationError(f"run {record.run_id} has a config this rtui cannot use ({rejected.reason})",
                                 remedy=f"tear it down by cluster name: `rtui down --yes --target {record.target} "
                                        f"--cluster-name {record.cluster_name}`")
        # A rejected config: the record holds the defaults for its target and cluster name (enough to tear down).
        return cls(store, record, with_session_settings(record.config))

    @classmethod
    def orphan(cls, run_id: str, config: RunConfig, store: RunStore | None = None) -> RunSession:
        """A run whose record is gone but whose resources discovery found: enough to tear it down."""
        store = store or RunStore()
        record = store.new(config)
        record = record.model_copy(update={"run_id": run_id, "spool_path": str(store.spool_dir / f"{run_id}.log"),
                                           "status": RunStatus.UP})
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

    # --- locks ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The run's lock, re-entrant within this session (the TUI holds it while attached)."""
        with self._hold("run", lambda: self.store.lock(self.run_id)):
            yield

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """The run's lock and its cluster's: no other rtui changes the same cluster meanwhile."""
        cluster = (self.config.target, self.config.cluster_name, self.run_id)
        with self.locked(), self._hold("cluster", lambda: self.store.cluster_lock(*cluster)):
            yield

    @contextlib.contextmanager
    def _hold(self, name: str, take: Callable[[], contextlib.AbstractContextManager[None]]) -> Iterator[None]:
        """The lock ``name``, taken by the first of this session's holders and let go by the last to
        leave, in whatever order they leave: the holders are tasks (the TUI while attached, a flow, a
        follow still unwinding) whose lives overlap without nesting. (A flock is per open file: taking
        it again in this process would conflict with ourselves.)"""
        count, stack = self._held.get(name, (0, None))
        if stack is None:
            stack = contextlib.ExitStack()
            stack.enter_context(take())
        self._held[name] = (count + 1, stack)
        try:
            yield
        finally:
            count, stack = self._held.pop(name)
            if count > 1:
                self._held[name] = (count - 1, stack)
            else:
                stack.close()

    def attached_elsewhere(self) -> bool:
        """Whether another rtui holds this run (it then owns the spool)."""
        return "run" not in self._held and self.store.runs_dir.exists() and self.store.is_locked(self.run_id)

    # --- operations --------------------------------------------------------------------
    async def preflight(self) -> list[CheckResult]:
        results: list[CheckResult] = []
        for layer in self.stack.layers:
            results.extend(await layer.preflight(self.ctx))
        return results

    async def plan(self) -> PlanResult:
        return await make_plan(self.stack, self.ctx)

    async def discover(self) -> list[Observed]:
        return await discover(self.stack, self.ctx)

    async def apply(self, plan: PlanResult, *, until: str | None = None) -> AsyncIterator[StepEvent]:
        steps = select_until(apply_steps(self.stack, self.ctx, plan), plan, until)
        self.record.use_config(self.config)
        self.record.plan = plan.as_plan()
        self.record.status = RunStatus.APPLYING
        self.store.save(self.record)
        for layer in self.stack.layers:
            layer.applying(self.ctx)
        reconcile(self.ctx, plan)
        async for event in self._run(steps, self.record.steps, done=RunStatus.UP):
            yield event

    async def teardown(self) -> AsyncIterator[StepEvent]:
        self.record.status = RunStatus.TEARING_DOWN
        self.store.save(self.record)
        unanswered: list[Unanswered] = []
        observed = await discover(self.stack, self.ctx, unanswered=unanswered)
        steps = teardown_steps(self.stack, self.ctx, observed)
        if unanswered:  # said first, as a step of its own: what is not asked, and why that is safe
            steps = [self._unanswered_step(unanswered), *steps]
        async for event in self._run(steps, self.record.teardown_steps, done=RunStatus.DOWN):
            yield event
        if self.record.status is RunStatus.DOWN:
            forget_missing(self.ctx, await discover(self.stack, self.ctx, unanswered=[]))
        async for event in self._sweep():
            yield event

    @staticmethod
    def _unanswered_step(unanswered: list[Unanswered]) -> Step:
        async def say() -> AsyncIterator[Progress]:
            for item in unanswered:
                yield Progress(item.line())
            yield Progress(unanswered[-1].line(), 1.0)

        return Step("unanswered", "Cluster API does not answer", say, expected_s=0.1)

    async def _sweep(self) -> AsyncIterator[StepEvent]:
        """The orphan sweep as a last step: anything of this run still live fails teardown, with its cost."""
        layers = [layer for layer in self.stack.layers if layer.sweeps]
        if not layers:
            return

        async def look() -> AsyncIterator[Progress]:
            yield Progress("asking AWS for anything still tagged with this run")
            found = [item for layer in layers for item in await layer.sweep(self.ctx)]
            self.record.facts.sweep = found
            self.store.save(self.record)
            kept = [item for item in found if item.kept]  # the run's data: kept on purpose, not a leftover
            left = [item for item in found if not item.kept]
            kept_note = "; kept on purpose: " + "; ".join(item.describe() for item in kept) if kept else ""
            if left:
                cost = sum(item.cost_per_hour for item in left)
                sources = "; ".join(dict.fromkeys(i.price_source for i in left if i.cost_per_hour and i.price_source))
                raise OperationError(f"{len(left)} resources of this run are still there (${cost:.3f}/h"
                                     + (f", {sources}" if sources else "") + "): "
                                     + "; ".join(item.describe() for item in left[:8])
                                     + (f"; +{len(left) - 8} more" if len(left) > 8 else "")
                                     + kept_note, remedy="run `rtui down` again; what it cannot delete is named above")
            yield Progress("nothing left: no resource of this run is tagged in AWS" + kept_note, 1.0)

        status = self.record.status
        async for event in self._run([Step("sweep", "Orphan sweep", look, expected_s=5.0)],
                                     self.record.teardown_steps, done=status):
            yield event
        if self.record.status is RunStatus.FAILED and status is RunStatus.DOWN:
            self.record.status = RunStatus.DOWN  # torn down; the sweep's findings are in its step and facts
            self.store.save(self.record)

    async def _run(self, steps: list[Step], into: dict[str, StepState], *,
                   done: RunStatus) -> AsyncIterator[StepEvent]:
        keys = {step.id: step.timing_key for step in steps}

        def on_state(step_id: str, state: StepState) -> None:
            before = into.get(step_id)
            into[step_id] = state
            # A new progress message alone is saved, not forced to disk: a long wait says one every
            # half second, and the next status change (or the run's end) forces what it said.
            message_only = before is not None and before.model_copy(update={"message": state.message}) == state
            self.store.save(self.record, durable=not message_only)
            if state.status is StepStatus.DONE and keys.get(step_id) and state.duration_s is not None:
                self.store.record_duration(keys[step_id], state.duration_s)  # the next run's ETA

        runner = Runner(steps, on_state=on_state)
        try:
            async for event in runner.events():
                yield event
        finally:
            self.record.status = RunStatus.FAILED if runner.failed else done
            self.store.save(self.record)

    async def jobs(self) -> RayJobs | None:
        return await self.ctx.jobs()

    async def cluster_alive(self) -> bool:
        if self.record.status is RunStatus.DOWN:
            return False
        jobs = await self.jobs()
        return jobs is not None and await jobs.answers()

    def spool(self, job: JobRecord | None = None) -> LogSpool:
        """The log spool of ``job``, by default the current one (each job has its own)."""
        return LogSpool(self.record.job_spool_path(job))

    def job_nodes(self) -> int | None:
        """The machines this run's training job runs on, as its target reads the config (None: unknown)."""
        return self.target.job_nodes(self.config)

    def telemetry(self, job: JobRecord | None = None) -> Telemetry:
        """Verdict and metric series of a job (the current one by default) rebuilt from its spool;
        keep it current with ``feed_from()``. The verdict knows the job's node count (``job_nodes``)."""
        # lazy: the log parser (~75 ms) only when telemetry is read; `rtui --help` and the first frame do without
        from backend.telemetry import Telemetry

        telemetry = Telemetry(job_nodes=self.job_nodes())
        spool = self.spool(job)
        if spool.exists():
            telemetry.replay_file(spool.path)
        return telemetry

    async def status_report(self) -> StatusReport:
        """The run now. A cluster whose API does not answer is said as the layer holding it explains it
        (aws: the endpoint admits only the CIDRs `up` learned), as `plan` and `up` say it."""
        try:
            return await self._status_report()
        except ApiUnreachable as exc:
            holder = next((layer for layer in self.stack.layers if layer.holds_above), None)
            raise (await holder.explain_unanswered(self.ctx, exc) if holder is not None else exc) from None

    async def _status_report(self) -> StatusReport:
        jobs = await self.jobs() if self.record.status is not RunStatus.DOWN else None
        alive = jobs is not None and await self.cluster_alive()
        job = self.record.current_job
        status, message = None, ""
        if alive and job is not None and jobs is not None:
            with contextlib.suppress(OperationError):
                live = await jobs.status(job.submission_id)
                status, message = live.status, live.message
                if live.state is not job.status and not self.attached_elsewhere():
                    with contextlib.suppress(OperationError), self.locked():
                        job.status, job.message = live.state, live.message
                        self.store.save(self.record)
        telemetry = self.telemetry()
        latest = telemetry.series.latest
        gpu = await self.gpu_fleet() if alive else None
        now = time.time()
        up = self.record.status is not RunStatus.DOWN
        billed = await self.billed(now) if up else Billed()
        store = self.data_store()
        model = await store.latest_model() if store is not None else None
        usage = await store.usage() if store is not None else None
        interruptions = await self.interruptions(telemetry, now)
        return StatusReport(self.record, alive, jobs.address if alive and jobs else None, status, message,
                            self.attached_elsewhere(), latest, telemetry.series.world_size,
                            telemetry.series.summary, telemetry.transport,
                            cost_meter(self.record, now, gpu=gpu, billed=billed),
                            model, usage, gpu,
                            tuple(interruptions))

    async def interruptions(self, telemetry: Telemetry, now: float | None = None) -> list[Interruption]:
        """Where the current job stopped and went on from a checkpoint (its log says), each with the node
        loss its target's records put in that moment (a Spot interruption), when they tell of one."""
        restarts = telemetry.series.restarts.found
        job = self.record.current_job
        if not restarts or job is None:
            return []
        now = time.time() if now is None else now
        losses: list[NodeLoss] = []
        if self.record.status is not RunStatus.DOWN:
            for layer in self.stack.layers:
                if isinstance(layer, NodeLosses):
                    losses += await layer.node_losses(self.ctx, since=job.submitted_at, now=now)
        return attribute(restarts, losses, now)

    def data_store(self) -> DataStore | None:
        """Where this run's checkpoints and model live: its own prefix under ``--storage-path`` when
        one is given, else the target's own place (local: a 0700 dir under the state dir, kept after
        `down`); None where the target keeps nothing rtui can reach."""
        storage = effective_storage_path(self.config.storage_path, self.record.facts.storage_path)
        if not storage:
            return self.target.data_store(self.store.root, self.run_id, self.config, ctx=self.ctx)
        return data_store_for(storage, self.run_id, local_default=None, profile=self.config.profile,
                              own_bucket=not self.config.storage_path, clients=self.ctx.clients)

    async def billed(self, now: float | None = None) -> Billed:
        """What the provider's own records say the run's nodes billed up to ``now``: ``node_hours`` and
        ``node_costs`` together, as the cost meter takes them."""
        now = time.time() if now is None else now
        return Billed(await self.node_hours(now), await self.node_costs(now))

    async def node_hours(self, now: float | None = None) -> dict[str, float]:
        """Node-hours so far of each priced resource that may have run below its planned size, from
        the provider's own records (``NodeHistory``); a resource they cannot tell of is left out (the
        cost meter then says its figure is an upper bound)."""

        now = time.time() if now is None else now
        scalable = self.record.plan.scalable() if self.record.plan is not None else {}
        out: dict[str, float] = {}
        for address in scalable:
            entry = self.record.resources.get(address)
            if entry is None or not entry.bills:
                continue
            for layer in self.stack.layers:
                if isinstance(layer, NodeHistory):
                    hours = await layer.node_hours(self.ctx, address, since=entry.created_at, now=now)
                    if hours is not None:
                        out[address] = hours
                        break
        return out

    async def node_costs(self, now: float | None = None) -> dict[str, float]:
        """What each priced resource billed at a moving price (Spot) has cost so far, from the provider's
        own price history (``NodeBilling``); the others are left out."""
        now = time.time() if now is None else now
        out: dict[str, float] = {}
        for address, entry in self.record.resources.items():
            if not entry.bills:
                continue
            for layer in self.stack.layers:
                if isinstance(layer, NodeBilling):
                    cost = await layer.node_cost(self.ctx, address, since=entry.created_at, now=now)
                    if cost is not None:
                        out[address] = cost
                        break
        return out

    async def gpu_fleet(self) -> GpuFleet | None:
        """GPU workers and nodes now, when the cluster's come and go (issue 26), with when it went idle:
        the last job's end, and when the idle timeout let the workers go after it."""
        cluster = self.ctx.cluster
        if not isinstance(cluster, GpuFleetReporter):
            return None
        fleet = await cluster.gpu_fleet(self.ctx)
        job = self.record.current_job
        if fleet is None or job is None or job.ended_at is None or not job.status.terminal:
            return fleet
        return fleet.after_job(job.ended_at)


@dataclass(frozen=True)
class Billed:
    """The provider's own record of what priced nodes billed (``RunSession.billed``): node-hours of the
    resources that may run below their planned size, and the cost of those billed at a moving price."""

    node_hours: Mapping[str, float] = field(default_factory=dict)
    node_costs: Mapping[str, float] = field(default_factory=dict)


def cost_meter(record: RunRecord, now: float | None = None, gpu: GpuFleet | None = None,
               node_hours: Mapping[str, float] | None = None,
               node_costs: Mapping[str, float] | None = None, billed: Billed | None = None) -> CostMeter | None:
    """What the run costs now and has cost so far: each live priced resource from when it was made,
    at the plan's price, unless it is known to bill nothing (``ResourceRecord.bills``); after teardown,
    what the orphan sweep still found. None when nothing is priced.

    ``gpu`` (``RunSession.gpu_fleet``): the GPU nodes now; their priced resource then bills for the
    nodes that exist (a nodegroup scaled to zero while idle bills nothing), and ``per_hour_full``
    says what the cluster costs at full size.

    What was accrued by a resource whose size may have gone below the planned one (``Plan.scalable``)
    comes from the provider's own record of its nodes, ``node_hours`` (``RunSession.node_hours``: on
    aws, the Auto Scaling group's activities), at the per-node price. Without that record it is
    counted at full size for its whole life, an upper bound: the item says ``accrued_at_most`` and
    the meter ``accrued_exact: False`` ("at most $X so far").

    Nodes billed at a price that moves (Spot) cost what the provider's price history says over the
    times they ran, ``node_costs`` (``RunSession.node_costs``), when it can tell: that replaces the
    plan's price, which was the price in effect when the plan was made. ``billed`` gives both at once."""
    if billed is not None:
        node_hours, node_costs = billed.node_hours, billed.node_costs
    now = time.time() if now is None else now
    prices = record.plan.prices() if record.plan is not None else {}
    scalable = record.plan.scalable() if record.plan is not None else {}
    history = node_hours or {}
    items: dict[str, CostItem] = {}
    for address, entry in record.resources.items():
        price = prices.get(address, 0.0)
        if price and entry.bills:
            hours = max(0.0, now - entry.created_at) / 3600
            item = CostItem(per_hour=price, since=entry.created_at, accrued=round(price * hours, 4))
            if address in scalable and address in history:
                item = replace(item, accrued=round(price / scalable[address] * history[address], 4),
                               node_hours=round(history[address], 4))
            elif address in scalable:
                item = replace(item, accrued_at_most=True)
            if node_costs and address in node_costs:
                item = replace(item, accrued=round(node_costs[address], 4), accrued_at_most=False,
                               accrued_from="the Spot price history")
            items[address] = item
    left = tuple(record.facts.sweep or ())
    if not items and not left:
        return None
    full = round(sum(i.per_hour for i in items.values()), 4)
    priced = gpu.priced if gpu is not None else None
    if gpu is not None and priced is not None and priced in items and gpu.full:
        share = min(1.0, gpu.nodes / gpu.full)
        held = items[priced]
        items[priced] = replace(held, per_hour=round(held.per_hour * share, 4), per_hour_full=held.per_hour)
    return CostMeter(per_hour=round(sum(i.per_hour for i in items.values()), 4), per_hour_full=full,
                     accrued=round(sum(i.accrued for i in items.values()), 4),
                     accrued_exact=not any(i.accrued_at_most for i in items.values()), resources=items,
                     left_behind=left, left_behind_per_hour=round(sum(i.cost_per_hour or 0 for i in left), 4))
