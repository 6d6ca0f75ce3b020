"""The preflight request of a run: what `rtui check` and the aws layer ask the feasibility matrix."""

from __future__ import annotations

from backend.layers.base import Context
from targets.aws.cloud import PreflightRequest
from targets.aws.infra.base import ROOT_VOLUME_GB, SYSTEM_DISK_UNKNOWN_GB


def preflight_request(ctx: Context) -> PreflightRequest:
    cfg = ctx.config
    return PreflightRequest(
        gpu_disk_gb=ROOT_VOLUME_GB,
        system_disk_gb=int(ctx.record.facts.system_disk_gb or SYSTEM_DISK_UNKNOWN_GB),
        regions=[cfg.region], gpu_node_type=cfg.gpu_node_type, gpu_node_count=cfg.gpu_node_count,
        system_node_type=cfg.system_node_type, system_node_count=cfg.system_node_count,
        profile=cfg.profile, default_region=cfg.region,
        require_efa=cfg.effective_require_transport() in ("efa", "efa_gdr"),
    )
