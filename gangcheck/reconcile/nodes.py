"""Nodes gangcheck owes a reclaim decision (marked `reclaim-when-idle`): left to reclaim once
the gang's own pods are gone, fenced by a reclaim that was interrupted (a restart), or whose
reclaim failed. Each is reclaimed, kept (its fence undone), or retried with backoff, with an
Event on the Node and a metric for every failure, until it succeeds or a person opts it out.

And nodes CordonAndTaint reclaimed (`reclaimed-at`), left for cluster-autoscaler's
scale-down: one still there `LEFT_FOR_SCALE_DOWN_SECONDS` after is said (a Warning Event
`ReclaimedNodeNotRemoved` on the Node naming the likely causes and what to do, a log line, a
metric), again in every slot of `NOT_REMOVED_REPEAT_SECONDS` while it stays, once per slot
across restarts and leaders (the Event is named for its slot: logic/attempt/not_removed.py);
nothing of it is changed. One a person returned to service (gangcheck's taint gone) loses the
record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import (
    AlreadyExistsError,
    ApiError,
    ConflictError,
    FencedError,
    NotFoundError,
)
from gangcheck.kube.resources import EVENT, NODE
from gangcheck.logic.attempt.actions import Event
from gangcheck.logic.attempt.not_removed import NotRemovedSlot, not_removed_slot
from gangcheck.logic.attempt.reclaim import not_removed_message, scale_down_watch
from gangcheck.logic.sources.karpenter.provisioner import gang_started
from gangcheck.model.names import RECLAIM_WHEN_IDLE, RECLAIMED_AT
from gangcheck.model.objects import tested_removal
from gangcheck.reclaim.arrivals import node_ref, tell
from gangcheck.reclaim.safely import Target, reclaim_safely
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.events import EventRecorder, event_body
from gangcheck.reconcile.handover import hand_over
from gangcheck.runtime.queue import Result
from gangcheck.telemetry import NO_METRICS, AttemptMetrics

log = logging.getLogger(__name__)
DRAIN_POLL_SECONDS = 2.0
NOT_REMOVED = "ReclaimedNodeNotRemoved"
RETRY_BASE_SECONDS = 2.0
RETRY_MAX_SECONDS = 300.0


def watched(node: dict[str, Any]) -> bool:
    """Whether the node is this reconciler's: a reclaim owed (`reclaim-when-idle`), or left
    for scale-down by CordonAndTaint (`reclaimed-at`)."""
    annotations = node["metadata"].get("annotations") or {}
    return RECLAIM_WHEN_IDLE in annotations or RECLAIMED_AT in annotations


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
        self._said: dict[str, str] = {}
        """The Event of the slot each node left for scale-down and still there was said in
        (a note only: the Event's name taken is the record; this spares a create per update)."""
        self.metrics = metrics

    async def reconcile(self, name: str) -> Result:
        cached = self._caches.nodes.store.get(name)
        if self._target(cached, name) is None:
            return await self._left(cached, name)
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
            if self._started(target.request) and await hand_over(
                self._kube, self._caches, name, target.request, target.mark()
            ):
                return Result()  # the started gang's node (reconcile/handover.py)
            return Result(requeue_after=DRAIN_POLL_SECONDS)
        if result.verdict == "reclaimed":
            self.metrics.reclaimed(1, result.held_seconds)
        return Result()

    async def _left(self, cached: dict[str, Any] | None, name: str) -> Result:
        """A node CordonAndTaint left for scale-down: come back when it is due, say it (read
        live) once overdue, take its record off once a person returned it to service."""
        now = self._clock()
        watch = scale_down_watch(cached, now) if cached is not None else None
        if watch is None or watch.fate == "none":
            self._said.pop(name, None)
            return Result()
        if watch.fate == "wait":
            return Result(requeue_after=watch.seconds)
        try:
            node = await self._kube.get(NODE, name)
        except NotFoundError:
            self._said.pop(name, None)
            return Result()
        watch = scale_down_watch(node, now)
        if watch.fate == "wait":
            return Result(requeue_after=watch.seconds)
        if watch.fate != "overdue":
            self._said.pop(name, None)
            if watch.fate == "returned":
                await self._forget_left(node)
            return Result()
        slot = not_removed_slot(node, now)
        if self._said.get(name) != slot.event:
            await self._say_not_removed(node, watch.since, slot, now)
            self._said[name] = slot.event
        return Result(requeue_after=slot.ends_in)

    async def _say_not_removed(
        self, node: dict[str, Any], since: datetime | None, slot: NotRemovedSlot, now: datetime
    ) -> None:
        """Say the node still there, once in this slot: its Event created under the slot's
        name (taken already: said in this slot by this replica before a restart, or another;
        nothing more is said). An Event the server does not take (after the client's retries)
        is said in the log and the metric all the same, and not tried again before the next
        slot: never silent, never held up (a replica that lost the lead raises)."""
        name = node["metadata"]["name"]
        message = not_removed_message(node, since)
        try:
            await self._kube.create(EVENT, not_removed_event(node, slot, message, now))
        except AlreadyExistsError:
            log.debug("already said in this slot: %s", slot.event, extra={"node": name})
            return
        except FencedError:
            raise
        except ApiError as e:
            log.warning("%s (its Event not recorded: %s)", message, e, extra={"node": name})
        else:
            log.warning(message, extra={"node": name})
        self.metrics.reclaimed_not_removed()

    async def _forget_left(self, node: dict[str, Any]) -> None:
        """Take the reclaimed-at record off (tested: a record changed meanwhile stays, for
        the next look); a node gone is done."""
        annotations = node["metadata"].get("annotations") or {}
        ops = tested_removal("annotations", RECLAIMED_AT, annotations[RECLAIMED_AT])
        try:
            await self._kube.json_patch(NODE, node["metadata"]["name"], ops)
        except (NotFoundError, ConflictError):
            return

    def _started(self, key: str) -> bool:
        """Whether the gang of request ``key`` (namespace/name) started, as the cache has
        the request (a cache behind says not yet: the node is looked at again)."""
        namespace, _, request = key.partition("/")
        return gang_started(self._caches.requests.store.get(request, namespace or None))

    @staticmethod
    def _target(node: dict[str, Any] | None, name: str) -> Target | None:
        raw = ((node or {}).get("metadata", {}).get("annotations") or {}).get(RECLAIM_WHEN_IDLE)
        return Target.from_mark(name, raw) if raw else None


def not_removed_event(
    node: dict[str, Any], slot: NotRemovedSlot, message: str, now: datetime
) -> dict[str, object]:
    """The Warning Event saying the node is still there, named for its slot (the name is
    what makes it once per slot)."""
    ref = node_ref(node["metadata"]["name"], str(node["metadata"].get("uid", "")))
    said = Event(NOT_REMOVED, message, warning=True)
    return event_body(ref, said, name=slot.event, first=now, last=now)
