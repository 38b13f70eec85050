"""What a gang's reconciler (a Workload's, a PodGroup's) is made with."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import TypedDict

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError, refusal
from gangcheck.logic.attempt.actions import (
    Action,
    AnnotateRequest,
    DeleteRequest,
    DeleteTemplate,
    Event,
)
from gangcheck.logic.attempt.lifecycle import Step
from gangcheck.model.objects import ObjectRef
from gangcheck.reconcile.admissioncheck import SourceOutcomes
from gangcheck.reconcile.apply import (
    Applier,
    NameCollisionError,
    StaleDecisionError,
    side_by_side,
)
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.events import EventRecorder
from gangcheck.reconcile.progress import PROGRESS_DELAY_SECONDS, HeldMessages
from gangcheck.runtime.together import at_once
from gangcheck.telemetry import NO_METRICS, AttemptMetrics


class GangOptions(TypedDict, total=False):
    """`GangReconciler`'s keyword parameters, for a subclass to pass on as they came."""

    clock: Callable[[], datetime]
    metrics: AttemptMetrics
    progress_delay: float


GangParts = tuple[Kube, Caches, EventRecorder, Applier]
"""`GangReconciler`'s positional parameters."""


log = logging.getLogger(__name__)


class Stalled:
    """The gangs (reconcile keys) whose attempt last decided it waits on what other requests
    leave it of nodes that exist (`Step.on_nodes`), by part (a Workload's check; "" for a
    PodGroup): the controller has them decide again when a request frees what they wait on
    (`waiting.frees_others`), instead of at their deadline or a poll. Taken whole: a gang
    still waiting notes itself again as it decides; one gone meanwhile is decided once more,
    then forgotten."""

    def __init__(self) -> None:
        self._parts: dict[str, set[str]] = {}

    def note(self, key: str, part: str, step: Step | None) -> None:
        """What the gang's decision for `part` says: waiting on nodes, or not."""
        if step is not None and step.on_nodes:
            self._parts.setdefault(key, set()).add(part)
        elif (parts := self._parts.get(key)) is not None:
            parts.discard(part)
            if not parts:
                del self._parts[key]

    def forget(self, key: str) -> None:
        self._parts.pop(key, None)

    def take(self) -> list[str]:
        """Every gang noted, and none left noted."""
        keys = list(self._parts)
        self._parts.clear()
        return keys


def refusal_event(action: Action, why: str) -> Event:
    """The Warning Event saying the API server refused `action` (`why`: its message), named
    for what the action did: FailedCreate ``Error creating Request: ...`` (Kueue's words),
    FailedDelete, else FailedUpdate."""
    kind = type(action).__name__
    if kind.startswith("Create"):
        message = f"Error creating {kind.removeprefix('Create')}: {why}"
        return Event("FailedCreate", message, warning=True)
    if isinstance(action, DeleteRequest | DeleteTemplate):
        what = "ProvisioningRequest" if isinstance(action, DeleteRequest) else "PodTemplate"
        return Event("FailedDelete", f"Error deleting {what} {action.name!r}: {why}", warning=True)
    if isinstance(action, AnnotateRequest):
        message = f"Error annotating ProvisioningRequest {action.name!r}: {why}"
    else:
        message = f"Error applying {kind}: {why}"
    return Event("FailedUpdate", message, warning=True)


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
        outcomes: SourceOutcomes | None = None,
    ) -> None:
        self._kube = kube
        self._caches = caches
        self._events = events
        self._applier = applier
        self._clock = clock
        self.metrics = metrics
        self.held_messages = HeldMessages(progress_delay)
        self.outcomes = outcomes or SourceOutcomes()
        """Where a Workload's capacity sources' outcomes are noted for its check's reconciler
        to publish (the controller gives both the same; a PodGroup has no check)."""
        self.stalled = Stalled()

    async def _applied(
        self,
        ref: ObjectRef,
        actions: Sequence[Action],
        *,
        refused: Callable[[Action, Exception], Awaitable[None]] | None = None,
    ) -> bool:
        """Apply a decision's actions for the gang ``ref`` in order, the claims of a run of
        nodes side by side (`apply.side_by_side`); False when one met a change meanwhile (the
        rest not applied: the decision is made again on what changed). A write the API
        server refuses for what it says (kube.errors.refused; a name taken) is told to
        ``refused`` before it is raised, alone or the first among writes made at once (the
        reclaim's nodes): one rule for both. Any other failure (a 422 of a patch that did
        not apply, a 5xx) is raised untold; the queue backs off. Of writes made side by
        side, the first in order that failed counts, as if made one after another."""
        for run in side_by_side(actions):
            failed = await at_once(partial(self._applier.apply, ref.namespace, a) for a in run)
            for action, error in zip(run, failed, strict=True):
                if isinstance(error, StaleDecisionError):
                    log.info("decision dropped: %s", error, extra={"object": str(ref)})
                    return False
                if isinstance(error, ApiError):
                    first = refusal(error, also=(NameCollisionError,))
                    if refused is not None and first is not None:
                        await refused(action, first)
                if error is not None:
                    raise error
                if isinstance(action, DeleteRequest):
                    log.info(
                        "deleted request %s: %s",
                        action.name,
                        action.reason,
                        extra={"object": str(ref)},
                    )
        return True
