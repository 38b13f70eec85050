"""Keep the Active condition of every AdmissionCheck that names our controller, and publish
there what its capacity sources did lately (``published``: the dispatcher in a MultiKueue
manager reads it)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ConflictError, ForbiddenError, NotFoundError
from gangcheck.kube.resources import ADMISSION_CHECK, NODE_POOL
from gangcheck.logic.attempt import published
from gangcheck.logic.attempt.driver import SourceNote
from gangcheck.logic.attempt.published import Seen
from gangcheck.logic.sources.karpenter.pools import named_pools, unusable_pools
from gangcheck.logic.timefmt import format_time
from gangcheck.logic.workloads import checkconfig
from gangcheck.model.objects import Obj
from gangcheck.reconcile.caches import Caches
from gangcheck.runtime.queue import Result

log = logging.getLogger(__name__)
#: The Active condition's reason when a NodePool a config names (top-level or a capacity
#: source's), or Karpenter's API, is missing, or gangcheck may not list NodePools.
KARPENTER_UNAVAILABLE = "KarpenterBackendUnavailable"
RECHECK_SECONDS = 30.0
NOT_PERMITTED = (
    "the Karpenter backend is unavailable: gangcheck may not list NodePools (install "
    "manifests/components/karpenter, or the chart with karpenter.enabled=true)"
)


def active_of(ac: Obj) -> Obj | None:
    """The check's Active condition, if it has one."""
    return condition_of(ac, "Active")


def condition_of(ac: Obj, kind: str) -> Obj | None:
    """The check's condition of type ``kind``, if it has one."""
    conditions = (ac.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


async def write_active(kube: Kube, caches: Caches, ac: Obj, wanted: Obj) -> bool:
    """Write `wanted` as the check's Active condition (its other conditions kept), on the
    version `ac` is (`write_conditions`)."""
    if not await write_conditions(kube, caches, ac, (wanted,)):
        return False
    _said_active(ac["metadata"]["name"], wanted)
    return True


def _said_active(name: str, wanted: Obj) -> None:
    log.info(
        "admission check %s active=%s: %s",
        name,
        wanted["status"],
        wanted["message"],
        extra={"object": f"AdmissionCheck/{name}", "reason": wanted["reason"]},
    )


async def write_conditions(kube: Kube, caches: Caches, ac: Obj, wanted: Sequence[Obj]) -> bool:
    """Write `wanted` as the check's conditions of their types (its other conditions kept),
    on the version `ac` is; the answer goes to the cache. False when the check changed or
    went meanwhile (its watch event brings it back to the reconciler)."""
    kinds = {c["type"] for c in wanted}
    conditions = (ac.get("status") or {}).get("conditions") or []
    others = [c for c in conditions if c.get("type") not in kinds]
    patch = {
        "metadata": {"resourceVersion": ac["metadata"]["resourceVersion"]},
        "status": {"conditions": [*others, *wanted]},
    }
    try:
        updated = await kube.merge_patch(
            ADMISSION_CHECK, ac["metadata"]["name"], patch, subresource="status"
        )
    except (ConflictError, NotFoundError):
        return False
    caches.admission_checks.store.put_if_newer(updated)
    return True


PUBLISH_AFTER = 5.0
"""Seconds an outcome noted waits before its check's reconcile publishes it (``wake``): those
of a burst go in one write."""


class SourceOutcomes:
    """The outcomes of capacity sources the Workload reconciler noted (a gang delivered whole,
    or a source that could not deliver: ``published.seen``), per AdmissionCheck of ours, not
    yet published on it; ``wake`` asks for that check's reconcile, which publishes them.
    Only the latest per flavors and source is kept: a write failing meanwhile holds no more
    than one per source and flavors. Lost with the process (what was published stays)."""

    def __init__(self) -> None:
        self._pending: dict[str, dict[tuple[tuple[str, ...], str], Seen]] = {}
        self.wake: Callable[[str], None] = lambda _check: None

    def note(
        self, check: str, flavors: Iterable[str], notes: Iterable[SourceNote], now: datetime
    ) -> None:
        names = tuple(flavors)
        noted = [
            one
            for n in notes
            if (one := published.seen(names, n.source, n.outcome, n.reason, now)) is not None
        ]
        if not noted:
            return
        first = check not in self._pending
        pending = self._pending.setdefault(check, {})
        for one in noted:
            pending[one.key] = one
        if first:  # those noted until it runs are published with these
            self.wake(check)

    def pending(self, check: str) -> tuple[Seen, ...]:
        return tuple((self._pending.get(check) or {}).values())

    def written(self, check: str, seen: Iterable[Seen]) -> None:
        """``seen`` is on the check now: held no longer (one noted since stays)."""
        pending = self._pending.get(check) or {}
        for one in seen:
            if pending.get(one.key) == one:
                del pending[one.key]
        if not pending:
            self._pending.pop(check, None)
        else:  # noted while it was written
            self.wake(check)

    def forget(self, check: str) -> None:
        """The check is gone, or not ours: nothing to publish on it."""
        self._pending.pop(check, None)


class AdmissionCheckReconciler:
    def __init__(
        self,
        kube: Kube,
        caches: Caches,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        outcomes: SourceOutcomes | None = None,
    ) -> None:
        self._kube = kube
        self._caches = caches
        self._clock = clock
        self.outcomes = outcomes or SourceOutcomes()

    async def reconcile(self, name: str) -> Result:
        ac = self._caches.admission_checks.store.get(name)
        if ac is None or not checkconfig.is_ours(ac):
            self.outcomes.forget(name)
            return Result()
        resolution = await self._with_backend(self._caches.resolve(name))
        now = self._clock()
        previous = active_of(ac)
        generation = int(ac["metadata"].get("generation", 0))
        wanted = checkconfig.active_condition(resolution, generation, format_time(now), previous)
        noted = self.outcomes.pending(name)
        before = published.on_check(ac)
        outcomes = published.merged(before, noted, now)
        writes = [wanted] if previous != wanted else []
        if published.due(before, outcomes):
            was = condition_of(ac, published.CONDITION)
            writes.append(published.condition(outcomes, was, now, generation))
        if writes and not await write_conditions(self._kube, self._caches, ac, writes):
            return Result()  # changed or gone meanwhile; its watch event brings us back
        self.outcomes.written(name, noted)
        if previous != wanted:
            _said_active(name, wanted)
        return self._recheck(resolution)

    async def _with_backend(self, resolution: checkconfig.Resolution) -> checkconfig.Resolution:
        """A config naming Karpenter NodePools (``spec.karpenter``, or any capacity source's
        ``karpenter``) is active only where every one exists (asked live: a pool created
        later is found by the recheck); the message names each missing pool's field. A config
        naming none never asks for NodePools (Karpenter need not be installed)."""
        spec = resolution.spec
        named = named_pools(spec) if spec is not None else ()
        if not named:
            return resolution
        try:
            listed = await self._kube.list_objects(NODE_POOL)
            served = {p["metadata"]["name"]: p for p in listed.get("items") or []}
        except NotFoundError:
            served = None
        except ForbiddenError:
            return checkconfig.Resolution(None, KARPENTER_UNAVAILABLE, NOT_PERMITTED)
        problem = unusable_pools(named, served)
        if problem is None:
            return resolution
        return checkconfig.Resolution(None, KARPENTER_UNAVAILABLE, problem)

    @staticmethod
    def _recheck(resolution: checkconfig.Resolution) -> Result:
        """Looked at again in ``RECHECK_SECONDS`` while the config names NodePools, active or
        not: a pool created later turns the check active, one deleted since inactive
        (nothing else wakes this reconciler for a NodePool)."""
        unavailable = resolution.reason == KARPENTER_UNAVAILABLE
        if unavailable or (resolution.spec is not None and named_pools(resolution.spec)):
            return Result(requeue_after=RECHECK_SECONDS)
        return Result()
