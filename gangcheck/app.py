"""The task tree of one controller process: caches, the work queue, its workers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gangcheck.dispatcher import Dispatcher
from gangcheck.kube.client import Kube
from gangcheck.kube.discovery import PodGroupApiWatcher, ServedPodGroups
from gangcheck.kube.errors import ApiError, NotFoundError
from gangcheck.kube.informer import Informer
from gangcheck.kube.resources import ADMISSION_CHECK, PROVISIONING_REQUEST
from gangcheck.logic.attempt import published
from gangcheck.logic.attempt.actions import Event
from gangcheck.logic.attempt.fulfillment import claim_of
from gangcheck.logic.attempt.hold import is_arriving
from gangcheck.logic.dispatch import ANSWER_WITHIN, RoundWait
from gangcheck.logic.placement.usage import (
    frees_capacity,
    node_change_matters,
    node_claim_change_matters,
)
from gangcheck.logic.podgroups.gating import group_of
from gangcheck.logic.sources.waiting import frees_others
from gangcheck.logic.timefmt import format_time
from gangcheck.logic.workloads import checkconfig
from gangcheck.model.names import (
    CONSUME_ANNOTATION,
    GROUP_ANNOTATION,
    WORKLOAD_ANNOTATION,
)
from gangcheck.model.objects import Obj, is_finished, labels_of, ref_of
from gangcheck.model.podgroups import SHORT
from gangcheck.reconcile import provreq
from gangcheck.reconcile.admissioncheck import (
    PUBLISH_AFTER,
    AdmissionCheckReconciler,
    SourceOutcomes,
    active_of,
    write_active,
)
from gangcheck.reconcile.apply import Applier, Sources
from gangcheck.reconcile.arrivals import ArrivalGateReconciler
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.devices import DeviceProblemReconciler
from gangcheck.reconcile.events import EventRecorder
from gangcheck.reconcile.karpenter import KarpenterProvisioner
from gangcheck.reconcile.nodes import DrainingNodeReconciler, watched
from gangcheck.reconcile.podgroup import API_GROUP_OF, PodGroupOptions, PodGroupReconciler
from gangcheck.reconcile.progress import PROGRESS_DELAY_SECONDS
from gangcheck.reconcile.workload import WorkloadReconciler
from gangcheck.runtime.leader import LeaderElector, LeaseConfig
from gangcheck.runtime.queue import Result, WorkQueue, run_workers
from gangcheck.server import HealthServer
from gangcheck.settings import DEFAULT_WORKERS, LEASE_NAME, LEASE_NAMESPACE
from gangcheck.telemetry import Metrics, reconcile_span
from gangcheck.webhook import WebhookServer

#: The capacity sources the edge serves (reconcile/apply.Sources): every place a gang asks
#: is a ProvisioningRequest class today (cluster-autoscaler's, gangcheck's Karpenter one).
SOURCES = Sources(provreq.EDGE)

log = logging.getLogger(__name__)

WORKLOAD_KEY, CHECK_KEY, NODE_KEY, GROUP_KEY, DRA_KEY = "wl:", "ac:", "node:", "pg:", "dra:"
ARRIVAL_KEY = "arrival:"
GONE_KEY = "gone:"
"""`gone:workloads`, `gone:<PodGroup API's short word>`: the gangs' API no longer served while
gangcheck's requests for them are there (`Controller._say_api_gone`)."""
WORKLOADS_GONE = "workloads"
#: The Event said on each request whose gang's API is no longer served, said again this often
#: while it is not (an Event expires in an hour).
API_NOT_SERVED = "GangApiNotServed"
API_GONE_REPEAT_SECONDS = 1800.0
DEVICES_KEY = f"{DRA_KEY}inventory"
"""One key for the whole device inventory (reconcile/devices.py)."""
DEFAULT_POD_GROUPS = PodGroupOptions()
#: Past this, a cache not synced is said: logged at ERROR, and on our AdmissionChecks
#: (Active=False, reason `CACHES_NOT_SYNCED`), and again every `UNSYNCED_REPEAT_SECONDS`.
UNSYNCED_GRACE_SECONDS = 30.0
UNSYNCED_REPEAT_SECONDS = 60.0
CACHES_NOT_SYNCED = "CachesNotSynced"
_CONTROLLERS = {
    WORKLOAD_KEY: "workload",
    CHECK_KEY: "admissioncheck",
    NODE_KEY: "node",
    GROUP_KEY: "podgroup",
    DRA_KEY: "devices",
    ARRIVAL_KEY: "arrival",
    GONE_KEY: "apigone",
}


def api_gone_message(api: str) -> str:
    """What a request whose gang's API is no longer served (its CRD removed) is told."""
    return (
        f"{api} is no longer served (its CRD removed?): this request, and the nodes that "
        "arrived for it and are held, are kept as they are, nothing withdrawn or reclaimed, "
        f"until {api} is served again and its gang can be read"
    )


def requests_of_api(requests: Iterable[Obj], gone: str) -> list[Obj]:
    """gangcheck's requests made for gangs of the API `gone` (`WORKLOADS_GONE`, or a
    PodGroup API's short word)."""
    found = []
    for req in requests:
        annotations = (req.get("metadata") or {}).get("annotations") or {}
        if gone == WORKLOADS_GONE:
            mine = WORKLOAD_ANNOTATION in annotations
        else:
            mine = str(annotations.get(GROUP_ANNOTATION) or "").partition("/")[0] == gone
        if mine:
            found.append(req)
    return found


def _object_of(key: str) -> dict[str, str]:
    """Kind, namespace and name of the object a queue key stands for (for the trace)."""
    prefix, _, rest = key.partition(":")
    if prefix + ":" == WORKLOAD_KEY:
        namespace, _, name = rest.partition("/")
        return {"kind": "Workload", "namespace": namespace, "name": name}
    if prefix + ":" == GROUP_KEY:
        _short, namespace, name = [*rest.split("/", 2), "", ""][:3]
        return {"kind": "PodGroup", "namespace": namespace, "name": name}
    kinds = {CHECK_KEY: "AdmissionCheck", NODE_KEY: "Node"}
    return {"kind": kinds.get(prefix + ":", ""), "name": rest}


def _meta(old: Obj | None, new: Obj | None) -> dict[str, object]:
    obj = new if new is not None else old
    return dict((obj or {}).get("metadata") or {})


def _is_echo(old: Obj | None, new: Obj | None) -> bool:
    """The watch bringing back a version the cache holds already: gangcheck's own write, put
    in the cache when it was answered. Its writer decided again on it then (the Workload
    reconciler does, see `WorkloadReconciler._settle`), so the echo changes nothing."""
    if old is None or new is None:
        return False
    version = (old.get("metadata") or {}).get("resourceVersion")
    return bool(version) and version == (new.get("metadata") or {}).get("resourceVersion")


def _counted(pod: Obj | None) -> bool:
    """A pod bound to a node and not finished: what a gang's start is counted in."""
    return (
        pod is not None and bool((pod.get("spec") or {}).get("nodeName")) and not is_finished(pod)
    )


class Controller:
    """Wires informers to the queue and the queue to the reconcilers."""

    def __init__(
        self,
        kube: Kube,
        *,
        workers: int = DEFAULT_WORKERS,
        watch_timeout: int = 300,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        metrics: Metrics | None = None,
        pod_groups: PodGroupOptions | None = DEFAULT_POD_GROUPS,
        discovery_seconds: float = 60.0,
        progress_delay_seconds: float = PROGRESS_DELAY_SECONDS,
        pod_group_sync_seconds: float = UNSYNCED_GRACE_SECONDS,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.caches = Caches.create(kube, watch_timeout=watch_timeout)
        self.queue = WorkQueue()
        self.workers = workers
        self._watch_timeout = watch_timeout
        # Events are sent in the background: a worker does not wait a round trip for one.
        events = self.events = EventRecorder(kube, clock=clock, background=True)
        applier = Applier(kube, self.caches, SOURCES, clock=clock, metrics=self.metrics)
        # What the Workloads' capacity sources did, published on their checks a little later:
        # a burst of outcomes, one write.
        outcomes = SourceOutcomes()
        outcomes.wake = lambda check: self.queue.add(CHECK_KEY + check, after=PUBLISH_AFTER)
        self.workload_reconciler = WorkloadReconciler(
            kube,
            self.caches,
            events,
            applier,
            clock=clock,
            metrics=self.metrics,
            progress_delay=progress_delay_seconds,
            outcomes=outcomes,
        )
        self.check_reconciler = AdmissionCheckReconciler(
            kube, self.caches, clock=clock, outcomes=outcomes
        )
        self.node_reconciler = DrainingNodeReconciler(
            kube, self.caches, clock=clock, metrics=self.metrics
        )
        self.arrival_reconciler = ArrivalGateReconciler(kube, self.caches, clock=clock)
        self.device_reconciler = DeviceProblemReconciler(self.caches, events)
        self.karpenter = KarpenterProvisioner(kube, self.caches, clock=clock)
        self.group_reconciler = (
            PodGroupReconciler(
                kube,
                self.caches,
                events,
                applier,
                options=pod_groups,
                clock=clock,
                metrics=self.metrics,
                progress_delay=progress_delay_seconds,
            )
            if pod_groups is not None
            else None
        )
        self.discovery_seconds = discovery_seconds
        self.served_pod_groups: ServedPodGroups | None = None
        self._group_tasks: dict[str, asyncio.Task[None]] = {}
        self._unlisted_tasks: dict[str, asyncio.Task[None]] = {}
        self.pod_group_sync_seconds = pod_group_sync_seconds
        self._wire()

    async def run(self, *, unsynced_grace: float = UNSYNCED_GRACE_SECONDS) -> None:
        """Run until cancelled: caches first, then the workers once every cache has synced.
        A cache not synced `unsynced_grace` seconds on is said (`_say_unsynced`), and again
        every `UNSYNCED_REPEAT_SECONDS` until every one has."""
        async with asyncio.TaskGroup() as tg:
            for informer in self.caches.all():
                tg.create_task(informer.run(), name=f"informer-{informer.resource.plural}")
            self.metrics.caches_synced(False)
            wait = unsynced_grace
            while not self.caches.synced:
                try:
                    async with asyncio.timeout(wait):
                        await self.caches.wait_synced()
                except TimeoutError:
                    await self._say_unsynced()
                    wait = UNSYNCED_REPEAT_SECONDS
            self.metrics.caches_synced(True)
            log.info("caches synced", extra={"workloads": len(self.caches.workloads.store)})
            self.enqueue_everything()
            tg.create_task(run_workers(self.queue, self.reconcile, workers=self.workers))
            tg.create_task(self.karpenter.run(), name="karpenter-provisioner")
            if self.group_reconciler is not None:
                watcher = PodGroupApiWatcher.for_kube(self.kube)
                on_change = functools.partial(self._serve_pod_groups, tg)
                tg.create_task(watcher.run(on_change, self.discovery_seconds))

    async def _say_unsynced(self) -> None:
        """Every cache not synced and its last error, logged at ERROR and written on every
        AdmissionCheck of ours as Active=False (`CACHES_NOT_SYNCED`): no reconcile runs
        until they sync, so Kueue must not keep Workloads waiting on a check nobody serves.
        Only once a list or watch failed: caches still listing without an error (a large
        cluster's first list) are logged as a warning, the checks left as they are.
        The checks are read live (their own cache may be the one not synced); without
        Kueue's API there is none to write. Once synced, each check's reconcile
        (`enqueue_everything`) sets Active as it decides."""
        unsynced = [i for i in self.caches.all() if not i.synced.is_set()]
        said = "; ".join(
            f"{'.'.join(filter(None, (i.resource.plural, i.resource.group)))}: "
            f"{i.last_error or 'no answer yet'}"
            for i in unsynced
        )
        message = f"gangcheck's caches have not synced, nothing is reconciled: {said}"
        extra = {"resources": [i.resource.plural for i in unsynced]}
        if not any(i.last_error for i in unsynced):  # slow (a large cluster's first list)
            log.warning(message, extra=extra)
            return
        log.error(message, extra=extra)
        try:
            listed = await self.kube.list_objects(ADMISSION_CHECK)
        except NotFoundError:
            return  # Kueue's API not served: no AdmissionCheck to say it on
        except ApiError as e:
            log.warning("cannot read the AdmissionChecks to say so: %s", e)
            return
        not_served = checkconfig.Resolution(None, CACHES_NOT_SYNCED, message)
        now = format_time(self.clock())
        for ac in listed.get("items") or []:
            if not checkconfig.is_ours(ac):
                continue
            previous = active_of(ac)
            generation = int(ac["metadata"].get("generation", 0))
            wanted = checkconfig.active_condition(not_served, generation, now, previous)
            if previous == wanted:
                continue
            try:
                await write_active(self.kube, self.caches, ac, wanted)
            except ApiError as e:  # fenced, refused, unreachable: said again in a while
                log.warning("cannot set AdmissionCheck %s inactive: %s", ac["metadata"]["name"], e)

    async def _serve_pod_groups(self, tg: asyncio.TaskGroup, served: ServedPodGroups) -> None:
        """Watch the PodGroups of every API the server serves now; stop watching the others.
        A new API's informer is waited for `pod_group_sync_seconds` at most: one that has not
        listed by then (its list refused by RBAC, or failing) is said (`_say_unlisted`) and
        left listing again on its own backoff, while the APIs that listed, and the Workloads,
        are served; once it lists, its groups are served too (`_when_listed`)."""
        wanted = {res.group: res for res in served.resources}
        if self.served_pod_groups is None:  # the first answer: requests made for gangs of an
            for group in SHORT.keys() - wanted.keys():  # API gone before this process (a
                self.queue.add(GONE_KEY + SHORT[group])  # restart, a new leader) are said
        for group, informer in list(self.caches.pod_groups.items()):
            if wanted.get(group) != informer.resource:
                if group not in wanted:  # no longer served: what was made for its groups stays
                    self.queue.add(GONE_KEY + SHORT[group])
                self._group_tasks.pop(group).cancel()
                if (waiting := self._unlisted_tasks.pop(group, None)) is not None:
                    waiting.cancel()
                del self.caches.pod_groups[group]
        started = []
        for group, res in wanted.items():
            if group in self.caches.pod_groups:
                continue
            informer = Informer(self.kube, res, watch_timeout=self._watch_timeout)
            informer.add_handler(self._on_pod_group)
            self.caches.pod_groups[group] = informer
            self._group_tasks[group] = tg.create_task(
                informer.run(), name=f"informer-{res.group}-{res.plural}"
            )
            started.append(informer)
        deadline = asyncio.get_running_loop().time() + self.pod_group_sync_seconds
        for informer in started:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await informer.synced.wait()
        for informer in started:
            if not informer.synced.is_set():
                self._say_unlisted(informer)
                group = informer.resource.group
                self._unlisted_tasks[group] = tg.create_task(
                    self._when_listed(informer), name=f"listed-{group}"
                )
        self._say_pod_groups_synced()
        self.served_pod_groups = served
        self.caches.pod_groups_discovered = True
        log.info("serving PodGroups of: %s", served)
        for pod in self.caches.pods.store:
            self._on_pod_member(pod)

    def _say_unlisted(self, informer: Informer) -> None:
        """A PodGroup API served but not listed in time, said at ERROR with its last error."""
        res = informer.resource
        log.error(
            "cannot list %s PodGroups (%s): its groups are not served until they list "
            "(listed again on a backoff); the other PodGroup APIs and Workloads are served",
            res.api_version,
            informer.last_error or "no answer yet",
            extra={"resources": [f"{res.plural}.{res.group}"]},
        )

    async def _when_listed(self, informer: Informer) -> None:
        """A PodGroup API skipped for not listing: once it lists, its groups and members are
        reconciled (its list told `_on_pod_group` of every group it holds)."""
        await informer.synced.wait()
        group = informer.resource.group
        self._unlisted_tasks.pop(group, None)
        log.info("%s PodGroups listed: serving them now", informer.resource.api_version)
        self._say_pod_groups_synced()
        for pod in self.caches.pods.store:
            ref = group_of(pod)
            if ref is not None and ref.api_group == group:
                self._on_pod_member(pod)

    def _say_pod_groups_synced(self) -> None:
        """`gangcheck_caches_synced` is 0 while a PodGroup API served has not listed."""
        self.metrics.caches_synced(self.caches.synced and self.caches.pod_groups_synced)

    async def _say_api_gone(self, gone: str) -> Result:
        """The API of some gangs is no longer served (`GONE_KEY`) while gangcheck's requests
        for them are there: nothing is withdrawn or reclaimed on the word of a cache that
        cannot read the gangs (they stay, as do the nodes held for them), and that is said,
        at ERROR and as a Warning Event on each such request, again every
        `API_GONE_REPEAT_SECONDS` until the API is served again or the requests are gone."""
        if gone == WORKLOADS_GONE:
            api, served = "Kueue's Workload API", self.caches.workloads.served
        else:
            group = API_GROUP_OF[gone]
            api, served = f"the {group} PodGroup API", group in self.caches.pod_groups
        if served:
            return Result()
        requests = requests_of_api(self.caches.requests.store, gone)
        if not requests:
            return Result()
        message = api_gone_message(api)
        log.error(
            "%s is no longer served: %d requests made for its gangs are kept, with the nodes "
            "held for them, until it is served again",
            api,
            len(requests),
            extra={
                "requests": sorted(
                    f"{r['metadata']['namespace']}/{r['metadata']['name']}" for r in requests
                )
            },
        )
        for req in requests:
            ref = ref_of(req, PROVISIONING_REQUEST.kind, PROVISIONING_REQUEST.api_version)
            await self.events.emit(ref, Event(API_NOT_SERVED, message, warning=True))
        return Result(requeue_after=API_GONE_REPEAT_SECONDS)

    async def reconcile(self, key: str) -> Result:
        """One reconcile: a span naming the object, and its latency recorded."""
        kind = _CONTROLLERS.get(key.split(":", 1)[0] + ":", "unknown")
        started = time.monotonic()
        with reconcile_span(kind, key, **_object_of(key)):
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
        if key.startswith(ARRIVAL_KEY):
            return await self.arrival_reconciler.reconcile(key.removeprefix(ARRIVAL_KEY))
        if key == DEVICES_KEY:
            return await self.device_reconciler.reconcile(key)
        if key.startswith(GONE_KEY):
            return await self._say_api_gone(key.removeprefix(GONE_KEY))
        if key.startswith(GROUP_KEY):
            if self.group_reconciler is None:
                return Result()
            return await self.group_reconciler.reconcile(key.removeprefix(GROUP_KEY))
        return await self.workload_reconciler.reconcile(key.removeprefix(WORKLOAD_KEY))

    def enqueue_everything(self) -> None:
        if not self.caches.workloads.served:  # requests left for Workloads no one can read
            self.queue.add(GONE_KEY + WORKLOADS_GONE)
        for ac in self.caches.admission_checks.store:
            self.queue.add(CHECK_KEY + ac["metadata"]["name"])
        for wl in self.caches.workloads.store:
            self._add_workload(wl["metadata"]["namespace"], wl["metadata"]["name"])
        for req in self.caches.requests.store:
            self._on_request(None, req)
        for template in self.caches.templates.store:  # one left by a Workload gone
            self._on_template(None, template)
        for node in self.caches.nodes.store:  # every gang with a request is queued already
            self._add_node_keys(node)

    # ---- event -> key ------------------------------------------------------------------

    def _wire(self) -> None:
        c = self.caches
        c.workloads.add_handler(self._on_workload)
        c.admission_checks.add_handler(self._on_admission_check)
        c.configs.add_handler(self._on_config)
        c.flavors.add_handler(lambda _o, _n: self._add_workloads_with_our_checks())
        c.requests.add_handler(self._on_request)
        c.requests.add_handler(self.karpenter.on_request)
        c.templates.add_handler(self._on_template)
        c.nodes.add_handler(self._on_node)
        c.nodes.add_handler(self.karpenter.on_node)
        c.node_claims.add_handler(self._on_node_claim)
        c.pods.add_handler(self._on_pod)
        c.namespaces.add_handler(self._on_namespace)
        for devices in (c.resource_slices, c.resource_claims, c.device_classes):
            devices.add_handler(self._on_capacity_change)
        for inventory in (c.resource_slices, c.device_classes):
            inventory.add_handler(lambda _o, _n: self.queue.add(DEVICES_KEY))

    def _add_workload(self, namespace: object, name: object) -> None:
        self.queue.add(f"{WORKLOAD_KEY}{namespace}/{name}")

    def _on_workload(self, old: Obj | None, new: Obj | None) -> None:
        if _is_echo(old, new):
            return
        if new is None and not self.caches.workloads.served:  # emptied: the API not served
            self.queue.add(GONE_KEY + WORKLOADS_GONE)
        meta = _meta(old, new)
        if self._concerns_us(old, new, str(meta["namespace"]), str(meta["name"])):
            self._add_workload(meta["namespace"], meta["name"])

    def _concerns_us(self, old: Obj | None, new: Obj | None, namespace: str, name: str) -> bool:
        """Whether a Workload's change can change what gangcheck does: it lists, or listed,
        one of gangcheck's checks, or gangcheck made requests or templates for it. Any other
        Workload's reconcile decides nothing (a check that becomes gangcheck's requeues the
        Workloads listing it: `_on_admission_check`)."""
        ours = self.caches.our_check_names()
        for obj in (old, new):
            checks = ((obj or {}).get("status") or {}).get("admissionChecks") or []
            if any(ch.get("name") in ours for ch in checks):
                return True
        return bool(
            self.caches.requests_of(namespace, name) or self.caches.templates_of(namespace, name)
        )

    def _on_admission_check(self, old: Obj | None, new: Obj | None) -> None:
        if not any(o is not None and checkconfig.is_ours(o) for o in (old, new)):
            return
        name = str(_meta(old, new)["name"])
        self.queue.add(CHECK_KEY + name)
        if old is not None and new is not None and published.same_but_outcomes(old, new):
            return  # what its sources did, published: no Workload decides on it
        for wl in self.caches.workloads.store:
            checks = (wl.get("status") or {}).get("admissionChecks") or []
            if any(ch.get("name") == name for ch in checks):
                self._add_workload(wl["metadata"]["namespace"], wl["metadata"]["name"])

    def _on_config(self, old: Obj | None, new: Obj | None) -> None:
        name = _meta(old, new)["name"]
        for ac in self.caches.admission_checks.store:
            if ((ac.get("spec") or {}).get("parameters") or {}).get("name") == name:
                self._on_admission_check(None, ac)
        for informer in self.caches.pod_groups.values():  # a group may name it, or default to it
            for group in informer.store:
                self._on_pod_group(None, group)

    def _add_workloads_with_our_checks(self) -> None:
        ours = self.caches.our_check_names()
        for wl in self.caches.workloads.store:
            checks = (wl.get("status") or {}).get("admissionChecks") or []
            if any(ch.get("name") in ours for ch in checks):
                self._add_workload(wl["metadata"]["namespace"], wl["metadata"]["name"])

    def _on_request(self, old: Obj | None, new: Obj | None) -> None:
        if frees_others(old, new):
            self._wake_stalled()
        meta = _meta(old, new)
        annotations = meta.get("annotations")
        annotations = annotations if isinstance(annotations, dict) else {}
        workload = annotations.get(WORKLOAD_ANNOTATION)
        if workload and not self._echo_of_workload_write(old, new, meta["namespace"], workload):
            self._add_workload(meta["namespace"], workload)
        if group := annotations.get(GROUP_ANNOTATION):
            short, _, name = str(group).partition("/")
            if short in API_GROUP_OF:
                self.queue.add(f"{GROUP_KEY}{short}/{meta['namespace']}/{name}")

    def _wake_stalled(self) -> None:
        """The gangs waiting on what other requests leave them of nodes that exist, to decide
        again: a request left the claim order or started (`waiting.frees_others`)."""
        for key in self.workload_reconciler.stalled.take():
            self.queue.add(WORKLOAD_KEY + key)
        if self.group_reconciler is not None:
            for key in self.group_reconciler.stalled.take():
                self.queue.add(GROUP_KEY + key)

    def _on_template(self, old: Obj | None, new: Obj | None) -> None:
        """A PodTemplate gone while its request is in flight is recreated by its gang's owner;
        one seen for a Workload (or PodGroup) not cached goes to that gang's orphan sweep
        (`WorkloadReconciler._remove_orphans`): made as the Workload went (its create's answer
        lost, retried after), it may reach the cache only after the sweep looked, which no
        other event would run again (no garbage collector is assumed)."""
        if new is None:
            self._on_request(old, new)
            return
        meta = _meta(old, new)
        annotations = meta.get("annotations")
        annotations = annotations if isinstance(annotations, dict) else {}
        workload = annotations.get(WORKLOAD_ANNOTATION)
        cached = self.caches.workloads.store.get(str(workload), str(meta["namespace"]))
        if workload and cached is None:
            self._add_workload(meta["namespace"], workload)
        # a PodGroup's, to its group's sweep (`PodGroupReconciler._withdraw_orphans`) likewise
        short, _, name = str(annotations.get(GROUP_ANNOTATION) or "").partition("/")
        if short in API_GROUP_OF:
            informer = self.caches.pod_groups.get(API_GROUP_OF[short])
            if informer is None or informer.store.get(name, str(meta["namespace"])) is None:
                self.queue.add(f"{GROUP_KEY}{short}/{meta['namespace']}/{name}")

    def _echo_of_workload_write(
        self, old: Obj | None, new: Obj | None, namespace: object, workload: object
    ) -> bool:
        """A request's echo, while its Workload is cached (its reconciler decided again on
        the write); a request of a Workload gone is followed through its echoes as before
        (the orphan's withdrawal, `WorkloadReconciler._remove_orphans`)."""
        return _is_echo(old, new) and (
            self.caches.workloads.store.get(str(workload), str(namespace)) is not None
        )

    def _add_group(self, api_group: str, namespace: object, name: object) -> None:
        self.queue.add(f"{GROUP_KEY}{SHORT[api_group]}/{namespace}/{name}")

    def _on_pod_group(self, old: Obj | None, new: Obj | None) -> None:
        obj = new if new is not None else old
        api_version = str((obj or {}).get("apiVersion") or "")
        meta = _meta(old, new)
        group = api_version.split("/", 1)[0]
        if group in SHORT:
            self._add_group(group, meta["namespace"], meta["name"])

    def _on_namespace(self, old: Obj | None, new: Obj | None) -> None:
        """A namespace's labels decide for the groups there: opting in or out changes what
        they say about ungated members, and a config's namespaceSelector whether they may
        use it. A namespace newly cached is read too (a group seen before it decided on no
        labels)."""
        if new is None or (old is not None and labels_of(old) == labels_of(new)):
            return
        namespace = new["metadata"]["name"]
        for informer in self.caches.pod_groups.values():
            for group in informer.store.in_namespace(namespace):
                self._on_pod_group(None, group)

    def _on_pod_member(self, pod: Obj | None) -> None:
        ref = group_of(pod) if pod is not None else None
        if ref is not None and pod is not None and self.group_reconciler is not None:
            self._add_group(ref.api_group, pod["metadata"]["namespace"], ref.name)

    def _on_capacity_change(self, _old: Obj | None, _new: Obj | None) -> None:
        """Devices (or, through `_on_node`, a node) changed fit: revisit the gangs waiting for
        capacity. Gangs past that (fulfilled, started, rolling back) do not fit again; what
        they read of nodes and pods reaches them by `_on_recorded` and `_on_consumer`."""
        for req in self.caches.in_flight.open_requests():
            self._on_request(None, req)

    def _on_recorded(self, node: Obj | None) -> None:
        """The gang of the request the node is recorded for (the arrival ledger)."""
        owner = claim_of(node) if node is not None else ""
        namespace, _, name = owner.partition("/")
        req = self.caches.requests.store.get(name, namespace) if name else None
        if req is not None:
            self._on_request(None, req)

    def _on_consumer(self, pod: Obj | None) -> None:
        """The gang of the request the pod consumes (its start is counted in its pods)."""
        meta = (pod or {}).get("metadata") or {}
        name = (meta.get("annotations") or {}).get(CONSUME_ANNOTATION)
        req = self.caches.requests.store.get(str(name), meta.get("namespace")) if name else None
        if req is not None:
            self._on_request(None, req)

    def _on_node(self, old: Obj | None, new: Obj | None) -> None:
        if node_change_matters(old, new):
            self._on_recorded(old)
            self._on_recorded(new)
            self._on_capacity_change(old, new)
        if new is not None:
            self._add_node_keys(new)

    def _on_node_claim(self, old: Obj | None, new: Obj | None) -> None:
        """A NodeClaim whose deletion began (or that went, or named another node while being
        deleted) changed whether its nodes are usable: what a node event that matters reaches."""
        if not node_claim_change_matters(old, new):
            return
        names = {
            *self.caches.capacity.nodes_of_claim(old),
            *self.caches.capacity.nodes_of_claim(new),
        }
        if not names:
            return  # no node of it known yet: the node's own event will tell when it comes
        for name in sorted(names):
            self._on_recorded(self.caches.nodes.store.get(name))
        self._on_capacity_change(old, new)

    def _add_node_keys(self, node: Obj) -> None:
        """The node's own keys: an idle reclaim to finish (or a node left for scale-down to
        watch), an arrival to open."""
        if watched(node):
            self.queue.add(NODE_KEY + node["metadata"]["name"])
        if is_arriving(node):
            self.queue.add(ARRIVAL_KEY + node["metadata"]["name"])

    def _on_pod(self, old: Obj | None, new: Obj | None) -> None:
        """A pod's group; and when what it uses moved (bound, unbound, finished, gone), the
        gang it consumes for and what its nodes' changes reach."""
        self._on_pod_member(new if new is not None else old)
        was = (old or {}).get("spec", {}).get("nodeName")
        now = (new or {}).get("spec", {}).get("nodeName")
        phase = (
            ((old or {}).get("status") or {}).get("phase"),
            ((new or {}).get("status") or {}).get("phase"),
        )
        if _counted(old) != _counted(new):  # bound or unbound, finished: a start moved
            self._on_consumer(new if new is not None else old)
        if old is None or new is None or was != now or phase[0] != phase[1]:
            freed = frees_capacity(old, new)
            for node in {was, now} - {None, ""}:
                obj = self.caches.nodes.store.get(str(node))
                if obj is not None:
                    self._on_recorded(obj)
                    if freed:  # room given back: a gang waiting for capacity may fit now
                        self._on_capacity_change(None, obj)
                    self._add_node_keys(obj)


@dataclass(frozen=True)
class WebhookOptions:
    """The pod scheduling-gate webhook: HTTPS on `port` (0: any free one), certificate files
    in `cert_dir`; on shutdown it keeps answering `drain_seconds`, the replica NotReady."""

    port: int = 9443
    cert_dir: str = "/tmp/k8s-webhook-server/serving-certs"
    drain_seconds: float = 5.0


@dataclass(frozen=True)
class RunOptions:
    """How one controller process runs (the CLI fills it from flags and the settings file)."""

    workers: int = DEFAULT_WORKERS
    leader_election: LeaseConfig | None = None
    bind_address: str = "0.0.0.0"
    health_port: int = 8081
    metrics_port: int = 8080
    pod_groups: PodGroupOptions | None = DEFAULT_POD_GROUPS
    discovery_seconds: float = 60.0
    progress_delay_seconds: float = PROGRESS_DELAY_SECONDS
    webhook: WebhookOptions | None = None


async def run_controller(kube: Kube, options: RunOptions) -> None:
    """Serve health and metrics, then reconcile: at once, or once elected leader."""
    # the gangs with an open request, read at each scrape from the controller made below
    metrics = Metrics(
        in_flight=lambda: controller.caches.in_flight.gangs(),  # noqa: PLW0108
        queue_depth=lambda: controller.queue.ready,
        leading=lambda: elector is None or elector.is_leader,
    )
    kube = kube.observed(metrics.api_request)
    elector = LeaderElector(kube, options.leader_election) if options.leader_election else None
    controller = Controller(
        kube.fenced(elector.write_fence) if elector is not None else kube,
        workers=options.workers,
        metrics=metrics,
        pod_groups=options.pod_groups,
        discovery_seconds=options.discovery_seconds,
        progress_delay_seconds=options.progress_delay_seconds,
    )

    await _serve(
        options,
        metrics,
        elector,
        controller.run,
        serving=lambda: controller.caches.synced,
        webhook=_webhook(options, metrics),
    )


async def run_dispatcher(
    kube: Kube,
    options: RunOptions,
    *,
    at_once: int = 1,
    worker_lease: tuple[str, str] = (LEASE_NAMESPACE, LEASE_NAME),
    answer_within: float = ANSWER_WITHIN,
    rounds: RoundWait | None = None,
) -> None:
    """The manager cluster's role (``gangcheck run --role dispatcher``): serve health and
    metrics, then dispatch Workloads to worker clusters (gangcheck.dispatcher), at once or
    once elected leader (one dispatcher writes nominations at a time). ``worker_lease``:
    gangcheck's leader Lease in each worker (namespace, name); ``answer_within``: the seconds
    a pass waits for one worker's reads; ``rounds``: how long a gang every worker failed for
    waits before they are all tried again."""
    metrics = Metrics(leading=lambda: elector is None or elector.is_leader)
    kube = kube.observed(metrics.api_request)
    elector = LeaderElector(kube, options.leader_election) if options.leader_election else None
    dispatcher = Dispatcher(
        kube.fenced(elector.write_fence) if elector is not None else kube,
        metrics=metrics,
        at_once=at_once,
        worker_lease=worker_lease,
        answer_within=answer_within,
        rounds=rounds,
    )

    await _serve(options, metrics, elector, dispatcher.run, serving=lambda: dispatcher.passes > 0)


def not_ready(
    *, draining: bool, webhook_serving: bool | None, standing_by: bool, serving: bool
) -> str:
    """Why a replica is not ready ("" when it is): what `/readyz` answers, and so whether the
    webhook Service sends it reviews. Shutting down: not ready. With a webhook
    (`webhook_serving` not None), ready while it answers, leading or standing by, caches
    synced or not: it reads nothing but the review and its certificate files. Without one,
    ready while standing by behind another leader, or once `serving`."""
    if draining:
        return "shutting down"
    if webhook_serving is not None:
        return "" if webhook_serving else "the webhook is not serving"
    if standing_by or serving:
        return ""
    return "caches not synced"


async def _serve(
    options: RunOptions,
    metrics: Metrics,
    elector: LeaderElector | None,
    run: Callable[[], Coroutine[Any, Any, None]],
    *,
    serving: Callable[[], bool],
    webhook: WebhookServer | None = None,
) -> None:
    """Health and metrics (and the webhook: on every replica, the Service sends reviews to
    all of them) served around `run`, which runs at once, or once `elector` leads; ready as
    `not_ready` says. When `run` ends (SIGTERM cancels it), the replica turns NotReady and
    the webhook keeps answering `drain_seconds` while the API server stops sending it
    reviews (the Service's endpoint removed), then stops: a rollout creates no member
    ungated by calls to a replica gone."""
    draining = False

    def ready() -> str:
        return not_ready(
            draining=draining,
            webhook_serving=webhook.serving if webhook is not None else None,
            standing_by=elector is not None and not elector.is_leader,
            serving=serving(),
        )

    server = HealthServer(
        metrics=metrics,
        ready=ready,
        bind_address=options.bind_address,
        health_port=options.health_port,
        metrics_port=options.metrics_port,
    )
    await server.start()
    if webhook is not None:
        await webhook.start()
        log.info("webhook serving on port %d", webhook.port)
    try:
        if elector is None:
            await run()
        else:
            await elector.run(run)
    finally:
        draining = True
        try:
            drain = options.webhook.drain_seconds if options.webhook is not None else 0.0
            if webhook is not None and drain > 0:
                log.info("NotReady; the webhook answers %.1fs more, then stops", drain)
                await asyncio.sleep(drain)
        finally:
            if webhook is not None:
                await webhook.stop()
            await server.stop()


def _webhook(options: RunOptions, metrics: Metrics) -> WebhookServer | None:
    if options.webhook is None:
        return None
    certs = Path(options.webhook.cert_dir)
    return WebhookServer(
        cert_file=certs / "tls.crt",
        key_file=certs / "tls.key",
        bind_address=options.bind_address,
        port=options.webhook.port,
        on_gated=metrics.pod_gated,
        on_error=metrics.webhook_error,
    )
