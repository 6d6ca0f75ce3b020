"""Targets: where a run goes. This module is the contract (``Target``) and the registry; a target's
code is one package under ``targets/`` (issue 24), its layers included (issue 38).

A ``Target`` owns what differs between places a run can go: its stack of layers, its config
defaults and checks, how runs of it are found without a record (orphans), what it does when the
provider has no capacity, the App's subtitle, the first screen's panel, and whether it costs money.
Generic code (``backend/*.py``, ``tui/``, ``screens/``) asks the run's target and never compares
its name (``tests/test_architecture.py`` checks it).

Imports point one way: a target's package imports ``backend`` (and the aws target the kube target's
kube layer); nothing in ``backend`` imports a target. The registry (``backend.registry``, below
the config) names the built-in ones as data and imports each only when asked for. The package
``targets`` re-exports these names, so ``targets.Target`` is the same class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TextIO, TypeVar

from backend.config import RunConfig
from backend.record import Facts, NoFacts
from backend.registry import (
    BUILTIN,
    DEFAULT,
    ENTRY_POINT_GROUP,
    Defaults,
    GpuNodes,
    TinyModel,
    known,
    load,
    names,
    spec,
)

if TYPE_CHECKING:
    from pathlib import Path

    from backend.delivery import DataStore
    from backend.errors import NoCapacity
    from backend.layers.base import Context
    from backend.planner import Stack
    from backend.record import RunFacts

# A GPU cluster's sequence length left on auto: room for a multi-turn conversation through a chat
# template (the default dataset's, and most instruction data: the plan's data line counts the sampled
# records that are longer, and cut); 128, the old default, cut most of them.
GPU_SEQ_LEN = 1024

# The rate at which large GPU training is interrupted by hardware and software failures, as Meta reports
# it for Llama 3 405B's pre-training ("The Llama 3 Herd of Models", 2024, section 3.3.4): 419 unexpected
# interruptions in a 54-day snapshot on 16,384 H100 GPUs (one every ~3 hours for the whole job; the GPUs
# and their HBM3 caused about half of them). Spread over the GPUs: 419 / (54 × 24 × 16384) ≈ 1.97e-5
# interruptions per GPU-hour, so ≈ 7.9e-5 per hour for a node of 4 GPUs and ≈ 1.6e-4 for one of 8.
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384
INTERRUPTIONS_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)
LLAMA3_SOURCE = "Llama 3's failure rate, 419 in 54 days on 16,384 H100s"


@dataclass(frozen=True)
class InterruptionRate:
    """How often one of the run's GPU nodes is expected to be interrupted (the job then restarts from its
    newest complete checkpoint), and where that figure comes from, in a few words for the plan."""

    per_node_hour: float
    source: str


@dataclass(frozen=True)
class FoundCluster:
    """A live cluster of a target found from the world (markers, tags), whatever the records say."""

    run_id: str
    cluster_name: str
    where: str
    state_dir: str | None = None  # the rtui state dir that made it, when it says
    running: bool = True  # False: its marks are there but its processes are gone (nothing to stop)


C = TypeVar("C", bound=RunConfig)


class Target(ABC, Generic[C]):
    """One place a run can go. Subclass it, override what differs, register it (module docstring).

    The class attributes are what generic code asks instead of a target's name. ``C`` is its config
    model (``config_model``): every ``config`` a target's method gets is one, made by ``resolve_config``
    or read from the run's record."""

    name: ClassVar[str]
    label: ClassVar[str]  # its line on the first screen
    costs_money: ClassVar[bool] = False  # whether applying a plan may bill someone (asks twice in the TUI)
    on_gpus: ClassVar[bool] = True  # trains on GPUs with NCCL (else on CPUs with gloo)
    offline: ClassVar[bool] = False  # never asks the model hub (no revision is resolved at plan time)
    shared_disk: ClassVar[bool] = False  # every node writes the same disk (no shared storage for checkpoints)
    bench_variants: ClassVar[tuple[str, ...]] = ("efa", "tcp")  # what `rtui bench` measures here
    bench_ab_steps: ClassVar[int] = 20
    has_kubernetes: ClassVar[bool] = False  # its stack has Kubernetes objects (`rtui manifest`)
    has_feasibility: ClassVar[bool] = False  # `rtui check` shows a feasibility matrix (``feasibility``)
    # Its settings: the common RunConfig's fields and its own (a subclass), each a flag, a RTUI_* variable
    # and a rtui.toml key; `rtui config show` lists these.
    config_model: ClassVar[type[RunConfig]] = RunConfig
    # What its layers decide once and keep in the run's record (``RunFacts.own``), typed.
    facts_model: ClassVar[type[Facts]] = NoFacts
    # "module:Class" of its first-screen panel (a Textual widget, imported by the screen only), or None.
    panel: ClassVar[str | None] = None
    # What the plan's cost line says when nothing is priced.
    unpriced: ClassVar[str] = "nothing priced"
    # What the steps screen says when the provider had no capacity and ``fail_over`` can move the
    # machines (its `m` key does); None: it cannot, and the screen offers a retry only.
    fail_over_words: ClassVar[str | None] = None
    # What `m` says when ``fail_over`` found nowhere to move the machines to: the error and what to do next.
    nowhere_to_move: ClassVar[tuple[str, str]] = ("the provider has no capacity for the run and nothing can move",
                                                  "run `rtui up` again later")
    # How long a job's first step waits for GPU nodes that went away while idle (issue 26), in seconds.
    scale_up_s: ClassVar[float] = 0.0

    @abstractmethod
    def stack(self, config: C) -> Stack:
        """Its layers, bottom up (DESIGN.md §1). Import them here: they stay off the first frame."""

    @abstractmethod
    def defaults(self, config: C) -> Defaults:
        """What the fields left on auto resolve to for ``config``."""

    def check(self, config: C, cwd: Path) -> RunConfig:
        """Refuse (UserError) what this target cannot run; return the config, paths made absolute."""
        return config

    def where(self, config: C) -> str:
        """Which cluster, in a few words, for the App's subtitle (after the target's name); "" for none."""
        return ""

    def live_clusters(self, cluster_name: str | None = None) -> list[FoundCluster]:
        """Its clusters live on this machine found without records (cheap: no network)."""
        return []

    async def tagged_runs(self, config: C) -> list[str]:
        """Run ids the provider holds resources of for ``config.cluster_name`` (may ask the network)."""
        return []

    def fail_over(self, stack: Stack, ctx: Context, error: NoCapacity, *, elsewhere: bool = True,
                  on_demand: bool | None = True) -> str | None:
        """Move what the provider had no capacity for (in the run's ``stack``, its record in ``ctx``): to
        another place (``elsewhere``) or, for machines bought on a spot market, to on-demand capacity
        (``on_demand``; None: when the run's own settings allow it), as the target can; what moved, in
        one line, or None when it cannot."""
        return None

    def fail_over_hint(self, config: C, facts: RunFacts) -> str | None:
        """What `m` does after a capacity failure, in words (``fail_over_words``; None: nothing)."""
        return self.fail_over_words

    def data_store(self, state_root: Path, run_id: str, config: C, *, ctx: Context | None = None) -> DataStore | None:
        """Where a run's checkpoints and model live, when rtui manages them on this target. ``ctx``: the
        run's session, whose clients a store that reaches the cluster uses (None: no session)."""
        return None

    def feasibility(self, config: C, *, regions: list[str] | None, all_regions: bool,
                    request_quota: bool, yes: bool, as_json: bool, out: TextIO) -> int | None:
        """`rtui check` on this target when it has its own (an exit code), else None for the generic one."""
        return None

    def job_storage_path(self, config: C, run_id: str) -> str | None:
        """Where the job writes checkpoints and the model when the target gives the run its own storage
        and no --storage-path names any (kube: the run's volume, mounted in every Ray pod), else None."""
        return None

    def storage_profile(self, config: C) -> str | None:
        """The AWS profile that writes --storage-path (None: the usual credential chain)."""
        return None

    def job_nodes(self, config: C) -> int | None:
        """How many machines the training job's workers run on, when the config settles it (None: it
        does not). The NCCL badge and `rtui status` take it as the job's own node count: a job on one
        machine uses no network, whatever network NCCL announces (issue 39)."""
        return None

    def manifest(self, config: C, run_id: str) -> str | None:
        """`rtui manifest`: the Kubernetes objects a run's plan applies, as a YAML stream with ``# `` notes
        first (None: its stack has none; ``has_kubernetes`` says so without loading anything)."""
        return None

    def gpu_nodes(self, config: C) -> GpuNodes | None:
        """Its GPU machines as ``config`` sets them (None: it trains on CPUs, or does not choose them)."""
        return None

    def gives_storage(self, config: C) -> bool:
        """Whether the run gets storage of the target's own that every node writes (kube: a volume)."""
        return False

    def interruption_rate(self, config: C, facts: RunFacts) -> InterruptionRate:
        """The expected interruptions per node-hour of the run's training nodes (``--checkpoint-every
        auto`` checkpoints by it; the job's rate is this times ``job_nodes``). By default the hardware and
        software failure rate of large GPU training (``INTERRUPTIONS_PER_GPU_HOUR``, Llama 3) times the
        GPUs of a node. A target on CPUs (local) counts its machine as one GPU's share: most failures in
        that figure are of GPUs and their memory, which a CPU machine does not have, so one GPU's share
        is generous to the host's own (CPU, memory, disk, network); it gives an optimum of hours even for
        a checkpoint of a tenth of a second (≈ 1.7 h), so a local run of minutes checkpoints at its end
        only. A target whose nodes can be taken back (Spot capacity) overrides it with that rate."""
        nodes = self.gpu_nodes(config)
        gpus = nodes.gpus_per_node if self.on_gpus and nodes is not None else 1
        where = f"× {gpus} GPUs per node" if self.on_gpus else "one GPU's share for a CPU machine"
        return InterruptionRate(INTERRUPTIONS_PER_GPU_HOUR * gpus, f"{LLAMA3_SOURCE}, {where}")


@cache
def get(name: str) -> Target[Any]:
    """The target called ``name``; KeyError when no built-in or installed target has that name."""
    target = load(name)
    if not isinstance(target, Target):
        raise TypeError(f"{spec(name)} is not a backend.targets.Target")
    if target.name != name:
        raise TypeError(f"{spec(name)} is the {target.name} target, registered as {name}")
    return target


__all__ = ["BUILTIN", "DEFAULT", "ENTRY_POINT_GROUP", "GPU_SEQ_LEN", "INTERRUPTIONS_PER_GPU_HOUR", "Defaults",
           "FoundCluster", "GpuNodes", "TinyModel", "InterruptionRate", "Target", "get", "known", "names"]
