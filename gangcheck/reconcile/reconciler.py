"""What a gang's reconciler (a Workload's, a PodGroup's) is made with."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypedDict

from gangcheck.kube.client import Kube
from gangcheck.reconcile.apply import Applier
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.events import EventRecorder
from gangcheck.reconcile.progress import PROGRESS_DELAY_SECONDS, HeldMessages
from gangcheck.telemetry import NO_METRICS, AttemptMetrics


class GangOptions(TypedDict, total=False):
    """`GangReconciler`'s keyword parameters, for a subclass to pass on as they came."""

    clock: Callable[[], datetime]
    metrics: AttemptMetrics
    progress_delay: float


GangParts = tuple[Kube, Caches, EventRecorder, Applier]
"""`GangReconciler`'s positional parameters."""


class GangReconciler:
    """The API, the caches, the Event recorder and the applier of a decision's actions; the
    clock, the attempt metrics, and the progress messages held back (`HeldMessages`)."""

    def __init__(
        self,
        kube: Kube,
        caches: Caches,
        events: EventRecorder,
        applier: Applier,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        metrics: AttemptMetrics = NO_METRICS,
        progress_delay: float = PROGRESS_DELAY_SECONDS,
    ) -> None:
        self._kube = kube
        self._caches = caches
        self._events = events
        self._applier = applier
        self._clock = clock
        self.metrics = metrics
        self.held_messages = HeldMessages(progress_delay)
