"""The capacity-aware MultiKueue dispatcher (``gangcheck run --role dispatcher``, in the
manager cluster): the thin edge around :func:`gangcheck.logic.dispatch.decide`.

It keeps the manager's AdmissionChecks, MultiKueueConfigs, MultiKueueClusters and Workloads
in watch-fed caches while it runs (``_manager_items``: listed only while a cache is not
filled or its watch is broken), and makes a pass as soon as one of them changes, as soon
as a ProvisioningRequest changes in a worker (a watch there, through the worker's client:
gangcheck's request saying its source cannot deliver moves the gang on at once), and at least
every ``interval`` seconds (the poll: what else changes in a worker, such as nodes arriving or
a copy evicted, is seen within it). A pass reads, in the manager, the AdmissionChecks of
MultiKueue's controller, the MultiKueueConfigs, the MultiKueueClusters and the Workloads; for
each Workload that carries such a check, has quota reserved and is not yet placed (no
``status.clusterName``), oldest first, it gathers the facts of every worker its checks'
MultiKueueConfigs list (MultiKueue copies it to no other; a cluster listed without a
MultiKueueCluster is skipped) and takes one step. A worker's client (and its watches) is
kept while a MultiKueueConfig of MultiKueue's checks lists it and its MultiKueueCluster and
Secret are there, and made again when the kubeconfig in that Secret changes (its digest: an
update leaving it as it was keeps the client). Each worker is read
once per pass (its AdmissionChecks, nodes, pods, ProvisioningRequests and Workloads, side by
side, the workers side by side), for every Workload of the pass, the copies of the Workloads
nominated there included (a slow worker costs a pass its answer once, not once per Workload,
and at most ``answer_within`` seconds, ``ANSWER_WITHIN``: one that does not answer by then is
skipped, and skipped unread by the next passes for ``SILENT_FIRST`` seconds, doubled up to
``SILENT_MAX`` while it stays silent, then read again):

- a worker whose MultiKueueCluster is not ``Active``, whose kubeconfig Secret is missing or
  unusable (one naming a command to run or a file to read is never loaded:
  ``kubeconfig_unused``; one refused is not read again while its Secret holds it), that does
  not answer or answers what cannot be read, that refuses its credentials (401, on a list or
  on a get while its lists come from caches), or that runs no gangcheck (no AdmissionCheck of
  gangcheck's controller ``Active`` there) is skipped, with the reason;
- so is a worker whose gangcheck is down: its leader Lease there (``worker_lease``; read
  while running in the background every ``LEASE_EVERY`` seconds, each read within the same
  bound, a pass using the latest answer as of when it came: a slow worker's answer holds up
  no pass, and one not answered within the bound is the worker's silence; read beside the
  lists when there is no answer yet) last renewed longer ago than its duration plus
  ``DOWN_GRACE`` (``lease_down``, its age bounded by what this process saw of its renewals
  by its own clock, ``sighted``: the AdmissionCheck stays ``Active`` when gangcheck's
  process dies, it wrote that condition itself). A worker nominated is kept so for
  ``DOWN_PATIENCE`` seconds more, then given up as a failed copy is (``with_down``). No
  Lease, or one the reader may not get (a reader's rights older than the Lease's rule), is
  not known: not skipped, logged once;
- whether the gang fits now on the worker's nodes (the manager Workload's pod sets, with
  those of the other gangs nominated there and not placed yet, against its nodes less what
  bound pods use), and how many such other gangs there are;
- whether it was given up lately for another gang (the records on the manager's Workloads:
  ``recent_failures``);
- its capacity sources' recent outcomes, from the records gangcheck leaves on its
  ProvisioningRequests there (fulfilled or started: delivered; rolled back: a stockout), for
  the gangs this dispatcher sent there only (``_sources``), each once per source;
- which cluster the worker's MultiKueueCluster reaches (the uid of its ``kube-system``
  Namespace, read with the Lease; recorded for each worker nominated): a worker re-pointed
  since it was nominated (its Secret changed to reach another cluster) is given up, the
  record saying that Kueue's copy in the earlier cluster is left there for a person to
  delete (``repointed``: Kueue then looks only in the new one);
- for a worker nominated, whether its copy of the Workload failed: a check ``Retry`` or
  ``Rejected``, not queued there at all (Kueue there says ``Inadmissible``: its LocalQueue
  missing or stopped, at once; its ClusterQueue missing or inactive, for
  ``NOT_QUEUED_WITHIN`` seconds), ``Evicted``, requeued, or deactivated; or whether
  gangcheck's request for it there says its capacity source cannot deliver
  (``cannot_deliver``: ``Failed``, or cluster-autoscaler's ``CapacityIsNotFound``), without
  waiting for gangcheck's deadline.

It then writes the record (annotation ``gangcheck.io/dispatch``) on the manager's Workload
first and the nomination second, by server-side apply of ``status.nominatedClusterNames`` as
field manager ``kueue-admission`` (Kueue drops the nomination with that manager when a worker
admits); a nomination another field manager owns (another dispatcher, a hand's write) is left
as written, and the record says who wrote it. The Events of a pass follow all its
nominations. A restart reads the record
and resumes: a worker nominated stays so until its copy fails. Nothing is ever written in a
worker: the worker's identity (the Secret MultiKueue already holds) is only read through.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import yaml

from gangcheck.kube.client import APPLY_PATCH, Kube, KubeconfigError
from gangcheck.kube.errors import ApiError, ForbiddenError, NotFoundError
from gangcheck.kube.informer import Informer
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    LEASE,
    MULTIKUEUE_CLUSTER,
    MULTIKUEUE_CONFIG,
    NAMESPACE,
    NODE,
    POD,
    PROVISIONING_REQUEST,
    SECRET,
    WORKLOAD,
    Resource,
)
from gangcheck.logic.attempt import published
from gangcheck.logic.attempt.actions import Event
from gangcheck.logic.attempt.published import STOCKOUT_CAUSES, Outcome, Seen
from gangcheck.logic.attempt.records import RollbackCause
from gangcheck.logic.dispatch import (
    ANSWER_WITHIN,
    IDENTITY_NAMESPACE,
    KUEUE_ADMISSION,
    KUEUE_ITSELF,
    LEASE_EVERY,
    MULTIKUEUE_CONTROLLER,
    RECORD_ANNOTATION,
    UNANSWERED,
    WORKER_LEASE_ANNOTATION,
    CheckWorkers,
    Departed,
    DispatchRecord,
    Down,
    Flavors,
    RoundWait,
    Sighting,
    Silence,
    SourceHistory,
    Step,
    WorkerFacts,
    admission_status,
    cannot_deliver,
    check_workers,
    copy_of,
    decide,
    departed,
    flavors_of,
    for_workload,
    kubeconfig_unused,
    lease_down,
    left_to_another,
    nominated_by_another,
    nominated_by_kueue,
    not_answering,
    owns_nomination,
    patient,
    recent_failures,
    same_capacity,
    sighted,
    silence,
    silent_reason,
    unanswered,
    unread,
    with_down,
    worker_lease,
    workers_for,
)
from gangcheck.logic.placement.fit import (
    BoundUsage,
    GangPodSet,
    NodeView,
    fit_gang,
    member_from_template,
    node_view,
    used_resources,
)
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.names import (
    ATTEMPT_CONFIG_ANNOTATION,
    CONTROLLER_NAME,
    FULFILLED,
    PHASE_ANNOTATION,
    ROLLBACK_REASON_ANNOTATION,
    SOURCE_ANNOTATION,
    STARTED,
    WORKLOAD_ANNOTATION,
    WORKLOAD_UID_ANNOTATION,
)
from gangcheck.model.objects import Obj, ObjectRef
from gangcheck.reconcile.events import EventRecorder
from gangcheck.reconcile.ingest import trim_node, trim_pod
from gangcheck.runtime.together import at_once
from gangcheck.settings import LEASE_NAME, LEASE_NAMESPACE
from gangcheck.telemetry import Metrics

log = logging.getLogger(__name__)

KUBECONFIG_KEY = "kubeconfig"
#: The poll (seconds) behind the watches on the manager's objects: what changes in a worker
#: (a request saying its source cannot deliver, nodes arriving) is seen within it.
DEFAULT_INTERVAL = 1.0
#: How many of a source's latest outcomes count.
RECENT = 10
#: How many resourceVersions of its own writes the dispatcher keeps to know their events.
OWN_WRITES_KEPT = 64
#: What a pass reads in the manager: from watch-fed caches while ``run`` keeps them
#: (``_manager_items``), so that a pass over thousands of Workloads, once a second even when
#: none waits, costs the manager's API server nothing.
_MANAGER_READS = (ADMISSION_CHECK, WORKLOAD, MULTIKUEUE_CONFIG, MULTIKUEUE_CLUSTER)
#: How long (seconds) ``run`` waits for those caches to be filled before its first pass.
SYNC_WAIT = 30.0
#: How often (seconds) at most a gang's record is written again when only the words of a
#: worker's skip changed (the same workers skipped, each for the same reason: ``_reworded``,
#: nothing else changed): a worker erring in new words at each read (a proxy's page naming
#: its request) otherwise had every waiting gang's record written, and a NoWorker Event
#: sent, at every pass.
SKIP_REWORDED_EVERY = 60.0


@dataclass
class _Worker:
    """A worker as the manager holds it: its client (None: skipped) and why not, and the
    digest of the kubeconfig its client was made from (``_digest``)."""

    name: str
    kube: Kube | None = None
    skip: str = ""
    kubeconfig: str = ""
    lease: tuple[str, str] | None = None
    """gangcheck's leader Lease there (``worker_lease``; None: the dispatcher's setting)."""


@dataclass(frozen=True)
class _Answer:
    """gangcheck's Lease in a worker and the cluster's identity there, as last read
    (``Dispatcher._probe``): each the object or the error its get raised, read at ``at`` (this
    process's clock); ``silent``: not answered within ``answer_within``."""

    lease_ref: tuple[str, str]
    at: datetime
    lease: Obj | Exception | None = None
    identity: Obj | Exception | None = None
    silent: bool = False


#: The longest uid taken as a cluster's identity (a uid is 36 characters): a longer answer is
#: no uid, and is not written into the record.
_UID_MAX = 128


class Dispatcher:
    """A pass over the manager's Workloads on each change, and every ``interval`` seconds
    (module doc)."""

    def __init__(
        self,
        kube: Kube,
        *,
        metrics: Metrics | None = None,
        kueue_namespace: str = "kueue-system",
        interval: float = DEFAULT_INTERVAL,
        at_once: int = 1,
        connect: Callable[[bytes], Awaitable[Kube]] | None = None,
        answer_within: float = ANSWER_WITHIN,
        clock: Callable[[], datetime] | None = None,
        worker_lease: tuple[str, str] = (LEASE_NAMESPACE, LEASE_NAME),
        unanswered_within: float = UNANSWERED,
        lease_every: float = LEASE_EVERY,
        rounds: RoundWait | None = None,
    ) -> None:
        self.kube = kube
        # how long a gang every worker failed for waits before they are all tried again
        self.rounds = rounds or RoundWait()
        # per worker, gangcheck's Lease and the cluster's identity there as last read
        # (``_probe``): read in the background every ``lease_every`` seconds while running
        # (``_probing``), so that a pass does not wait on a slow worker's answer
        self.lease_every = lease_every
        self._answers: dict[str, _Answer] = {}
        # per worker, why its identity could not be read, as last logged (logged once)
        self._identity_unknown: dict[str, str] = {}
        # a copy gangcheck in a worker has left untouched for this long gives the worker up
        # for its gang (``unanswered``): by (worker, namespace, copy uid), since when this
        # process saw it so; kept from pass to pass only while it stays so
        self.unanswered_within = unanswered_within
        self._unanswered: dict[tuple[str, str, str], datetime] = {}
        self._unanswered_seen: dict[tuple[str, str, str], datetime] = {}
        # a copy Kueue in a worker says its ClusterQueue is missing or inactive for this long
        # gives the worker up for its gang (``_not_queued_for``): timed the same way
        self.not_queued_within = NOT_QUEUED_WITHIN
        self._not_queued: dict[tuple[str, str, str], datetime] = {}
        self._not_queued_seen: dict[tuple[str, str, str], datetime] = {}
        # per Workload waiting (namespace, name), when this process last wrote its record: a
        # skip only reworded is written again ``SKIP_REWORDED_EVERY`` seconds after it
        self._record_written: dict[tuple[str, str], datetime] = {}
        # gangcheck's leader Lease in each worker (namespace, name): stale, gangcheck is down
        self.worker_lease = worker_lease
        # per worker, why its Lease could not be read, as last logged (logged once)
        self._lease_unknown: dict[str, str] = {}
        # per worker, its Lease's renewals as this process read them (``sighted``; with the
        # Lease read, namespace and name): its age bounded by this clock, whatever the
        # worker's says
        self._sightings: dict[str, tuple[tuple[str, str], Sighting]] = {}
        self.metrics = metrics or Metrics()
        self.kueue_namespace = kueue_namespace
        self.interval = interval
        self.at_once = at_once
        self.answer_within = answer_within
        self._now = clock or (lambda: datetime.now(UTC))
        self.events = EventRecorder(kube, clock=self._now)
        # the workers that did not answer within ``answer_within``, by name: skipped unread
        # until their window ends (``silence``)
        self._silent: dict[str, Silence] = {}
        # per worker, the digest of a kubeconfig refused (``_worker``) and why: not parsed or
        # loaded again at each pass while its Secret holds it
        self._refused_configs: dict[str, tuple[str, str]] = {}
        # the workers connected (a client, and its watches while running), by name: those a
        # MultiKueueConfig served lists, through their MultiKueueCluster's Secret as last read
        self._workers: dict[str, _Worker] = {}
        self._connect = connect or _connect
        self._wake = asyncio.Event()
        self._running = False
        self._worker_watches: dict[str, list[asyncio.Task[None]]] = {}
        # per worker, the Workloads (namespace, name) nominated there and waiting: a change
        # of a request of one of them wakes a pass
        self._followed: dict[str, set[tuple[str, str]]] = {}
        # each gang's give-ups, with its flavors, kept a while after its Workload is deleted
        self._departed: Departed = {}
        self.passes = 0
        self.woken_by_workers = 0
        # the resourceVersions of the manager's Workloads as this dispatcher's own writes left
        # them (the latest OWN_WRITES_KEPT): their watch events wake no pass
        self._own_writes: dict[str, None] = {}
        # the manager's objects a pass reads, kept by watches while ``run`` runs (empty: a
        # pass lists them, as ``pass_once`` called alone does)
        self._caches: dict[Resource, Informer] = {}
        # per worker, its caches of what a pass reads there, while running (``_start_watching``)
        self._worker_caches: dict[str, dict[Resource, Informer]] = {}

    async def run(self) -> None:
        self._running = True
        self._caches = {res: Informer(self.kube, res, transform=_slim) for res in _MANAGER_READS}
        for res, informer in self._caches.items():
            informer.add_handler(self._woken_by(res))
        watchers = [asyncio.create_task(i.run()) for i in self._caches.values()]
        try:
            await self._synced()
            while True:
                self._wake.clear()
                try:
                    await self.pass_once()
                except ApiError as e:
                    log.warning("dispatch pass failed: %s", e)
                self.passes += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval)
        finally:
            self._running = False
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            self._caches = {}
            await self.close()

    async def _synced(self) -> None:
        """Waits, at most ``SYNC_WAIT`` seconds, until every cache is filled: the first pass
        reads them (their first lists wake no pass more). One not filled by then (its CRD
        not served yet) is listed by the passes meanwhile."""
        waits = [asyncio.ensure_future(i.synced.wait()) for i in self._caches.values()]
        try:
            await asyncio.wait(waits, timeout=SYNC_WAIT)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    def _woken_by(self, res: Resource) -> Callable[[Obj | None, Obj | None], None]:
        """Wakes the loop on any change of the manager's ``res`` (a Workload's, unless it is
        as this dispatcher's own write left it: ``_own_write``)."""

        def changed(_old: Obj | None, new: Obj | None) -> None:
            if res is WORKLOAD and new is not None and self._own_write(new):
                return
            self._wake.set()

        return changed

    async def _manager_items(self, res: Resource) -> list[Obj]:
        """The manager's objects of ``res``: from its cache while it is synced and current
        (``run``), else listed (before the first list answered, while its watch is broken,
        and for ``pass_once`` called alone). The cache's objects are not copied: a pass
        changes none of them (``_dispatch`` works on a copy of what it writes)."""
        informer = self._caches.get(res)
        if informer is not None and informer.synced.is_set() and informer.current:
            return list(informer.store)
        return await _items(self.kube, res)

    def _own_write(self, obj: Mapping[str, Any]) -> bool:
        """The Workload ``obj`` is as this dispatcher's own write left it: the pass that
        wrote it took it into account already (a pass woken by it would find nothing to do,
        and a worker's change arriving meanwhile would wait for that pass to end)."""
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if version not in self._own_writes:
            return False
        del self._own_writes[version]
        return True

    def _wrote(self, written: Obj) -> None:
        """After a write of a manager's Workload: its version is known as ours, and its cache
        holds it (the next pass reads it, whether or not the watch brought it yet)."""
        version = str(((written or {}).get("metadata") or {}).get("resourceVersion") or "")
        if version:
            self._own_writes[version] = None
            while len(self._own_writes) > OWN_WRITES_KEPT:
                del self._own_writes[next(iter(self._own_writes))]
        cache = self._caches.get(WORKLOAD)
        if cache is not None and written:
            cache.store.put_if_newer(written)

    def _worker_changed(self, name: str, res: Resource) -> Callable[[Obj | None, Obj | None], None]:
        """Wakes the loop on a change in the worker ``name`` of a ProvisioningRequest (``res``)
        of a Workload nominated there and waiting (gangcheck's request saying its source
        cannot deliver, a rollback recorded), or of its copy there (``WORKLOAD``: its check
        state, evicted, admitted): the dispatcher moves on, or records the admission, when
        the worker says so, not at the next poll."""

        def changed(old: Obj | None, new: Obj | None) -> None:
            if self._follows(name, res, new or old or {}):
                self.woken_by_workers += 1
                self._wake.set()

        return changed

    def _follows(self, worker: str, res: Resource, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if res is WORKLOAD:
            workload = meta.get("name")
        else:
            workload = (meta.get("annotations") or {}).get(WORKLOAD_ANNOTATION)
        return (str(meta.get("namespace") or ""), str(workload)) in self._followed.get(worker, ())

    def _start_watching(self, name: str, kube: Kube) -> None:
        """While running: the worker's caches of what a pass reads there (``_VIEW_READS``),
        each listed once and kept by watch through the worker's client (read-only: ``list``,
        ``watch``); a change of a request or a copy followed wakes a pass
        (``_worker_changed``). A cache refused its watch (a reader's rights older than its
        rule) or whose watch is broken is listed by the passes meanwhile (``_view``)."""
        if self._running:
            caches = {
                res: Informer(kube, res, transform=_WORKER_TRIM.get(res)) for res in _VIEW_READS
            }
            for res in (PROVISIONING_REQUEST, WORKLOAD):
                caches[res].add_handler(self._worker_changed(name, res))
            self._worker_caches[name] = caches
            self._worker_watches[name] = [asyncio.create_task(c.run()) for c in caches.values()]
            self._worker_watches[name].append(asyncio.create_task(self._probing(name, kube)))

    async def _drop(self, name: str) -> None:
        """Ends the worker's watches and closes its client (when held), and forgets its
        silence (another client, perhaps another server, is read afresh)."""
        self._silent.pop(name, None)
        self._refused_configs.pop(name, None)
        self._lease_unknown.pop(name, None)
        self._sightings.pop(name, None)
        self._answers.pop(name, None)
        self._identity_unknown.pop(name, None)
        self._worker_caches.pop(name, None)
        held = self._workers.pop(name, None)
        tasks = self._worker_watches.pop(name, [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if held is not None and held.kube is not None:
            try:
                await held.kube.close()
            except Exception as e:  # closed anyway as far as the dispatcher is concerned
                log.debug("closing the client of %s: %s", name, e)

    async def _forget(
        self,
        by_check: Mapping[str, CheckWorkers],
        clusters: Sequence[Obj],
        *,
        also: Iterable[str] = (),
    ) -> None:
        """Drops the workers held that no MultiKueueConfig of MultiKueue's checks lists any
        more (but those ``also`` read: nominated for a Workload waiting), or whose
        MultiKueueCluster is gone (their clients and watches would be kept for nothing,
        reading with credentials the manager no longer holds), a kubeconfig refused
        included (its digest and reason, else kept for the process's life)."""
        held = self._workers.keys() | self._worker_watches.keys() | self._refused_configs.keys()
        gone = _gone(held, by_check, clusters, also=also)
        for name in sorted(gone):
            log.info("worker %s no longer listed or its MultiKueueCluster gone: closed", name)
        await asyncio.gather(*(self._drop(name) for name in gone))

    async def close(self) -> None:
        held = self._workers.keys() | self._worker_watches.keys() | self._refused_configs.keys()
        await asyncio.gather(*(self._drop(name) for name in held))

    # -- one pass ---------------------------------------------------------------------------

    async def pass_once(self) -> None:
        # The manager's reads side by side, two by two: each round trip in a row is time a
        # gang waits for its nomination (the configs and clusters only when a Workload waits,
        # or, when none does, a worker is held: to close it once no longer listed).
        checks, workloads = await asyncio.gather(
            self._manager_items(ADMISSION_CHECK), self._manager_items(WORKLOAD)
        )
        ours = {
            c["metadata"]["name"]
            for c in checks
            if (c.get("spec") or {}).get("controllerName") == MULTIKUEUE_CONTROLLER
        }
        # shallow copies: the record written replaces a copy's metadata, not the cache's
        waiting = [dict(wl) for wl in workloads if _to_dispatch(wl, ours)] if ours else []
        if not waiting:
            self._followed = {}
            self.metrics.dispatch_waiting(0, 0)
            if self._workers or self._worker_watches or self._refused_configs:  # still listed?
                configs, clusters = await asyncio.gather(
                    self._manager_items(MULTIKUEUE_CONFIG),
                    self._manager_items(MULTIKUEUE_CLUSTER),
                )
                await self._forget(check_workers(checks, configs), clusters)
            return
        configs, clusters = await asyncio.gather(
            self._manager_items(MULTIKUEUE_CONFIG), self._manager_items(MULTIKUEUE_CLUSTER)
        )
        by_check = check_workers(checks, configs)
        records = {_key(wl): _record(wl) for wl in workloads}
        configured = {_key(wl): workers_for(_check_names(wl) & ours, by_check) for wl in waiting}
        unlisted = _unlisted(waiting, records, configured, clusters)
        also = set().union(*unlisted.values())
        await self._forget(by_check, clusters, also=also)
        workers = await self._workers_listed(by_check, clusters, also=also)
        # each worker read once per pass, the workers side by side
        views = dict(
            zip(
                (w.name for w in workers),
                await asyncio.gather(*(self._view(w) for w in workers)),
                strict=True,
            )
        )
        # oldest first: a burst is spread in the order Kueue reserved its quota
        waiting.sort(key=lambda wl: str(wl["metadata"].get("creationTimestamp") or ""))
        self._unanswered_seen, self._not_queued_seen = {}, {}
        nominated = {
            _key(wl): _nominated_to(wl, records[_key(wl)]) for wl in workloads if _pending(wl)
        }
        pod_sets = {_key(wl): _pod_sets(wl) for wl in workloads}
        memory = self._memory(records, workloads)
        rooms = _Rooms(views, nominated, pod_sets)
        # every gang's step decided in order (each on the nominations before it), then
        # written side by side: a burst's last gang is not nominated a round trip per gang
        # after its first
        steps: list[_Planned] = []
        for wl in waiting:
            key = _key(wl)
            alike, failures = memory.of(key, self._now())
            counts = Counter(c for k, cs in nominated.items() if k != key for c in cs)
            mine = configured[key]
            step = await self._dispatch(
                wl,
                [w for w in workers if w.name in mine.clusters or w.name in unlisted[key]],
                unlisted=unlisted[key],
                configured=mine.clusters,
                unconfigured=mine.problem,
                views=views,
                rooms=rooms,
                counts=counts,
                failures=failures,
                alike=alike,
            )
            steps.append(_Planned(wl, records[key], nominated.get(key, ()), step))
            records[key] = step.record
            nominated[key] = tuple(step.nominated)
            rooms.nominated_anew(key, step.newly_nominated)
        told = await self._write_steps(steps, records, nominated)
        followed: dict[str, set[tuple[str, str]]] = {}
        for key in {_key(wl) for wl in waiting}:
            for cluster in nominated.get(key, ()):
                followed.setdefault(cluster, set()).add(key)
        self._followed = followed
        self._passed({_key(wl) for wl in waiting}, memory)
        trying = sum(1 for wl in waiting if nominated.get(_key(wl)))
        self.metrics.dispatch_waiting(trying, len(waiting) - trying)
        for wl, step in told:
            try:
                await self._tell(wl, step)
            except ApiError as e:
                log.warning("events of %s not recorded: %s", _ref(wl).name, e)

    async def _write_steps(
        self,
        steps: Sequence[_Planned],
        records: dict[tuple[str, str], DispatchRecord],
        nominated: dict[tuple[str, str], tuple[str, ...]],
    ) -> list[tuple[Obj, Step]]:
        """Write the pass's steps side by side (each gang's record, then its nomination:
        ``_write_step``); a gang whose write failed is left in ``records`` and ``nominated``
        as it was before the step (as the next pass reads it). The steps written with
        something to tell, for the Events after every nomination of the pass."""
        written = await at_once(functools.partial(self._write_step, p) for p in steps)
        told = []
        for p, error in zip(steps, written, strict=True):
            if isinstance(error, ApiError):
                log.warning("dispatching %s failed: %s", _ref(p.wl).name, error)
                records[_key(p.wl)], nominated[_key(p.wl)] = p.record, p.was
                continue
            if error is not None:
                raise error
            if _to_tell(p.record, p.step):
                told.append((p.wl, p.step))
        return told

    def _memory(
        self, records: dict[tuple[str, str], DispatchRecord], workloads: Sequence[Obj]
    ) -> _Memory:
        """What the pass remembers of the gangs' attempts (``_Memory``), the give-ups of gangs
        deleted since as the passes before kept them (``_passed``)."""
        gone = {k: v for k, v in self._departed.items() if k not in records}
        return _Memory(records, {_key(wl): flavors_of(wl) for wl in workloads}, gone)

    def _passed(self, waiting: set[tuple[str, str]], memory: _Memory) -> None:
        """After a pass: the timings kept are those it saw (``waiting``: its Workloads); the
        give-ups kept for after a gang's deletion (``dispatch.departed``), as the pass left
        the records (``memory``, its give-ups written)."""
        self._departed = departed(self._departed, memory.records, memory.asks, self._now())
        self._unanswered = self._unanswered_seen
        self._not_queued = self._not_queued_seen
        self._record_written = {k: t for k, t in self._record_written.items() if k in waiting}

    async def _dispatch(
        self,
        wl: Obj,
        workers: Sequence[_Worker],
        *,
        views: Mapping[str, _View],
        rooms: Callable[[str], _Room],
        counts: Mapping[str, int],
        failures: Mapping[str, str],
        alike: _Alike | None = None,
        unconfigured: str = "",
        unlisted: Iterable[str] = (),
        configured: Sequence[str] | None = None,
    ) -> Step:
        """The step for ``wl`` (written by ``_write_step``). ``unlisted``: workers of
        ``workers`` nominated that its MultiKueueConfigs no longer list; ``configured``: the
        workers they list; ``alike``: the gangs whose outcomes in a worker speak for this
        one's (``_Memory.of``)."""
        record = _record(wl)
        dropped = set(unlisted)

        async def facts_of(*, fit: bool) -> list[WorkerFacts]:
            facts = [
                await self._facts(
                    worker,
                    views[worker.name],
                    wl,
                    nominated=worker.name in record.nominated,
                    room=functools.partial(rooms, worker.name) if fit else None,
                    pending=counts.get(worker.name, 0),
                    lately_failed=failures.get(worker.name, ""),
                    alike=alike,
                )
                for worker in workers
            ]
            return [replace(f, unlisted=True) if f.name in dropped else f for f in facts]

        status = wl.get("status") or {}
        written = list(status.get("nominatedClusterNames") or [])
        another = nominated_by_another(wl["metadata"]) if written else ""
        if not another and nominated_by_kueue(record, written, at_once=self.at_once):
            another = KUEUE_ITSELF
        now = self._now()

        async def step_with(*, fit: bool) -> Step:
            facts = await facts_of(fit=fit)
            return decide(
                record,
                facts,
                at_once=self.at_once,
                now=now,
                unconfigured=unconfigured,
                written=written,
                rounds=self.rounds,
            )

        if another:
            step = left_to_another(record, written, another, configured=configured)
        else:
            # whether the gang fits now counts only when a worker is chosen: a gang kept on
            # its worker costs no fit (each next to every other gang pending there)
            step = await step_with(fit=False)
            if step.newly_nominated:
                step = await step_with(fit=True)
        if step.record != record and self._reworded_lately(wl, record, step, now):
            step = replace(step, record=replace(step.record, skipped=record.skipped))
        return step

    async def _write_step(self, planned: _Planned) -> None:
        """Write the step decided for a gang: the record, then the nomination (a restart
        between the two finds the record and nominates again, never another cluster first)."""
        wl, record, step = planned.wl, planned.record, planned.step
        if step.record != record:
            await self._write_record(wl, step.record)
            self._record_written[_key(wl)] = self._now()
            if step.record.round > record.round:
                self.metrics.dispatch_round()
            if step.record.admitted and not record.admitted:  # once per gang, as written
                self.metrics.dispatch_clusters_tried(len(step.record.tried))
        written = list((wl.get("status") or {}).get("nominatedClusterNames") or [])
        if list(step.nominated) != written:
            await self._nominate(wl, step.nominated)

    def _reworded_lately(self, wl: Obj, record: DispatchRecord, step: Step, now: datetime) -> bool:
        """The step changes only the words of the workers' skips (the same workers skipped,
        each for the same reason: ``_reworded``; nothing else) and this process wrote the
        record less than ``SKIP_REWORDED_EVERY`` seconds ago: the record is left as it is (a
        worker's error text may change at each read; its new words show within that time)."""
        now_skipped, was = step.record.skipped, record.skipped
        if step.changed or now_skipped.keys() != was.keys():
            return False
        if not all(_reworded(was[c], said) for c, said in now_skipped.items()):
            return False
        if replace(step.record, skipped=record.skipped) != record:
            return False
        written = self._record_written.get(_key(wl))
        return written is not None and (now - written).total_seconds() < SKIP_REWORDED_EVERY

    async def _write_record(self, wl: Obj, record: DispatchRecord) -> None:
        meta = wl["metadata"]
        patch = {
            "metadata": {
                "resourceVersion": meta["resourceVersion"],
                "annotations": {RECORD_ANNOTATION: record.to_annotation()},
            }
        }
        reply = await self.kube.merge_patch(WORKLOAD, meta["name"], patch, meta["namespace"])
        self._wrote(reply)
        wl["metadata"] = reply["metadata"]

    async def _nominate(self, wl: Obj, clusters: Sequence[str]) -> None:
        meta = wl["metadata"]
        body = {
            "apiVersion": WORKLOAD.api_version,
            "kind": WORKLOAD.kind,
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                # the Workload as read (or as the record left it): a status Kueue changed
                # meanwhile (placed, evicted) refuses the nomination; the next pass reads it
                "resourceVersion": meta["resourceVersion"],
            },
            # every field of kueue-admission as it is, or the apply would drop them
            "status": admission_status(wl.get("status") or {}, clusters),
        }
        self._wrote(
            await self.kube.request(
                "PATCH",
                f"{WORKLOAD.object_path(meta['name'], meta['namespace'])}/status",
                query={"fieldManager": KUEUE_ADMISSION, "force": "true"},
                body=body,
                content_type=APPLY_PATCH,
            )
        )

    async def _tell(self, wl: Obj, step: Step) -> None:
        ref = _ref(wl)
        for cluster, why in step.fallbacks.items():
            self.metrics.dispatch_fallback(cluster)
            await self.events.emit(
                ref, Event("DispatchFallback", f"gave up on {cluster}: {why}", warning=True)
            )
        for cluster in step.newly_nominated:
            self.metrics.dispatch_nomination(cluster)
            await self.events.emit(
                ref, Event("Nominated", f"nominated {cluster}: {step.record.reason}")
            )
        if not step.nominated:
            skipped = "; ".join(f"{c}: {why}" for c, why in sorted(step.record.skipped.items()))
            message = step.record.reason + (f" (skipped: {skipped})" if skipped else "")
            await self.events.emit(ref, Event("NoWorker", message, warning=True))

    # -- a worker's facts -------------------------------------------------------------------

    async def _workers_listed(
        self,
        by_check: Mapping[str, CheckWorkers],
        clusters: Sequence[Obj],
        *,
        also: Iterable[str] = (),
    ) -> list[_Worker]:
        """The workers the MultiKueueConfigs of MultiKueue's checks list (MultiKueue copies
        a Workload to no other), and those ``also`` (nominated, no longer listed: read for
        the copy left there): each through its MultiKueueCluster (``clusters``, the
        manager's), or skipped without one."""
        listed = sorted({c for workers in by_check.values() for c in workers.clusters} | set(also))
        objects = {c["metadata"]["name"]: c for c in clusters}

        async def worker(name: str) -> _Worker:
            held = self._workers.get(name)
            if name not in objects and name in set(also) and held is not None and held.kube:
                return held  # its MultiKueueCluster gone: read through the client held
            if name not in objects:
                return _Worker(name, skip=f"no MultiKueueCluster {name}")
            return await self._worker(objects[name])

        return list(await asyncio.gather(*(worker(name) for name in listed)))

    async def _worker(self, cluster: Obj) -> _Worker:
        """The worker's client, made again when the kubeconfig in its Secret changes (its
        digest: an update of the Secret leaving it as it was keeps the client); else why it
        is skipped. A Secret gone, or without a kubeconfig, closes the client held."""
        name = cluster["metadata"]["name"]
        active = _condition(cluster, "Active")
        if active is None or active.get("status") != "True":
            why = (
                "no Active condition"
                if active is None
                else f"{active.get('reason')}: {active.get('message')}"
            )
            return _Worker(name, skip=f"MultiKueueCluster not Active ({why})")
        lease = worker_lease(cluster, self.worker_lease)
        if isinstance(lease, str):
            return _Worker(name, skip=lease)
        origin = (cluster.get("spec") or {}).get("clusterSource") or {}
        source = origin.get("kubeConfig") or {}
        if source.get("locationType", "Secret") != "Secret":
            return _Worker(name, skip="its kubeconfig is not in a Secret (only Secrets are read)")
        secret_name = str(source.get("location") or "")
        if not secret_name:  # asked for, '' would be the Secrets' collection
            profile = (origin.get("clusterProfileRef") or {}).get("name")
            why = f" (ClusterProfile {profile}: not read)" if profile else ""
            return _Worker(name, skip=f"no kubeconfig Secret{why}")
        try:
            secret = await self.kube.get_if_exists(SECRET, secret_name, self.kueue_namespace)
        except ApiError as e:
            return _Worker(name, skip=f"Secret {self.kueue_namespace}/{secret_name}: {e}")
        if secret is None:
            await self._drop(name)
            return _Worker(name, skip=f"Secret {self.kueue_namespace}/{secret_name} not found")
        raw = str((secret.get("data") or {}).get(KUBECONFIG_KEY) or "")
        if not raw:
            await self._drop(name)
            why = f"Secret {self.kueue_namespace}/{secret_name} has no key {KUBECONFIG_KEY}"
            return _Worker(name, skip=why)
        digest = _digest(raw)
        held = self._workers.get(name)
        if held is not None and held.kube is not None and held.kubeconfig == digest:
            held.lease = lease
            return held
        where = f"Secret {self.kueue_namespace}/{secret_name}"
        refused = self._refused_configs.get(name)
        if refused is not None and refused[0] == digest:  # read once: the same answer
            return _Worker(name, skip=f"{where}: {refused[1]}")
        await self._drop(name)  # a kubeconfig rotated: another server, other credentials
        config, why = await asyncio.to_thread(_read_kubeconfig, raw)
        if not why:  # (Kueue refuses those too: its MultiKueueCluster turns not Active soon)
            try:
                kube = await self._connect(config)
            except Exception as e:  # any unusable kubeconfig: the worker is skipped, said why
                why = f"unusable kubeconfig ({_first_line(e)})"
        if why:
            self._refused_configs[name] = (digest, why)
            return _Worker(name, skip=f"{where}: {why}")
        held = self._workers[name] = _Worker(name, kube, kubeconfig=digest, lease=lease)
        self._start_watching(name, kube)
        return held

    async def _view(self, worker: _Worker) -> _View:
        """What a pass reads of one worker, once for every Workload it dispatches: whether
        gangcheck runs there, its nodes, its pods, gangcheck's requests and its Workloads
        (the copies; read side by side). All of them within ``answer_within`` seconds, or
        the worker is skipped as silent, and skipped unread by the next passes until its
        window ends (``silence``, ``unread``). gangcheck's Lease there and the cluster's
        identity: their latest answer while running (read in the background, ``_probing``:
        the pass does not wait on them), else read beside the lists, within the same bound;
        an answer that did not come within the bound is the worker's silence as well."""
        if worker.kube is None:
            return _View(skip=worker.skip)
        kube = worker.kube
        lease_ref = worker.lease or self.worker_lease
        held = self._silent.get(worker.name)
        said = unread(held, self._now(), within=self.answer_within)
        if said:
            return _View(skip=said, patient=patient(held))
        caches = self._worker_caches.get(worker.name, {})
        answer = self._answers.get(worker.name)
        if not self._running or answer is None or answer.lease_ref != lease_ref:
            answer = None  # none read in the background yet (or of another Lease): read now
        elif answer.silent:
            return self._silenced(worker.name, held)
        try:
            if answer is None:
                reads, read = await asyncio.wait_for(
                    asyncio.gather(
                        _worker_reads(kube, caches), self._probe(worker.name, kube, lease_ref)
                    ),
                    self.answer_within,
                )
            else:
                reads = await asyncio.wait_for(_worker_reads(kube, caches), self.answer_within)
                read = answer
        except TimeoutError:
            return self._silenced(worker.name, held)
        self._silent.pop(worker.name, None)
        refused = _unauthorized(read.lease, read.identity)
        if refused is not None:  # its lists may come from caches a watch filled before
            return _View(skip=_credentials_refused(refused))
        view = self._view_read(worker.name, reads, self._now())
        view.identity = self._identity(worker.name, read.identity)
        if not view.skip:
            got = self._lease(worker.name, read.lease, lease_ref)
            prior = self._sightings.get(worker.name)
            seen = prior[1] if prior and prior[0] == lease_ref else None
            view.down = lease_down(got, read.at, name=lease_ref, seen=seen)
        return view

    def _silenced(self, name: str, held: Silence | None) -> _View:
        """The worker ``name`` did not answer within ``answer_within``: skipped, and unread
        until its window ends (``silence``; ``held``: its window before)."""
        silent = silence(held, self._now())
        self._silent[name] = silent
        log.warning(
            "worker %s did not answer within %gs: skipped until %s",
            name,
            self.answer_within,
            silent.until.isoformat(),
        )
        return _View(skip=silent_reason(silent, within=self.answer_within), patient=patient(silent))

    @staticmethod
    def _view_read(name: str, reads: Sequence[list[Obj] | BaseException], now: datetime) -> _View:
        """The worker's lists (``_VIEW_READS``, as ``_worker_reads`` returned them) made sense
        of, or why it is skipped."""
        for res, read in zip(_VIEW_READS, reads, strict=True):
            if isinstance(read, ApiError):
                return _View(skip=_refused(res, read))
            if isinstance(read, Exception):  # a body that is not JSON
                return _View(skip=_unreadable(read))
            if isinstance(read, BaseException):
                raise read
        checks, nodes, pods, requests, copies = (
            r for r in reads if not isinstance(r, BaseException)
        )
        try:
            return _view_of(checks, nodes, pods, requests, copies, now=now)
        except Exception as e:  # a worker's objects not as its API serves them
            log.warning("worker %s answered what cannot be read: %r", name, e)
            return _View(skip=_unreadable(e))

    async def _probe(self, name: str, kube: Kube, lease: tuple[str, str]) -> _Answer:
        """Reads gangcheck's Lease ``lease`` (namespace, name) in the worker ``name`` and the
        cluster's identity there (its ``IDENTITY_NAMESPACE`` Namespace), side by side, not
        bounded (the caller bounds it); keeps the answer for the passes, and the Lease's
        sighting by this process's clock, at the time it answered (``sighted``)."""
        read, identity = await asyncio.gather(
            _get_or_error(kube, LEASE, lease[1], lease[0]),
            _get_or_error(kube, NAMESPACE, IDENTITY_NAMESPACE, None),
        )
        answer = _Answer(lease, self._now(), read, identity)
        prior = self._sightings.get(name)
        got = read if isinstance(read, Mapping) else None
        seen = sighted(prior[1] if prior and prior[0] == lease else None, got, answer.at)
        if seen is not None:
            self._sightings[name] = (lease, seen)
        self._answers[name] = answer
        return answer

    async def _probing(self, name: str, kube: Kube) -> None:
        """While the worker ``name`` is held through ``kube``: its ``_probe`` every
        ``lease_every`` seconds, each bounded by ``answer_within`` (one not answered by then
        is kept as its silence: the next pass skips the worker as one that does not answer).
        The first is the pass's own, read as the client is made."""
        while True:
            await asyncio.sleep(self.lease_every)
            held = self._workers.get(name)
            if held is None or held.kube is not kube:
                return
            lease = held.lease or self.worker_lease
            try:
                await asyncio.wait_for(self._probe(name, kube, lease), self.answer_within)
            except TimeoutError:
                self._answers[name] = _Answer(lease, self._now(), silent=True)

    def _identity(self, name: str, read: Obj | Exception | None) -> str:
        """The identity of the cluster the worker ``name`` reaches (``WorkerFacts.identity``:
        the uid of its ``IDENTITY_NAMESPACE``, as read), or '' when not known: the reader's
        rights older than the rule granting its get (403), or any other failure, said in the
        log once (a re-pointed MultiKueueCluster is then not noticed)."""
        meta = read.get("metadata") if isinstance(read, Mapping) else None
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        if isinstance(uid, str) and 0 < len(uid) <= _UID_MAX:
            self._identity_unknown.pop(name, None)
            return uid
        where = f"Namespace {IDENTITY_NAMESPACE}"
        if isinstance(read, ForbiddenError):
            why = (
                f"get on {where} refused (the reader's rights, manifests/dispatcher/worker/"
                f"reader.yaml, older than its rule on it): {_first_line(read)}"
            )
        elif isinstance(read, Exception):
            why = f"{where} not read: {_first_line(read)}"
        else:
            why = f"{where} answered without a uid"
        if self._identity_unknown.get(name) != why:
            self._identity_unknown[name] = why
            log.warning(
                "worker %s: which cluster it reaches cannot be told (a MultiKueueCluster "
                "re-pointed to another is not noticed): %s",
                name,
                why,
            )
        return ""

    def _lease(self, name: str, read: Obj | Exception | None, lease: tuple[str, str]) -> Obj | None:
        """gangcheck's Lease as read in the worker ``name``, or None when it could not be
        read: none there (404: leader election off, or another name), not granted to the
        reader (403: its rights older than the Lease's rule), or any other failure. Not
        known is no reason to skip a worker: said in the log once (again when the reason
        changes), not on the Workload."""
        if read is None:
            return None
        if not isinstance(read, Exception):
            self._lease_unknown.pop(name, None)
            return read
        why = _lease_unknown(read, lease)
        if self._lease_unknown.get(name) != why:
            self._lease_unknown[name] = why
            log.warning("worker %s: whether gangcheck is up there is not known: %s", name, why)
        return None

    def _not_answering(self, worker: str, view: _View, wl: Obj) -> str:
        """Why ``worker`` is given up for ``wl``: gangcheck there has left its copy untouched
        (``unanswered``) for ``unanswered_within`` seconds, timed from the first pass of
        this process that saw it so (the worker's clock is not read; a restart waits anew);
        '' otherwise."""
        meta = wl["metadata"]
        copy = _copy(view, wl)
        if copy is None or not unanswered(copy, view.ours, _requests_for(view, copy)):
            return ""
        key = (worker, str(meta["namespace"]), str(copy["metadata"].get("uid") or meta["name"]))
        now = self._now()
        since = self._unanswered.get(key) or now
        self._unanswered_seen[key] = since
        return not_answering(since, now, limit=self.unanswered_within)

    def _not_queued_for(self, worker: str, view: _View, wl: Obj) -> str:
        """Why ``worker`` is given up for ``wl``: Kueue there has said for
        ``not_queued_within`` seconds (timed from the first pass of this process that saw it
        so) that the copy's ClusterQueue is missing or inactive (``_inadmissible``, not its
        LocalQueue: that one at once, ``_copy_failure``); '' otherwise. Kueue reads the
        ClusterQueue from its in-memory queues, which a restart of Kueue there fills anew:
        for a moment a healthy worker's copy may say so."""
        meta = wl["metadata"]
        copy = _copy(view, wl)
        said = _inadmissible(copy) if copy is not None else ""
        if copy is None or not said:
            return ""
        key = (worker, str(meta["namespace"]), str(copy["metadata"].get("uid") or meta["name"]))
        now = self._now()
        since = self._not_queued.get(key) or now
        self._not_queued_seen[key] = since
        if (now - since).total_seconds() < self.not_queued_within:
            return ""
        return _not_queued_there(said)

    async def _facts(
        self,
        worker: _Worker,
        view: _View,
        wl: Obj,
        *,
        nominated: bool,
        room: Callable[[], _Room] | None = None,
        pending: int = 0,
        lately_failed: str = "",
        alike: _Alike | None = None,
    ) -> WorkerFacts:
        if view.skip or worker.kube is None:
            return WorkerFacts(
                worker.name,
                reachable=False,
                skip=view.skip or worker.skip,
                patience=nominated and view.patient,
                identity=view.identity,
            )
        try:
            failure, admitted, copied = _copy_state(view, wl) if nominated else ("", False, True)
            if nominated and not failure:
                failure = self._not_queued_for(worker.name, view, wl)
            if nominated and not failure:
                failure = self._not_answering(worker.name, view, wl)
            fits_now = _fits_now(room(), wl) if room is not None else False
        except Exception as e:  # its answer (the copy, its pods) not as its API serves it
            log.warning("worker %s answered what cannot be read: %r", worker.name, e)
            return WorkerFacts(
                worker.name, reachable=False, skip=_unreadable(e), identity=view.identity
            )
        facts = WorkerFacts(
            worker.name,
            fits_now=fits_now,
            sources=view.sources(alike),
            failure=failure,
            pending=pending,
            lately_failed=lately_failed,
            admitted=admitted,
            copied=copied,
            identity=view.identity,
        )
        return with_down(facts, view.down, nominated=nominated)


@dataclass
class _View:
    """One worker as a pass read it (``skip``: why it cannot be used now)."""

    skip: str = ""
    patient: bool = False
    """Skipped as silent, in its first window (``dispatch.patient``)."""
    nodes: list[NodeView] = field(default_factory=list)
    pods: list[Obj] = field(default_factory=list)
    requests: dict[tuple[str, str], list[Obj]] = field(default_factory=dict)
    """gangcheck's requests there, by the namespace and name of the Workload each is for
    (``WORKLOAD_ANNOTATION``): each Workload's looked up, not every request read again for
    each Workload of a pass (a worker holding 20,000 requests made a pass over 500 gangs
    nominated there take 8 s)."""
    outcomes: _Outcomes = field(default_factory=dict)
    """Its capacity sources' outcomes for the gangs sent there (``_outcomes``)."""
    copies: dict[tuple[str, str], Obj] = field(default_factory=dict)
    """Its Workloads (Kueue's copies of the manager's), by namespace and name."""
    down: Down | None = None
    """gangcheck there is down, from its leader Lease (``lease_down``); None: up, or not known."""
    ours: frozenset[str] = frozenset()
    """The names of the AdmissionChecks gangcheck serves there."""
    identity: str = ""
    """Which cluster it is (``WorkerFacts.identity``); '' not known."""
    published: tuple[Seen, ...] = ()
    """What gangcheck there publishes of its sources' outcomes on its AdmissionChecks, of
    every gang there (``published.on_check``), the latest per flavors and source, no older
    than ``published.KEEP_SECONDS``."""

    histories: dict[Flavors | str | None, tuple[SourceHistory, ...]] = field(default_factory=dict)
    """``sources`` as a pass asked for it, by the flavors asked for (a pass asks for each of
    its gangs: thousands of gangs sent there, read again for each of thousands waiting)."""

    def sources(self, alike: _Alike | None = None) -> tuple[SourceHistory, ...]:
        """Its capacity sources' histories, of the gangs sent there that are ``alike`` (None:
        every gang); instead, what gangcheck there publishes for gangs of the same flavors
        (``_published_histories``) when there is none, or when that tells of an outcome
        since the latest of those gangs' requests was made (a gang that runs for days keeps
        its delivery's record; gangs met a stockout since, their requests deleted)."""
        key = "every gang" if alike is None else alike.mine
        if key not in self.histories:
            counts, mine = alike or (lambda _: True), None if alike is None else alike.mine
            recorded = _histories(self.outcomes, counts)
            told = _published_latest(self.published, mine)
            since = _recorded_at(self.outcomes, counts)
            newer = any(since is None or one.at > since for one in told.values())
            self.histories[key] = _published_histories(told) if newer or not recorded else recorded
        return self.histories[key]


# -- reads in a worker ----------------------------------------------------------------------------


def _view_of(
    checks: list[Obj],
    nodes: list[Obj],
    pods: list[Obj],
    requests: list[Obj],
    copies: list[Obj],
    *,
    now: datetime,
) -> _View:
    """A worker's reads made sense of (raises on objects not shaped as its API serves them)."""
    if not _gangchecks(checks, active=True):
        return _View(skip=f"no AdmissionCheck of {CONTROLLER_NAME} Active: no gangcheck there")
    return _View(
        nodes=[node_view(n) for n in nodes],  # a node being deleted is not usable there
        pods=pods,
        requests=_by_workload(requests),
        outcomes=_outcomes(requests, copies),
        copies={_key(c): c for c in copies},
        ours=_gangchecks(checks),
        published=published.merged(
            [], (s for c in checks if _gangchecks([c]) for s in published.on_check(c)), now
        ),
    )


#: What ``Dispatcher._view`` reads in a worker, in order.
_VIEW_READS = (ADMISSION_CHECK, NODE, POD, PROVISIONING_REQUEST, WORKLOAD)
#: The longest message of a condition or check the worker's caches keep (the record keeps
#: less: ``dispatch.WHY_MAX``).
_MESSAGE_KEPT = 1024
#: The longest annotation value they keep (longer: left out, as if not there); a record or an
#: attempt's configuration, JSON, may be longer than a name: those up to ``_JSON_KEPT``.
_NOTE_KEPT = 1024
_JSON_KEPT = 16384
#: The metadata they keep of a request or a copy, and the annotations a pass reads.
_META_KEPT = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
_REQUEST_NOTES = (
    WORKLOAD_ANNOTATION,
    WORKLOAD_UID_ANNOTATION,
    PHASE_ANNOTATION,
    ROLLBACK_REASON_ANNOTATION,
    SOURCE_ANNOTATION,
    ATTEMPT_CONFIG_ANNOTATION,
)


def _trim_meta(obj: Obj, notes: Sequence[str]) -> Obj:
    meta = obj.get("metadata") or {}
    out: Obj = {k: meta[k] for k in _META_KEPT if k in meta}
    if meta.get("deletionTimestamp"):
        out["deletionTimestamp"] = meta["deletionTimestamp"]
    given = meta.get("annotations") or {}
    kept = {}
    for key in notes:
        value = given.get(key)
        limit = _JSON_KEPT if key in (ATTEMPT_CONFIG_ANNOTATION, RECORD_ANNOTATION) else _NOTE_KEPT
        if isinstance(value, str) and len(value) <= limit:
            kept[key] = value
        elif key == ROLLBACK_REASON_ANNOTATION and isinstance(value, str):
            kept[key] = value[:_NOTE_KEPT]  # its presence is what counts
    if kept:
        out["annotations"] = kept
    return out


def _said_kept(items: object, keys: Sequence[str]) -> list[Obj]:
    """Conditions or admission checks, each with only ``keys``, its message cut."""
    out = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, Mapping):
            kept = {k: item[k] for k in keys if k in item}
            if isinstance(kept.get("message"), str):
                kept["message"] = kept["message"][:_MESSAGE_KEPT]
            out.append(kept)
    return out


def _trim_request(req: Obj) -> Obj:
    """What a worker's cache keeps of a ProvisioningRequest: what a pass reads (its gang,
    gangcheck's record, its class, its Failed and Provisioned conditions): a few KB, however
    large the worker made it."""
    status = req.get("status") or {}
    conditions = [
        c
        for c in _said_kept(status.get("conditions"), ("type", "status", "reason", "message"))
        if c.get("type") in ("Failed", "Provisioned")
    ]
    return {
        "apiVersion": req.get("apiVersion"),
        "kind": req.get("kind"),
        "metadata": _trim_meta(req, _REQUEST_NOTES),
        "spec": {"provisioningClassName": (req.get("spec") or {}).get("provisioningClassName")},
        "status": {"conditions": conditions},
    }


def _trim_copy(copy: Obj) -> Obj:
    """What a worker's cache keeps of a Workload (a copy): what a pass reads (the record it
    carries, whether it is active, its conditions, checks and requeue state), not its pod
    sets."""
    status = copy.get("status") or {}
    kept: Obj = {
        "conditions": _said_kept(status.get("conditions"), ("type", "status", "reason", "message")),
        "admissionChecks": _said_kept(status.get("admissionChecks"), ("name", "state", "message")),
    }
    if isinstance(status.get("requeueState"), Mapping):
        kept["requeueState"] = {
            k: v for k, v in status["requeueState"].items() if k in ("count", "requeueAt")
        }
    spec = copy.get("spec") or {}
    return {
        "apiVersion": copy.get("apiVersion"),
        "kind": copy.get("kind"),
        "metadata": _trim_meta(copy, (RECORD_ANNOTATION,)),
        "spec": {"active": spec["active"]} if "active" in spec else {},
        "status": kept,
    }


#: What a worker's caches keep of its nodes and pods (what a fit reads, as gangcheck's own),
#: its requests and its Workloads (what a pass reads): a worker's odd or hostile objects cost
#: the dispatcher's memory a few KB each at most.
_WORKER_TRIM = {
    NODE: trim_node,
    POD: trim_pod,
    PROVISIONING_REQUEST: _trim_request,
    WORKLOAD: _trim_copy,
}
#: The pods a fit counts: not ended.
_ENDED = ("Succeeded", "Failed")


async def _worker_reads(
    kube: Kube, caches: Mapping[Resource, Informer]
) -> list[list[Obj] | BaseException]:
    """What a pass reads in a worker (``_VIEW_READS``): from its caches when every one is
    filled and current, else listed (each failure returned in its place)."""
    if len(caches) == len(_VIEW_READS) and all(
        c.synced.is_set() and c.current for c in caches.values()
    ):
        return [
            [o for o in caches[res].store if (o.get("status") or {}).get("phase") not in _ENDED]
            if res is POD
            else list(caches[res].store)
            for res in _VIEW_READS
        ]
    listed = await asyncio.gather(
        _items(kube, ADMISSION_CHECK),
        _items(kube, NODE),
        _items(kube, POD, field_selector=f"status.phase!={_ENDED[0]},status.phase!={_ENDED[1]}"),
        _items(kube, PROVISIONING_REQUEST),
        _items(kube, WORKLOAD),
        return_exceptions=True,
    )
    return list(listed)


def _refused(res: Resource, error: ApiError) -> str:
    """Why a worker is skipped when its list of ``res`` failed: its API not served there
    (Kueue of another version: 404 on the list), the reader's rights not granted (403), or
    it does not answer."""
    said = _first_line(error)
    if isinstance(error, NotFoundError):
        kueue = res.group == ADMISSION_CHECK.group
        extra = ": another Kueue version, or not installed" if kueue else ""
        return f"{res.kind} ({res.api_version}) not served there{extra} ({said})"
    if isinstance(error, ForbiddenError):
        return (
            "refused (the reader's rights, manifests/dispatcher/worker/reader.yaml, not granted "
            f"there to this Secret's identity): {said}"
        )
    if error.status == UNAUTHORIZED:
        return _credentials_refused(error)
    return f"unreachable: {said}"


#: The status of an answer refusing the credentials themselves (not their rights: 403).
UNAUTHORIZED = 401


def _credentials_refused(error: ApiError) -> str:
    """Why a worker is skipped whose API server answered 401: it is reachable and answers,
    but takes the kubeconfig's credentials for no one (Kueue's reads and writes there are
    refused alike: MultiKueue cannot copy a Workload there either)."""
    return (
        "credentials refused (401: the token or client certificate of its kubeconfig Secret "
        f"expired, was revoked or is not this cluster's): {_first_line(error)}"
    )


def _unauthorized(*reads: object) -> ApiError | None:
    """The first of ``reads`` (gets' answers, ``_get_or_error``) that is a 401, if any."""
    return next((r for r in reads if isinstance(r, ApiError) and r.status == UNAUTHORIZED), None)


def _lease_unknown(read: Exception, lease: tuple[str, str]) -> str:
    """Why gangcheck's Lease ``lease`` (namespace, name) could not be read in a worker."""
    where = f"Lease {lease[0]}/{lease[1]}"
    if isinstance(read, NotFoundError):
        return (
            f"no {where} there (leader election off, or another Lease: the dispatcher's "
            f"workerLeaseNamespace and workerLeaseName, or the MultiKueueCluster's annotation "
            f"{WORKER_LEASE_ANNOTATION})"
        )
    if isinstance(read, ForbiddenError):
        return (
            f"get on {where} refused (the reader's rights, manifests/dispatcher/worker/"
            f"reader.yaml, older than its rule on that Lease): {_first_line(read)}"
        )
    return f"{where} not read: {_first_line(read)}"


def _unreadable(error: BaseException) -> str:
    return f"unreadable answer ({type(error).__name__}: {_first_line(error)})"


async def _connect(kubeconfig: bytes) -> Kube:
    """A client of the worker from the kubeconfig held in its Secret (read from a file only
    while the client is made, then removed). Few retries: an unreachable worker is skipped."""
    fd, path = tempfile.mkstemp(prefix="gangcheck-worker-", suffix=".kubeconfig")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(kubeconfig)
        return await Kube.connect(path, retry_attempts=1, retry_seconds=2)
    except KubeconfigError as e:  # said without the file, another at each try: said once
        said = str(e).replace(f" in {path}", "").replace(f" {path}", "").replace(path, "")
        raise KubeconfigError(said) from e
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _read_kubeconfig(raw: str) -> tuple[bytes, str]:
    """The kubeconfig in a Secret's ``data`` value (``raw``, base64), and why it is not used
    ('' if it may be: ``kubeconfig_unused``). Called in a thread: a Secret's MiB of YAML takes
    seconds to read, which the event loop (every watch, every other gang's pass) does not
    wait for."""
    try:
        config = base64.b64decode(raw)
        return config, kubeconfig_unused(yaml.safe_load(config))
    except (ValueError, yaml.YAMLError) as e:
        return b"", f"unusable kubeconfig (not YAML: {_first_line(e)})"
    except RecursionError:  # else raised out of the pass, ending the dispatcher's run
        return b"", "unusable kubeconfig (nested too deep for a YAML reader)"


def _to_tell(record: DispatchRecord, step: Step) -> bool:
    """Whether the step written over ``record`` has something to tell (Events, metrics: told
    after the pass's other nominations)."""
    told = step.changed or step.record.skipped != record.skipped
    return told or (not step.nominated and step.record.reason != record.reason)


def _reworded(was: str, now: str) -> bool:
    """Whether a worker's skip ``now`` says what ``was`` said in other words: the same head,
    the dispatcher's words before the first ': ' (``unreachable``, ``credentials refused
    (401``, ``gangcheck down``...), what follows being the worker's own (an error's text)."""
    return was.partition(": ")[0] == now.partition(": ")[0]


def _digest(kubeconfig: str) -> str:
    """The kubeconfig's digest (the Secret's ``data`` value, base64 as the API serves it):
    what a client held was made from, compared rather than the Secret's resourceVersion,
    which any update of the Secret moves."""
    return hashlib.sha256(kubeconfig.encode()).hexdigest()


def _unlisted(
    waiting: Sequence[Obj],
    records: Mapping[tuple[str, str], DispatchRecord],
    configured: Mapping[tuple[str, str], CheckWorkers],
    clusters: Sequence[Obj],
) -> dict[tuple[str, str], set[str]]:
    """Per Workload waiting, the workers nominated that Kueue no longer manages for it (its
    MultiKueueConfigs, ``configured``, no longer list them, or their MultiKueueCluster is
    gone): read for its copy there (``decide``: no other nominated while it is there)."""
    present = {str((c.get("metadata") or {}).get("name") or "") for c in clusters}
    return {
        _key(wl): {
            c
            for c in _nominated_to(wl, records[_key(wl)])
            if c not in configured[_key(wl)].clusters or c not in present
        }
        for wl in waiting
    }


def _gone(
    held: Iterable[str],
    by_check: Mapping[str, CheckWorkers],
    clusters: Sequence[Obj],
    *,
    also: Iterable[str] = (),
) -> set[str]:
    """Of the workers ``held``, those no MultiKueueConfig of MultiKueue's checks lists
    (``by_check``, from ``check_workers``) or without a MultiKueueCluster (``clusters``),
    but those ``also`` names (read for a copy Kueue no longer manages)."""
    listed = {c for workers in by_check.values() for c in workers.clusters}
    present = {str((c.get("metadata") or {}).get("name") or "") for c in clusters}
    return set(held) - ((listed & present) | set(also))


def _gangchecks(checks: Sequence[Obj], *, active: bool = False) -> frozenset[str]:
    """The names of a worker's AdmissionChecks that gangcheck serves there (``active``: of
    those, the ones Kueue shows Active)."""
    return frozenset(
        str(c["metadata"]["name"])
        for c in checks
        if (c.get("spec") or {}).get("controllerName") == CONTROLLER_NAME
        and (not active or (_condition(c, "Active") or {}).get("status") == "True")
    )


def _copy_state(view: _View, wl: Obj) -> tuple[str, bool, bool]:
    """The worker's copy of ``wl`` (as the pass listed its Workloads, once for every Workload
    of the pass): why it failed ('' if not), whether it is admitted, and whether there is
    one."""
    copy = _copy(view, wl)
    if copy is None:
        return "", False, False
    failure = _copy_failure(copy, _requests_for(view, copy))
    admitted = _condition(copy, "Admitted")
    placed = not failure and admitted is not None and admitted.get("status") == "True"
    return failure, placed, True


def _copy(view: _View, wl: Obj) -> Obj | None:
    """The worker's copy of the manager's Workload ``wl`` as the pass read it; None when it
    has none, or only one left by an earlier Workload of its name (``copy_of``)."""
    copy = view.copies.get(_key(wl))
    if copy is None or not copy_of(copy, str(wl["metadata"].get("uid") or "")):
        return None
    return copy


#: Kueue's reason on a Workload's ``QuotaReserved=False`` when it cannot queue it at all: its
#: LocalQueue or ClusterQueue missing or inactive (Kueue v0.17, ``WorkloadInadmissible``,
#: set by the workload controller). gangcheck there never sees such a copy, and nothing of it
#: fails: without this, the worker stayed nominated for good.
INADMISSIBLE = "Inadmissible"
#: How long (seconds) a copy may say its ClusterQueue is missing or inactive before the worker
#: is given up for the gang (``Dispatcher._not_queued_for``).
NOT_QUEUED_WITHIN = 30.0


def _inadmissible(copy: Obj) -> str:
    """What Kueue in a worker says when it cannot queue the copy at all (``INADMISSIBLE``:
    ``LocalQueue lq doesn't exist``, ``... is inactive``, ``ClusterQueue cq doesn't
    exist``, ``... is inactive``), or ''."""
    reserved = _condition(copy, "QuotaReserved")
    if reserved is None or reserved.get("status") != "False":
        return ""
    if reserved.get("reason") != INADMISSIBLE:
        return ""
    return str(reserved.get("message") or INADMISSIBLE)


def _not_queued_there(said: str) -> str:
    return (
        f"not queued there: {said} (Kueue there cannot queue the copy: the worker needs the "
        "Workload's LocalQueue, in its namespace, on an Active ClusterQueue)"
    )


def _copy_failure(copy: Obj, requests: Sequence[Obj]) -> str:
    """Why the worker's copy of a Workload failed, or '' (trying): its state (a check Retry
    or Rejected, its LocalQueue missing or stopped there: ``INADMISSIBLE``, evicted,
    requeued, deactivated; a ClusterQueue missing is timed: ``Dispatcher._not_queued_for``),
    or gangcheck's requests for it there (``requests``: ``_requests_for``) saying their
    capacity source cannot deliver."""
    said = cannot_deliver(requests)
    if said:
        return said
    status = copy.get("status") or {}
    for check in status.get("admissionChecks") or []:
        if check.get("state") in ("Retry", "Rejected"):
            said = f"check {check.get('name')} {check.get('state')}"
            return f"{said}: {check.get('message')}" if check.get("message") else said
    said = _inadmissible(copy)
    if said.startswith("LocalQueue "):  # read from its API by Kueue there: no passing state
        return _not_queued_there(said)
    evicted = _condition(copy, "Evicted")
    if evicted is not None and evicted.get("status") == "True":
        return f"evicted: {evicted.get('reason')}: {evicted.get('message', '')}"
    if int((status.get("requeueState") or {}).get("count") or 0) > 0:
        return "requeued after a failed attempt"
    if (copy.get("spec") or {}).get("active") is False:
        return "deactivated"
    return ""


def _by_workload(requests: Sequence[Obj]) -> dict[tuple[str, str], list[Obj]]:
    """A worker's requests by the namespace and name of the Workload each is for (those
    for none left out)."""
    out: dict[tuple[str, str], list[Obj]] = {}
    for req in requests:
        meta = req.get("metadata") or {}
        workload = (meta.get("annotations") or {}).get(WORKLOAD_ANNOTATION)
        if isinstance(workload, str) and workload:
            out.setdefault((str(meta.get("namespace") or ""), workload), []).append(req)
    return out


def _requests_for(view: _View, copy: Obj) -> list[Obj]:
    """gangcheck's requests in a worker (as the pass read them) for the worker's Workload
    ``copy``, not being deleted: of its namespace and name, and of its uid where the request
    names one (a request left by an earlier copy of that name, made again since, is not
    this copy's)."""
    uid = str(copy["metadata"].get("uid") or "")
    return [
        req
        for req in view.requests.get(_key(copy), ())
        if not req["metadata"].get("deletionTimestamp")
        and (
            not uid
            or (req["metadata"].get("annotations") or {}).get(WORKLOAD_UID_ANNOTATION, uid) == uid
        )
    ]


@dataclass
class _Room:
    """A worker's room as a pass counts it: its nodes, what is used on each (its bound pods'
    requests, and the members of the gangs nominated there and not placed yet, each gang
    placed once, in turn: ``take``), and whether those gangs all fit (``fits``; if not, no
    other gang fits now there). Each gang of the pass is then fitted alone on what they
    leave: the members fitted grow with the gangs, not with their square (each gang fitted
    next to all the others took 13 s for 200 gangs on 200 nodes in one pass)."""

    nodes: list[NodeView]
    used: dict[str, dict[str, int]]
    fits: bool = True

    @classmethod
    def of(cls, view: _View, pending: Sequence[Sequence[GangPodSet]]) -> _Room:
        used = {node: dict(res) for node, res in used_resources(view.pods).items()}
        room = cls(view.nodes, used)
        for gang in pending:
            room.take(gang)
        return room

    def fit(self, gang: Sequence[GangPodSet]) -> bool:
        """Whether the gang's pod sets fit now on what is left."""
        return self.fits and bool(gang) and fit_gang(gang, self.nodes, BoundUsage(self.used)).fits

    def take(self, gang: Sequence[GangPodSet]) -> None:
        """The gang placed on what is left (its members' requests used where they go); a
        gang that does not fit leaves no room for any other (``fits``)."""
        if not self.fits or not gang:
            return
        result = fit_gang(gang, self.nodes, BoundUsage(self.used))
        if not result.fits:
            self.fits = False
            return
        members = {ps.name: ps.member for ps in gang}
        for node, names in result.placements.items():
            used = self.used.setdefault(node, {})
            for name in names:
                for resource, amount in members[name].requests.items():
                    used[resource] = used.get(resource, 0) + amount


@dataclass(frozen=True)
class _Planned:
    """A gang's step as a pass decided it, to be written (``_write_step``)."""

    wl: Obj
    record: DispatchRecord
    """Its record as read."""
    was: tuple[str, ...]
    """The clusters it was nominated to as read."""
    step: Step


@dataclass
class _Rooms:
    """Per worker, its room as a pass counts it (``_Room``): built when first read, from the
    gangs then nominated there (``nominated``: the pass's own map, as its nominations change
    it), then each gang the pass nominates there anew taken from it."""

    views: Mapping[str, _View]
    nominated: Mapping[tuple[str, str], Sequence[str]]
    pod_sets: Mapping[tuple[str, str], Sequence[GangPodSet]]
    built: dict[str, _Room] = field(default_factory=dict)

    def __call__(self, cluster: str) -> _Room:
        if cluster not in self.built:
            pending = [
                self.pod_sets.get(k, []) for k, cs in self.nominated.items() if cluster in cs
            ]
            self.built[cluster] = _Room.of(self.views[cluster], pending)
        return self.built[cluster]

    def nominated_anew(self, key: tuple[str, str], clusters: Iterable[str]) -> None:
        """The gang ``key`` nominated anew to ``clusters``: what the next gangs fit beside."""
        for cluster in clusters:
            if cluster in self.built:
                self.built[cluster].take(self.pod_sets.get(key, []))


def _fits_now(room: _Room, wl: Obj) -> bool:
    """The manager's pod sets, whole, on the worker's nodes as the pass read them, less what
    its bound pods and the other gangs nominated there and not placed yet use (``room``)."""
    return room.fit(_pod_sets(wl))


#: Per capacity source of a worker (its class and index), the latest outcome of each gang the
#: dispatcher sent there, by the gang's namespace and name: when its request was made, and
#: how it ended.
_Outcomes = dict[str, dict[tuple[str, str], tuple[str, Outcome]]]


def _outcomes(requests: Sequence[Obj], copies: Sequence[Obj]) -> _Outcomes:
    """Each capacity source's recent outcomes, from gangcheck's records on the requests of
    the gangs this dispatcher sent to the worker (``copies``: the worker's Workloads): a
    request counts when it is for a copy there that carries the dispatcher's record (Kueue
    copies the manager's annotations into the copy it makes, after the record was written),
    of that copy's uid where the request names one, and each copy counts once per source,
    its latest outcome. Records on any other request (a gang of the worker's own, or written
    by whoever may write requests there, thousands of them) are not counted: one namespace
    could otherwise rank the worker for every tenant's gangs."""
    sent = {
        _key(c): str(c["metadata"].get("uid") or "")
        for c in copies
        if RECORD_ANNOTATION in (c["metadata"].get("annotations") or {})
    }
    latest: _Outcomes = {}
    for req in requests:
        meta = req["metadata"]
        notes = meta.get("annotations") or {}
        gang = (str(meta.get("namespace") or ""), str(notes.get(WORKLOAD_ANNOTATION) or ""))
        uid = sent.get(gang)
        if uid is None or (uid and notes.get(WORKLOAD_UID_ANNOTATION, uid) != uid):
            continue
        if ROLLBACK_REASON_ANNOTATION in notes:
            # as gangcheck there publishes it (``published.seen``): a rollback whose cause
            # says nothing of the source's room (a start deadline the gang's own pods
            # missed, stray pods, a race lost, the config changed, the gang withdrawn)
            # is no stockout of the source
            if RollbackCause.of(notes[ROLLBACK_REASON_ANNOTATION]) not in STOCKOUT_CAUSES:
                continue
            outcome = Outcome.STOCKOUT
        elif notes.get(PHASE_ANNOTATION) in (FULFILLED, STARTED):
            outcome = Outcome.DELIVERED
        else:
            continue
        klass = (req.get("spec") or {}).get("provisioningClassName")
        per = latest.setdefault(f"{klass}#{notes.get(SOURCE_ANNOTATION, '0')}", {})
        seen = (str(meta.get("creationTimestamp") or ""), outcome)
        if gang not in per or per[gang] < seen:
            per[gang] = seen
    return latest


def _histories(
    outcomes: _Outcomes, counts: Callable[[tuple[str, str]], bool]
) -> tuple[SourceHistory, ...]:
    """Each source's last ``RECENT`` outcomes among the gangs that ``counts`` (those assigned
    the flavors of the gang being dispatched: ``dispatch.same_capacity``), sources with none
    left out."""
    histories = []
    for _, by_gang in sorted(outcomes.items()):
        recent = [o for g, (_, o) in sorted(by_gang.items(), key=lambda i: i[1]) if counts(g)]
        if recent := recent[-RECENT:]:
            histories.append(
                SourceHistory(
                    deliveries=recent.count(Outcome.DELIVERED),
                    stockouts=recent.count(Outcome.STOCKOUT),
                    last=recent[-1],
                )
            )
    return tuple(histories)


def _recorded_at(outcomes: _Outcomes, counts: Callable[[tuple[str, str]], bool]) -> datetime | None:
    """When the latest request among the records of the gangs that ``counts`` was made."""
    made = (parse_time(at) for per in outcomes.values() for g, (at, _) in per.items() if counts(g))
    return max((at for at in made if at is not None), default=None)


def _published_latest(outcomes: Sequence[Seen], mine: Flavors | None) -> dict[str, Seen]:
    """What gangcheck in a worker publishes (``published``) for a gang asking ``mine``: per
    source, the latest outcome of gangs of the same flavors (``same_capacity``; a gang whose
    flavors are not known takes every one)."""
    latest: dict[str, Seen] = {}
    for one in outcomes:
        if not same_capacity(frozenset(one.flavors), mine):
            continue
        held = latest.get(one.source)
        if held is None or one.at >= held.at:
            latest[one.source] = one
    return latest


def _published_histories(latest: Mapping[str, Seen]) -> tuple[SourceHistory, ...]:
    """Those outcomes (``_published_latest``) as the sources' histories, one outcome each.
    Read where the worker holds no record of the gangs sent there, or where it tells of a
    later outcome than they do (``_View.sources``)."""
    return tuple(
        SourceHistory(
            deliveries=int(one.outcome is Outcome.DELIVERED),
            stockouts=int(one.outcome is Outcome.STOCKOUT),
            last=one.outcome,
        )
        for _, one in sorted(latest.items())
    )


# -- helpers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Memory:
    """What a pass remembers of the gangs' attempts: the records on the manager's Workloads
    (the pass's own map, as its steps rewrite them) and what each gang asks (``asks``: its
    resource flavors, ``dispatch.flavors_of``)."""

    records: Mapping[tuple[str, str], DispatchRecord]
    asks: Mapping[tuple[str, str], Flavors | None]
    gone: Departed
    """The give-ups of gangs deleted since (``dispatch.departed``), with the flavors each
    asked."""

    def of(self, key: tuple[str, str], now: datetime) -> tuple[_Alike, dict[str, str]]:
        """For gang ``key``: the gangs whose outcomes speak for its chances (``_Alike``), and
        the workers given up lately for such gangs (``recent_failures``)."""
        alike = _Alike(self.asks, self.asks.get(key))
        others = (r for k, r in self.records.items() if k != key and alike(k))
        also = (g for f, g in self.gone.values() if same_capacity(f, alike.mine))
        return alike, recent_failures(others, now, also=also)


@dataclass(frozen=True)
class _Alike:
    """Whether another gang's outcomes (its give-ups in the manager's records, its requests'
    outcomes in a worker) speak for the chances of a gang asking ``mine``: assigned the same
    resource flavors (``dispatch.same_capacity``; a gang no longer in the manager counts)."""

    asks: Mapping[tuple[str, str], Flavors | None]
    mine: Flavors | None

    def __call__(self, other: tuple[str, str]) -> bool:
        return same_capacity(self.asks.get(other), self.mine)


def _pod_sets(wl: Obj) -> list[GangPodSet]:
    pod_sets = []
    for ps in (wl.get("spec") or {}).get("podSets") or []:
        count = int(ps.get("count") or 0)
        pod_sets.append(
            GangPodSet(str(ps.get("name")), count, member_from_template(ps.get("template") or {}))
        )
    return pod_sets


def _key(wl: Obj) -> tuple[str, str]:
    return (str(wl["metadata"].get("namespace") or ""), str(wl["metadata"].get("name") or ""))


def _record(wl: Obj) -> DispatchRecord:
    """The record on the manager's Workload ``wl``, as it counts for it (``for_workload``:
    none of an earlier Workload of its name)."""
    raw = (wl["metadata"].get("annotations") or {}).get(RECORD_ANNOTATION)
    return for_workload(DispatchRecord.from_annotation(raw), str(wl["metadata"].get("uid") or ""))


def _pending(wl: Obj) -> bool:
    """Not placed yet, not finished, not being deleted."""
    status = wl.get("status") or {}
    finished = _condition(wl, "Finished")
    return not (
        status.get("clusterName")
        or wl["metadata"].get("deletionTimestamp")
        or (finished is not None and finished.get("status") == "True")
    )


def _nominated_to(wl: Obj, record: DispatchRecord) -> tuple[str, ...]:
    """The workers a Workload is nominated to: written, else recorded."""
    written = (wl.get("status") or {}).get("nominatedClusterNames") or []
    return tuple(str(c) for c in written) or record.nominated


def _check_names(wl: Obj) -> set[str]:
    return {str(c.get("name")) for c in (wl.get("status") or {}).get("admissionChecks") or []}


def _to_dispatch(wl: Obj, checks: set[str]) -> bool:
    """Carries a MultiKueue check, quota reserved, not placed yet, not finished."""
    status = wl.get("status") or {}
    if status.get("clusterName") or wl["metadata"].get("deletionTimestamp"):
        return False
    if not _check_names(wl) & checks:
        return False
    reserved = _condition(wl, "QuotaReserved")
    finished = _condition(wl, "Finished")
    return (
        reserved is not None
        and reserved.get("status") == "True"
        and (finished is None or finished.get("status") != "True")
    )


def _condition(obj: Obj, kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _ref(wl: Obj) -> ObjectRef:
    meta = wl["metadata"]
    return ObjectRef(
        WORKLOAD.kind, meta["namespace"], meta["name"], meta.get("uid", ""), WORKLOAD.api_version
    )


def _slim(obj: Obj) -> Obj:
    """What the dispatcher's caches keep of a manager's object: all of it but the
    managedFields entries that do not own ``status.nominatedClusterNames`` (the only ones a
    pass reads, ``nominated_by_another``; most of a Workload's size)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("managedFields"), list):
        return obj
    kept = [e for e in meta["managedFields"] if owns_nomination(e)]
    return {**obj, "metadata": {**meta, "managedFields": kept}}


async def _get_or_error(
    kube: Kube, res: Resource, name: str, namespace: str | None
) -> Obj | Exception:
    """The object, or the error its get raised (read beside the lists: its failure is
    not theirs)."""
    try:
        return await kube.get(res, name, namespace)
    except Exception as e:  # any failure: the caller says what it means
        return e


async def _items(kube: Kube, res: Resource, **kw: str) -> list[Obj]:
    return list((await kube.list_objects(res, **kw)).get("items") or [])


def _first_line(error: BaseException) -> str:
    text = str(error)
    return text.splitlines()[0] if text else type(error).__name__


__all__ = ["DEFAULT_INTERVAL", "Dispatcher"]
