"""Why is this gang pending? The chain, and the one link that blocks it.

Pure: the edge (``gangcheck.diagnose``) fetches the objects; here ``gather`` reads one
Workload and the cluster objects around it into ``Facts`` (quota → check state → the current
attempt's ProvisioningRequest → arrived nodes → per-node fit) and replays the controller's
decision on them (``replay``: ``admission.decide`` on the Snapshot ``snapshot_of`` builds, as
the controller builds it from its caches). ``verdict`` names the first broken link as one
line: first what ``decide`` cannot know (the Workload itself, quota and queues, an inactive
AdmissionCheck, other checks, a Retry or Rejected already written; an admitted Workload's
members scheduled so far), then the step the replayed decision returns (the start
watchdog's rollback too). ``gang_row`` condenses the
same facts for ``gangcheck status``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from gangcheck.logic.attempt import lifecycle, naming, places, topup
from gangcheck.logic.attempt.explain import (
    GangRow,
    Placement,
    RequestFacts,
    Verdict,
    World,
    as_decided,
    attempt_phase,
    deleting_verdict,
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
from gangcheck.logic.attempt.fulfillment import (
    GangSpec,
)
from gangcheck.logic.attempt.lifecycle import Progress
from gangcheck.logic.attempt.records import kept_restated
from gangcheck.logic.sources.world import capacity_of, place_in
from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.logic.workloads import checkconfig, slices
from gangcheck.logic.workloads.admission import (
    CHECK_UPDATED,
    Snapshot,
    check_ended,
    consumed_request,
    decide,
    gang_templates,
    members_scheduled,
    start_total,
)
from gangcheck.logic.workloads.podsets import pod_template_spec
from gangcheck.logic.workloads.snapshot import snapshot_of
from gangcheck.model.names import (
    FULFILLED,
    KEPT_FROM_ANNOTATION,
    ROLLING_BACK,
    STARTED,
    WORKLOAD_UID_ANNOTATION,
)
from gangcheck.model.objects import (
    CheckState,
    Condition,
    Flavor,
    Obj,
    ProvisioningRequest,
    Workload,
    conditions_of,
    request_of,
    workload_of,
)
from gangcheck.model.provisioning_config import AtomicProvisioningSpec, FulfillmentMode

PENDING, READY, RETRY, REJECTED = "Pending", "Ready", "Retry", "Rejected"
# Reasons a node will not lose by waiting: the gang, its flavor or the node template is wrong.


# ---- the target --------------------------------------------------------------------------

KINDS = {
    "job": "job",
    "jobs": "job",
    "job.batch": "job",
    "jobs.batch": "job",
    "workload": "workload",
    "workloads": "workload",
    "wl": "workload",
    "workload.kueue.x-k8s.io": "workload",
    "workloads.kueue.x-k8s.io": "workload",
    "pod": "pod",
    "pods": "pod",
    "po": "pod",
    "podgroup": "podgroup",
    "podgroups": "podgroup",
    "pg": "podgroup",
}
POD_GROUP_APIS = ("scheduling.k8s.io", "scheduling.x-k8s.io")
"""A podgroup target may name its API: `podgroup.scheduling.x-k8s.io/NS/NAME`."""


class TargetError(ValueError):
    """The target names no object gangcheck can diagnose; the message says why, in a line."""


@dataclass(frozen=True)
class Target:
    kind: str
    namespace: str
    name: str
    api_group: str = ""
    """Of a podgroup target, when named: scheduling.k8s.io or scheduling.x-k8s.io."""

    def __str__(self) -> str:
        kind = f"{self.kind}.{self.api_group}" if self.api_group else self.kind
        return f"{kind}/{self.namespace}/{self.name}"


def parse_target(text: str, *, default_namespace: str = "default") -> Target:
    """`KIND/NAMESPACE/NAME` (or `KIND/NAME` in the default namespace)."""
    parts = text.strip().split("/")
    if len(parts) == 2:
        parts = [parts[0], default_namespace, parts[1]]
    if len(parts) != 3 or not all(parts):
        raise TargetError(f"{text!r} is not KIND/NAMESPACE/NAME (for example job/team-a/train)")
    kind, api_group = KINDS.get(parts[0].lower()), ""
    if kind is None:
        base, _, api_group = parts[0].lower().partition(".")
        if KINDS.get(base) == "podgroup" and api_group in POD_GROUP_APIS:
            kind = "podgroup"
    if kind is None:
        raise TargetError(
            f"unknown kind {parts[0]!r}: use job, workload, pod or podgroup "
            "(podgroup.scheduling.k8s.io, podgroup.scheduling.x-k8s.io)"
        )
    return Target(kind, parts[1], parts[2], api_group)


# ---- facts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadState:
    """The Workload itself and its quota: the first links of the chain."""

    reserved: bool = False
    cluster_queue: str = ""
    local_queue: str = ""
    local_queue_found: bool | None = None
    quota_condition: Condition | None = None
    admitted: bool = False
    admitted_at: datetime | None = None
    finished: Condition | None = None
    active: bool = True
    deleting: bool = False
    evicted: Condition | None = None
    requeue_at: datetime | None = None
    created: datetime | None = None


@dataclass(frozen=True)
class CheckFacts:
    """One admission check of the Workload (or of its ClusterQueue, not yet listed)."""

    name: str
    state: str = PENDING
    """"" when the ClusterQueue requires it but the Workload does not list it yet."""
    message: str = ""
    retry_count: int = 0
    requeue_after_seconds: int | None = None
    ours: bool = True
    exists: bool = True
    active: bool = True
    problem: str = ""
    """Why the check is not active."""
    controller: str = ""

    @property
    def attempt(self) -> int:
        return self.retry_count + 1


@dataclass(frozen=True)
class StartFacts:
    """After admission: members scheduled, and when the start watchdog gives up."""

    scheduled: int
    total: int
    deadline: datetime | None = None


@dataclass(frozen=True)
class Replay:
    """The decision `admission.decide` makes for the check now, on the Snapshot the controller
    would read (built by the same function, from the live read instead of its caches)."""

    progress: Progress | None = None
    """Where the attempt it followed stands (None: it followed none)."""
    message: str = ""
    """The step's message, else the check's message after the decision."""
    state: str = ""
    """The check's state after the decision (written now, or kept)."""
    asks: bool = False
    """The decision asks for capacity: no request exists for the attempt yet."""
    deadlines: Mapping[str, datetime] = field(default_factory=dict)
    """The deadlines it moves requests to (deadlineSeconds changed under the attempt)."""


@dataclass(frozen=True)
class Ended:
    """A turn of the check to Retry or Rejected, as the Workload's Events tell: Kueue resets
    either to Pending at once ("Reset to Pending after eviction. Previously: Retry"), and the
    message that said why goes with it."""

    state: str
    message: str
    at: datetime | None = None
    attempt: int | None = None
    """The attempt it ended, as the request its message names says (None: it names none)."""


@dataclass(frozen=True)
class Facts:
    namespace: str
    name: str
    state: WorkloadState = WorkloadState()
    checks: tuple[CheckFacts, ...] = ()
    focus: str = ""
    """The check of ours diagnosed: the first not Ready, else the first."""
    mode: str = FulfillmentMode.FIT.value
    request: RequestFacts | None = None
    placement: Placement | None = None
    start: StartFacts | None = None
    replay: Replay | None = None
    """The controller's decision for the focus check, replayed on what was read."""
    relation: str = ""
    """A workload slice's relation to the running one, in the check message's words
    (`slices.relation`); '' for a Workload that is no slice."""
    given_nodes: int = 0
    """Once admitted: the nodes recorded as arrived for its request, none older than it
    (`_given_nodes`)."""
    turns: tuple[Ended, ...] = ()
    """The focus check's turns to Retry or Rejected, oldest first (`turns_of`), as far as
    its Events were read and are left (they expire)."""

    @property
    def focus_check(self) -> CheckFacts | None:
        return next((c for c in self.checks if c.name == self.focus), None)

    @property
    def ended(self) -> Ended | None:
        """The focus check's last Retry or Rejected."""
        return self.turns[-1] if self.turns else None


def gather(workload: Obj, world: World, *, now: datetime, events: Sequence[Obj] = ()) -> Facts:
    """Everything the chain needs about one Workload, read from the objects (`events`: the
    Events on it); the decision the controller makes for its check now, replayed on them
    (`replay`)."""
    wl = workload_of(workload)
    state = workload_state(workload, wl, world)
    checks = check_facts(wl, world, _cluster_queue_checks(state, world))
    focus = _focus(checks)
    resolution = _resolution(world, focus)
    spec = resolution.spec if resolution else None
    req = _find_request(world, wl, focus, checks)
    request = _request_facts(world, req, focus, checks, wl) if focus else None
    gang = _gang(slices.as_asked(wl, req), focus, spec, world.flavors, req)  # a slice: its ask
    fitted_in = world
    kept = _kept(world, req)
    if kept and spec is not None:  # topping kept arrivals up: fitted on their nodes and its own
        gang, fitted_in = _topped_up(wl, focus, spec, world, req=req, kept=kept)
    placement = None
    if gang.pod_sets and (state.reserved or req is not None) and not state.admitted:
        placement = place_in(fitted_in, gang, wl.ref.namespace, req, now)
    decided = replay(_snapshot(wl, focus, world), now) if focus else None
    exists = node_names(world)
    if decided is not None:  # what a rollback kept, as it is now (gone since, said so)
        decided = replace(decided, message=kept_restated(decided.message, exists))
    return Facts(
        namespace=wl.ref.namespace,
        name=wl.ref.name,
        state=state,
        checks=tuple(replace(c, message=kept_restated(c.message, exists)) for c in checks),
        focus=focus,
        mode=(spec.fulfillment.mode.value if spec else FulfillmentMode.FIT.value),
        request=as_decided(request, decided.deadlines) if decided else request,
        placement=placement,
        start=_start_facts(state, wl, req, world, spec),
        replay=decided,
        relation=slices.relation(wl, req),
        given_nodes=_given_nodes(wl, focus, request, world) if state.admitted else 0,
        turns=turns_of(events, wl.ref.name, focus, exists) if focus else (),
    )


def turns_of(
    events: Sequence[Obj], workload: str, check: str, exists: Collection[str]
) -> tuple[Ended, ...]:
    """The check's turns to Retry or Rejected among the Workload's Events (gangcheck's
    CHECK_UPDATED, `admission.check_ended`), oldest first, each message as it reads now (a
    node a rollback kept, gone since, said gone: `kept_restated`) with the attempt it ended
    (`attempt_named`); none when none is left (Events expire)."""
    found = []
    for event in events:
        if event.get("reason") != CHECK_UPDATED:
            continue
        turn = check_ended(str(event.get("message") or ""), check)
        if turn is not None:
            found.append((event_time(event), turn))
    found.sort(key=lambda f: f[0] or _EPOCH)
    return tuple(
        Ended(state, kept_restated(message, exists), at, attempt_named(message, workload, check))
        for at, (state, message) in found
    )


def attempt_named(message: str, workload: str, check: str) -> int | None:
    """The attempt of the first request of the workload and check the message names (a
    rollback's "rolled back <request> (...)"); None when it names none."""
    for word in re.findall(r"[A-Za-z0-9][A-Za-z0-9.-]*", message):
        attempt = naming.attempt_of(word.rstrip("."), workload, check)
        if attempt is not None:
            return attempt
    return None


def earlier_attempts(facts: Facts) -> tuple[Ended, ...]:
    """The turns to Retry or Rejected of the attempts before the one the check stands in,
    oldest first: not the last when the check says it itself (Retry or Rejected now) or
    Kueue reset the check from it (`reset_from`, said where the check is)."""
    turns, check = facts.turns, facts.focus_check
    if not turns or check is None:
        return turns
    last = turns[-1]
    own = last.state == check.state and last.attempt in (None, check.attempt)
    return turns[:-1] if own or reset_from(facts) is not None else turns


def turn_line(turn: Ended) -> str:
    """One earlier attempt's end in one line: which, how, when, and its check's message (a
    rollback's says why and what it reclaimed or kept)."""
    which = f"attempt {turn.attempt}" if turn.attempt is not None else "an earlier attempt"
    when = f" at {format_time(turn.at)}" if turn.at else ""
    return f"{which}: {turn.state}{when}: {turn.message or '(no message)'}"


_EPOCH = datetime.fromtimestamp(0, UTC)


def event_time(event: Obj) -> datetime | None:
    """When the Event last happened (a repeat counted on it moves lastTimestamp)."""
    meta = event.get("metadata") or {}
    for raw in (
        event.get("lastTimestamp"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
        meta.get("creationTimestamp"),
    ):
        when = parse_time(str(raw or ""))
        if when is not None:
            return when
    return None


def replay(snap: Snapshot, now: datetime) -> Replay:
    """`decide` on the snapshot, as a diagnosis reads it (a Kueue workload slice by the
    difference its request records: slices.py)."""
    sliced = slices.recorded_predecessor(snap)
    decision = decide(snap, now) if sliced is None else slices.decide(snap, now, predecessor=sliced)
    entry = decision.check or snap.workload.checks.get(snap.check)
    step = decision.step
    return Replay(
        progress=step.progress if step is not None else None,
        message=(step.message if step is not None and step.message else "")
        or (entry.message if entry else ""),
        state=entry.state if entry else "",
        asks=any(note.outcome == "asked" for note in decision.sources),
        deadlines=moved_deadlines(decision.actions),
    )


def _snapshot(wl: Workload, check: str, world: World) -> Snapshot:
    return snapshot_of(
        wl,
        check,
        admission_check=world.admission_checks.get,
        config=world.configs.get,
        requests=world.requests,
        flavors=world.flavors,
        capacity=capacity_of(world),
    )


def workload_state(obj: Obj, wl: Workload, world: World) -> WorkloadState:
    status, spec = obj.get("status") or {}, obj.get("spec") or {}
    conds = wl.conditions
    local_queue = str(spec.get("queueName") or "")
    lq_key = f"{wl.ref.namespace}/{local_queue}"
    lq = world.local_queues.get(lq_key) if world.local_queues is not None else None
    cq = str((status.get("admission") or {}).get("clusterQueue") or "")
    if not cq and lq is not None:
        cq = str((lq.get("spec") or {}).get("clusterQueue") or "")
    requeue = (status.get("requeueState") or {}).get("requeueAt")
    admitted = conds.get("Admitted")
    return WorkloadState(
        reserved=wl.has_quota_reservation,
        cluster_queue=cq,
        local_queue=local_queue,
        local_queue_found=(
            None if world.local_queues is None or not local_queue else lq is not None
        ),
        quota_condition=conds.get("QuotaReserved"),
        admitted=wl.is_admitted,
        admitted_at=parse_time(admitted.last_transition_time)
        if wl.is_admitted and admitted
        else None,
        finished=conds["Finished"] if wl.is_finished else None,
        active=wl.active,
        deleting=wl.deleting,
        evicted=conds["Evicted"] if wl.is_evicted else None,
        requeue_at=parse_time(str(requeue)) if requeue else None,
        created=parse_time(str((obj.get("metadata") or {}).get("creationTimestamp") or "")),
    )


def _cluster_queue_checks(state: WorkloadState, world: World) -> tuple[str, ...]:
    if world.cluster_queues is None or not state.cluster_queue:
        return ()
    cq = world.cluster_queues.get(state.cluster_queue) or {}
    spec = cq.get("spec") or {}
    names = [str(n) for n in spec.get("admissionChecks") or []]
    strategy = (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []
    names += [str(rule.get("name", "")) for rule in strategy]
    return tuple(dict.fromkeys(n for n in names if n))


def check_facts(wl: Workload, world: World, required: Sequence[str] = ()) -> tuple[CheckFacts, ...]:
    """The checks the Workload lists, then those its ClusterQueue requires and it lacks."""
    listed = [_check(world, name, wl.checks[name]) for name in wl.checks]
    missing = [_check(world, name, None) for name in required if name not in wl.checks]
    return tuple(listed + missing)


def _check(world: World, name: str, entry: CheckState | None) -> CheckFacts:
    ac = world.admission_checks.get(name)
    controller = str(((ac or {}).get("spec") or {}).get("controllerName") or "")
    problem = _inactive_because(world, name, ac)
    return CheckFacts(
        name=name,
        state=entry.state if entry else "",
        message=entry.message if entry else "",
        retry_count=entry.retry_count if entry else 0,
        requeue_after_seconds=entry.requeue_after_seconds if entry else None,
        ours=ac is not None and checkconfig.is_ours(ac),
        exists=ac is not None,
        active=problem is None,
        problem=problem or "",
        controller=controller,
    )


def _inactive_because(world: World, name: str, ac: Obj | None) -> str | None:
    """Why the AdmissionCheck is not active (None when it is): for ours, the config as this
    code resolves it first, then the Active condition Kueue goes by."""
    if ac is None:
        return f"the AdmissionCheck {name} does not exist"
    if checkconfig.is_ours(ac):
        resolution = checkconfig.resolve(ac, world.configs.get)
        if not resolution.active:
            return resolution.message
    active = _active_condition(ac)
    if active is None:
        return _NO_ACTIVE if checkconfig.is_ours(ac) else "no Active condition"
    if active.status != "True":
        return active.message or active.reason or "Active is not True"
    return None


_NO_ACTIVE = "no Active condition yet (is the gangcheck controller running?)"


def _active_condition(ac: Obj) -> Condition | None:
    return conditions_of(ac).get("Active")


def _focus(checks: Sequence[CheckFacts]) -> str:
    ours = [c for c in checks if c.ours]
    pick = next((c for c in ours if c.state != READY), ours[0] if ours else None)
    return pick.name if pick else ""


def _resolution(world: World, check: str) -> checkconfig.Resolution | None:
    if not check:
        return None
    return checkconfig.resolve(world.admission_checks.get(check), world.configs.get)


def _attempt_name(
    world: World, wl: Workload, check: str, checks: Sequence[CheckFacts]
) -> tuple[str, int]:
    """The request of the attempt in flight (the latest capacity source asked), and the
    attempt's number."""
    facts = next((c for c in checks if c.name == check), None)
    attempt = facts.attempt if facts else 1
    existing = {
        str((o.get("metadata") or {}).get("name"))
        for o in world.requests
        if (o.get("metadata") or {}).get("namespace") == wl.ref.namespace
    }
    return naming.current_request(existing, wl.ref.name, check, attempt)[0], attempt


def _find_request(
    world: World, wl: Workload, check: str, checks: Sequence[CheckFacts]
) -> ProvisioningRequest | None:
    if not check:
        return None
    name, _ = _attempt_name(world, wl, check, checks)
    for obj in world.requests:
        meta = obj.get("metadata") or {}
        if meta.get("namespace") == wl.ref.namespace and meta.get("name") == name:
            return request_of(obj)
    return None


def _request_facts(
    world: World,
    req: ProvisioningRequest | None,
    check: str,
    checks: Sequence[CheckFacts],
    wl: Workload,
) -> RequestFacts:
    name, attempt = _attempt_name(world, wl, check, checks)
    return request_facts(req, name, attempt, node_names(world))


def _gang(
    wl: Workload,
    check: str,
    spec: AtomicProvisioningSpec | None,
    flavors: Mapping[str, Flavor],
    req: ProvisioningRequest | None,
) -> GangSpec:
    """(pod set, count, template) as the controller assesses them (pinned to the capacity
    source the request asked, `lifecycle.asked_source`, not the one now at its index, the pod
    sets of the config it was made under, `lifecycle.made_under`; the first source without a
    request); every pod set without a config to say which need capacity."""
    if spec is not None:
        snap = Snapshot(workload=wl, check=check, config=spec, flavors=flavors)
        if req is None:
            return gang_templates(snap, place=places.Place(0))  # fitted in any one domain
        labels = lifecycle.asked_source(req, spec).node_selector
        return gang_templates(snap, labels=labels, made=lifecycle.made_under(req, spec))
    return GangSpec(
        tuple(
            (ps.name, ps.count, pod_template_spec(wl, ps.name, ps.template, flavors))
            for ps in wl.pod_sets
        )
    )


def _kept(world: World, req: ProvisioningRequest | None) -> tuple[ProvisioningRequest, ...]:
    """The requests whose kept arrivals `req` tops up (logic/attempt/topup.py)."""
    if req is None:
        return ()
    names = {n for n in req.annotations.get(KEPT_FROM_ANNOTATION, "").split(",") if n}
    return tuple(
        request_of(o)
        for o in world.requests
        if (o.get("metadata") or {}).get("namespace") == req.ref.namespace
        and (o.get("metadata") or {}).get("name") in names
    )


def _topped_up(
    wl: Workload,
    check: str,
    spec: AtomicProvisioningSpec,
    world: World,
    *,
    req: ProvisioningRequest | None,
    kept: tuple[ProvisioningRequest, ...],
) -> tuple[GangSpec, World]:
    """The gang as the controller fits a request topping kept arrivals up: pinned to the
    labels the sources share, tolerating every hold, counting the kept requests' nodes."""
    assert req is not None
    snap = Snapshot(workload=wl, check=check, config=spec, flavors=world.flavors)
    labels = topup.shared_labels(spec, req, kept)
    made = lifecycle.made_under(req, spec)
    gang = topup.tolerating(gang_templates(snap, labels=labels, made=made), kept)
    names = {r.name for r in kept}
    left = tuple(
        o
        for o in world.requests
        if not (
            (o.get("metadata") or {}).get("namespace") == req.ref.namespace
            and (o.get("metadata") or {}).get("name") in names
        )
    )
    return gang, replace(world, requests=left)


def _start_facts(
    state: WorkloadState,
    wl: Workload,
    req: ProvisioningRequest | None,
    world: World,
    spec: AtomicProvisioningSpec | None,
) -> StartFacts | None:
    if not state.admitted or req is None:
        return None
    scheduled = members_scheduled(world, req.ref.namespace, req.name)
    deadline = None
    if spec is not None and state.admitted_at is not None:
        seconds = spec.fulfillment.start_deadline_seconds
        deadline = datetime.fromtimestamp(
            state.admitted_at.timestamp() + seconds, state.admitted_at.tzinfo
        )
    return StartFacts(scheduled=scheduled, total=start_total(wl, req, spec), deadline=deadline)


# ---- the verdict -------------------------------------------------------------------------


def verdict(facts: Facts, now: datetime) -> Verdict:
    """THE reason the gang is not running: the first broken link of the chain."""
    return (
        _workload_verdict(facts, now)
        or _quota_verdict(facts, now)
        or _check_verdict(facts, now)
        or Verdict(
            True, "admission", "quota reserved and every check Ready; waiting for Kueue to admit"
        )
    )


def _workload_verdict(facts: Facts, now: datetime) -> Verdict | None:
    st = facts.state
    if st.finished is not None:
        detail = f" ({st.finished.message})" if st.finished.message else ""
        return Verdict(False, "workload", f"finished{detail}")
    if st.deleting:
        return Verdict(False, "workload", "the Workload is being deleted")
    if not st.active:
        why = st.evicted.message if st.evicted and st.evicted.message else _rejection(facts)
        detail = (f": {why}" if why else "") + _turned(facts, REJECTED)
        return Verdict(True, "workload", f"the Workload is deactivated (spec.active=false){detail}")
    if st.admitted:
        return _start_verdict(facts, now)
    return None


def _rejection(facts: Facts) -> str:
    rejected = next((c for c in facts.checks if c.state == REJECTED), None)
    if rejected is None:
        return ""
    return f"the check {rejected.name} rejected it" + (
        f": {rejected.message}" if rejected.message else ""
    )


def _start_verdict(facts: Facts, now: datetime) -> Verdict:
    start, req = facts.start, facts.request
    if req is not None and req.phase == STARTED:
        return Verdict(False, "start", "admitted and running")
    done = facts.replay
    if req is not None and done is not None and done.progress in ROLLBACK:
        why = f"{req.rollback_reason or done.message}{_reclaimed(req)}"
        return Verdict(True, "start", f"admitted, but rolling back attempt {req.attempt}: {why}")
    if start is None or start.total == 0:
        return Verdict(False, "start", "admitted")
    if start.scheduled >= start.total:
        return Verdict(False, "start", "admitted and running")
    when = until("start deadline", start.deadline, now)
    return Verdict(
        True,
        "start",
        f"admitted, but only {start.scheduled} of {start.total} members are scheduled{when}",
    )


ROLLBACK = (Progress.ROLLING_BACK, Progress.ROLLED_BACK)
"""A rollback the replayed decision starts or runs (the start watchdog's, once admitted)."""


def _reclaimed(req: RequestFacts) -> str:
    return f"; {req.outcome_line}" if req.outcome else ""


def _quota_verdict(facts: Facts, now: datetime) -> Verdict | None:
    st = facts.state
    if st.reserved:
        return None
    inactive = next((c for c in facts.checks if c.ours and not c.active), None)
    if inactive is not None:
        return _inactive(inactive)
    if st.requeue_at is not None and st.requeue_at > now:
        retried = max((c.retry_count for c in facts.checks if c.ours), default=0)
        after = f" after attempt {retried}" if retried else ""
        wait = human_duration((st.requeue_at - now).total_seconds())
        said = f"backoff{after}: Kueue requeues the Workload in {wait}{_turned(facts, RETRY)}"
        return Verdict(True, "quota", said)
    return Verdict(True, "quota", f"quota: {_unreserved(facts)}{_attempt_kept(facts, now)}")


RESET = "Reset to Pending after eviction. Previously: "
"""Kueue's message on a check it resets as it evicts the Workload (v0.17,
pkg/workload/admissionchecks.go resetChecksOnEviction), the state it was in after it."""


def reset_from(facts: Facts) -> Ended | None:
    """The focus check's last Retry or Rejected (`Facts.ended`) when Kueue reset the check
    from it: its message now only says it was reset; the Event says why."""
    check, ended = facts.focus_check, facts.ended
    if check is None or ended is None or check.message != RESET + ended.state:
        return None
    return ended


def _turned(facts: Facts, state: str) -> str:
    """`; the check C turned Retry: why` when Kueue reset the check from `state`."""
    ended = reset_from(facts)
    if ended is None or ended.state != state:
        return ""
    return f"; the check {facts.focus} turned {state}" + (
        f": {ended.message}" if ended.message else ""
    )


def _unreserved(facts: Facts) -> str:
    """Why Kueue holds no quota for the gang, in Kueue's words where it gave some."""
    st = facts.state
    cond = st.quota_condition
    if cond is not None and cond.message:
        cq = st.cluster_queue
        prefix = f"ClusterQueue {cq}: " if cq and cq not in cond.message else ""
        return f"{prefix}{cond.message}"
    if st.local_queue_found is False:
        return f"LocalQueue {st.local_queue} does not exist in {facts.namespace}"
    queue = f" (LocalQueue {st.local_queue})" if st.local_queue else ""
    return f"not reserved yet; Kueue has not placed it{queue}"


def _attempt_kept(facts: Facts, now: datetime) -> str:
    """Quota taken back without eviction (its queue stopped or gone) while an attempt was in
    flight: the attempt is kept until its deadline, then withdrawn (admission._without_quota)."""
    req, check = facts.request, facts.focus_check
    if req is None or not req.found or req.deleting or check is None or check.state != PENDING:
        return ""
    when = until("deadline", req.deadline, now)
    return (
        f"; its attempt in flight ({req.name}) is withdrawn at its deadline, what arrived for "
        f"it reclaimed{when}"
    )


def _inactive(check: CheckFacts) -> Verdict:
    return Verdict(True, "check", f"the AdmissionCheck {check.name} is inactive: {check.problem}")


def _check_verdict(facts: Facts, now: datetime) -> Verdict | None:
    focus = facts.focus_check
    if focus is None or focus.state == READY:
        return _other_checks(facts)
    if not focus.active:
        return _inactive_in_flight(facts, focus, now) or _inactive(focus)
    if focus.state == REJECTED:
        return Verdict(True, "check", f"the check {focus.name} rejected the gang: {focus.message}")
    if focus.state == RETRY:
        return _retry_verdict(focus, facts.request)
    return _attempt_verdict(facts, focus, now)


def _inactive_in_flight(facts: Facts, check: CheckFacts, now: datetime) -> Verdict | None:
    """An inactive check of ours over a gang that has its quota, whose attempt goes on: the
    controller decides by the config (`checkconfig.resolve`: a check Active=False for another
    reason, a Karpenter NodePool missing, still has one), or, with no valid config, by the
    one the attempt recorded. Kueue (v0.17) keeps the reservations made and gives no new gang
    quota on the ClusterQueue (pending, AdmissionCheckInactive). Both are said, with the
    attempt's own line. None: the replayed decision follows no attempt and asks none (the
    check is what blocks)."""
    done = facts.replay
    if check.state != PENDING or done is None or (done.progress is None and not done.asks):
        return None
    said = _attempt_verdict(facts, check, now)
    cq = facts.state.cluster_queue
    where = f" on ClusterQueue {cq}" if cq else ""
    return Verdict(
        said.blocked,
        said.step,
        f"the AdmissionCheck {check.name} is inactive ({check.problem}): no new gang gets "
        f"quota{where}; this gang keeps its quota and its attempt goes on: {said.reason}",
    )


def _retry_verdict(check: CheckFacts, req: RequestFacts | None) -> Verdict:
    after = (
        f" after {human_duration(check.requeue_after_seconds)}"
        if check.requeue_after_seconds
        else ""
    )
    if req is not None and req.rollback_reason:
        return Verdict(
            True,
            "check",
            f"attempt {req.attempt} rolled back ({req.rollback_reason}); "
            f"Kueue requeues the gang{after}",
        )
    return Verdict(
        True, "check", f"the check {check.name} asked Kueue to retry{after}: {check.message}"
    )


def _other_checks(facts: Facts) -> Verdict | None:
    waiting = next((c for c in facts.checks if c.state != READY), None)
    if waiting is None:
        return None
    if not waiting.active:
        return _inactive(waiting)
    whose = "" if waiting.ours else f" ({waiting.controller or 'not gangcheck'})"
    state = waiting.state or "not listed yet"
    message = f": {waiting.message}" if waiting.message else ""
    return Verdict(True, "check", f"the admission check {waiting.name}{whose} is {state}{message}")


def _attempt_verdict(facts: Facts, check: CheckFacts, now: datetime) -> Verdict:
    """The check Pending: what the decision replayed on the live read says of its attempt."""
    req, done = facts.request, facts.replay or Replay(state=check.state, message=check.message)
    name = req.name if req else "?"
    if req is None or not req.found:
        if done.asks:
            return Verdict(
                True,
                "request",
                f"ProvisioningRequest {name} does not exist yet (is the gangcheck controller "
                "running?)",
            )
        return _pending_check(check.name, done)
    if req.deleting:
        return deleting_verdict(req, now)
    said = step_verdict(
        done.progress,
        done.message,
        req,
        now,
        fits=lambda: _fits_verdict(facts, req),
        provisioned=lambda deadline: fit_verdict(facts.placement, req, deadline),
        waiting=lambda accepted, eta, deadline: _waiting_verdict(req, accepted, eta, deadline),
    )
    return said or _pending_check(check.name, done)


def _pending_check(name: str, done: Replay) -> Verdict:
    state = done.state or "not listed yet"
    message = f": {done.message}" if done.message else ""
    return Verdict(True, "check", f"the check {name} is {state}{message}")


def _waiting_verdict(req: RequestFacts, accepted: bool, eta: str, deadline: str) -> Verdict:
    if not accepted:
        return Verdict(
            True, "request", f"waiting for the autoscaler to accept {req.name}{deadline}"
        )
    eta = f" ({eta})" if eta else ""
    return Verdict(
        True,
        "request",
        f"waiting for the autoscaler: {req.name} accepted, not provisioned yet{eta}{deadline}",
    )


def _fits_verdict(facts: Facts, req: RequestFacts) -> Verdict:
    if facts.mode == FulfillmentMode.TRUST_PROVISIONED.value:
        return Verdict(True, "check", f"{req.name} is Provisioned; {_MARK_READY}")
    return Verdict(True, "check", f"the whole gang fits on nodes that exist; {_MARK_READY}")


_MARK_READY = "waiting for gangcheck to mark the check Ready (is the controller running?)"


# ---- one row of `gangcheck status` -------------------------------------------------------


def is_gang(workload: Obj, world: World) -> bool:
    """A Workload one of our checks cares about, or one a request of ours was made for."""
    wl = workload_of(workload)
    if set(wl.checks) & _our_checks(world):
        return True
    return any(_request_of_workload(r, wl) for r in world.requests)


def _request_of_workload(req: Obj, wl: Workload) -> bool:
    meta = req.get("metadata") or {}
    owners = {o.get("uid") for o in meta.get("ownerReferences") or []}
    annotated = (meta.get("annotations") or {}).get(WORKLOAD_UID_ANNOTATION)
    return meta.get("namespace") == wl.ref.namespace and wl.ref.uid in {annotated, *owners}


def _given_nodes(wl: Workload, check: str, request: RequestFacts | None, world: World) -> int:
    """The nodes recorded as arrived for the request an admitted gang consumes (its check's
    podSetUpdates name it; with Race not always the latest ask), else for the latest ask;
    a node older than that request arrived for an earlier one of its name (`recorded_for`
    with its creationTimestamp; none when it is gone: every node recorded under the name)."""
    entry = wl.checks.get(check)
    name = consumed_request(entry) if entry is not None else ""
    if not name and request is not None and request.found:
        name = request.name
    if not name:
        return 0
    made = next(
        (
            str((r.get("metadata") or {}).get("creationTimestamp") or "") or None
            for r in world.requests
            if (r.get("metadata") or {}).get("name") == name and _request_of_workload(r, wl)
        ),
        None,
    )
    return recorded_for(world.nodes, wl.ref.namespace, name, made)


def gang_row(facts: Facts, now: datetime) -> GangRow:
    check = facts.focus_check
    placement, req, start = facts.placement, facts.request, facts.start
    given = facts.state.admitted and placement is None
    arrived = facts.given_nodes if given else len(placement.arrived) if placement else 0
    created = facts.state.created
    line = verdict(facts, now).line
    if facts.relation and facts.relation not in line:  # a slice: what it adds to what runs
        line = f"{facts.relation}; {line}"
    return GangRow(
        namespace=facts.namespace,
        name=facts.name,
        check=facts.focus,
        state=check.state if check else "",
        phase=phase_of(facts, now),
        attempt=check.attempt if check else 0,
        request=req.name if req and req.found else "",
        age_seconds=int((now - created).total_seconds()) if created else None,
        arrived=arrived,
        needed=nodes_needed(placement),
        placeable=placement.placeable if placement else None,
        total=placement.total if placement else (req.members if req and req.found else None),
        verdict=line,
        members_note=f"{start.scheduled}/{start.total} scheduled" if start else "",
        given=given,
    )


def phase_of(facts: Facts, now: datetime | None = None) -> str:
    """requested, provisioned, fulfilling, rolling back, ready, started (and the states
    around them: queued, backoff (Kueue's requeue not yet due at `now`), pending, retrying,
    rejected, admitted, finished)."""
    st, check, req = facts.state, facts.focus_check, facts.request
    if st.finished is not None:
        return "finished"
    if st.admitted:
        return "started" if req is not None and req.phase == STARTED else "admitted"
    if not st.reserved:
        due = st.requeue_at is not None and now is not None and st.requeue_at > now
        return "backoff" if due else "queued"
    if check is not None and check.state in (RETRY, REJECTED):
        return "retrying" if check.state == RETRY else "rejected"
    if req is not None and req.phase == ROLLING_BACK:
        return "rolling back"
    if (check is not None and check.state == READY) or (req is not None and req.phase == FULFILLED):
        return "ready"
    return attempt_phase(req, facts.placement, facts.replay.progress if facts.replay else None)


def _our_checks(world: World) -> set[str]:
    return {n for n, ac in world.admission_checks.items() if checkconfig.is_ours(ac)}
