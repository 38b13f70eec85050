"""A request of the gang that stays in deletion: said, and waited for more slowly.

A request gangcheck deleted (withdrawn, rolled back, replaced) or someone deleted is gone in
moments, unless a finalizer holds it: another controller's, which gangcheck never removes.
While it is there the gang waits (its next ask is made under the same name). Within
``GRACE_SECONDS`` of its deletionTimestamp it is looked at again every second, as before;
past the grace the wait is said (``line``: the gang's message, a Warning Event once, the
diagnosis) and looked at less often (``poll_after``: 1 s, doubling, up to
``MAX_POLL_SECONDS``).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.model.objects import ProvisioningRequest

GRACE_SECONDS = 30.0
"""How long a request may be in deletion before its wait is said."""
FIRST_POLL_SECONDS = 1.0
MAX_POLL_SECONDS = 30.0
EVENT_REASON = "RequestStuckDeleting"
"""The Warning Event's reason: a person must act (the finalizer's controller, or its owner)."""


def line(name: str, finalizers: Sequence[str], since: datetime | None, now: datetime) -> str:
    """What a request in deletion since `since` says once past the grace: its name, the
    finalizers left and since when; "" within the grace, or when the time is not known."""
    if since is None or (now - since).total_seconds() < GRACE_SECONDS:
        return ""
    held = f"finalizers [{', '.join(finalizers)}] remain" if finalizers else "no finalizer left"
    return (
        f"waiting for ProvisioningRequest {name} to be deleted: {held} since {format_time(since)}"
    )


def stuck(req: ProvisioningRequest, now: datetime) -> str:
    """`line` for this request ("" when it is not being deleted)."""
    if not req.deleting:
        return ""
    return line(req.name, req.finalizers, parse_time(req.deletion_timestamp), now)


def poll_after(reqs: Sequence[ProvisioningRequest], now: datetime) -> float:
    """When the requests the gang waits on are looked at again: every second within the
    grace (the deletion of one no finalizer holds is done in moments), then 1 s doubling
    with the time past it, up to ``MAX_POLL_SECONDS`` (the watch still wakes the gang at
    once when one goes)."""
    times = [parse_time(r.deletion_timestamp) for r in reqs if r.deleting]
    known = [t for t in times if t is not None]
    if not known or len(known) < len(times):
        return FIRST_POLL_SECONDS
    past = (now - max(known)).total_seconds() - GRACE_SECONDS
    return min(MAX_POLL_SECONDS, max(FIRST_POLL_SECONDS, past))
