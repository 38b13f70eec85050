"""Nodes left to reclaim once the gang's own pods are gone (marked `reclaim-when-idle`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gangcheck.kube.client import Kube
from gangcheck.logic.reclaim import RECLAIM_WHEN_IDLE
from gangcheck.reclaim.safely import Target, forget_drain, reclaim_safely
from gangcheck.reconcile.caches import Caches
from gangcheck.runtime.queue import Result

log = logging.getLogger(__name__)
DRAIN_POLL_SECONDS = 2.0


class DrainingNodeReconciler:
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
        self.metrics: Any = None

    async def reconcile(self, name: str) -> Result:
        node = self._caches.nodes.store.get(name)
        raw = ((node or {}).get("metadata", {}).get("annotations") or {}).get(RECLAIM_WHEN_IDLE)
        target = Target.from_mark(name, raw) if raw else None
        if target is None:
            return Result()
        result = await reclaim_safely(self._kube, target, self._clock())
        if result.verdict == "drain":
            return Result(requeue_after=DRAIN_POLL_SECONDS)
        if result.verdict == "keep":
            await forget_drain(self._kube, name)
            log.info("kept node %s: %s", name, result.reason, extra={"request": target.request})
        elif result.verdict == "reclaimed" and self.metrics is not None:
            self.metrics.reclaimed(1, result.held_seconds)
        return Result()
