"""Problems with the DRA objects themselves, said once each as an Event on the object.

A ResourceSlice whose driver no DeviceClass selects, a pool mid-update or invalid, a
DeviceClass selector gangcheck cannot evaluate: the fit leaves those devices out (and says
so in the message of a gang that does not fit); here the owner of the object hears of it.
"""

from __future__ import annotations

import logging

from gangcheck.logic.attempt.actions import Event
from gangcheck.logic.placement.dra import Problem, build_inventory
from gangcheck.model.objects import Obj, ObjectRef
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.events import EventRecorder
from gangcheck.runtime.queue import Result

log = logging.getLogger(__name__)
_API = {"ResourceSlice": "resource.k8s.io/v1", "DeviceClass": "resource.k8s.io/v1"}


class DeviceProblemReconciler:
    """One key for the whole inventory: recomputed when slices, classes or claims change."""

    def __init__(self, caches: Caches, events: EventRecorder) -> None:
        self._caches = caches
        self._events = events
        self._said: set[tuple[str, str, str, str]] = set()

    async def reconcile(self, _key: str) -> Result:
        """Say each problem not said yet; remember only the problems there are now (those of
        objects gone, or versions replaced, are forgotten: memory stays flat over weeks)."""
        c = self._caches
        inventory = build_inventory(
            tuple(c.resource_slices.store),
            tuple(c.device_classes.store),
            tuple(c.resource_claims.store),
        )
        now: set[tuple[str, str, str, str]] = set()
        for problem in inventory.problems:
            obj = self._object_of(problem)
            if obj is None:
                continue
            meta = obj["metadata"]
            said = (problem.kind, problem.name, meta.get("resourceVersion", ""), problem.message)
            now.add(said)
            if said in self._said:
                continue
            ref = ObjectRef(problem.kind, "", problem.name, meta.get("uid", ""), _API[problem.kind])
            await self._events.emit(ref, Event("DeviceProblem", str(problem), warning=True))
        self._said = now
        return Result()

    def _object_of(self, problem: Problem) -> Obj | None:
        if problem.kind == "ResourceSlice":
            return self._caches.resource_slices.store.get(problem.name)
        if problem.kind == "DeviceClass":
            return self._caches.device_classes.store.get(problem.name)
        return None  # a pool is no object: its slices are named in their own problems
