"""The ray-job layer: the training job, through the Ray Jobs API of whatever cluster is below.

Any cluster layer that offers ``ClusterAccess`` carries it: a local head, or a KubeRay head
reached through the Kubernetes API server. The job is found live by its metadata
(``rtui_run``), so a submission whose answer was lost in a crash is not made twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from backend import targets
from backend.config import RunConfig
from backend.delivery import check_storage_writable, effective_storage_path
from backend.errors import OperationError, UserError
from backend.hub import DatasetRevision, Revision, read_hf_token, resolve_dataset, resolve_revision
from backend.jobspec import build_job_spec, passed_env_values
from backend.layers.base import Context, Handler, Layer, job_secret_env, refuse_job_env_without_carrier
from backend.rayjobs import RayJobs, submit_when_ready
from backend.resources import Action, CheckResult, CheckStatus, Observed, Resource, Spec
from backend.runner import Progress
from backend.stepfit import memory_refusal
from backend.store import JobRecord, JobState
from backend.targets import InterruptionRate
from backend.waiting import Look, WaitTimedOut, wait_done

JOB = "ray.job.train"
STOP_WAIT_S = 15.0


def _hub_token(source: str) -> str | None:
    """The --hf-token value for asking the Hub about a private model (None: not set or unreadable;
    the kube layer's preflight says what is wrong with it)."""
    if not source:
        return None
    try:
        return read_hf_token(source)
    except UserError:
        return None


class JobSpecSummary(Spec):
    """What the plan shows of the job, and what it is compared by (``spec_hash``): the full job is made
    again from the config at submission (``build_job_spec``), pinned to the commits shown here."""

    # In the order the plan shows them.
    entrypoint: str
    workers: int
    step: str | None = None  # what one optimizer step is
    checkpoint: str | None = None  # what --checkpoint-every auto means for this job
    job_env: str | None = None  # the names of the variables passed
    model_revision: str | None = None  # "<commit> (<what was asked>)"
    data: str | None = None  # "<commit> ..." of a hub dataset, with its licence
    spec_hash: str

    def pinned(self, shown: str | None) -> str | None:
        """The commit a shown pin starts with (``model_revision``, ``data``): the one submitted."""
        return (shown or "").split(" ", 1)[0] or None


class JobHandler(Handler):
    kind = "ray-job"
    spec_model = JobSpecSummary
    title = "Submit the training job"
    delete_title = "Stop the training job"
    expected_s = 3.0
    retries = 2
    backoff_s = 1.0

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        status = JobState(have.state.get("status", "FAILED"))
        same = have.state.get("spec_hash") == JobSpecSummary.of(want).spec_hash
        if same and status in (JobState.PENDING, JobState.RUNNING, JobState.SUCCEEDED):
            return Action.NOOP, f"same job already {status.value.lower()}"
        if not status.terminal:
            return Action.REPLACE, "the job changed: the running one will be stopped"
        return Action.CREATE, "the job changed" if not same else f"last job {status.value.lower()}"

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        jobs = await _jobs(ctx)
        # The commit the plan resolved and showed, never the branch's newer head.
        shown = JobSpecSummary.of(want)
        revision, data = shown.pinned(shown.model_revision), shown.pinned(shown.data)  # the dataset's, likewise
        spec = build_job_spec(_with_storage(ctx), revision, run_id=ctx.record.run_id, data=data,
                              interruption_rate=_interruption_rate(ctx))
        submission_id = f"rtui-{ctx.record.run_id}-{len(ctx.record.jobs) + 1}"
        runtime_env = {**spec.runtime_env, "env_vars": {
            **spec.runtime_env.get("env_vars", {}), **_job_env(ctx),
            **job_secret_env(ctx, submission_id, passed_env_values(spec))}}
        yield Progress(f"submitting {submission_id}", 0.3)
        async for waiting in submit_when_ready(
                jobs, entrypoint=spec.entrypoint, submission_id=submission_id, runtime_env=runtime_env,
                metadata={"rtui_run": ctx.record.run_id, "rtui_spec": spec.spec_hash}):
            yield Progress(waiting, 0.3)
        ctx.record.jobs.append(JobRecord(submission_id=submission_id, submitted_at=time.time(),
                                         spec_hash=spec.spec_hash, spool_path=ctx.record.next_job_spool_path()))
        ctx.ledger.update(want.address, id=submission_id, outputs={"spec_hash": spec.spec_hash})
        yield Progress(f"submitted {submission_id}", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        jobs = await ctx.jobs()
        if jobs is None:
            yield Progress("the cluster is gone, and the job with it", 1.0)
            return
        status = await jobs.status(have.id)
        if not status.terminal:
            yield Progress(f"stopping {have.id}")
            await jobs.stop(have.id)
            seen = [status]

            async def stopped() -> Look:
                seen[0] = await jobs.status(have.id)
                return Look(done=seen[0].terminal, message=seen[0].status.lower())

            # Past the wait the job's own state is recorded as it is (Ray stops it in its own time).
            with contextlib.suppress(WaitTimedOut):
                await wait_done(stopped, what=f"job {have.id}", timeout_s=STOP_WAIT_S, poll_s=0.5)
            status = seen[0]
        for job in ctx.record.jobs:
            if job.submission_id == have.id:  # the state and Ray's message for it, never one without the other
                job.status, job.message, job.ended_at = status.state, status.message, status.end_time
        ctx.save()
        yield Progress(f"job {status.status.lower()}", 1.0)


class RayJobLayer(Layer):
    name = "ray-job"
    title = "Ray job"
    _handlers: ClassVar[dict[str, Handler]] = {"ray-job": JobHandler()}

    @property
    def handlers(self) -> Mapping[str, Handler]:
        return self._handlers

    def __init__(self) -> None:
        self._revisions: dict[tuple[str, str], Revision] = {}
        self._datasets: dict[str, DatasetRevision] = {}

    async def prepare(self, ctx: Context) -> None:
        """The hub commit the job loads, asked at plan time (none for a local model directory); and
        refused here, before the cluster is paid for: ``--job-env`` where the cluster cannot carry its
        values privately, a step the GPUs' memory cannot hold by the plan's estimate."""
        config = ctx.config
        refuse_job_env_without_carrier(ctx)
        refusal = memory_refusal(config)
        if refusal is not None:
            raise refusal
        await self._pin_model(config)
        data = config.effective_data()
        if config.data_is_hub() and targets.get(config.target).offline:
            raise UserError(f"--data {data}: the {config.target} target works offline, without the Hub",
                            remedy="give a local JSONL/Parquet file, `cycle` or `random`")
        if config.data_is_hub() and data not in self._datasets:  # a Hub dataset is pinned like the model
            self._datasets[data] = await asyncio.to_thread(resolve_dataset, data, token=_hub_token(config.hf_token))

    async def _pin_model(self, config: RunConfig) -> None:
        model_id = config.effective_model_id()
        known = (model_id, config.model_revision) in self._revisions
        if targets.get(config.target).offline or model_id is None or known:
            return
        if Path(model_id).expanduser().is_dir():
            if config.model_revision:
                raise UserError(f"--model-id {model_id} is a directory, which has no revision",
                                remedy="drop --model-revision, or name a hub model id")
            return
        self._revisions[(model_id, config.model_revision)] = await asyncio.to_thread(
            resolve_revision, model_id, config.model_revision, token=_hub_token(config.hf_token))

    def desired(self, ctx: Context, below: Sequence[Resource]) -> list[Resource]:
        revision = self._revision(ctx)
        dataset = self._datasets.get(ctx.config.effective_data())
        spec = build_job_spec(_with_storage(ctx), revision.sha if revision else None, run_id=ctx.record.run_id,
                              data=dataset.ref.uri(dataset.sha) if dataset else None,
                              interruption_rate=_interruption_rate(ctx))
        pinned = {"model_revision": f"{revision.sha} ({revision.asked})"} if revision else {}
        if dataset:  # the plan names the dataset, its commit and its licence
            pinned["data"] = dataset.describe()
        return [Resource(address=JOB, layer=self.name, kind="ray-job", cost_per_hour=0.0,
                         spec=JobSpecSummary(**spec.summary(), **pinned, spec_hash=spec.spec_hash).as_spec(),
                         depends_on=tuple(r.address for r in below))]

    def _revision(self, ctx: Context) -> Revision | None:
        model_id = ctx.config.effective_model_id()
        return None if model_id is None else self._revisions.get((model_id, ctx.config.model_revision))

    async def preflight(self, ctx: Context) -> list[CheckResult]:
        results = []
        if ctx.config.storage_path:  # where checkpoints and the model go: a write the run can make?
            results.append(await asyncio.to_thread(
                check_storage_writable, ctx.config.storage_path,
                profile=targets.get(ctx.config.target).storage_profile(ctx.config), run_id=ctx.record.run_id,
                clients=ctx.clients))
        names = ctx.config.job_env_names()
        if not names:
            return results
        try:
            passed_env_values(build_job_spec(ctx.config))
        except UserError as exc:
            return [*results, CheckResult(id="job.env", title="Variables passed to the job",
                                          status=CheckStatus.FAIL, detail=exc.message, remedy=exc.remedy)]
        return [*results, CheckResult(id="job.env", title="Variables passed to the job", status=CheckStatus.OK,
                                      detail=", ".join(names))]

    async def discover(self, ctx: Context) -> list[Observed]:
        jobs = await ctx.jobs()
        if jobs is None:
            return []
        try:
            listed = await jobs.list()
        except OperationError:  # the head went away since it answered: no job can be seen running
            return []
        ours = [j for j in listed if j.metadata.get("rtui_run") == ctx.record.run_id and "rtui_bench" not in j.metadata]
        if not ours:
            return []
        latest = max(ours, key=lambda j: (j.start_time or 0, j.submission_id))
        known = {j.submission_id: j.spec_hash for j in ctx.record.jobs}
        spec_hash = latest.metadata.get("rtui_spec") or known.get(latest.submission_id)
        return [Observed(address=JOB, layer=self.name, kind="ray-job", id=latest.submission_id,
                         state={"status": latest.state.value, "spec_hash": spec_hash, "entrypoint": latest.entrypoint},
                         depends_on=(), reason=latest.state.value.lower())]


def _interruption_rate(ctx: Context) -> InterruptionRate:
    """The target's expected interruptions per node-hour for this run, by what its layers decided (its facts:
    a Spot run that fell back to On-Demand is rated as On-Demand), for --checkpoint-every auto."""
    return targets.get(ctx.config.target).interruption_rate(ctx.config, ctx.record.facts)


async def _jobs(ctx: Context) -> RayJobs:
    jobs = await ctx.jobs()
    if jobs is None:
        raise OperationError("no Ray cluster of this run is up to take the job",
                             remedy="apply the whole plan (`rtui up --yes`)")
    return jobs


def _with_storage(ctx: Context) -> RunConfig:
    """The config the job is built from: ``--storage-path``, else the storage a layer below made for the
    run (the aws layer's bucket, ``RunFacts.storage_path``)."""
    storage = effective_storage_path(ctx.config.storage_path, ctx.record.facts.storage_path)
    return ctx.config if storage == ctx.config.storage_path else ctx.config.model_copy(update={"storage_path": storage})


def _job_env(ctx: Context) -> dict[str, str]:
    return ctx.cluster.job_env(ctx) if ctx.cluster is not None else {}
