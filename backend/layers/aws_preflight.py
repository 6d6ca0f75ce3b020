"""The aws target in this version: the live feasibility checks, and an honest refusal to plan.

Provisioning (VPC, IAM, EKS, nodegroups) arrives as the ``aws`` layer in a later issue;
until then planning says so in one line instead of pretending.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from backend.errors import UserError
from backend.layers.base import Context, Handler, Layer
from backend.model import CheckResult, Observed, Resource

if TYPE_CHECKING:
    from backend.aws import PreflightRequest


class AwsPreflight(Layer):
    name = "aws"

    @property
    def handlers(self) -> Mapping[str, Handler]:
        return {}

    def desired(self, ctx: Context, below: Sequence[Resource]) -> list[Resource]:
        raise UserError("provisioning the aws target is not in this version",
                        remedy="`rtui check --target aws` shows where it could run; use --target local to train now")

    async def discover(self, ctx: Context) -> list[Observed]:
        return []

    async def preflight(self, ctx: Context) -> list[CheckResult]:
        from backend.aws import run_preflight

        report = await run_preflight(preflight_request(ctx))
        return report.to_check_results()


def preflight_request(ctx: Context) -> PreflightRequest:
    from backend.aws import PreflightRequest

    cfg = ctx.config
    return PreflightRequest(
        regions=[cfg.region], gpu_node_type=cfg.gpu_node_type, gpu_node_count=cfg.gpu_node_count,
        system_node_type=cfg.system_node_type, system_node_count=cfg.system_node_count,
        profile=cfg.profile, default_region=cfg.region,
        require_efa=cfg.effective_require_transport() in ("efa", "efa_gdr"),
    )
