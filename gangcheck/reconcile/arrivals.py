"""Opens nodes that registered closed and that no waiting gang records (attempt/arrivals)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ConflictError, NotFoundError
from gangcheck.logic.attempt.arrivals import arrival_verdict
from gangcheck.logic.attempt.hold import taints_opened
from gangcheck.reconcile.apply import write_taints
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.view import open_requests
from gangcheck.runtime.queue import Result

log = logging.getLogger(__name__)
#: How long a closed node may wait for a gang to record it before it is opened regardless.
OPEN_AFTER_SECONDS = 120.0
#: How often a node kept closed for a waiting gang is looked at again.
RECHECK_SECONDS = 5.0


class ArrivalGateReconciler:
    """One node at a time: open it when the verdict says so, at the resourceVersion judged."""

    def __init__(
        self,
        kube: Kube,
        caches: Caches,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        open_after_seconds: float = OPEN_AFTER_SECONDS,
    ) -> None:
        self._kube = kube
        self._caches = caches
        self._clock = clock
        self.open_after_seconds = open_after_seconds

    async def reconcile(self, name: str) -> Result:
        node = self._caches.nodes.store.get(name)
        if node is None:
            return Result()
        waiting = open_requests(self._caches)
        verdict = arrival_verdict(
            node, waiting, now=self._clock(), open_after_seconds=self.open_after_seconds
        )
        if not verdict.open:
            if verdict.recheck_after is None:
                return Result()
            return Result(requeue_after=min(RECHECK_SECONDS, max(0.2, verdict.recheck_after)))
        try:
            updated = await write_taints(self._kube, node, taints_opened(node))
        except ConflictError:
            return Result(requeue_after=0.2)  # judged on a stale node: judge again
        except NotFoundError:
            return Result()
        self._caches.nodes.store.put_if_newer(updated)
        log.info("opened node %s to every pod: %s", name, verdict.reason)
        return Result()
