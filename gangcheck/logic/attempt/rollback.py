"""Rolling an attempt back, for any gang: when to, what to record first, what to reclaim.

Shared by the admission check (Kueue Workloads) and the PodGroup provisioner. The sequence is
kept on the request so it completes, and counts every node, across a restart:
1. ``trigger`` says why the attempt must end now (a terminal condition, or the deadline passed
   without the gang fitting);
2. ``start`` marks the request rolling back and records the nodes that arrived for it;
3. ``reclaim`` asks the edge to reclaim them safely and record the outcome on the request;
4. ``verdict`` reads that outcome back; the caller then retries or gives up.

``abandon`` is the same sequence for an attempt whose gang is gone (its Workload or PodGroup
deleted mid-attempt): what arrived for it is reclaimed before its request is deleted.
``reclaim_late`` reclaims without recording a rollback, for an attempt kept open after its
gang went while its source may still deliver (lifecycle.promise).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from gangcheck.logic.attempt.actions import (
    Action,
    AnnotateRequest,
    ClaimNode,
    Event,
    ReclaimArrivals,
)
from gangcheck.logic.attempt.backend import AttemptRecord
from gangcheck.logic.attempt.fulfillment import (
    ClusterView,
    GangSpec,
    arrived_for,
    assess,
    held_as,
    is_arrival_of,
    request_key,
)
from gangcheck.logic.attempt.records import (
    AttemptPhase,
    Record,
    RollbackCause,
)
from gangcheck.logic.attempt.status import AttemptStatus, Phase, Signal
from gangcheck.model.names import (
    PHASE_ANNOTATION,
    ROLLBACK_NODES_ANNOTATION,
    ROLLBACK_REASON_ANNOTATION,
    ROLLING_BACK,
)
from gangcheck.model.objects import Obj
from gangcheck.model.provisioning_config import AtomicProvisioningSpec


def record_of(req: AttemptRecord) -> Record:
    """The attempt's record, as its request carries it."""
    return Record.of(req.annotations)


def is_rolling_back(req: AttemptRecord) -> bool:
    return record_of(req).phase is AttemptPhase.ROLLING_BACK


def deadline_of(req: AttemptRecord) -> datetime | None:
    return record_of(req).deadline


def trigger(
    req: AttemptRecord,
    status: AttemptStatus,
    capacity: ClusterView | None,
    gang: Sequence[tuple[str, int, Obj]] | GangSpec,
    *,
    deadline_seconds: int,
    started: bool,
    now: datetime,
) -> str | None:
    """Why this attempt must roll back now, if it must: its backend ended it, or the
    deadline passed without the gang fitting.

    `started`: the gang's pods may already run (a Workload admitted), so an expired booking no
    longer matters.
    """
    phase = status.phase(started=started)
    if phase in (Phase.FAILED, Phase.REVOKED):
        return f"{phase}: {status.signal(phase).text}"
    if phase is Phase.EXPIRED:
        return f"{phase}: {status.signal(phase).message or 'booking expired'}"
    deadline = deadline_of(req)
    if deadline is None or now < deadline:
        return None
    verdict = assess(capacity, req, gang, now)
    if phase is Phase.PROVISIONED and verdict.fits:
        return None
    # `deadline_seconds`: the config in force, which the deadline follows (within a slack:
    # lifecycle.current_deadline moves it when deadlineSeconds changes)
    if verdict.fits:  # on nodes that exist: what never came is the autoscaler's Provisioned
        why = (
            f"Deadline: {req.name} was not provisioned within {deadline_seconds}s, though the "
            f"gang fits on nodes that exist ({verdict.summary})"
        )
    else:
        why = f"Deadline: the gang did not fit within {deadline_seconds}s ({verdict.summary})"
    return why + _autoscaler_said(status.note)


def _autoscaler_said(note: Signal | None) -> str:
    """What the autoscaler last said of a request it has not provisioned, for the record."""
    if note is None or not note.reason:
        return ""
    said = f"{note.reason}: {note.message}" if note.message else ""
    return f"; the autoscaler said {said or note.reason}"


def start(
    req: AttemptRecord, capacity: ClusterView | None, why: str, *, also: Sequence[str] = ()
) -> tuple[AnnotateRequest, Event]:
    """Mark the request rolling back, with the nodes that arrived for it so far (those it
    records and those it claims in the same step, `also`)."""
    arrived = _arrived(req, capacity, also)
    annotate = AnnotateRequest(
        req.name,
        {
            PHASE_ANNOTATION: ROLLING_BACK,
            ROLLBACK_REASON_ANNOTATION: why,
            ROLLBACK_NODES_ANNOTATION: json.dumps(arrived, sort_keys=True),
        },
    )
    return annotate, Event("RollbackStarted", f"Rolling back {req.name}: {why}")


def _arrived(
    req: AttemptRecord, capacity: ClusterView | None, also: Collection[str]
) -> dict[str, str]:
    """Name -> creationTimestamp of the nodes recorded for the request, and of `also` (the
    ones recorded for it in the same step)."""
    claiming = set(also)
    return {
        n["metadata"]["name"]: n["metadata"].get("creationTimestamp", "")
        for n in _nodes(capacity)
        if is_arrival_of(n, request_key(req), req.creation_timestamp)
        or n["metadata"]["name"] in claiming
    }


def reclaim(
    req: AttemptRecord, capacity: ClusterView | None, reclaimer: str, *, also: Collection[str] = ()
) -> ReclaimArrivals:
    """Reclaim the nodes recorded when the rollback began, plus any that arrived since (and
    `also`, the ones recorded in the same step)."""
    recorded = record_of(req).rollback_nodes
    recorded.update(_arrived(req, capacity, also))
    arrived = {str(k): str(v) for k, v in recorded.items()}
    return ReclaimArrivals(
        req.name,
        request_key(req),
        req.creation_timestamp,
        tuple(sorted(arrived)),
        reclaimer,
        tuple(arrived[n] for n in sorted(arrived)),
    )


def abandon(
    req: AttemptRecord,
    capacity: ClusterView | None,
    reclaimer: str,
    why: str,
    *,
    also: Sequence[tuple[str, str]] = (),
    gone: bool = False,
) -> tuple[Action, ...]:
    """The attempt is withdrawn (its gang gone, evicted, finished): what to do before its
    request is deleted.

    The nodes that arrived for it are reclaimed as in any rollback, recorded on the request
    first; `also`: (name, resourceVersion) of arrivals it had not recorded yet, recorded for
    it now (lifecycle.abandon says which). Nothing is left to reclaim once the gang started
    (the nodes were its to use: they go to the autoscaler's scale-down as it leaves them),
    once a rollback recorded its outcome, or when nothing arrived; nor once it was fulfilled,
    unless the gang is `gone` (deleted: a MultiKueue worker whose copy lost the race after it
    turned Ready) — an evicted or requeued gang may come back to its unheld nodes, which the
    autoscaler scales down otherwise. The safe path keeps any node that runs a pod.
    """
    record = record_of(req)
    fulfilled = record.phase is AttemptPhase.FULFILLED
    if req.deleting or record.phase is AttemptPhase.STARTED or record.raw_outcome:
        return ()
    if fulfilled and not gone:
        return ()
    arrived = arrived_for(_nodes(capacity), request_key(req), req.creation_timestamp)
    if not arrived and not also and not record.raw_nodes:
        return ()
    names = tuple(name for name, _ in also)
    claims = tuple(ClaimNode(name, rv, request_key(req), held_as(req)) for name, rv in also)
    recorded: tuple[Action, ...] = (
        () if is_rolling_back(req) else (start(req, capacity, why, also=names)[0],)
    )
    return (*claims, *recorded, reclaim(req, capacity, reclaimer, also=names))


def kept_open(req: AttemptRecord) -> bool:
    """Whether the attempt was withdrawn kept open (lifecycle.promise): a reclaim recorded
    its outcome, no rollback was recorded (`reclaim_late`)."""
    record = record_of(req)
    return bool(record.raw_outcome) and record.phase is AttemptPhase.ASKED


def reclaim_late(
    req: AttemptRecord,
    capacity: ClusterView | None,
    reclaimer: str,
    *,
    also: Sequence[tuple[str, str]] = (),
) -> tuple[Action, ...]:
    """An attempt whose gang is gone, kept open while its source may still deliver
    (lifecycle.promise): record the arrivals `also` ((name, resourceVersion)) for it, then
    reclaim, with them, every node recorded for it that its reclaims did not settle
    (reclaimed, draining, or kept by a safety rule; one whose reclaim failed is tried
    again). No rollback is recorded (`start`): the request stays open, so the arrival ledger
    records for it what its source delivers later. The outcome each reclaim records holds
    the earlier ones' (`Outcome.after`): every node that came for it, which closes its
    promise once they are as many as its members (lifecycle.promise). Nothing when nothing
    is left to reclaim."""
    if req.deleting:
        return ()
    outcome = record_of(req).outcome
    settled = outcome.settled if outcome is not None else frozenset()
    names = tuple(name for name, _ in also)
    arrived = {n: t for n, t in _arrived(req, capacity, names).items() if n not in settled}
    if not arrived:
        return ()
    claims = tuple(
        ClaimNode(name, rv, request_key(req), held_as(req)) for name, rv in also if name in arrived
    )
    ordered = tuple(sorted(arrived))
    reclaim = ReclaimArrivals(
        req.name,
        request_key(req),
        req.creation_timestamp,
        ordered,
        reclaimer,
        tuple(arrived[n] for n in ordered),
        earlier=record_of(req).raw_outcome,
    )
    return (*claims, reclaim)


def reclaimer_of(config: AtomicProvisioningSpec | None) -> str:
    """The reclaimer a config names; the default one when there is no config to read."""
    return (config or AtomicProvisioningSpec()).fulfillment.reclaimer.value


@dataclass(frozen=True)
class RolledBack:
    """A finished rollback: why it began, and the one line saying what it did."""

    reason: str
    message: str

    @property
    def cause(self) -> RollbackCause:
        return RollbackCause.of(self.reason)

    @property
    def revoked(self) -> bool:
        return self.cause is RollbackCause.REVOKED


def rolled_back(done: RolledBack) -> Event:
    """The Event saying the rollback is done, with what it did.

    `RollbackStarted` and `RolledBack` are Normal, as Kueue records its own provisioning
    check turning Retry (AdmissionCheckUpdated) and the eviction that requeues the Workload:
    an attempt that ends and is retried on backoff is the designed path, nothing a person
    must act on (a Warning is). What is gets a Warning of its own: a node whose reclaim
    failed (ReclaimFailed) or whose fence the API server refused (NodeKept), a write
    refused (FailedCreate, FailedUpdate, FailedDelete), giving up (Kueue's
    AdmissionCheckRejected; a PodGroup's GaveUp)."""
    return Event("RolledBack", done.message)


def verdict(req: AttemptRecord) -> RolledBack | None:
    """The recorded outcome of the rollback, once the reclaim is done."""
    record = record_of(req)
    if record.outcome is None:
        return None
    reason = record.reason or "rolled back"
    return RolledBack(reason, f"rolled back {req.name} ({reason}); {record.outcome.summary()}")


def _nodes(capacity: ClusterView | None) -> Collection[Obj]:
    return capacity.nodes if capacity else ()
