"""The flows every front end shares: up, follow, attach, down (DESIGN.md §1).

The CLI, the TUI and ``rtui bench`` call these; none of them keeps its own copy. Each flow
yields typed events (``StepEvent`` for steps, ``JobUpdate`` for a job's log and status) and
raises ``RtuiError`` with one line and a remedy when it cannot go on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from backend.config import RunConfig
from backend.delivery import DataUsage, LocalDirStore
from backend.errors import NoCapacity, OperationError, RtuiError, UserError
from backend.follow import JobFollower, JobUpdate
from backend.layers.base import HeadLogSource
from backend.planner import PlanResult, forget_missing
from backend.rayjobs import JobStatus
from backend.resources import Action, CheckStatus, EventKind, StepEvent
from backend.runner import Progress, Runner, Step
from backend.session import RunSession, target_of
from backend.spool import LogSpool
from backend.store import JobState, RunStatus, RunStore, StepState, StepStatus
from backend.telemetry import Telemetry
from backend.waiting import Look, WaitTimedOut, wait_until

RUN = "run"
TRAIN = "train"
WATCH_EVERY_S = 0.5


async def check_preflight(session: RunSession) -> None:
    failed = [c for c in await session.preflight() if c.status is CheckStatus.FAIL]
    if failed:
        raise UserError(f"preflight: {failed[0].title}: {failed[0].detail}", remedy=failed[0].remedy)


async def up(session: RunSession, *, until: str | None = None, follow: bool = True,
             az_failover: bool = False) -> AsyncIterator[StepEvent]:
    """Preflight, plan, apply (up to ``until``), then follow the job as the ``train`` step.

    The first event (step ``run``, started) carries the plan; the last (step ``run``) the outcome.
    With ``az_failover``, GPU nodes AWS has no capacity for move to the next feasible AZ, and
    the plan is applied again (each move is kept in the run record with its reason); with the
    config's ``spot_fallback`` ("on-demand"), Spot GPU nodes AWS has no Spot capacity for go
    On-Demand first.
    """
    with session.changing():
        await check_preflight(session)
        plan = await session.plan()
        yield StepEvent(step=RUN, kind=EventKind.STARTED, message=f"run {session.run_id}",
                        data={"run_id": session.run_id, "plan": plan.model_dump(mode="json"), "noop": plan.is_noop})
        moves: set[str] = set()
        while True:
            ok, no_capacity = True, None
            async for event in session.apply(plan, until=until):
                ok = ok and event.kind not in (EventKind.FAILED, EventKind.CANCELLED)
                if isinstance(event.error, NoCapacity):
                    no_capacity = event.error
                yield event
            # on_demand None: as the run's own settings allow (nobody is asked here)
            moved = None if no_capacity is None else fail_over(session, no_capacity, elsewhere=az_failover,
                                                               on_demand=None)
            if moved is None or moved in moves:  # the same move again would fail the same way
                break
            moves.add(moved)
            yield StepEvent(step=RUN, kind=EventKind.PROGRESS, message=moved, data={"failover": moved})
            plan = await session.plan()
            yield StepEvent(step=RUN, kind=EventKind.PROGRESS, message="the plan after moving the GPU nodes",
                            data={"plan": plan.model_dump(mode="json")})
        if ok and follow and until is None and session.record.current_job is not None:
            async for event in follow_steps(session):
                ok = ok and event.kind not in (EventKind.FAILED, EventKind.CANCELLED)
                yield event
        job = session.record.current_job
        yield StepEvent(step=RUN, kind=EventKind.DONE if ok else EventKind.FAILED,
                        message=("run is up" if ok else "run failed") + f": {session.run_id}",
                        data={"run_id": session.run_id, "job_status": job.status.value if job else None,
                              "status": session.record.status.value})


def fail_over(session: RunSession, error: NoCapacity, *, elsewhere: bool = True,
              on_demand: bool | None = True) -> str | None:
    """Move what the provider had no capacity for, as the run's target does it (``Target.fail_over``);
    what moved, or None."""
    return session.target.fail_over(session.stack, session.ctx, error, elsewhere=elsewhere, on_demand=on_demand)


async def apply_plan(session: RunSession, plan: PlanResult, *, until: str | None = None) -> AsyncIterator[StepEvent]:
    """Apply a plan someone reviewed (the TUI), under the run's and the cluster's locks."""
    with session.changing():
        async for event in session.apply(plan, until=until):
            yield event


async def follow_steps(session: RunSession) -> AsyncIterator[StepEvent]:
    """Following the job as a runner step: progress from telemetry, failure when the job fails.

    Its ETA: the seconds per training step the earlier jobs of this target took on this machine
    (start-up included) times this job's steps; a minute before any was measured."""
    key = f"{session.config.target}/train/per-step"
    per_step = session.store.durations().get(key)
    expected = per_step * session.config.steps if per_step else 60.0
    fleet = await session.gpu_fleet()
    if fleet is not None and fleet.short:
        expected += session.target.scale_up_s  # the job's first step waits for the nodes and workers to come back

    async def progress() -> AsyncIterator[Progress]:
        if fleet is not None and fleet.short:
            async for p in _scale_up_progress(session):
                yield p
        async for p in _train_progress(session):
            yield p

    runner = Runner([Step(TRAIN, "Train", progress, expected_s=expected)],
                    on_state=lambda sid, state: _save_step(session, sid, state, key))
    async for event in runner.events():
        yield event


SCALE_UP_POLL_S = 2.0
SCALE_UP_TIMEOUT_S = 1800.0


async def _scale_up_progress(session: RunSession) -> AsyncIterator[Progress]:
    """The GPU nodes and workers arriving, until every worker runs (then the job trains)."""
    async def arrived() -> Look:
        fleet = await session.gpu_fleet()
        if fleet is None or not fleet.short or await _job_over(session):
            return Look(done=True, message="")  # up, or a job that ended first: following it says the rest
        return Look(done=False, message=f"scaling up from idle: {fleet.sizes()} (the job's placement group "
                                        "asked for them)")

    try:
        async for arriving in wait_until(arrived, what="the GPU nodes", timeout_s=SCALE_UP_TIMEOUT_S,
                                         poll_s=SCALE_UP_POLL_S):
            if arriving.message:
                yield Progress(arriving.message, 0.0)
    except WaitTimedOut:
        return  # past the deadline the job's own state tells the rest (it fails or trains): no verdict here


async def _job_over(session: RunSession) -> bool:
    jobs, job = await session.jobs(), session.record.current_job
    if jobs is None or job is None:
        return True
    try:
        return (await jobs.status(job.submission_id)).terminal
    except RtuiError:
        return False


def _save_step(session: RunSession, sid: str, state: StepState, timing_key: str = "") -> None:
    session.record.steps[sid] = state
    session.store.save(session.record)
    if timing_key and state.status is StepStatus.DONE and state.duration_s is not None:
        session.store.record_duration(timing_key, state.duration_s / session.config.steps)


async def _train_progress(session: RunSession) -> AsyncIterator[Progress]:
    jobs = await session.jobs()
    if jobs is None:
        raise OperationError("the cluster of this run is not running", remedy=f"see `rtui status {session.run_id}`")
    follower = JobFollower(session, jobs)
    telemetry = Telemetry(job_nodes=session.job_nodes())  # one machine: intra-node, whatever NCCL announces
    if follower.spool.exists():  # parsed once: continue where any earlier session stopped
        telemetry.replay_file(follower.spool.path)
    total = session.config.steps
    last_emit = last_saved = 0.0
    shown: tuple[str, int | None] = ("", None)
    latest = ""
    async for update in follower.updates():
        if update.status is not None and not update.lines:
            yield Progress(f"job {update.status.status.lower()}")
            continue
        telemetry.feed_from(follower.spool.path)
        point = telemetry.series.latest
        if point is None or point.step is None:
            continue
        latest = (f"step {point.step}/{total} loss {point.loss or float('nan'):.4f} "
                  f"{point.tokens_per_s or 0:,.0f} tok/s")
        now = time.monotonic()
        if now - last_emit >= 0.5 and (latest, point.step) != shown:
            last_emit, shown = now, (latest, point.step)
            yield Progress(latest, min(1.0, point.step / total))
        if now - last_saved >= 10:
            last_saved = now
            _keep_telemetry(session, follower, telemetry)
    _keep_telemetry(session, follower, telemetry)
    if session.ctx.cluster is not None:
        await asyncio.to_thread(session.ctx.cluster.job_finished, session.ctx)
    status = follower.last_status
    if status is None or status.state is not JobState.SUCCEEDED:
        state = status.status if status else "UNKNOWN"
        detail = (status.message if status else "") or "see `rtui logs`"
        raise OperationError(f"job {state.lower()}: {detail.splitlines()[0][:200]}",
                             remedy=f"see `rtui logs {session.run_id}`")
    yield Progress(latest or "job succeeded", 1.0)


def _keep_telemetry(session: RunSession, follower: JobFollower, telemetry: Telemetry) -> None:
    """The followed job's telemetry snapshot, on the job (and as the run's latest) in the record."""
    snapshot = telemetry.snapshot(tail=0)
    if follower.job is not None:
        follower.job.telemetry = snapshot
    session.record.telemetry = snapshot
    session.store.save(session.record)


@dataclass(frozen=True)
class Attached:
    """What ``attach`` found: whether this rtui follows the job or only watches another's spool."""

    read_only: bool
    cluster_alive: bool


async def attach(session: RunSession, *, replayed_bytes: int = 0) -> AsyncGenerator[Attached | JobUpdate, None]:
    """Follow the current job; when another rtui holds the run, watch its spool read-only instead.

    Yields one ``Attached`` first, then ``JobUpdate``s. ``replayed_bytes`` is how much of the
    spool the caller has already shown (read-only watching continues from there).
    """
    if session.attached_elsewhere():
        yield Attached(read_only=True, cluster_alive=True)
        async for update in watch_spool(session, replayed_bytes):
            yield update
        return
    with session.locked():
        jobs = await session.jobs() if session.record.status is not RunStatus.DOWN else None
        alive = jobs is not None and await session.cluster_alive()
        yield Attached(read_only=False, cluster_alive=alive)
        if not alive or jobs is None or session.record.current_job is None:
            return
        async for update in JobFollower(session, jobs).updates():
            yield update


async def watch_spool(session: RunSession, offset: int) -> AsyncIterator[JobUpdate]:
    """What another rtui writes to the spool, and the job status it saves, until it lets go of the run."""
    spool = session.spool()
    shown: tuple[JobState, str] | None = None
    while True:
        attached = session.attached_elsewhere()
        lines, offset = spool.read_from(offset)
        if lines:
            yield JobUpdate(lines=lines)
        status = _saved_status(session)
        if status is not None and (status.state, status.message) != shown:
            shown = (status.state, status.message)
            yield JobUpdate(status=status)
        if not attached:
            return
        await asyncio.sleep(WATCH_EVERY_S)


def _saved_status(session: RunSession) -> JobStatus | None:
    """The current job's status as the rtui that follows it last saved it (the record on disk)."""
    try:
        job = session.store.load(session.run_id).current_job
    except (OSError, ValueError, RtuiError):
        return None
    if job is None:
        return None
    return JobStatus(job.submission_id, job.status, job.message or "", end_time=job.ended_at)


async def catch_up(session: RunSession) -> list[str]:
    """Spool what the job logged since we last looked, once (``rtui logs`` without --follow)."""
    if session.attached_elsewhere() or session.record.status is RunStatus.DOWN:
        return []
    jobs = await session.jobs()
    if jobs is None or session.record.current_job is None:
        return []
    with session.locked():
        return await JobFollower(session, jobs).catch_up()


def head_spool(session: RunSession) -> LogSpool:
    """The head pod's log, each line as the API server gave it: ``<RFC 3339 time> <text>``."""
    return LogSpool(Path(session.record.spool_path).with_suffix(".head.log"))


def _last_timestamped(spool: LogSpool) -> tuple[str | None, set[str]]:
    """The newest timestamp in the head spool and the lines that carry it (to skip on resume)."""
    last: str | None = None
    at_last: set[str] = set()
    for line in spool.iter_lines():
        ts = line.split(" ", 1)[0]
        if ts != last:
            last, at_last = ts, set()
        at_last.add(line)
    return last, at_last


async def head_log(session: RunSession, *, follow: bool) -> AsyncIterator[str]:
    """The Ray head pod's log: what the spool holds, then what the pod logged since (kube, aws).

    Lines reach the spool before the caller, with their timestamps, so a later call (or a
    resumed rtui) asks the API server only for what came after the last one kept.
    """
    source = session.ctx.cluster
    if not isinstance(source, HeadLogSource):
        raise UserError(f"the {session.config.target} target has no head pod",
                        remedy="--source head is for the kube and aws targets; the local head's logs are in "
                               "its temp dir (see `rtui status`)")
    spool = head_spool(session)
    for line in spool.iter_lines():
        yield line.split(" ", 1)[-1]
    if session.record.status is RunStatus.DOWN:
        return
    last, at_last = _last_timestamped(spool)
    async for line in source.head_log(session.ctx, since_time=last, follow=follow):
        ts = line.split(" ", 1)[0]
        if last is not None and (ts < last or (ts == last and line in at_last)):
            continue
        spool.append(line + "\n")
        yield line.split(" ", 1)[-1]


DATA_STEP = "data"


async def fetch_model(session: RunSession, to: Path) -> Path:
    """Copy the run's newest complete model to ``to`` (resumable); UserError when there is none."""
    store = session.data_store()
    found = await store.latest_model() if store is not None else None
    if store is None or found is None:
        raise UserError(f"run {session.run_id} has no complete model rtui can fetch",
                        remedy="a run writes its model when training ends; see `rtui status`")
    await store.fetch(found, to)
    return to


async def down(session: RunSession, *, delete_data: bool = False) -> AsyncIterator[StepEvent]:
    """Tear down everything discovery finds of this run, in reverse dependency order; then the run's
    data (checkpoints, models): kept and listed with its size, deleted only when ``delete_data``."""
    with session.changing():
        session.ctx.delete_data = delete_data  # a store the run made for its data goes with it then
        async for event in session.teardown():
            yield event
        async for event in data_after_down(session, delete_data):
            await _record_data(session, event)
            yield event


async def _record_data(session: RunSession, event: StepEvent) -> None:
    """The run's record follows its data: what `down` kept where rtui cannot look for free (a kube
    volume: a pod reads it) is remembered as measured, for `rtui status` of other runs; once deleted,
    it is forgotten, and so are the resources kept for it (kube: the namespace and the claim)."""
    data = event.data or {}
    if "kept" in data:
        local = isinstance(session.data_store(), LocalDirStore)  # a local dir is measured again when listed
        session.record.facts.kept_data = None if local else dict(data["kept"])
    elif "deleted" in data:
        session.record.facts.kept_data = None
        if any(entry.live for _, entry in session.ctx.ledger.items()):
            forget_missing(session.ctx, await session.discover())
    else:
        return
    session.store.save(session.record)


async def data_after_down(session: RunSession, delete_data: bool) -> AsyncIterator[StepEvent]:
    store = session.data_store()
    if store is None:
        return
    usage = await store.usage()
    if usage.bytes == 0 and usage.empty:
        await store.delete()  # nothing in it: removed with the rest
        return
    # The step's title first (the teardown pane's heading), then what became of the data.
    if not delete_data:
        yield StepEvent(step=DATA_STEP, kind=EventKind.STARTED, message="Keep the run's checkpoints and models")
        yield StepEvent(step=DATA_STEP, kind=EventKind.DONE, message=f"kept on purpose: {usage.describe()}",
                        remedy=f"delete it with `rtui down {session.run_id} --delete-data --yes`",
                        data={"kept": usage.to_dict()})
        return
    yield StepEvent(step=DATA_STEP, kind=EventKind.STARTED, message="Delete the run's checkpoints and models")
    yield StepEvent(step=DATA_STEP, kind=EventKind.PROGRESS, message=f"deleting {usage.describe()}")
    try:
        await store.delete()
    except (OSError, OperationError) as exc:
        yield StepEvent(step=DATA_STEP, kind=EventKind.FAILED, message=f"deleting {store.uri} failed: {exc}",
                        cause=str(exc), remedy="check its permissions and run the same command again")
        return
    yield StepEvent(step=DATA_STEP, kind=EventKind.DONE, message=f"deleted {usage.describe()}",
                    data={"deleted": usage.to_dict()})


@dataclass(frozen=True)
class Orphan:
    """A live cluster of ours that no run record on this machine knows about."""

    run_id: str
    cluster_name: str
    target: str
    where: str
    running: bool = True  # False: only its marks are left (a local dir whose processes are gone)


def find_orphans(store: RunStore, target: str, cluster_name: str | None = None) -> list[Orphan]:
    """Clusters the target finds from the world (markers) whose run has no record in this state dir."""
    found = target_of(target).live_clusters(cluster_name)
    if not found:
        return []
    known = {r.run_id for r in store.list()[0] if r.status is not RunStatus.DOWN}
    return [Orphan(c.run_id, c.cluster_name, target, c.where, c.running) for c in found
            if c.run_id not in known and not _recorded_elsewhere(store, c.run_id, c.state_dir)]


@dataclass(frozen=True)
class KeptData:
    """A torn-down run's data rtui keeps on purpose (until `rtui down RUN --delete-data --yes`)."""

    run_id: str
    usage: DataUsage
    target: str | None = None  # the target of the run that recorded it; None: a data dir on this machine

    def to_dict(self) -> dict[str, str | int | float | bool | None]:
        return {"run_id": self.run_id, "kept_on_purpose": True, **self.usage.to_dict()}


def kept_data(store: RunStore) -> list[KeptData]:
    """Data dirs of local runs that are down (or whose record is gone), and the data runs that are down
    keep elsewhere (a kube volume: as `down` measured it): not leftovers, kept on purpose."""
    records = store.list()[0]
    live = {r.run_id for r in records if r.status is not RunStatus.DOWN}
    out = []
    root = store.root / "data"
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.is_dir() and path.name not in live:
            usage = LocalDirStore(path).measure()
            if usage.bytes:
                out.append(KeptData(path.name, usage))
    listed = {k.run_id for k in out}
    for record in records:
        fact = record.facts.kept_data
        if record.status is RunStatus.DOWN and fact and record.run_id not in listed:
            cost = fact.get("monthly_cost")
            out.append(KeptData(record.run_id, DataUsage(
                str(fact.get("where") or ""), int(str(fact.get("bytes") or 0)), int(str(fact.get("models") or 0)),
                int(str(fact.get("checkpoints") or 0)),
                float(cost) if isinstance(cost, (int, float)) else None), record.target))
    return out


async def tagged_orphan(store: RunStore, config: RunConfig) -> RunSession | None:
    """A run of this cluster name the target's provider has resources of (aws: by our tags) and no
    record here knows."""
    tagged = await target_of(config.target).tagged_runs(config)
    if not tagged:
        return None
    known = {r.run_id for r in store.list()[0] if r.status is not RunStatus.DOWN}
    runs = [r for r in tagged if r not in known]
    return RunSession.orphan(runs[0], config, store) if runs else None


def _recorded_elsewhere(store: RunStore, run_id: str, state_dir: object) -> bool:
    """Whether another rtui state dir still holds this run's record: its run, not an orphan."""
    if not isinstance(state_dir, str) or Path(state_dir) == store.root:
        return False
    return (Path(state_dir) / "runs" / f"{run_id}.json").is_file()


def session_for_down(store: RunStore, run_id: str | None, config: RunConfig, *, by_cluster: bool) -> RunSession | None:
    """The run ``rtui down`` means: the one named, else this target's active run of this cluster
    name, else a cluster of that name found live without a record. None when there is nothing."""
    if run_id is not None:
        try:
            return RunSession.open(run_id, store, lenient=True)
        except UserError:
            orphans = [o for o in find_orphans(store, config.target) if o.run_id == run_id]
            if not orphans:
                raise
            return RunSession.orphan(run_id, config.model_copy(update={"cluster_name": orphans[0].cluster_name}), store)
    active = store.find_active(config.target, config.cluster_name)
    if active is not None:
        return RunSession.open(active.run_id, store, lenient=True)
    orphans = find_orphans(store, config.target, config.cluster_name)
    if orphans:
        return RunSession.orphan(orphans[0].run_id, config, store)
    if by_cluster:
        owned = [c for c in target_of(config.target).live_clusters(config.cluster_name)
                 if _recorded_elsewhere(store, c.run_id, c.state_dir)]
        if owned:
            raise OperationError(
                f"cluster {config.cluster_name} belongs to run {owned[0].run_id} of another state dir "
                f"({owned[0].state_dir}); this one leaves it alone",
                remedy=f"RTUI_STATE_DIR={owned[0].state_dir} rtui down {owned[0].run_id} --yes")
        return None
    return RunSession.open(None, store, lenient=True)


def plan_is_noop_below(plan: PlanResult, layer: str) -> bool:
    """Whether everything under ``layer`` (bench: the cluster without its job) is already in place."""
    return all(c.action is Action.NOOP for c in plan.changes if c.layer != layer)
