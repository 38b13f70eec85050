"""PodGroups that grow: ``minCount`` raised on a released (running) group.

The members running are never touched. When ``minCount`` rises above them, the members added
(gated by the webhook, created by whoever scales the group) are provisioned all or nothing:
the oldest ``minCount - running`` of the gated members are the *growth*; if they fit
together on nodes that exist they are released at once, else one ProvisioningRequest asks
for them (``<group>-<kind>-grow-<n>``, recorded with ``GROWS_ANNOTATION``: how many ran when
it was made, and with the source it asks, whose deadline it has), and they are released
together, annotated to consume it, when they fit whole on nodes that exist. A member added
whose gate was removed by hand (or never added) and that waits unbound, consuming no request
(`podgroup.loose_members`), is one of the growth while a gated member waits: counted in its
need and its fit, and given its request and the hold's toleration at its release, named in
GangGrown, as a gang's release does (`podgroup.release_together`). The growth asks
the capacity source the group was released onto (the one InOrder reached, or the one that
won a Race; after an InOrder top-up, the source topped up from, followed to its index in the
config now by ``lifecycle.asked_source``), one source only: it neither falls back to the
next source nor races. When that source left the config, the growth asks where a new attempt
of the config now asks first (its first source), its node labels no longer pinned. A growth
in flight is followed as the group's own attempt is (`driver.in_flight`): before Provisioned,
its source leaving the config, moving, or asking another class, parameters or nodes
(`lifecycle.source_drift`) rolls it back (ConfigChanged, naming the field), and the next
growth asks at once under the new config (no backoff, no retry counted); once Provisioned it
is kept. Past the deadline the growth is rolled back like any attempt (what arrived for it
reclaimed by the safe path), the group stays Released, its running members untouched, and the
next growth attempt follows after Kueue's backoff, counted from the rolled-back attempt's
deadline (its request is the record until then); past ``backoffLimitCount`` the growth waits,
saying so.

A growth delivered has the start watchdog of a gang's release: its members released onto it
(the time recorded on its request, ``gangcheck.io/released-at``) not all bound within the
``fulfillment.startDeadlineSeconds`` of the group's config now, it is rolled back
(StartDeadline): what arrived for it and runs none of the group's pods is reclaimed by the
safe path (a node a member of it is bound to drains, reclaimed once idle), the hold lifted
from what stays; no member is touched. Its members' gates stay lifted, so gangcheck cannot
hold them back for another growth: they are counted as the group's, the reason said on the
group (Warning ``GrowthRolledBack``); a growth asked later (minCount raised again) follows
after the backoff of a rollback.

Raised again while a growth is in flight, above the members it asks for: before Provisioned
it is replaced (rolled back, ConfigChanged, the next asking for them all at once); once
Provisioned it is kept, and the members beyond it wait (none released alone) until it has
started, when the next growth asks for them, as for a raise after a growth has started; a
delivered growth is never withdrawn as superseded. A growth of more members than
``podGroups.maxMembers`` is said (Event ``GangTooLarge``) and not asked.

Lowered again to what runs or less (or no longer a gang), a growth not delivered is withdrawn
(its arrivals, on which nothing of the group runs, reclaimed safely); capacity members use is
never withdrawn.
A ``minCount`` above the members that exist is said on the group (Event
``MinCountAboveMembers``) until they exist.

While a growth is in flight its members and its requests are left out of what
``podgroup.decide`` sees, so it neither releases them one by one as late members nor counts
the growth's nodes as free for others.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from gangcheck.logic.attempt import driver, flow, lifecycle, naming, places, rollback
from gangcheck.logic.attempt.actions import (
    Action,
    AnnotateRequest,
    CreateRequest,
    Event,
    ReleaseHold,
)
from gangcheck.logic.attempt.fulfillment import (
    ClusterView,
    fits_now,
    proven_older,
    request_key,
)
from gangcheck.logic.attempt.hold import hold_toleration
from gangcheck.logic.attempt.lifecycle import Progress
from gangcheck.logic.attempt.records import AttemptPhase, RollbackCause, count_of
from gangcheck.logic.attempt.status import Phase
from gangcheck.logic.podgroups import podgroup
from gangcheck.logic.podgroups.gating import gated_at, released_by
from gangcheck.logic.podgroups.podgroup import (
    RELEASED,
    GroupDecision,
    GroupSnapshot,
    _ask,
    _pinned,
    _source_labels,
    _status,
    gang_domain,
    gang_from_pods,
    source_asks,
)
from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.model.names import (
    CLASS_ANNOTATION,
    CONSUME_ANNOTATION,
    FULFILLED,
    GANG_MEMBERS_ANNOTATION,
    MARKED_SINCE_ANNOTATION,
    OUTCOME_ANNOTATION,
    PHASE_ANNOTATION,
    RELEASED_AT_ANNOTATION,
    RELEASED_UNMARKED_ANNOTATION,
    REQUEST_ANNOTATION,
    SOURCE_ANNOTATION,
    START_ROLLED_AT_ANNOTATION,
    STARTED,
    STATE_ANNOTATION,
)
from gangcheck.model.objects import Pod, ProvisioningRequest
from gangcheck.model.podgroups import PodGroup
from gangcheck.model.provisioning_config import AtomicProvisioningSpec

#: On a growth request: how many members ran when it was made.
GROWS_ANNOTATION = "gangcheck.io/grows-group"


def decide(snap: GroupSnapshot, now: datetime) -> GroupDecision:
    """`podgroup.decide`, and for a released group whose minCount rose above the members
    running, the growth: asked for all or nothing, the running members left alone; and the
    hold of a delivered growth whose request is gone lifted (`_holds_of_gone`)."""
    snap, marking = _marking(snap, now)
    snap, recorded = _released_onto(snap, now)
    decision = _decide(snap, now)
    if recorded:
        decision = _with(GroupDecision(actions=recorded), decision)
    ungated = _ungated(snap)
    if ungated is not None:
        decision = podgroup.merged(decision, ungated)
    lifted = _holds_of_gone(snap, decision)
    decision = decision if lifted is None else _with(decision, lifted)
    if (
        marking is None
        and not snap.group.annotations.get(MARKED_SINCE_ANNOTATION)
        and (decision.status or {}).get(STATE_ANNOTATION) == RELEASED
    ):
        marking = {MARKED_SINCE_ANNOTATION: format_time(now)}  # released now, marked
    return decision if marking is None else podgroup.merged(decision, GroupDecision(status=marking))


#: The longest `RELEASED_UNMARKED_ANNOTATION` written (characters): a group's annotations
#: are 256 KiB in all, and a write past that is refused (the group's status stuck). Members
#: beyond it (a gang of hundreds released at once just before the upgrade) are read as
#: before the mark.
UNMARKED_BUDGET = 32 * 1024


def _marking(snap: GroupSnapshot, now: datetime) -> tuple[GroupSnapshot, dict[str, str] | None]:
    """A group released by a version before `RELEASED_BY_ANNOTATION` (no
    `MARKED_SINCE_ANNOTATION`), at this version's first look: its members whose gate was
    lifted with no mark and that still wait unbound, consuming no request, stamped by the
    webhook, are taken as that version's release (onto room that exists: a gang's, a growth's
    or late members', binding) and recorded so (`RELEASED_UNMARKED_ANNOTATION`), with the time
    from which releases are marked. Read as ungated by hand, each was said MemberNotGated
    though gangcheck released it, and a growth asked for it once more (a gated member
    waiting). One the webhook never stamped was never gated (said, as before). A member
    ungated by hand before the upgrade cannot be told from them: it is taken as released."""
    group = snap.group
    if (
        group.annotations.get(STATE_ANNOTATION, "") != RELEASED
        or group.deleting
        or group.annotations.get(MARKED_SINCE_ANNOTATION)
    ):
        return snap, None
    since = group.annotations.get(RELEASED_AT_ANNOTATION, "")
    binding = sorted(
        (
            p
            for p in snap.members
            if p.live
            and not p.gated
            and not p.node_name
            and not p.consumes
            and not released_by(p.raw)
            and gated_at(p.raw) is not None
        ),
        # those a growth would say first (created since the release), within the budget
        key=lambda p: (not since or p.created < since, p.name),
    )
    names: list[str] = []
    length = -1  # no comma before the first
    for pod in binding:
        length += len(pod.name) + 1
        if length > UNMARKED_BUDGET:
            break
        names.append(pod.name)
    marking = {MARKED_SINCE_ANNOTATION: format_time(now)}
    if names:
        marking[RELEASED_UNMARKED_ANNOTATION] = ",".join(sorted(names))
    adopted = replace(group, annotations={**group.annotations, **marking})
    return replace(snap, group=adopted), marking


def _released_unmarked(group: PodGroup) -> set[str]:
    """The members an earlier version released with no mark (`_marking`), by name."""
    return set(filter(None, group.annotations.get(RELEASED_UNMARKED_ANNOTATION, "").split(",")))


def _ungated(snap: GroupSnapshot) -> GroupDecision | None:
    """The members of a growth (created since the group's release, minCount above the gang
    released) without the gate, said once as a gang's are before its release
    (`podgroup.said_ungated`: MemberNotGated on the group and the pod, each with its cause):
    created without it (the webhook down, or not asked), its gate removed by someone else,
    or bound without ever having had it. A member gangcheck released (marked, or consuming a
    request), or one the webhook stamped that is bound, is not said. Before, a released
    group said nothing of them: the growth's member could be scheduled one by one, before
    the growth's capacity existed, and no one was told."""
    group = snap.group
    if group.annotations.get(STATE_ANNOTATION, "") != RELEASED or group.deleting:
        return None
    if not group.is_gang or group.min_count <= _released(group.annotations):
        return None  # no growth: members beyond the gang are late ones
    since = group.annotations.get(RELEASED_AT_ANNOTATION, "")
    reported = podgroup.reported_ungated(group)
    unmarked = _released_unmarked(group)
    pods = [
        p
        for p in snap.members
        if p.live
        and not p.gated
        and p.name not in reported
        and not p.consumes
        and not released_by(p.raw)
        and p.name not in unmarked
        and (not p.node_name or gated_at(p.raw) is None)
        and (not since or p.created >= since)  # the gang's own were said before its release
    ]
    return podgroup.said_ungated(snap, pods, whose="growth") if pods else None


def _released_onto(snap: GroupSnapshot, now: datetime) -> tuple[GroupSnapshot, tuple[Action, ...]]:
    """A growth in flight that live members consume was delivered: its members were
    released onto it (`_follow`), and the record of it written right after (its phase
    Fulfilled) was lost (a refused or lost answer, the leader lost between the two writes).
    It is taken as delivered, and its record written again first (its start watchdog counting
    from now). Taken as still in flight, its members counted running, it was withdrawn as no
    longer needed, the node that came for it reclaimed (fenced, so a member not yet bound
    could not be) under its members.

    Members are released onto a growth only once it is Provisioned, and one bound to a node
    older than the request was not placed on what arrived for it: a name used again (the
    earlier growth's request deleted by hand) is consumed by the earlier growth's members,
    running on its nodes, and is not taken for delivered on them (it was marked Fulfilled,
    then Started, its hold lifted, while the new members waited and were asked for again)."""
    candidates = {
        r.name: r
        for r in snap.requests
        if GROWS_ANNOTATION in r.annotations
        and not r.deleting
        and not _settled(r)
        and not _delivered_phase(r)
        and not rollback.is_rolling_back(r)
    }
    if not candidates:
        return snap, ()
    consumers = [p for p in snap.members if p.live and not p.gated and p.consumes in candidates]
    consumed = {p.consumes for p in consumers if not _on_older_node(snap, p, candidates)}
    recorded: list[Action] = []
    requests = []
    for req in snap.requests:
        if (
            candidates.get(req.name) is req
            and req.name in consumed
            and snap.backend.status_of(req).has(Phase.PROVISIONED)
        ):
            recorded += _fulfilled(req, now)
            requests.append(
                replace(req, annotations={**req.annotations, PHASE_ANNOTATION: FULFILLED})
            )
        else:
            requests.append(req)
    return (replace(snap, requests=tuple(requests)), tuple(recorded)) if recorded else (snap, ())


def _on_older_node(
    snap: GroupSnapshot, member: Pod, requests: Mapping[str, ProvisioningRequest]
) -> bool:
    """Whether the member is bound to a node created before the request it consumes, by
    whole seconds (a node made since, or unknown, is not)."""
    if not member.node_name or snap.capacity is None:
        return False
    node = next(
        (n for n in snap.capacity.nodes if n["metadata"].get("name") == member.node_name), None
    )
    created = parse_time(requests[member.consumes].creation_timestamp)
    return node is not None and proven_older(node, created)


def _holds_of_gone(snap: GroupSnapshot, decision: GroupDecision) -> GroupDecision | None:
    """The growth requests members were released onto (they consume them), deleted outside
    gangcheck: no record is left whose end (Started, a rollback, the group's end) would lift
    the hold on the nodes recorded for them, so it is lifted now
    (`lifecycle.release_holds_of_gone`: once the API server confirms the request gone, with
    a HoldLifted Warning Event), nothing reclaimed. A name this decision asks again is left
    alone: the request made under it counts its own."""
    there = {r.name for r in snap.requests}
    made = {
        str((a.body.get("metadata") or {}).get("name") or "")
        for a in decision.actions
        if isinstance(a, CreateRequest)
    }
    gone = {
        p.consumes
        for p in snap.members
        if p.live and p.consumes not in (there | made) and _is_growth(snap, p.consumes)
    }
    if not gone:
        return None
    lift, said = lifecycle.release_holds_of_gone(
        snap.capacity, snap.group.ref.namespace, sorted(gone)
    )
    return GroupDecision(actions=lift, events=said) if lift else None


def _is_growth(snap: GroupSnapshot, name: str) -> bool:
    """Whether `name` is one of this group's growth requests (`<group>-<kind>-grow-<n>`)."""
    tail = name.rsplit("-", 1)[-1]
    return tail.isdigit() and name == _request_name(snap, int(tail))


def _decide(snap: GroupSnapshot, now: datetime) -> GroupDecision:
    group = snap.group
    growing = tuple(r for r in snap.requests if GROWS_ANNOTATION in r.annotations)
    state = group.annotations.get(STATE_ANNOTATION, "")
    if state != RELEASED or group.deleting:
        return podgroup.decide(snap, now)  # deleted: every request withdrawn, growth's too
    live = [p for p in snap.members if p.live]
    # Members added with the gated ones whose gate was removed by hand (or never added) and
    # that wait unbound, consuming nothing, are of the growth, as of a gang's release
    # (`podgroup.loose_members`): counted in its need and fit, given its request and hold.
    # Without a gated member waiting they are taken as running, as before. A member a release
    # of gangcheck's lifted the gate of onto room that exists (no request consumed), marked so
    # (`gating.released_by`), is running while it binds, a gated member waiting or not: asked
    # for again by no growth (before the mark, the next growth asked for it once more).
    # One an earlier version released so, with no mark, is too (`_marking`).
    loose = (
        {p.name for p in podgroup.loose_members(live)} - _released_unmarked(group)
        if any(p.gated for p in live)
        else set()
    )
    running = [p for p in live if not p.gated and p.name not in loose]
    gated = sorted(
        (p for p in live if p.gated or p.name in loose), key=lambda p: (p.created, p.name)
    )
    need = group.min_count - len(running)
    if need <= 0 and not growing:
        return podgroup.decide(snap, now)
    if not growing and group.min_count <= _released(group.annotations):
        # minCount is not above the gang released: a member missing here (gone, or not yet
        # back in the cache after its release) is no growth to ask or warn of
        return podgroup.decide(snap, now)
    latest = _latest(snap, growing)
    config = snap.config or (lifecycle.recorded_config(latest[1]) if latest else None)
    if config is None:
        return podgroup.decide(snap, now)  # no config: late members as before, nothing asked
    # a growth made is followed under the config it recorded; a new one needs the config now
    # (deleted, invalid, or not serving the group's namespace: nothing new is asked)
    unserved = "" if snap.config is not None else snap.config_problem or "no config"
    snap = replace(snap, config=config)
    in_flight = latest is not None and not _settled(latest[1]) and not _delivered_phase(latest[1])
    size = _members_of(latest[1]) if latest is not None and in_flight else max(need, 0)
    chosen = tuple(gated[:size]) if need > 0 or in_flight else ()
    # the members the growth asks for, and those minCount added beyond a growth in flight:
    # none of them is released alone as a late member meanwhile
    held = tuple(gated[: max(size, need)]) if need > 0 or in_flight else ()
    rest = replace(
        snap,
        members=tuple(p for p in snap.members if p not in held),
        requests=tuple(r for r in snap.requests if r not in growing),
    )
    base = podgroup.decide(rest, now)
    grown = _grow(
        snap,
        growing,
        latest=latest,
        chosen=chosen,
        waiting=len(gated),
        running=running,
        need=need,
        now=now,
        unserved=unserved,
    )
    return podgroup.merged(base, grown)


def _grow(
    snap: GroupSnapshot,
    growing: tuple[ProvisioningRequest, ...],
    *,
    latest: tuple[int, ProvisioningRequest] | None,
    chosen: Sequence[Pod],
    waiting: int,
    running: Sequence[Pod],
    need: int,
    now: datetime,
    unserved: str = "",
) -> GroupDecision:
    """The growth: followed, replaced, withdrawn or asked. `unserved`: why the group has no
    config now (its growth in flight followed under the config it recorded): no new growth
    is asked or released then, the members it would take kept gated, the reason said."""
    group = snap.group
    done = _delivered(snap, growing, running, now)
    if (
        latest is not None
        and _start_rolled(latest[1])
        and (need <= 0 or _delivered_phase(latest[1]))
    ):
        return _with(done, _rolled_back_on_start(snap, latest[1]))
    if (
        latest is not None
        and _delivered_phase(latest[1])
        and (need <= 0 or _phase(latest[1]) is not AttemptPhase.STARTED)
    ):
        if need <= 0:
            return done  # the growth delivered: its members are the group's, running or binding
        message = (
            f"released; minCount {group.min_count} needs {need} more member(s): asked for once "
            f"the members of growth {latest[1].name} are all bound"
        )
        return _with(done, _status(snap, RELEASED, message))
    if need <= 0:
        return _lowered(snap, growing, len(running), done)
    in_flight = latest is not None and not _settled(latest[1]) and not _delivered_phase(latest[1])
    if need > snap.max_members and not in_flight:
        message = (
            f"released; minCount {group.min_count} adds {need} members to the {len(running)} "
            f"running, more than the {snap.max_members} one ProvisioningRequest may carry here "
            "(setting podGroups.maxMembers); nothing is asked, the running members are untouched"
        )
        return _with(done, _status(snap, RELEASED, message, warn="GangTooLarge"))
    # a growth in flight is followed once the members it asks for (or, fewer, those needed)
    # exist; a new one is asked once every member needed does
    enough = min(need, _members_of(latest[1])) if latest is not None and in_flight else need
    if (len(chosen) if in_flight else waiting) < enough:
        message = (
            f"released; minCount {group.min_count} is above the members that exist: "
            f"{len(running)} run, {waiting} more are waiting to be released; nothing is "
            f"asked until {need - waiting} more exist"
        )
        if in_flight and latest is not None:
            return _short(snap, latest[1], message, done, now)
        return _with(done, _status(snap, RELEASED, message, warn="MinCountAboveMembers"))
    said = f"minCount raised to {group.min_count}: {need} member(s) added to {len(running)} running"
    if unserved and not in_flight:
        message = (
            f"released; {said}; no growth is asked: {unserved}; the {len(running)} running "
            "members are untouched"
        )
        return _with(done, _status(snap, RELEASED, message, warn="ConfigProblem"))
    if latest is None:
        return _with(done, _first(snap, chosen, 1, said, now, gone=()))
    number, req = latest
    if _delivered_phase(req):
        # raised again once the growth before started: the next asks for the members beyond
        return _with(done, _first(snap, chosen, number + 1, said, now, gone=()))
    if not _settled(req):
        return _with(done, _follow(snap, req, chosen, said, now, need=need))
    assert snap.config is not None
    reason = rollback.record_of(req).reason or "rolled back"
    if RollbackCause.of(reason) is RollbackCause.CONFIG_CHANGED:
        # the config changed under it: the next growth under the new config at once, as the
        # group's own next attempt (no backoff, no retry counted)
        said += f"; growth attempt {number} was rolled back ({reason}), the next asks now"
        return _with(done, _first(snap, chosen, number + 1, said, now, gone=_gone(snap, growing)))
    if lifecycle.next_attempt(number, snap.config.retry_strategy) is None:
        limit = snap.config.retry_strategy.backoff_limit_count
        message = (
            f"released; {said}; growth attempt {number} was rolled back ({reason}) and "
            f"backoffLimitCount {limit} allows no more; the {len(running)} running members "
            "are untouched"
        )
        return _with(done, _status(snap, RELEASED, message, warn="GrowthRolledBack"))
    due = next_due(snap.config, number, req)
    if due is not None and now < due:
        message = (
            f"released; {said}; growth attempt {number} was rolled back ({reason}); the "
            f"{len(running)} running members are untouched; the next at {format_time(due)}"
        )
        wait = max(0.2, (due - now).total_seconds())
        # Normal, as a gang's RolledBack: retried on backoff (rollback.rolled_back)
        status = _status(snap, RELEASED, message, note="GrowthRolledBack")
        return _with(done, replace(status, requeue_after=wait))
    return _with(done, _first(snap, chosen, number + 1, said, now, gone=_gone(snap, growing)))


def _short(
    snap: GroupSnapshot,
    req: ProvisioningRequest,
    message: str,
    done: GroupDecision,
    now: datetime,
) -> GroupDecision:
    """A growth in flight whose members fell short of those it asks for (deleted, or
    relabelled to another group): it is not followed meanwhile (none of them is released
    alone), so it waits for them until its deadline, said; then, or at once when its
    rollback had begun, it is withdrawn as a growth no longer needed (`_lowered`: what
    arrived for it reclaimed safely), Event GrowthWithdrawn. Kept for ever, its arrivals
    stayed held and its deadline was never judged."""
    deadline = rollback.deadline_of(req)
    if deadline is not None and now < deadline and not rollback.is_rolling_back(req):
        message += (
            f"; growth {req.name} asked for them waits until its deadline "
            f"{format_time(deadline)}, then is withdrawn"
        )
        status = _status(snap, RELEASED, message, warn="MinCountAboveMembers")
        wait = lifecycle.until_deadline(req, now)
        return _with(done, replace(status, requeue_after=wait))
    why = (
        f"fewer members exist than growth {req.name} asks for, past its deadline: "
        "withdrawn, asked again once they exist"
    )
    status = _status(snap, RELEASED, f"{message}; {why}", warn="MinCountAboveMembers")
    return _with(done, _withdrawn(snap, [req], why, status))


def _withdrawn(
    snap: GroupSnapshot, growths: Sequence[ProvisioningRequest], why: str, status: GroupDecision
) -> GroupDecision:
    """`status`, with the growths no longer needed withdrawn (driver.withdraw: what arrived
    reclaimed by the safe path), Event GrowthWithdrawn."""
    gone = driver.withdraw(
        growths, capacity=snap.capacity, config=snap.config, backend=snap.backend, why=why
    )
    return replace(
        status,
        actions=gone.actions,
        events=(*status.events, *gone.events, Event("GrowthWithdrawn", why)),
        requeue_after=gone.requeue_after,
    )


def _gone(snap: GroupSnapshot, growing: Sequence[ProvisioningRequest]) -> tuple[Action, ...]:
    """The growth requests before the next one withdrawn (superseded), their hold lifted; a
    delivered one is kept: members consume it."""
    return tuple(
        a
        for r in growing
        if not r.deleting and not _delivered_phase(r)
        for a in (
            *lifecycle.release_hold(snap.capacity, r),
            *snap.backend.withdraw(r, "superseded"),
        )
    )


def _first(
    snap: GroupSnapshot,
    chosen: Sequence[Pod],
    number: int,
    said: str,
    now: datetime,
    *,
    gone: tuple[Action, ...],
) -> GroupDecision:
    """No growth request in flight: release the added members at once if they fit together
    on nodes that exist, else ask for them."""
    assert snap.config is not None
    group = snap.group
    source, pins = _source(snap, chosen)
    gang = _pinned(gang_from_pods(group, chosen), pins)
    here = fits_now(_others_held(snap), gang)
    if here.fits:
        message = f"released; {said}: they fit on nodes that exist, released together"
        status = _status(snap, RELEASED, message)
        released, events = podgroup.release_together(
            chosen, {}, pins, (), reason="GangGrown", message=message
        )
        return replace(status, actions=(*gone, *released), events=(*status.events, *events))
    name = _request_name(snap, number)
    record = {  # the source asked recorded: the growth is followed (deadline, drift) by it
        **lifecycle.record(number, snap.config, now, reserved=0, source=source),
        GANG_MEMBERS_ANNOTATION: str(len(chosen)),
        GROWS_ANNOTATION: str(group.min_count - len(chosen)),
    }
    asked = driver.ask(snap.backend, _ask(snap, gang, name, record, source), reserved=0)
    status = _status(snap, RELEASED, f"released; {said}: {asked.message}")
    return replace(
        status,
        actions=(*gone, *asked.actions),
        events=(*status.events, *asked.events),
        requeue_after=lifecycle.LOOK_AGAIN_SECONDS,
    )


def _source(snap: GroupSnapshot, chosen: Sequence[Pod]) -> tuple[int, dict[str, str]]:
    """The capacity source a new growth attempt asks, and the group's pins it keeps.

    The source the group was released onto: the one whose node labels its pins carry (the one
    InOrder reached, or the one that won a Race), else the one the group's latest request
    asked (an InOrder top-up releases the group across the kept source and the next, pinned
    to neither; the growth asks the one that delivered last, not the first, which stopped
    short), followed to its index in the config now (`lifecycle.asked_source`: moved, or
    another source removed before it). The growth asks it, so the members added land beside
    the running ones. When that source left the config, or the request is gone, the growth
    is a new ask for capacity the group has none of: it asks where a new attempt of the
    config now asks first (`places.first_place`, as `flow.first_ask`), and the left source's
    node labels are dropped from its pins (no source asks those nodes now). A record without
    a recorded config is read by its index, as before. A group with a required topology level
    whose domain record is gone (written over by hand) is pinned to the domain its running
    members share (`podgroup.gang_domain`), not released or asked across domains."""
    config = snap.config
    assert config is not None
    pins, _ = gang_domain(snap)  # recorded, or (the record gone) where its members run
    for source in config.sources():
        labels = source.node_selector
        if labels and all(pins.get(k) == v for k, v in labels.items()):
            return source.index, pins
    name = snap.group.annotations.get(REQUEST_ANNOTATION, "")
    req = next((r for r in snap.requests if name and r.name == name), None)
    asked = lifecycle.asked_source(req, config) if req is not None else None
    if asked is not None and asked.now is not None:
        return asked.now, pins
    if asked is not None:
        pins = {k: v for k, v in pins.items() if asked.node_selector.get(k) != v}
    gang = _pinned(gang_from_pods(snap.group, chosen), pins)
    first = places.first_place(
        config, lambda index: _pinned(gang, _source_labels(config, index)), snap.capacity
    )
    return first.source, pins


def _follow(
    snap: GroupSnapshot,
    req: ProvisioningRequest,
    chosen: Sequence[Pod],
    said: str,
    now: datetime,
    *,
    need: int,
) -> GroupDecision:
    """The growth request in flight, for the members it was made for. minCount raised again
    above them (`need` members to add now): replaced before it is Provisioned (rolled back,
    CONFIG_CHANGED; the next asks for them all at once), kept once Provisioned (the members
    beyond it are asked for once it has started)."""
    assert snap.config is not None
    group = snap.group
    size = _members_of(req)
    grown = (
        f"minCount {group.min_count} needs {need} members added to the "
        f"{group.min_count - need} running, more than the {size} the growth asks for"
        if need > size
        else None
    )
    if grown is not None:
        said += (
            f"; growth {req.name} asks for {size} of them, the other {need - size} once it "
            "has started"
        )
    _, pins = _source(snap, chosen)  # a source left since: its labels no longer pinned
    # now's, with the deadline of the source it asked, as for the group's own attempt: a
    # deadline change applies
    config = lifecycle.source_config(snap.config, lifecycle.asked_source(req, snap.config))
    attempt = lifecycle.Attempt(
        request=req,
        status=snap.backend.status_of(req),
        gang=_pinned(gang_from_pods(group, chosen), pins),
        capacity=snap.capacity,
        config=config,
    )
    # compared with what its source asks now, as the group's own attempt (podgroup._followed):
    # a source that left, moved, or asks another class, parameters or nodes ends it before
    # Provisioned (rolled back, CONFIG_CHANGED)
    class_name, parameters = _asks_now(snap.config, req)
    followed = driver.in_flight(
        attempt, now, class_name=class_name, parameters=parameters, changed=grown
    )
    step = followed.step
    assert step is not None  # always in fit mode
    if step.progress is Progress.FITS:
        consume = {CONSUME_ANNOTATION: req.name, CLASS_ANNOTATION: req.class_name}
        toleration = (hold_toleration(request_key(req)),)
        message = f"released; {said}: they fit whole, released together: {step.message}"
        status = _status(snap, RELEASED, message)
        released, events = podgroup.release_together(
            chosen, consume, pins, toleration, reason="GangGrown", message=message
        )
        return replace(
            status,
            actions=(*followed.upkeep, *step.actions, *released, *_fulfilled(req, now)),
            events=(*status.events, *events),
            step=step,
        )
    if step.progress in (Progress.ROLLING_BACK, Progress.ROLLED_BACK):
        rolling = GroupDecision(
            actions=step.actions,
            events=step.events,
            requeue_after=step.requeue_after or 0.2,
            step=step,
        )
        return flow.followed(rolling, followed, req.name)  # a replacement said, as the group's
    status = _status(snap, RELEASED, f"released; {said}: {step.message}")
    return replace(
        status,
        actions=(*followed.upkeep, *step.actions),
        requeue_after=step.requeue_after,
        step=step,
    )


def _asks_now(
    config: AtomicProvisioningSpec, req: ProvisioningRequest
) -> tuple[str, dict[str, str]]:
    """The class and parameters the growth's source asks now (`podgroup.source_asks`).

    A growth made by an older version recorded no source (read as the first) though it may
    have asked another (the source the group was released onto): when its class or
    parameters are not those of the first source as it recorded it (or, without a record,
    as the config has it now), it asked another, and it is compared with its own, as then:
    not rolled back for a change of a source it did not ask."""
    index = places.of_request(req).source
    if SOURCE_ANNOTATION not in req.annotations:
        first = (lifecycle.recorded_config(req) or config).source(0)
        mine = (req.class_name, dict(req.parameters))
        if first is None or (first.class_name, dict(first.parameters)) != mine:
            return mine
    return source_asks(config, index)


def _delivered(
    snap: GroupSnapshot,
    growing: Sequence[ProvisioningRequest],
    running: Sequence[Pod],
    now: datetime,
) -> GroupDecision:
    """Growth requests delivered: started (their hold lifted) once every member consuming
    them is bound; withdrawn once the group has no member left, or, not started, once no
    member consumes it (the members released onto it all left before they were bound: it
    would never start, its nodes held and the group's next growth waiting for ever), its
    hold lifted and nothing reclaimed, as the group's own request whose members all left.
    That withdrawal is applied only once the API server confirms no pod consumes it
    (`ReleaseHold.unconsumed`): a pod cache older than the request (a new leader's, its
    pods listed before the members' release, its requests after the record of it) shows
    the members released onto it still gated.

    Not started while its members bind: the start watchdog (`_watch_start`) rolls it back
    past startDeadlineSeconds, what arrived for it reclaimed by the safe path, then lifts the
    hold on what stays (`_start_rollback`)."""
    actions: list[Action] = []
    events: list[Event] = []
    waits: list[float] = []
    for req in growing:
        phase = _phase(req)
        if not req.deleting and _start_rolled(req):
            step = _start_rollback(snap, req)
            actions += step.actions
            events += step.events
            waits += [step.requeue_after] if step.requeue_after is not None else []
            continue
        if req.deleting or phase not in (AttemptPhase.FULFILLED, AttemptPhase.STARTED):
            continue
        if not running and not any(p.live for p in snap.members):
            actions += snap.backend.withdraw(req, "the gang has no members left")
            continue
        mine = [p for p in snap.members if p.live and p.consumes == req.name]
        if not mine and phase is not AttemptPhase.STARTED:
            why = (
                f"the members released onto growth {req.name} all left before they were "
                "bound: its request is withdrawn, the hold on what arrived for it lifted"
            )
            # judged on the pod cache, which may be older than the request's record (a new
            # leader's: the members released onto it still gated there): confirmed first
            actions.append(ReleaseHold((), unconsumed=req.name))
            actions += lifecycle.release_hold(snap.capacity, req)
            actions += snap.backend.withdraw(req, why)
            events.append(Event("GrowthWithdrawn", why))
            continue
        if phase is AttemptPhase.STARTED or (mine and all(p.node_name for p in mine)):
            actions += lifecycle.release_hold(snap.capacity, req)
            if phase is not AttemptPhase.STARTED:
                actions.append(AnnotateRequest(req.name, {PHASE_ANNOTATION: STARTED}))
            continue
        watched = _watch_start(snap, req, mine, now)
        actions += watched.actions
        events += watched.events
        waits += [watched.requeue_after] if watched.requeue_after is not None else []
    return GroupDecision(
        actions=tuple(actions), events=tuple(events), requeue_after=min(waits, default=None)
    )


def _growth_attempt(
    snap: GroupSnapshot, req: ProvisioningRequest, mine: Sequence[Pod]
) -> lifecycle.Attempt:
    """The delivered growth as the start watchdog and its rollback read it: following the
    group's config now (`lifecycle.following`), what it asked (its reclaimer) the config it
    was made under (`Attempt.made`), as a gang's release is watched."""
    return lifecycle.Attempt(
        request=req,
        status=snap.backend.status_of(req),
        gang=gang_from_pods(snap.group, mine),
        capacity=snap.capacity,
        config=lifecycle.following(req, snap.config),
    )


def _watch_start(
    snap: GroupSnapshot, req: ProvisioningRequest, mine: Sequence[Pod], now: datetime
) -> lifecycle.Step:
    """The start watchdog of a growth delivered (Fulfilled) whose members bind: as a gang's
    (`podgroup.start_watch`), counted from their release onto it (`RELEASED_AT_ANNOTATION` on
    its request; one released by a version that did not record it is counted from now,
    recorded), within the startDeadlineSeconds of the config now (`_start_deadline`). Past it the
    growth is rolled back (`lifecycle.start_rollback`, StartDeadline): only what arrived for
    it and runs none of the group's pods is reclaimed, by the safe path (a node where a member
    of it is bound drains, reclaimed once idle); no member is touched. Before, a growth whose
    members never bound held what arrived for it for ever."""
    attempt = _growth_attempt(snap, req, mine)
    limit = _start_deadline(req, snap.config)
    released = parse_time(req.annotations.get(RELEASED_AT_ANNOTATION, ""))
    if released is None:
        stamp = AnnotateRequest(req.name, {RELEASED_AT_ANNOTATION: format_time(now)})
        return lifecycle.Step(Progress.WAITING, actions=(stamp,), requeue_after=float(limit))
    watched = podgroup.start_watch(released, mine, limit, now)
    if watched is None or isinstance(watched, float):
        return lifecycle.Step(Progress.WAITING, requeue_after=watched)
    step = lifecycle.start_rollback(attempt, watched, now=now)
    rolled_at = {START_ROLLED_AT_ANNOTATION: format_time(now)}  # the next one's backoff from
    return replace(
        step,
        actions=tuple(
            AnnotateRequest(a.name, {**a.annotations, **rolled_at})
            if isinstance(a, AnnotateRequest) and a.name == req.name
            else a
            for a in step.actions
        ),
    )


def _start_rollback(snap: GroupSnapshot, req: ProvisioningRequest) -> lifecycle.Step:
    """A growth its start watchdog rolls back: what arrived for it reclaimed by the safe path
    (`lifecycle.roll_back`, once: its outcome recorded), then the hold lifted from what stays
    (a node a member of it runs on, or kept by a safety rule)."""
    mine = [p for p in snap.members if p.live and p.consumes == req.name]
    if not _settled(req):
        return lifecycle.roll_back(_growth_attempt(snap, req, mine))
    return lifecycle.Step(Progress.ROLLED_BACK, actions=lifecycle.release_hold(snap.capacity, req))


def _rolled_back_on_start(snap: GroupSnapshot, req: ProvisioningRequest) -> GroupDecision:
    """What the group says of a growth its start watchdog rolled back (or is rolling back):
    the reason, and that its members' gates are lifted, so gangcheck cannot hold them back
    for another growth (as a gang's release rolled back gives up); once its outcome is
    recorded, a Warning GrowthRolledBack and RolledBack, once."""
    done = rollback.verdict(req)
    what = done.message if done is not None else f"rolling back {req.name} ({_reason(req)})"
    message = (
        f"released; {what}: the members released onto it keep their gates lifted, so gangcheck "
        "cannot hold them back for another growth; what arrived for it and runs none of the "
        "group's pods is reclaimed, no member is touched"
    )
    if done is None:  # said as it begins (RollbackStarted), written on the group meanwhile
        return _status(snap, RELEASED, message)
    said = _status(snap, RELEASED, message, warn="GrowthRolledBack")
    return replace(said, events=(*said.events, rollback.rolled_back(done))) if said.events else said


def _reason(req: ProvisioningRequest) -> str:
    return rollback.record_of(req).reason or "rolled back"


def _lowered(
    snap: GroupSnapshot,
    growing: Sequence[ProvisioningRequest],
    running: int,
    done: GroupDecision,
) -> GroupDecision:
    """minCount back at or below what runs: a growth not delivered is no longer needed."""
    pending = [r for r in growing if not r.deleting and not _delivered_phase(r) and not _settled(r)]
    if not pending:
        return done
    why = (
        f"minCount lowered to {snap.group.min_count}, at or below the {running} members "
        "running: the growth asked for is no longer needed"
    )
    return _with(done, _withdrawn(snap, pending, why, _status(snap, RELEASED, f"released; {why}")))


def _latest(
    snap: GroupSnapshot, growing: Sequence[ProvisioningRequest]
) -> tuple[int, ProvisioningRequest] | None:
    """The latest growth attempt: its number and its request."""
    numbered = [(int(r.name.rsplit("-", 1)[-1]), r) for r in growing if _is_growth(snap, r.name)]
    return max(numbered, key=lambda n: n[0], default=None)


def _request_name(snap: GroupSnapshot, number: int) -> str:
    group = snap.group
    return naming.fit(f"{group.ref.name}-{group.short}-grow", f"-{number}")


def _settled(req: ProvisioningRequest) -> bool:
    """Rolled back, its outcome recorded."""
    return OUTCOME_ANNOTATION in req.annotations


def _phase(req: ProvisioningRequest) -> AttemptPhase | None:
    return rollback.record_of(req).phase


def _delivered_phase(req: ProvisioningRequest) -> bool:
    """Its members were released onto it (binding or running): Fulfilled, Started, or its
    start watchdog rolling it back (`_start_rolled`, the outcome not recorded yet): neither in
    flight nor withdrawn as no longer needed meanwhile. Once rolled back, it is followed as
    any growth rolled back (the next after the backoff)."""
    if _phase(req) in (AttemptPhase.FULFILLED, AttemptPhase.STARTED):
        return True
    return _start_rolled(req) and not _settled(req)


def _start_rolled(req: ProvisioningRequest) -> bool:
    """Its rollback was begun by its start watchdog (`_watch_start`)."""
    return rollback.record_of(req).cause is RollbackCause.START_DEADLINE


def _fulfilled(req: ProvisioningRequest, now: datetime) -> tuple[Action, ...]:
    """`lifecycle.fulfilled`, with when the growth's members were released onto it
    (`RELEASED_AT_ANNOTATION` on its request), from which its start watchdog counts."""
    stamp = {RELEASED_AT_ANNOTATION: format_time(now)}
    return tuple(
        AnnotateRequest(a.name, {**a.annotations, **stamp}) if isinstance(a, AnnotateRequest) else a
        for a in lifecycle.fulfilled(req)
    )


def _members_of(req: ProvisioningRequest) -> int:
    recorded = count_of(req.annotations.get(GANG_MEMBERS_ANNOTATION))
    return sum(p.count for p in req.pod_sets) if recorded is None else recorded


def next_due(
    config: AtomicProvisioningSpec, number: int, req: ProvisioningRequest
) -> datetime | None:
    """When the growth after `req`, rolled back, may be asked: a rollback's backoff counted
    from the deadline it rolled back at, its fulfillment deadline, or for one its start
    watchdog rolled back (`_start_rolled`) from when it did (`START_ROLLED_AT_ANNOTATION`),
    which the fulfillment deadline, passed before its members were released, would leave no
    backoff at all. A startDeadlineSeconds edited after that rollback does not move it. A
    rollback a release before the stamp began (none written) counts from its release plus the
    startDeadlineSeconds it was made under (`lifecycle.made_under`): such a release judged it
    by that one, so rolled it back then, and counted the next growth's backoff from then too;
    the config now's would move it by every edit since (a raise to a day: a day's wait)."""
    since = rollback.deadline_of(req) or parse_time(req.creation_timestamp)
    if _start_rolled(req):
        rolled = parse_time(req.annotations.get(START_ROLLED_AT_ANNOTATION, ""))
        released = parse_time(req.annotations.get(RELEASED_AT_ANNOTATION, ""))
        if rolled is None and released is not None:
            made = lifecycle.made_under(req, config) or config
            rolled = released + timedelta(seconds=made.fulfillment.start_deadline_seconds)
        if rolled is not None:
            since = rolled if since is None else max(since, rolled)
    if since is None:
        return None
    return since + timedelta(seconds=lifecycle.backoff_seconds(number, config.retry_strategy))


def _start_deadline(req: ProvisioningRequest, config: AtomicProvisioningSpec | None) -> int:
    """The startDeadlineSeconds a delivered growth's start watchdog judges it by: the
    config's now (`lifecycle.following`)."""
    return lifecycle.following(req, config).fulfillment.start_deadline_seconds


def _others_held(snap: GroupSnapshot) -> ClusterView:
    """The capacity, counting nodes that arrived for this group's own requests as free."""
    capacity = snap.capacity or ClusterView()
    own = {request_key(r) for r in snap.requests}
    return replace(capacity, in_flight=capacity.in_flight - own)


def _released(annotations: Mapping[str, str]) -> int:
    """How many members the group released together (0: not recorded)."""
    return count_of(annotations.get(GANG_MEMBERS_ANNOTATION)) or 0


def _with(first: GroupDecision, second: GroupDecision) -> GroupDecision:
    return podgroup.merged(first, second)
