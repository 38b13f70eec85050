"""Gangs that grow: Kueue Workload slices (the ``ElasticJobsViaWorkloadSlices`` gate).

Scaling a running elastic Job up (``kueue.x-k8s.io/elastic-job: "true"``) makes Kueue create a
new Workload, a *slice*, carrying the Job's whole new size (8, not the 4 added) and annotated
``kueue.x-k8s.io/workload-slice-replacement-for: <namespace>/<old slice>``. When the new slice
gets its quota, Kueue's scheduler finishes the old one (``Finished``, reason
``WorkloadSliceReplaced``; its ``Admitted`` condition stays) and the admission checks run on
the new slice while the Job's running pods go on; the added pods wait behind Kueue's
``kueue.x-k8s.io/elastic-job`` scheduling gate until the new slice is admitted. Scaling down
changes the admitted slice's counts in place: no new slice, nothing to ask.

So for a slice the check asks only for the difference: each pod set's count less what the
slice it replaces was admitted with (its members run: their usage is on the nodes already, so
the difference fitting whole on what is free is the whole slice fitting). The running members
are never counted as missing, never asked for again, never touched.

Two things differ from a fixed-size gang, both because Kueue would stop the whole Job:

- *No Retry, no Rejected.* Kueue evicts a Workload whose check says Retry or Rejected, and
  evicting the new slice suspends the Job, killing the running members. A slice's attempt is
  rolled back as any other (request deleted, arrivals reclaimed safely), and the check stays
  Pending: the next attempt follows after Kueue's backoff (the attempts counted by gangcheck
  on its own requests, not in Kueue's retryCount); with no attempt left it waits, saying so.
- *No start watchdog.* Its rollback would need a Retry. The added pods are the Job's: Kueue
  does not apply the new slice's podSetUpdates to a running Job, so they carry the first
  slice's (its consume annotation and hold toleration, not this request's); Kueue builds each
  slice from that template, so the slice says which hold the Job's pods tolerate
  (``held_as``). The nodes that arrive for the difference are held *as that* (``HOLD_AS`` on
  the request), so after Ready they stay closed to every pod but the Job's until the slice's
  members are all scheduled, or the start deadline has passed since Ready; then the hold is
  lifted and the attempt marked started (nothing is rolled back). A Job whose pods tolerate no
  hold of gangcheck's (its first slice fitted with no request) has its nodes opened at Ready.

A Job scaled again while its slice waits on the check gets a new slice replacing the pending
one (never admitted, so none of its members run): what runs is followed back to the slice
that was admitted (`predecessor_of`, ``Predecessor.before``). A slice evicted since it was
made had Kueue stop the whole Job: nothing runs, the whole slice is asked (`stopped_since`).

The difference is recorded on the request (``SLICE_ANNOTATION``) when it is made, so an
attempt in flight goes on as asked even if the old slice's Workload is deleted meanwhile.

Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from gangcheck.logic.attempt import flow, lifecycle, naming, rollback
from gangcheck.logic.attempt.actions import Action, AnnotateRequest, CreateRequest, Event
from gangcheck.logic.attempt.fulfillment import claim_of
from gangcheck.logic.attempt.hold import HOLD_TAINT, hold_value
from gangcheck.logic.attempt.records import AttemptPhase
from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.logic.workloads import admission
from gangcheck.logic.workloads.admission import MAX_MESSAGE, Decision, Snapshot
from gangcheck.logic.workloads.podsets import admitted_count, members_now
from gangcheck.model.names import (
    CONSUME_ANNOTATION,
    HOLD_AS,
    OUTCOME_ANNOTATION,
    PHASE_ANNOTATION,
    STARTED,
)
from gangcheck.model.objects import (
    CheckState,
    Obj,
    PodSet,
    PodSetAssignment,
    ProvisioningRequest,
    Workload,
    workload_of,
)

#: Kueue's annotation on a new slice: the ``namespace/name`` of the slice it replaces.
REPLACEMENT_FOR = "kueue.x-k8s.io/workload-slice-replacement-for"
#: Kueue's Finished reason on the slice a new one replaced.
REPLACED_REASON = "WorkloadSliceReplaced"
#: On a slice's request: the slice it adds to and the members per pod set that slice runs.
SLICE_ANNOTATION = "gangcheck.io/slice-base"

PENDING, READY, RETRY, REJECTED = "Pending", "Ready", "Retry", "Rejected"
#: After Ready, how often a slice whose added members are not all scheduled looks again (a
#: member bound onto a node that arrived for the slice wakes it at once; one bound elsewhere
#: is seen here).
MEMBERS_POLL_SECONDS = 5.0


@dataclass(frozen=True)
class Predecessor:
    """The slice a Workload names as the one it replaces, as the caches hold it."""

    key: str
    """``namespace/name`` as the annotation says."""
    workload: Workload | None
    """None: no such Workload (deleted, or the annotation names none)."""
    before: Predecessor | None = None
    """When `workload` was never admitted and is itself a slice (the Job scaled again while
    its slice waited: Kueue makes a new slice replacing the pending one): the slice that one
    replaced, whose members are what runs."""


@dataclass(frozen=True)
class Base:
    """What a slice adds to: the slice it replaces and the members per pod set running."""

    replaces: str
    running: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(self.running.values())

    def to_annotation(self) -> str:
        return json.dumps(
            {"replaces": self.replaces, "running": dict(self.running)}, sort_keys=True
        )

    @classmethod
    def from_annotation(cls, raw: str) -> Base | None:
        try:
            data = json.loads(raw)
            running = {str(k): int(v) for k, v in dict(data["running"]).items()}
            return cls(str(data["replaces"]), running)
        except (ValueError, KeyError, TypeError):
            return None


def replaced_key(wl: Workload) -> str:
    return wl.annotations.get(REPLACEMENT_FOR, "")


#: The most never-admitted slices followed back to the one whose members run.
MAX_PENDING_CHAIN = 16


def predecessor_of(
    wl: Workload, lookup: Callable[[str, str], Obj | None], *, depth: int = 0
) -> Predecessor | None:
    """The slice `wl` replaces, looked up by (name, namespace); None when `wl` is no slice.
    A replaced slice never admitted that is itself a slice is followed back (`before`) to
    the one whose members run."""
    key = replaced_key(wl)
    if not key:
        return None
    namespace, _, name = key.partition("/")
    obj = lookup(name, namespace) if name else None
    old = workload_of(obj) if obj is not None else None
    before = None
    if old is not None and not old.is_admitted and depth < MAX_PENDING_CHAIN:
        before = predecessor_of(old, lookup, depth=depth + 1)
    return Predecessor(key, old, before)


def stopped_since(wl: Workload) -> bool:
    """The slice was evicted since it was made (its ``Evicted`` condition, True or, once
    admitted again, False: Kueue v0.17 `SetQuotaReservation` resets it, it does not remove
    it): Kueue stopped the Job then (`jobframework` reconciler: an evicted Workload's job is
    stopped), so none of the replaced slice's members run any more."""
    return "Evicted" in wl.conditions


def base_of(wl: Workload, pred: Predecessor) -> Base | str:
    """The members the replaced slice runs per pod set, or why they cannot be told."""
    if stopped_since(wl):
        return Base(pred.key, {})  # the Job was stopped: the slice is the whole gang
    old = pred.workload
    finished = old.conditions.get("Finished") if old is not None else None
    if (
        finished is not None
        and finished.is_true
        and finished.reason == REPLACED_REASON
        and wl.ref.uid
        and wl.ref.uid not in finished.message
    ):
        return (
            f"this Workload is a slice replacing {pred.key}, which another slice replaced "
            f"already ({finished.message}): two slices raced for one Job; nothing is asked "
            "for this one"
        )
    running = _running(pred)
    return running if isinstance(running, str) else Base(pred.key, running)


def _running(pred: Predecessor) -> dict[str, int] | str:
    """The members per pod set that run under the replaced slice: its admitted counts, within
    the Job's count when it was scaled down since (`members_now`); for one never admitted,
    those of the slice it replaced in turn (nothing, when it is no slice: the Job never ran,
    the slice is the whole gang; nothing either when it was evicted while it waited, which
    stopped the Job)."""
    old = pred.workload
    if old is None:
        return (
            f"this Workload is a slice replacing {pred.key}, which is gone: which of the Job's "
            "members run already cannot be told, so nothing is asked (delete the Job's pending "
            "slice, or scale the Job again, for Kueue to make a new one)"
        )
    if old.is_admitted:
        return {ps.name: members_now(old, ps) for ps in old.pod_sets}
    if stopped_since(old):
        return {}  # evicted while it waited: Kueue stopped the Job, nothing of it runs
    if pred.before is None:
        if replaced_key(old):  # a slice whose own predecessor was not followed (too deep)
            return (
                f"this Workload is a slice replacing {pred.key}, a slice never admitted, "
                f"behind more than {MAX_PENDING_CHAIN} such slices: which of the Job's members "
                "run cannot be told, so nothing is asked"
            )
        return {}  # it never ran: the slice is the whole gang
    return _running(pred.before)


def shrunk(wl: Workload, base: Base) -> Workload:
    """The Workload with each pod set's count less the members running: what to ask for.
    The count is the Job's now (the spec: Kueue changes it in place when a pending slice is
    scaled down) within what the admission assigned."""
    spec = {ps.name: ps.count for ps in wl.pod_sets}

    def less(name: str, count: int) -> int:
        return max(0, count - base.running.get(name, 0))

    pod_sets = tuple(PodSet(ps.name, less(ps.name, ps.count), ps.template) for ps in wl.pod_sets)
    assignments = (
        None
        if wl.assignments is None
        else tuple(
            PodSetAssignment(
                a.name,
                None if a.count is None else less(a.name, min(a.count, spec.get(a.name, a.count))),
                a.flavors,
            )
            for a in wl.assignments
        )
    )
    return replace(wl, pod_sets=pod_sets, assignments=assignments)


def as_asked(wl: Workload, req: ProvisioningRequest | None) -> Workload:
    """The Workload as its request asked for it: for a slice whose request records what the
    replaced slice runs, less those members (what a diagnosis fits); else as it is."""
    if req is None or not replaced_key(wl):
        return wl
    base = Base.from_annotation(req.annotations.get(SLICE_ANNOTATION, ""))
    return wl if base is None else shrunk(wl, base)


def held_as(wl: Workload) -> str:
    """The request (``namespace/name``) whose hold the Job's pods tolerate: the consume
    annotation and the hold toleration the first slice's check gave the Job's pod template,
    which Kueue copies into every slice it makes from it; '' when a pod set carries none."""
    keys = set()
    for ps in wl.pod_sets:
        meta = ps.template.get("metadata") or {}
        name = (meta.get("annotations") or {}).get(CONSUME_ANNOTATION)
        if not name:
            return ""
        key = f"{wl.ref.namespace}/{name}"
        value = hold_value(key)
        tolerations = (ps.template.get("spec") or {}).get("tolerations") or []
        if not any(t.get("key") == HOLD_TAINT and t.get("value") == value for t in tolerations):
            return ""
        keys.add(key)
    return keys.pop() if len(keys) == 1 else ""


def describe(wl: Workload, base: Base) -> str:
    """The slice's relation to the running one: 'adds 4 members to default/x running 4'."""
    less = shrunk(wl, base)
    added = sum(admitted_count(less, ps) for ps in less.pod_sets)
    return f"workload slice: adds {added} members to {base.replaces} running {base.total}"


def relation(wl: Workload, req: ProvisioningRequest | None) -> str:
    """The slice's relation to the running one (`describe`) as its request recorded it: what
    the check message begins with, for `gangcheck status`; '' for a Workload that is no slice
    or a slice with nothing asked yet."""
    if req is None or not replaced_key(wl):
        return ""
    base = Base.from_annotation(req.annotations.get(SLICE_ANNOTATION, ""))
    return describe(wl, base) if base is not None else ""


def decide(snap: Snapshot, now: datetime, *, predecessor: Predecessor) -> Decision:
    """`admission.decide` for a Workload that replaces a running slice (`predecessor`): the
    difference asked for, the running members left alone."""
    wl = snap.workload
    state = wl.checks.get(snap.check)
    if (
        state is None
        or wl.deleting
        or wl.is_finished
        or wl.is_evicted
        or not wl.has_quota_reservation
        or snap.competing
        or state.state in (RETRY, REJECTED)
    ):
        return admission.decide(snap, now)  # nothing a slice does otherwise
    if snap.config is None:  # as admission's: the attempt in flight goes on as it was made
        latest = _latest(snap, state)
        made = lifecycle.recorded_config(latest[1]) if latest is not None else None
        if made is None:
            return admission.decide(snap, now)  # nothing asked: the check says it is inactive
        snap = replace(snap, config=made, config_problem="")
    recorded = _recorded(snap, state)
    if recorded is not None and recorded.total and stopped_since(wl):
        recorded = None  # asked while members ran, which the eviction stopped
    base = recorded if recorded is not None else base_of(wl, predecessor)
    if state.state == READY:
        return _while_ready(snap, state, now)
    if isinstance(base, str):
        return _cannot_tell(snap, state, base)
    said = describe(wl, base)
    latest = _latest(snap, state)
    if latest is None:
        return _difference(snap, state, base, said, attempts=state.retry_count, now=now)
    number, req = latest
    if OUTCOME_ANNOTATION not in req.annotations:
        return _difference(snap, state, base, said, attempts=number - 1, now=now)
    # the latest attempt is rolled back: say so once, then the next after its backoff
    ended = _difference(snap, state, base, said, attempts=number - 1, now=now)
    if ended.check is not None:
        return ended
    assert snap.config is not None
    due = _due(snap, number, req)
    if lifecycle.next_attempt(number, snap.config.retry_strategy) is None:
        return Decision()
    if due is not None and now < due:
        return Decision(requeue_after=max(1.0, (due - now).total_seconds()))
    return _difference(snap, state, base, said, attempts=number, now=now)


def _difference(
    snap: Snapshot, state: CheckState, base: Base, said: str, *, attempts: int, now: datetime
) -> Decision:
    """`admission.decide` on the difference, shown a check entry whose retryCount is the
    slice's own `attempts` made (request names follow it), written as a slice writes it."""
    shown = replace(state, retry_count=attempts, message=state.message.removeprefix(f"{said}; "))
    wl = snap.workload
    view = replace(
        snap, workload=replace(shrunk(wl, base), checks={**wl.checks, snap.check: shown})
    )
    decision = _restored(admission.decide(view, now), state)
    written = _slice_written(snap, state, decision, base=base, said=said, now=now)
    if written.check is not None and written.check == state:
        return replace(written, check=None, events=())
    return written


def recorded_predecessor(snap: Snapshot) -> Predecessor | None:
    """For a diagnosis, which reads no other Workload: the slice's predecessor as its latest
    request recorded it; None when the Workload is no slice or nothing was asked yet (a
    replay of the whole gang then, the check's own message saying what the slice adds)."""
    key = replaced_key(snap.workload)
    state = snap.workload.checks.get(snap.check)
    if not key or state is None or _recorded(snap, state) is None:
        return None
    return Predecessor(key, None)


def _recorded(snap: Snapshot, state: CheckState) -> Base | None:
    """The base recorded on the slice's latest request, if any."""
    latest = _latest(snap, state)
    if latest is None:
        return None
    return Base.from_annotation(latest[1].annotations.get(SLICE_ANNOTATION, ""))


def _latest(snap: Snapshot, state: CheckState) -> tuple[int, ProvisioningRequest] | None:
    """The slice's latest attempt at or after Kueue's (its number, its current request)."""
    wl = snap.workload
    attempts = {
        a: r
        for r in snap.requests
        if (a := naming.attempt_of(r.name, wl.ref.name, snap.check)) is not None
        and a >= state.retry_count + 1
    }
    if not attempts:
        return None
    number = max(attempts)
    names = {r.name for r in snap.requests}
    current, _ = naming.current_request(names, wl.ref.name, snap.check, number)
    req = next((r for r in snap.requests if r.name == current), attempts[number])
    return number, req


def _then(snap: Snapshot, state: CheckState) -> str:
    """When the next attempt of a slice whose latest was rolled back follows."""
    assert snap.config is not None
    latest = _latest(snap, state)
    if latest is None:
        return "the next attempt follows"
    number, req = latest
    if lifecycle.next_attempt(number, snap.config.retry_strategy) is None:
        limit = snap.config.retry_strategy.backoff_limit_count
        return f"backoffLimitCount {limit} allows no more attempts (scale the Job back to drop it)"
    due = _due(snap, number, req)
    return f"the next attempt at {format_time(due)}" if due else "the next attempt follows"


def _due(snap: Snapshot, number: int, req: ProvisioningRequest) -> datetime | None:
    assert snap.config is not None
    since = rollback.deadline_of(req) or parse_time(req.creation_timestamp)
    if since is None:
        return None
    return since + timedelta(seconds=lifecycle.backoff_seconds(number, snap.config.retry_strategy))


def _requeue(snap: Snapshot, state: CheckState, now: datetime) -> float | None:
    latest = _latest(snap, state)
    if latest is None:
        return None
    due = _due(snap, *latest)
    return max(1.0, (due - now).total_seconds()) if due is not None and due > now else None


def _restored(decision: Decision, state: CheckState) -> Decision:
    """The decision with Kueue's retryCount and requeue back in its check entry."""
    if decision.check is None:
        return decision
    check = replace(
        decision.check,
        retry_count=state.retry_count,
        requeue_after_seconds=state.requeue_after_seconds,
    )
    return replace(decision, check=None if check == state else check)


def _slice_written(
    snap: Snapshot, state: CheckState, decision: Decision, *, base: Base, said: str, now: datetime
) -> Decision:
    """The difference's decision as a slice writes it: the base recorded on a new request; a
    Retry or Rejected kept Pending; Ready opening the nodes held for the difference."""
    actions = tuple(_recording(a, base, held_as(snap.workload)) for a in decision.actions)
    decision = replace(decision, actions=actions)
    if decision.step is not None and decision.step.message:  # what a diagnosis says
        decision = replace(
            decision, step=replace(decision.step, message=f"{said}; {decision.step.message}")
        )
    check = decision.check
    if check is None:
        return decision
    if check.state in (RETRY, REJECTED):
        message = (
            f"{said}; {check.message}; {_then(snap, state)}; the slice waits Pending, its "
            f"{base.total} running members untouched (Retry or Rejected would have Kueue evict "
            "it and suspend the whole Job)"
        )
        events = tuple(e for e in decision.events if e.reason != "AdmissionCheckUpdated")
        # a Warning when Rejected (given up); Normal when retried, as a gang's RolledBack
        noted = Event("SliceRolledBack", message, warning=check.state == REJECTED)
        wait = _requeue(snap, state, now) or 1.0
        kept = _say(state, message, requeue=wait)
        return replace(decision, check=kept.check, events=(*events, noted), requeue_after=wait)
    if check.state == READY:
        req = _consumed(snap, check)
        after = _held_until_used(snap, req, now, since=now) if req is not None else Decision()
        message = f"{said}; {check.message}" if check.message else said
        if stopped_since(snap.workload):  # Kueue starts the Job again with these
            check = replace(check, pod_set_updates=compatible(snap.workload, check.pod_set_updates))
        return replace(
            decision,
            check=replace(check, message=message),
            actions=(*decision.actions, *after.actions),
            requeue_after=after.requeue_after or decision.requeue_after,
        )
    return replace(decision, check=replace(check, message=f"{said}; {check.message}"))


def _recording(action: Action, base: Base, held: str) -> Action:
    """A new request of the slice, with the base it adds to recorded on it, and the hold its
    arrivals are to carry (`held_as`), if the Job's pods tolerate one."""
    if not isinstance(action, CreateRequest):
        return action
    body = dict(action.body)
    meta = dict(body.get("metadata") or {})
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        SLICE_ANNOTATION: base.to_annotation(),
        **({HOLD_AS: held} if held else {}),
    }
    body["metadata"] = meta
    return CreateRequest(body)


def compatible(wl: Workload, updates: tuple[Obj, ...]) -> tuple[Obj, ...]:
    """The podSetUpdates without the annotations, labels and node selector entries the pod
    set's template already has with another value. Kueue v0.17 refuses to start a Job whose
    template and an admission check's podSetUpdate disagree on a key (`podset.Merge`: the
    Workload then finishes, FailedToStart); a slice's template carries what the first slice's
    check gave the Job (its consume annotation, naming the first request), so a slice whose
    Job is started again (after an eviction) keeps those: its pods consume and tolerate as
    the Job's pods always did, and its nodes are held as that (`held_as`)."""
    templates = {ps.name: ps.template for ps in wl.pod_sets}
    out = []
    for update in updates:
        template = templates.get(str(update.get("name") or ""), {})
        meta, spec = template.get("metadata") or {}, template.get("spec") or {}
        has = {
            "annotations": meta.get("annotations") or {},
            "labels": meta.get("labels") or {},
            "nodeSelector": spec.get("nodeSelector") or {},
        }
        kept = dict(update)
        for field_name, there in has.items():
            if field_name in update:
                mine = dict(update[field_name] or {})
                same = {k: v for k, v in mine.items() if k not in there or there[k] == v}
                if same:
                    kept[field_name] = same
                else:
                    kept.pop(field_name)
        out.append(kept)
    return tuple(out)


def _consumed(snap: Snapshot, check: CheckState) -> ProvisioningRequest | None:
    """The request the Ready slice consumes (`_consumed_name`), None when it is gone."""
    name = _consumed_name(snap, check)
    return next((r for r in snap.requests if name and r.name == name), None)


def _consumed_name(snap: Snapshot, check: CheckState) -> str:
    """The name of the request the Ready slice consumes: its podSetUpdates name it; for a
    slice whose updates keep the Job's own consume annotation (`compatible`), its latest
    attempt's ('' when none is left)."""
    for update in check.pod_set_updates:
        name = (update.get("annotations") or {}).get(CONSUME_ANNOTATION)
        if name:
            return str(name)
    if stopped_since(snap.workload):
        latest = _latest(snap, check)
        return latest[1].name if latest is not None else ""
    return ""


def _while_ready(snap: Snapshot, state: CheckState, now: datetime) -> Decision:
    """After Ready the added members are the Job's: the nodes that arrived for them held for
    the Job's pods until they are used, then opened, once the racers of its attempt that
    lost are withdrawn (`admission.left_behind`); nothing else (no start watchdog: its
    rollback would need a Retry, which stops the whole Job). Its request deleted outside
    gangcheck: the hold it left on the added nodes is lifted, as a whole gang's is
    (`lifecycle.release_holds_of_gone`); nothing is asked again or reclaimed. Its request is
    named by its podSetUpdates, else (started again after an eviction) by its latest
    attempt, else (that one gone too) by the nodes recorded as arrived for it
    (`_gone_on_nodes`)."""
    req = _consumed(snap, state)
    if req is None:
        name = _consumed_name(snap, state)
        lift, said = lifecycle.release_holds_of_gone(
            snap.capacity,
            snap.workload.ref.namespace,
            (name,) if name else _gone_on_nodes(snap),
        )
        return Decision(actions=lift, events=said)
    if req.deleting:
        return Decision()
    attempt = naming.attempt_of(req.name, snap.workload.ref.name, snap.check)
    behind = admission.left_behind(snap, req, attempt) if attempt is not None else None
    if behind is not None:  # racers of the slice's attempt that lost, not withdrawn yet
        return behind
    base = Base.from_annotation(req.annotations.get(SLICE_ANNOTATION, ""))
    started = rollback.record_of(req).phase is AttemptPhase.STARTED
    if started and base is not None and not _adds(snap.workload, base):
        return _departed(snap, req, base)
    return _held_until_used(snap, req, now, since=parse_time(state.last_transition_time))


def _gone_on_nodes(snap: Snapshot) -> tuple[str, ...]:
    """The slice's requests (by their names, `naming.attempt_of`) that nodes are recorded as
    arrived for and that are gone. A Ready slice whose podSetUpdates name no request (started
    again after an eviction: they keep the Job's own consume annotation, `compatible`) and
    whose requests are all gone (deleted outside gangcheck) has no other record of which
    request its nodes are held for; without it their hold stayed for ever."""
    wl = snap.workload
    prefix = f"{wl.ref.namespace}/"
    there = {r.name for r in snap.requests}
    found = {
        name
        for node in (snap.capacity.nodes if snap.capacity is not None else ())
        if (key := claim_of(node)).startswith(prefix)
        and (name := key.removeprefix(prefix)) not in there
        and naming.attempt_of(name, wl.ref.name, snap.check) is not None
    }
    return tuple(sorted(found))


def _adds(wl: Workload, base: Base) -> int:
    """How many members the slice adds now (the Job's count, which Kueue lowers in place when
    the Job is scaled down, less what the replaced slice runs)."""
    return sum(ps.count for ps in shrunk(wl, base).pod_sets)


def _departed(snap: Snapshot, req: ProvisioningRequest, base: Base) -> Decision:
    """The Job scaled back to what the replaced slice ran (or less): the members the slice's
    request asked for are gone, so is the request, as a gang's is once the gang goes. A
    `Provisioned` request left in place has cluster-autoscaler book its capacity (its pods
    placed in its simulation wherever they fit) for 10 minutes from `Provisioned`, which keeps
    the nodes the departed members left empty from its scale-down. Nothing is reclaimed: the
    attempt started, its nodes are the Job's to leave to the autoscaler (rollback.abandon)."""
    why = f"the members it added to {base.replaces} are gone (the Job scaled back)"
    return flow.withdraw(Decision, snap, why, requests=[req])


def _held_until_used(
    snap: Snapshot, req: ProvisioningRequest, now: datetime, *, since: datetime | None
) -> Decision:
    """The hold on the nodes that arrived for the slice's request kept while the slice's
    members are not all scheduled (counted as the pods consuming the request the Job's pods
    name, `HOLD_AS`; the slice's members are the Job's count now, `members_now`, which a
    scale-down lowers) and the start deadline since Ready (`since`) has not passed; then lifted
    and the attempt marked started. A request held as its own (the Job's pods tolerate no
    hold of gangcheck's: nothing else could use the nodes) is opened at once."""
    started = rollback.record_of(req).phase is AttemptPhase.STARTED
    held = req.annotations.get(HOLD_AS, "")
    if held and not started:
        assert snap.config is not None
        wl = snap.workload
        total = sum(members_now(wl, ps) for ps in wl.pod_sets)
        scheduled = admission.members_scheduled(
            snap.capacity, wl.ref.namespace, held.partition("/")[2]
        )
        limit = snap.config.fulfillment.start_deadline_seconds
        waited = (now - since).total_seconds() if since is not None else 0.0
        if scheduled < total and waited < limit:
            return Decision(requeue_after=max(1.0, min(limit - waited, MEMBERS_POLL_SECONDS)))
    actions = lifecycle.release_hold(snap.capacity, req)
    if not started:
        actions = (*actions, AnnotateRequest(req.name, {PHASE_ANNOTATION: STARTED}))
    return Decision(actions=actions)


def _cannot_tell(snap: Snapshot, state: CheckState, why: str) -> Decision:
    """The difference cannot be told: nothing asked, anything asked before withdrawn (what
    arrived for it reclaimed safely), said on the check and in a Warning Event."""
    withdrawn = flow.withdraw(Decision, snap, why)
    said = _say(state, why)
    events = withdrawn.events
    if said.check is not None:
        events = (*events, Event("WorkloadSliceUnclear", why, warning=True))
    return replace(
        said, actions=withdrawn.actions, events=events, requeue_after=withdrawn.requeue_after
    )


def _say(state: CheckState, message: str, *, requeue: float | None = None) -> Decision:
    """The check Pending with `message` (no write when it says so already)."""
    check = replace(state, state=PENDING, message=message[:MAX_MESSAGE])
    return Decision(check=None if check == state else check, requeue_after=requeue)
