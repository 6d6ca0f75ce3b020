"""What a layer is: the resources it wants, what it finds live, and one handler per kind.

A layer never writes steps by hand: the planner diffs ``desired`` against ``discover`` and
turns each change into a step that calls the kind's handler. Adding a resource kind means a
handler and a line in its layer's ``desired``; nothing outside the layer's folder changes.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from backend.clients import Clients
from backend.config import RunConfig
from backend.errors import ApiUnreachable, UserError
from backend.ledger import Ledger
from backend.resources import Action, CheckResult, GpuFleet, Leftover, NodeLoss, Observed, Resource, Spec
from backend.runner import Progress
from backend.store import RunRecord, RunStore

if TYPE_CHECKING:
    from backend.rayjobs import RayJobs


class ClusterAccess(Protocol):
    """How upper layers reach the Ray cluster a lower layer made (the Jobs API, with its auth)."""

    async def jobs(self, ctx: Context) -> RayJobs | None:
        """The live cluster's Jobs API, or None when no cluster of this run is up."""
        ...

    def job_env(self, ctx: Context) -> dict[str, str]:
        """Environment the cluster adds to every job (e.g. where results go)."""
        ...

    def job_finished(self, ctx: Context) -> None:
        """A job of this run ended (locally: the files it left are made private again)."""
        ...


@runtime_checkable
class GpuFleetReporter(Protocol):
    """A cluster whose GPU workers and nodes come and go with demand (issue 26)."""

    async def gpu_fleet(self, ctx: Context) -> GpuFleet | None:
        """GPU workers running and GPU nodes now against the full size, with the address of the
        priced GPU nodes resource when there is one; None when it cannot be seen."""
        ...


@runtime_checkable
class NodeHistory(Protocol):
    """A layer that can say how long the nodes of one of its priced, scalable resources really ran,
    from the provider's own records (issue 26: the cost meter's "so far")."""

    async def node_hours(self, ctx: Context, address: str, *, since: float, now: float) -> float | None:
        """Node-hours of ``address`` between ``since`` and ``now``; None when its records cannot tell."""
        ...


@runtime_checkable
class NodeBilling(Protocol):
    """A layer whose nodes of one of its priced resources are billed at a price that moves (Spot), and
    that can say what they were billed from the provider's own records (issue 41: the cost meter)."""

    async def node_cost(self, ctx: Context, address: str, *, since: float, now: float) -> float | None:
        """Dollars ``address``'s nodes cost between ``since`` and ``now`` (None: the records cannot tell,
        or its price does not move: the plan's price times its node-hours is the figure then)."""
        ...


@runtime_checkable
class NodeLosses(Protocol):
    """A layer that can say which nodes its provider took away while a job ran (issue 41: a Spot
    interruption), from the provider's own records."""

    async def node_losses(self, ctx: Context, *, since: float, now: float) -> list[NodeLoss]:
        """Nodes lost between ``since`` and ``now``, oldest first; empty when its records cannot tell."""
        ...


@runtime_checkable
class JobSecretCarrier(Protocol):
    """A cluster that hands the job the ``--job-env`` values outside ``runtime_env``: Ray's Jobs API
    returns a job's ``runtime_env`` to anyone who lists jobs, and its runtime-env agent logs it."""

    def carry_job_secrets(self, ctx: Context, submission_id: str, values: Mapping[str, str]) -> dict[str, str]:
        """Store ``values`` where only that job reads them; the (non-secret) variables saying where."""
        ...


def _no_private_channel(ctx: Context) -> UserError:
    return UserError(f"--job-env: the {ctx.config.target} target has no private way to hand values to the job "
                     "(Ray's Jobs API shows a job's runtime_env to anyone who lists jobs)",
                     remedy="drop --job-env, or give the target's ClusterAccess a carry_job_secrets "
                            "(backend/layers/base.py, JobSecretCarrier)")


def refuse_job_env_without_carrier(ctx: Context) -> None:
    """At plan time: ``--job-env`` on a cluster with no ``JobSecretCarrier`` (a plugin target's) is an
    error, never a fallback to ``runtime_env``, which the Jobs API shows to anyone who lists jobs."""
    if ctx.config.job_env_names() and not isinstance(ctx.cluster, JobSecretCarrier):
        raise _no_private_channel(ctx)


def job_secret_env(ctx: Context, submission_id: str, values: Mapping[str, str]) -> dict[str, str]:
    """The ``env_vars`` that give a job the user's ``--job-env`` values through the cluster's own
    carrier (locally: a 0600 file in the cluster's 0700 dir): where they are, never the values."""
    if not values:
        return {}
    if not isinstance(ctx.cluster, JobSecretCarrier):
        raise _no_private_channel(ctx)
    return ctx.cluster.carry_job_secrets(ctx, submission_id, values)


@runtime_checkable
class HeadLogSource(Protocol):
    """A cluster whose Ray head runs in a pod with a log of its own (not the local target)."""

    def head_log(self, ctx: Context, *, since_time: str | None, follow: bool) -> AsyncIterator[str]:
        """The head's log lines, each ``<RFC 3339 time> <text>``, from ``since_time`` on."""
        ...


@dataclass(frozen=True)
class Unanswered:
    """What teardown goes on without: its API gave no answer, and ``holder`` deletes what rtui made there."""

    what: str
    why: str
    holder: str

    def line(self) -> str:
        return f"{self.what}: the API does not answer ({self.why}); what rtui made there goes with {self.holder}"


@dataclass
class Context:
    """What a layer and its handlers may use: the config, the run's record and its ledger, and the
    session's clients (``RunSession`` passes its own and closes them when it ends)."""

    config: RunConfig
    record: RunRecord
    store: RunStore
    cluster: ClusterAccess | None = None
    clients: Clients = field(default_factory=Clients)
    # `down --delete-data`: the run's data goes too (a store the run made for it, e.g. its bucket, with it).
    delete_data: bool = False
    # Teardown's discovery: where what lives inside a cluster that does not answer is noted (and taken as
    # nothing to delete) when a layer holds that cluster (``Layer.holds_above``); None elsewhere.
    unanswered: list[Unanswered] | None = None

    def note_unanswered(self, what: str, exc: ApiUnreachable, holder: str | None) -> None:
        """Note ``what`` as unanswered, or raise ``exc`` when nothing would delete it (not in teardown)."""
        if self.unanswered is None or holder is None:
            raise exc
        self.unanswered.append(Unanswered(what, exc.message, holder))

    @property
    def ledger(self) -> Ledger:
        return self.store.ledger(self.record)

    def save(self) -> None:
        self.store.save(self.record)

    async def jobs(self) -> RayJobs | None:
        return await self.cluster.jobs(self) if self.cluster is not None else None


class Handler(abc.ABC):
    """Create, update and delete one kind of resource. Create must be idempotent: look first."""

    kind: ClassVar[str]
    title: ClassVar[str]
    expected_s: ClassVar[float] = 1.0
    retries: ClassVar[int] = 0
    backoff_s: ClassVar[float] = 1.0
    updatable: ClassVar[bool] = False
    # When something this depends on is created or replaced, this must be made again too.
    follows_dependencies: ClassVar[bool] = True
    # The type of what it is made with (``Resource.spec`` is its JSON form): every plan checks each wanted
    # resource's spec against it. None: a spec that is a provider's own object (a Kubernetes manifest).
    spec_model: ClassVar[type[Spec] | None] = None

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        """The action that turns ``have`` into ``want``, and why. Default: spec keys must match."""
        if not have.healthy:
            return Action.REPLACE, have.reason or "not healthy"
        changed = sorted(k for k, v in want.spec.items() if have.state.get(k) != v)
        if changed:
            return (Action.UPDATE if self.updatable else Action.REPLACE), f"changed: {', '.join(changed)}"
        return Action.NOOP, have.reason or "in place"

    def kept_on_down(self, have: Observed, observed: Sequence[Observed]) -> bool:
        """Whether teardown leaves ``have`` in place (the run's data and what holds it: removed only by
        `rtui down --delete-data`, through the run's data store)."""
        return False

    # What its delete step is called in a progress pane (default: "Delete <address>").
    delete_title: ClassVar[str | None] = None

    def step_title(self, address: str, action: Action) -> str:
        if action is Action.DELETE and self.delete_title:
            return self.delete_title
        verb = {Action.DELETE: "Delete", Action.REPLACE: "Replace", Action.UPDATE: "Update"}.get(action)
        return f"{verb} {address}" if verb else self.title

    def kube_objects(self, ctx: Context, want: Resource) -> list[dict[str, Any]]:
        """The Kubernetes objects that applying ``want`` sends, made from the plan's resource (a value read
        only when applied, such as a secret's, stands as where it comes from). ``create`` applies these and
        `rtui manifest` prints them for every resource of the plan, so the two cannot drift (issue 38)."""
        return []

    @abc.abstractmethod
    def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]: ...

    def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        raise NotImplementedError(f"{self.kind} cannot be updated in place")

    @abc.abstractmethod
    def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]: ...


class Layer(abc.ABC):
    name: ClassVar[str]
    title: ClassVar[str] = ""  # what the plan's heading says of it beside its name ("Ray job")
    sweeps: ClassVar[bool] = False  # whether ``sweep`` looks for anything (teardown then shows its step)
    # What of this layer holds everything the layers above make (aws: "the EKS cluster"), so that their
    # teardown may go on without them when their API does not answer; None: nothing does.
    holds_above: ClassVar[str | None] = None

    @property
    @abc.abstractmethod
    def handlers(self) -> Mapping[str, Handler]:
        """The handler of each kind this layer owns."""

    async def prepare(self, ctx: Context) -> None:
        """Fetch the facts ``desired`` needs from the world (an image's digest), once per plan."""
        return None

    def settle_offline(self, ctx: Context) -> None:
        """What ``prepare`` asks the world for, settled from the config alone, so that `rtui manifest` plans
        without reaching a cloud or a cluster. Only facts no Kubernetes object is made from may be guessed."""
        return None

    @abc.abstractmethod
    def desired(self, ctx: Context, below: Sequence[Resource]) -> list[Resource]:
        """What should exist, from the config and the resources of the layers below."""

    @abc.abstractmethod
    async def discover(self, ctx: Context) -> list[Observed]:
        """Everything of this run that is live now, found from the world (markers, tags, labels)."""

    async def preflight(self, ctx: Context) -> list[CheckResult]:
        """Checks that can fail before anything is created."""
        return []

    async def explain_unanswered(self, ctx: Context, exc: ApiUnreachable) -> ApiUnreachable:
        """``exc`` (a layer above found the cluster this layer holds silent) with what this layer knows of why."""
        return exc

    def price_source(self, ctx: Context) -> str:
        """Where the costs of this layer's last ``desired`` come from ("" when it prices nothing)."""
        return ""

    def usage_costs(self, ctx: Context) -> list[str]:
        """What its last ``desired`` bills by use beside the hourly costs ("+ $0.045/GB ...")."""
        return []

    def plan_notes(self, ctx: Context) -> list[str]:
        """One line each about what its last ``desired`` decided differently from the run's record."""
        return []

    def applying(self, ctx: Context) -> None:
        """A plan of this layer is about to be applied (keep what it settled, e.g. the AZs)."""
        return None

    async def sweep(self, ctx: Context) -> list[Leftover]:
        """After teardown: anything of this run still live, found from the world (not the record)."""
        return []

    def access(self) -> ClusterAccess | None:
        """The Ray cluster this layer makes, for the layers above; None when it makes none."""
        return None

    def handler(self, kind: str) -> Handler:
        return self.handlers[kind]
