"""Keep the Active condition of every AdmissionCheck that names our controller."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ConflictError, ForbiddenError, NotFoundError
from gangcheck.kube.resources import ADMISSION_CHECK, NODE_POOL
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
    conditions = (ac.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Active"), None)


async def write_active(kube: Kube, caches: Caches, ac: Obj, wanted: Obj) -> bool:
    """Write `wanted` as the check's Active condition (its other conditions kept), on the
    version `ac` is; the answer goes to the cache. False when the check changed or went
    meanwhile (its watch event brings it back to the reconciler)."""
    name = ac["metadata"]["name"]
    conditions = (ac.get("status") or {}).get("conditions") or []
    others = [c for c in conditions if c.get("type") != "Active"]
    patch = {
        "metadata": {"resourceVersion": ac["metadata"]["resourceVersion"]},
        "status": {"conditions": [*others, wanted]},
    }
    try:
        updated = await kube.merge_patch(ADMISSION_CHECK, name, patch, subresource="status")
    except (ConflictError, NotFoundError):
        return False
    caches.admission_checks.store.put_if_newer(updated)
    log.info(
        "admission check %s active=%s: %s",
        name,
        wanted["status"],
        wanted["message"],
        extra={"object": f"AdmissionCheck/{name}", "reason": wanted["reason"]},
    )
    return True


class AdmissionCheckReconciler:
    def __init__(
        self,
        kube: Kube,
        caches: Caches,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._kube = kube
        self._caches = caches
        self._clock = clock

    async def reconcile(self, name: str) -> Result:
        ac = self._caches.admission_checks.store.get(name)
        if ac is None or not checkconfig.is_ours(ac):
            return Result()
        resolution = await self._with_backend(self._caches.resolve(name))
        previous = active_of(ac)
        wanted = checkconfig.active_condition(
            resolution,
            int(ac["metadata"].get("generation", 0)),
            format_time(self._clock()),
            previous,
        )
        if previous == wanted:
            return self._recheck(resolution)
        if not await write_active(self._kube, self._caches, ac, wanted):
            return Result()  # changed or gone meanwhile; its watch event brings us back
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
