"""The flow around an attempt, once for both gang sources.

The attempt's logic is shared (driver.py, lifecycle.py, topup.py, race.py, places.py); so is,
here, the plumbing around it that each adapter (a Kueue Workload's check,
logic/workloads/admission.py; a PodGroup, logic/podgroups/podgroup.py) would otherwise write
over its own snapshot: the InOrder attempt in flight and the requests it supersedes
(``in_order``), a place left for the next (``fall_back``), arrivals kept and topped up
(``keep``, ``top_up``, ``kept_without_next``), a race started, followed and won
(``race_attempt``, ``racers``, ``standing``, ``won``), an ask made and said (``ask``), a gang's
attempts withdrawn (``withdraw``).

An adapter says what it knows of its gang once per decision (``Gang``): its config, requests,
capacity and backend, how it names its attempt's asks, the gang as each place asks for it, how
it makes an ask and how an attempt ends; what comes back is its own decision (a ``Decided``),
to write on its own state. What is truly its own stays with it: the check entry,
podSetUpdates, the start watchdog and slices of a Workload; gating, late members and growth
of a PodGroup.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from gangcheck.logic.attempt import (
    deletion,
    driver,
    lifecycle,
    naming,
    places,
    race,
    rollback,
    scaledown,
    topup,
)
from gangcheck.logic.attempt.actions import Action, CreateRequest, Event
from gangcheck.logic.attempt.backend import Ask, CapacityBackend
from gangcheck.logic.attempt.fulfillment import ClusterView, GangSpec
from gangcheck.model.objects import ProvisioningRequest
from gangcheck.model.provisioning_config import AtomicProvisioningSpec


@dataclass(frozen=True, kw_only=True)
class Decided:
    """What a gang source's decision carries besides the write on its own state (a check
    entry; a PodGroup's annotations)."""

    actions: tuple[Action, ...] = ()
    """What is done before the gang's own state is written: what that state says is done."""
    after: tuple[Action, ...] = ()
    """What is done once the gang's own state is written, which does not wait for it: the
    racers that lost, withdrawn (a restart between the two finds them left behind and
    withdraws them then: race.left_behind)."""
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None
    capacity_used: Mapping[str, int] | None = None
    """When the gang gets its capacity: its members by the capacity they use (reserved,
    existing, new)."""
    sources: tuple[driver.SourceNote, ...] = ()
    """What happened at the capacity sources, for their metrics."""
    step: lifecycle.Step | None = None
    """Where the attempt followed stands (None: no attempt was followed): what a diagnosis
    explains (it replays the decision on a live read)."""


D = TypeVar("D", bound=Decided)


@dataclass(frozen=True)
class NewAsk:
    """A new ask of the attempt: where it goes, what the gang's message says first (why an
    earlier place was left), and the attempt's requests whose arrivals are kept (topup.py),
    with how the gang splits between their nodes and this ask (None: split when asked)."""

    place: places.Place
    said: str = ""
    kept: tuple[ProvisioningRequest, ...] = ()
    kept_split: topup.Split | None = None


class Held(Protocol):
    """What a gang source's snapshot holds of its attempts."""

    @property
    def requests(self) -> tuple[ProvisioningRequest, ...]: ...
    @property
    def capacity(self) -> ClusterView | None: ...
    @property
    def config(self) -> AtomicProvisioningSpec | None: ...
    @property
    def backend(self) -> CapacityBackend: ...
    @property
    def templates(self) -> frozenset[str]: ...


@dataclass(frozen=True, kw_only=True)
class Gang(Generic[D]):
    """One gang, as its adapter says it for one decision."""

    kind: type[D]
    """The adapter's decision type: a plain one carries only actions and a requeue."""
    held: Held
    """The adapter's snapshot (with a config: an attempt is made and followed under one)."""
    owner: str
    """The name of the object the gang is (its requests are named after it)."""
    namespace: str
    """Its namespace, its requests' and their nodes' records' (``namespace/name``)."""
    short: str
    """What its request names carry after the owner's (the check; the PodGroup's kind)."""
    attempt: int
    """The number of the attempt in flight."""
    gang_of: places.GangOf
    """The gang as each capacity source is asked for it."""
    pinned: Callable[[Mapping[str, str]], GangSpec]
    """The gang pinned to these node labels (on the nodes of several sources)."""
    create: Callable[[str, NewAsk], D]
    """Make the ask of this name (the attempt's state saying so), or what stands instead
    (a PodGroup whose gang fits on nodes that exist is released there)."""
    ended: Callable[[ProvisioningRequest, str], D]
    """The attempt of this request ends (why): as a rollback that no place follows would."""
    now: datetime
    """The decision's time (how long a request of the gang has been in deletion)."""
    say: Callable[[str, Event], D]
    """The gang's state as it stands, its message this one; with the Event only when that
    changes what it says (nothing is written when it says it already)."""

    @property
    def config(self) -> AtomicProvisioningSpec:
        assert self.held.config is not None
        return self.held.config

    @property
    def requests(self) -> tuple[ProvisioningRequest, ...]:
        return self.held.requests

    @property
    def capacity(self) -> ClusterView | None:
        return self.held.capacity

    @property
    def backend(self) -> CapacityBackend:
        return self.held.backend

    @property
    def templates(self) -> frozenset[str]:
        return self.held.templates

    def name_of(self, ask: int = 0) -> str:
        """The name of the attempt's ask number `ask`."""
        return naming.request_name(self.owner, self.short, self.attempt, ask)

    def current(self) -> tuple[str, int]:
        """The request of the attempt in flight: its name, and which ask of the attempt it is."""
        return current(self.requests, self.owner, self.short, self.attempt)

    def asks(self) -> list[race.Ask]:
        """Every request of the attempt in flight, with its number among the attempt's asks."""
        return race.asks(self.requests, self.name_of)

    def kept_for(self, req: ProvisioningRequest) -> tuple[ProvisioningRequest, ...]:
        return topup.kept_for(self.requests, req)

    def kept_in(self) -> tuple[ProvisioningRequest, ...]:
        """The requests of the attempt in flight whose arrivals are kept for it."""
        return topup.kept_of(r for _, r in self.asks())

    def whole(self) -> GangSpec:
        """The gang pinned to no source: its topology level says whether one gang may sit
        on the nodes of two places (`topup.allowed`)."""
        return self.pinned({})

    @property
    def superseded(self) -> str:
        return f"superseded by attempt {self.attempt}"


def current(
    requests: Sequence[ProvisioningRequest], owner: str, short: str, attempt: int
) -> tuple[str, int]:
    """The request of attempt `attempt` in flight: its name, and which ask of it it is."""
    return naming.current_request({r.name for r in requests}, owner, short, attempt)


def rolling(kind: type[D], step: lifecycle.Step) -> D:
    """A rollback under way: its actions, Events and requeue only (the gang's state is
    written when it is done)."""
    return kind(
        actions=step.actions, events=step.events, requeue_after=step.requeue_after, step=step
    )


def find(requests: Sequence[ProvisioningRequest], name: str) -> ProvisioningRequest | None:
    return next((r for r in requests if r.name == name), None)


def decided(kind: type[D], gone: driver.Withdrawal) -> D:
    """A withdrawal (driver.withdraw, race.withdraw_losers) as the adapter's decision."""
    return kind(actions=gone.actions, events=gone.events, requeue_after=gone.requeue_after)


def withdraw(
    kind: type[D],
    held: Held,
    why: str,
    *,
    requests: Sequence[ProvisioningRequest] | None = None,
    gone: bool = False,
) -> D:
    """Withdraw the gang's attempts (`requests`: these only), what arrived for each reclaimed
    (driver.withdraw; `gone`: the gang is deleted)."""
    withdrawn = driver.withdraw(
        held.requests if requests is None else requests,
        capacity=held.capacity,
        config=held.config,
        backend=held.backend,
        why=why,
        gone=gone,
    )
    return decided(kind, withdrawn)


def record(
    attempt: int, config: AtomicProvisioningSpec, now: datetime, new: NewAsk, *, reserved: int
) -> dict[str, str]:
    """What a new ask records: the attempt (lifecycle.record; `reserved`: its members placed
    on reserved capacity), its place, what it tops up and how many members the kept nodes
    hold."""
    on_kept = new.kept_split.kept_members if new.kept and new.kept_split is not None else 0
    return {
        **lifecycle.record(attempt, config, now, reserved=reserved, source=new.place.source),
        **new.place.record(),
        **topup.record(new.kept, on_kept),
    }


def with_split(new: NewAsk, held: Held, pinned: Callable[[Mapping[str, str]], GangSpec]) -> NewAsk:
    """The ask with the gang split between the kept nodes and it (`pinned`: the gang pinned
    to these labels, those its place's source and the kept requests' sources share); as it
    is when nothing is kept or the split is made."""
    if not new.kept or new.kept_split is not None:
        return new
    assert held.config is not None
    labels = topup.shared_labels(held.config, new.place, new.kept)
    return replace(new, kept_split=topup.split(held.capacity, pinned(labels), new.kept))


def ask(held: Held, made: Ask, new: NewAsk, *, reserved: int, write: Callable[[str], D]) -> D:
    """Make the ask, and say it (`write`: the adapter's state with this message), with its
    Event and its source's note."""
    assert held.config is not None
    asked = driver.ask(held.backend, made, reserved=reserved)
    where = new.place.describe(held.config)
    decision = write(new.said + asked.message + (f" from {where}" if where else ""))
    return replace(
        decision,
        actions=asked.actions,
        events=(*decision.events, *asked.events),
        sources=(driver.asked_note(held.config, new.place.source),),
    )


def followed(decision: D, inflight: driver.InFlight, name: str) -> D:
    """The attempt in flight's decision, after the backend's upkeep; a replacement said."""
    if inflight.change is not None:
        decision = replace(decision, events=(*decision.events, driver.replaced_event(name)))
    return replace(decision, actions=inflight.upkeep + decision.actions)


def first_ask(gang: Gang[D], name: str) -> D:
    """The attempt's first ask, `name`: at its first source, in its best domain. Or, `name`
    being a later ask's (`resumed`: the attempt had reached it, its request deleted outside
    gangcheck), that ask again, at the place the attempt's fall-backs reach after as many
    places left, not at a source that stocked out earlier in the attempt."""
    ask = next((k for k in range(1, naming.MAX_ASKS) if gang.name_of(k) == name), 0)
    place = _place_at(gang, ask) if ask else None
    if place is None:
        return gang.create(
            name, NewAsk(places.first_place(gang.config, gang.gang_of, gang.capacity))
        )
    said = (
        f"{name} was deleted outside gangcheck; the attempt goes on where it was, the places "
        "before it having failed: "
    )
    return gang.create(name, NewAsk(place, said))


def resumed(gang: Gang[D]) -> str | None:
    """The latest ask of the attempt in flight that was made (its PodTemplates are left: a
    request deleted outside gangcheck leaves them, one gangcheck withdraws takes them with
    it) when none of its asks is left: its request deleted by hand after the places before
    it failed and were withdrawn. None: none after the first, or its place cannot be told
    now (`_place_at`)."""
    pod_sets = [p[0] for p in gang.whole().pod_sets]
    for ask in reversed(range(1, naming.MAX_ASKS)):
        name = gang.name_of(ask)
        if any(naming.template_name(name, p) in gang.templates for p in pod_sets):
            return name if _place_at(gang, ask) is not None else None
    return None


def _place_at(gang: Gang[D], ask: int) -> places.Place | None:
    """The place of the attempt's `ask`-th ask, as its fall-backs reach it (each ask after
    the first is made where the one before could not deliver: `driver.fall_back`), on the
    config and capacity now; None when the config now has no place that far."""
    place: places.Place | None = places.first_place(gang.config, gang.gang_of, gang.capacity)
    for _ in range(ask):
        if place is None:
            return None
        place = places.next_place(gang.config, place, gang.gang_of, gang.capacity)
    return place


def in_order(
    gang: Gang[D],
    *,
    first: Callable[[str], D],
    in_flight: Callable[[ProvisioningRequest], D],
    why: str,
) -> D:
    """InOrder: the attempt's current ask followed (`in_flight`), or its first one made
    (`first`, given its name); a kept ask with no next one topped up now; the requests of
    earlier attempts withdrawn (`why`), not those kept for this one or topped up by it."""
    name, asked = gang.current()
    req = find(gang.requests, name)
    if req is None:  # no ask of the attempt left: the one it had reached, if it is known
        name = resumed(gang) or name
    # the kept requests of the attempt, and those the current one tops up (rolling back too),
    # but one kept with no node of its own (an earlier version's): withdrawn, nothing to undo
    kept = (*gang.kept_in(), *(gang.kept_for(req) if req is not None else ()))
    empty = {r.name: r for r in kept if topup.holds_nothing(r, gang.capacity)}
    keep = {r.name for r in kept} - set(empty)
    stale = lifecycle.superseded(
        [r for r in gang.requests if r.name not in keep and r.name not in empty],
        name,
        capacity=gang.capacity,
        backend=gang.backend,
        why=why,
    ) + lifecycle.superseded(
        list(empty.values()),
        name,
        capacity=gang.capacity,
        backend=gang.backend,
        why=topup.HOLDS_NOTHING,
    )
    if req is None:
        decision = first(name)
        # no ask of the attempt is left: what another of its asks held (its request deleted
        # outside gangcheck) is held by nothing now; the one asked again counts its own
        lifted, said = _holds_of_gone(gang, [], but=(name,))
        decision = replace(
            decision,
            actions=(*lifted, *decision.actions),
            events=(*decision.events, *said),
        )
    elif req.deleting:
        decision = deleting(gang, (req,))
    elif topup.is_kept(req):
        decision = kept_without_next(gang, req, asked)
    else:
        decision = in_flight(req)
    # the kept requests' nodes kept from the autoscaler's scale-down (scaledown.py)
    guarded = scaledown.guard(gang.kept_in(), gang.capacity)
    return replace(decision, actions=stale + guarded + decision.actions)


def deleting(gang: Gang[D], reqs: Sequence[ProvisioningRequest]) -> D:
    """The gang waits for these requests of its attempt, being deleted, to be gone (what it
    asks next is asked under their names): looked at again soon; once one is in deletion
    past the grace, the wait is said on the gang's state, naming it and the finalizers that
    hold it, with a Warning Event once, and looked at less often (deletion.py). Another
    controller's finalizer is never removed: a person must act."""
    wait = deletion.poll_after(reqs, gang.now)
    said = [line for r in reqs if (line := deletion.stuck(r, gang.now))]
    if not said:
        return gang.kind(requeue_after=wait)
    message = "; ".join(said)
    out = gang.say(message, Event(deletion.EVENT_REASON, message, warning=True))
    return replace(out, requeue_after=wait)


def kept_back(
    kind: type[D],
    kept: Sequence[ProvisioningRequest],
    held: Held,
    why: str,
) -> D:
    """The attempt ends without the gang: what was kept for it goes back first, each by its
    own record (topup.roll_back)."""
    gone = topup.roll_back(kept, held.capacity, held.config, why)
    return kind(actions=gone, requeue_after=lifecycle.ROLLBACK_REQUEUE_SECONDS)


def outstanding(kind: type[D], held: Held, req: ProvisioningRequest, why: str) -> D | None:
    """The attempt of `req` ends: what was kept for it and has not gone back yet goes back
    first (`kept_back`); None when nothing is outstanding."""
    kept = topup.kept_for(held.requests, req)
    return kept_back(kind, kept, held, why) if topup.outstanding(kept) else None


def fall_back(
    gang: Gang[D], req: ProvisioningRequest, why: str, *, before: tuple[Event, ...] = ()
) -> D | None:
    """The place `req` asked (a capacity source, a topology domain) could not deliver (`why`):
    the next asked in the same attempt (driver.fall_back), the new request made before the old
    one is withdrawn (`before`: Events said before the new ask's); what was kept for the
    attempt goes back when the next place may not top it up. None when no place is next (the
    attempt ends as with one source)."""
    _, asks = gang.current()
    nxt = driver.fall_back(
        gang.config,
        req,
        asks=asks,
        gang_of=gang.gang_of,
        capacity=gang.capacity,
        backend=gang.backend,
        why=why,
    )
    if nxt is None:
        return None
    kept = topup.kept_of(gang.kept_for(req))
    if kept and not topup.allowed(gang.config, gang.whole(), places.of_request(req), nxt.place):
        return kept_back(gang.kind, kept, gang, why)
    name = gang.name_of(nxt.ask)
    made = gang.create(name, NewAsk(nxt.place, nxt.said, kept))
    event = nxt.event(gang.config, req.name, name)
    return replace(made, actions=(*made.actions, *nxt.gone), events=(*before, *made.events, event))


def keep(gang: Gang[D], req: ProvisioningRequest, step: lifecycle.Step) -> D | None:
    """InOrder tops up instead of throwing away (topup.py): a rollback starting on a place
    that stopped short after part of the gang arrived from it becomes keeping what arrived
    (the same write, the phase Kept), and the next place is asked for the members the kept
    nodes cannot hold; None when the rollback goes on as before (a required topology, no
    place next, nothing of its own that holds a member: a top-up that delivered nothing is not
    kept for the nodes it tops up, a cause that never falls back, its source changed under
    it: driver.source_changed)."""
    actions = topup.keep_write(step, req)
    if actions is None or driver.source_changed(gang.config, req):
        return None
    place = places.of_request(req)
    _, asks = gang.current()
    following = topup.may_ask_next(
        gang.config,
        gang.whole(),
        place,
        places.next_place(gang.config, place, gang.gang_of, gang.capacity),
        asks,
    )
    if following is None:
        return None
    mine = topup.as_kept(req, actions)
    labels = topup.shared_labels(gang.config, following, (mine,))
    capacity = topup.with_claims(gang.capacity, actions)
    if not topup.split(capacity, gang.pinned(labels), (mine,)).kept_members:
        return None  # nothing of its own holds a member: the nodes it tops up are not its
    kept = (*topup.kept_of(gang.kept_for(req)), mine)
    return top_up(
        gang, req, kept=kept, following=following, ask=asks + 1, why=step.message, actions=actions
    )


def top_up(
    gang: Gang[D],
    req: ProvisioningRequest,
    *,
    kept: tuple[ProvisioningRequest, ...],
    following: places.Place,
    ask: int,
    why: str,
    actions: tuple[Action, ...] = (),
) -> D | None:
    """`req` kept (its keep written by `actions`, or already recorded): the place
    `following` asked for the members the kept nodes cannot hold. None when they hold none,
    or all."""
    labels = topup.shared_labels(gang.config, following, kept)
    split = topup.split(topup.with_claims(gang.capacity, actions), gang.pinned(labels), kept)
    if not split.kept_members or not split.remainder:
        return None
    name = gang.name_of(ask)
    said = topup.stopped_short(gang.config, req, why, split)
    made = gang.create(name, NewAsk(following, said, kept, split))
    event = topup.topped_up(gang.config, req, why, split, following=following, name=name)
    failed = driver.failed_note(gang.config, req, why)
    return replace(
        made,
        actions=(*actions, *made.actions),
        events=(*made.events, event),
        sources=(*failed, *made.sources),
    )


def kept_without_next(gang: Gang[D], req: ProvisioningRequest, ask: int) -> D:
    """The latest ask of the attempt is kept and no next one exists (its making was lost: a
    restart, an answer lost): the next place asked now, from the record. When no place can
    top it up any more (the config changed, the nodes went), what was kept goes back and the
    attempt ends as a rollback's would (`Gang.ended`)."""
    place = places.of_request(req)
    following = places.next_place(gang.config, place, gang.gang_of, gang.capacity)
    kept = gang.kept_in()
    why = rollback.record_of(req).reason or "stopped short"
    if following is not None and topup.allowed(gang.config, gang.whole(), place, following):
        topped = top_up(gang, req, kept=kept, following=following, ask=ask + 1, why=why)
        if topped is not None:
            return topped
    gone = topup.roll_back(kept, gang.capacity, gang.config, why)
    if gone:
        return gang.kind(actions=gone, requeue_after=lifecycle.ROLLBACK_REQUEUE_SECONDS)
    return gang.ended(req, why)


# ---- Race --------------------------------------------------------------------------------


def race_attempt(
    gang: Gang[D], *, start: Callable[[], D], follow: Callable[[list[race.Ask]], D]
) -> D:
    """capacitySourcePolicy Race (race.py): the racers asked (`start`) or followed
    (`follow`); the requests of earlier attempts withdrawn."""
    asks = gang.asks()
    stale = race.stale(
        gang.requests, asks, capacity=gang.capacity, backend=gang.backend, why=gang.superseded
    )
    if asks and all(r.deleting for _, r in asks):
        # every ask of the attempt is being deleted (an earlier one under these names, after
        # an eviction, held by a finalizer): nothing is judged on them, and nothing asked
        # under their names, until they are gone
        decision = deleting(gang, [r for _, r in asks])
    else:
        decision = follow(asks) if asks else start()
    # an ask made again under the name of one gone (a racer deleted by hand, its place
    # given back to its source: only its own record knew that source was raced) counts the
    # nodes recorded for it, as an InOrder ask asked again under its name does
    again = {
        str((a.body.get("metadata") or {}).get("name") or "")
        for a in decision.actions
        if isinstance(a, CreateRequest)
    }
    lifted, said = _holds_of_gone(gang, asks, but=again) if asks else ((), ())
    return replace(
        decision,
        actions=(*stale, *lifted, *decision.actions),
        events=(*decision.events, *said),
    )


def _holds_of_gone(
    gang: Gang[D], asks: Sequence[race.Ask], *, but: Collection[str] = ()
) -> tuple[tuple[Action, ...], tuple[Event, ...]]:
    """The holds left on nodes recorded for asks of this attempt that are gone (other than
    `asks` and `but`, the one asked again now): a request deleted outside gangcheck, a
    racer the race goes on without or an InOrder ask whose attempt starts over (an ask
    gangcheck withdraws has its hold lifted first). No record of it is left whose end would
    lift them (lifecycle.release_holds_of_gone)."""
    here = {*but, *(r.name for _, r in asks)}
    gone = [n for k in range(naming.MAX_ASKS) if (n := gang.name_of(k)) not in here]
    return lifecycle.release_holds_of_gone(gang.capacity, gang.namespace, gone)


def racers(gang: Gang[D]) -> list[D]:
    """The race's first asks, at once: the k-th at source k (race.starting)."""
    return [gang.create(gang.name_of(p.source), NewAsk(p)) for p in race.starting(gang.config)]


def standing(gang: Gang[D], asks: Sequence[race.Ask], follow_one: race.FollowOne) -> race.Standing:
    """The race as it stands (race.follow)."""
    return race.follow(
        asks, follow_one, config=gang.config, capacity=gang.capacity, backend=gang.backend
    )


def replacement(gang: Gang[D], ended: race.Ended) -> D | None:
    """The ask that takes the place of a racer that could not deliver, if a source is left;
    of a place missing from the race (`ended.request` None: a racer's request deleted outside
    gangcheck), said by a RacerReplaced Warning Event."""
    if ended.replacement is None:
        return None
    asked, place = ended.replacement
    name = gang.name_of(asked)
    made = gang.create(name, NewAsk(place))
    if ended.request is not None:
        return made
    message = f"{ended.why}: {place.describe(gang.config)} is asked in the place missing ({name})"
    return replace(made, events=(*made.events, Event("RacerReplaced", message, warning=True)))


def joined(
    decision: D, parts: Sequence[Decided], *, said: Callable[[Event], bool] | None = None
) -> D:
    """The racers' decisions as one, written as `decision` (the adapter's state saying the
    race): all their actions, Events (those `said` keeps) and notes; the soonest requeue."""
    waits = [d.requeue_after for d in parts if d.requeue_after is not None]
    events = (e for d in parts for e in d.events if said is None or said(e))
    return replace(
        decision,
        actions=tuple(a for d in parts for a in d.actions),
        events=(*decision.events, *events),
        sources=tuple(n for d in parts for n in d.sources),
        requeue_after=min(waits, default=None),
    )


def won(out: D, first: race.Won) -> D:
    """The winner's decision (`out`), after its upkeep; the other racers withdrawn, what
    arrived for them reclaimed (race.won), once the winner is written: neither the gang's
    state nor its members wait on a loser's withdrawal (its reclaim may meet a node changed
    meanwhile and be tried again)."""
    gone = first.withdrawal
    return replace(
        out,
        actions=(*first.followed.upkeep, *out.actions),
        after=(*out.after, *gone.actions),
        events=(*out.events, *gone.events, first.event),
        sources=(*out.sources, *first.notes),
    )
