"""Every command-line command (``rtui COMMAND``; ``tui.cli`` parses the arguments and calls ``run``): each
resolves a run or a config, calls the backend, prints the result and returns the exit code."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TextIO

from backend import targets
from backend.config import config_for, held_reason
from backend.delivery import LOAD_HINT, human_bytes, model_summary
from backend.errors import UserError
from backend.resolve import ResolvedConfig, trust_command
from backend.resources import CheckStatus, EventKind, Plan, StepEvent
from backend.session import RunSession
from backend.store import RunStatus, RunStore, new_run_id
from backend.textutil import strip_ansi
from backend.trust import remember
from training.fabric import format_table, human_size
from tui.invocation import resolved_from, rtui_command
from tui.render import eval_line, format_event, format_plan, format_status, status_row


def _json_line(out: TextIO, payload: dict[str, Any]) -> None:
    out.write(json.dumps(payload, default=str) + "\n")
    out.flush()


def run(ns: argparse.Namespace, out: TextIO) -> int:
    """The command ``ns`` names (``rtui COMMAND``, parsed by ``tui.cli``); its exit code."""
    if ns.command == "config":
        return config_trust(ns, out) if ns.action == "trust" else config_show(ns, out)
    if ns.command == "logs" and getattr(ns, "word", None) == "classify":
        return classify(ns, out)
    simple: dict[str, Callable[[argparse.Namespace, TextIO], int]] = {
        "check": check, "manifest": manifest, "token": token}
    if ns.command in simple:
        return simple[ns.command](ns, out)
    handler: dict[str, Callable[[argparse.Namespace, TextIO], Coroutine[Any, Any, int]]] = {
        "plan": plan, "up": up, "status": status, "logs": logs, "down": down, "runs": runs, "bench": bench,
        "model": model}
    return asyncio.run(handler[ns.command](ns, out))


def token(ns: argparse.Namespace, out: TextIO) -> int:
    # lazy: boto3 only for `rtui token` (kubectl's exec plugin)
    from targets.aws.eks import token_command_output

    out.write(token_command_output(ns.cluster_name, ns.region, ns.profile) + "\n")
    return 0


def config_show(ns: argparse.Namespace, out: TextIO) -> int:
    """The values a run on this target uses (auto resolved), where each came from; only the target's fields,
    and every field a checkout's file sets that is held until the user confirms it (with why)."""
    resolved = resolved_from(ns, untrusted="show")
    config = resolved.config
    values = config.model_dump(mode="json")
    auto = config.auto_values()
    held = {field: held_reason(field) for field in resolved.unconfirmed}
    if ns.json:
        # "config" stays the raw values (what a rtui.toml would hold); "effective" is what a run uses;
        # "fields" are the ones the target reads; "held" the file's fields waiting for a confirmation.
        json.dump({"config": values, "effective": {**values, **auto}, "auto": sorted(auto),
                   "fields": list(config.fields_of_target()), "sources": resolved.sources,
                   "config_file": resolved.config_file, "unconfirmed": sorted(resolved.unconfirmed),
                   "held": held}, out)
        out.write("\n")
        return 0
    rows = config.effective_rows(resolved.sources)
    shown_fields = {field for field, _, _ in rows}
    # The file's content is confirmed whole: a held field this target ignores is listed too.
    rows += [(field, resolved.unconfirmed[field], resolved.sources[field])
             for field in held if field not in shown_fields]
    width = max(len(field) for field, _, _ in rows)
    for field, value, source in rows:
        out.write(f"{field:<{width}}  {json.dumps(value):<48}  {source}\n")
    out.write(f"(the fields the {config.target} target uses; `--target` shows another's)\n")
    if held:
        many = len(held) > 1
        command = trust_command(getattr(ns, "config_file", None))
        out.write(f"{len(held)} field{'s' if many else ''} of {resolved.config_file} {'are' if many else 'is'} held "
                  f"until you confirm its content: review {'them' if many else 'it'}, then run `{command}` (or pass "
                  "the values as flags)\n")
    return 0


def config_trust(ns: argparse.Namespace, out: TextIO) -> int:
    """Confirm the held fields of ./rtui.toml (or --config FILE) in the content read now (checked like any
    config first)."""
    resolved = resolved_from(ns, untrusted="show")
    if not resolved.unconfirmed or resolved.config_file is None or resolved.config_sha256 is None:
        out.write("nothing to confirm: the config file read here sets no held field, is your own config dir's, "
                  "or is confirmed already\n")
        return 0
    remember(Path(resolved.config_file), resolved.config_sha256)
    for field, value in resolved.unconfirmed.items():
        out.write(f"{field} = {json.dumps(value)}  ({held_reason(field)})\n")
    out.write(f"confirmed {resolved.config_file} (sha256 {resolved.config_sha256[:16]}…); any change to it asks "
              "again\n")
    return 0


def check(ns: argparse.Namespace, out: TextIO) -> int:
    resolved = resolved_from(ns)
    config = resolved.config
    target = targets.get(config.target)
    code = target.feasibility(config, regions=getattr(ns, "cfg_region", None), all_regions=ns.all_regions,
                              request_quota=ns.request_quota_increase, yes=ns.yes, as_json=ns.json, out=out)
    if code is not None:
        return code
    matrix = " or ".join(f"--target {t}" for t in targets.names() if targets.get(t).has_feasibility)
    if ns.request_quota_increase:
        raise UserError(f"--request-quota-increase is for {matrix}")
    if ns.all_regions:
        raise UserError(f"--all-regions is for {matrix}")
    return asyncio.run(_preflight(resolved, ns.json, out))


def manifest(ns: argparse.Namespace, out: TextIO) -> int:
    config = resolved_from(ns).config
    if not targets.get(config.target).has_kubernetes:
        kube = " or ".join(f"--target {t}" for t in targets.names() if targets.get(t).has_kubernetes)
        raise UserError(f"the {config.target} target has no Kubernetes objects", remedy=f"use {kube}")
    text = targets.get(config.target).manifest(config, new_run_id() if ns.run_id is None else ns.run_id)
    out.write(text or "")
    return 0


def classify(ns: argparse.Namespace, out: TextIO) -> int:
    if not ns.files:
        raise UserError("no files to classify", remedy="use `rtui logs classify FILE... [--json]` (- for stdin)")
    try:
        # lazy: the log classifier only for `rtui logs classify`
        from backend.telemetry.classify import classify_command
    except ImportError:
        raise UserError("log classification is not available in this version") from None
    return classify_command(ns.files, as_json=ns.json, stdout=out, stdin=sys.stdin, stderr=sys.stderr)


async def plan(ns: argparse.Namespace, out: TextIO) -> int:
    async with RunSession.for_config(resolved_from(ns)) as session:
        the_plan = await session.plan()
        if ns.json:
            _json_line(out, {"run_id": session.run_id, "target": the_plan.target, "noop": the_plan.is_noop,
                             "cost_per_hour": the_plan.cost_per_hour, "price_source": the_plan.price_source,
                             "usage_costs": the_plan.usage_costs, "notes": the_plan.notes,
                             "counts": the_plan.counts(),
                             "layers": the_plan.layers(),
                             "changes": [c.model_dump(mode="json") for c in the_plan.changes]})
        else:
            out.write(format_plan(the_plan, run_id=session.run_id))
        return 0


async def up(ns: argparse.Namespace, out: TextIO) -> int:
    # lazy: the flows load the job-following machinery (~120 ms); `rtui token`, run on every kubectl call, does without
    from backend import flows

    if not ns.yes:
        raise UserError("`rtui up` changes things and needs --yes", remedy="or run `rtui` to review the plan first")
    async with RunSession.for_config(resolved_from(ns)) as session:
        session.store.ensure_writable()
        emit = _emitter(ns.json, out)
        ok = False
        async for event in flows.up(session, until=ns.until, az_failover=ns.az_failover):
            emit(event)
            if event.step == flows.RUN and event.kind is EventKind.STARTED and not ns.json:
                out.write(format_plan(Plan.model_validate(event.data["plan"]), run_id=session.run_id))
            if event.step == flows.RUN and event.kind in (EventKind.DONE, EventKind.FAILED):
                ok = event.kind is EventKind.DONE
        if ok and not ns.json:
            rtui = rtui_command()  # pasteable from here, also when `rtui` is not on the PATH
            out.write(f"\nThe cluster stays up. Logs: {rtui} logs {session.run_id}  ·  "
                      f"tear down: {rtui} down {session.run_id} --yes\n")
        return 0 if ok else 1


def _emitter(as_json: bool, out: TextIO) -> Callable[[StepEvent], None]:
    started = time.monotonic()

    def emit(event: StepEvent) -> None:
        if as_json:
            _json_line(out, event.model_dump(mode="json"))
        elif event.kind is not EventKind.LOG:
            out.write(format_event(event, time.monotonic() - started) + "\n")
            out.flush()

    return emit


async def _preflight(resolved: ResolvedConfig, as_json: bool, out: TextIO) -> int:
    """Preflight of a target without a feasibility matrix: exit 0 when nothing fails, 3 when something does."""
    async with RunSession.for_config(resolved) as session:
        results = await session.preflight()
        failed = any(r.status is CheckStatus.FAIL for r in results)
        if as_json:
            _json_line(out, {"target": session.config.target, "checks": [r.model_dump(mode="json") for r in results],
                             "feasible": not failed})
        else:
            marks = {CheckStatus.OK: "✓", CheckStatus.WARN: "!", CheckStatus.FAIL: "✗", CheckStatus.INFO: "i"}
            for r in results:
                out.write(f"{marks[r.status]} {r.title}" + (f" — {r.detail}" if r.detail else "")
                          + (f"\n    {r.remedy}" if r.remedy and r.status is not CheckStatus.OK else "") + "\n")
        return 3 if failed else 0


async def status(ns: argparse.Namespace, out: TextIO) -> int:
    # lazy: the flows load the job-following machinery (~120 ms); `rtui token`, run on every kubectl call, does without
    from backend import flows

    store = RunStore()
    resolved = resolved_from(ns)
    # --target (or RTUI_TARGET) and --cluster-name narrow which run "the latest" is.
    wanted = {f: getattr(resolved.config, f) for f in ("target", "cluster_name")
              if resolved.sources.get(f) in ("flag", "env")}
    session: RunSession | None
    missing: UserError | None = None
    try:
        session = RunSession.open(ns.run_id if ns.run_id is not None or not wanted else _latest_of(store, wanted),
                                  store, lenient=True)
    except UserError as exc:
        if ns.run_id is not None or wanted:
            raise
        session, missing = None, exc
    if session is not None and ns.run_id is not None and "target" in wanted \
            and session.record.target != wanted["target"]:
        raise UserError(f"run {session.run_id} is on the {session.record.target} target, not {wanted['target']}",
                        remedy=f"drop --target, or see `rtui runs` for the {wanted['target']} runs")
    shown_target = wanted.get("target", targets.DEFAULT)
    orphans = [o for o in flows.find_orphans(store, shown_target) if session is None or o.run_id != session.run_id]
    if missing is not None and not orphans:
        raise missing
    if session is not None:
        async with session:
            data: dict[str, Any] | None = (await session.status_report()).to_dict()
    else:
        data = None
    # Data dirs on this machine (the local target's): its store, for this invocation's config, says whether there
    # are any (a default config when the config resolved is another target's).
    probe = resolved.config if resolved.config.target == shown_target else config_for(shown_target)
    keeps_data = targets.get(shown_target).data_store(store.root, "", probe) is not None
    # Kept elsewhere (a kube volume): listed with the target's runs.
    kept = [k for k in flows.kept_data(store) if (keeps_data if k.target is None else k.target == shown_target)
            and (session is None or k.run_id != session.run_id)]
    if ns.json:
        _json_line(out, {**(data or {}), "orphans": [vars(o) for o in orphans],
                         "kept_data": [k.to_dict() for k in kept]})
        return 0
    if data is not None:
        out.write(format_status(data))
    for o in orphans:
        state = "is running" if o.running else "was left behind, its processes gone,"
        out.write(status_row("orphan", f"{o.target} cluster {o.cluster_name} of run {o.run_id} {state} without a "
                                       f"record ({o.where}) — {'tear it down' if o.running else 'remove it'}: "
                                       f"{rtui_command()} down {o.run_id} --yes") + "\n")
    for k in kept:
        out.write(status_row("kept", f"on purpose: run {k.run_id}'s data, {k.usage.describe()} — delete it: "
                                     f"{rtui_command()} down {k.run_id} --delete-data --yes") + "\n")
    return 0


def _latest_of(store: RunStore, wanted: dict[str, str]) -> str:
    """The newest run of this target (and cluster name, when given)."""
    records, _ = store.list()
    for record in records:
        if all(getattr(record, field) == value for field, value in wanted.items()):
            return record.run_id
    where = f"the {wanted.get('target', 'any')} target" + (f", cluster {wanted['cluster_name']}"
                                                            if "cluster_name" in wanted else "")
    raise UserError(f"no runs on {where}", remedy="see `rtui runs` for every run")


def _line_writer(out: TextIO) -> Callable[[list[str]], None]:
    """Colour escapes are kept for a terminal and dropped for a pipe or a file."""
    keep = out.isatty()

    def write(lines: list[str]) -> None:
        for line in lines:
            out.write((line if keep else strip_ansi(line)) + "\n")
        out.flush()

    return write


async def logs(ns: argparse.Namespace, out: TextIO) -> int:
    # lazy: the flows load the job-following machinery (~120 ms); `rtui token`, run on every kubectl call, does without
    from backend import flows
    from backend.follow import JobUpdate

    async with RunSession.open(ns.run_id, lenient=True) as session:
        write = _line_writer(out)
        if ns.source == "head":
            async for line in flows.head_log(session, follow=ns.follow):
                write([line])
            return 0
        job = session.record.current_job
        if ns.job is not None:
            job = session.record.job(ns.job)
            if job is None:
                count = len(session.record.jobs)
                raise UserError(f"run {session.run_id} has no job {ns.job} (it has {count} job{'s' * (count != 1)})",
                                remedy=f"use --job 1 to --job {count}" if count else "submit one with `rtui up --yes`")
        offset = 0
        for line, end in session.spool(job).iter_from(0):
            write([line])
            offset = end
        if session.record.status is RunStatus.DOWN or job is None or job is not session.record.current_job:
            return 0  # an earlier job is history: its spool is all there is to print
        if not ns.follow:
            write(await flows.catch_up(session))
            return 0
        async for update in flows.attach(session, replayed_bytes=offset):
            if isinstance(update, JobUpdate):
                write(update.lines)
        return 0


async def down(ns: argparse.Namespace, out: TextIO) -> int:
    # lazy: the flows load the job-following machinery (~120 ms); `rtui token`, run on every kubectl call, does without
    from backend import flows

    if not ns.yes:
        raise UserError("`rtui down` deletes everything the run created and needs --yes",
                        remedy="or press D in the wizard")
    resolved = resolved_from(ns)
    by_cluster = any(resolved.sources.get(f) in ("flag", "env") for f in ("target", "cluster_name"))
    store = RunStore()
    session = flows.session_for_down(store, ns.run_id, resolved.config, by_cluster=by_cluster)
    if session is None:
        session = await flows.tagged_orphan(store, resolved.config)
    if session is None:
        out.write(f"nothing of cluster {resolved.config.cluster_name} is running on the "
                  f"{resolved.config.target} target\n")
        return 0
    async with session:
        emit = _emitter(ns.json, out)
        ok = True
        if session.record.status is RunStatus.DOWN and not await session.discover():
            async for event in flows.data_after_down(session, ns.delete_data):
                emit(event)
                ok = ok and event.kind is not EventKind.FAILED
            if not ns.json:
                out.write(f"run {session.run_id} is already down\n")
            return 0 if ok else 1
        async for event in flows.down(session, delete_data=ns.delete_data):
            emit(event)
            ok = ok and event.kind is not EventKind.FAILED
        if not ns.json:
            out.write(f"run {session.run_id} is {'down' if ok else 'NOT fully down: see the errors above'}\n")
        return 0 if ok else 1


async def runs(ns: argparse.Namespace, out: TextIO) -> int:
    store = RunStore()
    if ns.set_aside_corrupt:  # the only command that moves a record: listing never does
        for kept in store.set_aside_corrupt():
            print(f"rtui: set aside an unreadable run record as {kept}", file=sys.stderr)
    records, warnings = store.list()
    for warning in warnings:
        print(f"rtui: {warning}", file=sys.stderr)
    rows = [{"run_id": r.run_id, "target": r.target, "cluster_name": r.cluster_name, "status": r.status.value,
             "created_at": r.created_at, "job": r.current_job.submission_id if r.current_job else None,
             "job_status": r.current_job.status if r.current_job else None} for r in records]
    if ns.json:
        _json_line(out, {"runs": rows})
        return 0
    if not rows:
        out.write("no runs yet: start one with `rtui` or `rtui up --yes`\n")
        return 0
    out.write(f"{'RUN':<24} {'TARGET':<6} {'CLUSTER':<16} {'STATUS':<13} {'JOB':<10} CREATED\n")
    for row in rows:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(row["created_at"] or 0)))
        out.write(f"{row['run_id']:<24} {row['target']:<6} {row['cluster_name']:<16} {row['status']:<13} "
                  f"{(row['job_status'] or '-'):<10} {created}\n")
    return 0


async def bench(ns: argparse.Namespace, out: TextIO) -> int:
    """`rtui bench fabric|ab`: bring the cluster up, run the bench jobs, print the table and the ratio."""
    # lazy: the flows load the job-following machinery (~120 ms); `rtui token`, run on every kubectl call, does without
    from backend import bench as benches
    from backend import flows

    if not ns.yes:
        raise UserError(f"`rtui bench {ns.bench}` starts a cluster and runs jobs on it and needs --yes",
                        remedy=f"see `rtui bench {ns.bench} --help` for what it runs")
    for name, least in (("iters", 1), ("warmup", 0), ("max_mib", 1)):
        value = getattr(ns, name, None)
        if value is not None and value < least:
            raise UserError(f"--{name.replace('_', '-')} must be at least {least}")
    if ns.timeout <= 0:
        raise UserError("--timeout must be positive")

    resolved = resolved_from(ns)
    async with RunSession.for_config(resolved) as session:
        session.store.ensure_writable()
        # Progress is human text; with --json it goes to stderr so stdout holds only the result.
        emit = _emitter(False, sys.stderr if ns.json else out)
        ok = True
        with session.changing():
            try:
                if ns.bench == "fabric":
                    max_mib = getattr(ns, "max_mib", None)
                    report = await benches.run_fabric(
                        session, variants=ns.variant, on_event=emit, iters=ns.iters, warmup=ns.warmup,
                        max_bytes=max_mib * 2**20 if max_mib else None, timeout_s=ns.timeout)
                else:
                    steps = resolved.config.steps if resolved.sources.get("steps") == "flag" else None
                    report = await benches.run_ab(session, variants=ns.variant, steps=steps, on_event=emit,
                                                  timeout_s=ns.timeout)
            finally:
                if ns.down:
                    async for event in flows.down(session):
                        emit(event)
                        ok = ok and event.kind is not EventKind.FAILED
        report = {**report, "run_id": session.run_id, "cluster": "down" if ns.down and ok else "up"}
        if ns.json:
            _json_line(out, report)
        else:
            out.write("\n" + (_format_fabric(report) if ns.bench == "fabric" else _format_ab(report)))
            if not ns.down:
                out.write(f"The cluster stays up: tear it down with `{rtui_command()} down {session.run_id} --yes`\n")
            elif not ok:
                out.write(f"run {session.run_id} is NOT fully down: see the errors above\n")
        return 0 if ok else 1


def _format_fabric(report: dict[str, Any]) -> str:
    lines = []
    for name, run in report["variants"].items():
        lines.append(f"{name}: all_reduce on {run['transport']} — {run['world_size']} workers on "
                     f"{run['nodes']} node(s), {run.get('iters', '?')} iters after {run.get('warmup', '?')} warmup")
        lines.append(format_table(run["results"]))
        if run.get("capped"):
            lines.append(f"(CPU: the sweep stops at {human_size(run['results'][-1]['size_bytes'])}; GPUs go to 1 GiB)")
        lines.append("")
    size = report.get("ratio_size_bytes")
    if report["ratio"] is not None and size:
        lines.append(f"EFA vs TCP busbw at {human_size(size)}: {report['ratio']:.2f}×")
    else:
        raw = report.get("raw_ratio")
        lines.append(f"EFA vs TCP: n/a — {report['reason']}" + (f" (raw busbw ratio {raw:.2f}×)" if raw else ""))
    return "\n".join(lines) + "\n"


def _format_ab(report: dict[str, Any]) -> str:
    lines = [f"training A/B, {report['steps']} steps each:"]
    for key in ("a", "b"):
        side = report[key]
        if side is None:
            lines.append(f"  {key}  —  not run")
            continue
        steps_s = f"{side['steps_per_s']:.4f} steps/s" if side.get("steps_per_s") else ""
        lines.append(f"  {key}  {side['variant']:<5} on {side['transport']:<10} {side['tokens_per_s']:>12,.1f} "
                     f"tokens/s  {steps_s}")
    if report["speedup"] is not None:
        lines.append(f"speedup (efa/tcp): {report['speedup']:.2f}×")
    else:
        raw = report.get("raw_speedup")
        lines.append(f"speedup: n/a — {report['reason']}" + (f" (raw ratio {raw:.2f}×)" if raw else ""))
    return "\n".join(lines) + "\n"


__all__ = ["plan", "up", "status", "logs", "down", "runs", "check", "bench"]


async def model(ns: argparse.Namespace, out: TextIO) -> int:
    """`rtui model [RUN_ID] [--to DIR] [--json]`: the run's model, copied to a local directory."""
    async with RunSession.open(ns.run_id, lenient=True) as session:
        store = session.data_store()
        if store is None:
            raise UserError(f"run {session.run_id} is on the {session.record.target} target, whose model rtui cannot "
                            "fetch yet", remedy="copy it from the --storage-path the run used")
        found = await store.latest_model()
        if found is None:
            raise UserError(f"run {session.run_id} has no complete model in {store.uri}",
                            remedy="a run writes its model when training ends: see `rtui status` for how the job did "
                                   "(an export interrupted by teardown is never offered)")
        summary = model_summary(found, session.telemetry().series.summary)
        assert summary is not None
        to = Path(ns.to).expanduser().resolve() if ns.to else None
        if ns.json:
            if to is not None:
                await store.fetch(found, to)
                summary = {**summary, "copied_to": str(to)}
            _json_line(out, summary)
            return 0
        to = to or Path.cwd() / f"rtui-model-{session.run_id}"
        total = found.bytes

        def progress(done: int, _all: int) -> None:
            out.write(f"\rcopying {human_bytes(done)} / {human_bytes(total)}")
            out.flush()

        await store.fetch(found, to, progress)
        out.write(f"\nmodel of run {session.run_id} (step {found.step}) copied to {to}: {len(found.files)} files, "
                  f"{human_bytes(total)}\n")
        if summary.get("eval_loss_before") is not None:
            out.write(f"{eval_line(summary)}\n")
        out.write("load it with:\n  " + LOAD_HINT.format(path=to) + "\n")
        return 0
