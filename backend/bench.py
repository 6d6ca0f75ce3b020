"""`rtui bench fabric|ab`: measure the network a run will train on, before training.

Both benches bring the run's cluster up the way ``rtui up --until head`` does (same plan,
same steps), then submit short jobs through the Ray Jobs API, one per *variant*: on GPU
targets "efa" (the EFA environment) and "tcp" (NCCL forced onto sockets), on the local
target a single "gloo" variant — there is no EFA on this machine, and running gloo twice
would only measure noise. Each job's log goes to its own file under the state dir (not
the run's spool: the A/B's metric lines would pollute the training run's series); the
numbers come from the tagged JSON lines of ``training.protocol``, the transport from the
NCCL verdict of ``Telemetry`` over the same log. A ratio is only given when both variants
really ran on the transport they were meant to; otherwise it is null with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from backend import flows, targets
from backend.config import RunConfig
from backend.errors import OperationError, UserError
from backend.jobspec import JobSpec, build_job_spec, passed_env_values
from backend.layers.base import job_secret_env
from backend.rayjobs import RayJobs, submit_when_ready
from backend.resources import EventKind, StepEvent
from backend.store import JobState
from backend.telemetry import Telemetry
from training.protocol import FABRIC_TAG, parse_record

if TYPE_CHECKING:
    from backend.session import RunSession

EventSink = Callable[[StepEvent], None]

# What the worker pods already carry (DESIGN.md §3), restated so a variant never
# depends on the image's defaults. No FI_EFA_USE_DEVICE_RDMA: g6 has no GPUDirect RDMA.
EFA_ENV = {"FI_PROVIDER": "efa", "NCCL_NET_PLUGIN": "ofi", "NCCL_DEBUG": "INFO"}
# Forced TCP: NCCL's own socket transport, libfabric on tcp, the OFI plugin not loaded.
TCP_ENV = {"NCCL_NET": "Socket", "FI_PROVIDER": "tcp", "NCCL_NET_PLUGIN": "none", "NCCL_DEBUG": "INFO"}


@dataclass(frozen=True)
class Variant:
    name: str
    env: dict[str, str]
    expects: tuple[str, ...]  # verdicts that count as "ran as intended"


VARIANTS = {
    "efa": Variant("efa", EFA_ENV, ("efa", "efa_gdr")),
    "tcp": Variant("tcp", TCP_ENV, ("socket",)),
    "gloo": Variant("gloo", {}, ("gloo",)),
}
NO_EFA_LOCALLY = ("the local target has no EFA: only gloo over loopback TCP was measured "
                  "(use --target aws for an EFA-vs-TCP ratio)")
JOB_LAYER = "ray-job"
JOB_TIMEOUT_S = 900.0
HEARTBEAT_S = 5.0


def select_variants(config: RunConfig, names: Sequence[str] | None = None) -> list[Variant]:
    allowed = targets.get(config.target).bench_variants
    chosen = list(dict.fromkeys(names)) if names else list(allowed)
    for name in chosen:
        if name not in allowed:
            raise UserError(f"variant {name!r} is not available on the {config.target} target",
                            remedy=f"use {' or '.join(allowed)}")
    return [VARIANTS[n] for n in chosen]


# --- results, parsed from a job log ---------------------------------------------------------
@dataclass
class FabricRun:
    variant: str
    transport: str
    world_size: int
    nodes: int
    results: list[dict[str, Any]]
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "transport": self.transport, "world_size": self.world_size,
                "nodes": self.nodes, "results": self.results, "transport_reason": self.reason, **self.extra}


def _verdict(lines: Iterable[str]) -> tuple[str, str, dict[str, Any] | None]:
    """(transport, why, RTUI_SUMMARY record) from one pass of Telemetry over the lines."""
    telemetry = Telemetry()
    telemetry.feed_lines(lines)
    verdict = telemetry.transport
    return verdict.transport, verdict.reason, telemetry.series.summary


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def parse_fabric_log(lines: Sequence[str], *, variant: str) -> FabricRun:
    """The sweep's RTUI_FABRIC record; the NCCL verdict fills the transport on GPUs."""
    record: dict[str, Any] | None = None
    for line in lines:
        if FABRIC_TAG in line:
            parsed = parse_record(line, (FABRIC_TAG,))
            record = parsed[1] if parsed else record
    if record is None:
        raise OperationError(f"the {variant} fabric job printed no {FABRIC_TAG} record")
    results = record.get("results")
    keys = ("size_bytes", "time_us", "algbw_gbps", "busbw_gbps")
    if not isinstance(results, list) or not results or not all(
            isinstance(r, dict) and all(_positive(r.get(k)) for k in keys) for r in results):
        raise OperationError(f"the {variant} fabric job printed a malformed {FABRIC_TAG} record")
    transport, reason = record.get("transport"), "the job ran its collectives on gloo"
    if not transport:
        transport, reason, _ = _verdict(lines)
    return FabricRun(variant, str(transport), int(record.get("world_size", 0)), int(record.get("nodes", 0)),
                     [{k: r[k] for k in keys} for r in results], reason,
                     {k: record[k] for k in ("iters", "warmup", "capped", "hosts") if k in record})


def _mismatch(run_variant: str, transport: str) -> str | None:
    variant = VARIANTS[run_variant]
    if transport in variant.expects:
        return None
    if transport == "intra_node":
        return (f"the {run_variant} run never used the network (single node: NCCL used P2P/SHM); "
                "a fabric ratio needs workers on two or more nodes")
    return f"the {run_variant} run used {transport}, not {' or '.join(variant.expects)}"


def fabric_ratio(runs: dict[str, FabricRun]) -> dict[str, Any]:
    """EFA over TCP busbw at the largest size both swept (where bandwidth saturates)."""
    if set(runs) != {"efa", "tcp"}:
        why = NO_EFA_LOCALLY if "gloo" in runs else "the ratio needs both the efa and the tcp variant"
        return {"ratio": None, "raw_ratio": None, "ratio_size_bytes": None, "ratio_by_size": [], "reason": why}
    efa = {r["size_bytes"]: r["busbw_gbps"] for r in runs["efa"].results}
    tcp = {r["size_bytes"]: r["busbw_gbps"] for r in runs["tcp"].results}
    by_size = [{"size_bytes": s, "ratio": round(efa[s] / tcp[s], 3)} for s in sorted(set(efa) & set(tcp))
               if tcp[s] > 0]
    raw = by_size[-1]["ratio"] if by_size else None
    reason = _mismatch("efa", runs["efa"].transport) or _mismatch("tcp", runs["tcp"].transport)
    if raw is None and reason is None:
        reason = "the two sweeps share no message size with a nonzero TCP busbw"
    return {"ratio": raw if reason is None else None, "raw_ratio": raw,
            "ratio_size_bytes": by_size[-1]["size_bytes"] if by_size else None, "ratio_by_size": by_size,
            "reason": reason}


def fabric_report(runs: dict[str, FabricRun]) -> dict[str, Any]:
    """The CLI's one JSON object: the first variant's sweep at the top, every variant below."""
    first = next(iter(runs.values()))
    return {"transport": first.transport, "world_size": first.world_size, "nodes": first.nodes,
            "results": first.results, "variants": {k: v.to_dict() for k, v in runs.items()},
            **fabric_ratio(runs)}


def parse_ab_log(lines: Sequence[str], *, variant: str, local: bool) -> dict[str, Any]:
    transport, reason, summary = _verdict(lines)
    if local:
        transport, reason = "gloo", "the local target trains on CPU with gloo"
    if not summary or not _positive(summary.get("tokens_per_s_mean")):
        raise OperationError(f"the {variant} training job printed no RTUI_SUMMARY with tokens_per_s_mean")
    step_time = summary.get("step_time_s_mean")
    return {"variant": variant, "transport": transport, "transport_reason": reason,
            "tokens_per_s": summary["tokens_per_s_mean"],
            "steps_per_s": round(1 / step_time, 4) if _positive(step_time) and step_time else None,
            "step_time_s": step_time, "steps": summary.get("steps"), "world_size": summary.get("world_size")}


def ab_report(sides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    a, b = sides.get("efa") or sides.get("gloo"), sides.get("tcp")
    if a is None or b is None:
        why = NO_EFA_LOCALLY if "gloo" in sides else "the speedup needs both the efa and the tcp variant"
        return {"a": a, "b": b, "speedup": None, "raw_speedup": None, "reason": why}
    raw = round(a["tokens_per_s"] / b["tokens_per_s"], 3)
    reason = _mismatch("efa", a["transport"]) or _mismatch("tcp", b["transport"])
    return {"a": a, "b": b, "speedup": raw if reason is None else None, "raw_speedup": raw, "reason": reason}


# --- running ------------------------------------------------------------------------------
def _event(step: str, kind: EventKind, message: str, **data: Any) -> StepEvent:
    return StepEvent(step=step, kind=kind, message=message, data=data)


async def bring_up(session: RunSession, on_event: EventSink) -> RayJobs:
    """What ``rtui up --until <cluster layer>`` does: the same flow, stopping below the job."""
    cluster_layer = session.stack.layers[-2].name
    plan = await session.plan()
    if flows.plan_is_noop_below(plan, JOB_LAYER):
        on_event(_event("cluster", EventKind.DONE, "cluster already up"))
        return await _jobs_of(session)
    async for event in flows.up(session, until=cluster_layer, follow=False):
        on_event(event)
        if event.kind in (EventKind.FAILED, EventKind.CANCELLED) and event.step != flows.RUN:
            raise OperationError(f"bringing the cluster up failed at {event.step}: {event.message}",
                                 remedy=event.remedy or f"see `rtui status {session.run_id}`")
    return await _jobs_of(session)


async def _jobs_of(session: RunSession) -> RayJobs:
    jobs = await session.jobs()
    if jobs is None:
        raise OperationError("the cluster is up but has no Jobs API address")
    await _refuse_if_training(session, jobs)
    return jobs


async def _refuse_if_training(session: RunSession, jobs: RayJobs) -> None:
    job = session.record.current_job
    if job is None:
        return
    live = await jobs.status(job.submission_id)
    if not live.terminal:
        raise UserError(f"training job {job.submission_id} is {live.status.lower()} on this cluster: a bench "
                        "would compete with it for the same workers",
                        remedy=f"wait for it (`rtui logs {session.run_id} -f`) or start over with `rtui down`")


def bench_dir(session: RunSession) -> Path:
    """``<state>/bench/<run id>/``: private like the run records (job logs can name hosts and paths)."""
    path = session.store.root / "bench" / session.run_id
    for directory in (path.parent.parent, path.parent, path):
        directory.mkdir(exist_ok=True, mode=0o700)
    return path


def _private_open(path: Path) -> TextIO:
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8")


_FABRIC_PROGRESS = re.compile(r"rtui-fabric: (\S+ \S+) done")


def _progress_of(line: str) -> str | None:
    if match := _FABRIC_PROGRESS.search(line):
        return f"swept {match.group(1)}"
    if "RTUI_METRIC" in line:
        parsed = parse_record(line)
        if parsed and isinstance(parsed[1].get("step"), int):
            return f"step {parsed[1]['step']}"
    return None


async def run_job(session: RunSession, jobs: RayJobs, spec: JobSpec, *, label: str, variant: Variant,
                  on_event: EventSink, timeout_s: float = JOB_TIMEOUT_S) -> tuple[list[str], Path]:
    """Submit one bench job, follow its log into a file, return its lines once it succeeded."""
    submission_id = f"rtui-{session.run_id}-{label}-{time.strftime('%H%M%S')}"
    secret_env = job_secret_env(session.ctx, submission_id, passed_env_values(spec))
    env = {**spec.runtime_env.get("env_vars", {}), **secret_env, **variant.env}
    # The cluster's own job environment (locally: results inside its dir, which teardown removes).
    env.update(session.ctx.cluster.job_env(session.ctx) if session.ctx.cluster is not None else {})
    log_path = bench_dir(session) / f"{submission_id}.log"
    on_event(_event(label, EventKind.STARTED, f"submitting {submission_id}", submission_id=submission_id,
                    log=str(log_path), entrypoint=spec.entrypoint, env=variant.env))
    async for waiting in submit_when_ready(jobs, entrypoint=spec.entrypoint, submission_id=submission_id,
                                           runtime_env={**spec.runtime_env, "env_vars": env},
                                           metadata={"rtui_run": session.run_id, "rtui_bench": label}):
        on_event(_event(label, EventKind.PROGRESS, waiting))
    started = time.monotonic()
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for chunk in jobs.follow(submission_id):
                queue.put_nowait(chunk)
        finally:
            queue.put_nowait(None)

    pumper = asyncio.create_task(pump())
    text: list[str] = []
    last_said = started
    try:
        with _private_open(log_path) as log:
            async with asyncio.timeout(timeout_s):
                while True:
                    if time.monotonic() - last_said >= HEARTBEAT_S:  # alive while Ray starts workers
                        last_said = time.monotonic()
                        on_event(_event(label, EventKind.PROGRESS, f"running ({last_said - started:.0f}s)"))
                    try:
                        chunk = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
                    except TimeoutError:
                        continue
                    if chunk is None:
                        break
                    log.write(chunk)
                    log.flush()
                    text.append(chunk)
                    for line in chunk.splitlines():
                        message = _progress_of(line)
                        # Every swept size, but training steps at most once a second.
                        if message and (message.startswith("swept") or time.monotonic() - last_said >= 1.0):
                            last_said = time.monotonic()
                            on_event(_event(label, EventKind.PROGRESS, message))
        await pumper  # re-raises what stopped the stream (e.g. a lost dashboard)
    except (TimeoutError, asyncio.CancelledError) as exc:
        pumper.cancel()
        with contextlib.suppress(Exception):
            await jobs.stop(submission_id)
        if isinstance(exc, TimeoutError):
            raise OperationError(f"{label} did not finish within {timeout_s:.0f}s; stopped it",
                                 remedy=f"see {log_path}") from None
        raise
    status = await jobs.status(submission_id)
    lines = "".join(text).splitlines()
    if status.state is not JobState.SUCCEEDED:
        detail = next((ln for ln in reversed(lines) if "failed" in ln), status.message or "")
        raise OperationError(f"{label} job {status.status.lower()}: {detail.strip()[:200]}",
                             remedy=f"see {log_path}")
    on_event(_event(label, EventKind.DONE, f"{label} finished in {time.monotonic() - started:.0f}s",
                    log=str(log_path)))
    return lines, log_path


def fabric_spec(config: RunConfig, *, iters: int | None = None, warmup: int | None = None,
                max_bytes: int | None = None) -> JobSpec:
    """The sweep, shipped and configured exactly like the training job (same py_modules and env)."""
    base = build_job_spec(config)
    args = ["python", "-m", "training.fabric", "--num-workers", str(base.workers),
            "--device", "cuda" if targets.get(config.target).on_gpus else "cpu"]
    for flag, value in (("--iters", iters), ("--warmup", warmup), ("--max-bytes", max_bytes)):
        if value is not None:
            args += [flag, str(value)]
    return JobSpec(entrypoint=shlex.join(args), runtime_env=base.runtime_env, workers=base.workers,
                   passed_env=base.passed_env)


def _save(session: RunSession, name: str, report: dict[str, Any]) -> None:
    with _private_open(bench_dir(session) / f"{name}.json") as fh:
        fh.write(json.dumps({"at": time.time(), **report}, indent=1) + "\n")


async def run_fabric(session: RunSession, *, variants: Sequence[str] | None = None,
                     on_event: EventSink = lambda _e: None, iters: int | None = None, warmup: int | None = None,
                     max_bytes: int | None = None, timeout_s: float = JOB_TIMEOUT_S) -> dict[str, Any]:
    """The fabric check on every variant, and the EFA-vs-TCP busbw ratio when it means something."""
    chosen = select_variants(session.config, variants)
    jobs = await bring_up(session, on_event)
    spec = fabric_spec(session.config, iters=iters, warmup=warmup, max_bytes=max_bytes)
    runs: dict[str, FabricRun] = {}
    for variant in chosen:
        lines, log = await run_job(session, jobs, spec, label=f"fabric-{variant.name}", variant=variant,
                                   on_event=on_event, timeout_s=timeout_s)
        runs[variant.name] = parse_fabric_log(lines, variant=variant.name)
        runs[variant.name].extra["log"] = str(log)
    report = fabric_report(runs)
    _save(session, "fabric", report)
    return report


async def run_ab(session: RunSession, *, variants: Sequence[str] | None = None, steps: int | None = None,
                 on_event: EventSink = lambda _e: None, timeout_s: float = JOB_TIMEOUT_S) -> dict[str, Any]:
    """Two short training jobs, EFA then TCP; the speedup is their tokens/s ratio."""
    chosen = select_variants(session.config, variants)
    local = not session.target.on_gpus
    steps = steps or session.target.bench_ab_steps
    # The transport guard stays off: the verdict over each log says what each side ran on.
    config = session.config.model_copy(update={"steps": steps, "require_transport": "any"})
    jobs = await bring_up(session, on_event)
    spec = build_job_spec(config)
    sides: dict[str, dict[str, Any]] = {}
    for variant in chosen:
        lines, log = await run_job(session, jobs, spec, label=f"ab-{variant.name}", variant=variant,
                                   on_event=on_event, timeout_s=timeout_s)
        sides[variant.name] = {**parse_ab_log(lines, variant=variant.name, local=local), "log": str(log)}
    report = {**ab_report(sides), "steps": steps}
    _save(session, "ab", report)
    return report
