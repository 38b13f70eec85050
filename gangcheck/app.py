"""The task tree of one controller process: caches, the work queue, its workers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from gangcheck.kube.client import Kube, Obj
from gangcheck.kube.errors import ApiError
from gangcheck.logic import checkconfig
from gangcheck.logic.actions import WORKLOAD_ANNOTATION
from gangcheck.logic.reclaim import RECLAIM_WHEN_IDLE
from gangcheck.reconcile.admissioncheck import AdmissionCheckReconciler
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.events import EventRecorder
from gangcheck.reconcile.nodes import DrainingNodeReconciler
from gangcheck.reconcile.workload import WorkloadReconciler
from gangcheck.runtime.leader import LeaderElector, LeaseConfig
from gangcheck.runtime.queue import Result, WorkQueue, run_workers
from gangcheck.server import HealthServer
from gangcheck.telemetry import Metrics, tracer

log = logging.getLogger(__name__)

WORKLOAD_KEY, CHECK_KEY, NODE_KEY = "wl:", "ac:", "node:"
_CONTROLLERS = {WORKLOAD_KEY: "workload", CHECK_KEY: "admissioncheck", NODE_KEY: "node"}


def _meta(old: Obj | None, new: Obj | None) -> dict[str, object]:
    obj = new if new is not None else old
    return dict((obj or {}).get("metadata") or {})


class Controller:
    """Wires informers to the queue and the queue to the reconcilers."""

    def __init__(
        self,
        kube: Kube,
        *,
        workers: int = 4,
        watch_timeout: int = 300,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        metrics: Metrics | None = None,
    ) -> None:
        self.kube = kube
        self.metrics = metrics or Metrics()
        self.caches = Caches.create(kube, watch_timeout=watch_timeout)
        self.queue = WorkQueue()
        self.workers = workers
        events = EventRecorder(kube, clock=clock)
        self.workload_reconciler = WorkloadReconciler(kube, self.caches, events, clock=clock)
        self.check_reconciler = AdmissionCheckReconciler(kube, self.caches, clock=clock)
        self.node_reconciler = DrainingNodeReconciler(kube, self.caches, clock=clock)
        self.workload_reconciler.metrics = self.node_reconciler.metrics = self.metrics
        self._wire()

    async def run(self) -> None:
        """Run until cancelled: caches first, then the workers once every cache has synced."""
        async with asyncio.TaskGroup() as tg:
            for informer in self.caches.all():
                tg.create_task(informer.run(), name=f"informer-{informer.resource.plural}")
            await self.caches.wait_synced()
            log.info("caches synced", extra={"workloads": len(self.caches.workloads.store)})
            self.enqueue_everything()
            tg.create_task(run_workers(self.queue, self.reconcile, workers=self.workers))

    async def reconcile(self, key: str) -> Result:
        """One reconcile: a span naming the object, and its latency recorded."""
        kind = _CONTROLLERS.get(key.split(":", 1)[0] + ":", "unknown")
        started = time.monotonic()
        with tracer.start_as_current_span(f"reconcile {kind}", attributes={"gangcheck.key": key}):
            try:
                return await self._dispatch(key)
            except ApiError as e:
                self.metrics.api_error(e.status)
                raise
            finally:
                self.metrics.reconciled(kind, time.monotonic() - started)

    async def _dispatch(self, key: str) -> Result:
        if key.startswith(CHECK_KEY):
            return await self.check_reconciler.reconcile(key.removeprefix(CHECK_KEY))
        if key.startswith(NODE_KEY):
            return await self.node_reconciler.reconcile(key.removeprefix(NODE_KEY))
        return await self.workload_reconciler.reconcile(key.removeprefix(WORKLOAD_KEY))

    def enqueue_everything(self) -> None:
        for ac in self.caches.admission_checks.store:
            self.queue.add(CHECK_KEY + ac["metadata"]["name"])
        for wl in self.caches.workloads.store:
            self._add_workload(wl["metadata"]["namespace"], wl["metadata"]["name"])
        for req in self.caches.requests.store:
            self._on_request(None, req)
        for node in self.caches.nodes.store:
            self._on_node(None, node)

    # ---- event -> key ------------------------------------------------------------------

    def _wire(self) -> None:
        c = self.caches
        c.workloads.add_handler(self._on_workload)
        c.admission_checks.add_handler(self._on_admission_check)
        c.configs.add_handler(self._on_config)
        c.flavors.add_handler(lambda _o, _n: self._add_workloads_with_our_checks())
        c.requests.add_handler(self._on_request)
        c.nodes.add_handler(self._on_node)
        c.pods.add_handler(self._on_pod)

    def _add_workload(self, namespace: object, name: object) -> None:
        self.queue.add(f"{WORKLOAD_KEY}{namespace}/{name}")

    def _on_workload(self, old: Obj | None, new: Obj | None) -> None:
        meta = _meta(old, new)
        self._add_workload(meta["namespace"], meta["name"])

    def _on_admission_check(self, old: Obj | None, new: Obj | None) -> None:
        if not any(o is not None and checkconfig.is_ours(o) for o in (old, new)):
            return
        name = str(_meta(old, new)["name"])
        self.queue.add(CHECK_KEY + name)
        for wl in self.caches.workloads.store:
            checks = (wl.get("status") or {}).get("admissionChecks") or []
            if any(ch.get("name") == name for ch in checks):
                self._add_workload(wl["metadata"]["namespace"], wl["metadata"]["name"])

    def _on_config(self, old: Obj | None, new: Obj | None) -> None:
        name = _meta(old, new)["name"]
        for ac in self.caches.admission_checks.store:
            if ((ac.get("spec") or {}).get("parameters") or {}).get("name") == name:
                self._on_admission_check(None, ac)

    def _add_workloads_with_our_checks(self) -> None:
        ours = self.caches.our_check_names()
        for wl in self.caches.workloads.store:
            checks = (wl.get("status") or {}).get("admissionChecks") or []
            if any(ch.get("name") in ours for ch in checks):
                self._add_workload(wl["metadata"]["namespace"], wl["metadata"]["name"])

    def _on_request(self, old: Obj | None, new: Obj | None) -> None:
        meta = _meta(old, new)
        annotations = meta.get("annotations")
        workload = annotations.get(WORKLOAD_ANNOTATION) if isinstance(annotations, dict) else None
        if workload:
            self._add_workload(meta["namespace"], workload)

    def _on_capacity_change(self, _old: Obj | None, _new: Obj | None) -> None:
        """Nodes and bound pods change fit: revisit every Workload with a request in flight."""
        for req in self.caches.requests.store:
            self._on_request(None, req)

    def _on_node(self, old: Obj | None, new: Obj | None) -> None:
        self._on_capacity_change(old, new)
        if new is not None and RECLAIM_WHEN_IDLE in (new["metadata"].get("annotations") or {}):
            self.queue.add(NODE_KEY + new["metadata"]["name"])

    def _on_pod(self, old: Obj | None, new: Obj | None) -> None:
        was = (old or {}).get("spec", {}).get("nodeName")
        now = (new or {}).get("spec", {}).get("nodeName")
        phase = (
            ((old or {}).get("status") or {}).get("phase"),
            ((new or {}).get("status") or {}).get("phase"),
        )
        if old is None or new is None or was != now or phase[0] != phase[1]:
            self._on_capacity_change(old, new)
            for node in {was, now} - {None, ""}:
                obj = self.caches.nodes.store.get(str(node))
                if obj is not None:
                    self._on_node(None, obj)


@dataclass(frozen=True)
class RunOptions:
    """How one controller process runs (the CLI fills it from flags and the settings file)."""

    workers: int = 4
    leader_election: LeaseConfig | None = None
    bind_address: str = "0.0.0.0"
    health_port: int = 8081
    metrics_port: int = 8080


async def run_controller(kube: Kube, options: RunOptions) -> None:
    """Serve health and metrics, then reconcile: at once, or once elected leader."""
    metrics = Metrics(in_flight=lambda: len(controller.caches.requests.store))
    controller = Controller(kube, workers=options.workers, metrics=metrics)
    elector = LeaderElector(kube, options.leader_election) if options.leader_election else None

    def ready() -> bool:
        standby = elector is not None and not elector.is_leader
        return standby or controller.caches.synced

    server = HealthServer(
        metrics=metrics,
        ready=ready,
        bind_address=options.bind_address,
        health_port=options.health_port,
        metrics_port=options.metrics_port,
    )
    await server.start()
    try:
        if elector is None:
            await controller.run()
        else:
            await elector.run(controller.run)
    finally:
        await server.stop()
