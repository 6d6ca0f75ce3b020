"""The targets rtui knows, by name, and what a target gives the settings left on auto (``Defaults``).

Below the config, which asks a run's target through it (``backend.config.TargetTraits``); the contract a
target implements (``backend.targets.Target``) is built on it. Nothing here imports the rest of rtui: a
target is imported by name (``importlib``) when first asked for, so the first frame pays for none.

The built-in targets are the ``BUILTIN`` lines below. A target from another package is found by its
entry point in the ``rtui.targets`` group (``name = "module:attribute"``, the attribute a ``Target``
subclass or instance): installing that package is all it takes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Any

# name -> "module:attribute" of its Target; one line per built-in target.
BUILTIN: dict[str, str] = {
    "local": "targets.local:LocalTarget",
    "aws": "targets.aws:AwsTarget",
    "kube": "targets.kube:KubeTarget",
}
DEFAULT = "local"
ENTRY_POINT_GROUP = "rtui.targets"


@dataclass(frozen=True)
class TinyModel:
    """The random Qwen2 a run trains when it names no model (``Defaults.model_id`` None): its shape."""

    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    vocab_size: int = 1024


@dataclass(frozen=True)
class GpuNodes:
    """A run's GPU machines, as its target's config sets them: what the memory estimate and the
    interruption rate read. ``count_field`` is the config field (and flag) that sets ``count``."""

    instance_type: str
    count: int
    gpus_per_node: int
    count_field: str
    gpu: tuple[str, float] | None = None  # (the GPU's name, GiB of it a rank may use) when the target knows


@dataclass(frozen=True)
class Defaults:
    """What a config field left on auto (0, "auto", unset) resolves to on a target."""

    batch_size: int  # 0: ``fit_batch`` says (the largest micro-batch the GPU's memory fits)
    precision: str
    learning_rate: float
    model_id: str | None  # None: the tiny random model (CPU targets)
    workers: int
    shard_size: int  # ranks per FSDP shard group with --shard hybrid
    require_transport: str
    seq_len: int = 128
    # With batch_size 0: the micro-batch for a config (a GPU target's is backend.stepfit.fitting_micro_batch).
    fit_batch: Callable[[Any], int] | None = None
    tiny: TinyModel = TinyModel()  # the model's shape when ``model_id`` is None


@cache
def _plugins() -> dict[str, str]:
    """{name: "module:attribute"} of the installed packages' targets (read once, when first needed)."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in BUILTIN}


def names() -> list[str]:
    """Every target this rtui knows: the built-in ones, then the installed ones."""
    return [*BUILTIN, *sorted(_plugins())]


def known(name: str) -> bool:
    return name in BUILTIN or name in _plugins()


def spec(name: str) -> str:
    """The "module:attribute" of the target called ``name``; KeyError when none has that name."""
    found = BUILTIN.get(name) or _plugins().get(name)
    if found is None:
        raise KeyError(name)
    return found


@cache
def load(name: str) -> Any:
    """The target called ``name``, imported and made once (``backend.targets.get`` checks what it is)."""
    module, _, attribute = spec(name).partition(":")
    found = getattr(importlib.import_module(module), attribute)
    return found() if isinstance(found, type) else found
