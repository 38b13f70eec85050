"""Reconcile one PodGroup: read the caches, decide, apply the actions once, write what changed.

Keys are ``<short>/<namespace>/<name>``, short being ``pg`` (scheduling.k8s.io) or
``coscheduling`` (scheduling.x-k8s.io): the two APIs may hold groups of the same name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Unpack

from gangcheck.kube.errors import (
    ApiError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    ReplacedError,
    refused,
)
from gangcheck.kube.resources import POD
from gangcheck.logic.attempt.actions import Action, DeleteTemplate, Event
from gangcheck.logic.podgroups import growth, podgroup
from gangcheck.logic.podgroups.gating import is_gated
from gangcheck.logic.podgroups.group_snapshot import (
    config_named,
    config_serving,
    group_snapshot_of,
)
from gangcheck.logic.podgroups.podgroup import GroupDecision, GroupSnapshot
from gangcheck.model.names import CONFIG_ANNOTATION, GROUP_UID_ANNOTATION, MESSAGE_ANNOTATION
from gangcheck.model.objects import Obj, ObjectRef
from gangcheck.model.podgroups import SHORT, PodGroup, pod_group_of
from gangcheck.model.provisioning_config import AtomicProvisioningSpec
from gangcheck.reconcile.attempts import names_of, withdraw_orphans
from gangcheck.reconcile.reconciler import GangOptions, GangParts, GangReconciler, refusal_event
from gangcheck.reconcile.view import cluster_view
from gangcheck.runtime.queue import Result, soonest
from gangcheck.telemetry import traced_decision

log = logging.getLogger(__name__)
API_GROUP_OF = {short: group for group, short in SHORT.items()}
STALE_RETRY_SECONDS = 0.5
ORPHAN_RECHECK_SECONDS = 5.0
#: How soon a group whose namespace is not cached yet is looked at again (its namespace's
#: watch event also brings it back at once, `Controller._on_namespace`).
NAMESPACE_WAIT_SECONDS = 2.0
GROUP_GONE = "PodGroup deleted"
UNCONFIRMED = "?unconfirmed"
"""Not a uid: neither the group nor its absence could be confirmed."""


@dataclass(frozen=True)
class PodGroupOptions:
    """Settings of the PodGroup provisioner."""

    config: str = ""
    """The AtomicProvisioningConfig used unless a group names another; "" = the defaults."""
    max_members: int = 5000


def group_key(api_group: str, namespace: str, name: str) -> str:
    return f"{SHORT[api_group]}/{namespace}/{name}"


class PodGroupReconciler(GangReconciler):
    """The PodGroup provisioner, one group at a time."""

    def __init__(
        self,
        *parts: *GangParts,
        options: PodGroupOptions | None = None,
        **kwargs: Unpack[GangOptions],
    ) -> None:
        """`GangReconciler`'s parameters, and the provisioner's options (keyword only)."""
        super().__init__(*parts, **kwargs)
        self._options = options or PodGroupOptions()

    async def reconcile(self, key: str) -> Result:
        short, namespace, name = key.split("/", 2)
        api_group = API_GROUP_OF[short]
        informer = self._caches.pod_groups.get(api_group)
        obj = informer.store.get(name, namespace) if informer else None
        if obj is None:
            self.held_messages.forget(key)
            self.stalled.forget(key)
            return await self._without_group(api_group, short, namespace, name)
        group = pod_group_of(obj)
        if self._earlier_attempts(group):
            # An earlier group of this name, deleted and made again before a reconcile saw it
            # gone (one key for both watch events; gangcheck down meanwhile), left attempts:
            # withdrawn first, as when it is seen gone, so none of its capacity is kept for
            # ever and none of its names collides with the new group's asks.
            swept = await self._withdraw_orphans(api_group, short, namespace, name)
            if swept.requeue_after is not None or self._earlier_attempts(group):
                # what is left is being deleted: its deletion routes this key again
                return Result(requeue_after=swept.requeue_after or ORPHAN_RECHECK_SECONDS)
        if not group.deleting and self._caches.namespaces.store.get(namespace) is None:
            # its namespace not cached yet (made with the group, its watch event behind the
            # group's): its labels decide which config serves the group, so nothing is asked
            # or said until they are known
            return Result(requeue_after=NAMESPACE_WAIT_SECONDS)
        snap = self._snapshot(group, api_group)
        decision = traced_decision(growth.decide, snap, self._clock())
        self.stalled.note(key, "", decision.step)
        return Result(requeue_after=await self._apply(key, obj, decision))

    def _snapshot(self, group: PodGroup, api_group: str) -> GroupSnapshot:
        ns, key = group.ref.namespace, podgroup.group_key(group)
        return group_snapshot_of(
            group,
            self._caches.member_views(ns, api_group, group.ref.name),
            config=self._config(group),
            requests=self._caches.requests_of_group(ns, key),
            capacity=cluster_view(self._caches),
            max_members=self._options.max_members,
            opted_in=self._caches.opted_in(ns),
            templates=names_of(self._caches.templates_of_group(ns, key)),
        )

    def _config(self, group: PodGroup) -> tuple[AtomicProvisioningSpec | None, str]:
        """The config the group names, else the provisioner's default: either only if it
        serves the group's namespace (its spec.podGroups.namespaceSelector)."""
        ns = group.ref.namespace
        return config_serving(
            group.annotations.get(CONFIG_ANNOTATION) or self._options.config,
            self._caches.configs.store.get,
            namespace=ns,
            labels=self._caches.namespace_labels(ns),
        )

    def _config_named(self, name: str) -> tuple[AtomicProvisioningSpec | None, str]:
        return config_named(name, self._caches.configs.store.get)

    async def _apply(self, key: str, obj: Obj, decision: GroupDecision) -> float | None:
        """Apply the actions, then write the group's status (a new message alone may be
        held: see `progress`), then apply what comes after it (`flow.Decided.after`) and
        emit events. Returns the seconds until the group wants another look: the decision's
        requeue, a held message falling due, or a short retry when cut short by a change
        meanwhile; None when nothing is due."""
        group = pod_group_of(obj)
        refused = partial(self._report_refused, obj)
        if not await self._applied(group.ref, decision.actions, refused=refused):
            return STALE_RETRY_SECONDS
        held = None
        if decision.status:
            # A new message that comes with an Event is written with it: the decision says
            # an Event when the message changes (LateMembersWaiting), and while its write
            # were held every pass would find the old message and say the Event again.
            only = set(decision.status) == {MESSAGE_ANNOTATION} and not decision.events
            held = self.held_messages.hold(key, "", message_only=only, now=self._clock())
            if held is None:
                await self._write_status(obj, decision.status)
        else:
            self.held_messages.forget(key)
        try:
            stale = not await self._applied(group.ref, decision.after, refused=refused)
        finally:  # the group is written: what came with it is said, whatever comes after meets
            if decision.capacity_used:
                self.metrics.capacity_used(decision.capacity_used)
            for note in decision.sources:
                self.metrics.source(note.source, note.outcome, note.reason, note.seconds)
            for event in decision.events:
                await self._events.emit(event.about or group.ref, event)
        return STALE_RETRY_SECONDS if stale else soonest(decision.requeue_after, held)

    async def _report_refused(self, obj: Obj, action: Action, error: ApiError) -> None:
        """The API server refused what we did (a namespace's ResourceQuota, a policy): say
        so as an Event and as the group's message, as a Workload's check says it."""
        event = refusal_event(action, error.message)
        await self._events.emit(pod_group_of(obj).ref, event)
        if (obj["metadata"].get("annotations") or {}).get(MESSAGE_ANNOTATION) != event.message:
            await self._write_status(obj, {MESSAGE_ANNOTATION: event.message})

    async def _write_status(self, obj: Obj, status: Mapping[str, str]) -> None:
        """Merge our annotations into the group (an empty value removes one), into this very
        group only: one deleted and made again under its name since `obj` was read (a job
        run again by a script) is not given the state decided for the one before (Released
        would let its members go with nothing asked for); its own events decide it. A write
        the API server refuses for what it says (a policy webhook, the annotations' size) is
        said as a FailedUpdate Event on the group, then raised: the queue backs off."""
        meta = obj["metadata"]
        group = pod_group_of(obj)
        informer = self._caches.pod_groups[group.api_group]
        patch = {"metadata": {"annotations": {k: (v or None) for k, v in status.items()}}}
        try:
            updated = await self._kube.merge_patch(
                informer.resource, meta["name"], patch, meta["namespace"], uid=meta.get("uid")
            )
        except (NotFoundError, ReplacedError):
            return
        except (ForbiddenError, InvalidError) as e:
            if refused(e):
                message = f"Error writing the PodGroup's status: {e.message}"
                await self._events.emit(group.ref, Event("FailedUpdate", message, warning=True))
            raise
        informer.store.put_if_newer(updated)

    async def _without_group(self, api_group: str, short: str, namespace: str, name: str) -> Result:
        """The group is gone, or was never made: say on every member it holds why it waits,
        and, once the API server confirms the group is gone, reclaim what arrived for each
        unfinished attempt and delete what gangcheck made for it. A cache not authoritative
        (an API not served now, a relist under way, a 404) proves no absence."""
        if not self._caches.pod_groups_known(api_group):
            # Discovery has not answered yet (a start), or the API is served and its list is
            # refused or failing: nothing can be said of the group; the members are looked
            # at again once it has, or it lists (App._serve_pod_groups, App._when_listed),
            # not what gangcheck made for a group gone meanwhile: looked at again here.
            key = f"{short}/{name}"
            made = self._caches.requests_of_group(namespace, key) or (
                self._caches.templates_of_group(namespace, key)
            )
            return Result(requeue_after=ORPHAN_RECHECK_SECONDS if made else None)
        served = api_group in self._caches.pod_groups
        for pod in self._caches.members_of(namespace, api_group, name):
            if is_gated(pod):
                await self._note_missing(pod, api_group, name, served=served)
        return await self._withdraw_orphans(api_group, short, namespace, name)

    def _earlier_attempts(self, group: PodGroup) -> bool:
        """Whether a request or PodTemplate of this group's name was made for another group
        (another uid): templates are owned by nothing, so none goes with its group."""
        namespace, key = group.ref.namespace, podgroup.group_key(group)
        made = (*self._caches.requests_of_group(namespace, key),)
        made += (*self._caches.templates_of_group(namespace, key),)
        return any(_annotations(o).get(GROUP_UID_ANNOTATION) != group.ref.uid for o in made)

    async def _withdraw_orphans(
        self, api_group: str, short: str, namespace: str, name: str
    ) -> Result:
        """Once the API server confirms which group of this name is there now (if any),
        reclaim what arrived for each unfinished attempt made for another, and delete what
        gangcheck made for it: its requests, and the templates they left (a request deleted
        before its templates' delete failed, or a leader lost before the retry: no garbage
        collector is assumed, as a Workload's sweep assumes none)."""
        requests = self._caches.requests_of_group(namespace, f"{short}/{name}")
        templates = self._caches.templates_of_group(namespace, f"{short}/{name}")
        if not requests and not templates:
            return Result()
        live_uid = await self._live_uid(api_group, namespace, name)
        if live_uid == UNCONFIRMED:
            return Result(requeue_after=ORPHAN_RECHECK_SECONDS)
        sweep = await withdraw_orphans(
            self._applier,
            self._caches,
            requests,
            is_orphan=lambda r: _annotations(r).get(GROUP_UID_ANNOTATION) != live_uid,
            config_of=lambda r: self._config_of(_annotations(r).get(CONFIG_ANNOTATION, "")),
            why=GROUP_GONE,
            at=f"{namespace}/{name}",
            keep_promises=live_uid is None,
        )
        if sweep.waits:
            return Result(requeue_after=sweep.requeue_after)  # waits for the node cache
        for tpl in templates:
            if tpl["metadata"]["name"] in sweep.kept:
                continue  # its request is kept open (lifecycle.promise): the ledger reads it
            if _annotations(tpl).get(GROUP_UID_ANNOTATION) != live_uid:
                await self._applier.apply(namespace, DeleteTemplate(tpl["metadata"]["name"]))
        return Result(requeue_after=sweep.requeue_after)

    async def _live_uid(self, api_group: str, namespace: str, name: str) -> str | None:
        """The uid of the group the API server has now; None if it says there is none;
        UNCONFIRMED when neither can be known."""
        informer = self._caches.pod_groups.get(api_group)
        if informer is None or not informer.authoritative:
            return UNCONFIRMED
        try:
            live = await self._kube.get_if_exists(informer.resource, name, namespace)
        except NotFoundError:  # a 404 naming no PodGroup
            return UNCONFIRMED
        return str(live["metadata"]["uid"]) if live is not None else None

    def _config_of(self, config_name: str) -> AtomicProvisioningSpec | None:
        """The config the request was made under (recorded on it, since the group that
        named it is gone), else the provisioner's default config."""
        config, _ = self._config_named(config_name or self._options.config)
        return config

    async def _note_missing(self, pod: Obj, api_group: str, name: str, *, served: bool) -> None:
        text = podgroup.missing_group_message(api_group, name, served=served)
        meta = pod["metadata"]
        if (meta.get("annotations") or {}).get(MESSAGE_ANNOTATION) == text:
            return
        patch = {"metadata": {"annotations": {MESSAGE_ANNOTATION: text}}}
        try:
            updated = await self._kube.merge_patch(POD, meta["name"], patch, meta["namespace"])
        except (NotFoundError, ConflictError):
            return
        self._caches.pods.store.put_if_newer(updated)
        ref = ObjectRef("Pod", meta["namespace"], meta["name"], meta.get("uid", ""), "v1")
        await self._events.emit(ref, Event("PodGroupNotFound", text, warning=True))


def _annotations(obj: Obj) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})
