"""The capacity every attempt is decided against, read from the caches (both gang sources)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gangcheck.logic.attempt.fulfillment import Capacity, Waiting
from gangcheck.logic.capacity.provreq import PROVISIONING_REQUEST
from gangcheck.logic.capacity.status import AttemptStatus, Phase
from gangcheck.model.names import FULFILLED, PHASE_ANNOTATION, ROLLING_BACK, STARTED
from gangcheck.model.objects import Obj, request_of
from gangcheck.reconcile.caches import Caches


def _status(req: Obj) -> AttemptStatus:
    return PROVISIONING_REQUEST.status_of(request_of(req))


def _key(obj: Obj) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def _is_waiting(req: Obj) -> bool:
    """Provisioned (so it may claim arrivals) and neither fulfilled nor done."""
    return _status(req).has(Phase.PROVISIONED) and _is_open(req)


def _is_open(req: Obj) -> bool:
    """Neither fulfilled nor done: capacity may still arrive for it."""
    if req["metadata"].get("deletionTimestamp"):
        return False
    phase = (req["metadata"].get("annotations") or {}).get(PHASE_ANNOTATION)
    if phase in (FULFILLED, STARTED, ROLLING_BACK):
        return False
    return not _status(req).has_ended


def waiting_requests(
    requests: Iterable[Obj], *, is_waiting: Callable[[Obj], bool] = _is_waiting
) -> list[tuple[str, Obj]]:
    """Requests still waiting for capacity, oldest first: the order they claim new nodes in."""
    waiting = [r for r in requests if is_waiting(r)]
    waiting.sort(key=lambda r: (r["metadata"].get("creationTimestamp", ""), _key(r)))
    return [(_key(r), r) for r in waiting]


def in_flight_capacity(caches: Caches) -> Capacity:
    """The nodes and pods the caches hold, and the requests in flight, oldest waiting first."""
    return Capacity(
        nodes=tuple(caches.nodes.store),
        pods=tuple(caches.pods.store),
        in_flight=frozenset(_key(r) for r in caches.requests.store),
        waiting=_waiting(caches),
        device_classes=tuple(caches.device_classes.store),
        resource_slices=tuple(caches.resource_slices.store),
        resource_claims=tuple(caches.resource_claims.store),
        claim_templates=tuple(caches.claim_templates.store),
    )


def open_requests(caches: Caches) -> tuple[Waiting, ...]:
    """Requests capacity may still arrive for, Provisioned or not yet (a node can register
    before the request's Provisioned condition reaches this controller), oldest first."""
    return _waiting(caches, is_waiting=_is_open)


def _waiting(
    caches: Caches, *, is_waiting: Callable[[Obj], bool] = _is_waiting
) -> tuple[Waiting, ...]:
    templates = caches.templates.store
    out = []
    for key, req in waiting_requests(caches.requests.store, is_waiting=is_waiting):
        ns = req["metadata"]["namespace"]
        names = [p["podTemplateRef"]["name"] for p in (req.get("spec") or {}).get("podSets") or []]
        found = (templates.get(n, ns) for n in names)
        created = str(req["metadata"].get("creationTimestamp") or "")
        out.append(Waiting(key, tuple(t.get("template") or {} for t in found if t), created))
    return tuple(out)
