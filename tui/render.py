"""Plain-text renderings shared by the CLI (and by tests): plans, events, status."""

from __future__ import annotations

import json
import time
from typing import Any

from backend.model import Action, EventKind, Plan, StepEvent

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
        per_hour = sum(c.cost_per_hour or 0.0 for c in changes if c.action is not Action.DELETE)
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
    if event.kind is EventKind.FAILED and event.remedy:
        text = f"{text} — {event.remedy}"
    if event.kind is EventKind.PROGRESS and event.fraction is not None:
        text = f"{text} ({event.fraction:.0%})"
    return f"{elapsed_s:7.1f}s {mark} {event.step:<18} {text}"


def format_status(data: dict[str, Any]) -> str:
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(data["created_at"]))
    cluster = data["cluster"]
    lines = [
        f"run      {data['run_id']}  ({data['target']}, cluster {data['cluster_name']}, created {created})",
        f"status   {data['status']}" + ("  [an rtui is attached]" if data["attached"] else
                                          "  [interrupted: no rtui attached; `rtui --resume` continues]"
                                          if data["status"] in ("applying", "tearing_down") else ""),
        f"cluster  {'up' if cluster['alive'] else 'not running'}"
        + (f" — dashboard {cluster['dashboard_url']}" if cluster["alive"] and cluster["dashboard_url"] else ""),
    ]
    cost = data.get("cost")
    if cost and cost.get("resources"):
        lines.append(f"cost     ${cost['per_hour']:.2f}/hour now, ${cost['accrued']:.2f} so far "
                     f"({len(cost['resources'])} priced resources)")
    if cost and cost.get("left_behind"):
        lines.append(f"LEFT     {len(cost['left_behind'])} resources still exist after teardown "
                     f"(${cost['left_behind_per_hour']:.3f}/hour): run `rtui down` again")
    job = data.get("job")
    if job:
        earlier = f" (job {job['number']}; earlier: `rtui logs --job N`)" if job.get("number", 1) > 1 else ""
        lines.append(f"job      {job['submission_id']}: {job['status']}{earlier}"
                     + (f" — {job['message'].splitlines()[0][:120]}" if job.get("message") else ""))
    transport = data.get("transport") or {}
    if transport.get("label"):
        lines.append(f"transport {transport['label']}" + (f" ({transport['basis']})" if transport.get("basis") else "")
                     + "".join(f"\n  warning: {w}" for w in transport.get("warnings", [])[:3]))
    metric = data.get("last_metric")
    if metric:
        world = metric.get("world_size")
        lines.append(f"training step {metric.get('step')} loss {metric.get('loss')} "
                     f"{metric.get('tokens_per_s') or 0:,.0f} tokens/s" + (f" (world {world})" if world else ""))
    for address, res in data.get("resources", {}).items():
        lines.append(f"  {res['status']:<9} {address:<22} {res.get('id') or ''}")
    for name, step in data["steps"].items():
        took = f"{step['duration_s']:.1f}s" if step.get("duration_s") is not None else ""
        extra = step.get("error") or step.get("message") or ""
        lines.append(f"  {step['status']:<9} {name:<22} {took:>7}  {extra[:100]}")
    return "\n".join(lines) + "\n"
