"""Which in-flight requests wait for capacity, and the order they claim new nodes in.

A request is *open* while capacity may still arrive for it: not being deleted, not
fulfilled, started, rolling back or kept (its source stopped short: logic/attempt/topup.py),
and not ended (Failed, CapacityRevoked, BookingExpired).
It is *waiting* when it is open and Provisioned: only then may it claim arrivals. Older
requests claim first: by creationTimestamp (whole seconds), then, in the same second, by when
gangcheck created them (``ASKED_AT_ANNOTATION``, to the microsecond), then `namespace/name`.
Before the stamp, two gangs' requests made in the same second were ordered by name: the
younger, first by name, claimed a node made for the older as soon as it was Provisioned
itself, and each gang got a node of the other's and waited for the next (seen in the
side-by-side benchmark: both gangs Ready 0.5 s late).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gangcheck.logic.attempt.fulfillment import Waiting, marked_started
from gangcheck.logic.attempt.status import AttemptStatus, Phase
from gangcheck.logic.sources.provreq import PROVISIONING_REQUEST
from gangcheck.model.names import (
    ASKED_AT_ANNOTATION,
    FULFILLED,
    GANG_GONE_ANNOTATION,
    KEPT,
    PHASE_ANNOTATION,
    ROLLING_BACK,
    STARTED,
)
from gangcheck.model.objects import Obj, request_of


def _status(req: Obj) -> AttemptStatus:
    return PROVISIONING_REQUEST.status_of(request_of(req))


def request_key(req: Obj) -> str:
    return f"{req['metadata']['namespace']}/{req['metadata']['name']}"


def is_waiting(req: Obj) -> bool:
    """Provisioned (so it may claim arrivals) and neither fulfilled nor done."""
    return _status(req).has(Phase.PROVISIONED) and is_open(req)


def is_open(req: Obj) -> bool:
    """Neither fulfilled nor done: capacity may still arrive for it."""
    if req["metadata"].get("deletionTimestamp"):
        return False
    phase = (req["metadata"].get("annotations") or {}).get(PHASE_ANNOTATION)
    if phase in (FULFILLED, STARTED, ROLLING_BACK, KEPT):
        return False
    return not _status(req).has_ended


def frees_others(old: Obj | None, new: Obj | None) -> bool:
    """Whether a request's change (`new` None: gone) changes what other gangs' attempts may
    count of nodes that exist: it left the claim order (no longer waiting: fulfilled, rolling
    back, kept, ended or gone), so the younger ones claim what it would have first
    (`fulfillment._may_claim`); or it was marked ``Started``, so its arrivals and its members
    count as any running gang's do (`fulfillment._partition`, `lifecycle.starting_gangs`).
    Only a change heard (`old` known): a request first seen changes no one's decision made
    before it."""
    if old is None:
        return False
    left = is_waiting(old) and (new is None or not is_waiting(new))
    return left or (new is not None and marked_started(new) and not marked_started(old))


def waiting_requests(
    requests: Iterable[Obj], *, is_waiting: Callable[[Obj], bool] = is_waiting
) -> list[tuple[str, Obj]]:
    """Requests still waiting for capacity, oldest first: the order they claim new nodes in."""
    waiting = [r for r in requests if is_waiting(r)]
    waiting.sort(key=_age_order)
    return [(request_key(r), r) for r in waiting]


def _age_order(req: Obj) -> tuple[str, str, str]:
    """Older first: the second it was created in, then within it when gangcheck created it
    (a request without the stamp, made by an earlier release, first), then its key."""
    meta = req["metadata"]
    asked_at = str((meta.get("annotations") or {}).get(ASKED_AT_ANNOTATION) or "")
    return (str(meta.get("creationTimestamp") or ""), asked_at, request_key(req))


def waiting_of(
    requests: Iterable[Obj],
    template: Callable[[str, str], Obj | None],
    *,
    is_waiting: Callable[[Obj], bool] = is_waiting,
) -> tuple[Waiting, ...]:
    """The waiting requests, oldest first, with their pod templates (`template(name, ns)`)."""
    out = []
    for key, req in waiting_requests(requests, is_waiting=is_waiting):
        ns = req["metadata"]["namespace"]
        names = [p["podTemplateRef"]["name"] for p in (req.get("spec") or {}).get("podSets") or []]
        found = (template(n, ns) for n in names)
        created = str(req["metadata"].get("creationTimestamp") or "")
        gone = GANG_GONE_ANNOTATION in (req["metadata"].get("annotations") or {})
        templates = tuple(t.get("template") or {} for t in found if t)
        out.append(Waiting(key, templates, created, gone=gone))
    return tuple(out)
