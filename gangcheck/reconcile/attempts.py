"""Edge code both gang sources share: the objects made for their attempts, and withdrawing
the attempts of a gang that is gone (the orphan sweep)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from gangcheck.logic.attempt import lifecycle
from gangcheck.logic.attempt.actions import Action, Event
from gangcheck.logic.attempt.backend import CapacityBackend
from gangcheck.model.objects import Obj, request_of
from gangcheck.model.provisioning_config import AtomicProvisioningSpec
from gangcheck.reconcile.apply import Applier
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.view import cluster_view

log = logging.getLogger(__name__)


def made_for_uid(obj: Obj, annotation: str) -> str:
    """The uid of the gang an object was made for: the annotation naming it (`annotation`),
    else its first owner's (a PodTemplate made before gangcheck stopped owning them by the
    gang's object); '' when neither says."""
    meta = obj["metadata"]
    uid = (meta.get("annotations") or {}).get(annotation)
    if uid:
        return str(uid)
    return next((str(r.get("uid") or "") for r in meta.get("ownerReferences") or []), "")


def names_of(objs: Iterable[Obj]) -> frozenset[str]:
    """The names of the objects made for a gang's attempts (PodTemplates)."""
    return frozenset(o["metadata"]["name"] for o in objs)


@dataclass(frozen=True)
class Sweep:
    """What one pass of the orphan sweep did not finish: look again in `requeue_after`
    seconds (None: every attempt it found is withdrawn)."""

    requeue_after: float | None = None
    waits: bool = False
    """An attempt waits for the node cache to catch up (lifecycle.clean_up_waits): it may
    record arrivals from its templates, which stay until it is withdrawn."""
    kept: frozenset[str] = frozenset()
    """The PodTemplates named by the requests kept open (lifecycle.promise): left in place,
    the arrival ledger reads them to record what their source still delivers."""


async def withdraw_orphans(
    applier: Applier,
    caches: Caches,
    requests: Iterable[Obj],
    *,
    is_orphan: Callable[[Obj], bool],
    config_of: Callable[[Obj], AtomicProvisioningSpec | None],
    why: str,
    at: str,
    backend: CapacityBackend | None = None,
    tell: Callable[[Obj, Event], Awaitable[None]] | None = None,
    keep_promises: bool = True,
) -> Sweep:
    """Withdraw each attempt whose gang is gone, after reclaiming what arrived for it (under
    the config it was made with, `config_of`). `tell` records, for a request with arrivals
    to reclaim, the Event saying which (lifecycle.reclaiming): a gang deleted outright (a
    MultiKueue worker's copy of a Workload, removed by the manager) leaves no other record in
    its cluster of what arrived for it.

    An attempt whose source's promise is open (lifecycle.promise: Provisioned, nothing
    ended it, before its deadline) is not withdrawn yet: what arrived is reclaimed and the
    hold lifted, as in a withdrawal, but the request is kept, so that what its source still
    delivers is recorded for it and reclaimed by a later pass; it is deleted once the
    promise closes. Not with `keep_promises` false (a gang of the name is there again, and
    its asks take the names). The sweep is looked at again when a promise closes at the
    latest, or shortly when one waits for the node cache to catch up
    (lifecycle.clean_up_waits)."""
    capacity = cluster_view(caches, copied=True)  # read across the awaits below
    backend = backend or applier.sources.default
    waits: list[float] = []
    kept: set[str] = set()
    behind = False
    for obj in requests:
        if not is_orphan(obj):
            continue
        orphan = request_of(obj)
        config = config_of(obj)
        if lifecycle.clean_up_waits((orphan,), capacity, config):
            log.info("%s waits for the node cache to catch up", orphan.name, extra={"object": at})
            waits.append(lifecycle.CATCH_UP_REQUEUE_SECONDS)
            behind = True
            continue
        now = datetime.now(UTC)
        came = lifecycle.came_for(orphan, capacity)
        status = backend.status_of(orphan)
        promise = lifecycle.promise(orphan, status, orphan.class_name, now, came=came)
        if keep_promises and promise.open:
            # marked first: from then on no live gang waits behind it for a new node
            mark = lifecycle.mark_gone(orphan, now)
            reclaim = lifecycle.reclaim_promised(orphan, capacity, config, now=now)
            withdraw: tuple[Action, ...] = ()
            waits.append(lifecycle.until_closed(promise, now))
            if reclaim:  # its outcome, once written, may close the promise (came_for)
                waits.append(lifecycle.CATCH_UP_REQUEUE_SECONDS)
            kept.update(p.template_name for p in orphan.pod_sets)
            said = f"kept open, {promise.why}"
        else:
            mark = ()
            reclaim = lifecycle.abandon(orphan, capacity, config, why, now=now, gone=True)
            withdraw = backend.withdraw(orphan, why)
            said = f"withdrawn ({promise.why})" if keep_promises else "withdrawn"
        log.info(
            "%s: %s: %s (%d steps to reclaim what arrived)",
            orphan.name,
            why,
            said,
            len(reclaim),
            extra={"object": at},
        )
        # as lifecycle.clean_up: the hold lifted from what stays (a node kept for its pods)
        held = lifecycle.release_hold(capacity, orphan)
        for action in (*mark, *reclaim, *held, *withdraw):
            await applier.apply(orphan.ref.namespace, action)
        if tell is not None:
            for event in lifecycle.reclaiming(reclaim, why):
                await tell(obj, event)
    return Sweep(min(waits) if waits else None, behind, frozenset(kept))
