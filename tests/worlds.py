"""A reconciler against a fake API server, on a clock the test moves: what the Workload and
PodGroup reconcilers' narrative tests (tests/unit/test_workload_reconciler.py,
tests/unit/test_podgroup_reconciler.py) share. Each module's ``World`` adds its reconciler,
the request its autoscaler provisions, and what it reads of its own objects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar

from gangcheck.app import SOURCES
from gangcheck.kube.resources import PROVISIONING_REQUEST, Resource
from gangcheck.reconcile.apply import Applier
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.events import EventRecorder
from gangcheck.runtime.queue import Result
from tests.builders import node
from tests.fakes.kube import FakeKube

Obj = dict[str, Any]
NOW = datetime(2026, 11, 30, 10, 1, tzinfo=UTC)


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciling(Protocol):
    async def reconcile(self, key: str) -> Result: ...


R = TypeVar("R", bound=Reconciling)


class World(Generic[R]):
    """The fake server holding `objs`, the caches the controller reads (with an informer for
    each of `pod_groups`), and what a reconciler writes through (`events`, `applier`); the
    subclass makes `reconciler`, which reconciles `key`."""

    key: str
    reconciler: R

    def __init__(
        self,
        objs: Iterable[Obj],
        *,
        pod_groups: Iterable[Resource] = (),
        node_labels: Mapping[str, str] | None = None,
    ) -> None:
        self.now = NOW
        self.kube = FakeKube(clock=self.clock)
        self.kube.add(*objs)
        self.caches: Caches = self.kube.caches(*pod_groups)
        self.events = EventRecorder(self.kube, clock=self.clock)
        self.applier = Applier(self.kube, self.caches, SOURCES, clock=self.clock)
        self._node_labels = dict(node_labels or {})

    def clock(self) -> datetime:
        return self.now

    async def reconcile(self) -> Result:
        """One reconcile, after the watches brought every change (as the queue would)."""
        self.kube.sync(self.caches)
        return await self.reconciler.reconcile(self.key)

    async def settle(self, times: int = 6) -> None:
        """Reconcile until a reconcile writes nothing."""
        for _ in range(times):
            before = len(self.kube.writes)
            await self.reconcile()
            if len(self.kube.writes) == before:
                return

    def requests(self) -> list[Obj]:
        return self.kube.all_of(PROVISIONING_REQUEST)

    def request(self) -> Obj:
        """The request the autoscaler provisions (`provision`)."""
        raise NotImplementedError

    def provision(self, *nodes: str) -> None:
        """Play the autoscaler, a minute on: the request is Provisioned and its nodes
        (two GPUs each, with the world's node labels) register."""
        self.now += timedelta(minutes=1)
        req = self.request()
        req["status"] = {
            "conditions": [
                {"type": "Provisioned", "status": "True", "reason": "Provisioned",
                 "message": "", "lastTransitionTime": stamp(self.now)}
            ]
        }  # fmt: skip
        self.kube.add(req)
        for name in nodes:
            self.kube.add(
                node(name, gpu=2, created=stamp(self.now), labels=dict(self._node_labels))
            )
