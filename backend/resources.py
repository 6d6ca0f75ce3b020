"""The typed vocabulary shared by every target: checks, plans, step events.

Everything here is plain data (pydantic), so the CLI can print it as JSON, the run
store can persist it and the TUI can render it without knowing which target made it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from backend.errors import RtuiError
from backend.restarts import Restart


class CheckStatus(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    INFO = "info"


class CheckResult(BaseModel):
    """One preflight finding: what was checked, the verdict, and what to do about it."""

    model_config = ConfigDict(frozen=True)

    id: str
    title: str
    status: CheckStatus
    detail: str = ""
    remedy: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class Action(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    REPLACE = "replace"
    DELETE = "delete"
    NOOP = "noop"


ACTION_SYMBOL: dict[Action, str] = {
    Action.CREATE: "+",
    Action.UPDATE: "~",
    Action.REPLACE: "-/+",
    Action.DELETE: "-",
    Action.NOOP: " ",
}


class Spec(BaseModel):
    """What one kind of resource is made with, typed: its handler's ``spec_model``. A plan, a record and
    the plan's diff hold its JSON form (``Resource.spec``), made with ``as_spec`` (the fields given, so
    an optional one left out stays out of the diff) and read back, checked, with ``of``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def as_spec(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)

    @classmethod
    def of(cls, resource: Resource) -> Self:
        return cls.model_validate(resource.spec)


class Resource(BaseModel):
    """Something a layer wants to exist: its stable address, its kind and the spec that matters (the JSON
    form of its handler's ``spec_model`` where it has one; a Kubernetes object is its own spec)."""

    model_config = ConfigDict(frozen=True)

    address: str
    layer: str
    kind: str
    spec: dict[str, Any] = Field(default_factory=dict)
    depends_on: tuple[str, ...] = ()
    cost_per_hour: float | None = None
    cost_note: str = ""  # what the hourly cost is made of, or what bills beside it (per GB)
    # vCPUs of each quota it uses: {"L-DB2E81BA": {"vcpus": 96, "headroom": 192}} (aws)
    quota: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    # What it changes beyond the run's own objects, for everyone on the cluster ("KubeRay's CRDs, seen by
    # every namespace"); empty for what only the run uses. Applying such a change is confirmed twice.
    cluster_wide: str = ""


class Observed(BaseModel):
    """Something of this run that discovery found live (by marker, tags or labels, never the record alone)."""

    model_config = ConfigDict(frozen=True)

    address: str
    layer: str
    kind: str
    id: str
    state: dict[str, Any] = Field(default_factory=dict)
    depends_on: tuple[str, ...] = ()
    healthy: bool = True
    adopted: bool = False
    reason: str = ""


class Change(BaseModel):
    """One thing the plan will create, change or leave alone (Terraform-style). Its step shares its address."""

    model_config = ConfigDict(frozen=True)

    address: str
    layer: str
    kind: str
    action: Action
    depends_on: tuple[str, ...] = ()
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    cost_per_hour: float | None = None
    cost_note: str = ""
    quota: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    reason: str = ""
    cluster_wide: str = ""  # Resource.cluster_wide

    @property
    def symbol(self) -> str:
        return ACTION_SYMBOL[self.action]


class Plan(BaseModel):
    """What ``apply`` will do: the difference between desired and discovered state, bottom layer first."""

    target: str
    changes: list[Change] = Field(default_factory=list)
    # What each layer's heading says beside its name ("Kubernetes objects"), from the layer itself.
    layer_titles: dict[str, str] = Field(default_factory=dict)
    # Where the prices come from ("estimate, us-east-1 prices" when not quoted for the region), and
    # what bills by use beside the hourly total ("+ $0.045/GB NAT data processing").
    price_source: str = ""
    usage_costs: list[str] = Field(default_factory=list)
    # One line each about what the plan decided differently from before, and why ("capacity reservation
    # cr-… expired: the GPU nodes run On-Demand").
    notes: list[str] = Field(default_factory=list)

    @property
    def is_noop(self) -> bool:
        return all(c.action is Action.NOOP for c in self.changes)

    def prices(self) -> dict[str, float]:
        """How a plan is priced, the only place: what each priced resource it keeps or makes costs per
        hour (USD), by address. A change that deletes prices nothing; {} when nothing is priced."""
        return {c.address: c.cost_per_hour for c in self.changes
                if c.action is not Action.DELETE and c.cost_per_hour is not None}

    def scalable(self) -> dict[str, int]:
        """The priced resources whose size may go below the planned one while the run lives (a
        nodegroup an autoscaler may shrink: ``min_size`` under ``size``), with that planned size: what
        each of them costs per hour is for that many nodes."""
        out = {}
        for c in self.changes:
            spec = c.after or {}
            if c.action is not Action.DELETE and c.cost_per_hour and isinstance(spec.get("size"), int) \
                    and isinstance(spec.get("min_size"), int) and spec["min_size"] < spec["size"]:
                out[c.address] = int(spec["size"])
        return out

    @property
    def cost_per_hour(self) -> float:
        return sum(self.prices().values())

    def layer_cost_per_hour(self, layer: str) -> float:
        """What one layer's part of the plan costs per hour (its changes' ``prices``)."""
        prices = self.prices()
        return sum(prices.get(c.address, 0.0) for c in self.changes if c.layer == layer)

    def as_plan(self) -> Plan:
        """Just the plan (a subclass's extra fields, such as what discovery saw, left out): what a record keeps."""
        return Plan.model_validate(self.model_dump(include=set(Plan.model_fields)))

    def cluster_wide(self) -> list[Change]:
        """The changes applying this plan makes to objects everyone on the cluster shares."""
        return [c for c in self.changes if c.cluster_wide and c.action is not Action.NOOP]

    def counts(self) -> dict[str, int]:
        out = {a.value: 0 for a in Action}
        for c in self.changes:
            out[c.action.value] += 1
        return out

    def layers(self) -> list[str]:
        return list(dict.fromkeys(c.layer for c in self.changes))

    def change(self, address: str) -> Change | None:
        return next((c for c in self.changes if c.address == address), None)


class EventKind(StrEnum):
    STARTED = "started"
    PROGRESS = "progress"
    LOG = "log"
    RETRYING = "retrying"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


TERMINAL_EVENTS = frozenset({EventKind.DONE, EventKind.FAILED, EventKind.SKIPPED, EventKind.CANCELLED})


class StepEvent(BaseModel):
    """Something that happened to one step. The runner emits these; the UI renders them."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    step: str
    kind: EventKind
    message: str = ""
    fraction: float | None = None
    cause: str | None = None
    remedy: str | None = None
    attempt: int = 1
    ts: float = Field(default_factory=time.time)
    data: dict[str, Any] = Field(default_factory=dict)
    # A failure's own error, to catch by type (a NoCapacity a target can fail over); never serialised.
    error: RtuiError | None = Field(default=None, exclude=True, repr=False)


@dataclass(frozen=True)
class Leftover:
    """Something of a run the orphan sweep still found live after teardown, and what it costs."""

    kind: str
    id: str
    state: str = ""
    cost_per_hour: float = 0.0
    price_source: str = ""  # where cost_per_hour comes from ("estimate, us-east-1 prices", ...)
    kept: bool = False  # the run's data, kept on purpose (until `down --delete-data`): not a leftover

    def describe(self) -> str:
        cost = f", ${self.cost_per_hour:.3f}/h" if self.cost_per_hour else ""
        return f"{self.kind} {self.id}" + (f" ({self.state}{cost})" if self.state or cost else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CostItem:
    """One priced resource on the cost meter (``backend.session.cost_meter``)."""

    per_hour: float  # now: for the GPU nodes, those there are when the meter was given them
    since: float  # when it was made (epoch seconds)
    accrued: float  # dollars so far
    node_hours: float | None = None  # from the provider's own record of its nodes, where there is one
    accrued_at_most: bool = False  # counted at full size for its whole life: an upper bound
    per_hour_full: float | None = None  # at full size, where ``per_hour`` counts fewer nodes
    # Where ``accrued`` came from when not the plan's price: the provider's price history (Spot).
    accrued_from: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"per_hour": self.per_hour, "since": self.since, "accrued": self.accrued}
        if self.node_hours is not None:
            out["node_hours"] = self.node_hours
        if self.accrued_from is not None:
            out["accrued_from"] = self.accrued_from
        if self.accrued_at_most:
            out["accrued_at_most"] = True
        if self.per_hour_full is not None:
            out["per_hour_full"] = self.per_hour_full
        return out


@dataclass(frozen=True)
class CostMeter:
    """What a run costs now and has cost so far (``backend.session.cost_meter``); ``to_dict`` is its
    form in `rtui status --json`."""

    per_hour: float  # now
    per_hour_full: float  # with every GPU node there
    accrued: float  # so far
    accrued_exact: bool  # False: a resource that may have run below its size is counted at full size
    resources: dict[str, CostItem]
    left_behind: tuple[Leftover, ...] = ()  # what the orphan sweep still found after teardown
    left_behind_per_hour: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"per_hour": self.per_hour, "per_hour_full": self.per_hour_full, "accrued": self.accrued,
                "accrued_exact": self.accrued_exact,
                "resources": {address: item.to_dict() for address, item in self.resources.items()},
                "left_behind": [item.to_dict() for item in self.left_behind],
                "left_behind_per_hour": self.left_behind_per_hour}


@dataclass(frozen=True)
class GpuFleet:
    """The GPU side of a run's cluster now, against its full size (issue 26: its workers and nodes
    come and go with demand), as its cluster layer sees it (``layers.base.GpuFleetReporter``)."""

    workers: int  # GPU workers running
    nodes: int  # GPU nodes in the cluster (the workers may land on any)
    full: int  # the run's GPU node count: one worker per node at full size
    autoscaling: bool  # the cluster lets idle workers go
    idle_timeout_s: float | None = None  # how long an idle worker stays
    priced: str | None = None  # the address of the priced resource that holds the GPU nodes, when one does
    idle_since: float | None = None  # the last job's end, once it ended
    scaled_down_at: float | None = None  # when the idle timeout let the workers go after it

    @property
    def short(self) -> bool:
        """Fewer workers than at full size: a job waits for the rest to come back."""
        return self.workers < self.full

    def sizes(self) -> str:
        """The nodes and the Ray worker pods on them, now against full size. "Ray worker pods", not
        "workers": the config's and the badge's workers are training ranks (GPUs), several a pod."""
        return f"GPU nodes {self.nodes}/{self.full}, Ray worker pods {self.workers}/{self.full}"

    def line(self) -> str:
        scaled = " (scaled down while idle; the next job brings them back)" if self.autoscaling and self.short else ""
        return self.sizes() + scaled

    def after_job(self, ended_at: float) -> GpuFleet:
        """This fleet with when it went idle: the job's end, and the workers' scale-down after it."""
        idle = self.idle_timeout_s
        return replace(self, idle_since=ended_at,
                       scaled_down_at=ended_at + idle if idle and self.short else None)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuFleet:
        """Back from ``to_dict`` (what `rtui status` prints is rendered from its JSON)."""
        return cls(**{k: v for k, v in data.items() if k != "line"})

    def to_dict(self) -> dict[str, Any]:
        """``rtui status --json``'s ``gpu``."""
        out: dict[str, Any] = {"workers": self.workers, "nodes": self.nodes, "full": self.full,
                               "autoscaling": self.autoscaling, "line": self.line(),
                               "idle_timeout_s": self.idle_timeout_s, "priced": self.priced}
        if self.idle_since is not None:
            out.update(idle_since=self.idle_since, scaled_down_at=self.scaled_down_at)
        return out


@dataclass(frozen=True)
class NodeLoss:
    """A node the provider took away while a job ran, as its own records say
    (``layers.base.NodeLosses``): a Spot interruption, a node that failed its health check."""

    at: float  # when the provider recorded it (epoch seconds)
    node: str  # the provider's name for it (an instance id, a node name)
    cause: str  # in words, short: "Spot interruption"
    spot: bool = False  # the node was Spot capacity


@dataclass(frozen=True)
class Interruption:
    """A job that stopped and went on from a checkpoint (``backend.restarts.Restart``), with what
    took its node away when the target can tell (``loss``)."""

    restart: Restart
    loss: NodeLoss | None = None

    @property
    def cause(self) -> str | None:
        return "Spot" if self.loss is not None and self.loss.spot else self.loss.cause if self.loss else None

    def to_dict(self) -> dict[str, Any]:
        return {**self.restart.to_dict(), "cause": self.cause,
                "lost_node": None if self.loss is None else {"node": self.loss.node, "at": self.loss.at,
                                                             "cause": self.loss.cause}}


# A loss is the cause of a restart when the provider recorded it between a little before the job's last
# step (a Spot notice gives two minutes; a provider records a node gone after its health check) and the
# job's first step since.
LOSS_BEFORE_S = 300.0


def interruptions_summary(found: Sequence[Interruption]) -> dict[str, Any]:
    """``rtui status --json``'s ``interruptions``, which the run screen words too: how many, the time they
    cost (None while one is still counting), and each."""
    lost = [i.restart.lost_s for i in found]
    return {"count": len(found), "lost_s": None if any(x is None for x in lost) else round(sum(filter(None, lost)), 1),
            "items": [i.to_dict() for i in found]}


def attribute(restarts: list[Restart], losses: list[NodeLoss], now: float) -> list[Interruption]:
    """Each restart with the earliest unclaimed loss in its window (``LOSS_BEFORE_S``)."""
    left = sorted(losses, key=lambda loss: loss.at)
    out: list[Interruption] = []
    for restart in restarts:
        start = (restart.at_ts if restart.at_ts is not None else now) - LOSS_BEFORE_S
        end = restart.resumed_ts if restart.resumed_ts is not None else now
        found = next((loss for loss in left if start <= loss.at <= end), None)
        if found is not None:
            left.remove(found)
        out.append(Interruption(restart, found))
    return out
