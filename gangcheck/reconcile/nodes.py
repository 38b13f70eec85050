"""Nodes gangcheck owes a reclaim decision (marked `reclaim-when-idle`): left to reclaim once
the gang's own pods are gone, fenced by a reclaim that was interrupted (a restart), or whose
reclaim failed. Each is reclaimed, kept (its fence undone), or retried with backoff, with an
Event on the Node and a metric for every failure, until it succeeds or a person opts it out.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import NODE
from gangcheck.model.names import RECLAIM_WHEN_IDLE
from gangcheck.reclaim.arrivals import tell
from gangcheck.reclaim.safely import Target, reclaim_safely
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.events import EventRecorder
from gangcheck.runtime.queue import Result
from gangcheck.telemetry import NO_METRICS, AttemptMetrics

DRAIN_POLL_SECONDS = 2.0
RETRY_BASE_SECONDS = 2.0
RETRY_MAX_SECONDS = 300.0


class DrainingNodeReconciler:
    def __init__(
        self,
        kube: Kube,
        caches: Caches,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        metrics: AttemptMetrics = NO_METRICS,
    ) -> None:
        self._kube = kube
        self._caches = caches
        self._clock = clock
        self._events = EventRecorder(kube, clock=clock)
        self._failures: dict[str, int] = {}
        self.metrics = metrics

    async def reconcile(self, name: str) -> Result:
        if self._target(self._caches.nodes.store.get(name), name) is None:
            return Result()
        try:  # the cache may lag a mark already cleared: act on the live node's mark only
            target = self._target(await self._kube.get(NODE, name), name)
        except NotFoundError:
            target = None
        if target is None:
            self._failures.pop(name, None)
            return Result()
        # the mark read may be of a reclaim under way: owed only if it is still there in turn
        result = await reclaim_safely(
            self._kube, target, self._clock(), owed=True, told=self._caches
        )
        await tell(self._events, self.metrics, name, result, request=target.request)
        if result.verdict == "failed":
            failures = self._failures[name] = self._failures.get(name, 0) + 1
            return Result(requeue_after=min(RETRY_BASE_SECONDS * 2**failures, RETRY_MAX_SECONDS))
        self._failures.pop(name, None)
        if result.verdict == "drain":
            return Result(requeue_after=DRAIN_POLL_SECONDS)
        if result.verdict == "reclaimed":
            self.metrics.reclaimed(1, result.held_seconds)
        return Result()

    @staticmethod
    def _target(node: dict[str, Any] | None, name: str) -> Target | None:
        raw = ((node or {}).get("metadata", {}).get("annotations") or {}).get(RECLAIM_WHEN_IDLE)
        return Target.from_mark(name, raw) if raw else None
