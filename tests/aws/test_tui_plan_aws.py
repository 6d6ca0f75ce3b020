"""The plan review screen over a real aws plan (moto): layers, costs, the quota, the apply gate."""

from __future__ import annotations

from pathlib import Path

from backend.resources import Action
from screens.confirm import ConfirmApply
from tests.aws.conftest import World
from tests.aws.provision_world import session_for
from tests.pilot_wait import wait_for
from tests.test_tui_plan import PlanApp, diff_text, planned, summary_text

# The documented on-demand prices (us-east-1): 2 × g6.12xlarge, 1 × m7i.xlarge, the EKS control plane,
# one NAT gateway and its public IPv4 address, the gp3 root volumes at $0.08/GB-month (2 × 200 GB, and
# 100 GB for the system node, sized from the registry double's 14 GB default image).
PER_HOUR = 2 * 4.6016 + 0.2016 + 0.10 + 0.045 + 0.005 + 500 * 0.08 / 730


async def test_aws_plan_shows_its_layers_costs_and_quota(world: World, kube_file: Path) -> None:
    app = PlanApp(session_for())  # its own plan: discovery and pricing against moto
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await planned(pilot, timeout=30)
        plan = screen.plan
        assert plan is not None and plan.layers() == ["aws", "kube", "ray-job"]
        creates = sum(1 for c in plan.changes if c.action is Action.CREATE)
        text = diff_text(screen)
        for heading in ("aws — AWS infrastructure", "kube — Kubernetes objects", "ray-job — Ray job"):
            assert heading in text
        assert "  + aws.nodegroup.gpu  $9.25/h" in text and "  + aws.eks-cluster  $0.10/h" in text
        assert "cost: 2 × g6.12xlarge $4.6016/h + 2 × 200 GB gp3" in text
        assert "cost: gateway $0.045/h + Elastic IP $0.005/h, + $0.045/GB processed" in text
        assert "uses 96 vCPUs of L-DB2E81BA, headroom 192" in text
        assert "uses 4 vCPUs of L-1216C47A, headroom 640" in text
        summary = summary_text(screen)
        assert f"Plan: {creates} to create, 0 to update" in summary
        assert (f"Cost: ${PER_HOUR:.2f}/hour while up, + $0.045/GB NAT data processing, + $0.50/GB "
                "(+ $0.03/GB-month) CloudWatch Logs: control-plane audit, authenticator logs "
                "(estimate, us-east-1 prices)") in " ".join(summary.split())  # the pane wraps it
        assert "96 vCPUs of L-DB2E81BA, headroom 192" in summary

        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmApply), 5, "the apply confirmation")
        shown = str(app.screen.query_one("#apply-summary").render())
        assert shown == f"Apply: creates {creates} resources, ${PER_HOUR:.2f}/hour while up"
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is screen, 5, "back to the plan")
        assert app.applied == []
        await pilot.press("a", "y")
        await wait_for(pilot, lambda: app.applied, 5, "the apply")
        assert app.applied == [plan]
