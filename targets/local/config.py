"""The local target's settings: the Ray cluster on this machine and the tiny model it trains."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from backend.config import RunConfig

if TYPE_CHECKING:
    from backend.layers.base import Context


class LocalConfig(RunConfig):
    """A run on this machine: the local target's config."""

    # backend.trust: what a checkout's rtui.toml may set without a confirmation (free), and why each other
    # field waits for one (held), one line each: `rtui config show` and the wizard's modal print it.
    free_fields: ClassVar[frozenset[str]] = frozenset({
        "local_cpus", "local_hidden_size", "local_layers", "local_heads", "local_vocab_size",
    })
    held_fields: ClassVar[Mapping[str, str]] = MappingProxyType({
        "local_worker_nodes": "starts more Ray processes on this machine, each listening on ports",
        "local_dashboard_port": "chooses a fixed port this machine listens on",
    })

    local_cpus: int = Field(default=0, ge=0, le=1024, description="CPUs given to the local Ray head (0 = all cores)")
    local_worker_nodes: int = Field(default=0, ge=0, le=8, description="Extra local Ray worker nodes")
    local_dashboard_port: int = Field(default=0, ge=0, le=65535,
        description="Local Ray dashboard port (0 = a free port)")
    local_hidden_size: int = Field(default=64, ge=8, le=8192, description="Tiny local model: hidden size")
    local_layers: int = Field(default=2, ge=1, le=64, description="Tiny local model: decoder layers")
    local_heads: int = Field(default=4, ge=1, le=128, description="Tiny local model: attention heads")
    local_vocab_size: int = Field(default=1024, ge=16, le=262_144, description="Tiny local model: vocabulary size")


def local_config(ctx: Context) -> LocalConfig:
    """The run's config, as the local layer reads it."""
    return LocalConfig.of(ctx.config)
