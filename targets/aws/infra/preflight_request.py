"""The preflight request of a run: what `rtui check` and the aws layer ask the feasibility matrix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from targets.aws.cloud import PreflightRequest
from targets.aws.config import AwsConfig, aws_config
from targets.aws.facts import aws_facts
from targets.aws.infra.common import ROOT_VOLUME_GB, SYSTEM_DISK_UNKNOWN_GB

if TYPE_CHECKING:
    from backend.layers.base import Context

# How the other deadlines follow ``aws_timeout_s`` (the listing's): 12 s gives a region 30 s and the
# whole check 60 s.
REGION_FACTOR = 2.5
DEADLINE_FACTOR = 5.0


def request_for(config: AwsConfig, *, regions: list[str] | None = None, all_regions: bool = False,
                system_disk_gb: int = SYSTEM_DISK_UNKNOWN_GB, spot: bool | None = None) -> PreflightRequest:
    """What the matrix checks for ``config``: its node types and counts, its transport and its deadlines."""
    timeout = config.aws_timeout_s
    spot = config.spot if spot is None else spot
    return PreflightRequest(
        regions=regions, all_regions=all_regions,
        gpu_disk_gb=ROOT_VOLUME_GB, system_disk_gb=system_disk_gb,
        gpu_node_type=config.gpu_node_type, gpu_node_count=config.gpu_node_count,
        system_node_type=config.system_node_type, system_node_count=config.system_node_count,
        profile=config.profile, default_region=config.region, require_efa=config.wants_efa(),
        spot=spot, spot_types=_spot_types(config) if spot else [],
        listing_timeout_s=timeout, region_timeout_s=REGION_FACTOR * timeout, deadline_s=DEADLINE_FACTOR * timeout,
    )


def _spot_types(config: AwsConfig) -> list[str]:
    """``--spot-types`` as a list (the GPU type left out), whichever shape the config holds it in."""
    as_list = getattr(config, "spot_type_list", None)
    if callable(as_list):
        return list(as_list())
    value = getattr(config, "spot_types", [])
    return [t for t in (value.split(",") if isinstance(value, str) else value) if t and t != config.gpu_node_type]


def preflight_request(ctx: Context) -> PreflightRequest:
    """The run's own region, with the system disk its image needs (when the registry said), Spot unless
    its GPU nodes went On-Demand when Spot had none."""
    config = aws_config(ctx)
    return request_for(config, regions=[config.region],
                       system_disk_gb=int(aws_facts(ctx).system_disk_gb or SYSTEM_DISK_UNKNOWN_GB),
                       spot=config.spot and aws_facts(ctx).spot_fallback is None)
