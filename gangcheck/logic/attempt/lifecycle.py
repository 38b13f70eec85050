"""One attempt's life, for any gang: the attempt core.

A gang source (a Kueue Workload's check, a PodGroup) reads its gang and writes its outcome;
everything between is here, once. Given the attempt (its record, the status its capacity
backend reports, the gang's demand, the capacity that exists, the config) and the clock,
``follow`` says where the attempt stands:

- WAITING: capacity asked for, not usable yet (claims of arrived nodes may come with it);
- FITS: the whole gang fits on nodes that exist (or, trusting the backend, is provisioned);
- FAILED / REVOKED / EXPIRED: the backend ended it (outside fit mode, where no rollback runs);
- ROLLING_BACK: a rollback is starting or reclaiming what arrived (logic/attempt/rollback.py);
- ROLLED_BACK: the rollback is done; ``next_attempt`` says retry after N seconds or give up.

Also here: withdrawing an attempt (``clean_up``, ``superseded``; for a gang gone while its
source's promise is open, keeping it to reclaim what still comes: ``promise``,
``reclaim_promised``), lifting the hold, the
attempt's record for a new ask, the capacity source it was made with and whether the config
changed it since (``asked_source``, ``source_drift``), and how long to wait before looking
again. And the one rule for the config an attempt in flight follows, for every gang source:
its deadlines the config now (``following``, an ``Attempt``'s ``config``), what it asked the
config it was made under (``made_under``, an ``Attempt``'s ``made``).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

from gangcheck.logic.attempt import backoff, rollback, scaledown
from gangcheck.logic.attempt.actions import (
    Action,
    AnnotateRequest,
    ClaimNode,
    Event,
    ReclaimArrivals,
    ReleaseHold,
)
from gangcheck.logic.attempt.backend import AttemptRecord, CapacityBackend
from gangcheck.logic.attempt.fulfillment import (
    ClusterView,
    GangSpec,
    arrived_for,
    assess,
    claim_of,
    dra_hint,
    fits_without,
    held_as,
    level_wait,
    request_key,
    strays,
    unrecorded_arrivals,
)
from gangcheck.logic.attempt.hold import held_nodes, is_held
from gangcheck.logic.attempt.records import AttemptPhase, RollbackCause
from gangcheck.logic.attempt.status import AttemptStatus, Phase
from gangcheck.logic.placement.fit import could_be_made_for, member_from_template
from gangcheck.logic.placement.quantity import QuantityError
from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.model.names import (
    ATTEMPT_ANNOTATION,
    ATTEMPT_CONFIG_ANNOTATION,
    DEADLINE_ANNOTATION,
    FULFILLED,
    GANG_GONE_ANNOTATION,
    PHASE_ANNOTATION,
    RESERVED_ANNOTATION,
    SOURCE_ANNOTATION,
)
from gangcheck.model.objects import Obj, Pod, ProvisioningRequest
from gangcheck.model.provisioning_config import (
    CHECK_CAPACITY,
    KARPENTER_CLASS,
    AtomicProvisioningSpec,
    FulfillmentMode,
    RetryStrategy,
    Source,
    recorded_spec,
    spec_record,
)

ROLLBACK_REQUEUE_SECONDS = 0.2
#: How often a rollback waiting for the node cache to catch up looks again.
CATCH_UP_REQUEUE_SECONDS = 1.0
LOOK_AGAIN_SECONDS = 5.0


class Progress(StrEnum):
    WAITING = "Waiting"
    FITS = "Fits"
    FAILED = "Failed"
    REVOKED = "Revoked"
    EXPIRED = "Expired"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"


@dataclass(frozen=True)
class Attempt:
    """One attempt in flight, with what its decision needs."""

    request: AttemptRecord
    """The attempt's record (gangcheck's annotations on the backend's object)."""
    status: AttemptStatus
    gang: GangSpec
    capacity: ClusterView | None
    config: AtomicProvisioningSpec
    """The config the attempt follows now (`following`): its deadlines, retries and mode;
    what it asked is `made`'s."""
    fit: bool = True
    """Fit mode: the gang must fit on nodes that exist, else the attempt rolls back."""
    started: bool = False
    """The gang's pods may already run (an admitted Workload): an expired booking is moot."""
    fallback: str | None = None
    """The capacity source asked next should this one fail (spec.capacitySources), by name:
    then a source that says it cannot find the capacity is left at once."""

    @property
    def made(self) -> AtomicProvisioningSpec:
        """The config its request was made under (`made_under`; a record without one:
        `config`): what the attempt asked, and finishes with, whatever the config became
        since."""
        return made_under(self.request, self.config) or self.config


@dataclass(frozen=True)
class Step:
    """Where an attempt stands, and what to do about it before the source writes anything."""

    progress: Progress
    message: str = ""
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None
    domains: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """FITS: the topology domain each constrained pod set was placed in."""
    verdict: rollback.RolledBack | None = None
    """ROLLED_BACK: what the rollback did, and why it began."""
    on_nodes: bool = False
    """WAITING, Provisioned: the gang waits on nodes that exist, on what other requests leave
    it of them (an older request's claim, a starting gang's members): decided again when one
    of those leaves the claim order or starts (`waiting.frees_others`), not on a timer."""


def follow(attempt: Attempt, now: datetime) -> Step:
    """Where the attempt stands now: rolling back, to roll back, or as its status says."""
    req = attempt.request
    if rollback.is_rolling_back(req):
        return roll_back(attempt)
    trigger = _rollback_trigger(attempt, now) if attempt.fit else None
    if trigger is None and attempt.fallback is not None:
        trigger = _not_found(attempt)
    if trigger and attempt.fit:
        return start_rollback(attempt, trigger, now=now)
    if trigger:  # nothing is counted as arrived outside fit mode: the next source at once
        return Step(Progress.FAILED, trigger)
    return from_status(attempt, now)


def _not_found(attempt: Attempt) -> str | None:
    """The source said it cannot find the capacity (cluster-autoscaler's CapacityIsNotFound,
    which it would otherwise try again later) while another source is next in line."""
    status = attempt.status
    if not status.capacity_not_found or status.has(Phase.PROVISIONED):
        return None
    said = status.note_text or "no node group can host the gang"
    return f"{RollbackCause.NOT_FOUND.value}: {said}"


def from_status(attempt: Attempt, now: datetime) -> Step:
    """The attempt's status, by Kueue's precedence, as a step."""
    req, status = attempt.request, attempt.status
    hint = dra_hint(status, attempt.gang)
    phase = status.phase(started=attempt.started)
    if phase is Phase.FAILED:
        said = status.signal(Phase.FAILED).message
        return Step(Progress.FAILED, said + hint if said else "")
    if phase is Phase.REVOKED:
        return Step(Progress.REVOKED, status.signal(Phase.REVOKED).message or "capacity revoked")
    if phase is Phase.EXPIRED:
        return Step(Progress.EXPIRED, status.signal(Phase.EXPIRED).message)
    if phase is Phase.PROVISIONED:
        return _provisioned(attempt, now)
    if phase is Phase.ACCEPTED:
        message = status.note_text or f"provisioning request {req.name} accepted"
    else:
        message = f"waiting for provisioning request {req.name} to be accepted"
    return Step(Progress.WAITING, message + hint, requeue_after=until_deadline(req, now))


def _provisioned(attempt: Attempt, now: datetime) -> Step:
    """Provisioned: trusted as such, or the gang must fit on nodes that exist."""
    req = attempt.request
    if not attempt.fit:
        said = attempt.status.signal(Phase.PROVISIONED).message
        return Step(Progress.FITS, said or "capacity provisioned")
    verdict = assess(attempt.capacity, req, attempt.gang, now)
    held = held_as(req)
    claims = tuple(ClaimNode(name, rv, request_key(req), held) for name, rv in verdict.claims)
    if verdict.fits:
        message = f"the whole gang fits on nodes that exist: {verdict.summary}"
        return Step(Progress.FITS, message, actions=claims, domains=verdict.domains)
    message = f"capacity requested, not yet usable: {verdict.summary}"
    message += level_wait(verdict.missing_level, verdict.arrivals)
    others = strays(attempt.capacity, req, verdict.arrived)
    if others:
        named = ", ".join(f"{p.ref.namespace}/{p.name} on {p.node_name}" for p in others[:5])
        taken = f"pods not of this gang took nodes that arrived for it: {named}"
        capacity = attempt.capacity
        if capacity is not None and fits_without(capacity, req, attempt.gang, others, now):
            if starting_gangs(capacity, others):
                # Members of gangs not started yet, which took these nodes in the moment
                # before they were recorded: the nodes that came for those gangs and that
                # they leave count here once they start (`fulfillment._partition`).
                message += f"; {taken} ({STARTING_SAID})"
                wait = min(STRAYS_STARTING_RECHECK, until_deadline(req, now))
                return Step(
                    Progress.WAITING, message, actions=claims, requeue_after=wait, on_nodes=True
                )
            # Everything asked has arrived and the gang would fit there but for them: no more
            # capacity comes for this request, so waiting for the deadline would only hold it.
            return start_rollback(attempt, f"StrayPods: {taken}", now=now)
        message += f"; {taken}"
    wait = until_deadline(req, now)
    return Step(Progress.WAITING, message, actions=claims, requeue_after=wait, on_nodes=True)


#: How soon at the latest an attempt whose arrivals members of gangs starting took decides
#: again (their request marked Started, the nodes they leave count): that mark decides it at
#: once (`Step.on_nodes`), a node's change too; this is the fallback.
STRAYS_STARTING_RECHECK = 2.0
STARTING_SAID = "members of gangs starting: what those leave counts once started"


def starting_gangs(capacity: ClusterView, strays: Sequence[Pod]) -> bool:
    """Whether every pod in `strays` is a member of another gang whose request is in flight
    and not yet marked Started (`ClusterView.keeps`): a gang whose own arrivals, or some of
    them, its members may leave when it starts."""
    return bool(strays) and all(
        p.consumes and capacity.keeps(f"{p.ref.namespace}/{p.consumes}") for p in strays
    )


def _rollback_trigger(attempt: Attempt, now: datetime) -> str | None:
    return rollback.trigger(
        attempt.request,
        attempt.status,
        attempt.capacity,
        attempt.gang,
        deadline_seconds=attempt.config.fulfillment.deadline_seconds,
        started=attempt.started,
        now=now,
    )


#: The reason a rollback begins when the config changed under an attempt not yet provisioned:
#: the next attempt follows at once under the new config (no backoff, no retry counted).
CONFIG_CHANGED = RollbackCause.CONFIG_CHANGED.value
#: How far an attempt's deadline may sit from creation + deadlineSeconds before it is moved.
DEADLINE_SLACK_SECONDS = 2.0


def drift(req: ProvisioningRequest, class_name: str, parameters: Mapping[str, str]) -> str | None:
    """How the attempt's record differs from what the config asks now (class, parameters),
    in words; None when it does not."""
    if req.class_name != class_name:
        return f"class {req.class_name!r} -> {class_name!r}"
    if dict(req.parameters) != dict(parameters):
        return "the request parameters changed"
    return None


@dataclass(frozen=True)
class AskedSource:
    """The capacity source an attempt was made with, and where it stands in the config now
    (`asked_source`)."""

    index: int
    """Its index when the attempt asked it (the request's gangcheck.io/capacity-source)."""
    source: Source | None
    """The source as the attempt asked it: the one the config it recorded lists at `index`
    (a record without a config: the config's now at `index`, as before). What its pins and
    its fit use, before and after Provisioned."""
    now: int | None
    """The same source's index in the config now; None: it left the config."""
    field: str = ""
    """The source as its config names it, for messages: ``spec.capacitySources[1] (dws)``."""
    change: str | None = None
    """How the config changed the source under the attempt (it left, moved, or asks other
    nodes), in words naming the field; None: it did not. Its class and parameters are
    compared with the request itself (`drift`)."""

    @property
    def node_selector(self) -> Mapping[str, str]:
        return self.source.node_selector if self.source is not None else {}

    @property
    def name(self) -> str:
        return self.source.name if self.source is not None else f"source-{self.index}"


def asked_source(req: AttemptRecord, config: AtomicProvisioningSpec) -> AskedSource:
    """The source `req` asked, from its record: the config it was made under (`made_under`)
    at the index it recorded; and the same source in `config` (the config now).

    A source's identity: its `name` when both the source asked and one of the config now
    have one; else what it asks (class, parameters, Karpenter NodePools, nodeSelector).
    `deadlineSeconds` is no part of it (a changed deadline applies to the attempt in
    flight). Of several matches the one at the recorded index wins, else the first. A
    record without a config (made by an older version), or a config of one class then and
    now, is read by its index in the config now, as before."""
    index = rollback.record_of(req).source
    made = recorded_config(req)
    asked = made.source(index) if made is not None else None
    if made is None or asked is None:
        return _by_index(index, config)
    if made.capacity_sources is None and config.capacity_sources is None:
        return AskedSource(index, asked, 0)
    theirs = _identities(config)
    now = _found(_identities(made)[index], theirs, index)
    where = _field(made, index)
    return AskedSource(index, asked, now, where, _changed(where, asked, theirs, index, now))


def _found(mine: _Identity, theirs: Sequence[_Identity], index: int) -> int | None:
    """Where the source is among `theirs`: at `index` if it is there, else the first match."""
    matches = [j for j, other in enumerate(theirs) if _same(mine, other)]
    return index if index in matches else (matches[0] if matches else None)


def _changed(
    where: str, asked: Source, theirs: Sequence[_Identity], index: int, now: int | None
) -> str | None:
    """How the source asked stands in the config now, in words; None: as it was asked."""
    if now is None:
        return f"{where} left the config"
    if now != index:
        return f"{where} is spec.capacitySources[{now}] now"
    before, after = dict(asked.node_selector), dict(theirs[now][1][2])
    return f"{where}: nodeSelector {before} -> {after}" if before != after else None


def _by_index(index: int, config: AtomicProvisioningSpec) -> AskedSource:
    """The source by its index in the config now (a record without a config)."""
    source = config.source(index)
    where = f"spec.capacitySources[{index}]"
    if source is None:
        return AskedSource(index, None, None, where, f"{where} left the config")
    return AskedSource(index, source, index, where if config.capacity_sources else "")


#: A capacity source's name (None: it has none) and what it asks: class, parameters (with
#: Karpenter's NodePools), nodeSelector (`asked_source`).
_Identity = tuple[str | None, tuple[str, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]]


def _identities(config: AtomicProvisioningSpec) -> list[_Identity]:
    listed = config.capacity_sources
    return [
        (
            listed[i].name if listed is not None else None,
            (
                s.class_name,
                tuple(sorted(s.parameters.items())),
                tuple(sorted(s.node_selector.items())),
            ),
        )
        for i, s in enumerate(config.sources())
    ]


def _same(one: _Identity, other: _Identity) -> bool:
    if one[0] is not None and other[0] is not None:
        return one[0] == other[0]
    return one[1] == other[1]


def _field(config: AtomicProvisioningSpec, index: int) -> str:
    """``spec.capacitySources[i] (name)``; the single class of a config without a list."""
    listed = config.capacity_sources
    if listed is None:
        return f"spec.provisioningClassName ({config.provisioning_class_name})"
    name = listed[index].name
    return f"spec.capacitySources[{index}]" + (f" ({name})" if name else "")


def source_drift(
    req: ProvisioningRequest,
    config: AtomicProvisioningSpec,
    class_name: str,
    parameters: Mapping[str, str],
) -> str | None:
    """How the config changed under the attempt, in words naming the field: the source it
    asked left the config, moved, or asks other nodes (`asked_source`); else the class or
    parameters the source asks now differ from the request's (`drift`). None: no change."""
    asked = asked_source(req, config)
    if asked.change is not None:
        return asked.change
    change = drift(req, class_name, parameters)
    return f"{asked.field}: {change}" if change is not None and asked.field else change


def source_config(config: AtomicProvisioningSpec, asked: AskedSource) -> AtomicProvisioningSpec:
    """The config as the attempt follows it: with its source's deadline (the config's now
    for that source; the one it asked with, once the source left)."""
    if asked.now is not None or asked.source is None:
        return config.for_source(asked.index if asked.now is None else asked.now)
    seconds = asked.source.deadline_seconds
    if seconds == config.fulfillment.deadline_seconds:
        return config
    fulfillment = config.fulfillment.model_copy(update={"deadline_seconds": seconds})
    return config.model_copy(update={"fulfillment": fulfillment})


def replaced(attempt: Attempt, change: str, now: datetime) -> Step:
    """The config changed under an attempt not yet Provisioned (`drift`): it is rolled back
    (CONFIG_CHANGED) so what arrived goes back, and the next one uses the new config. (Once
    Provisioned an attempt is kept: its capacity is there.)"""
    return start_rollback(attempt, f"{CONFIG_CHANGED}: {change}", now=now)


def current_deadline(
    req: ProvisioningRequest, config: AtomicProvisioningSpec
) -> tuple[ProvisioningRequest, tuple[Action, ...]]:
    """deadlineSeconds applies to the attempt in flight: its deadline is moved to creation +
    the config's deadlineSeconds when the config changed it (the record as it will be, and
    the write). A record without a readable deadline (removed or rewritten by hand) is given
    that one: without it the attempt would never be rolled back."""
    created, deadline = parse_time(req.creation_timestamp), rollback.deadline_of(req)
    if created is None:
        return req, ()
    wanted = created + timedelta(seconds=config.fulfillment.deadline_seconds)
    if deadline is not None and abs((deadline - wanted).total_seconds()) <= DEADLINE_SLACK_SECONDS:
        return req, ()
    annotations = {DEADLINE_ANNOTATION: format_time(wanted)}
    moved = replace(req, annotations={**req.annotations, **annotations})
    return moved, (AnnotateRequest(req.name, annotations),)


def start_rollback(attempt: Attempt, why: str, *, now: datetime | None = None) -> Step:
    """Record the rollback, and the nodes that arrived, on the request first: it completes,
    and counts every node, even across a restart.

    Arrivals the request may claim but has not recorded yet (one that registered since the
    last look, or whose record was lost with an answer or an apiserver restart) are recorded
    now, by the same rules as while it waited, so that they are reclaimed with the rest. So
    the rollback does not start while the node cache may miss nodes (its watch failed and is
    not answered again yet): a node that registered meanwhile would be left unrecorded.
    """
    req = attempt.request
    if attempt.capacity is not None and not attempt.capacity.nodes_current:
        return Step(
            Progress.ROLLING_BACK,
            f"{why}; the rollback waits until the node cache has caught up",
            requeue_after=CATCH_UP_REQUEUE_SECONDS,
        )
    claims = _last_claims(attempt, now)
    annotate, event = rollback.start(
        req, attempt.capacity, why, also=tuple(name for name, _ in claims)
    )
    recorded = tuple(ClaimNode(name, rv, request_key(req), held_as(req)) for name, rv in claims)
    return Step(
        Progress.ROLLING_BACK,
        why,
        actions=(*recorded, annotate),
        events=(event,),
        requeue_after=ROLLBACK_REQUEUE_SECONDS,
    )


def _last_claims(attempt: Attempt, now: datetime | None) -> tuple[tuple[str, str], ...]:
    """(name, resourceVersion) of every arrival a provisioned attempt in fit mode may still
    claim, usable or not: none otherwise (claims are made only once the backend says
    Provisioned, and only while the attempt is open: a fulfilled or kept one claims no new
    node, and one registered since came for someone else, as ``abandon`` reads it too)."""
    if not attempt.fit or attempt.capacity is None:
        return ()
    if not attempt.status.has(Phase.PROVISIONED):
        return ()
    if rollback.record_of(attempt.request).phase is not AttemptPhase.ASKED:
        return ()
    return unrecorded_arrivals(attempt.capacity, attempt.request, attempt.gang, now)


def roll_back(attempt: Attempt) -> Step:
    """Reclaim what arrived (once: the outcome is recorded), then say it is done."""
    req = attempt.request
    done = rollback.verdict(req)
    if done is None:
        reclaimer = rollback.reclaimer_of(attempt.made)
        action = rollback.reclaim(req, attempt.capacity, reclaimer)
        return Step(
            Progress.ROLLING_BACK, actions=(action,), requeue_after=ROLLBACK_REQUEUE_SECONDS
        )
    event = rollback.rolled_back(done)
    return Step(Progress.ROLLED_BACK, done.message, events=(event,), verdict=done)


def next_attempt(attempt: int, strategy: RetryStrategy) -> int | None:
    """Seconds until the attempt after `attempt` (Kueue's backoff), or None: give up."""
    if not backoff.may_retry(attempt, limit=strategy.backoff_limit_count):
        return None
    return backoff_seconds(attempt, strategy)


def backoff_seconds(attempt: int, strategy: RetryStrategy) -> int:
    """Kueue's backoff after attempt `attempt` ended."""
    return backoff.requeue_after_seconds(
        attempt - 1,
        base_seconds=strategy.backoff_base_seconds,
        max_seconds=strategy.backoff_max_seconds,
    )


def fulfilled(req: AttemptRecord) -> tuple[Action, ...]:
    """Mark the request fulfilled: it no longer claims or holds back new nodes."""
    if rollback.record_of(req).settled:
        return ()
    return (AnnotateRequest(req.name, {PHASE_ANNOTATION: FULFILLED}),)


def record(
    attempt: int,
    config: AtomicProvisioningSpec,
    now: datetime,
    *,
    reserved: int,
    source: int = 0,
) -> dict[str, str]:
    """gangcheck's record of a new attempt: its number, deadline (the source's), members on
    reserved nodes, the capacity source it asks (after the first), and the config it is made
    under (`recorded_config`)."""
    deadline = now + timedelta(seconds=config.for_source(source).fulfillment.deadline_seconds)
    made = {
        ATTEMPT_ANNOTATION: str(attempt),
        DEADLINE_ANNOTATION: format_time(deadline),
        RESERVED_ANNOTATION: str(reserved),
        ATTEMPT_CONFIG_ANNOTATION: spec_record(config),
    }
    return {**made, SOURCE_ANNOTATION: str(source)} if source else made


def recorded_config(
    req: AttemptRecord, *, finishing: bool = False
) -> AtomicProvisioningSpec | None:
    """The config the attempt was made under, as it recorded it (None for a record without
    one, made by an older version). `finishing`: read to finish the attempt
    (`recorded_spec`)."""
    return recorded_spec(req.annotations.get(ATTEMPT_CONFIG_ANNOTATION), finishing=finishing)


def made_under(
    req: AttemptRecord, config: AtomicProvisioningSpec | None
) -> AtomicProvisioningSpec | None:
    """The config an attempt is finished under: the one it recorded, else `config` (the
    gang's config now). An attempt carries what it needs to finish its own rollback, so a
    config deleted, made invalid or changed since does not change how its arrivals go back;
    nor does a label check added since that refuses the record (a NodePool list 'a,b'): its
    withdrawal reclaims through the reclaimer it was made under, never the default one."""
    return recorded_config(req, finishing=True) or config


def following(req: AttemptRecord, config: AtomicProvisioningSpec | None) -> AtomicProvisioningSpec:
    """The config an attempt in flight follows, the one rule for every gang source (a
    Workload, a slice, a PodGroup's gang and its growth): the gang's config now (`config`), so
    its deadlines (`deadlineSeconds`, `startDeadlineSeconds`), lengthened or shortened since,
    apply to it; without one (deleted, made invalid), the one it was made under (`made_under`);
    else the defaults. What it asked (pod sets, capacity sources and their pins, fit mode,
    race, reclaimer) is always read from the config it was made under (`Attempt.made`)."""
    return config or made_under(req, None) or AtomicProvisioningSpec()


def asked(backend: CapacityBackend, attempt: str) -> Event:
    """The Event saying capacity was asked for, in the backend's words."""
    return Event(f"{backend.kind}Created", f"Created {backend.kind} {attempt!r}")


def release_hold(capacity: ClusterView | None, req: AttemptRecord) -> tuple[Action, ...]:
    """Lift the hold from the nodes recorded for this request that still carry one: its gang
    has started, or its rollback is done (what was not reclaimed is no longer the gang's);
    and the scale-down guard gangcheck set on them while they were kept (scaledown.py).
    Every node recorded under its name, of any age (`arrived_for` with no time): one an
    earlier request of the name left held (an ask deleted by hand and asked again under its
    name, whose holds flow.in_order leaves for the new one to lift) is held by nothing else."""
    nodes = capacity.nodes if capacity else ()
    arrived = arrived_for(nodes, request_key(req), None)
    held = held_nodes(nodes, [n["metadata"]["name"] for n in arrived])
    return (*((ReleaseHold(held),) if held else ()), *scaledown.unguard(arrived, request_key(req)))


def release_holds_of_gone(
    capacity: ClusterView | None, namespace: str, names: Collection[str]
) -> tuple[tuple[Action, ...], tuple[Event, ...]]:
    """The hold lifted from the nodes recorded for each of the gang's requests `names` that
    is gone, deleted outside gangcheck (the one a Ready gang was given capacity by; a racer
    the race went on without): no record is left whose end (Started, a rollback, the gang's
    end) would lift it, so the nodes would stay closed to every pod but the gang's for ever;
    and the scale-down guard set on them while they were kept for a top-up (scaledown.py),
    which would keep them from the autoscaler's scale-down for ever. Applied only once the
    API server confirms the request is gone (`ReleaseHold.gone`, first: the guard goes after
    it); each with the Warning Event saying so. One pass over the nodes."""
    if not names:  # the usual case: no pass over the nodes
        return (), ()
    keys = {f"{namespace}/{name}": name for name in names}
    held: dict[str, list[str]] = {}
    guarded: dict[str, list[Obj]] = {}
    for node in capacity.nodes if capacity else ():
        name = keys.get(claim_of(node))
        if name is None:
            continue
        if is_held(node):
            held.setdefault(name, []).append(str(node["metadata"]["name"]))
        if scaledown.guarded_for(node) == f"{namespace}/{name}":
            guarded.setdefault(name, []).append(node)
    actions: list[Action] = []
    events = []
    for name in sorted({*held, *guarded}):
        nodes = sorted(held.get(name, ()))
        actions.append(ReleaseHold(tuple(nodes), gone=name))
        actions += scaledown.unguard(guarded.get(name, ()), f"{namespace}/{name}")
        if not nodes:
            continue  # only the guard: lifted quietly, as with any hold released
        listed = ", ".join(nodes)
        message = (
            f"provisioning request {name}, whose capacity was the gang's, is gone (deleted "
            f"outside gangcheck): the hold is lifted from {listed}, which no request holds for "
            "the gang any more"
        )
        events.append(Event("HoldLifted", message, warning=True))
    return tuple(actions), tuple(events)


def clean_up(
    requests: Sequence[AttemptRecord],
    *,
    capacity: ClusterView | None,
    config: AtomicProvisioningSpec | None,
    backend: CapacityBackend,
    why: str,
    gone: bool = False,
) -> tuple[Action, ...]:
    """Withdraw every attempt of a gang, after reclaiming what arrived for an unfinished one
    (`abandon`; a fulfilled one's too when the gang is `gone`) and lifting the hold from what
    stays."""
    return tuple(
        action
        for r in requests
        if not r.deleting
        for action in (
            *abandon(r, capacity, config, why, gone=gone),
            *release_hold(capacity, r),
            *backend.withdraw(r, why),
        )
    )


def reclaiming(actions: Sequence[Action], why: str) -> tuple[Event, ...]:
    """The Events saying, for each attempt withdrawn with arrivals to reclaim (`clean_up`),
    which nodes are reclaimed and why: a gang withdrawn mid-attempt (evicted, deleted) says
    what became of what arrived for it."""
    return tuple(
        Event(
            "ReclaimingArrivals",
            f"Withdrawing {a.request} ({why}): reclaiming safely the {len(a.nodes)} node(s) "
            f"that arrived for it: {', '.join(a.nodes)}",
        )
        for a in actions
        if isinstance(a, ReclaimArrivals) and a.nodes
    )


def abandon(
    req: AttemptRecord,
    capacity: ClusterView | None,
    config: AtomicProvisioningSpec | None,
    why: str,
    *,
    now: datetime | None = None,
    gone: bool = False,
) -> tuple[Action, ...]:
    """The attempt is withdrawn: reclaim what arrived for it (rollback.abandon; `gone`: the
    gang is deleted),
    with the arrivals it had not recorded yet recorded first, by the rules of a rollback
    (`unrecorded_arrivals`): in fit mode, for a request still waiting (Provisioned, open),
    whose pod templates say which arrivals could be its. The config is the one the attempt
    was made under (`made_under`); without any, nothing more than what it recorded is
    reclaimed."""
    config = made_under(req, config)
    if rollback.kept_open(req):  # its promise closed: what came since its last reclaim
        return reclaim_promised(req, capacity, config, now=now)
    also = _unrecorded_when_abandoned(req, capacity, config, now)
    return rollback.abandon(req, capacity, rollback.reclaimer_of(config), why, also=also, gone=gone)


@dataclass(frozen=True)
class Promise:
    """Whether the source of an attempt whose gang is gone may still deliver for it
    (`promise`): until when, and why (or why not), in words."""

    until: datetime | None
    """The attempt's deadline while the promise is open; None: closed."""
    why: str

    @property
    def open(self) -> bool:
        return self.until is not None


#: Classes whose Provisioned=True is not a promise that outlives the request: gangcheck's
#: Karpenter provisioner takes a deleted request's nodes back (its NodeClaims go with it);
#: check-capacity scales nothing up.
NO_PROMISE_CLASSES = frozenset({KARPENTER_CLASS, CHECK_CAPACITY})


def promise(
    req: AttemptRecord, status: AttemptStatus, class_name: str, now: datetime, *, came: int = 0
) -> Promise:
    """Whether the attempt of a gang that is gone (its Workload or PodGroup deleted: the
    orphan sweep, never an eviction or a rollback) is kept open rather than withdrawn now.

    cluster-autoscaler's Provisioned=True (best-effort-atomic) says the scale-up is
    committed, and deleting the request does not take it back: a node may register after
    the withdrawal, and none would be recorded for a request that no longer exists. So
    while the source said Provisioned, nothing ended it (Failed, CapacityRevoked,
    BookingExpired), the attempt was not fulfilled, started, kept or rolling back, and its
    deadline (`rollback.deadline_of`) has not passed, the request is kept: what arrives is
    recorded for it and reclaimed (`reclaim_promised`), the arrival ledger reading its pod
    templates (owned by nothing: they outlive the gang). Everything else read is on the
    request (class, conditions, annotations) and its nodes: the same across a restart.

    It closes early once everything asked for came: `came` (`came_for`: the nodes recorded
    for it now or settled by its reclaims) at least the members it asked. A source makes no
    more nodes for a request than the pods it asks for (cluster-autoscaler sizes a scale-up
    by packing them, each new node holding one at least), so one that made that many has
    made all it will. A gang whose members share nodes keeps the promise open until its
    deadline: the nodes reclaimed are gone, and with them whether they would have held it
    whole."""
    if class_name in NO_PROMISE_CLASSES:
        return Promise(None, f"class {class_name}: deleting the request ends what it asked")
    if req.deleting:
        return Promise(None, "being deleted")
    if status.has_ended:
        return Promise(None, f"{status.phase()}: nothing more comes for it")
    if not status.has(Phase.PROVISIONED):
        return Promise(None, "not provisioned: deleting the request ends the scale-up")
    record = rollback.record_of(req)
    if record.phase is not AttemptPhase.ASKED:
        return Promise(None, f"{record.phase.value}: claims no new node")
    if record.deadline is None:
        return Promise(None, "no deadline recorded")
    if now >= record.deadline:
        return Promise(None, f"its deadline {format_time(record.deadline)} passed")
    asked = sum(p.count for p in req.pod_sets)
    if asked and came >= asked:
        return Promise(None, f"everything asked for came ({came} node(s) for {asked} member(s))")
    until = format_time(record.deadline)
    return Promise(record.deadline, f"provisioned: what its source delivers until {until}")


def mark_gone(req: AttemptRecord, now: datetime) -> tuple[Action, ...]:
    """The record that an attempt is kept open for a gang that is gone (`promise`): from
    then on its gang claims last (`Waiting.gone`). Written once."""
    if GANG_GONE_ANNOTATION in req.annotations:
        return ()
    return (AnnotateRequest(req.name, {GANG_GONE_ANNOTATION: format_time(now)}),)


def came_for(req: AttemptRecord, capacity: ClusterView | None) -> int:
    """How many nodes came for an attempt, as far as is known: those recorded for it now,
    and those its reclaims settled (reclaimed, draining or kept; the outcome on a request
    kept open holds every reclaim's: `rollback.reclaim_late`)."""
    outcome = rollback.record_of(req).outcome
    settled = outcome.settled if outcome is not None else frozenset()
    nodes = capacity.nodes if capacity is not None else ()
    recorded = {
        n["metadata"]["name"] for n in arrived_for(nodes, request_key(req), req.creation_timestamp)
    }
    return len(settled | recorded)


def until_closed(promise: Promise, now: datetime) -> float:
    """Seconds until an open promise closes (its deadline): when to look again at the
    latest; arrivals wake the sweep before (a node recorded for the request, or any node
    change while it is open)."""
    left = (promise.until - now).total_seconds() if promise.until else 0.0
    return max(ROLLBACK_REQUEUE_SECONDS, left)


def reclaim_promised(
    req: AttemptRecord,
    capacity: ClusterView | None,
    config: AtomicProvisioningSpec | None,
    *,
    now: datetime | None = None,
) -> tuple[Action, ...]:
    """One pass over an attempt kept open for its promise (`promise`): the arrivals it had
    not recorded are recorded for it by the rules of `abandon` (in fit mode, from its pod
    templates while they exist), except one another waiting request could have been made
    for (the gone gang claims last: that node is the live gang's to record, never one to
    delete), then every node recorded for it that its reclaims did not settle is reclaimed
    (`rollback.reclaim_late`). No rollback is recorded: the request stays open,
    so what its source still delivers is recorded for it, and reclaimed by the next pass."""
    config = made_under(req, config)
    also = tuple(
        (name, rv)
        for name, rv in _unrecorded_when_abandoned(req, capacity, config, now)
        if not _wanted_elsewhere(capacity, req, name)
    )
    return rollback.reclaim_late(req, capacity, rollback.reclaimer_of(config), also=also)


def _wanted_elsewhere(capacity: ClusterView | None, req: AttemptRecord, name: str) -> bool:
    """Whether another waiting request of a live gang could have been made for the node
    `name` (one kept for a gang that is gone, as this one, is not: `Waiting.gone`)."""
    if capacity is None:
        return False
    found = next((n for n in capacity.nodes if n["metadata"]["name"] == name), None)
    if found is None:
        return False
    view, key = capacity.view(found), request_key(req)
    for other in capacity.waiting:
        if other.key == key or other.gone:
            continue  # another gang gone claims last too: one of them records it
        for template in other.templates:
            try:
                if could_be_made_for(member_from_template(template), view):
                    return True
            except QuantityError:
                return True  # unreadable: it might have been
    return False


def clean_up_waits(
    requests: Sequence[AttemptRecord],
    capacity: ClusterView | None,
    config: AtomicProvisioningSpec | None,
) -> bool:
    """Whether withdrawing these attempts (`clean_up`, the orphan sweep) must wait until the
    node cache has caught up: one of them would record the arrivals it had passed over
    (`abandon`), and a node that registered while the node watch was down would be missed,
    as `start_rollback` waits for the same reason."""
    return (
        capacity is not None
        and not capacity.nodes_current
        and any(
            not r.deleting and _waiting_templates(r, capacity, made_under(r, config))
            for r in requests
        )
    )


def _waiting_templates(
    req: AttemptRecord, capacity: ClusterView | None, config: AtomicProvisioningSpec | None
) -> tuple[Obj, ...]:
    """The pod templates of this attempt when abandoning it records its passed-over
    arrivals: in fit mode, for a request still waiting; else none."""
    if capacity is None or config is None or config.fulfillment.mode is not FulfillmentMode.FIT:
        return ()
    key = request_key(req)
    waiting = next((w for w in capacity.waiting if w.key == key), None)
    return waiting.templates if waiting is not None else ()


def _unrecorded_when_abandoned(
    req: AttemptRecord,
    capacity: ClusterView | None,
    config: AtomicProvisioningSpec | None,
    now: datetime | None,
) -> tuple[tuple[str, str], ...]:
    templates = _waiting_templates(req, capacity, config)
    if capacity is None or not templates:
        return ()
    pod_sets = tuple((str(i), 1, t) for i, t in enumerate(templates))
    gang = GangSpec(pod_sets, namespace=req.ref.namespace)
    return unrecorded_arrivals(capacity, req, gang, now)


def superseded(
    requests: Sequence[AttemptRecord],
    current: str,
    *,
    capacity: ClusterView | None,
    backend: CapacityBackend,
    why: str,
) -> tuple[Action, ...]:
    """Withdraw the attempts other than `current`, lifting the hold from what they kept."""
    return tuple(
        action
        for r in requests
        if r.name != current and not r.deleting
        for action in (*release_hold(capacity, r), *backend.withdraw(r, why))
    )


def until_deadline(req: AttemptRecord, now: datetime) -> float:
    """When to look again at an attempt in flight: by its deadline, at most every 5 s."""
    deadline = rollback.deadline_of(req)
    left = (deadline - now).total_seconds() if deadline else LOOK_AGAIN_SECONDS
    return max(ROLLBACK_REQUEUE_SECONDS, min(LOOK_AGAIN_SECONDS, left))
