"""The aws target. In this version it checks feasibility; provisioning comes in a later issue.

``preflight()`` is the live matrix of regions and AZs (backend/aws), reduced to the
CheckResults every target returns. Planning or applying says plainly that it is not there
yet, instead of pretending.
"""

from __future__ import annotations

from backend.errors import UserError
from backend.model import CheckResult, Plan
from backend.rayjobs import RayJobs
from backend.runner import Step
from backend.targets.base import Target

NOT_YET = UserError("provisioning the aws target is not in this version",
                    remedy="`rtui check --target aws` shows where it could run; use --target local to train now")


class AwsTarget(Target):
    name = "aws"

    def preflight_request(self):  # type: ignore[no-untyped-def]
        from backend.aws import PreflightRequest

        cfg = self.config
        return PreflightRequest(
            regions=[cfg.region], gpu_node_type=cfg.gpu_node_type, gpu_node_count=cfg.gpu_node_count,
            system_node_type=cfg.system_node_type, system_node_count=cfg.system_node_count,
            profile=cfg.profile, default_region=cfg.region,
            require_efa=cfg.effective_require_transport() in ("efa", "efa_gdr"),
        )

    async def preflight(self) -> list[CheckResult]:
        from backend.aws import run_preflight

        report = await run_preflight(self.preflight_request())
        return report.to_check_results()

    async def plan(self) -> Plan:
        raise NOT_YET

    def apply_steps(self, plan: Plan) -> list[Step]:
        raise NOT_YET

    def teardown_steps(self) -> list[Step]:
        raise NOT_YET

    def jobs(self) -> RayJobs | None:
        return None

    async def cluster_alive(self) -> bool:
        return False
