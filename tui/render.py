"""Plain-text renderings shared by the CLI (and by tests): plans, events, status."""

from __future__ import annotations

import json
import time
from typing import Any

from backend.resources import Action, EventKind, GpuFleet, Plan, StepEvent

_EVENT_MARK = {
    EventKind.STARTED: "…", EventKind.PROGRESS: "·", EventKind.RETRYING: "↻", EventKind.DONE: "✓",
    EventKind.FAILED: "✗", EventKind.SKIPPED: "=", EventKind.CANCELLED: "⊘", EventKind.LOG: " ",
}


def _brief(value: dict[str, Any] | None) -> str:
    if not value:
        return ""
    return ", ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in value.items())


def format_plan(plan: Plan, *, run_id: str | None = None) -> str:
    """Terraform-style: one line per change with its symbol, then a count line."""
    lines = [f"Plan for the {plan.target} target" + (f" (run {run_id})" if run_id else "") + ":"]
    for layer in plan.layers():
        changes = [c for c in plan.changes if c.layer == layer]
        per_hour = plan.layer_cost_per_hour(layer)
        lines.append(f"  {layer}" + (f"  ${per_hour:.2f}/hour" if per_hour else ""))
        for change in changes:
            if change.action is Action.UPDATE and change.before is not None:
                detail = _changed(change.before, change.after or {})
            else:
                detail = _brief(change.after if change.action is not Action.DELETE else change.before)
            cost = f"  ${change.cost_per_hour:.4f}/h" if change.cost_per_hour else ""
            cost += f" ({change.cost_note})" if change.cost_note and change.action is not Action.DELETE else ""
            lines.append(f"  {change.symbol:>3} {change.address}" + (f"  [{detail}]" if detail else "")
                         + cost + (f"  # {change.reason}" if change.reason else ""))
            if change.action is not Action.NOOP:
                lines.extend(f"        uses {q.get('vcpus') or 0:.0f} vCPUs of quota {code}"
                             + (f" (headroom {q['headroom']:.0f})" if q.get("headroom") is not None else "")
                             for code, q in change.quota.items())
    counts = plan.counts()
    lines.append(
        f"Plan: {counts['create']} to create, {counts['update']} to update, {counts['replace']} to replace, "
        f"{counts['delete']} to delete, {counts['noop']} unchanged."
        + (f" Cost: ${plan.cost_per_hour:.2f}/hour" + "".join(f", {u}" for u in plan.usage_costs)
           + (f" ({plan.price_source})" if plan.price_source else "") + "." if plan.cost_per_hour else "")
    )
    lines.extend(f"Note: {note}" for note in plan.notes)
    if plan.is_noop:
        lines.append("Nothing to do: everything is already in place.")
    return "\n".join(lines) + "\n"


def _changed(before: dict[str, Any], after: dict[str, Any]) -> str:
    """What an update changes, ``key: before → after`` (Terraform's ``~`` lines)."""
    return ", ".join(f"{k}: {before.get(k)} → {v}" for k, v in after.items() if before.get(k) != v)


def format_event(event: StepEvent, elapsed_s: float) -> str:
    mark = _EVENT_MARK.get(event.kind, "?")
    text = event.message
    if event.kind in (EventKind.FAILED, EventKind.DONE) and event.remedy:
        text = f"{text} — {event.remedy}"
    if event.kind is EventKind.PROGRESS and event.fraction is not None:
        text = f"{text} ({event.fraction:.0%})"
    return f"{elapsed_s:7.1f}s {mark} {event.step:<18} {text}"


def eval_line(summary: dict[str, Any]) -> str:
    """"eval loss 6.93 → 0.08 on 2,048 held-out tokens" from a run summary's eval_* keys."""
    before, after, tokens = summary.get("eval_loss_before"), summary.get("eval_loss_after"), summary.get("eval_tokens")
    text = f"eval loss {before:.2f}" if isinstance(before, int | float) else "eval loss ?"
    if isinstance(after, int | float):
        text += f" → {after:.2f}"
    if isinstance(tokens, int):
        text += f" on {tokens:,} held-out tokens"
    return text


def stopped_while_idle_line(stopped: dict[str, Any]) -> str:
    """"stopped while idle at 14:12 (600s without a job or an rtui)" (issue 26, the local target)."""
    at = time.strftime("%H:%M", time.localtime(stopped["at"]))
    return f"stopped while idle at {at} ({stopped['idle_s']:.0f}s without a job or an rtui; `rtui up` starts it again)"


def gpu_line(gpu: GpuFleet, *, ranks: int | None = None) -> str:
    """GPU nodes and Ray worker pods now against the full size, the job's training ranks when given,
    and when they went idle (issue 26): "GPU nodes 0/2, Ray worker pods 0/2 — idle since 14:02, scaled
    to zero at 14:12"."""
    line = gpu.sizes() + (f" · {ranks} training ranks" if ranks else "")
    when = []
    if gpu.idle_since:
        when.append(f"idle since {time.strftime('%H:%M', time.localtime(gpu.idle_since))}")
    if gpu.scaled_down_at:
        verb = "scaled to zero" if gpu.workers == 0 else "scaled down"
        when.append(f"{verb} at {time.strftime('%H:%M', time.localtime(gpu.scaled_down_at))}")
    return line + (f" — {', '.join(when)}" if when else "")


# `rtui status`: a label, then its value, every value in one column (the longest label is "transport").
STATUS_LABEL_WIDTH = 10

# What a transport verdict rests on (telemetry's and the NCCL verdict's ``basis``), in words.
BASIS_WORDS = {"channels": "seen on its channels", "failure": "after a network plugin failure",
               "announced": "announced, no channel connected yet", "backend": "from the job's backend"}


def status_row(label: str, text: str) -> str:
    return f"{label:<{STATUS_LABEL_WIDTH}}{text}"


def format_status(data: dict[str, Any]) -> str:
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(data["created_at"]))
    cluster = data["cluster"]
    lines = [
        status_row("run", f"{data['run_id']}  ({data['target']}, cluster {data['cluster_name']}, created {created})"),
        status_row("status", f"{data['status']}" + (
            "  [an rtui is attached]" if data["attached"] else
            "  [interrupted: no rtui attached; `rtui --resume` continues]"
            if data["status"] in ("applying", "tearing_down") else "")),
        status_row("cluster", f"{'up' if cluster['alive'] else 'not running'}"
                   + (f" — dashboard {cluster['dashboard_url']}" if cluster["alive"] and cluster["dashboard_url"]
                      else "")
                   + (f" — {stopped_while_idle_line(cluster['stopped_while_idle'])}"
                      if cluster.get("stopped_while_idle") else "")),
    ]
    gpu = data.get("gpu")
    if gpu:
        lines.append(status_row("gpu", gpu_line(GpuFleet.from_dict(gpu))))
    cost = data.get("cost")
    if cost and cost.get("resources"):
        now = per_hour_words(cost["per_hour"], cost.get("per_hour_full"))
        priced = len(cost["resources"])
        lines.append(status_row("cost", f"{now}, {accrued_text(cost)} ({priced} priced resource{'s' * (priced != 1)})"))
    if cost and cost.get("left_behind"):
        lines.append(status_row("LEFT", f"{len(cost['left_behind'])} resources still exist after teardown "
                                        f"(${cost['left_behind_per_hour']:.3f}/hour): run `rtui down` again"))
    job = data.get("job")
    if job:
        earlier = f" (job {job['number']}; earlier: `rtui logs --job N`)" if job.get("number", 1) > 1 else ""
        lines.append(status_row("job", f"{job['submission_id']}: {job['status']}{earlier}"
                                + (f" — {job['message'].splitlines()[0][:120]}" if job.get("message") else "")))
    transport = data.get("transport") or {}
    if transport.get("label"):
        basis = transport.get("basis")
        lines.append(status_row("transport", transport["label"]
                                + (f" — {BASIS_WORDS.get(basis, f'basis: {basis}')}" if basis else ""))
                     + "".join(f"\n  warning: {w}" for w in transport.get("warnings", [])[:3]))
    metric = data.get("last_metric")
    if metric:
        world = metric.get("world_size")
        lines.append(status_row("training", f"step {metric.get('step')} loss {metric.get('loss')} "
                                            f"{metric.get('tokens_per_s') or 0:,.0f} tokens/s"
                                + (f" (world {world})" if world else "")))
    interruptions = data.get("interruptions") or {}
    if interruptions.get("count"):
        lines.append(status_row("restarts", interruptions_words(interruptions)))
        lines.extend(f"  {interruption_line(item)}" for item in interruptions["items"][-5:])
    summary = data.get("summary") or {}
    if summary.get("eval_loss_before") is not None:
        lines.append(status_row("eval", eval_line(summary)))
    model = data.get("model")
    if model:
        lines.append(status_row("model", f"{model['uri']} ({len(model['files'])} files, {model['bytes']:,} bytes) — "
                                         f"copy it: rtui model {data['run_id']} --to DIR"))
    lines.extend(status_row("notice", res["notice"]) for res in data.get("resources", {}).values()
                 if res.get("notice"))
    for address, res in data.get("resources", {}).items():
        lines.append(f"  {res['status']:<9} {address:<22} {res.get('id') or ''}")
    for phase, steps in (("", data["steps"]), ("teardown ", data.get("teardown_steps") or {})):
        for name, step in steps.items():
            took = f"{step['duration_s']:.1f}s" if step.get("duration_s") is not None else ""
            extra = step.get("error") or step.get("message") or ""
            lines.append(f"  {step['status']:<9} {phase + name:<22} {took:>7}  {extra[:100]}")
    return "\n".join(lines) + "\n"


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def interruption_line(item: dict[str, Any]) -> str:
    """One interruption (``Interruption.to_dict``): "interrupted at step 40 (Spot), resumed at step 35
    on node X after 52s"; before its first step since, where it goes on from."""
    cause = f" ({item['cause']})" if item.get("cause") else ""
    node = f" on {item['node']}" if item.get("node") else ""
    if item.get("resumed_ts") is None:
        return f"interrupted at step {item['at_step']}{cause}, going on from step {item['resumed_step']}{node}"
    down = item.get("down_s")
    return (f"interrupted at step {item['at_step']}{cause}, resumed at step {item['resumed_step']}{node}"
            + (f" after {format_duration(down)}" if down is not None else ""))


def interruptions_words(data: dict[str, Any]) -> str:
    """``StatusReport``'s ``interruptions``: how many, and the time they cost (the waits and the steps
    done again), or the waits so far while the job has not yet caught up."""
    items, count = data.get("items") or [], int(data.get("count") or 0)
    spot = sum(1 for i in items if i.get("cause") == "Spot")
    head = f"{count} interruption{'s' * (count != 1)}" + (f" ({spot} Spot)" if spot else "")
    if data.get("lost_s") is not None:
        return f"{head}, {format_duration(data['lost_s'])} lost"
    waited = sum(i.get("down_s") or 0.0 for i in items)
    return f"{head}, {format_duration(waited)} lost so far (the job has not yet caught up)"


def per_hour_words(per_hour: float, per_hour_full: float | None) -> str:
    """The cost meter's "now", with the price at full size beside it when fewer GPU nodes bill now."""
    if per_hour_full is None or per_hour_full == per_hour:
        return f"${per_hour:.2f}/hour now"
    return f"${per_hour:.2f}/hour now (${per_hour_full:.2f}/hour at full size)"


def accrued_text(cost: dict[str, Any]) -> str:
    """The "so far" of a cost meter in its `rtui status --json` form."""
    return accrued_words(cost["accrued"], cost.get("accrued_exact", True))


def accrued_words(accrued: float, exact: bool) -> str:
    """The cost meter's "so far": exact, or an upper bound when a scaled resource's history is unknown
    (``backend.session.cost_meter``: counted at full size)."""
    return f"{'' if exact else 'at most '}${accrued:.2f} so far"
