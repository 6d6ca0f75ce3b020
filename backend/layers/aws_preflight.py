"""The preflight request of a run: what `rtui check` and the aws layer ask the feasibility matrix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend.layers.base import Context

if TYPE_CHECKING:
    from backend.aws import PreflightRequest


def preflight_request(ctx: Context) -> PreflightRequest:
    from backend.aws import PreflightRequest

    cfg = ctx.config
    return PreflightRequest(
        regions=[cfg.region], gpu_node_type=cfg.gpu_node_type, gpu_node_count=cfg.gpu_node_count,
        system_node_type=cfg.system_node_type, system_node_count=cfg.system_node_count,
        profile=cfg.profile, default_region=cfg.region,
        require_efa=cfg.effective_require_transport() in ("efa", "efa_gdr"),
    )
