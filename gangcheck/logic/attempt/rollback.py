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
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gangcheck.logic.attempt.actions import (
    DEADLINE_ANNOTATION,
    FULFILLED,
    OUTCOME_ANNOTATION,
    PHASE_ANNOTATION,
    ROLLBACK_NODES_ANNOTATION,
    ROLLBACK_REASON_ANNOTATION,
    ROLLING_BACK,
    STARTED,
    Action,
    AnnotateRequest,
    Event,
    Obj,
    ReclaimArrivals,
)
from gangcheck.logic.attempt.fulfillment import Capacity, GangSpec, assess, request_key
from gangcheck.logic.attempt.reclaim import Outcome, arrived_for
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.objects import Condition, ProvisioningRequest, is_true
from gangcheck.model.provisioning_config import AtomicProvisioningSpec


def is_rolling_back(req: ProvisioningRequest) -> bool:
    return req.annotations.get(PHASE_ANNOTATION) == ROLLING_BACK


def deadline_of(req: ProvisioningRequest) -> datetime | None:
    raw = req.annotations.get(DEADLINE_ANNOTATION)
    return parse_time(raw) if raw else None


def trigger(
    req: ProvisioningRequest,
    capacity: Capacity | None,
    gang: Sequence[tuple[str, int, Obj]] | GangSpec,
    *,
    deadline_seconds: int,
    started: bool,
    now: datetime,
) -> str | None:
    """Why this attempt must roll back now, if it must: a terminal condition or the deadline.

    `started`: the gang's pods may already run (a Workload admitted), so an expired booking no
    longer matters.
    """
    conds = req.conditions
    for kind in ("Failed", "CapacityRevoked"):
        if is_true(conds, kind):
            return f"{kind}: {conds[kind].message or conds[kind].reason}"
    if is_true(conds, "BookingExpired") and not started:
        return f"BookingExpired: {conds['BookingExpired'].message or 'booking expired'}"
    deadline = deadline_of(req)
    if deadline is None or now < deadline:
        return None
    verdict = assess(capacity, req, gang, now)
    if is_true(conds, "Provisioned") and verdict.fits:
        return None
    why = f"Deadline: the gang did not fit within {deadline_seconds}s ({verdict.summary})"
    return why + _autoscaler_said(conds.get("Provisioned"))


def _autoscaler_said(provisioned: Condition | None) -> str:
    """What the autoscaler last said of a request it has not provisioned, for the record."""
    if provisioned is None or provisioned.is_true or not provisioned.reason:
        return ""
    said = f"{provisioned.reason}: {provisioned.message}" if provisioned.message else ""
    return f"; the autoscaler said {said or provisioned.reason}"


def start(
    req: ProvisioningRequest, capacity: Capacity | None, why: str
) -> tuple[AnnotateRequest, Event]:
    """Mark the request rolling back, with the nodes that arrived for it so far."""
    arrived = {
        n["metadata"]["name"]: n["metadata"].get("creationTimestamp", "")
        for n in arrived_for(_nodes(capacity), request_key(req))
    }
    annotate = AnnotateRequest(
        req.name,
        {
            PHASE_ANNOTATION: ROLLING_BACK,
            ROLLBACK_REASON_ANNOTATION: why,
            ROLLBACK_NODES_ANNOTATION: json.dumps(arrived, sort_keys=True),
        },
    )
    return annotate, Event("RollbackStarted", f"Rolling back {req.name}: {why}", warning=True)


def reclaim(req: ProvisioningRequest, capacity: Capacity | None, reclaimer: str) -> ReclaimArrivals:
    """Reclaim the nodes recorded when the rollback began, plus any that arrived since."""
    try:
        recorded = dict(json.loads(req.annotations.get(ROLLBACK_NODES_ANNOTATION, "{}")))
    except (ValueError, TypeError):
        recorded = {}
    for n in arrived_for(_nodes(capacity), request_key(req)):
        recorded[n["metadata"]["name"]] = n["metadata"].get("creationTimestamp", "")
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
    req: ProvisioningRequest, capacity: Capacity | None, reclaimer: str, why: str
) -> tuple[Action, ...]:
    """The gang of this attempt is gone: what to do before its request is deleted.

    The nodes that arrived for it are reclaimed as in any rollback, recorded on the request
    first. Nothing is left to reclaim once the gang was fulfilled or started (the nodes were
    its to use), once a rollback recorded its outcome, or when nothing arrived.
    """
    phase = req.annotations.get(PHASE_ANNOTATION)
    if req.deleting or phase in (FULFILLED, STARTED) or OUTCOME_ANNOTATION in req.annotations:
        return ()
    arrived = arrived_for(_nodes(capacity), request_key(req))
    if not arrived and ROLLBACK_NODES_ANNOTATION not in req.annotations:
        return ()
    recorded: tuple[Action, ...] = () if is_rolling_back(req) else (start(req, capacity, why)[0],)
    return (*recorded, reclaim(req, capacity, reclaimer))


def reclaimer_of(config: AtomicProvisioningSpec | None) -> str:
    """The reclaimer a config names; the default one when there is no config to read."""
    return (config or AtomicProvisioningSpec()).fulfillment.reclaimer.value


@dataclass(frozen=True)
class Verdict:
    """A finished rollback: why it began, and the one line saying what it did."""

    reason: str
    message: str

    @property
    def revoked(self) -> bool:
        return self.reason.startswith("CapacityRevoked")


def verdict(req: ProvisioningRequest) -> Verdict | None:
    """The recorded outcome of the rollback, once the reclaim is done."""
    raw = req.annotations.get(OUTCOME_ANNOTATION)
    if not raw:
        return None
    reason = req.annotations.get(ROLLBACK_REASON_ANNOTATION, "rolled back")
    summary = Outcome.from_annotation(raw).summary()
    return Verdict(reason, f"rolled back {req.name} ({reason}); {summary}")


def _nodes(capacity: Capacity | None) -> tuple[Obj, ...]:
    return capacity.nodes if capacity else ()
