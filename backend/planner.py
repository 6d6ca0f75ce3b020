"""Plans from layers, and steps from plans (DESIGN.md §1).

``make_plan`` diffs every layer's desired resources against what it discovers live;
``apply_steps`` turns each non-noop change into one step with the change's address;
``teardown_steps`` turns what discovery finds into delete steps in reverse dependency
order. The ledger entry of a resource is written before its handler touches the world.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from pydantic import Field

from backend.aio import all_or_none
from backend.errors import ApiUnreachable, UserError
from backend.layers.base import Context, Handler, Layer, Unanswered
from backend.ledger import ResourceStatus
from backend.record import current_name
from backend.resources import Action, Change, Observed, Plan, Resource
from backend.runner import Progress, Step


@dataclass(frozen=True)
class Stack:
    """A target's layers, bottom up."""

    target: str
    layers: Sequence[Layer]

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    def handler(self, layer: str, kind: str) -> Handler:
        return self.layer(layer).handler(kind)


async def discover(stack: Stack, ctx: Context, *, unanswered: list[Unanswered] | None = None) -> list[Observed]:
    """Every layer's live resources of this run, bottom layer first (layers looked at concurrently).

    A layer runs on the layers below it (its ``desired`` is made from theirs), so what it has live
    depends on what the nearest layer below has live: that is written into each ``depends_on`` here,
    the one place, and teardown reads nothing but ``depends_on``.

    With ``unanswered`` (teardown), a layer whose API does not answer while a layer below holds what it
    made (``Layer.holds_above``) is taken as having nothing to delete of its own, and noted there."""
    async def look(index: int, layer: Layer) -> list[Observed]:
        try:
            return await layer.discover(ctx)
        except ApiUnreachable as exc:
            if unanswered is None:
                raise await explained(stack, ctx, index, exc) from None
            holder = _holder_below(stack, index)
            ctx.note_unanswered(f"the {layer.name} layer", exc, holder.holds_above if holder else None)
            return []

    ctx.unanswered = unanswered
    try:
        found: list[list[Observed]] = await all_or_none(*(look(i, layer) for i, layer in enumerate(stack.layers)))
    finally:
        ctx.unanswered = None
    out: list[Observed] = []
    below: tuple[str, ...] = ()
    for per_layer in found:
        out.extend(o.model_copy(update={"depends_on": tuple(dict.fromkeys([*o.depends_on, *below]))})
                   if below else o for o in per_layer)
        below = tuple(o.address for o in per_layer) or below
    return out


def desired(stack: Stack, ctx: Context) -> list[Resource]:
    wanted: list[Resource] = []
    for layer in stack.layers:
        wanted.extend(layer.desired(ctx, tuple(wanted)))
    return wanted


class PlanResult(Plan):
    """A plan plus what discovery saw when it was made (needed to delete or replace)."""

    observed: dict[str, Observed] = Field(default_factory=dict, exclude=True)


def _holder_below(stack: Stack, index: int) -> Layer | None:
    return next((below for below in reversed(stack.layers[:index]) if below.holds_above), None)


async def explained(stack: Stack, ctx: Context, index: int, exc: ApiUnreachable) -> ApiUnreachable:
    """``exc`` (layer ``index`` found its cluster's API silent) as the layer holding that cluster explains
    it: the nearest holder below, else the layer itself when it holds one (aws's cluster-autoscaler)."""
    layer = stack.layers[index]
    explainer = _holder_below(stack, index) or (layer if layer.holds_above else None)
    return exc if explainer is None else await explainer.explain_unanswered(ctx, exc)


async def make_plan(stack: Stack, ctx: Context) -> PlanResult:
    async def prepare(index: int, layer: Layer) -> None:
        # Preparation asks the same API as discovery, at the same time: whichever meets the silence first
        # says it, and says it explained.
        try:
            await layer.prepare(ctx)
        except ApiUnreachable as exc:
            raise await explained(stack, ctx, index, exc) from None

    found, _ = await all_or_none(discover(stack, ctx),
                                 all_or_none(*(prepare(i, layer) for i, layer in enumerate(stack.layers))))
    wanted = desired(stack, ctx)
    observed = {o.address: o for o in found}
    plan = diff(stack, wanted, observed)
    sources = [s for layer in stack.layers if (s := layer.price_source(ctx))]
    plan.price_source = "; ".join(dict.fromkeys(sources))
    plan.usage_costs = [u for layer in stack.layers for u in layer.usage_costs(ctx)]
    plan.notes = [n for layer in stack.layers for n in layer.plan_notes(ctx)]
    return plan


def diff(stack: Stack, wanted: Sequence[Resource], observed: dict[str, Observed]) -> PlanResult:
    changes: dict[str, Change] = {}
    for want in wanted:  # layers bottom up, each in dependency order: dependencies are decided first
        handler = stack.handler(want.layer, want.kind)
        if handler.spec_model is not None:
            handler.spec_model.of(want)  # a spec its handler cannot read is rtui's bug: said here, not mid-apply
        have = observed.get(want.address)
        if have is None:
            action, reason = Action.CREATE, "does not exist"
        elif have.adopted:
            action, reason = Action.NOOP, have.reason or "exists, not made by rtui: adopted"
        else:
            action, reason = handler.compare(want, have)
        remade = [d for d in want.depends_on if d in changes and changes[d].action in (Action.CREATE, Action.REPLACE)]
        if remade and action in (Action.NOOP, Action.UPDATE) and have is not None and not have.adopted \
                and handler.follows_dependencies:
            action, reason = Action.REPLACE, f"{remade[0]} is {changes[remade[0]].action.value}d"
        changes[want.address] = Change(
            address=want.address, layer=want.layer, kind=want.kind, action=action, depends_on=want.depends_on,
            before=dict(have.state) if have is not None else None, after=dict(want.spec),
            cost_per_hour=want.cost_per_hour, cost_note=want.cost_note, quota=dict(want.quota), reason=reason,
            cluster_wide=want.cluster_wide)
    wanted_addresses = {w.address for w in wanted}
    for have in observed.values():
        if have.address not in wanted_addresses and not have.adopted:
            changes[have.address] = Change(
                address=have.address, layer=have.layer, kind=have.kind, action=Action.DELETE,
                depends_on=have.depends_on, before=dict(have.state), reason="no longer wanted")
    return PlanResult(target=stack.target, changes=list(changes.values()), observed=dict(observed),
                      layer_titles={layer.name: layer.title for layer in stack.layers if layer.title})


def _effective_deps(change: Change, by_address: dict[str, Change]) -> tuple[str, ...]:
    """The nearest non-noop changes this one waits for (a no-op dependency is already in place)."""
    out: list[str] = []
    stack = list(change.depends_on)
    seen: set[str] = set()
    while stack:
        address = stack.pop()
        if address in seen or address not in by_address:
            continue
        seen.add(address)
        dep = by_address[address]
        if dep.action is Action.NOOP:
            stack.extend(dep.depends_on)
        else:
            out.append(address)
    return tuple(sorted(out))


def apply_steps(stack: Stack, ctx: Context, plan: PlanResult) -> list[Step]:
    """One step per non-noop change; a change that deletes waits for what depends on it."""
    by_address = {c.address: c for c in plan.changes}
    typical = ctx.store.durations()
    steps: list[Step] = []
    for change in plan.changes:
        if change.action is Action.NOOP:
            continue
        handler = stack.handler(change.layer, change.kind)
        key = timing_key(ctx, change.kind, change.action)
        deps = _effective_deps(change, by_address)
        if change.action is Action.DELETE:
            deps = tuple(c.address for c in plan.changes
                         if change.address in c.depends_on and c.action is not Action.NOOP)
        steps.append(Step(change.address, handler.step_title(change.address, change.action),
                          _change_action(handler, ctx, change, plan),
                          deps=deps, expected_s=typical.get(key, handler.expected_s), retries=handler.retries,
                          backoff_s=handler.backoff_s, timing_key=key, layer=change.layer))
    return steps


def timing_key(ctx: Context, kind: str, action: Action) -> str:
    """What a step's duration is kept under: the target, the resource kind and what is done to it
    (``local/ray-head/create``); AZ or name parts of an address do not change how long it takes."""
    return f"{ctx.config.target}/{kind}/{action.value}"


def reconcile(ctx: Context, plan: PlanResult) -> None:
    """Resources made before a crash and found live: the ledger learns their ids instead of making more."""
    for change in plan.changes:
        have = plan.observed.get(change.address)
        if change.action is not Action.NOOP or have is None:
            continue
        entry = ctx.ledger.get(change.address)
        status = ResourceStatus.ADOPTED if have.adopted else ResourceStatus.READY
        if entry is None or entry.status is not status or entry.id != have.id:
            ctx.ledger.set(change.address, change.kind, status, layer=change.layer, id=have.id,
                           outputs=entry.outputs if entry is not None else None)


def _change_action(handler: Handler, ctx: Context, change: Change,
                   plan: PlanResult) -> Callable[[], AsyncIterator[Progress]]:
    want = Resource(address=change.address, layer=change.layer, kind=change.kind, spec=change.after or {},
                    depends_on=change.depends_on, cost_per_hour=change.cost_per_hour,
                    cost_note=change.cost_note, quota=dict(change.quota))
    have = plan.observed.get(change.address)

    async def run() -> AsyncIterator[Progress]:
        if change.action in (Action.DELETE, Action.REPLACE) and have is not None:
            async for update in _delete(handler, ctx, have):
                yield update
        if change.action is Action.UPDATE and have is not None:
            async for update in handler.update(ctx, want, have):
                yield update
            ctx.ledger.update(change.address, status=ResourceStatus.READY)
        elif change.action in (Action.CREATE, Action.REPLACE):
            ctx.ledger.set(change.address, change.kind, ResourceStatus.INTENDED, layer=change.layer)
            async for update in handler.create(ctx, want):
                yield update
            ctx.ledger.update(change.address, status=ResourceStatus.READY)

    return run


async def _delete(handler: Handler, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
    entry = ctx.ledger.get(have.address)
    if entry is None:
        ctx.ledger.set(have.address, have.kind, ResourceStatus.DELETING, layer=have.layer, id=have.id)
    else:
        ctx.ledger.update(have.address, status=ResourceStatus.DELETING, id=have.id)
    async for update in handler.delete(ctx, have):
        yield update
    # A handler that keeps what it was asked to delete (the run's data, until --delete-data) marks it
    # READY again: the record then says it is still there.
    if (entry := ctx.ledger.get(have.address)) is None or entry.status is ResourceStatus.DELETING:
        ctx.ledger.update(have.address, status=ResourceStatus.DELETED)


def teardown_steps(stack: Stack, ctx: Context, observed: Sequence[Observed]) -> list[Step]:
    """A delete step per live resource of ours; each waits for everything that depends on it: its
    order comes from ``depends_on`` alone (``discover`` puts a layer's resources on the layer below)."""
    ours = [o for o in observed
            if not o.adopted and not stack.handler(o.layer, o.kind).kept_on_down(o, observed)]
    typical = ctx.store.durations()
    steps = []
    for have in reversed(ours):
        handler = stack.handler(have.layer, have.kind)
        dependents = tuple(o.address for o in ours if have.address in o.depends_on)

        def action(handler: Handler = handler, have: Observed = have) -> AsyncIterator[Progress]:
            return _delete(handler, ctx, have)

        key = timing_key(ctx, have.kind, Action.DELETE)
        steps.append(Step(have.address, handler.step_title(have.address, Action.DELETE), action,
                          deps=dependents, expected_s=typical.get(key, handler.expected_s), timing_key=key,
                          layer=have.layer))
    return steps


def forget_missing(ctx: Context, observed: Sequence[Observed]) -> None:
    """After teardown: what the ledger still owes but discovery cannot find is gone."""
    found = {o.address for o in observed}
    for address, entry in ctx.ledger.items():
        if entry.live and address not in found:
            ctx.ledger.update(address, status=ResourceStatus.DELETED)


def select_until(steps: Sequence[Step], plan: Plan, until: str | None) -> list[Step]:
    """The steps needed for ``until`` (an address or a layer) and what they wait for; all when None."""
    if until is None:
        return list(steps)
    addresses = {c.address for c in plan.changes}
    layers = set(plan.layers())
    name = current_name(until)  # an older rtui's word for it (``--until kubernetes``) is still understood
    if name not in addresses and name not in layers:
        names = ", ".join([*plan.layers(), *sorted(addresses)])
        raise UserError(f"--until {until!r} is neither an address nor a layer of this plan",
                        remedy=f"use one of {names}")
    until = name
    by_id = {s.id: s for s in steps}
    layer_of = {c.address: c.layer for c in plan.changes}
    roots = [until] if until in addresses else [a for a, layer in layer_of.items() if layer == until]
    wanted: set[str] = set()
    pending = [r for r in roots if r in by_id]
    while pending:
        sid = pending.pop()
        if sid not in wanted:
            wanted.add(sid)
            pending.extend(by_id[sid].deps)
    return [s for s in steps if s.id in wanted]
