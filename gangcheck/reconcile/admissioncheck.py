"""Keep the Active condition of every AdmissionCheck that names our controller."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ConflictError, NotFoundError
from gangcheck.kube.resources import ADMISSION_CHECK
from gangcheck.logic.timefmt import format_time
from gangcheck.logic.workloads import checkconfig
from gangcheck.reconcile.caches import Caches
from gangcheck.runtime.queue import Result

log = logging.getLogger(__name__)


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
        resolution = self._caches.resolve(name)
        conditions = (ac.get("status") or {}).get("conditions") or []
        previous = next((c for c in conditions if c.get("type") == "Active"), None)
        wanted = checkconfig.active_condition(
            resolution,
            int(ac["metadata"].get("generation", 0)),
            format_time(self._clock()),
            previous,
        )
        if previous == wanted:
            return Result()
        others = [c for c in conditions if c.get("type") != "Active"]
        patch = {
            "metadata": {"resourceVersion": ac["metadata"]["resourceVersion"]},
            "status": {"conditions": [*others, wanted]},
        }
        try:
            updated = await self._kube.merge_patch(
                ADMISSION_CHECK, name, patch, subresource="status"
            )
        except (ConflictError, NotFoundError):
            return Result()  # changed or gone meanwhile; its watch event brings us back
        self._caches.admission_checks.store.put_if_newer(updated)
        log.info(
            "admission check %s active=%s: %s",
            name,
            wanted["status"],
            wanted["message"],
            extra={"object": f"AdmissionCheck/{name}", "reason": wanted["reason"]},
        )
        return Result()
