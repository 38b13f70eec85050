"""Reclaim every node that arrived for a rolled-back request, and say what became of each.

Each node's result is recorded in the outcome (reclaimed, draining, kept with its reason,
failed with its error), and each node kept or failed is told so twice more: an Event on the
Node and a log line, so the reason outlives the request the outcome is written on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol

from gangcheck.kube.client import Kube
from gangcheck.logic.attempt.actions import Event, ReclaimArrivals
from gangcheck.logic.attempt.records import Outcome
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.objects import ObjectRef
from gangcheck.reclaim.reclaimers import NOT_CACHED, Told
from gangcheck.reclaim.safely import Result, Target, reclaim_safely
from gangcheck.runtime.together import at_once

log = logging.getLogger(__name__)
PARALLEL = 8


class EventRecorder(Protocol):
    """Where the reclaim tells what became of a node (reconcile/events.py is one): the
    reclaimers depend on the edge only through this."""

    async def emit(self, ref: ObjectRef, event: Event) -> None: ...


async def reclaim_arrivals(
    kube: Kube,
    action: ReclaimArrivals,
    now: datetime,
    *,
    events: EventRecorder,
    metrics: Any,
    told: Told = NOT_CACHED,
) -> Outcome:
    """Reclaim the arrived nodes safely, a few at a time (their settles overlap; Cluster API
    Machines are marked and their owners scaled down one at a time: `DeleteMachine`), each to
    its end whatever the others meet: one raising does not cut another off between its cordon
    and its delete; the first error, in the nodes' order, is raised once all are done. `told`:
    the caches, told of each delete as it is answered (`reclaim_safely`)."""
    got: dict[str, Result] = {}

    def one(node: str) -> Callable[[], Awaitable[None]]:
        async def reclaim() -> None:
            target = Target(node, action.request_key, action.request_created, action.reclaimer)
            got[node] = await reclaim_safely(kube, target, now, told=told)

        return reclaim

    errors = await at_once((one(node) for node in action.nodes), limit=PARALLEL)
    if error := next((e for e in errors if e is not None), None):
        raise error
    results = {node: got[node] for node in action.nodes}
    for node, result in results.items():
        await tell(events, metrics, node, result, request=action.request_key)
    outcome = _outcome(action, results, now)
    if metrics is not None:
        metrics.reclaimed(len(outcome.reclaimed), outcome.node_seconds)
    return outcome


def _outcome(action: ReclaimArrivals, results: dict[str, Result], now: datetime) -> Outcome:
    reclaimed, draining, kept, failed, held = [], [], {}, {}, 0
    created = dict(zip(action.nodes, action.node_created, strict=False))
    for node, result in results.items():
        if result.verdict == "reclaimed":
            reclaimed.append(node)
            held += result.held_seconds
        elif result.verdict == "gone":  # done before a restart or a lost answer, or by the cloud
            reclaimed.append(node)
            born = parse_time(created.get(node, ""))
            held += int((now - born).total_seconds()) if born else 0
        elif result.verdict == "drain":
            draining.append(node)
        elif result.verdict == "keep":
            kept[node] = result.reason
        else:
            failed[node] = result.reason
    return Outcome(tuple(reclaimed), tuple(draining), kept, held, failed)


async def tell(
    events: EventRecorder, metrics: Any, node: str, result: Result, *, request: str
) -> None:
    """An Event on the Node and a log line for a node kept or a reclaim that failed; an
    Event on each pod bound to a node as it was reclaimed. A node kept is a Warning when the
    API server forced it (its fence refused: `cause` set), something to look at; kept by a
    safety rule it is Normal."""
    for pod in result.bound_too_late:
        namespace, _, name = pod.partition("/")
        ref = ObjectRef(kind="Pod", namespace=namespace, name=name, api_version="v1")
        message = f"bound to node {node} as gangcheck reclaimed it (for {request})"
        await events.emit(ref, Event("BoundToReclaimedNode", message, warning=True))
    if result.verdict == "keep":
        message = f"gangcheck keeps node {node} (arrived for {request}): {result.reason}"
        log.info(message, extra={"node": node, "request": request})
        event = Event("NodeKept", message, warning=bool(result.cause))
        await events.emit(node_ref(node, result.node_uid), event)
    elif result.verdict == "failed":
        message = (
            f"gangcheck could not reclaim node {node} (arrived for {request}), retrying:"
            f" {result.reason}"
        )
        log.warning(message, extra={"node": node, "request": request})
        await events.emit(
            node_ref(node, result.node_uid), Event("ReclaimFailed", message, warning=True)
        )
        if metrics is not None:
            metrics.reclaim_failed(result.cause or "Unknown")


def node_ref(name: str, uid: str) -> ObjectRef:
    return ObjectRef(kind="Node", namespace="", name=name, uid=uid, api_version="v1")
