"""The admission check's one decision: (Workload, requests, config, clock) -> what to do.

``decide`` is pure. It reads a Snapshot of what the caches hold for one Workload and one of
our AdmissionChecks, and returns the check entry to write (if it changed), the objects to
create or delete, and the Events to emit. The reconciler applies that once and writes only
what changed. Kueue's precedence for request conditions is kept:
Failed > CapacityRevoked > BookingExpired (before admission) > Provisioned > Accepted > Pending.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial

from gangcheck.logic.attempt import driver, flow, lifecycle, naming, places, race, rollback, topup
from gangcheck.logic.attempt.actions import (
    AnnotateRequest,
    DeleteRequest,
    Event,
    ReclaimArrivals,
)
from gangcheck.logic.attempt.backend import Ask, AskedPodSet, CapacityBackend
from gangcheck.logic.attempt.fulfillment import (
    ClusterView,
    GangSpec,
    capacity_used,
    hold_key,
    reservations_of,
    reserved_split,
)
from gangcheck.logic.attempt.hold import hold_toleration
from gangcheck.logic.attempt.lifecycle import Progress
from gangcheck.logic.attempt.records import AttemptPhase, RollbackCause
from gangcheck.logic.attempt.status import AttemptStatus, Phase
from gangcheck.logic.placement.reservations import describe
from gangcheck.logic.placement.usage import tally
from gangcheck.logic.sources.provreq import PROVISIONING_REQUEST
from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.logic.workloads.podsets import (
    MergedPodSet,
    members_now,
    merge_pod_sets,
    missing_flavors,
    pod_template_spec,
    request_parameters,
    required_level,
    required_pod_sets,
    unassigned_pod_sets,
)
from gangcheck.model.names import (
    CHECK_ANNOTATION,
    CLASS_ANNOTATION,
    CONSUME_ANNOTATION,
    FLAVORS_ANNOTATION,
    OUTCOME_ANNOTATION,
    PHASE_ANNOTATION,
    STARTED,
    WORKLOAD_ANNOTATION,
    WORKLOAD_UID_ANNOTATION,
)
from gangcheck.model.objects import (
    CheckState,
    Flavor,
    Obj,
    ProvisioningRequest,
    Workload,
)
from gangcheck.model.provisioning_config import (
    AtomicProvisioningSpec,
    FulfillmentMode,
    label_key_problem,
    label_value_problem,
)

PENDING, READY, RETRY, REJECTED = "Pending", "Ready", "Retry", "Rejected"
MAX_MESSAGE = 32768
NOT_NEEDED = "the provisioning request is not needed"


@dataclass(frozen=True)
class Snapshot:
    workload: Workload
    check: str
    config: AtomicProvisioningSpec | None
    config_problem: str = ""
    flavors: Mapping[str, Flavor] = field(default_factory=dict)
    requests: tuple[ProvisioningRequest, ...] = ()
    templates: frozenset[str] = frozenset()
    """Names of the PodTemplates made for the Workload's attempts that exist."""
    capacity: ClusterView | None = None
    backend: CapacityBackend = PROVISIONING_REQUEST
    competing: tuple[str, ...] = ()
    """Other checks on the Workload whose pods consume a ProvisioningRequest (gangcheck's
    or Kueue's built-in one): a pod can consume only one."""
    inactive: str = ""
    """Why the check is Active=False though its config resolves (its Active condition's
    message: a NodePool a Karpenter source names is missing); '' when it is active. Kueue
    gives no new gang quota on the ClusterQueue; the attempt of a gang that has its quota
    goes on by the config, its Pending message noting the check (`_noted`)."""


@dataclass(frozen=True)
class Decision(flow.Decided):
    """The check entry to write (None: unchanged), and what every gang source's decision
    carries (flow.Decided; a diagnosis, logic/workloads/diagnosis.py, replays it)."""

    check: CheckState | None = None


def decide(snap: Snapshot, now: datetime) -> Decision:
    """Everything the check controller does for one Workload and one of our checks."""
    wl, state = snap.workload, snap.workload.checks.get(snap.check)
    if wl.deleting or wl.is_finished or wl.is_evicted:
        return _withdrawn(snap, state, now)
    if state is None:
        return _withdraw_attempts(snap, "the check is no longer listed on the Workload")
    if not wl.has_quota_reservation:
        return _without_quota(snap, state, now)
    if snap.competing:
        return _competing(snap, state, now)
    if snap.config is None:
        return _inactive(snap, state, now)
    if snap.inactive:
        note = f" (the check is not active: {snap.inactive}; the attempt in flight goes on)"
        return _noted(decide(replace(snap, inactive=""), now), state, note)
    if state.state in (RETRY, REJECTED):
        return _after_rollback(snap, state)  # then Kueue core evicts and requeues, or deactivates
    unassigned = unassigned_pod_sets(wl, snap.config.managed_resources)
    if unassigned:
        message = (
            "the admission is inconsistent: no podSetAssignment for pod set "
            f"{', '.join(unassigned)}; waiting for Kueue to admit it again"
        )
        return _transition(state, PENDING, message, now)
    pod_sets = required_pod_sets(wl, snap.config.managed_resources)
    if not pod_sets:
        return _not_needed(snap, state, now)
    if state.state == READY:
        return _while_ready(snap, state, now)
    return _pending(snap, state, now)


def _without_quota(snap: Snapshot, state: CheckState, now: datetime) -> Decision:
    """Quota lost outside eviction: Kueue takes a waiting gang's reservation back without
    evicting it, its check left as it is, when its LocalQueue or ClusterQueue is stopped,
    deleted or missing. As Kueue, the attempt in flight is kept, so a reservation regained
    soon finds it where it was; but only until its deadline: then (or at once, when its
    rollback had begun) it is withdrawn, what arrived for it reclaimed safely and its hold
    lifted, so a gang that may never get its quota back holds no capacity, and the check
    says so. The next reservation starts the attempt afresh. A Ready check's attempt is
    kept (its gang is admitted as soon as it has quota again), but not the racers that lost
    to it: they are not the gang's whether it has quota or not (`left_behind`); nor the hold
    of its request deleted outside gangcheck (`_hold_of_gone`), which quota may never come
    back to lift."""
    live = [r for r in snap.requests if not r.deleting]
    if state.state == READY:
        if not consumed_request(state):  # a slice's (its attempts are its own): as before
            return Decision()
        req = flow.find(snap.requests, _ready_request(snap, state))
        if req is None:
            return _hold_of_gone(snap, state)
        return left_behind(snap, req, state.retry_count + 1) or Decision()
    if state.state != PENDING or not live:
        return Decision()
    rolling = any(rollback.is_rolling_back(r) for r in live)
    deadlines = [d for r in live if (d := rollback.deadline_of(r)) is not None]
    due = max(deadlines, default=None)
    if not rolling and (due is None or now < due):
        return Decision(requeue_after=(due - now).total_seconds() if due else None)
    lost = snap.workload.conditions.get("QuotaReserved")
    said = f" ({lost.reason}: {lost.message})" if lost and lost.message else ""
    why = f"quota lost{said} past the attempt's deadline"
    decision = _with_deletions(snap, Decision(), why)
    if decision.requeue_after is not None and not decision.actions:
        return decision  # the node cache is catching up: withdrawn once it has
    gone = ", ".join(a.name for a in decision.actions if isinstance(a, DeleteRequest))
    reclaimed = sum(len(a.nodes) for a in decision.actions if isinstance(a, ReclaimArrivals))
    message = (
        f"Workload {why}: provisioning request {gone} withdrawn"
        + (f", the {reclaimed} node(s) that arrived for it reclaimed safely" if reclaimed else "")
        + "; asked for again once Kueue reserves quota"
    )
    noted = _transition(state, PENDING, message, now)
    return replace(decision, check=noted.check, events=(*noted.events, *decision.events))


def _competing(snap: Snapshot, state: CheckState, now: datetime) -> Decision:
    """Two checks would each have the pods consume a request: Kueue refuses the conflicting
    podSetUpdates and finishes the Workload. Say so and make no request; the job waits."""
    message = (
        f"the Workload also lists admission check {', '.join(snap.competing)}, which "
        "provisions capacity too; a pod can consume only one ProvisioningRequest, so none is "
        "made: keep one provisioning check on the ClusterQueue"
    )
    decision = _transition(state, PENDING, message, now)
    if decision.check is None:
        return decision
    event = Event("ConflictingAdmissionChecks", message, warning=True)
    return replace(decision, events=(*decision.events, event))


def _inactive(snap: Snapshot, state: CheckState, now: datetime) -> Decision:
    """No valid config (deleted, or made invalid): nothing new is asked for, and nothing
    asked for or provisioned is lost. The attempt in flight goes on, and is rolled back if
    it must be, under the config it was made with (recorded on its request); a Ready check
    stays Ready, its gang untouched. When the config is back, the same attempt goes on."""
    req = flow.find(snap.requests, _current(snap, state)[0])
    recorded = lifecycle.recorded_config(req) if req is not None else None
    if recorded is not None:
        decision = decide(replace(snap, config=recorded, config_problem="", inactive=""), now)
        note = f" (the check is not active: {snap.config_problem}; {ATTEMPT_GOES_ON})"
        return _noted(decision, state, note)
    if state.state == READY:
        return Decision()
    if state.state in (RETRY, REJECTED):
        return _after_rollback(snap, state)
    message = f"the check is not active: {snap.config_problem}; no provisioning request is made"
    if req is not None:
        message += f" (provisioning request {req.name} is kept as it is until the config is back)"
    return _transition(state, PENDING, message, now)


ATTEMPT_GOES_ON = "the attempt in flight goes on under the config it was made with"


def _noted(decision: Decision, state: CheckState, note: str) -> Decision:
    """The decision made while the check is not active, its Pending message followed by
    `note`; the entry written only when that changes it (the decision was made against the
    entry with the note, so an unchanged message comes back without it). A decision that
    leaves the entry alone while what arrived goes back (a rollback) leaves it alone."""
    rolling = decision.step is not None and decision.step.progress in (
        Progress.ROLLING_BACK,
        Progress.ROLLED_BACK,
    )
    entry = decision.check or state
    if entry.state != PENDING or (decision.check is None and rolling):
        return decision
    message = entry.message if entry.message.endswith(note) else entry.message + note
    noted = replace(entry, message=message[:MAX_MESSAGE])
    return replace(decision, check=None if noted == state else noted)


def _with_deletions(snap: Snapshot, decision: Decision, why: str) -> Decision:
    """The decision, plus deleting every request of the check, each with an Event."""
    withdrawn = _withdraw_attempts(snap, why)
    gone = withdrawn.actions
    events = withdrawn.events + tuple(
        Event("ProvisioningRequestDeleted", f"Deleted ProvisioningRequest {a.name!r}: {why}")
        for a in gone
        if isinstance(a, DeleteRequest)
    )
    waits = [t for t in (decision.requeue_after, withdrawn.requeue_after) if t is not None]
    return replace(
        decision,
        actions=(*gone, *decision.actions),
        events=(*decision.events, *events),
        requeue_after=min(waits, default=None),
    )


def _withdraw_attempts(snap: Snapshot, why: str) -> Decision:
    """Withdraw every attempt this Workload has for this check (flow.withdraw); a deleted
    Workload's fulfilled attempt has its arrivals reclaimed too (rollback.abandon)."""
    return flow.withdraw(Decision, snap, why, gone=snap.workload.deleting)


def _withdrawn(snap: Snapshot, state: CheckState | None, now: datetime) -> Decision:
    """The gang is gone or evicted: every attempt withdrawn, what arrived reclaimed, each
    said in an Event; an evicted Workload whose arrivals are reclaimed has its check say so
    instead of its last progress."""
    why = _why_cleanup(snap.workload)
    decision = _withdraw_attempts(snap, why)
    events = decision.events
    reclaimed = sum(len(a.nodes) for a in decision.actions if isinstance(a, ReclaimArrivals))
    evicted = snap.workload.is_evicted and not (snap.workload.deleting or snap.workload.is_finished)
    if not (evicted and reclaimed and state is not None and state.state == PENDING):
        return replace(decision, events=events)  # as Kueue: the check is left as it is
    gone = ", ".join(a.name for a in decision.actions if isinstance(a, DeleteRequest))
    message = (
        f"{why}: provisioning request {gone} withdrawn; the {reclaimed} node(s) that arrived "
        "for it are reclaimed safely"
    )
    noted = _transition(state, PENDING, message, now)
    return replace(decision, check=noted.check, events=(*noted.events, *events))


def _why_cleanup(wl: Workload) -> str:
    if wl.deleting:
        return "Workload deleted"
    if wl.is_finished:
        return "Workload finished"
    if wl.is_evicted:
        return "Workload evicted"
    return "Workload has no quota reservation"


def _not_needed(snap: Snapshot, state: CheckState, now: datetime) -> Decision:
    """No pod set needs capacity: Ready, and (as Kueue) no request kept."""
    ready = (
        Decision()
        if state.state == READY
        else _transition(state, READY, NOT_NEEDED, now, pod_set_updates=())
    )
    return _with_deletions(snap, ready, NOT_NEEDED)


def _while_ready(snap: Snapshot, state: CheckState, now: datetime) -> Decision:
    """After Ready: a revoked capacity rejects; in fit mode (now or when the attempt was made:
    `_fit_as_made`) the start watchdog runs; asks of the attempt that lost a race and are not
    withdrawn yet are withdrawn."""
    wl = snap.workload
    req = flow.find(snap.requests, _ready_request(snap, state))
    if req is None:
        return _hold_of_gone(snap, state)
    behind = left_behind(snap, req, state.retry_count + 1)
    if behind is not None:
        return behind
    attempt = _attempt(snap, req)
    if rollback.is_rolling_back(req):
        return _outcome(snap, state, req, lifecycle.roll_back(attempt), now)
    if attempt.status.has(Phase.REVOKED) and wl.active:
        message = attempt.status.signal(Phase.REVOKED).message or "capacity revoked"
        return _transition(state, REJECTED, message, now)
    lost = None if wl.is_admitted else _lost_before_admission(attempt.status)
    fit = _fit_as_made(attempt)
    if lost is not None and fit:  # the booking is gone: reclaim, then Retry
        return _outcome(snap, state, req, lifecycle.start_rollback(attempt, lost, now=now), now)
    if lost is not None:  # as Kueue: Retry (or Rejected)
        return _outcome(snap, state, req, lifecycle.from_status(attempt, now), now)
    started = rollback.record_of(req).phase is AttemptPhase.STARTED
    if fit and wl.is_admitted and not started:
        return _watch_start(snap, attempt, now)
    if started:
        return _release_holds(snap, req)
    return Decision()


def _hold_of_gone(snap: Snapshot, state: CheckState) -> Decision:
    """The request a Ready check's gang consumes, deleted outside gangcheck: what it held
    for the gang is held by nothing now, lifted (`lifecycle.release_holds_of_gone`)."""
    lift, said = lifecycle.release_holds_of_gone(
        snap.capacity, snap.workload.ref.namespace, (_ready_request(snap, state),)
    )
    return Decision(actions=lift, events=said)


def left_behind(snap: Snapshot, req: ProvisioningRequest, attempt: int) -> Decision | None:
    """The asks of attempt `attempt` other than `req`, the one the Ready gang consumes, not
    withdrawn yet: racers that lost (Ready is written before they are withdrawn, flow.won,
    so a withdrawal that met a change meanwhile, or a restart between the two, leaves them),
    withdrawn now, what arrived for them reclaimed; None when none is left. The requests
    `req` tops up are the gang's too (topped up, not raced)."""
    asks = race.asks(
        snap.requests, lambda k: naming.request_name(snap.workload.ref.name, snap.check, attempt, k)
    )
    kept = {r.name for r in topup.kept_for(snap.requests, req)}
    losers = [r for r in race.left_behind(asks, req.name) if r.name not in kept]
    if not losers:
        return None
    withdrawn = _withdraw_losers(snap, losers)
    return withdrawn if withdrawn.actions or withdrawn.requeue_after is not None else None


def _release_holds(snap: Snapshot, req: ProvisioningRequest) -> Decision:
    """Lift the hold from the nodes of the request and of the requests it tops up; those of
    a request it tops up that is gone (deleted outside gangcheck) too, once the API server
    confirms it (`lifecycle.release_holds_of_gone`, with the Event saying so)."""
    every = (req, *topup.kept_for(snap.requests, req))
    gone = topup.kept_gone(snap.requests, req)
    lifted, said = lifecycle.release_holds_of_gone(snap.capacity, req.ref.namespace, gone)
    own = tuple(a for r in every for a in lifecycle.release_hold(snap.capacity, r))
    return Decision(actions=(*own, *lifted), events=said)


def _attempt(
    snap: Snapshot, req: ProvisioningRequest, status: AttemptStatus | None = None
) -> lifecycle.Attempt:
    """The attempt of this request, as the core reads it: under its source's deadline, the
    node labels of the source it asked (`lifecycle.asked_source`) and its domain, the pod sets
    of the config it was made under (`lifecycle.made_under`: a managedResources narrowed since
    does not turn it Ready with a pod set it asked for not placed), with the place next in
    line."""
    assert snap.config is not None
    place = places.of_request(req)
    asked = lifecycle.asked_source(req, snap.config)
    made = lifecycle.made_under(req, snap.config)
    gang = gang_templates(snap, labels=asked.node_selector, made=made)  # any one domain
    capacity = snap.capacity
    kept = topup.kept_for(snap.requests, req)
    if kept:  # topping kept arrivals up: the gang on their nodes and its own
        labels = topup.shared_labels(snap.config, req, kept)
        gang = topup.tolerating(gang_templates(snap, labels=labels, made=made), kept)
        capacity = topup.view(snap.capacity, kept)
    return lifecycle.Attempt(
        request=req,
        status=status or snap.backend.status_of(req),
        gang=gang,
        capacity=capacity,
        config=lifecycle.source_config(snap.config, asked),
        fit=_fit_mode(snap),
        started=snap.workload.is_admitted,
        fallback=driver.next_in_line(snap.config, place, _gang_of(snap), snap.capacity),
    )


def _gang_of(snap: Snapshot) -> places.GangOf:
    """The gang as each capacity source would be asked for it."""
    return lambda index: gang_templates(snap, place=places.Place(index))


def _gang(snap: Snapshot, state: CheckState, now: datetime) -> flow.Gang[Decision]:
    """The Workload's gang as the attempt flow (flow.py) reads it: its attempt is the check's
    retry, each ask made by `_create`; an attempt that ends Retries or is Rejected."""
    assert snap.config is not None
    return flow.Gang(
        kind=Decision,
        held=snap,
        owner=snap.workload.ref.name,
        namespace=snap.workload.ref.namespace,
        short=snap.check,
        attempt=state.retry_count + 1,
        gang_of=_gang_of(snap),
        pinned=lambda labels: gang_templates(snap, labels=labels),
        create=partial(_create, snap, state, now),
        ended=lambda _, why: _retry_or_reject(snap, state, "rollback", why, now),
        now=now,
        say=partial(_say, state, now),
    )


def _say(state: CheckState, now: datetime, message: str, event: Event) -> Decision:
    """The check in its state, its message this one; `event` once, when that changes what it
    says."""
    said = _transition(state, state.state, message, now)
    return replace(said, events=(*said.events, event)) if said.check is not None else said


def _outcome(
    snap: Snapshot, state: CheckState, req: ProvisioningRequest, step: lifecycle.Step, now: datetime
) -> Decision:
    """Where the attempt stands, written as the check entry (the step kept on the decision)."""
    return replace(_written(snap, state, req, step, now), step=step)


def _written(
    snap: Snapshot, state: CheckState, req: ProvisioningRequest, step: lifecycle.Step, now: datetime
) -> Decision:
    if step.progress is Progress.ROLLED_BACK:
        assert step.verdict is not None
        rolled = _rolled_back(snap, state, req, step, now)
        failed = driver.failed_note(snap.config, req, step.verdict.reason)
        return replace(rolled, sources=(*failed, *rolled.sources))
    if step.progress is Progress.FITS:
        domains = step.domains
        if not _fit_mode(snap):  # trusted, no fit to choose: the domain it asked
            made = lifecycle.made_under(req, snap.config)
            domains = places.asked_pins(gang_templates(snap, made=made), places.of_request(req))
        ready = _ready(snap, state, req, step.message, now, domains=domains)
        delivered = driver.delivered_note(snap.config, req, now)
        return replace(ready, actions=(*step.actions, *ready.actions), sources=delivered)
    if step.progress in (Progress.FAILED, Progress.EXPIRED):
        given = RollbackCause.FAILED if step.progress is Progress.FAILED else RollbackCause.EXPIRED
        said = RollbackCause.of(step.message)  # CapacityIsNotFound when the step says so
        cause = said if said is RollbackCause.NOT_FOUND else given
        failed = driver.failed_note(snap.config, req, cause.value)
        ended = _fall_back(snap, state, req, step.message, now)
        if ended is None and step.progress is Progress.FAILED:
            ended = _retry_or_reject(snap, state, "failure", step.message, now)
        elif ended is None:
            ended = _retry_or_reject(snap, state, "booking expired", step.message, now)
        return replace(ended, sources=(*failed, *ended.sources))
    if step.progress is Progress.REVOKED and not snap.workload.active:
        # as Kueue: only an active Workload is rejected (deactivated)
        message = f"{step.message}; the Workload is deactivated, so the check is not rejected"
        return _transition(state, state.state, message, now)
    if step.progress is Progress.REVOKED:
        return _transition(state, REJECTED, step.message, now)
    if step.progress is Progress.ROLLING_BACK:
        return _keep(snap, state, req, step, now) or flow.rolling(Decision, step)
    pending = _transition(state, PENDING, step.message, now)
    refused = driver.refused_note(snap.config, req, snap.backend.status_of(req))
    return replace(pending, actions=step.actions, requeue_after=step.requeue_after, sources=refused)


def _rolled_back(
    snap: Snapshot,
    state: CheckState,
    req: ProvisioningRequest,
    step: lifecycle.Step,
    now: datetime,
) -> Decision:
    """The rollback is done: the next capacity source, else Retry or Rejected (a revoked
    capacity rejects)."""
    done = step.verdict
    assert done is not None
    fell_back = None
    if driver.falls_back(done):
        fell_back = _fall_back(snap, state, req, done.message, now)
    # the attempt ends: what was kept for it goes back first, each by its own record
    going_back = flow.outstanding(Decision, snap, req, done.message)
    if fell_back is None and going_back is not None:
        return going_back
    if fell_back is not None:
        decision = fell_back
    elif done.revoked and not snap.workload.active:
        decision = Decision()  # as Kueue: a deactivated Workload is not rejected again
    elif done.revoked:
        decision = _transition(state, REJECTED, done.message, now)
    elif done.cause is RollbackCause.CONFIG_CHANGED:
        decision = _retry(snap, state, f"Retrying after config change: {done.message}", now)
    else:
        decision = _retry_or_reject(snap, state, "rollback", done.message, now)
    return replace(decision, events=(*decision.events, *step.events))


def _fall_back(
    snap: Snapshot, state: CheckState, req: ProvisioningRequest, why: str, now: datetime
) -> Decision | None:
    """The place this attempt asked could not deliver: the next asked in the same attempt
    (flow.fall_back; no retry of Kueue's is used); None when no place is next (then Retry or
    Rejected, as with one source), or once the check is no longer Pending."""
    if state.state != PENDING:
        return None
    return flow.fall_back(_gang(snap, state, now), req, why)


def _keep(
    snap: Snapshot,
    state: CheckState,
    req: ProvisioningRequest,
    step: lifecycle.Step,
    now: datetime,
) -> Decision | None:
    """InOrder tops up instead of throwing away (flow.keep), while the check is Pending, in
    fit mode, with ProvisioningRequests; None when the rollback goes on as before."""
    if state.state != PENDING or not _fit_mode(snap) or snap.backend is not PROVISIONING_REQUEST:
        return None
    return flow.keep(_gang(snap, state, now), req, step)


def _lost_before_admission(status: AttemptStatus) -> str | None:
    """A Ready check's request Failed or its booking expired before Kueue admitted the gang
    (other checks, or a second scheduling pass, still pending): the capacity may be gone."""
    for phase in (Phase.FAILED, Phase.EXPIRED):
        if status.has(phase):
            return f"{phase}: {status.signal(phase).text}"
    return None


def _fit_mode(snap: Snapshot) -> bool:
    assert snap.config is not None
    return snap.config.fulfillment.mode is FulfillmentMode.FIT


def _fit_as_made(attempt: lifecycle.Attempt) -> bool:
    """Whether a Ready attempt is finished in fit mode: in fit mode now, or made in fit mode
    (`Attempt.made`): its claimed nodes carry its hold until it is Started, and what
    arrived for it goes back should its capacity be lost before admission, a mode switched
    to TrustProvisioned since notwithstanding (else the hold stayed for the gang's whole
    life, and the arrivals were left)."""
    return attempt.fit or attempt.made.fulfillment.mode is FulfillmentMode.FIT


def _watch_start(snap: Snapshot, attempt: lifecycle.Attempt, now: datetime) -> Decision:
    """The start watchdog: every member scheduled within the start deadline, or roll back."""
    assert snap.config is not None
    req = attempt.request
    assert isinstance(req, ProvisioningRequest)
    total = start_total(snap.workload, req, snap.config)
    scheduled = members_scheduled(snap.capacity, req.ref.namespace, req.name)
    if scheduled >= total:
        started = AnnotateRequest(req.name, {PHASE_ANNOTATION: STARTED})
        released = _release_holds(snap, req)
        return replace(released, actions=(*released.actions, started))
    limit = attempt.config.fulfillment.start_deadline_seconds  # the config's now
    admitted = parse_time(snap.workload.conditions["Admitted"].last_transition_time)
    waited = (now - admitted).total_seconds() if admitted else 0.0
    if waited < limit:  # a member bound or gone requeues the gang: only the deadline is due
        return Decision(requeue_after=limit - waited)
    trigger = (
        f"StartDeadline: {scheduled} of {total} members scheduled within {limit}s of admission"
    )
    return flow.rolling(Decision, lifecycle.start_rollback(attempt, trigger, now=now))


def start_total(
    wl: Workload, req: ProvisioningRequest, config: AtomicProvisioningSpec | None
) -> int:
    """How many members must be scheduled for the attempt of `req` to have started: what it
    asked for and the members the kept nodes it tops up hold, within the members the Job has
    now (an elastic Job scaled down in place since: `members_now`) of the pod sets the config
    the attempt was made under manages (`lifecycle.made_under`: a managedResources changed
    since does not lower the count, and so mark it started early, its holds lifted)."""
    made = lifecycle.made_under(req, config)
    managed = made.managed_resources if made is not None else ()
    asked = sum(p.count for p in req.pod_sets) + topup.kept_members(req)
    return min(asked, sum(members_now(wl, ps) for ps in required_pod_sets(wl, managed)))


def members_scheduled(capacity: ClusterView | None, namespace: str, request: str) -> int:
    """Pods of the namespace consuming the request that are bound to a node and not finished
    (the count the cluster capacity keeps, or counted from the pods)."""
    if capacity is not None and capacity.cluster is not None:
        return capacity.cluster.tallied(namespace, request)
    return tally(capacity.pods if capacity else (), CONSUME_ANNOTATION, namespace, request)


def _request_name(snap: Snapshot, state: CheckState, ask: int = 0) -> str:
    return naming.request_name(snap.workload.ref.name, snap.check, state.retry_count + 1, ask)


def _current(snap: Snapshot, state: CheckState) -> tuple[str, int]:
    """The request of the attempt in flight: its name, and which ask of the attempt it is."""
    return flow.current(snap.requests, snap.workload.ref.name, snap.check, state.retry_count + 1)


def _ready_request(snap: Snapshot, state: CheckState) -> str:
    """The request a Ready check's gang consumes, else the attempt's current one."""
    return consumed_request(state) or _current(snap, state)[0]


def consumed_request(state: CheckState) -> str:
    """The request the check's podSetUpdates have the gang consume (with Race it need not be
    the latest ask); '' when they name none."""
    for update in state.pod_set_updates:
        name = (update.get("annotations") or {}).get(CONSUME_ANNOTATION)
        if name:
            return str(name)
    return ""


def _pending(snap: Snapshot, state: CheckState, now: datetime) -> Decision:
    assert snap.config is not None
    if _racing(snap, state):
        return _race(snap, state, now)
    gang = _gang(snap, state, now)
    return flow.in_order(
        gang,
        first=partial(flow.first_ask, gang),
        in_flight=lambda req: _in_flight(snap, state, req, now),
        why=gang.superseded,
    )


# ---- Race --------------------------------------------------------------------------------


def _racing(snap: Snapshot, state: CheckState) -> bool:
    """Whether the attempt in flight is a race (`race.is_race`: as its asks were made)."""
    attempt = state.retry_count + 1
    asks = race.asks(
        snap.requests, lambda k: naming.request_name(snap.workload.ref.name, snap.check, attempt, k)
    )
    return race.is_race(asks, snap.config)


def _race(snap: Snapshot, state: CheckState, now: datetime) -> Decision:
    """capacitySourcePolicy Race (logic/attempt/race.py): the first `raceWidth` sources asked
    at once; the first to deliver the whole gang wins (Ready, pinned to its nodes) and the
    others are withdrawn, what arrived for them reclaimed as a rollback's; a racer that fails
    gives its place to the next source not asked yet; when every source failed, Retry or
    Rejected."""
    gang = _gang(snap, state, now)
    return flow.race_attempt(
        gang,
        start=lambda: _start_race(snap, state, gang, now),
        follow=lambda asks: _follow_race(snap, state, gang, asks, now),
    )


def _start_race(
    snap: Snapshot, state: CheckState, gang: flow.Gang[Decision], now: datetime
) -> Decision:
    made = flow.racers(gang)
    settled = next((d for d in made if d.check is not None and d.check.state != PENDING), None)
    return settled or _raced(snap, state, made, now)


def _raced(snap: Snapshot, state: CheckState, made: list[Decision], now: datetime) -> Decision:
    """The racers' decisions as one: all their actions, Events and notes; one message."""
    said = [d.check.message for d in made if d.check is not None]
    return flow.joined(_transition(state, PENDING, race.racing(said), now), made)


def _follow_race(
    snap: Snapshot,
    state: CheckState,
    gang: flow.Gang[Decision],
    asks: list[race.Ask],
    now: datetime,
) -> Decision:
    """The race as it stands (race.follow), written as the check entry: Ready on the winner;
    else the racers going, a new ask for each place given up (made before the racer that
    gave it up is withdrawn); else Retry or Rejected."""
    standing = flow.standing(gang, asks, lambda r, others: _follow_racer(snap, r, others, now))
    if standing.won is not None:
        return _won(snap, state, standing.won, now)
    going: list[Decision] = [
        Decision(
            check=replace(state, message=g.message) if g.message is not None else None,
            actions=g.actions,
            events=g.events,
            requeue_after=g.requeue_after,
        )
        for g in standing.going
    ]
    for e in standing.ended:
        # the ask in its place first: it records what the race has asked (race._given), and
        # a restart between the two must not find the racer gone and its place not given
        made = flow.replacement(gang, e)
        if made is not None:
            going.append(made)
        going.append(Decision(actions=e.actions, sources=e.notes))
    if any(d.check is not None for d in going):
        return _raced(snap, state, going, now)
    failed = race.every_source_failed(standing)
    out = _retry_or_reject(snap, state, "rollback", failed, now)
    return replace(
        out,
        actions=(*out.actions, *(a for d in going for a in d.actions)),
        events=(*out.events, *(e for d in going for e in d.events)),
        sources=tuple(n for d in going for n in d.sources),
    )


def _follow_racer(
    snap: Snapshot, req: ProvisioningRequest, others: bool, now: datetime
) -> driver.InFlight:
    """One racer, as an attempt of its own; `others`: another racer or source remains, so a
    racer whose source says CapacityIsNotFound ends at once."""
    assert snap.config is not None
    place = places.of_request(req)
    attempt = replace(_attempt(snap, req), fallback="the race" if others else None)
    return driver.in_flight(
        attempt,
        now,
        class_name=_source_class(snap.config, place.source),
        parameters=_parameters(snap, place.source),
        upkeep=lambda: snap.backend.follow(req, _asked_again(snap, req)),
    )


def _won(snap: Snapshot, state: CheckState, won: race.Won, now: datetime) -> Decision:
    """The first racer to deliver the whole gang: Ready on it; the others withdrawn, what
    arrived for them reclaimed by the safe path of a rollback (race.won)."""
    followed = won.followed
    assert followed.step is not None
    return flow.won(_outcome(snap, state, followed.request, followed.step, now), won)


def _withdraw_losers(snap: Snapshot, losers: list[ProvisioningRequest]) -> Decision:
    """Racers that lost: withdrawn, what arrived for them reclaimed (race.withdraw_losers)."""
    gone = race.withdraw_losers(
        losers, capacity=snap.capacity, config=snap.config, backend=snap.backend
    )
    return flow.decided(Decision, gone)


def _create(
    snap: Snapshot,
    state: CheckState,
    now: datetime,
    name: str,
    new: flow.NewAsk,
) -> Decision:
    """Ask for the gang at the new ask's place (a capacity source, a topology domain), its
    message beginning with what the ask says (why an earlier place was left); with kept
    requests (topup.py) only the members their nodes cannot hold are asked."""
    assert snap.config is not None
    place = new.place
    source = place.source
    merged = _merged(snap)
    problem = _cannot_request(snap, merged, source)
    if problem is not None:
        return _transition(state, REJECTED, problem, now)
    missing = missing_flavors(
        snap.workload, required_pod_sets(snap.workload, snap.config.managed_resources), snap.flavors
    )
    if missing:
        message = (
            f"waiting for ResourceFlavor {', '.join(missing)} (named by the admission, not found)"
        )
        return replace(_transition(state, PENDING, message, now), requeue_after=10.0)
    reserved = 0
    new = flow.with_split(new, snap, lambda labels: gang_templates(snap, labels=labels))
    if new.kept_split is not None:
        on = new.kept_split.remainder
        merged = [replace(m, count=on[m.name]) for m in merged if m.name in on]
    if snap.config.reservations:
        split = reserved_split(
            snap.capacity,
            gang_templates(snap, place=places.Place(place.source)),
            reservations_of(snap.config),
        )
        if not split.remainder:
            message = f"the whole gang fits on reserved capacity: {describe(split)}"
            ready = _transition(state, READY, message, now, pod_set_updates=())
            return replace(ready, capacity_used={"reserved": split.reserved_members})
        reserved = split.reserved_members
        merged = [
            replace(m, count=split.remainder[m.name]) for m in merged if m.name in split.remainder
        ]
    flavors = snap.workload.flavors
    record = {
        **flow.record(state.retry_count + 1, snap.config, now, new, reserved=reserved),
        WORKLOAD_UID_ANNOTATION: snap.workload.ref.uid,
        **({FLAVORS_ANNOTATION: ",".join(flavors)} if flavors else {}),
    }
    made = _ask(snap, name, merged, record=record, place=place)
    write = partial(_transition, state, PENDING, now=now)
    return flow.ask(snap, made, new, reserved=reserved, write=write)


def _cannot_request(snap: Snapshot, merged: list[MergedPodSet], source: int = 0) -> str | None:
    assert snap.config is not None
    if driver.too_many_pod_sets(len(merged)):
        return (
            f"the gang has {len(merged)} distinct pod sets; a ProvisioningRequest carries at "
            f"most {driver.MAX_REQUEST_POD_SETS} (set podSetMergePolicy to merge similar pod sets)"
        )
    for m in merged:
        level = required_level(m.template)
        problem = label_key_problem(level) if level else None
        if problem is not None:
            return (
                f"pod set {m.name} requires one domain of topology level {level!r}, which no "
                f"node can carry: {problem}"
            )
    params = _parameters(snap, source)
    if len(params) > 100:
        return f"{len(params)} request parameters (config plus provreq annotations); at most 100"
    too_long = sorted(k for k, v in params.items() if len(v) > 255)
    if too_long:
        return f"request parameter {too_long[0]} is longer than 255 characters"
    return None


def _merged(snap: Snapshot) -> list[MergedPodSet]:
    assert snap.config is not None
    return _merged_under(snap.workload, snap.config)


def _merged_under(wl: Workload, config: AtomicProvisioningSpec) -> list[MergedPodSet]:
    """The request pod sets of `wl` under `config`: those its managedResources names, merged
    by its podSetMergePolicy."""
    required = required_pod_sets(wl, config.managed_resources)
    return merge_pod_sets(wl, required, config.pod_set_merge_policy)


def _ask(
    snap: Snapshot,
    name: str,
    merged: list[MergedPodSet],
    *,
    record: Mapping[str, str] | None = None,
    place: places.Place | None = None,
    labels: Mapping[str, str] | None = None,
    made: AtomicProvisioningSpec | None = None,
) -> Ask:
    """The attempt's ask at `place`: a pod set per merged pod set (pinned to its capacity
    source's node labels, or `labels`, and its topology domain), the Workload owning its
    objects; `made`: the config an ask in flight was made under (`gang_templates`)."""
    assert snap.config is not None
    wl = snap.workload
    place = place or places.Place()
    source = place.source
    gang = gang_templates(snap, place=place, labels=labels, made=made)
    pinned = {ps: tpl for ps, _, tpl in gang.pod_sets}
    return Ask(
        attempt=name,
        namespace=wl.ref.namespace,
        pod_sets=tuple(
            AskedPodSet(
                m.name,
                m.count,
                pinned.get(m.name) or pod_template_spec(wl, m.name, m.template, snap.flavors),
            )
            for m in merged
        ),
        identity={
            WORKLOAD_ANNOTATION: wl.ref.name,
            WORKLOAD_UID_ANNOTATION: wl.ref.uid,
            CHECK_ANNOTATION: snap.check,
        },
        record=record or {},
        capacity_class=_source_class(snap.config, source),
        parameters=_parameters(snap, source),
        existing=snap.templates,
    )


def _in_flight(
    snap: Snapshot, state: CheckState, req: ProvisioningRequest, now: datetime
) -> Decision:
    """The request exists: as the driver follows it (its templates made again where gone,
    pinned to the source it asked), written as the check entry; a config changed under it
    ends it (driver.in_flight)."""
    assert snap.config is not None
    index = places.of_request(req).source
    followed = driver.in_flight(
        _attempt(snap, req),
        now,
        class_name=_source_class(snap.config, index),
        parameters=_parameters(snap, index),
        upkeep=lambda: snap.backend.follow(req, _asked_again(snap, req)),
    )
    if followed.step is None:  # config changed, not in fit mode: as Kueue, Retry
        assert followed.change is not None
        decision = _retry(snap, state, f"Retrying after config change: {followed.change}", now)
    else:
        decision = _outcome(snap, state, followed.request, followed.step, now)
    return flow.followed(decision, followed, req.name)


def _asked_again(snap: Snapshot, req: ProvisioningRequest) -> Ask:
    """The ask of `req` as it was made: at its place, pinned to the source it asked, with
    the pod sets of the config it was made under (`lifecycle.made_under`: a template lost
    is made again for a pod set the config no longer manages)."""
    assert snap.config is not None
    labels = lifecycle.asked_source(req, snap.config).node_selector
    made = lifecycle.made_under(req, snap.config) or snap.config
    merged = _merged_under(snap.workload, made)
    return _ask(snap, req.name, merged, place=places.of_request(req), labels=labels, made=made)


# ---- rollback --------------------------------------------------------------------------


def _after_rollback(snap: Snapshot, state: CheckState) -> Decision:
    """With the verdict written, a rolled-back request is deleted (ending CA's booking)."""
    req = flow.find(snap.requests, _current(snap, state)[0])
    if req is None or req.deleting or OUTCOME_ANNOTATION not in req.annotations:
        return Decision()
    every = (req, *(r for r in topup.kept_for(snap.requests, req) if not r.deleting))
    return Decision(
        actions=tuple(
            a
            for r in every
            for a in (
                *lifecycle.release_hold(snap.capacity, r),
                *snap.backend.withdraw(r, "rolled back"),
            )
        )
    )


def _retry_or_reject(
    snap: Snapshot, state: CheckState, cause: str, detail: str, now: datetime
) -> Decision:
    """Retry while backoffLimitCount allows, else Rejected with a message that says why
    (Kueue copies it into the Workload's deactivation event)."""
    assert snap.config is not None
    attempt = state.retry_count + 1
    if lifecycle.next_attempt(attempt, snap.config.retry_strategy) is None:
        limit = snap.config.retry_strategy.backoff_limit_count
        return _transition(state, REJECTED, detail or _no_retry_left(cause, attempt, limit), now)
    prefix = f"Retrying after {cause}"
    return _retry(snap, state, f"{prefix}: {detail}" if detail else prefix, now)


def _no_retry_left(cause: str, attempt: int, limit: int) -> str:
    return (
        f"provisioning ended by {cause}, with no message from the autoscaler, on attempt "
        f"{attempt}; backoffLimitCount {limit} allows no more retries"
    )


def _retry(snap: Snapshot, state: CheckState, message: str, now: datetime) -> Decision:
    """Retry with Kueue's backoff: Kueue evicts, requeues, and the next attempt follows."""
    assert snap.config is not None
    delay = lifecycle.backoff_seconds(state.retry_count + 1, snap.config.retry_strategy)
    return _transition(state, RETRY, message, now, requeue_after_seconds=delay)


def gang_templates(
    snap: Snapshot,
    *,
    place: places.Place | None = None,
    labels: Mapping[str, str] | None = None,
    made: AtomicProvisioningSpec | None = None,
) -> GangSpec:
    """(name, count, pod template) of each request pod set, as the PodTemplates hold them
    (pinned to the capacity source and topology domain of `place`), and the topology level
    each must sit inside (`podsets.required_level`). The pod sets are those the config
    manages (`made`: the one an attempt in flight was made under; else the config now)."""
    assert snap.config is not None
    wl = snap.workload
    place = place or places.Place()
    pinned = _source_labels(snap.config, place.source) if labels is None else labels
    merged = _merged_under(wl, made or snap.config)
    topology = {m.name: level for m in merged if (level := required_level(m.template))}
    gang = GangSpec(
        tuple(
            (
                m.name,
                m.count,
                pod_template_spec(wl, m.name, m.template, snap.flavors, pinned=pinned),
            )
            for m in merged
        ),
        topology,
        namespace=wl.ref.namespace,
    )
    return places.pinned(gang, {}, place.domain)


def _ready(
    snap: Snapshot,
    state: CheckState,
    req: ProvisioningRequest,
    message: str,
    now: datetime,
    *,
    domains: Mapping[str, tuple[str, str]] | None = None,
) -> Decision:
    """Ready, and the request marked fulfilled: it no longer claims or holds back new nodes.
    The mark is written before the check, not after: a gang withdrawn between the two writes
    (deleted, finished, a replica killed meanwhile) would have its arrivals reclaimed
    (`rollback.abandon`) while its pods may already be bound there. Written the other way
    round, the fault suite caught that as an unsafe reclaim."""
    updates = pod_set_updates(snap, req, domains or {})
    decision = _transition(state, READY, message, now, pod_set_updates=updates)
    kept = (a for r in topup.kept_for(snap.requests, req) for a in lifecycle.fulfilled(r))
    actions = (*decision.actions, *kept, *lifecycle.fulfilled(req))
    assert snap.config is not None
    unpinned = tuple(
        Event(
            "InvalidClassDetail",
            f"provisioningClassDetails {detail} of {req.name} is {value!r}, not a label "
            f"value: the gang is not pinned to {key}",
            warning=True,
        )
        for key, detail, value in _class_details(snap.config, req)
        if label_value_problem(value) is not None
    )
    return replace(
        decision,
        actions=actions,
        capacity_used=capacity_used(req),
        events=(*decision.events, *unpinned),
    )


def pod_set_updates(
    snap: Snapshot, req: ProvisioningRequest, domains: Mapping[str, tuple[str, str]]
) -> tuple[Obj, ...]:
    """Consume and class annotations for every pod set the request covers, merged ones too;
    a node selector pinning the capacity source the request asked (`lifecycle.asked_source`,
    not whichever source sits at its index now) and the topology domain chosen for a
    constrained pod set. The pod sets are those of the config the request was made under
    (`lifecycle.made_under`), as its fit counts them."""
    assert snap.config is not None
    merged = _merged_under(snap.workload, lifecycle.made_under(req, snap.config) or snap.config)
    kept = topup.kept_for(snap.requests, req)
    pinned = (
        topup.shared_labels(snap.config, req, kept)
        if kept
        else lifecycle.asked_source(req, snap.config).node_selector
    )
    detail = {**pinned, **_detail_node_selector(snap.config, req)}
    holds = [hold_toleration(topup.key_of(r)) for r in kept]
    pin = {member: domains[m.name] for m in merged if m.name in domains for member in m.members}
    updates = []
    for member in sorted(n for m in merged for n in m.members):
        update: Obj = {
            "name": member,
            "annotations": {CONSUME_ANNOTATION: req.name, CLASS_ANNOTATION: req.class_name},
        }
        selector = {**detail, **dict([pin[member]])} if member in pin else detail
        if selector:
            update["nodeSelector"] = dict(selector)
        if _fit_mode(snap):
            update["tolerations"] = [hold_toleration(hold_key(req))]
            update["tolerations"] += holds  # the kept requests' nodes (topup.py)
        updates.append(update)
    return tuple(updates)


def _source_labels(config: AtomicProvisioningSpec, index: int) -> Mapping[str, str]:
    source = config.source(index)
    return source.node_selector if source is not None else {}


def _source_class(config: AtomicProvisioningSpec, index: int) -> str:
    source = config.source(index)
    return source.class_name if source is not None else config.provisioning_class_name


def _parameters(snap: Snapshot, index: int) -> dict[str, str]:
    """The request parameters for capacity source `index`: its own, and the Workload's
    provreq annotations."""
    assert snap.config is not None
    source = snap.config.source(index)
    own = source.parameters if source is not None else snap.config.parameters
    return request_parameters(own, snap.workload.annotations)


def _class_details(
    config: AtomicProvisioningSpec, req: ProvisioningRequest
) -> list[tuple[str, str, str]]:
    """The config's podSetUpdates.nodeSelector entries the request's class details fill:
    (label key, detail, the detail's value)."""
    if config.pod_set_updates is None:
        return []
    return [
        (s.key, s.value_from_provisioning_class_detail, value)
        for s in config.pod_set_updates.node_selector
        if (value := req.class_details.get(s.value_from_provisioning_class_detail)) is not None
    ]


def _detail_node_selector(
    config: AtomicProvisioningSpec, req: ProvisioningRequest
) -> dict[str, str]:
    """The node labels the class details pin the gang to; not a value no label can carry
    (no node has it, and Kueue's webhook refuses the check naming it: `_ready` says so)."""
    return {
        key: value
        for key, _, value in _class_details(config, req)
        if label_value_problem(value) is None
    }


def _transition(
    state: CheckState,
    new_state: str,
    message: str,
    now: datetime,
    *,
    pod_set_updates: tuple[Obj, ...] | None = None,
    requeue_after_seconds: int | None = None,
) -> Decision:
    """The check entry after this decision, or no write when nothing changes. The requeue
    delay is Retry's alone: a check leaving Retry (Kueue resets it to Pending keeping the
    delay) drops it, as Kueue's own check writes its entries."""
    message = message[:MAX_MESSAGE]
    updates = state.pod_set_updates if pod_set_updates is None else pod_set_updates
    requeue = requeue_after_seconds
    if requeue is None and new_state == RETRY == state.state:
        requeue = state.requeue_after_seconds
    new = replace(
        state,
        state=new_state,
        message=message,
        pod_set_updates=updates,
        requeue_after_seconds=requeue,
        last_transition_time=(
            format_time(now) if new_state != state.state else state.last_transition_time
        ),
    )
    if new == state:
        return Decision()
    events: tuple[Event, ...] = ()
    if new_state != state.state:
        text = check_updated(state.name, state.state, new_state, message)
        events = (Event(CHECK_UPDATED, text, warning=new_state in (RETRY, REJECTED)),)
    return Decision(check=new, events=events)


CHECK_UPDATED = "AdmissionCheckUpdated"
"""The reason of the Event on the Workload each time gangcheck changes its check's state."""


def check_updated(name: str, old: str, new: str, message: str) -> str:
    """The CHECK_UPDATED Event's message (`check_ended` reads it back)."""
    text = f"Admission check {name} updated state from {old} to {new}"
    return f"{text} with message: {message}" if message else text


def check_ended(text: str, name: str) -> tuple[str, str] | None:
    """(state, message) of a CHECK_UPDATED Event's message that turned the check `name` Retry
    or Rejected (Kueue resets both to Pending at once, the message with them: the Event keeps
    it); None for any other."""
    head = f"Admission check {name} updated state from "
    if not text.startswith(head):
        return None
    _, _, turn = text[len(head) :].partition(" to ")
    state, _, message = turn.partition(" with message: ")
    return (state, message) if state in (RETRY, REJECTED) else None
