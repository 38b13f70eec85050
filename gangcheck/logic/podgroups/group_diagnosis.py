"""Why is this PodGroup's gang pending? The same chain as for a Workload, without Kueue.

Pure: the edge (``gangcheck.diagnose``) fetches the PodGroup, the pods naming it and the
objects around them; here ``gather_group`` reads them into ``GroupFacts`` (the group and the
state gangcheck keeps on it → its members, gated or not → the current attempt's
ProvisioningRequest → the fit on the nodes it may use) and replays the provisioner's decision
on them (``replay_group``: ``podgroup.decide`` on the GroupSnapshot ``group_snapshot_of``
builds, as the provisioner builds it from its caches). ``group_verdict`` names the one link
that blocks: the group and its members as read, the state the provisioner wrote, then what
the replayed decision does (releases, asks, waits for the members) or the step it returns.
``group_row`` condenses the same facts for ``gangcheck status``.

A released gang binding is said with its start deadline (``StartWatch``: its release
recorded on the group plus the startDeadlineSeconds of the config its request was made
under, ``podgroup.start_watch``'s), as a Workload's diagnosis says its own. A released group
that grew (growth.py) is said with its latest growth (``GrowthFacts``): in flight, what it
waits for, in the words a gang's request is said in (its name, the autoscaler's answer, the
fit of the gated members it asks for, its deadline, its rollback); rolled back, when the next
growth asks for them (its backoff); delivered, how long its start watchdog leaves the members
released onto it (the same ``StartWatch``, from the release recorded on its request), and
that the gated members minCount added beyond it wait until they are all bound; once the
watchdog rolls it back (StartDeadline), that, with what its rollback reclaimed or kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from gangcheck.logic.attempt import lifecycle, naming, rollback, topup
from gangcheck.logic.attempt.actions import Action, AnnotateRequest, ReleaseMembers
from gangcheck.logic.attempt.explain import (
    GangRow,
    Placement,
    RequestFacts,
    Verdict,
    World,
    as_decided,
    attempt_phase,
    deleting_verdict,
    ended_verdict,
    fit_verdict,
    human_duration,
    moved_deadlines,
    node_names,
    nodes_needed,
    recorded_for,
    request_facts,
    step_verdict,
    until,
)
from gangcheck.logic.attempt.fulfillment import dra_hint
from gangcheck.logic.attempt.lifecycle import Progress
from gangcheck.logic.attempt.records import AttemptPhase, RollbackCause, count_of, kept_restated
from gangcheck.logic.podgroups import growth, podgroup
from gangcheck.logic.podgroups.gating import OPT_IN_VALUE, gated_at, group_of
from gangcheck.logic.podgroups.group_snapshot import config_serving, group_snapshot_of
from gangcheck.logic.podgroups.podgroup import (
    BACKING_OFF,
    BLOCKED,
    FAILED,
    GAVE_UP,
    NOT_A_GANG,
    PROVISIONING,
    RELEASED,
    SETTLE_SECONDS,
    WAITING,
    GroupSnapshot,
)
from gangcheck.logic.sources.provreq import PROVISIONING_REQUEST
from gangcheck.logic.sources.world import capacity_of, place_in
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.names import (
    CONFIG_ANNOTATION,
    GANG_MEMBERS_ANNOTATION,
    GROUP_UID_ANNOTATION,
    KEPT_FROM_ANNOTATION,
    MESSAGE_ANNOTATION,
    NEXT_ATTEMPT_ANNOTATION,
    OPT_IN_LABEL,
    PHASE_ANNOTATION,
    RELEASED_AT_ANNOTATION,
    REQUEST_ANNOTATION,
    ROLLBACK_REASON_ANNOTATION,
    ROLLING_BACK,
    STARTED,
    STATE_ANNOTATION,
    UNGATED_ANNOTATION,
)
from gangcheck.model.objects import Obj, Pod, ProvisioningRequest, pod_of, request_of
from gangcheck.model.podgroups import UPSTREAM, PodGroup, pod_group_of
from gangcheck.model.provisioning_config import AtomicProvisioningSpec

GroupKey = tuple[str, str, str]
"""(namespace, API group, name) of a PodGroup."""

NAMES_SHOWN = 5
ROLLBACK = (Progress.ROLLING_BACK, Progress.ROLLED_BACK)
"""A rollback the replayed decision starts or runs (the start watchdog's, once released)."""


# ---- facts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemberFacts:
    """The pods naming the group that still count: neither finished nor being deleted."""

    exist: int = 0
    min_count: int = 0
    gated: tuple[str, ...] = ()
    """Held by gangcheck's scheduling gate."""
    bound: tuple[str, ...] = ()
    ungated: tuple[str, ...] = ()
    """Without the gate: released by gangcheck, or never gated (the webhook did not run)."""
    stripped: tuple[str, ...] = ()
    """Of `ungated`, those the webhook stamped gated (gangcheck.io/gated-at): their gate was
    removed since, by a release or by someone else."""
    newest: datetime | None = None
    """When the newest member was created."""
    unschedulable: str = ""
    """What kube-scheduler last said of an unbound member it could not place (its
    PodScheduled=False condition), "" when it said nothing."""

    @property
    def unbound(self) -> int:
        return self.exist - len(self.bound)


@dataclass(frozen=True)
class GroupReplay:
    """The decision `podgroup.decide` makes for the group now, on the GroupSnapshot the
    provisioner would read (built by the same function, from the live read)."""

    progress: Progress | None = None
    """Where the attempt it followed stands (None: it followed none)."""
    message: str = ""
    """The step's message, else the group's message after the decision."""
    state: str = ""
    """The group's state after the decision (written now, or kept)."""
    asks: bool = False
    """The decision asks for capacity: no request exists for the attempt yet."""
    releases: bool = False
    """The decision lifts the gang's gates (it fits on nodes that exist)."""
    waits: bool = False
    """The decision only waits (members still being created, read once they settle)."""
    deadlines: Mapping[str, datetime] = field(default_factory=dict)
    """The deadlines it moves requests to (deadlineSeconds changed under the attempt)."""
    rollbacks: Mapping[str, str] = field(default_factory=dict)
    """The rollbacks it begins now, by request: the reason it records (a growth's start
    watchdog's, which its step does not carry)."""


def replay_group(snap: GroupSnapshot, now: datetime) -> GroupReplay:
    """`decide` on the snapshot, as a diagnosis reads it."""
    decision = growth.decide(snap, now)  # a running group's growth too (growth.py)
    status, notes, step = decision.status or {}, snap.group.annotations, decision.step
    said = status.get(MESSAGE_ANNOTATION, notes.get(MESSAGE_ANNOTATION, ""))
    return GroupReplay(
        progress=step.progress if step is not None else None,
        message=(step.message if step is not None and step.message else "") or said,
        state=status.get(STATE_ANNOTATION, notes.get(STATE_ANNOTATION, "")),
        asks=any(note.outcome == "asked" for note in decision.sources),
        releases=any(isinstance(a, ReleaseMembers) for a in decision.actions),
        waits=not (decision.status or decision.actions) and decision.requeue_after is not None,
        deadlines=moved_deadlines(decision.actions),
        rollbacks=_rollbacks_begun(decision.actions),
    )


def _rollbacks_begun(actions: Sequence[Action]) -> dict[str, str]:
    """The reasons of the rollbacks a decision begins, by request (`rollback.start` records
    its reason on the request)."""
    return {
        a.name: a.annotations[ROLLBACK_REASON_ANNOTATION]
        for a in actions
        if isinstance(a, AnnotateRequest) and ROLLBACK_REASON_ANNOTATION in a.annotations
    }


def _config_of(
    group: PodGroup,
    req: ProvisioningRequest | None,
    world: World,
    labels: Mapping[str, str] | None,
) -> tuple[AtomicProvisioningSpec | None, str]:
    """The config the provisioner decides under: the one the group names, if it serves the
    namespace (`labels`, None: not read); else the one the attempt in flight recorded (the
    provisioner's default when it was made: its setting is not readable here); else the
    defaults."""
    name = group.annotations.get(CONFIG_ANNOTATION, "")
    if name:
        ns = group.ref.namespace
        return config_serving(name, world.configs.get, namespace=ns, labels=labels)
    recorded = lifecycle.recorded_config(req) if req is not None else None
    return recorded or AtomicProvisioningSpec(), ""


@dataclass(frozen=True)
class StartWatch:
    """Members released together onto a request (the gang's, or a growth's) while they bind:
    the start watchdog (`podgroup.start_watch`) rolls it back unless they are all bound
    within the startDeadlineSeconds of the config it was made under, counted from their
    release."""

    phase: str = ""
    """The phase recorded on the request (Fulfilled while its members bind)."""
    members: tuple[str, ...] = ()
    """The members released onto it that still count (consuming its request)."""
    bound: tuple[str, ...] = ()
    released_at: datetime | None = None
    """When its members were released onto it (None: not recorded; a growth's is recorded
    at gangcheck's next look)."""
    start_deadline_seconds: int = 0
    """fulfillment.startDeadlineSeconds of the config it was made under."""
    rolled_back: str = ""
    """Why its start watchdog rolls it back: the reason recorded on its request, or the one
    the replayed decision records now ("": it does not)."""

    @property
    def start_deadline(self) -> datetime | None:
        """When its start watchdog rolls it back unless its members are all bound."""
        if self.released_at is None:
            return None
        return self.released_at + timedelta(seconds=self.start_deadline_seconds)

    @property
    def watched(self) -> bool:
        """Its start watchdog counts: members of it unbound, not started, not rolled back."""
        waiting = len(self.bound) < len(self.members)
        settled = self.phase in (STARTED, ROLLING_BACK) or self.rolled_back
        return waiting and not settled


def start_watch_of(
    req: ProvisioningRequest,
    live: Sequence[Pod],
    config: AtomicProvisioningSpec | None,
    released_at: datetime | None,
    rolled_back: str = "",
) -> StartWatch:
    """The start watchdog of the members released onto `req` (those of `live` consuming it),
    its deadline the one the controller judges it by (`lifecycle.following`: the gang's
    config now, else the one it was made under)."""
    mine = [p for p in live if p.consumes == req.name]
    follows = lifecycle.following(req, config)
    return StartWatch(
        phase=req.annotations.get(PHASE_ANNOTATION, ""),
        members=tuple(p.name for p in mine),
        bound=tuple(p.name for p in mine if p.node_name),
        released_at=released_at,
        start_deadline_seconds=follows.fulfillment.start_deadline_seconds,
        rolled_back=rolled_back,
    )


@dataclass(frozen=True)
class GrowthFacts:
    """The group's latest growth (growth.py): in flight for the gated members minCount
    added, delivered (its members released onto it: binding, started, or rolled back by its
    start watchdog), or rolled back before, the next in its backoff."""

    request: RequestFacts
    """Its request (`attempt`: the growth's number)."""
    watch: StartWatch = StartWatch()
    """Once delivered: its members and its start watchdog."""
    delivered: bool = False
    """Its members were released onto it."""
    asks: tuple[str, ...] = ()
    """In flight, or rolled back: the gated members it asks (asked) for."""
    gated: tuple[str, ...] = ()
    """The gated members that wait on it: those it asks for, then those minCount added
    beyond it (`beyond`)."""
    placement: Placement | None = None
    """In flight: the fit of the members it asks for on the nodes that exist."""
    next_at: datetime | None = None
    """Rolled back (not by its start watchdog), members still gated: when the next growth is
    asked (its backoff), None once backoffLimitCount allows none (`no_more`) or at once."""
    no_more: bool = False
    """Rolled back, and backoffLimitCount allows no more growth."""

    @property
    def in_flight(self) -> bool:
        """Asked, its members not released onto it yet, not rolled back."""
        return not self.delivered and not self.request.outcome

    @property
    def beyond(self) -> tuple[str, ...]:
        """The gated members minCount added beyond those it asks (asked) for."""
        return tuple(n for n in self.gated if n not in self.asks)


@dataclass(frozen=True)
class GroupFacts:
    namespace: str
    name: str
    api_group: str = UPSTREAM
    found: bool = True
    served: bool = True
    """The API server serves PodGroups of `api_group`."""
    api_version: str = ""
    min_count: int = 0
    is_gang: bool = True
    problem: str = ""
    deleting: bool = False
    topology_key: str = ""
    created: datetime | None = None
    state: str = ""
    """gangcheck.io/state; "" when gangcheck has not acted on the group."""
    message: str = ""
    attempt: int = 1
    request_name: str = ""
    """The request of the current attempt (once released: the one the members consume)."""
    next_attempt_at: datetime | None = None
    reported_ungated: tuple[str, ...] = ()
    config: str = ""
    """The AtomicProvisioningConfig the group names ("" = the controller's default)."""
    opted_in: bool | None = None
    """The namespace carries the webhook's opt-in label (None: not known)."""
    members: MemberFacts = MemberFacts()
    request: RequestFacts | None = None
    placement: Placement | None = None
    hint: str = ""
    """Said after an autoscaler's answer: why it cannot help (DRA claims)."""
    released_together: int | None = None
    """Once released: how many members were released together (the gang gangcheck read)."""
    late: tuple[str, ...] = ()
    """Gated members created after the gang was read: no part of its request."""
    replay: GroupReplay | None = None
    """The provisioner's decision for the group, replayed on what was read."""
    given_nodes: int = 0
    """Once released: the nodes recorded as arrived for its request, none older than it
    (`recorded_for`)."""
    growth: GrowthFacts | None = None
    """Once released: its latest growth (`growth_facts`), if any."""
    start: StartWatch | None = None
    """Once released: the start watchdog of the gang released together (on its request)."""

    @property
    def kind(self) -> str:
        return "PodGroup" if self.api_group == UPSTREAM else f"PodGroup.{self.api_group}"


def members_by_group(pods: Iterable[Obj]) -> dict[GroupKey, list[Pod]]:
    """The pods that name a PodGroup, by (namespace, API group, name), as the logic reads
    them."""
    out: dict[GroupKey, list[Pod]] = {}
    for pod in pods:
        ref = group_of(pod)
        if ref is not None:
            view = pod_of(pod)
            out.setdefault((view.ref.namespace, ref.api_group, ref.name), []).append(view)
    return out


def gather_group(
    obj: Obj | None,
    members: Sequence[Pod],
    world: World,
    *,
    namespace: str,
    name: str,
    api_group: str = UPSTREAM,
    served: bool = True,
    opted_in: bool | None = None,
    namespace_labels: Mapping[str, str] | None = None,
    now: datetime,
) -> GroupFacts:
    """Everything the chain needs about one PodGroup (`obj`, None when it does not exist)
    and the pods naming it; the decision the provisioner makes for it now, replayed on them
    (`replay`). `namespace_labels`: its namespace's (None: not read; a config's
    namespaceSelector is then not applied)."""
    live = sorted((p for p in members if p.live), key=lambda p: p.name)
    if obj is None:
        return GroupFacts(
            namespace,
            name,
            api_group,
            found=False,
            served=served,
            opted_in=opted_in,
            members=_member_facts(live, 0),
        )
    group = pod_group_of(obj)
    notes = group.annotations
    state = notes.get(STATE_ANNOTATION, "")
    attempt = podgroup.attempt_of(group)
    current = _latest_ask(world, group, attempt)
    recorded = notes.get(REQUEST_ANNOTATION, "")  # the latest capacity source's, once asked
    name_of_request = recorded if state == RELEASED or recorded else current
    req = _request(world, group.ref.namespace, name_of_request, group.ref.uid)
    request = None
    if req is not None or (state == PROVISIONING and name_of_request):
        request = request_facts(req, name_of_request, attempt, node_names(world))
    unbound = [p for p in live if not p.node_name]
    placement, hint = None, ""
    late = _late_members(unbound, req, released=state == RELEASED)
    if (
        group.is_gang
        and not group.problem
        and unbound
        and len(live) >= group.min_count
        and state not in (RELEASED, NOT_A_GANG)
    ):
        ours = podgroup.attempt_members(unbound, req) if req is not None else unbound
        gang = podgroup.gang_from_pods(group, ours)
        fitted_in, kept = world, _kept(world, req)
        if kept:  # topping kept arrivals up: fitted on their nodes and its own, as decided
            gang = topup.tolerating(gang, kept)
            gone = {topup.key_of(r) for r in kept}
            left = tuple(r for r in world.requests if topup.key_of(request_of(r)) not in gone)
            fitted_in = replace(world, requests=left)
        placement = place_in(fitted_in, gang, group.ref.namespace, req, now)
        hint = dra_hint(PROVISIONING_REQUEST.status_of(req), gang) if req is not None else ""
    meta = obj.get("metadata") or {}
    config = _config_of(group, req, world, namespace_labels)
    snap = group_snapshot_of(
        group,
        members,
        config=config,
        requests=world.requests,
        capacity=capacity_of(world),
        max_members=GroupSnapshot.max_members,
        opted_in=bool(opted_in),
    )
    decided = replay_group(snap, now)
    exists = node_names(world)  # what a rollback kept, as it is now (gone since, said so)
    decided = replace(decided, message=kept_restated(decided.message, exists))
    return GroupFacts(
        namespace=group.ref.namespace,
        name=group.ref.name,
        api_group=group.api_group,
        served=served,
        api_version=group.ref.api_version,
        min_count=group.min_count,
        is_gang=group.is_gang,
        problem=group.problem,
        deleting=group.deleting,
        topology_key=group.topology_key,
        created=parse_time(str(meta.get("creationTimestamp") or "")),
        state=state,
        message=kept_restated(notes.get(MESSAGE_ANNOTATION, ""), exists),
        attempt=attempt,
        request_name=name_of_request,
        # kept on the group once the next attempt runs: said only while it backs off
        next_attempt_at=parse_time(notes.get(NEXT_ATTEMPT_ANNOTATION, ""))
        if state == BACKING_OFF
        else None,
        reported_ungated=tuple(filter(None, notes.get(UNGATED_ANNOTATION, "").split(","))),
        config=notes.get(CONFIG_ANNOTATION, ""),
        opted_in=opted_in,
        members=_member_facts(live, group.min_count),
        request=as_decided(request, decided.deadlines),
        placement=placement,
        hint=hint,
        released_together=count_of(notes.get(GANG_MEMBERS_ANNOTATION)),
        late=late,
        replay=decided,
        given_nodes=(
            recorded_for(
                world.nodes,
                group.ref.namespace,
                name_of_request,
                req.creation_timestamp if req is not None else None,
            )
            if state == RELEASED and name_of_request
            else 0
        ),
        growth=(
            growth_facts(group, live, world, config[0], decided, now=now)
            if state == RELEASED
            else None
        ),
        start=(
            start_watch_of(
                req,
                live,
                config[0],
                parse_time(notes.get(RELEASED_AT_ANNOTATION, "")),
                decided.rollbacks.get(req.name, ""),  # its watchdog's rollback, begun now
            )
            if state == RELEASED and req is not None
            else None
        ),
    )


def growth_facts(
    group: PodGroup,
    live: Sequence[Pod],
    world: World,
    config: AtomicProvisioningSpec | None,
    decided: GroupReplay,
    *,
    now: datetime,
) -> GrowthFacts | None:
    """The group's latest growth request (`<group>-<kind>-grow-<n>`, made for this group):
    in flight (the gated members it asks for, their fit), delivered (its members released
    onto it: Fulfilled, Started) or rolled back by its start watchdog (StartDeadline: recorded
    on it, or begun by the replayed decision `decided`), or rolled back for another reason
    while members minCount added wait gated (when the next growth is asked); None else."""
    ns, uid = group.ref.namespace, group.ref.uid
    growths = []
    for obj in world.requests:
        name = str((obj.get("metadata") or {}).get("name") or "")
        req = _request(world, ns, name, uid)
        tail = name.rsplit("-", 1)[-1]
        if req is not None and growth.GROWS_ANNOTATION in req.annotations and tail.isdigit():
            growths.append((int(tail), req))
    if not growths:
        return None
    number, req = max(growths, key=lambda g: g[0])
    record = rollback.record_of(req)
    begun = decided.rollbacks.get(req.name, "")
    watchdog = record.cause is RollbackCause.START_DEADLINE or (
        RollbackCause.of(begun) is RollbackCause.START_DEADLINE
    )
    delivered = record.phase in (AttemptPhase.FULFILLED, AttemptPhase.STARTED)
    gated = [p for p in live if p.gated and not p.node_name]
    loose = {p.name for p in podgroup.loose_members(live)} if gated else set()
    running = [p for p in live if not p.gated and p.name not in loose]
    if group.min_count <= len(running):
        gated = []  # no growth needed: members gated now are late ones, not the growth's
    facts = GrowthFacts(
        request=request_facts(req, req.name, number, node_names(world)),
        delivered=delivered or watchdog,
        gated=tuple(p.name for p in sorted(gated, key=lambda p: (p.created, p.name))),
    )
    if delivered or watchdog:
        released = parse_time(req.annotations.get(RELEASED_AT_ANNOTATION, ""))
        why = (record.reason or begun) if watchdog else ""
        facts = replace(facts, watch=start_watch_of(req, live, config, released, why))
        if watchdog and facts.request.outcome and gated:  # the next growth after its backoff
            return _next_growth(facts, number, req, config)
        return facts
    if not gated:
        return None  # rolled back or withdrawn, no member waiting on it
    asks = podgroup.attempt_members(gated, req)
    facts = replace(facts, asks=tuple(p.name for p in asks))
    if facts.in_flight:
        gang = podgroup.gang_from_pods(group, asks)
        return replace(facts, placement=place_in(world, gang, ns, req, now))
    return _next_growth(facts, number, req, config)


def _next_growth(
    facts: GrowthFacts,
    number: int,
    req: ProvisioningRequest,
    config: AtomicProvisioningSpec | None,
) -> GrowthFacts:
    """A growth rolled back, members gated waiting: when growth.py asks the next (after the
    backoff of the rollback, at once after ConfigChanged), or that backoffLimitCount allows
    none."""
    now_config = config or lifecycle.recorded_config(req)  # as growth.py follows it
    if now_config is None:
        return facts
    if lifecycle.next_attempt(number, now_config.retry_strategy) is None:
        return replace(facts, no_more=True)
    if RollbackCause.of(rollback.record_of(req).reason or "") is RollbackCause.CONFIG_CHANGED:
        return facts  # the next asks at once, under the config now
    return replace(facts, next_at=growth.next_due(now_config, number, req))


def _late_members(
    unbound: Sequence[Pod], req: ProvisioningRequest | None, *, released: bool
) -> tuple[str, ...]:
    """Gated members created after the gang was read: once released, the gated ones; while
    a request is in flight, those beyond the members it was made for."""
    if released:
        return tuple(p.name for p in unbound if p.gated)
    if req is None:
        return ()
    ours = {p.name for p in podgroup.attempt_members(unbound, req)}
    return tuple(p.name for p in unbound if p.gated and p.name not in ours)


def _member_facts(live: Sequence[Pod], min_count: int) -> MemberFacts:
    return MemberFacts(
        exist=len(live),
        min_count=min_count,
        gated=tuple(p.name for p in live if p.gated),
        bound=tuple(p.name for p in live if p.node_name),
        ungated=tuple(p.name for p in live if not p.gated),
        stripped=tuple(p.name for p in live if not p.gated and gated_at(p.raw) is not None),
        newest=max(filter(None, (parse_time(p.created) for p in live)), default=None),
        unschedulable=next(
            (said for p in live if not p.node_name and not p.gated and (said := _unschedulable(p))),
            "",
        ),
    )


def _unschedulable(pod: Pod) -> str:
    """kube-scheduler's word on a pod it could not place: its PodScheduled=False condition."""
    conditions = (pod.raw.get("status") or {}).get("conditions") or []
    for c in conditions:
        # SchedulingGated is the API server's word for a gate (left until the scheduler looks)
        if (
            c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") != "SchedulingGated"
        ):
            reason, message = c.get("reason") or "", c.get("message") or ""
            return f"{pod.name}: {reason}: {message}" if message else f"{pod.name}: {reason}"
    return ""


def _kept(world: World, req: ProvisioningRequest | None) -> tuple[ProvisioningRequest, ...]:
    """The requests whose kept arrivals `req` tops up (logic/attempt/topup.py)."""
    if req is None:
        return ()
    names = {n for n in req.annotations.get(KEPT_FROM_ANNOTATION, "").split(",") if n}
    found = (request_of(o) for o in world.requests)
    return tuple(r for r in found if r.ref.namespace == req.ref.namespace and r.name in names)


def _latest_ask(world: World, group: PodGroup, attempt: int) -> str:
    """The request of the attempt in flight, as a Workload's diagnosis reads its check's: the
    latest ask of the attempt that exists (InOrder's next source; in a race, the racer given
    the place of one that failed), else the first ask's name. A race records no request on
    the group, and its first racer may be gone: read from it, the config would be the
    default's and the replay a wrong one."""
    ns, uid = group.ref.namespace, group.ref.uid
    names = {
        str((obj.get("metadata") or {}).get("name"))
        for obj in world.requests
        if (obj.get("metadata") or {}).get("namespace") == ns
        and _request(world, ns, str((obj.get("metadata") or {}).get("name")), uid) is not None
    }
    return naming.current_request(names, group.ref.name, group.short, attempt)[0]


def _request(world: World, namespace: str, name: str, uid: str) -> ProvisioningRequest | None:
    """The request of that name gangcheck made for this group (not for an earlier one of the
    same name)."""
    if not name:
        return None
    for obj in world.requests:
        meta = obj.get("metadata") or {}
        if meta.get("namespace") != namespace or meta.get("name") != name:
            continue
        made_for = (meta.get("annotations") or {}).get(GROUP_UID_ANNOTATION)
        if not made_for or not uid or made_for == uid:
            return request_of(obj)
    return None


# ---- the verdict -------------------------------------------------------------------------


def group_verdict(facts: GroupFacts, now: datetime) -> Verdict:
    """THE reason the gang is not running: the first broken link of the chain."""
    return (
        _group_verdict(facts)
        or _settled_verdict(facts, now)
        or _with_ungated(facts, _members_verdict(facts) or _attempt_verdict(facts, now))
    )


def _group_verdict(f: GroupFacts) -> Verdict | None:
    gated, m = f.members.gated, f.members
    if not f.served:
        held = f"; {_name_it(len(gated), 'gated ')} ({_pods(gated)})" if gated else ""
        return Verdict(True, "group", f"this cluster does not serve {f.api_group} PodGroups{held}")
    if not f.found:
        held = ""
        if gated:
            held = f"; {_name_it(len(gated), 'gated ', waiting=True)} ({_pods(gated)})"
        elif m.exist:
            held = f"; {_name_it(m.exist)} ({_pods(m.ungated)})"
        return Verdict(True, "group", f"PodGroup not found{held}")
    if f.deleting:
        return Verdict(False, "group", "the PodGroup is being deleted")
    if f.problem:
        return Verdict(True, "group", f"invalid PodGroup: {f.problem}")
    return None


def _name_it(count: int, kind: str = "", *, waiting: bool = False) -> str:
    """`1 gated member names it (and waits for it)`, `2 gated members name it (and wait for
    it)`."""
    if count == 1:
        return f"1 {kind}member names it" + (" and waits for it" if waiting else "")
    return f"{count} {kind}members name it" + (" and wait for it" if waiting else "")


def _settled_verdict(f: GroupFacts, now: datetime) -> Verdict | None:
    """States the controller stays in until someone acts (or the gang is done)."""
    if not f.is_gang or f.state == NOT_A_GANG:
        return Verdict(
            False, "group", "not a gang (no gang policy): its members are released as they come"
        )
    if f.state == GAVE_UP:
        message = f.message or f"gave up after attempt {f.attempt}"
        if not message.startswith("gave up"):
            message = f"gave up after attempt {f.attempt}: {message}"
        return Verdict(True, "gave up", message)
    if f.state == FAILED:
        return Verdict(True, "group", f"failed: {f.message or 'no message'}")
    if f.state == BLOCKED:
        return Verdict(True, "config", f"blocked by the config: {f.message or 'no message'}")
    if f.state == RELEASED:
        return _released_verdict(f, now)
    return None


def _released_verdict(f: GroupFacts, now: datetime) -> Verdict:
    m, req, done, grown = f.members, f.request, f.replay, f.growth
    # the replayed step is the growth's while one is in flight, unless the gang's own rolls back
    flying = grown is not None and grown.in_flight
    own = req is not None and (
        req.phase == ROLLING_BACK or req.name in (done or GroupReplay()).rollbacks
    )
    if req is not None and done is not None and done.progress in ROLLBACK and (own or not flying):
        why = req.rollback_reason or done.message  # the start watchdog's rollback
        outcome = f"; {req.outcome_line}" if req.outcome else ""
        return Verdict(
            True, "release", f"released, but rolling back attempt {f.attempt}: {why}{outcome}"
        )
    if grown is not None and grown.watch.rolled_back and not grown.request.outcome:
        return Verdict(
            True,
            "release",
            f"released, but rolling back growth {grown.request.name}: {grown.watch.rolled_back}",
        )
    if not m.exist:
        return Verdict(False, "release", "released; the gang has no members left")
    out = m.exist - len(m.gated)
    together = f.released_together if f.released_together is not None else out
    head = f"released: {together} member{'s' if together != 1 else ''} released together"
    if out > together:
        head += f", {out - together} more since"
    if grown is not None and grown.asks:  # in flight, or rolled back: what it waits for
        return Verdict(True, "release", f"{head}; {_growth_waits(f, grown, now)}")
    binding = m.unbound - len(m.gated)
    watching = _start_watch(grown.watch if grown else None, now, growth=grown)
    if grown is not None and grown.gated and grown.delivered and not grown.watch.rolled_back:
        return Verdict(True, "release", f"{head}{watching}; {_beyond(grown)}")
    if grown is not None and grown.gated and grown.watch.rolled_back:  # minCount raised since
        count = len(grown.gated)
        since = f"{count} gated member{'s' if count != 1 else ''} minCount added since"
        return Verdict(
            True,
            "release",
            f"{head}{_growth_rolled_back(grown)}; {since} ({_names(grown.gated)})"
            f"{_next_words(grown, now, count)}",
        )
    if m.gated and binding:
        one = len(m.gated) == 1
        return Verdict(
            True,
            "release",
            f"{head}{_start_watch(f.start, now)}; kube-scheduler starts a PodGroup only when "
            f"none of its members is gated, and {len(m.gated)} still {'is' if one else 'are'} "
            f"({_names(m.gated)}): gangcheck releases {'it' if one else 'them'} at once while "
            "the gang binds (is the controller running?)",
        )
    if m.gated:
        return Verdict(True, "release", f"{head}; {_late(f)}")
    rolled = _growth_rolled_back(grown)
    if not m.unbound:
        return Verdict(False, "release", f"{head}, all bound{rolled}")
    said = f": kube-scheduler says {m.unschedulable}" if m.unschedulable else ""
    return Verdict(
        bool(said or rolled),
        "release",
        f"{head}{rolled}; {len(m.bound)} of {m.exist} bound so far (kube-scheduler's turn)"
        f"{_start_watch(f.start, now, of=m.unbound)}{watching}{said}",
    )


def _growth_waits(f: GroupFacts, grown: GrowthFacts, now: datetime) -> str:
    """What a growth in flight waits for, as a gang's request is said (`step_verdict`); one
    rolled back: when the next growth asks for the members it asked for."""
    count, asks, beyond = len(grown.gated), grown.asks, grown.beyond
    later = f"; {_names(beyond)} once it has started" if beyond else ""
    added = f"gated member{'s' if count != 1 else ''} minCount {f.min_count} added"
    which = f"the {count} {added}" if len(asks) == count else f"{len(asks)} of the {count} {added}"
    name, req = grown.request.name, grown.request
    if not grown.in_flight:
        asked = f"growth {name} asked for {which} ({_names(asks)}{later}) and was rolled back"
        asked += f" ({req.rollback_reason})" if req.rollback_reason else ""
        return f"{asked}{_next_words(grown, now, count)}"
    asking = f"growth {name} asks for {which} ({_names(asks)}{later})"
    done = f.replay or GroupReplay()
    if done.progress in ROLLBACK:
        ended = ended_verdict(req)
        why = req.rollback_reason or (ended.reason if ended else "") or done.message
        outcome = f"; {req.outcome_line}" if req.outcome else ""
        return f"{asking}: rolling back: {why}{outcome}"
    said = step_verdict(
        done.progress,
        done.message,
        req,
        now,
        fits=lambda: Verdict(
            True,
            "release",
            f"{name} is Provisioned and they fit; waiting for gangcheck to release them (is "
            "the controller running?)",
        ),
        provisioned=lambda deadline: fit_verdict(grown.placement, req, deadline),
        waiting=lambda accepted, eta, deadline: _waiting_verdict(
            req, accepted, eta, deadline, placement=grown.placement
        ),
    )
    return f"{asking}: {said.reason if said else done.message or 'no message'}"


def _next_words(grown: GrowthFacts, now: datetime, count: int = 2) -> str:
    """A growth rolled back: when the next growth asks for the `count` members gated."""
    them = "it" if count == 1 else "them"
    if grown.no_more:
        stay = "it stays" if count == 1 else "they stay"
        return f": backoffLimitCount allows no more growth, {stay} gated"
    if grown.next_at is not None and grown.next_at > now:
        wait = human_duration((grown.next_at - now).total_seconds())
        return f": the next growth asks for {them} in {wait}, after its backoff"
    return f": the next growth asks for {them} now (is the controller running?)"


def _beyond(grown: GrowthFacts) -> str:
    """Gated members minCount added beyond a growth delivered: none is released alone; the
    next growth asks for them once the members released onto it are all bound."""
    count = len(grown.gated)
    them = "it" if count == 1 else "them"
    who = f"{count} gated member{'s' if count != 1 else ''} beyond it ({_names(grown.gated)})"
    if not grown.watch.watched:  # its members bound: the next growth is asked at once
        who = who.replace("beyond it", f"beyond growth {grown.request.name}")
        return f"{who}: the next growth asks for {them} now (is the controller running?)"
    return (
        f"{who} wait{'s' if count == 1 else ''} until they are all bound, then the next growth "
        f"asks for {them}"
    )


def _growth_rolled_back(grown: GrowthFacts | None) -> str:
    """A growth its start watchdog rolled back: why, and what its rollback did."""
    if grown is None or not grown.watch.rolled_back:
        return ""
    return (
        f"; growth {grown.request.name} was rolled back: {grown.watch.rolled_back}; "
        f"{grown.request.outcome_line}"
    )


def _start_watch(
    watch: StartWatch | None, now: datetime, *, growth: GrowthFacts | None = None, of: int = 0
) -> str:
    """Members released together binding: how long the start watchdog leaves them, as a
    Workload's start deadline is said (`until`). A growth's names it; the gang's own is said
    after the count of its members bound (`of`: the members unbound said there), naming
    those released together when others are unbound too."""
    if watch is None or not watch.watched:
        return ""
    when = until("start deadline", watch.start_deadline, now)
    if watch.start_deadline is None:
        if growth is None:
            return ""  # not recorded by an older version: the gang's watchdog does not count
        when = ", its start deadline counted from gangcheck's next look"
    when += ", rolled back unless all are by then"
    members = len(watch.members)
    counted = f"{len(watch.bound)} of the {members} member{'s' if members != 1 else ''} released "
    if growth is not None:
        return f"; growth {growth.request.name}: {counted}onto it bound{when}"
    if members - len(watch.bound) == of:
        return when
    return f"; {counted}together bound{when}"


def _late(f: GroupFacts) -> str:
    """Why members created after the gang was read are still gated."""
    late = f.members.gated
    said = f.message.removeprefix("released; ")
    if said != f.message and ("wait for room" in said or "stay gated" in said):
        return f"{said} ({_pods(late)})"
    return (
        f"{len(late)} member(s) created since are still gated ({_names(late)}); gangcheck "
        "releases each once the gang is bound and it fits on nodes that exist (is the "
        "controller running?)"
    )


def _not_gated_cause(f: GroupFacts) -> str:
    if f.opted_in is False:
        return f"namespace {f.namespace} is not opted in, no label {OPT_IN_LABEL}={OPT_IN_VALUE}"
    return "the webhook may be down"


def _not_gated(f: GroupFacts) -> str:
    """Which members carry no gate and why, as far as each pod tells (gating.ungated_cause):
    never gated, or the gate removed after the webhook added it."""
    never = [n for n in f.members.ungated if n not in f.members.stripped]
    said = [f"{_not_gated_cause(f)} ({_pods(never)})"] if never else []
    if f.members.stripped:
        said.append(f"the gate removed after the webhook added it ({_pods(f.members.stripped)})")
    return "members not gated: " + "; ".join(said)


def _members_verdict(f: GroupFacts) -> Verdict | None:
    m = f.members
    if m.ungated and not m.gated:
        return Verdict(True, "gate", _not_gated(f))
    if m.exist < f.min_count:
        return Verdict(True, "members", f"waiting for members: {m.exist} of {f.min_count} exist")
    return None


def _with_ungated(f: GroupFacts, found: Verdict) -> Verdict:
    """Before release, members without the gate are scheduled one by one: said after any
    other reason."""
    ungated = f.members.ungated
    if not ungated or not f.members.gated:
        return found
    tail = f"; {_not_gated(f)}"
    return Verdict(found.blocked, found.step, found.reason + tail)


def _attempt_verdict(f: GroupFacts, now: datetime) -> Verdict:
    if not f.state and (f.request is None or not f.request.found):
        done = "set no state on" if f.reported_ungated else "not acted on"
        return Verdict(
            True,
            "controller",
            f"gangcheck has {done} the PodGroup yet (no {STATE_ANNOTATION} annotation); "
            "is the controller running with the PodGroup provisioner?",
        )
    if f.state == BACKING_OFF and f.next_attempt_at is not None and f.next_attempt_at > now:
        wait = human_duration((f.next_attempt_at - now).total_seconds())
        _, _, why = f.message.partition(": ")
        return Verdict(
            True,
            "backoff",
            f"backing off: attempt {f.attempt} starts in {wait}" + (f"; {why}" if why else ""),
        )
    req, decided = f.request, f.replay or GroupReplay(state=f.state, message=f.message)
    if req is None or not req.found:
        return _no_request_verdict(f, decided)
    if req.deleting:
        return deleting_verdict(req, now)
    said = step_verdict(
        decided.progress,
        decided.message,
        req,
        now,
        hint=f.hint,
        fits=lambda: Verdict(
            True,
            "release",
            f"{req.name} is Provisioned and the whole gang fits; waiting for gangcheck to "
            "release the members (is the controller running?)",
        ),
        provisioned=lambda deadline: fit_verdict(f.placement, req, deadline),
        waiting=lambda accepted, eta, deadline: _waiting_verdict(
            req, accepted, eta, deadline, placement=f.placement, hint=f.hint
        ),
    )
    return said or _said(decided)


def _no_request_verdict(f: GroupFacts, done: GroupReplay) -> Verdict:
    """No request for the attempt: the decision releases the gang (it fits on nodes that
    exist), asks for one, or waits for the members to settle."""
    if done.releases:
        return Verdict(
            True,
            "release",
            "the whole gang fits on nodes that exist; waiting for gangcheck to release it "
            "(is the controller running?)",
        )
    if done.asks:
        return Verdict(
            True,
            "request",
            f"ProvisioningRequest {f.request_name} does not exist yet "
            "(is the gangcheck controller running?)",
        )
    if done.waits:
        return Verdict(
            True,
            "members",
            f"reading the members: {f.members.exist} exist (minCount {f.min_count}); "
            f"gangcheck acts once none has been created for {SETTLE_SECONDS:.0f}s",
        )
    return _said(done)


def _said(done: GroupReplay) -> Verdict:
    return Verdict(True, "group", f"{done.state or 'no state'}: {done.message or 'no message'}")


def _waiting_verdict(
    req: RequestFacts,
    accepted: bool,
    eta: str,
    deadline: str,
    *,
    placement: Placement | None,
    hint: str = "",
) -> Verdict:
    answer = f"accepted, not provisioned yet{f' ({eta})' if eta else ''}"
    answer = answer if accepted else "not accepted yet"
    fit = f": {placement.summary}" if placement is not None and placement.summary else ""
    return Verdict(
        True, "request", f"capacity requested ({req.name}, {answer}{deadline}){fit}{hint}"
    )


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return f"{shown}, +{more} more" if more > 0 else shown


def _pods(names: Sequence[str]) -> str:
    return f"pod{'s' if len(names) > 1 else ''} {_names(names)}"


# ---- one row of `gangcheck status` -------------------------------------------------------


def in_flight(facts: GroupFacts) -> bool:
    """A gang gangcheck holds or works on: it says a state, or holds members; not a group
    that is no gang, nor one released whose members are all gone."""
    m = facts.members
    if not facts.found or facts.state == NOT_A_GANG:
        return bool(m.gated)
    if not facts.state:
        return bool(m.gated) or _blocked_ungated(facts)
    return not (facts.state == RELEASED and not m.exist)


def _blocked_ungated(f: GroupFacts) -> bool:
    """A gang gangcheck should hold but cannot: members created without the gate, not yet
    bound, in a namespace opted in to gating or reported by the controller."""
    ours = f.opted_in is True or bool(f.reported_ungated)
    return f.is_gang and ours and bool(f.members.ungated) and f.members.unbound > 0


def group_phase(f: GroupFacts) -> str:
    """waiting, pending, requested, provisioned, fulfilling, rolling back, backoff, released,
    started (and: missing, not a gang, not gated, gave up, failed, blocked, new)."""
    req = f.request
    if not f.found:
        return "missing"
    if not f.is_gang or f.state == NOT_A_GANG:
        return "not a gang"
    settled = {GAVE_UP: "gave up", FAILED: "failed", BLOCKED: "blocked"}
    if f.state in settled:
        return settled[f.state]
    if f.state == RELEASED:
        return "started" if f.members.exist and not f.members.unbound else "released"
    if not f.state and f.members.ungated and not f.members.gated:
        return "not gated"
    if f.members.exist < f.min_count or f.state == WAITING:
        return "waiting"
    if f.state == BACKING_OFF and req is None:
        return "backoff"
    if not f.state:
        return "new"
    return attempt_phase(req, f.placement, f.replay.progress if f.replay else None)


def group_row(facts: GroupFacts, now: datetime) -> GangRow:
    placement, req = facts.placement, facts.request
    given = facts.state == RELEASED and placement is None
    return GangRow(
        namespace=facts.namespace,
        name=facts.name,
        check="",
        state=facts.state,
        phase=group_phase(facts),
        attempt=facts.attempt if facts.found else 0,
        request=req.name if req and req.found else "",
        age_seconds=int((now - facts.created).total_seconds()) if facts.created else None,
        arrived=facts.given_nodes if given else len(placement.arrived) if placement else 0,
        needed=nodes_needed(placement),
        placeable=placement.placeable if placement else None,
        total=placement.total if placement else (facts.members.exist or None),
        verdict=group_verdict(facts, now).line,
        kind=facts.kind,
        members_note=_members_note(facts),
        given=given,
    )


def _members_note(f: GroupFacts) -> str:
    """The members column without a fit: bound of released members, else how many exist."""
    m = f.members
    if f.state == RELEASED:
        return f"{len(m.bound)}/{m.exist} bound"
    if f.found and f.is_gang and f.min_count:
        return f"{m.exist}/{f.min_count} exist"
    return f"{m.exist} exist" if m.exist else ""
