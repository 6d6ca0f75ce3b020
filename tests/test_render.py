from __future__ import annotations

from backend.resources import Action, Change, EventKind, Plan, StepEvent
from screens.plan import render_plan
from tui.render import format_event, format_plan


def sample_plan() -> Plan:
    return Plan(target="local", changes=[
        Change(address="local.ray-head", layer="local-ray", kind="ray-head", action=Action.CREATE,
               after={"cpus": 2}, reason="not running"),
        Change(address="ray.job.train", layer="ray-job", kind="ray-job", action=Action.REPLACE,
               before={"steps": 5}, after={"steps": 9}, reason="the job changed"),
        Change(address="aws.nodegroup.gpu", layer="aws", kind="nodegroup", action=Action.DELETE,
               before={"size": 2}, cost_per_hour=9.2),
        Change(address="aws.vpc", layer="aws", kind="vpc", action=Action.NOOP, cost_per_hour=0.045),
        Change(address="aws.nodegroup.sys", layer="aws", kind="nodegroup", action=Action.UPDATE,
               before={"size": 1}, after={"size": 2}, cost_per_hour=0.4032),
    ])


def test_plain_plan_uses_terraform_symbols_and_counts() -> None:
    text = format_plan(sample_plan(), run_id="r1")
    lines = text.splitlines()
    assert lines[0] == "Plan for the local target (run r1):"
    # each layer says what it costs by the hour (deletions do not count; the aws layer: 0.045 + 0.4032)
    assert (lines[1], lines[3], lines[5]) == ("  local-ray", "  ray-job", "  aws  $0.45/hour")
    assert lines[2].strip().startswith("+ local.ray-head  [cpus=2]")
    assert lines[4].strip().startswith("-/+ ray.job.train  [steps=9]")
    assert lines[6].strip().startswith("- aws.nodegroup.gpu  [size=2]")
    assert lines[8].strip().startswith("~ aws.nodegroup.sys  [size: 1 → 2]  $0.4032/h")
    assert "Plan: 1 to create, 1 to update, 1 to replace, 1 to delete, 1 unchanged." in text
    # deletions don't count towards the hourly cost
    assert "Cost: $0.45/hour." in text
    assert "Nothing to do" not in text


def test_noop_plan_says_nothing_to_do() -> None:
    plan = Plan(target="local", changes=[Change(address="local.ray-head", layer="local-ray", kind="ray-head",
                                                action=Action.NOOP)])
    assert plan.is_noop
    assert "Nothing to do" in format_plan(plan)


def test_tui_plan_shows_before_and_after_for_changes() -> None:
    text = render_plan(sample_plan()).plain
    assert "steps = 5 → 9" in text
    assert "size = 1 → 2" in text
    assert "Cost: $0.45/hour" in text


def test_event_lines() -> None:
    ev = StepEvent(step="head", kind=EventKind.FAILED, message="port taken", remedy="use another")
    assert format_event(ev, 1.25) == "    1.2s ✗ head               port taken — use another"
    prog = StepEvent(step="train", kind=EventKind.PROGRESS, message="step 3", fraction=0.5)
    assert format_event(prog, 0).endswith("step 3 (50%)")


def test_status_labels_line_up_and_say_what_the_transport_rests_on() -> None:
    """Issue 40 item 8: `rtui status` printed "transport gloo (no NCCL) (backend)" and "training step …" a
    column right of the others ("run      r…"), and "kept     on purpose"."""
    from tui.render import format_status, status_row

    data = {
        "run_id": "r1", "target": "local", "cluster_name": "rtui-ray", "created_at": 0.0, "status": "up",
        "attached": False, "cluster": {"alive": True, "dashboard_url": "http://127.0.0.1:1"},
        "cost": {"resources": ["a"], "per_hour": 1.0, "per_hour_full": 1.0, "accrued": 0.5},
        "job": {"submission_id": "j1", "status": "SUCCEEDED", "message": "done"},
        "transport": {"label": "gloo (no NCCL)", "basis": "backend"},
        "last_metric": {"step": 3, "loss": 6.2, "tokens_per_s": 40000.0, "world_size": 2},
        "summary": {"eval_loss_before": 6.9, "eval_loss_after": 6.0, "eval_tokens": 100},
        "model": {"uri": "/m", "files": ["a"], "bytes": 10},
        "steps": {}, "resources": {},
    }
    lines = format_status(data).splitlines() + [status_row("kept", "run r0's data"),
                                                status_row("orphan", "local cluster x")]
    assert len(lines) >= 11
    columns = {line.index(line.split()[1], len(line.split()[0])) for line in lines}
    assert len(columns) == 1, "\n".join(lines)
    transport = next(line for line in lines if line.startswith("transport"))
    assert "(backend)" not in transport and "from the job's backend" in transport, transport


def test_status_and_the_teardown_modal_say_the_cost_now_in_the_same_words() -> None:
    """`rtui status` and `D`'s modal both name the full-size price beside what bills now, when they differ."""
    from backend.resources import CostItem, CostMeter
    from tui.render import format_status, per_hour_words

    assert per_hour_words(9.3, 9.3) == "$9.30/hour now" == per_hour_words(9.3, None)
    assert per_hour_words(0.1, 9.3) == "$0.10/hour now ($9.30/hour at full size)"
    idle = CostMeter(per_hour=0.1, per_hour_full=9.3, accrued=2.0, accrued_exact=False,
                     resources={"gpu": CostItem(per_hour=0.0, since=0.0, accrued=2.0, per_hour_full=9.2)})
    data = {"run_id": "r1", "target": "aws", "cluster_name": "rtui-ray", "created_at": 0.0, "status": "up",
            "attached": False, "cluster": {"alive": True, "dashboard_url": None}, "cost": idle.to_dict(),
            "transport": {}, "steps": {}, "resources": {}}
    cost = next(line for line in format_status(data).splitlines() if line.startswith("cost"))
    assert "$0.10/hour now ($9.30/hour at full size), at most $2.00 so far (1 priced resource)" in cost, cost
