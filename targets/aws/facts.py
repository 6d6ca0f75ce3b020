"""The aws target's facts: what its layers decided once and keep in the run's record (``RunFacts.own``):
the GPU AZ and the network's, the system disk, a reservation, AZ moves and Spot's fallback and risk,
the run's own bucket, the caller's public address and each create's idempotency tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from backend.record import Facts

if TYPE_CHECKING:
    from backend.layers.base import Context


class AzMove(BaseModel):
    """The GPU nodes moved AZ after a capacity failure."""

    from_az: str
    to: str
    why: str
    at: float


class SpotFallback(BaseModel):
    """The GPU nodes went On-Demand after AWS had no Spot capacity for them (``--spot-fallback``)."""

    az: str
    why: str
    at: float


class SpotRisk(BaseModel):
    """How often Spot takes one GPU node back, as the plan read it (aws: the Spot Instance Advisor's bucket
    for the GPU types in the region), for ``--checkpoint-every auto``."""

    per_node_hour: float
    source: str


class ReservationFact(BaseModel):
    """The capacity reservation the GPU nodes use."""

    az: str
    id: str | None = None
    kind: str | None = None
    placement_group: str | None = None


class AwsFacts(Facts):
    model_config = ConfigDict(extra="forbid")

    api_cidrs: list[str] = Field(default_factory=list)  # the caller's public address, learned once
    create_attempts: dict[str, int] = Field(default_factory=dict)  # per address: its idempotency tokens
    gpu_az: str | None = None
    network_azs: list[str] = Field(default_factory=list)
    system_disk_gb: int | None = None
    reservation: ReservationFact | None = None
    failed_azs: list[str] = Field(default_factory=list)
    az_moves: list[AzMove] = Field(default_factory=list)
    spot_fallback: SpotFallback | None = None  # the GPU nodes run On-Demand since: --spot no longer holds
    spot_risk: SpotRisk | None = None  # Spot GPU nodes: how often one is taken back, as the last plan read it
    data_bucket: str | None = None  # the run's own S3 bucket (no --storage-path), named once the plan settled it


def aws_facts(ctx: Context) -> AwsFacts:
    """The run's aws facts, as its layers read and write them."""
    return AwsFacts.of(ctx.record.facts)
