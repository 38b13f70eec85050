"""Edge code both gang sources share: the objects made for their attempts, and withdrawing
the attempts of a gang that is gone (the orphan sweep)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime

from gangcheck.logic.attempt import lifecycle
from gangcheck.logic.attempt.actions import Event
from gangcheck.logic.attempt.backend import CapacityBackend
from gangcheck.model.objects import Obj, request_of
from gangcheck.model.provisioning_config import AtomicProvisioningSpec
from gangcheck.reconcile.apply import Applier
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.view import cluster_view

log = logging.getLogger(__name__)


def owner_uids(obj: Obj) -> list[str]:
    return [r.get("uid", "") for r in obj["metadata"].get("ownerReferences") or []]


def names_of(objs: Iterable[Obj]) -> frozenset[str]:
    """The names of the objects made for a gang's attempts (PodTemplates)."""
    return frozenset(o["metadata"]["name"] for o in objs)


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
) -> bool:
    """Withdraw each attempt whose gang is gone, after reclaiming what arrived for it (under
    the config it was made with, `config_of`). False when one waits for the node cache to
    catch up (lifecycle.clean_up_waits): look again shortly. `tell` records, for a request
    with arrivals to reclaim, the Event saying which (lifecycle.reclaiming): a gang deleted
    outright (a MultiKueue worker's copy of a Workload, removed by the manager) leaves no
    other record in its cluster of what arrived for it."""
    capacity = cluster_view(caches, copied=True)  # read across the awaits below
    backend = backend or applier.sources.default
    done = True
    for obj in requests:
        if not is_orphan(obj):
            continue
        orphan = request_of(obj)
        config = config_of(obj)
        if lifecycle.clean_up_waits((orphan,), capacity, config):
            log.info("%s waits for the node cache to catch up", orphan.name, extra={"object": at})
            done = False
            continue
        reclaim = lifecycle.abandon(orphan, capacity, config, why, now=datetime.now(UTC), gone=True)
        log.info(
            "withdrawing %s: %s (%d steps to reclaim what arrived)",
            orphan.name,
            why,
            len(reclaim),
            extra={"object": at},
        )
        # as lifecycle.clean_up: the hold lifted from what stays (a node kept for its pods)
        held = lifecycle.release_hold(capacity, orphan)
        for action in (*reclaim, *held, *backend.withdraw(orphan, why)):
            await applier.apply(orphan.ref.namespace, action)
        if tell is not None:
            for event in lifecycle.reclaiming(reclaim, why):
                await tell(obj, event)
    return done
