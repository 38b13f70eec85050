"""When a node that registered closed (``hold.ARRIVING_TAINT``) is opened to every pod.

A node group serving gangs may register its nodes with the arrival taint, so that no pending
pod is scheduled onto a node in the moment between its registration and gangcheck recording it
for the request it came for (the record swaps the arrival taint for the hold). A closed node
that no request records is opened again:

- at once, when no request that capacity may still arrive for (Provisioned or not yet: a node
  can register before its request's condition is seen) may record it (it fits none of their
  pod templates by labels, affinity and room, or it is older than they are): it came for
  someone else, or for nothing;
- after ``open_after_seconds`` in any case, so that a node is never closed for long.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gangcheck.logic.attempt.fulfillment import Waiting, claim_of, is_new_arrival
from gangcheck.logic.attempt.hold import is_arriving
from gangcheck.logic.placement.fit import member_from_template
from gangcheck.logic.placement.quantity import QuantityError
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.objects import Obj


@dataclass(frozen=True)
class ArrivalCheck:
    open: bool
    reason: str
    recheck_after: float | None = None
    """Seconds until the verdict may change on its own (the backstop), when kept closed."""


def arrival_verdict(
    node: Obj, waiting: Sequence[Waiting], *, now: datetime, open_after_seconds: float
) -> ArrivalCheck:
    """Whether to open this closed node now, and why."""
    if not is_arriving(node):
        return ArrivalCheck(False, "not closed")
    if claim_of(node):
        return ArrivalCheck(True, f"recorded for {claim_of(node)}")
    born = parse_time(node.get("metadata", {}).get("creationTimestamp", ""))
    closed_for = (now - born).total_seconds() if born is not None else open_after_seconds
    if closed_for >= open_after_seconds:
        return ArrivalCheck(True, f"no waiting gang recorded it within {open_after_seconds:g}s")
    wanted_by = _first_that_could_use(node, waiting)
    if wanted_by is None:
        return ArrivalCheck(True, "no gang waiting for capacity could use it")
    return ArrivalCheck(
        False, f"kept for {wanted_by}", recheck_after=open_after_seconds - closed_for
    )


def _first_that_could_use(node: Obj, waiting: Sequence[Waiting]) -> str | None:
    """The first waiting request that may record this node: one it could have been made for
    (labels, affinity, room), that was made before the node arrived."""
    for request in waiting:
        try:
            members = [member_from_template(t) for t in request.templates]
        except QuantityError:
            continue
        if is_new_arrival(node, parse_time(request.created), members):
            return request.key
    return None
