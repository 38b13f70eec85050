"""The PodGroup provisioner's one decision: (group, members, requests, config, clock) -> what to do.

A gang declared by a PodGroup (no Kueue) is held back by gangcheck's scheduling gate, which
the webhook puts on every member pod at creation. Once ``minCount`` members exist and no
member has been created for ``SETTLE_SECONDS``, the members are read: that is the gang of the
attempt (``minCount`` is the least the gang may be, as upstream: the pods that must be
schedulable together). Their scheduling requirements become one ProvisioningRequest
(identical requirements grouped into one pod set), which records how many members it was
made for; the fit demands exactly those members (the oldest, by creation), and when they fit
on nodes that exist they are annotated to consume the request and their gates are lifted
together. Past the deadline the attempt is rolled back like a Workload's (lifecycle.py)
and retried with backoff.

Members created after the gang was read are late: they are no part of its request.
kube-scheduler starts a PodGroup only when none of its members is gated, so late members are
released with the gang, and any member gated while the released gang is not yet bound is
released at once (pinned to its domain, without the hold's toleration: they use no capacity
asked for the gang). Once the released gang is bound, each late member is released (oldest
first) when it fits on nodes that exist and no other gang's request holds; until then it
stays gated, the reason on the group. Upstream gang scheduling likewise admits pods beyond
``minCount`` one by one.

A released gang whose members are not all bound within ``startDeadlineSeconds`` of the release
(the start watchdog) is rolled back like any attempt: what arrived for it and runs nothing is
reclaimed. Its members' gates are lifted by then, so they cannot be held for a new attempt:
the group gives up, saying so.

``decide`` is pure. The state that must survive a restart lives on the API objects: the
attempt number, the time of the next attempt and the state shown to people as annotations on
the PodGroup; everything about one attempt on its request.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cache, partial

from gangcheck.logic.attempt import driver, flow, lifecycle, naming, places, race, rollback, topup
from gangcheck.logic.attempt.actions import (
    Action,
    AnnotateRequest,
    Event,
    ReleaseMembers,
)
from gangcheck.logic.attempt.backend import Ask, AskedPodSet, CapacityBackend
from gangcheck.logic.attempt.demand import limits_as_missing_requests, scheduling_requirements
from gangcheck.logic.attempt.fulfillment import (
    ClusterView,
    GangSpec,
    capacity_used,
    fits_now,
    request_key,
    reservations_of,
    reserved_split,
)
from gangcheck.logic.attempt.hold import hold_toleration
from gangcheck.logic.attempt.lifecycle import Progress
from gangcheck.logic.attempt.records import AttemptPhase, RollbackCause, count_of
from gangcheck.logic.podgroups.gating import gated_at, released_by, ungated_cause
from gangcheck.logic.sources.provreq import PROVISIONING_REQUEST
from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.model.names import (
    ATTEMPT_ANNOTATION,
    CLASS_ANNOTATION,
    CONFIG_ANNOTATION,
    CONSUME_ANNOTATION,
    DOMAIN_ANNOTATION,
    GANG_MEMBERS_ANNOTATION,
    GATE,
    GROUP_ANNOTATION,
    GROUP_UID_ANNOTATION,
    MESSAGE_ANNOTATION,
    NEXT_ATTEMPT_ANNOTATION,
    PHASE_ANNOTATION,
    RACE_WON_ANNOTATION,
    RELEASED_AT_ANNOTATION,
    RELEASED_BY_ANNOTATION,
    REQUEST_ANNOTATION,
    STARTED,
    STATE_ANNOTATION,
    UNGATED_ANNOTATION,
)
from gangcheck.model.objects import Obj, Pod, ProvisioningRequest, labels_of
from gangcheck.model.podgroups import PodGroup
from gangcheck.model.provisioning_config import AtomicProvisioningSpec

SETTLE_SECONDS = 2.0
"""Members are read once the newest is this old by its creationTimestamp (1 s resolution, so
at least 1 s of quiet): a burst of members created together is one gang, not minCount."""
LATE_RETRY_SECONDS = 15.0
"""How often late members that do not fit yet are fitted again (node changes also wake us)."""

WAITING, PROVISIONING, RELEASED = "WaitingForMembers", "Provisioning", "Released"
BACKING_OFF, BLOCKED, FAILED, NOT_A_GANG = "BackingOff", "Blocked", "Failed", "NotAGang"
GAVE_UP = "GaveUp"
"""Terminal: every attempt rolled back. Members stay gated; removing the state annotation
(``kubectl annotate podgroup NAME gangcheck.io/state-``) starts over."""
MAX_MESSAGE = 1024


@dataclass(frozen=True)
class GroupSnapshot:
    group: PodGroup
    members: tuple[Pod, ...]
    """Pods in the group's namespace that name it."""
    config: AtomicProvisioningSpec | None
    config_problem: str = ""
    requests: tuple[ProvisioningRequest, ...] = ()
    templates: frozenset[str] = frozenset()
    """Names of the PodTemplates made for the group's attempts that exist."""
    capacity: ClusterView | None = None
    max_members: int = 5000
    """The most members one request may carry (a setting)."""
    backend: CapacityBackend = PROVISIONING_REQUEST
    opted_in: bool = False
    """The namespace carries the webhook's opt-in label: its members should all be gated."""


@dataclass(frozen=True)
class GroupDecision(flow.Decided):
    """The group's annotations to write, and what every gang source's decision carries
    (flow.Decided; a diagnosis, logic/podgroups/group_diagnosis.py, replays it)."""

    status: Mapping[str, str] | None = None
    """Annotations to write on the PodGroup (None: nothing changed); "" deletes one."""


@dataclass(frozen=True)
class _Members:
    live: tuple[Pod, ...]
    gated: tuple[Pod, ...]
    unbound: tuple[Pod, ...]
    newly_ungated: tuple[Pod, ...]


def decide(snap: GroupSnapshot, now: datetime) -> GroupDecision:
    """Everything the provisioner does for one PodGroup."""
    group = snap.group
    members = _members(snap)
    noticed = _notice_ungated(snap, members)
    if group.deleting:
        return _withdraw_attempts(snap, "PodGroup deleted")
    state = group.annotations.get(STATE_ANNOTATION, "")
    if not members.gated and not snap.requests and state in ("", RELEASED, NOT_A_GANG):
        return _with(noticed, _after_release(snap, members) if state == RELEASED else None)
    decision = _decide(snap, members, state, now)
    return _with(noticed, decision)


def _decide(snap: GroupSnapshot, members: _Members, state: str, now: datetime) -> GroupDecision:
    group = snap.group
    if state == RELEASED:
        return _released(snap, members, now)
    if state == GAVE_UP:
        return _withdraw_attempts(snap, "the PodGroup gave up")
    if group.problem:
        return _status(snap, FAILED, group.problem, warn="InvalidPodGroup")
    if not group.is_gang:
        why = "not a gang (no gang policy): its members are released as they come"
        released = _release(snap, members.gated, None, {}, why, state=NOT_A_GANG)
        if not snap.requests:
            return released
        # no longer a gang mid-attempt (coscheduling's minMember removed): nothing will
        # consume its requests, so they are withdrawn, what arrived reclaimed safely
        return _with(released, _withdraw_attempts(snap, "the PodGroup is no longer a gang"))
    if snap.config is None:
        return _without_config(snap, members, now)
    if group.min_count > snap.max_members:
        message = (
            f"minCount {group.min_count} exceeds the {snap.max_members} members one "
            "ProvisioningRequest may carry here (setting podGroups.maxMembers)"
        )
        return _status(snap, FAILED, message, warn="GangTooLarge")
    if len(members.live) < group.min_count:
        message = f"waiting for members: {len(members.live)} of {group.min_count} exist"
        return replace(_status(snap, WAITING, message), actions=_stale(snap, ""))
    return _attempt(snap, members, now)


def _without_config(snap: GroupSnapshot, members: _Members, now: datetime) -> GroupDecision:
    """No valid config (deleted, or made invalid): nothing new is asked for; the attempt in
    flight goes on, and is rolled back if it must be, under the config it was made with
    (recorded on its request). Without one the group is Blocked, its request kept as it is.
    With fewer members than minCount left, the attempt is withdrawn and the hold lifted from
    what arrived for it, as for a group with its config waiting for members: kept, it would
    hold those nodes for a gang that cannot start for as long as the config is missing."""
    name, _ = _current(snap)
    req = next((r for r in snap.requests if r.name == name), None)
    recorded = lifecycle.recorded_config(req) if req is not None and not req.deleting else None
    if recorded is None:
        return _status(snap, BLOCKED, snap.config_problem, warn="ConfigProblem")
    if len(members.live) < snap.group.min_count:
        blocked = _status(snap, BLOCKED, snap.config_problem, warn="ConfigProblem")
        return replace(blocked, actions=_stale(replace(snap, config=recorded), ""))
    return _attempt(replace(snap, config=recorded, config_problem=""), members, now)


def _current(snap: GroupSnapshot) -> tuple[str, int]:
    """The request of the attempt in flight: its name, and which ask of the attempt it is."""
    group = snap.group
    return flow.current(snap.requests, group.ref.name, group.short, attempt_of(group))


def _attempt(snap: GroupSnapshot, members: _Members, now: datetime) -> GroupDecision:
    assert snap.config is not None
    if race.is_race(_asks(snap), snap.config):
        return _race(snap, members, now)
    gang = _gang(snap, members, now)

    def first(name: str) -> GroupDecision:
        return _backing_off(snap, now) or _settling(members, now) or _new_attempt(snap, gang, name)

    return flow.in_order(
        gang,
        first=first,
        in_flight=lambda req: _in_flight(gang, snap, members, req, now),
        why=f"superseded by {gang.current()[0]}",
    )


def _gang(snap: GroupSnapshot, members: _Members, now: datetime) -> flow.Gang[GroupDecision]:
    """The group's gang as the attempt flow (flow.py) reads it: its unbound members, each ask
    made by `_first` (released at once where they fit); an attempt that ends backs off to the
    next (or gives up)."""
    assert snap.config is not None
    config = snap.config
    group = snap.group
    whole = cache(lambda: gang_of(snap, members))  # read once, when first needed

    def ended(req: ProvisioningRequest, why: str) -> GroupDecision:
        done = rollback.RolledBack(why, f"rolled back {req.name} ({why})")
        step = lifecycle.Step(Progress.ROLLED_BACK, why, verdict=done)
        return _rolled_back(snap, step, done, now)

    return flow.Gang(
        kind=GroupDecision,
        held=snap,
        owner=group.ref.name,
        namespace=group.ref.namespace,
        short=group.short,
        attempt=attempt_of(group),
        gang_of=lambda index: _pinned(whole(), _source_labels(config, index)),
        pinned=lambda labels: _pinned(whole(), labels),
        create=lambda name, new: _first(snap, members, whole(), name, new, now=now),
        ended=ended,
        now=now,
        say=partial(_say, snap),
    )


def _say(snap: GroupSnapshot, message: str, event: Event) -> GroupDecision:
    """The group's state as it stands (Provisioning when it has none), its message this one;
    `event` once, when that changes what it says."""
    state = snap.group.annotations.get(STATE_ANNOTATION) or PROVISIONING
    said = _status(snap, state, message)
    return replace(said, events=(event,)) if said.status is not None else said


def _settling(members: _Members, now: datetime) -> GroupDecision | None:
    """Members still arriving: read them once the newest is SETTLE_SECONDS old."""
    born = [t for t in (parse_time(p.created) for p in members.unbound) if t is not None]
    if not born:
        return None
    left = SETTLE_SECONDS - (now - max(born)).total_seconds()
    return GroupDecision(requeue_after=max(0.2, left)) if left > 0 else None


def _new_attempt(snap: GroupSnapshot, gang: flow.Gang[GroupDecision], name: str) -> GroupDecision:
    too_large = _too_large(snap, gang.whole())
    if too_large is not None:
        return too_large
    return flow.first_ask(gang, name)


def _too_large(snap: GroupSnapshot, gang: GangSpec) -> GroupDecision | None:
    if not driver.too_many_pod_sets(len(gang.pod_sets)):
        return None
    message = (
        f"the members have {len(gang.pod_sets)} distinct scheduling requirements; one "
        f"ProvisioningRequest carries at most {driver.MAX_REQUEST_POD_SETS} pod sets"
    )
    return _status(snap, FAILED, message, warn="GangTooLarge")


def _first(
    snap: GroupSnapshot,
    members: _Members,
    gang: GangSpec,
    name: str,
    new: flow.NewAsk,
    *,
    now: datetime,
) -> GroupDecision:
    """No request yet: release at once if the gang fits on free nodes (of the capacity source
    of the new ask's place, in any one domain), else ask there for capacity, scoped to its
    topology domain, the message beginning with what the ask says (why an earlier place was
    left); with kept requests (topup.py) only the members their nodes cannot hold are asked."""
    assert snap.config is not None
    place, said = new.place, new.said
    source = place.source
    whole = gang
    gang = _pinned(gang, _source_labels(snap.config, source))
    reservations = reservations_of(snap.config)
    split = reserved_split(snap.capacity, gang, reservations) if reservations else None
    reserved = split.reserved_members if split else 0
    here = fits_now(snap.capacity, gang)
    new = flow.with_split(new, snap, lambda labels: _pinned(whole, labels))
    if new.kept_split is not None:  # the kept nodes' members stay there: only the rest is asked
        on = new.kept_split.remainder
        gang = replace(
            gang, pod_sets=tuple((ps, on[ps], tpl) for ps, _, tpl in gang.pod_sets if ps in on)
        )
    elif here.fits:
        message = f"{said}the whole gang fits on nodes that exist: {here.summary}"
        domains = {**here.domains, **_source_domain(snap.config, source)}
        released = _release(snap, members.unbound, None, domains, message, now=now)
        used = {"reserved": reserved, "existing": here.total - reserved}
        return replace(released, capacity_used={k: v for k, v in used.items() if v})
    if split is not None:
        gang = replace(
            gang,
            pod_sets=tuple(
                (ps, split.remainder[ps], tpl)
                for ps, _, tpl in gang.pod_sets
                if ps in split.remainder
            ),
        )
    record = {
        **flow.record(attempt_of(snap.group), snap.config, now, new, reserved=reserved),
        GANG_MEMBERS_ANNOTATION: str(len(members.unbound)),
    }
    if config := snap.group.annotations.get(CONFIG_ANNOTATION):  # read if the group is gone
        record[CONFIG_ANNOTATION] = config
    scoped = places.pinned(gang, {}, place.domain)  # the ask, not the fit: room anywhere wins
    made = _ask(snap, scoped, name, record, source)
    write = partial(_status, snap, PROVISIONING, request=name)
    return flow.ask(snap, made, new, reserved=reserved, write=write)


def _in_flight(
    gang: flow.Gang[GroupDecision],
    snap: GroupSnapshot,
    members: _Members,
    req: ProvisioningRequest,
    now: datetime,
) -> GroupDecision:
    """The attempt in flight, for the members it was made for (late ones wait their turn)."""
    ours = attempt_members(members.unbound, req)
    followed = _followed(snap, members, req, now, following=gang.gang_of)
    assert followed.step is not None  # a group's attempt is always followed in fit mode
    req = followed.request
    decision = _outcome(snap, ours, req, followed.step, now, gated=members.gated, gang=gang)
    return flow.followed(replace(decision, step=followed.step), followed, req.name)


def _followed(
    snap: GroupSnapshot,
    members: _Members,
    req: ProvisioningRequest,
    now: datetime,
    *,
    racing: bool | None = None,
    following: places.GangOf | None = None,
) -> driver.InFlight:
    """The attempt of `req` as the driver follows it, for the members it was made for, with
    the place next in line (InOrder: `following`, the gang as each source is asked for it);
    `racing`: a racer, with another racer or source left (a racer whose source says
    CapacityIsNotFound then ends at once) or not."""
    assert snap.config is not None
    ours = attempt_members(members.unbound, req)
    config = snap.config  # applied to the attempt in flight as to a Workload's
    place = places.of_request(req)
    index = place.source
    asked = lifecycle.asked_source(req, config)  # the source it was made with, not index's now
    gang = _pinned(gang_from_pods(snap.group, ours), asked.node_selector)
    capacity = snap.capacity
    kept = topup.kept_for(snap.requests, req)
    if kept:  # topping kept arrivals up: the gang on their nodes and its own
        labels = topup.shared_labels(config, req, kept)
        gang = topup.tolerating(_pinned(gang_from_pods(snap.group, ours), labels), kept)
        capacity = topup.view(snap.capacity, kept)
    if following is not None:
        fallback = driver.next_in_line(config, place, following, snap.capacity)
    else:
        fallback = "the race" if racing else None
    attempt = lifecycle.Attempt(
        request=req,
        status=snap.backend.status_of(req),
        gang=gang,  # in any one domain: the ask is scoped, the fit takes room where it is
        capacity=capacity,
        config=lifecycle.source_config(config, asked),
        fallback=fallback,
    )
    class_name, parameters = source_asks(config, index)
    return driver.in_flight(
        attempt, now, class_name=class_name, parameters=parameters, changed=_grown(snap.group, req)
    )


def source_asks(config: AtomicProvisioningSpec, index: int) -> tuple[str, dict[str, str]]:
    """The class and parameters capacity source `index` of `config` asks: what a group's
    ask of it carries, and what an attempt that asked it is compared with while it is
    followed (`lifecycle.source_drift`, through `driver.in_flight`)."""
    source = config.source(index)
    if source is None:
        return config.provisioning_class_name, dict(config.parameters)
    return source.class_name, dict(source.parameters)


# ---- Race ------------------------------------------------------------------------------


def _asks(snap: GroupSnapshot) -> list[race.Ask]:
    """Every request of the attempt in flight, with its number among the attempt's asks."""
    group = snap.group
    attempt = attempt_of(group)
    return race.asks(
        snap.requests, lambda k: naming.request_name(group.ref.name, group.short, attempt, k)
    )


def _race(snap: GroupSnapshot, members: _Members, now: datetime) -> GroupDecision:
    """capacitySourcePolicy Race (logic/attempt/race.py): the first `raceWidth` sources asked
    at once, each request pinned to its source's nodes; the first to deliver the whole gang
    wins (its members released onto it, consuming it and tolerating its hold) and the others
    are withdrawn, what arrived for them reclaimed as a rollback's; a racer that fails gives
    its place to the next source not asked yet; when every source failed, the next attempt
    after the backoff (or GaveUp)."""
    gang = _gang(snap, members, now)

    def start() -> GroupDecision:
        return _backing_off(snap, now) or _settling(members, now) or _start_race(snap, gang)

    def follow(asks: list[race.Ask]) -> GroupDecision:
        # asks all being deleted are waited for before: flow.race_attempt, flow.deleting
        return _follow_race(gang, snap, members, asks, now)

    return flow.race_attempt(gang, start=start, follow=follow)


def _said(decision: GroupDecision) -> str:
    return (decision.status or {}).get(MESSAGE_ANNOTATION, "")


def _start_race(snap: GroupSnapshot, gang: flow.Gang[GroupDecision]) -> GroupDecision:
    """The racers asked at once; a gang that fits on nodes of a source that exist is
    released at once instead, as with InOrder."""
    too_large = _too_large(snap, gang.whole())
    if too_large is not None:
        return too_large
    made = flow.racers(gang)
    settled = next((d for d in made if (d.status or {}).get(STATE_ANNOTATION) == RELEASED), None)
    return settled or _raced(snap, [_said(d) for d in made], made)


def _raced(
    snap: GroupSnapshot, said: Sequence[str], parts: Sequence[GroupDecision]
) -> GroupDecision:
    """The racers' decisions as one: all their actions, Events and notes; one message."""
    status = _status(snap, PROVISIONING, race.racing(said), request="")
    if snap.group.annotations.get(RACE_WON_ANNOTATION):  # a race of an earlier start
        status = replace(status, status={**(status.status or {}), RACE_WON_ANNOTATION: ""})
    # each ask's own state Event is said once, as the race's
    return flow.joined(status, parts, said=lambda e: e.reason != PROVISIONING)


def _follow_race(
    gang: flow.Gang[GroupDecision],
    snap: GroupSnapshot,
    members: _Members,
    asks: list[race.Ask],
    now: datetime,
) -> GroupDecision:
    """The race as it stands (race.follow), written on the group: released onto the winner;
    else the racers going, a new ask for each place given up (made before the racer that
    gave it up is withdrawn); else the next attempt, or GaveUp."""
    standing = flow.standing(
        gang, asks, lambda r, others: _followed(snap, members, r, now, racing=others)
    )
    if standing.won is not None:
        return _won(snap, members, standing.won, now)
    said: list[str] = []
    parts: list[GroupDecision] = []
    for g in standing.going:
        if g.message is not None:
            said.append(g.message)
        parts.append(
            GroupDecision(actions=g.actions, events=g.events, requeue_after=g.requeue_after)
        )
    for e in standing.ended:
        made = flow.replacement(gang, e)
        if made is not None:
            if (made.status or {}).get(STATE_ANNOTATION) == RELEASED:
                # room appeared on the next source's nodes: released there; the racers left
                # are withdrawn as left behind (`_released`)
                return _with(_joined(parts, standing), made)
            said.append(_said(made))
            parts.append(made)
        parts.append(GroupDecision(actions=e.actions, sources=e.notes))
    if said:
        return _raced(snap, said, parts)
    return _race_lost(snap, standing, parts, now)


def _joined(parts: Sequence[GroupDecision], standing: race.Standing) -> GroupDecision:
    """The racers' actions, Events and notes, and the ended ones withdrawn."""
    ended = [GroupDecision(actions=e.actions, sources=e.notes) for e in standing.ended]
    every = [*parts, *ended]
    return GroupDecision(
        actions=tuple(a for d in every for a in d.actions),
        events=tuple(e for d in every for e in d.events),
        sources=tuple(n for d in every for n in d.sources),
    )


def _race_lost(
    snap: GroupSnapshot, standing: race.Standing, parts: Sequence[GroupDecision], now: datetime
) -> GroupDecision:
    """Every source failed: the next attempt after the backoff, or GaveUp. As after a
    rollback, only the group's annotations are written with it (and the racers' Events and
    notes): its requests go as superseded by the next attempt, or as the group's that gave up."""
    assert snap.config is not None
    attempt = attempt_of(snap.group)
    why = race.every_source_failed(standing)
    delay = lifecycle.next_attempt(attempt, snap.config.retry_strategy)
    if delay is None:
        gave_up = _status(snap, GAVE_UP, f"gave up after attempt {attempt}: {why}")
        out = replace(gave_up, requeue_after=0.2)
    else:
        out = _next_attempt(snap, delay, why, now)
    return replace(
        out,
        events=(*out.events, *(e for d in parts for e in d.events)),
        sources=tuple(n for d in parts for n in d.sources),
    )


def _won(snap: GroupSnapshot, members: _Members, won: race.Won, now: datetime) -> GroupDecision:
    """The first racer to deliver the whole gang: its members released onto it (consuming it,
    tolerating its hold, pinned to its source's nodes), the group recording the source that
    won; the others withdrawn, what arrived for them reclaimed by the safe path of a
    rollback (race.won)."""
    assert snap.config is not None
    followed = won.followed
    assert followed.step is not None
    req = followed.request
    ours = attempt_members(members.unbound, req)
    out = flow.won(_outcome(snap, ours, req, followed.step, now, gated=members.gated), won)
    source = lifecycle.asked_source(req, snap.config).name  # as it asked, not its index now
    return replace(
        out,
        status={**(out.status or {}), RACE_WON_ANNOTATION: source},
        requeue_after=won.withdrawal.requeue_after,
        step=followed.step,
    )


def _left_behind(snap: GroupSnapshot, consumed: str) -> GroupDecision | None:
    """A released group's racers other than the one it consumes, not withdrawn yet (the node
    cache was behind when the race was won): withdrawn, their arrivals reclaimed. Only for
    an attempt made under Race (`race.is_race`; InOrder withdraws a source it leaves as it
    leaves it)."""
    asks = _asks(snap)
    if not race.is_race(asks, snap.config):
        return None
    losers = race.left_behind(asks, consumed)
    if not losers:
        return None
    gone = race.withdraw_losers(
        losers, capacity=snap.capacity, config=snap.config, backend=snap.backend
    )
    if not gone.actions and gone.requeue_after is None:
        return None
    return flow.decided(GroupDecision, gone)


def _outcome(
    snap: GroupSnapshot,
    ours: Sequence[Pod],
    req: ProvisioningRequest,
    step: lifecycle.Step,
    now: datetime,
    *,
    gated: Sequence[Pod] = (),
    gang: flow.Gang[GroupDecision] | None = None,
) -> GroupDecision:
    """Where the attempt stands, written on the group (and, when it fits, its members);
    `gang`: the attempt's (flow.py), for the next place when this one could not deliver, or
    to top what arrived up from it (None: neither)."""
    if step.progress is Progress.ROLLED_BACK:
        assert step.verdict is not None
        fell_back = _fall_back(gang, req, step) if gang is not None else None
        # the attempt ends: what was kept for it goes back first, by its own record
        going_back = flow.outstanding(GroupDecision, snap, req, step.verdict.message)
        if fell_back is None and going_back is not None:
            return going_back
        ended = fell_back or _rolled_back(snap, step, step.verdict, now)
        failed = driver.failed_note(snap.config, req, step.verdict.reason)
        return replace(ended, sources=(*failed, *ended.sources))
    if step.progress is Progress.ROLLING_BACK:
        # InOrder tops up instead of throwing away, as a Workload's check does (flow.keep)
        keeps = gang is not None and snap.backend is PROVISIONING_REQUEST
        keeping = flow.keep(gang, req, step) if keeps and gang is not None else None
        return keeping or flow.rolling(GroupDecision, step)
    if step.progress is Progress.FITS:
        released = _release(snap, ours, req, step.domains, step.message, now=now)
        chosen = {p.name for p in ours}
        late = _release_with_gang(
            tuple(p for p in gated if p.name not in chosen), dict(step.domains.values())
        )
        kept = topup.kept_for(snap.requests, req)
        fulfilled = (a for r in (*kept, req) for a in lifecycle.fulfilled(r))
        return replace(
            released,
            actions=(*step.actions, *released.actions, *late.actions, *fulfilled),
            events=(*released.events, *late.events),
            capacity_used=capacity_used(req),
            sources=driver.delivered_note(snap.config, req, now),
        )
    return replace(
        _status(snap, PROVISIONING, step.message, request=req.name),
        actions=step.actions,
        requeue_after=step.requeue_after,
    )


def _fall_back(
    gang: flow.Gang[GroupDecision], req: ProvisioningRequest, step: lifecycle.Step
) -> GroupDecision | None:
    """The place of this attempt could not deliver: the next asked in the same attempt
    (flow.fall_back, as a Workload's check does), the new request made before the old one
    goes; None when no place is next or the rollback is not one a next place answers."""
    assert step.verdict is not None
    if not driver.falls_back(step.verdict):
        return None
    return flow.fall_back(gang, req, step.verdict.message, before=step.events)


def _rolled_back(
    snap: GroupSnapshot, step: lifecycle.Step, done: rollback.RolledBack, now: datetime
) -> GroupDecision:
    """The rollback is done: schedule the next attempt (or give up).

    Only the group's annotations are written here: the next attempt's number is on the group
    before the rolled-back request goes, which it then does as superseded (and on giving up,
    as a group that gave up); a restart in between finds one or the other, never a gap in
    which the same attempt would be made again."""
    assert snap.config is not None
    attempt = attempt_of(snap.group)
    delay = lifecycle.next_attempt(attempt, snap.config.retry_strategy)
    if done.cause is RollbackCause.CONFIG_CHANGED:
        delay = 0  # the next attempt, under the new config, at once (as a Workload's)
    if done.revoked or delay is None:
        failed = _status(snap, GAVE_UP, f"gave up after attempt {attempt}: {done.message}")
        return replace(failed, events=(*failed.events, *step.events), requeue_after=0.2)
    return replace(_next_attempt(snap, delay, done.message, now), events=step.events)


def _next_attempt(snap: GroupSnapshot, delay: int, why: str, now: datetime) -> GroupDecision:
    """The attempt ended: the next one's number and time on the group, before its request
    goes (as superseded)."""
    attempt = attempt_of(snap.group)
    at = format_time(now + timedelta(seconds=delay))
    message = f"attempt {attempt + 1} at {at}: {why}"
    status = {
        **_status_annotations(BACKING_OFF, message),
        ATTEMPT_ANNOTATION: str(attempt + 1),
        NEXT_ATTEMPT_ANNOTATION: at,
        REQUEST_ANNOTATION: "",
    }
    return GroupDecision(status=status, requeue_after=0.2)


def _backing_off(snap: GroupSnapshot, now: datetime) -> GroupDecision | None:
    at = parse_time(snap.group.annotations.get(NEXT_ATTEMPT_ANNOTATION, ""))
    if at is None or now >= at:
        return None
    return GroupDecision(requeue_after=max(0.2, (at - now).total_seconds()))


# ---- release ---------------------------------------------------------------------------


def _release(
    snap: GroupSnapshot,
    gang: Sequence[Pod],
    req: ProvisioningRequest | None,
    domains: Mapping[str, tuple[str, str]],
    message: str,
    *,
    state: str = RELEASED,
    now: datetime | None = None,
) -> GroupDecision:
    """Lift the gang's gates together: annotated to consume the request, pinned to the
    domain. The group records how many were released together."""
    annotations = {CONSUME_ANNOTATION: req.name, CLASS_ANNOTATION: req.class_name} if req else {}
    pinned: dict[str, tuple[str, str]] = {}
    if snap.config is not None and req is not None:  # the source it asked, as it asked it
        labels = lifecycle.asked_source(req, snap.config).node_selector
        pinned = {f"source:{k}": (k, v) for k, v in labels.items()}
    kept = topup.kept_for(snap.requests, req) if req is not None else ()
    holds = _hold_toleration(req)
    if kept and snap.config is not None and req is not None:  # on kept and new nodes
        shared = topup.shared_labels(snap.config, req, kept)
        pinned = {f"source:{k}": (k, v) for k, v in shared.items()}
        holds = (*holds, *(hold_toleration(topup.key_of(r)) for r in kept))
    pins = dict({**domains, **pinned}.values())
    actions, said = release_together(
        gang, annotations, pins, holds, reason="GangReleased", message=message
    )
    decision = _status(
        snap,
        state,
        message,
        request=req.name if req else "",
        domain=_domain_text(pins),
        gang_members=str(len(gang)) if state == RELEASED else None,
        released_at=format_time(now) if state == RELEASED and now is not None else None,
    )
    return replace(decision, actions=actions, events=(*decision.events, *said))


def loose_members(pods: Iterable[Pod]) -> tuple[Pod, ...]:
    """The members whose gate is gone though no release lifted it (removed by someone else,
    or never added) and that wait unbound, consuming no request. One a release of gangcheck's
    lifted the gate of onto room that exists (its `RELEASED_BY_ANNOTATION`) is not: it binds
    on what it was fitted to (one released by a version that did not record it cannot be
    told from one ungated by hand)."""
    return tuple(
        p
        for p in pods
        if not p.gated and not p.node_name and not p.consumes and not released_by(p.raw)
    )


def release_together(
    pods: Sequence[Pod],
    annotations: Mapping[str, str],
    pins: Mapping[str, str],
    holds: Sequence[Obj],
    *,
    reason: str,
    message: str,
) -> tuple[tuple[Action, ...], tuple[Event, ...]]:
    """Lift the gates of the gated ones of `pods` (a gang, or a growth) together, annotated
    (`annotations`: the request consumed), pinned and tolerating `holds`, said in an Event
    `reason` (GangReleased, GangGrown), each marked with it (`RELEASED_BY_ANNOTATION`). Its
    loose members (`loose_members`) are given the annotations and the tolerations with them
    (none to give: nothing asked, nothing held, they are left alone), else the room asked for
    them is held off from them; their node
    selector the API server no longer lets change (the applier drops it). The Event names
    them. One rule for a gang's release (`_release`) and a growth's (growth.py)."""
    gated = tuple(sorted(p.name for p in pods if p.gated))
    loose = tuple(sorted(p.name for p in loose_members(pods))) if annotations or holds else ()
    if not gated and not loose:
        return (), ()
    names = tuple(sorted((*gated, *loose)))
    marked = {**annotations, RELEASED_BY_ANNOTATION: reason}
    action = ReleaseMembers(names, marked, dict(pins), GATE, tuple(holds))
    also = (
        f", and gave {len(loose)} member(s) whose gate was lifted before ({', '.join(loose)}) "
        "the request and its hold's toleration"
        if loose
        else ""
    )
    text = f"Released {len(gated)} members together{also}: {message}"
    return (action,), (Event(reason, text[:MAX_MESSAGE]),)


_LATE_RELEASED = {RELEASED_BY_ANNOTATION: "LateMembersReleased"}
"""What late members released onto room that exists are given: the mark of the release
(`loose_members`), no request."""


def _release_with_gang(late: Sequence[Pod], pins: Mapping[str, str]) -> GroupDecision:
    """Release gated members that are no part of the gang's request together with it (or
    while it binds): kube-scheduler starts a PodGroup only when none of its members is gated.
    They are pinned to the gang's domain and get no toleration of its hold: they use no
    capacity asked for the gang, only room on other nodes, if any."""
    names = tuple(sorted(p.name for p in late))
    if not names:
        return GroupDecision()
    text = (
        f"Released {len(names)} member(s) created after the gang was read together with it, "
        "since kube-scheduler starts a PodGroup only when none of its members is gated (no "
        f"capacity is asked for them): {', '.join(names)}"
    )
    return GroupDecision(
        actions=(ReleaseMembers(names, dict(_LATE_RELEASED), dict(pins), GATE),),
        events=(Event("LateMembersReleased", text[:MAX_MESSAGE]),),
    )


def _released(snap: GroupSnapshot, members: _Members, now: datetime) -> GroupDecision:
    """A released gang: the start watchdog while it binds, then its late members."""
    group = snap.group
    name = group.annotations.get(REQUEST_ANNOTATION, "")
    behind = _left_behind(snap, name)
    if behind is not None:
        return behind
    req = next((r for r in snap.requests if r.name == name and not r.deleting), None)
    if req is None:
        return _with(_hold_of_gone(snap), _release_late(snap, members))
    if rollback.record_of(req).phase is AttemptPhase.STARTED:
        return _release_late(snap, members)
    config = lifecycle.following(req, snap.config)  # its start deadline: the config's now
    attempt = lifecycle.Attempt(
        request=req,
        status=snap.backend.status_of(req),
        gang=gang_from_pods(group, attempt_members(members.unbound, req)),
        capacity=snap.capacity,
        config=config,
    )
    if rollback.is_rolling_back(req):
        step = lifecycle.roll_back(attempt)
        if step.progress is Progress.ROLLED_BACK:
            assert step.verdict is not None  # what was kept goes back too, by its own record
            going_back = flow.outstanding(GroupDecision, snap, req, step.verdict.message)
            if going_back is not None:
                return going_back
            message = (
                f"gave up after attempt {attempt_of(group)}: {step.verdict.message}; its members' "
                "gates are lifted, so gangcheck cannot hold them back for a new attempt"
            )
            gave_up = _status(snap, GAVE_UP, message)
            events = (*gave_up.events, *step.events)
            return replace(gave_up, events=events, requeue_after=0.2, step=step)
        return flow.rolling(GroupDecision, step)
    late = _release_late(snap, members, now=now)
    expired = _start_deadline_passed(snap, req, members, config, now)
    if expired is None:
        return late
    if isinstance(expired, float):
        due = expired if late.requeue_after is None else min(late.requeue_after, expired)
        return replace(late, requeue_after=due)
    return flow.rolling(GroupDecision, lifecycle.start_rollback(attempt, expired, now=now))


def _start_deadline_passed(
    snap: GroupSnapshot,
    req: ProvisioningRequest,
    members: _Members,
    config: AtomicProvisioningSpec,
    now: datetime,
) -> str | float | None:
    """The start watchdog of a released gang: None when its members consuming the request
    are all bound (or its release time is not recorded), the seconds left while they bind, or
    why it must roll back."""
    released = parse_time(snap.group.annotations.get(RELEASED_AT_ANNOTATION, ""))
    mine = [p for p in members.live if p.consumes == req.name]
    return start_watch(released, mine, config.fulfillment.start_deadline_seconds, now)


def start_watch(
    released: datetime | None, mine: Sequence[Pod], limit: int, now: datetime
) -> str | float | None:
    """The start watchdog's rule, for a gang's release and a growth's (growth.py): None when
    the members released together onto a request (`mine`, consuming it) are all bound, or
    their release time is not known; the seconds left while they bind, within `limit`
    (startDeadlineSeconds) of their release; else why the attempt must roll back."""
    waiting = [p for p in mine if not p.node_name]
    if released is None or not waiting:
        return None
    left = limit - (now - released).total_seconds()
    if left > 0:
        return max(0.2, min(LATE_RETRY_SECONDS, left))
    unbound = ", ".join(sorted(p.name for p in waiting)[:5])
    return (
        f"StartDeadline: {len(mine) - len(waiting)} of {len(mine)} members released together "
        f"bound within {limit}s of their release (unbound: {unbound})"
    )


def _release_late(
    snap: GroupSnapshot, members: _Members, *, now: datetime | None = None
) -> GroupDecision:
    """Members gated after the gang was read are no part of its request: once the released
    gang is bound, each is released (oldest first) when it fits on nodes that exist and no
    other gang's request holds, pinned to the gang's domain; the rest wait, said on the group.
    A group with a required topology level whose domain is not known (`gang_domain`: its record
    gone, its members' nodes not telling one) releases none: they stay gated, why said."""
    if not members.gated:
        return _after_release(snap, members)
    reported = reported_ungated(snap.group)
    request = snap.group.annotations.get(REQUEST_ANNOTATION, "")
    binding = [
        p
        for p in members.unbound
        if not p.gated
        and p.name not in reported
        and (p.consumes == request if request else True)  # late ones released consume none
    ]
    late = tuple(sorted(members.gated, key=_age_order))
    pins, why = gang_domain(snap, binding)
    if binding and not why:  # the gang binds only once none of its members is gated
        return replace(_release_with_gang(late, pins), requeue_after=LATE_RETRY_SECONDS)
    # The gang itself is bound: its request is marked started, late members or not.
    actions: tuple[Action, ...] = ()
    if not binding:
        actions = _after_release(
            snap, replace(members, unbound=tuple(p for p in members.unbound if not p.gated))
        ).actions
    if why:  # never released unpinned, into another domain than the gang's
        return _late_held(snap, late, actions, why)
    capacity = _not_held_by_others(snap)
    fitting, summary = _fitting_prefix(snap.group, late, pins, capacity)
    events: list[Event] = []
    if fitting:
        names = tuple(sorted(p.name for p in late[:fitting]))
        actions = (*actions, ReleaseMembers(names, dict(_LATE_RELEASED), pins, GATE))
        text = f"Released {fitting} late member(s) onto nodes that exist: {', '.join(names)}"
        events.append(Event("LateMembersReleased", text[:MAX_MESSAGE]))
    waiting = late[fitting:]
    if waiting and fitting:  # what keeps the rest waiting, as the rest
        summary = fits_now(capacity, _pinned(gang_from_pods(snap.group, waiting), pins)).summary
    if not waiting:
        message = f"released; {fitting} member(s) created later released onto nodes that exist"
        return GroupDecision(
            status=_status(snap, RELEASED, message).status, actions=actions, events=tuple(events)
        )
    message = (
        f"released; {len(waiting)} member(s) created after the gang was read wait for room on "
        f"nodes that exist (no request is made for them): {summary}"
    )
    status = _status(snap, RELEASED, message)
    said = snap.group.annotations.get(MESSAGE_ANNOTATION, "")
    if status.status and said.partition(":")[0] != message.partition(":")[0]:
        # said when the members waiting change, not each time their fit is worded anew
        events.append(Event("LateMembersWaiting", message[:MAX_MESSAGE], warning=True))
    return GroupDecision(
        status=status.status,
        actions=actions,
        events=tuple(events),
        requeue_after=LATE_RETRY_SECONDS,
    )


def _late_held(
    snap: GroupSnapshot, late: Sequence[Pod], actions: tuple[Action, ...], why: str
) -> GroupDecision:
    """Late members kept gated because the gang's domain is not known: said on the group (an
    Event when the members held change), looked at again as late members are."""
    message = (
        f"released; {len(late)} member(s) created after the gang was read stay gated, not "
        f"released outside the gang's topology domain: {why}"
    )
    status = _status(snap, RELEASED, message)
    said = snap.group.annotations.get(MESSAGE_ANNOTATION, "")
    events: tuple[Event, ...] = ()
    if status.status and said.partition(":")[0] != message.partition(":")[0]:
        events = (Event("LateMembersWaiting", message[:MAX_MESSAGE], warning=True),)
    return GroupDecision(
        status=status.status, actions=actions, events=events, requeue_after=LATE_RETRY_SECONDS
    )


def gang_domain(snap: GroupSnapshot, binding: Sequence[Pod] = ()) -> tuple[dict[str, str], str]:
    """The domain late members (and a growth) are pinned to: the one recorded on the group
    (`gangcheck.io/topology-domain`); for a group with a required topology level whose record
    is gone (removed by hand), the one its running members share (`running_domain`), or, while
    the released gang still binds (`binding`, none of it on a node yet), the one its members
    were pinned to at their release (their nodeSelector). With none of these, the recorded
    pins and why the domain is not known ("" when it is)."""
    pins = _domain_of(snap.group.annotations.get(DOMAIN_ANNOTATION, ""))
    key = snap.group.topology_key
    if not key or key in pins:
        return pins, ""
    shared, why = running_domain(snap, key)
    if not shared and binding:
        shared, why = _pinned_domain(binding, key)
    if not shared:
        return pins, f"the group's record of its domain ({DOMAIN_ANNOTATION}) is gone and {why}"
    return {**pins, **shared}, ""


def running_domain(snap: GroupSnapshot, key: str) -> tuple[dict[str, str], str]:
    """The required topology level's domain the group's running members share, read from
    their nodes' labels: `({key: value}, "")`, or nothing and why (no member runs, a node of
    one is not known or lacks the label, they run in more than one domain)."""
    where = sorted({p.node_name for p in snap.members if p.live and not p.gated and p.node_name})
    labels = {
        str((n.get("metadata") or {}).get("name") or ""): labels_of(n)
        for n in (snap.capacity.nodes if snap.capacity is not None else ())
    }
    if not where:
        return {}, "none of its members runs on a node yet"
    unknown = [name for name in where if key not in labels.get(name, {})]
    if unknown:
        return {}, f"the {key!r} label of node {unknown[0]!r}, where a member runs, is not known"
    values = sorted({labels[name][key] for name in where})
    if len(values) > 1:
        return {}, f"its running members are in {len(values)} {key!r} domains: {', '.join(values)}"
    return {key: values[0]}, ""


def _pinned_domain(pods: Sequence[Pod], key: str) -> tuple[dict[str, str], str]:
    """The value of `key` the released members were pinned to (their nodeSelector), if one."""
    values = sorted(
        {str(((p.raw.get("spec") or {}).get("nodeSelector") or {}).get(key) or "") for p in pods}
    )
    if values == [""]:
        return {}, f"the members released together are not pinned to a {key!r}"
    if len(values) > 1 or "" in values:
        shown = ", ".join(v or "none" for v in values)
        return {}, f"the members released together are pinned to {len(values)} {key!r}: {shown}"
    return {key: values[0]}, ""


def _not_held_by_others(snap: GroupSnapshot) -> ClusterView:
    """The capacity, counting nodes that arrived for this group's own requests as free."""
    capacity = snap.capacity or ClusterView()
    own = {request_key(r) for r in snap.requests}
    return replace(capacity, in_flight=capacity.in_flight - own)


def _fitting_prefix(
    group: PodGroup, late: Sequence[Pod], pins: Mapping[str, str], capacity: ClusterView
) -> tuple[int, str]:
    """How many of the late members (in order) fit together, and, when not all do, the fit of
    them all (its summary counts every one that waits)."""
    low, high = 0, len(late)
    while low < high:
        middle = (low + high + 1) // 2
        if fits_now(capacity, _pinned(gang_from_pods(group, late[:middle]), pins)).fits:
            low = middle
        else:
            high = middle - 1
    if low == len(late):
        return low, ""
    return low, fits_now(capacity, _pinned(gang_from_pods(group, late), pins)).summary


def _source_labels(config: AtomicProvisioningSpec, index: int) -> Mapping[str, str]:
    source = config.source(index)
    return source.node_selector if source is not None else {}


def _source_domain(config: AtomicProvisioningSpec, index: int) -> dict[str, tuple[str, str]]:
    """The capacity source's node labels as pins of the release (one per label)."""
    return {f"source:{k}": (k, v) for k, v in _source_labels(config, index).items()}


def _pinned(gang: GangSpec, pins: Mapping[str, str]) -> GangSpec:
    """The gang restricted to the domain its released members were pinned to."""
    if not pins:
        return gang
    pod_sets = tuple(
        (
            ps,
            count,
            {
                **tpl,
                "spec": {
                    **tpl["spec"],
                    "nodeSelector": {**(tpl["spec"].get("nodeSelector") or {}), **pins},
                },
            },
        )
        for ps, count, tpl in gang.pod_sets
    )
    return replace(gang, pod_sets=pod_sets, together="")


def _hold_toleration(req: ProvisioningRequest | None) -> tuple[Obj, ...]:
    """Members released onto a request's capacity tolerate the hold on its nodes."""
    return (hold_toleration(request_key(req)),) if req is not None else ()


def _domain_text(pins: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(pins.items()))


def _domain_of(text: str) -> dict[str, str]:
    pairs = (item.partition("=") for item in text.split(",") if "=" in item)
    return {k: v for k, _, v in pairs}


def _after_release(snap: GroupSnapshot, members: _Members) -> GroupDecision:
    """Once released: mark the request started when every member runs; delete it when the
    gang is gone (the booking has served its purpose)."""
    actions: list[Action] = []
    for req in snap.requests:
        if req.deleting:
            continue
        if not members.live:  # the hold goes with it: its record does
            actions += lifecycle.release_hold(snap.capacity, req)
            actions += snap.backend.withdraw(req, "the gang has no members left")
        elif not members.unbound and rollback.record_of(req).phase is not AttemptPhase.STARTED:
            actions += [*lifecycle.release_hold(snap.capacity, req)]
            actions.append(AnnotateRequest(req.name, {PHASE_ANNOTATION: STARTED}))
        elif rollback.record_of(req).phase is AttemptPhase.STARTED:
            actions += [*lifecycle.release_hold(snap.capacity, req)]
    return _with(GroupDecision(actions=tuple(actions)), _hold_of_gone(snap))


def _hold_of_gone(snap: GroupSnapshot) -> GroupDecision | None:
    """The request the released gang was given capacity by, gone (deleted outside
    gangcheck): the hold it left lifted (lifecycle.release_hold_of_gone)."""
    name = snap.group.annotations.get(REQUEST_ANNOTATION, "")
    if not name or any(r.name == name for r in snap.requests):
        return None
    lift, said = lifecycle.release_holds_of_gone(snap.capacity, snap.group.ref.namespace, (name,))
    return GroupDecision(actions=lift, events=said) if lift else None


# ---- members and requests --------------------------------------------------------------


def _members(snap: GroupSnapshot) -> _Members:
    live = tuple(p for p in sorted(snap.members, key=lambda p: p.name) if p.live)
    gated = tuple(p for p in live if p.gated)
    unbound = tuple(p for p in live if not p.node_name)
    reported = reported_ungated(snap.group)
    # ungated before the gang's release: unbound, or bound without ever having been gated
    # (one the webhook stamped, or consuming a request, had its gate lifted by a release)
    newly = tuple(
        p
        for p in live
        if not p.gated
        and p.name not in reported
        and (not p.node_name or (gated_at(p.raw) is None and not p.consumes))
    )
    return _Members(live, gated, unbound, newly)


def _notice_ungated(snap: GroupSnapshot, members: _Members) -> GroupDecision | None:
    """Members created without the gate (the webhook was down or skipped them) are said once."""
    state = snap.group.annotations.get(STATE_ANNOTATION, "")
    if not members.newly_ungated or state in (RELEASED, NOT_A_GANG):
        return None
    if snap.group.annotations.get(RELEASED_AT_ANNOTATION):
        return None  # released once (then gave up): its members' gates are the release's
    if not snap.opted_in and not members.gated and not state:
        return None  # a gang gangcheck was never asked to hold
    return said_ungated(snap, members.newly_ungated)


def reported_ungated(group: PodGroup) -> set[str]:
    """The members said to carry no gate (`said_ungated`), by name."""
    return set(filter(None, group.annotations.get(UNGATED_ANNOTATION, "").split(",")))


def said_ungated(snap: GroupSnapshot, pods: Sequence[Pod], *, whose: str = "gang") -> GroupDecision:
    """Members without the gate before their gang (or, `whose` "growth", the group's growth)
    is released, said once: a MemberNotGated Warning on the group and one on each pod, each
    with its cause (`gating.ungated_cause`), the names kept in `UNGATED_ANNOTATION` (those
    said before of pods no longer among the members dropped: with pods coming and going the
    annotation would only grow, towards the object's size limit)."""
    names = [p.name for p in pods]
    causes = {p.name: ungated_cause(p.raw) for p in pods}
    text = (
        f"{len(names)} member(s) carry no {GATE} scheduling gate before their {whose} is "
        f"released: {'; '.join(f'{n} {c}' for n, c in causes.items())}; they may be "
        f"scheduled one by one, before the {whose}'s capacity exists"
    )
    events = [Event("MemberNotGated", text[:MAX_MESSAGE], warning=True)]
    for pod in pods:
        about = pod.ref
        events.append(
            Event(
                "MemberNotGated",
                f"{causes[pod.name]}: PodGroup {snap.group.ref.name} cannot hold it back "
                f"until its {whose}'s capacity exists",
                warning=True,
                about=about,
            )
        )
    members = {p.name for p in snap.members}
    reported = reported_ungated(snap.group) & members  # names of pods gone are dropped
    status = {UNGATED_ANNOTATION: ",".join(sorted(reported | set(names)))}
    return GroupDecision(status=status, events=tuple(events))


def _with(first: GroupDecision | None, second: GroupDecision | None) -> GroupDecision:
    """Both decisions: their annotations merged, actions and events in order, when the
    second wants another look."""
    if first is None:
        return second or GroupDecision()
    if second is None:
        return first
    return replace(merged(first, second), requeue_after=second.requeue_after)


def merged(base: GroupDecision, mine: GroupDecision) -> GroupDecision:
    """Both decisions as one (the sooner look of the two); where both write the group,
    `mine`'s words win."""
    status = None
    if base.status is not None or mine.status is not None:
        status = {**(base.status or {}), **(mine.status or {})}
    waits = [t for t in (base.requeue_after, mine.requeue_after) if t is not None]
    return GroupDecision(
        status=status,
        actions=(*base.actions, *mine.actions),
        after=(*base.after, *mine.after),
        events=(*base.events, *mine.events),
        requeue_after=min(waits, default=None),
        capacity_used=mine.capacity_used or base.capacity_used,
        sources=(*base.sources, *mine.sources),
        step=mine.step or base.step,
    )


def attempt_members(unbound: Sequence[Pod], req: ProvisioningRequest) -> tuple[Pod, ...]:
    """The unbound members an attempt's request was made for: as many as it records, oldest
    first by creation (a member that replaced one of them takes its place; newer ones are
    late)."""
    return tuple(sorted(unbound, key=_age_order)[: gang_size(req)])


def _grown(group: PodGroup, req: ProvisioningRequest) -> str | None:
    """minCount raised above the members the attempt was made for: it cannot start the gang
    (kube-scheduler waits for minCount), so it is replaced by one for them all before it is
    provisioned (once provisioned it is kept, and the start watchdog judges it)."""
    size = gang_size(req)
    if group.min_count <= size:
        return None
    return f"minCount raised to {group.min_count} above the {size} members the attempt asks for"


def gang_size(req: ProvisioningRequest) -> int:
    """The members the request's attempt was made for: recorded, else asked plus reserved."""
    record = rollback.record_of(req)
    if record.gang_members is not None:
        return record.gang_members
    return sum(p.count for p in req.pod_sets) + record.reserved


def gang_of(snap: GroupSnapshot, members: _Members) -> GangSpec:
    """The members still to place, grouped by identical scheduling requirements into pod sets
    ``ps-0``, ``ps-1``… in the order of their first member's name."""
    return gang_from_pods(snap.group, members.unbound)


def gang_from_pods(group: PodGroup, pods: Sequence[Pod]) -> GangSpec:
    """The pods (in the order given) grouped by identical scheduling requirements into pod
    sets ``ps-0``, ``ps-1``…, with the group's topology and namespace."""
    groups: dict[str, list[Pod]] = {}
    for pod in pods:
        key = repr(scheduling_requirements(pod_template(pod)))
        groups.setdefault(key, []).append(pod)
    pod_sets = tuple(
        (f"ps-{i}", len(same), pod_template(same[0])) for i, same in enumerate(groups.values())
    )
    return GangSpec(pod_sets, together=group.topology_key, namespace=group.ref.namespace)


def pod_template(pod: Pod) -> Obj:
    """The PodTemplateSpec a member stands for: its labels and spec, without what binds it to
    this pod (node, gates, group membership), limits copied into missing requests."""
    spec = copy.deepcopy(pod.raw.get("spec") or {})
    for key in ("nodeName", "schedulingGates", "schedulingGroup", "hostname"):
        spec.pop(key, None)
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            limits_as_missing_requests(container)
    labels = dict((pod.raw.get("metadata") or {}).get("labels") or {})
    return {"metadata": {"labels": labels}, "spec": spec}


def attempt_of(group: PodGroup) -> int:
    return count_of(group.annotations.get(ATTEMPT_ANNOTATION)) or 1


def request_name(group: PodGroup, attempt: int) -> str:
    return naming.request_name(group.ref.name, group.short, attempt)


def group_key(group: PodGroup) -> str:
    return f"{group.short}/{group.ref.name}"


def _withdraw_attempts(snap: GroupSnapshot, why: str) -> GroupDecision:
    """Withdraw the group's attempts (flow.withdraw)."""
    return flow.withdraw(GroupDecision, snap, why)


def _stale(
    snap: GroupSnapshot, current: str, *, keep: Sequence[ProvisioningRequest] = ()
) -> tuple[Action, ...]:
    """Withdraw the attempts before `current`, lifting the hold from what they kept; not
    the requests `keep` (kept for the attempt in flight, topup.py)."""
    return lifecycle.superseded(
        [r for r in snap.requests if r.name not in {k.name for k in keep}],
        current,
        capacity=snap.capacity,
        backend=snap.backend,
        why=f"superseded by {current or 'waiting for members'}",
    )


def _ask(
    snap: GroupSnapshot, gang: GangSpec, name: str, record: Mapping[str, str], source: int = 0
) -> Ask:
    """The attempt's ask of capacity source `source`: a pod set per kind of member (pinned to
    the source's node labels), the group owning its objects."""
    assert snap.config is not None
    group = snap.group
    gang = _pinned(gang, _source_labels(snap.config, source))
    capacity_class, parameters = source_asks(snap.config, source)
    return Ask(
        attempt=name,
        namespace=group.ref.namespace,
        pod_sets=tuple(AskedPodSet(ps, count, tpl) for ps, count, tpl in gang.pod_sets),
        identity={GROUP_ANNOTATION: group_key(group), GROUP_UID_ANNOTATION: group.ref.uid},
        record=record,
        capacity_class=capacity_class,
        parameters=parameters,
        existing=snap.templates,
    )


# ---- status ----------------------------------------------------------------------------


def _status_annotations(state: str, message: str) -> dict[str, str]:
    return {STATE_ANNOTATION: state, MESSAGE_ANNOTATION: message[:MAX_MESSAGE]}


def _status(
    snap: GroupSnapshot,
    state: str,
    message: str,
    *,
    request: str | None = None,
    domain: str | None = None,
    gang_members: str | None = None,
    released_at: str | None = None,
    warn: str = "",
    note: str = "",
) -> GroupDecision:
    """The group's state and one-line message, written (with an Event) only when changed:
    a Warning of reason `warn`, a Normal one of reason `note`, else one named by the state
    (a Warning when it failed or gave up)."""
    wanted = _status_annotations(state, message)
    if request is not None:
        wanted[REQUEST_ANNOTATION] = request
    if domain is not None:
        wanted[DOMAIN_ANNOTATION] = domain
    if gang_members is not None:
        wanted[GANG_MEMBERS_ANNOTATION] = gang_members
    if released_at is not None and not snap.group.annotations.get(RELEASED_AT_ANNOTATION):
        wanted[RELEASED_AT_ANNOTATION] = released_at
    current = snap.group.annotations
    changed = {k: v for k, v in wanted.items() if current.get(k, "") != v}
    if not changed:
        return GroupDecision()
    events: tuple[Event, ...] = ()
    if current.get(STATE_ANNOTATION) != state or warn or note:
        warning = bool(warn) or (not note and state in (FAILED, GAVE_UP))
        events = (Event(warn or note or state, message[:MAX_MESSAGE], warning=warning),)
    return GroupDecision(status=changed, events=events)


def _age_order(pod: Pod) -> tuple[str, str]:
    """Oldest first (RFC 3339 UTC times sort as text; none sorts first), then by name."""
    return (pod.created, pod.name)


def missing_group_message(api_group: str, name: str, *, served: bool) -> str:
    """Why a gated member waits when the PodGroup it names does not exist."""
    if not served:
        return (
            f"held by the {GATE} scheduling gate: it names a {api_group} PodGroup {name!r}, "
            f"and this cluster does not serve {api_group} PodGroups"
        )
    return (
        f"held by the {GATE} scheduling gate: PodGroup {name!r} ({api_group}) does not exist; "
        "the gang is provisioned once it does"
    )
