"""Reconcile one Workload: read the caches, decide, apply the actions once, write what changed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial

from gangcheck.kube.errors import (
    ApiError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    refused,
)
from gangcheck.kube.resources import WORKLOAD
from gangcheck.logic.attempt import driver, naming
from gangcheck.logic.attempt.actions import (
    Action,
    AnnotateRequest,
    ClaimNode,
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
    DeleteTemplate,
    Event,
    GuardScaleDown,
    ReleaseHold,
    ReleaseMembers,
)
from gangcheck.logic.attempt.status import Phase
from gangcheck.logic.timefmt import parse_time
from gangcheck.logic.workloads import slices
from gangcheck.logic.workloads.admission import (
    MAX_MESSAGE,
    Decision,
    Snapshot,
    decide,
)
from gangcheck.logic.workloads.snapshot import snapshot_of
from gangcheck.model.names import WORKLOAD_UID_ANNOTATION
from gangcheck.model.objects import CheckState, Obj, ObjectRef, Workload, request_of, workload_of
from gangcheck.reconcile.attempts import made_for_uid, names_of, withdraw_orphans
from gangcheck.reconcile.caches import check_of
from gangcheck.reconcile.progress import progress_only
from gangcheck.reconcile.reconciler import GangReconciler, refusal_event
from gangcheck.reconcile.view import cluster_view
from gangcheck.runtime.queue import Result, soonest
from gangcheck.telemetry import traced_decision

log = logging.getLogger(__name__)
STALE_RETRY_SECONDS = 0.5
ORPHAN_RECHECK_SECONDS = 5.0
WL_GONE = "Workload deleted"


#: Decisions made in one reconcile of a Workload's check, each on the writes of the last.
MAX_PASSES = 3
#: Actions whose result the applier puts in the caches (the next decision sees it).
CACHED_ACTIONS = (
    CreateTemplate,
    CreateRequest,
    AnnotateRequest,
    ClaimNode,
    GuardScaleDown,
    ReleaseHold,
    ReleaseMembers,
)


@dataclass(frozen=True)
class Applied:
    """What applying one decision did: the seconds until another look is due, whether
    anything was written, and whether every write is in the caches."""

    delay: float | None
    wrote: bool = False
    cached: bool = True


class WorkloadReconciler(GangReconciler):
    """The admission check controller, one Workload key (`namespace/name`) at a time."""

    async def reconcile(self, key: str) -> Result:
        namespace, name = key.split("/", 1)
        obj = self._caches.workloads.store.get(name, namespace)
        if obj is None:
            self.held_messages.forget(key)
            self.stalled.forget(key)
            return await self._remove_orphans(namespace, name)
        wl = workload_of(obj)
        if self._earlier_attempts(wl):
            # An earlier Workload of this name, deleted and made again before a reconcile saw
            # it gone (one key for both watch events; gangcheck down meanwhile), left its
            # attempts: withdrawn first, as when it is seen gone, so none of its capacity is
            # kept for ever and none of its names collides with the new Workload's asks.
            swept = await self._remove_orphans(namespace, name)
            if swept.requeue_after is not None or self._earlier_attempts(wl):
                # what is left is being deleted: its deletion routes this key again
                return Result(requeue_after=swept.requeue_after or ORPHAN_RECHECK_SECONDS)
        delays = []
        for check in self._checks_of(wl):
            delays.append(await self._settle(wl, check))
        return Result(requeue_after=soonest(*delays))

    async def _settle(self, wl: Workload, check: str) -> float | None:
        """Decide and apply, then decide again at once on what was written, as long as all of
        it is in the caches (the check, requests and templates created or annotated, nodes
        and pods patched: each write's answer is put there): the decision the watch's echo
        of those writes would have asked for, made without a trip through the queue (the
        controller routes no echo of a write of gangcheck's own here: `app._is_echo`). A
        write the caches do not show yet (a delete) asks for another reconcile at once, as
        its echo did; so does a Workload still deciding after `MAX_PASSES`. A decision that
        repeats the last one is not applied again: the write changed nothing it reads."""
        last: tuple[Decision, float | None] | None = None
        for _ in range(MAX_PASSES):
            decision = traced_decision(self._decider(wl), self._snapshot(wl, check), self._clock())
            self.stalled.note(wl.ref.key, check, decision.step)
            if last is not None and decision == last[0]:
                return last[1]  # what was written changed nothing this decides on
            applied = await self._apply(wl, check, decision)
            last = (decision, applied.delay)
            if not applied.wrote:
                return applied.delay
            if not applied.cached:
                return 0.0
            obj = self._caches.workloads.store.get(wl.ref.name, wl.ref.namespace)
            if obj is None:
                return applied.delay
            wl = workload_of(obj)
        return 0.0

    def _earlier_attempts(self, wl: Workload) -> bool:
        """Whether a request or PodTemplate of this name was made for another Workload
        (another uid): templates are owned by nothing, so none goes with its Workload."""
        namespace, name = wl.ref.namespace, wl.ref.name
        requests = self._caches.requests_of(namespace, name)
        return any(request_of(r).workload_uid != wl.ref.uid for r in requests) or any(
            made_for_uid(t, WORKLOAD_UID_ANNOTATION) not in ("", wl.ref.uid)
            for t in self._caches.templates_of(namespace, name)
        )

    def _checks_of(self, wl: Workload) -> list[str]:
        """Our checks the Workload lists, plus any that still own a request of it."""
        ours = self._caches.our_check_names()
        listed = [c for c in wl.checks if c in ours]
        leftover = {check_of(r) for r in self._caches.requests_of(wl.ref.namespace, wl.ref.name)}
        return listed + sorted(leftover - set(listed) - {""})

    def _snapshot(self, wl: Workload, check: str) -> Snapshot:
        caches = self._caches
        namespace, name = wl.ref.namespace, wl.ref.name
        return snapshot_of(
            wl,
            check,
            admission_check=caches.admission_checks.store.get,
            config=caches.configs.store.get,
            requests=caches.requests_of(namespace, name),
            flavors=caches.flavors_by_name(),
            capacity=cluster_view(caches),
            templates=names_of(caches.templates_of(namespace, name)),
        )

    async def _remove_orphans(self, namespace: str, name: str) -> Result:
        """The Workload is not in the cache: if the API server confirms it is gone, reclaim
        what arrived for each unfinished attempt, then delete what it left (no garbage
        collector is assumed). A cache not authoritative (just relisting, or answered 404)
        proves no absence: look again later. An attempt whose source's promise is open
        (lifecycle.promise) is kept, with its templates, until the promise closes, unless a
        Workload of the name is there again (its asks take the names)."""
        requests = self._caches.requests_of(namespace, name)
        templates = self._caches.templates_of(namespace, name)
        if not requests and not templates:
            return Result()
        if not self._caches.workloads.authoritative:
            return Result(requeue_after=ORPHAN_RECHECK_SECONDS)
        try:
            live = await self._kube.get_if_exists(WORKLOAD, name, namespace)
        except NotFoundError:  # a 404 naming no Workload: the API itself answers oddly
            return Result(requeue_after=ORPHAN_RECHECK_SECONDS)
        live_uid = live["metadata"]["uid"] if live is not None else None

        def is_orphan(request: Obj) -> bool:  # of no Workload there now
            return request_of(request).workload_uid != live_uid

        self._note_refusals(filter(is_orphan, requests))
        sweep = await withdraw_orphans(
            self._applier,
            self._caches,
            requests,
            is_orphan=is_orphan,
            config_of=lambda r: self._caches.config_of(check_of(r)),
            why=WL_GONE,
            at=f"{namespace}/{name}",
            tell=lambda r, event: self._events.emit(_gone(r, namespace, name), event),
            keep_promises=live is None,
        )
        if sweep.waits:
            return Result(requeue_after=sweep.requeue_after)  # waits for the node cache
        for tpl in templates:
            if tpl["metadata"]["name"] in sweep.kept:
                continue  # its request is kept open: the ledger reads it
            if made_for_uid(tpl, WORKLOAD_UID_ANNOTATION) != live_uid:
                await self._applier.apply(namespace, DeleteTemplate(tpl["metadata"]["name"]))
        return Result(requeue_after=sweep.requeue_after)

    def _note_refusals(self, orphans: Iterable[Obj]) -> None:
        """The Workload is gone while an attempt of it waited on a source that says it cannot
        find the capacity (a MultiKueue worker's copy, removed as the dispatcher moved on at
        that answer before a reconcile of the copy saw it): noted as the attempt's pending
        decision notes it (`driver.refused_note`), for the flavors its request records (read
        from the request, the same after a restart). A request withdrawn is noted no more."""
        for raw in orphans:
            req = request_of(raw)
            if req.deleting or not req.flavors:
                continue
            status = self._applier.sources.default.status_of(req)
            notes = driver.refused_note(self._caches.config_of(check_of(raw)), req, status)
            if notes:
                self.outcomes.note(check_of(raw), req.flavors, notes, self._clock())

    async def _apply(self, wl: Workload, check: str, decision: Decision) -> Applied:
        """Apply the actions, then write the check (a new message alone may be held: see
        `progress`) and emit events. Returns what was written and the seconds until the
        check wants another look: the decision's requeue, a held message falling due, or a
        short retry when cut short by a change meanwhile; None when nothing is due."""
        refused = partial(self._report_failed_create, wl, check)
        if not await self._applied(wl.ref, decision.actions, refused=refused):
            return Applied(STALE_RETRY_SECONDS)
        key, held, written = wl.ref.key, None, False
        if decision.check is None:
            self.held_messages.forget(key, check)
        else:
            before = wl.checks.get(check)
            # A message that tells of a request withdrawn now is written now: the next pass
            # finds it gone and could not say it again (an evicted gang's reclaimed arrivals).
            withdrawing = any(isinstance(a, DeleteRequest) for a in decision.actions)
            held = self.held_messages.hold(
                key,
                check,
                message_only=progress_only(before, decision.check) and not withdrawing,
                now=self._clock(),
            )
            if held is None and decision.check != before:
                entry = decision.check.to_obj()
                if not await self._write_check(wl, entry) and not (
                    withdrawing and await self._write_check_again(wl, entry, before)
                ):
                    return Applied(STALE_RETRY_SECONDS)  # the Workload changed meanwhile
                self._count(wl, check, decision)
                written = True
        try:
            stale = not await self._applied(wl.ref, decision.after, refused=refused)
        finally:  # the check is written: what came with it is said, whatever comes after meets
            for event in decision.events:
                await self._events.emit(wl.ref, event)
            for note in decision.sources:
                self.metrics.source(note.source, note.outcome, note.reason, note.seconds)
            if decision.sources:
                self.outcomes.note(check, wl.flavors, decision.sources, self._clock())
        if stale:  # as a stale decision: made again on what changed, soon
            return Applied(STALE_RETRY_SECONDS)
        done = (*decision.actions, *decision.after)
        return Applied(
            soonest(decision.requeue_after, held),
            wrote=written or bool(done),
            cached=all(isinstance(a, CACHED_ACTIONS) for a in done),
        )

    def _decider(self, wl: Workload) -> Callable[[Snapshot, datetime], Decision]:
        """`decide`; for a Kueue Workload slice, with the slice it replaces (slices.py)."""
        predecessor = slices.predecessor_of(wl, self._caches.workloads.store.get)
        return decide if predecessor is None else partial(slices.decide, predecessor=predecessor)

    def _count(self, wl: Workload, check: str, decision: Decision) -> None:
        """Metrics for a written state change: outcomes, time to Ready, rollbacks."""
        before, after = wl.checks.get(check), decision.check
        if after is None or before is None or before.state == after.state:
            return
        if decision.capacity_used:
            self.metrics.capacity_used(decision.capacity_used)
        self.metrics.attempt(after.state.lower())
        reserved = wl.conditions.get("QuotaReserved")
        since = parse_time(reserved.last_transition_time) if reserved else None
        if after.state != "Ready":
            return
        now = self._clock()
        if since is not None:
            self.metrics.quota_to_ready((now - since).total_seconds())
        provisioned = self._provisioned_since(wl, check, before.retry_count + 1)
        if provisioned is not None:
            self.metrics.provisioned_to_fit((now - provisioned).total_seconds())

    def _provisioned_since(self, wl: Workload, check: str, attempt: int) -> datetime | None:
        store = self._caches.requests.store
        obj = next(  # the request of the latest capacity source asked
            (
                found
                for source in reversed(range(naming.MAX_SOURCES))
                if (
                    found := store.get(
                        naming.request_name(wl.ref.name, check, attempt, source), wl.ref.namespace
                    )
                )
            ),
            None,
        )
        status = self._applier.sources.default.status_of(request_of(obj)) if obj else None
        return parse_time(status.signal(Phase.PROVISIONED).since) if status else None

    async def _report_failed_create(
        self, wl: Workload, check: str, action: Action, error: ApiError
    ) -> None:
        """The API server refused what we did: say so on the check and as an Event."""
        state = wl.checks.get(check)
        event = refusal_event(action, error.message)
        message = event.message
        await self._events.emit(wl.ref, event)
        if state is not None and state.message != message:
            await self._write_check(wl, replace(state, message=message[:MAX_MESSAGE]).to_obj())

    async def _write_check_again(self, wl: Workload, entry: Obj, before: CheckState | None) -> bool:
        """The check of a pass that withdrew a request, refused because the Workload changed
        meanwhile (Kueue releasing an evicted gang's quota just after evicting it): written
        on the Workload of now if our entry there is still the one this pass read. No later
        pass could say it: the request is gone, and with it what its withdrawal reclaimed."""
        try:
            obj = await self._kube.get(WORKLOAD, wl.ref.name, wl.ref.namespace)
        except NotFoundError:
            return False
        now = workload_of(obj)
        if now.ref.uid != wl.ref.uid or now.checks.get(entry["name"]) != before:
            return False
        self._caches.workloads.store.put_if_newer(obj)
        return await self._write_check(now, entry)

    async def _write_check(self, wl: Workload, entry: Obj) -> bool:
        """Replace only our entry of status.admissionChecks, if the Workload is unchanged.
        A write the API server refuses for what it says (Kueue's webhook, the CRD's schema)
        is said as a FailedUpdate Event on the Workload, then raised: the queue backs off,
        where reading it as a change meanwhile retried it every 0.5 s, said nowhere."""
        obj = self._caches.workloads.store.get(wl.ref.name, wl.ref.namespace) or {}
        entries = (obj.get("status") or {}).get("admissionChecks") or []
        index = next((i for i, e in enumerate(entries) if e.get("name") == entry["name"]), None)
        if index is None:
            return False
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": wl.resource_version},
            {"op": "test", "path": f"/status/admissionChecks/{index}/name", "value": entry["name"]},
            {"op": "replace", "path": f"/status/admissionChecks/{index}", "value": entry},
        ]
        try:
            updated = await self._kube.json_patch(
                WORKLOAD, wl.ref.name, ops, wl.ref.namespace, subresource="status"
            )
        except (ConflictError, InvalidError, NotFoundError, ForbiddenError) as e:
            if refused(e):
                message = f"Error writing admission check {entry['name']}: {e.message}"
                await self._events.emit(wl.ref, Event("FailedUpdate", message, warning=True))
                raise
            log.info(
                "check write skipped, the Workload changed: %s",
                e.reason,
                extra={"object": str(wl.ref)},
            )
            return False
        self._caches.workloads.store.put_if_newer(updated)
        return True


def _gone(request: Obj, namespace: str, name: str) -> ObjectRef:
    """The Workload a request was made for, gone now (its uid from the request)."""
    uid = request_of(request).workload_uid
    return ObjectRef("Workload", namespace, name, uid, WORKLOAD.api_version)
