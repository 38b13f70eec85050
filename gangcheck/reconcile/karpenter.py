"""Serves the ProvisioningRequests of gangcheck's Karpenter class with NodeClaims.

Passes run when something changed, not on a clock: a request of the class changed (the
requests informer wakes the provisioner), one of gangcheck's NodeClaims did (a watch of
them runs from the revision of the pass's own list while requests of the class are in
flight, so no change between the list and the watch is missed), or a reclaim's mark came off
a node recorded and held (kept: its hold may be lifted, ``on_node``); and at most ``resync``
seconds apart as a safety net (``ORPHAN_INTERVAL`` with no request of the class: a woken
pass runs at once all the same, the last request's going included).

A pass looks at each request of ``KARPENTER_CLASS`` in the cache and
at every NodeClaim labelled with an attempt, decides with
``logic.sources.karpenter.provisioner.serve`` and applies: creates claims (a lost answer is
answered AlreadyExists on the retry: names are derived from the attempt), writes the request's
conditions at the resourceVersion read, deletes claims conditional on their uid, withdraws a
claim whose node exists through the reclaim's safe path (a node found running the pods of
a gang that started is handed over to it: ``handover.hand_over``), lifts the hold from a node such a
withdrawal kept (read live: recorded for the request, held for it, owing no reclaim), and
removes ``karpenter.sh/do-not-disrupt`` with a JSON patch that tests its value. A request
missing from the cache is looked up live before its claims are withdrawn: a cache cannot prove
absence.

Every claim of the pools is listed (at once, not from a cache that may lag) in a pass that has
a request to ask for, and each claim created in that pass is added to what the next request of
the same pass is charged with: the room of a pool counts every claim that exists and every one
just made, whatever Karpenter's ``status.resources`` says yet (``pools.pool_use``). Only the
leader runs these passes, each from fresh lists, so a restart or a new leader starts from
what the API server holds.

One request's trouble is its own: a claim the API server refuses for what it is (an admission
webhook or policy, the NodeClaim schema: ``kube.errors.refused_as_written``, not the
authorizer's 403) fails that request quoting the refusal (``NodeClaimRefused``), which
withdraws what was made; any other error serving one request is logged and the pass goes on
to the next request.

Without Karpenter's API (NodeClaims not served) a request of the class fails, saying so.
Without the rights of ``manifests/components/karpenter`` (403) it is said once, and again when
what is refused changes: a warning in the log, an Event on each request of the class and on
the gang it was made for, and the request ``Failed`` naming the component where its status
may still be written; the passes back off to a minute and resume once allowed
(``logic.sources.karpenter.access``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import (
    AlreadyExistsError,
    ApiError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    refused_as_written,
)
from gangcheck.kube.resources import NODE, NODE_CLAIM, NODE_POOL, PROVISIONING_REQUEST, Resource
from gangcheck.logic.attempt.actions import Event
from gangcheck.logic.sources.karpenter import access, names
from gangcheck.logic.sources.karpenter.claims import release_protection_patch
from gangcheck.logic.sources.karpenter.provisioner import (
    Served,
    gang_started,
    is_asking,
    is_served_here,
    kept_since,
    reads_pools,
    request_key,
    serve,
)
from gangcheck.logic.sources.waiting import is_open
from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.model.names import ARRIVED_FOR, RECLAIM_WHEN_IDLE
from gangcheck.model.objects import Obj, ObjectRef, ref_of
from gangcheck.reclaim.arrivals import tell
from gangcheck.reclaim.reclaimers import DeleteNodeClaim, delete_told
from gangcheck.reclaim.safely import Target, reclaim_safely
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.events import EventRecorder
from gangcheck.reconcile.handover import hand_over, lift_hold

log = logging.getLogger(__name__)

#: The base of the backoff while passes are refused (403).
INTERVAL = 1.0
#: Seconds between passes with requests of the class in flight when nothing wakes them.
RESYNC_SECONDS = 10.0
#: Seconds between passes looking only for claims whose request is gone.
ORPHAN_INTERVAL = 30.0
T = TypeVar("T")


class NotPermittedError(Exception):
    """A call of a pass was refused (403): ``action`` says what was refused."""

    def __init__(self, action: str) -> None:
        super().__init__(access.not_permitted(action))
        self.action = action


class ClaimRefusedError(Exception):
    """The API server refused a claim for what it is, not for gangcheck's rights: an admission
    webhook or policy, or the NodeClaim schema (``kube.errors.refused_as_written``, not
    RBAC's 403)."""

    def __init__(self, name: str, error: ApiError) -> None:
        message = f"the API server refused NodeClaim {name!r}: {error.message}"
        super().__init__(message)
        self.condition: Obj = {
            "type": "Failed",
            "status": "True",
            "reason": "NodeClaimRefused",
            "message": message,
        }


class KarpenterProvisioner:
    def __init__(
        self,
        kube: Kube,
        caches: Caches,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        interval: float = INTERVAL,
        resync: float = RESYNC_SECONDS,
        events: EventRecorder | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self._kube = kube
        self._caches = caches
        self._clock = clock
        self.interval = interval
        self.resync = resync
        self._events = events or EventRecorder(kube, clock=clock)
        self._sleep = sleep or self._until_woken
        self._woken = asyncio.Event()
        self._claims_version = ""
        """The revision of the last list of gangcheck's NodeClaims: their watch starts there."""
        self._watching: asyncio.Task[None] | None = None
        self.passes = 0
        self._answered: set[str] = set()
        """Requests of the class a pass of this process answered (its cache may lag)."""
        self._since_orphan_pass = ORPHAN_INTERVAL
        self._gone: dict[str, tuple[tuple[str, str], ...]] = {}
        """Attempts whose request a live read found gone and whose claims had nothing left to
        do, with what their claims and nodes were then (``_seen``): not read again while
        those stay as they were (claims outlive their gang's request as Karpenter's nodes)."""
        self.denials = access.Denials(interval)
        """What the passes were last refused, and the wait it makes before the next."""
        self._told: dict[str, str] = {}
        """The refusal each request of the class was told of, by request key."""

    def wake(self) -> None:
        """Something a pass reads changed: run one soon."""
        self._woken.set()

    def on_request(self, old: Obj | None, new: Obj | None) -> None:
        """A requests-informer handler: a request of the class changed."""
        if is_served_here(new or old or {}):
            self.wake()

    def on_node(self, old: Obj | None, new: Obj | None) -> None:
        """A nodes-informer handler: a node recorded and held was kept by a reclaim (its
        mark gone, ``kept_since``): a pass may lift its hold now, not at the resync."""
        if kept_since(old, new):
            self.wake()

    async def _until_woken(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._woken.wait(), seconds)

    async def run(self) -> None:
        try:
            while True:
                self._woken.clear()
                began = time.monotonic()
                try:
                    await self._pass()
                except ApiError as e:
                    log.warning("karpenter provisioner pass failed: %s", e)
                self.passes += 1
                self._follow_claims()
                await self._sleep(self._next_delay())
                self._since_orphan_pass += time.monotonic() - began
                if self._woken.is_set():  # a change to look at now, requests of it or not
                    self._since_orphan_pass = ORPHAN_INTERVAL
        finally:
            self._stop_watching()

    def _next_delay(self) -> float:
        if self.denials.refused:
            return self.denials.delay
        requests = self._requests()
        fresh = [k for k, r in requests.items() if k not in self._answered and _unanswered(r)]
        if fresh:
            return self.interval  # a new request is asked once its first second has passed
        return self.resync if requests else ORPHAN_INTERVAL

    def _follow_claims(self) -> None:
        """While requests of the class are in flight, watch gangcheck's NodeClaims from the
        last list's revision; each change wakes a pass (the watch ends with the requests)."""
        if not self._requests() or self.denials.refused:
            self._stop_watching()
            return
        idle = self._watching is None or self._watching.done()
        if idle and self._claims_version:
            self._watching = asyncio.create_task(self._watch_claims(self._claims_version))

    def _stop_watching(self) -> None:
        if self._watching is not None and not self._watching.done():
            self._watching.cancel()
        self._watching = None

    async def _watch_claims(self, version: str) -> None:
        """Wake a pass on each change of gangcheck's NodeClaims; end on any error (the next
        pass lists again and watches from there)."""
        try:
            async for event in self._kube.watch(
                NODE_CLAIM, resource_version=version, label_selector=names.ATTEMPT_LABEL
            ):
                if event.get("type") != "BOOKMARK":
                    self.wake()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # however it ends, the next pass lists and watches again
            log.debug("NodeClaim watch ended: %s", e)
        self._claims_version = ""  # a fresh list first: the revision may be too old now
        self.wake()

    async def _pass(self) -> None:
        try:
            await self.pass_once()
        except NotPermittedError as e:
            await self._refused(e)
        else:
            self._allowed()

    async def pass_once(self) -> None:
        requests = self._requests()
        if not requests and self._since_orphan_pass < ORPHAN_INTERVAL:
            return
        self._since_orphan_pass = 0.0
        try:
            claims = await self._claims()
        except NotPermittedError:
            if not requests:
                return  # nothing to serve: gangcheck need not read claims it cannot have made
            raise
        if claims is None:
            await self._unserved(requests, "NodeClaims")
            return
        keys = set(requests) | {_requested_for(c) for c in claims} - {""}
        try:
            pools = await self._pools() if requests or reads_pools(claims) else {}
        except NotPermittedError:
            if requests:
                raise
            pools = {}  # nothing to ask for; a claim whose pool is not read keeps its protection
        except NotFoundError:  # NodeClaims served, NodePools not (a CRD of two installed)
            if requests:
                await self._unserved(requests, "NodePools")
                return
            pools = {}  # as above: a claim whose pool is not read keeps its protection
        nodes = {n["metadata"]["name"]: n for n in self._caches.nodes.store}
        pool_claims: list[Obj] | None = None
        self._gone = {k: v for k, v in self._gone.items() if k in keys and k not in requests}
        for key in sorted(keys):
            seen = _seen(claims, key, nodes)
            request = requests.get(key)
            if request is None:
                if self._gone.get(key) == seen:
                    continue  # found gone, nothing left to do, nothing changed since
                request = await self._live_request(key)
            now = self._clock()
            if pool_claims is None and is_asking(request, key, claims, now):
                pool_claims = await self._pool_claims()
            served = serve(
                request,
                key,
                templates=self._templates(key),
                claims=claims,
                pools=pools,
                nodes=nodes,
                now=now,
                pool_claims=pool_claims or (),
            )
            created: list[Obj] = []
            try:
                await self._apply(request, served, claims, nodes, created, key=key)
            except ApiError as e:  # this request's; the others of the pass are served
                log.warning("karpenter: serving %s failed: %s", key, e, extra={"object": key})
            else:
                if served.create or served.conditions:
                    self._answered.add(key)
                acted = served.delete or served.release or served.reclaim or served.lift
                if request is None and not acted:
                    self._gone[key] = seen
            # Made in this pass (a create failing after some did too): charged to the room
            # of the next request's pool at once.
            claims.extend(created)
            if pool_claims is not None:
                pool_claims.extend(created)

    def _requests(self) -> dict[str, Obj]:
        found = {request_key(r): r for r in self._caches.requests.store if is_served_here(r)}
        self._answered &= set(found)
        return found

    @staticmethod
    async def _permitted(action: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except ForbiddenError as e:
            raise NotPermittedError(action) from e

    async def _claims(self) -> list[Obj] | None:
        """The claims of gangcheck's attempts (None: Karpenter's API is not served)."""
        try:
            listed = await self._permitted(
                "list karpenter.sh NodeClaims",
                self._kube.list_objects(NODE_CLAIM, label_selector=names.ATTEMPT_LABEL),
            )
        except NotFoundError:
            return None
        self._claims_version = str((listed.get("metadata") or {}).get("resourceVersion", ""))
        return list(listed.get("items") or [])

    async def _pool_claims(self) -> list[Obj]:
        """Every claim of every NodePool, whoever made it: what the pools' limits are charged
        with (read at once, never from a cache that may not show a claim made a moment ago)."""
        listed = await self._permitted(
            "list karpenter.sh NodeClaims",
            self._kube.list_objects(NODE_CLAIM, label_selector=names.NODE_POOL_LABEL),
        )
        return list(listed.get("items") or [])

    async def _pools(self) -> Mapping[str, Obj | None]:
        listed = await self._permitted(
            "list karpenter.sh NodePools", self._kube.list_objects(NODE_POOL)
        )
        return {p["metadata"]["name"]: p for p in listed.get("items") or []}

    def _allowed(self) -> None:
        if self.denials.allow():
            log.info("karpenter provisioner: permitted again, serving requests")
        self._told.clear()

    async def _refused(self, error: NotPermittedError) -> None:
        """Said once per refusal (and per request of the class), then the passes back off."""
        message = str(error)
        if self.denials.refuse(message):
            log.warning(
                "%s; requests of the Karpenter class wait, passes back off to %.0fs",
                message,
                self.denials.cap,
                extra={"reason": access.REASON},
            )
        requests = self._requests()
        self._told = {k: m for k, m in self._told.items() if k in requests}
        for key, request in sorted(requests.items()):
            if self._told.get(key) != message and not _failed_for(request, message):
                self._told[key] = message
                await self._tell(request, message)

    async def _tell(self, request: Obj, message: str) -> None:
        event = Event(access.REASON, message, warning=True)
        for ref in (
            ref_of(request, PROVISIONING_REQUEST.kind, PROVISIONING_REQUEST.api_version),
            *_owners(request),
        ):
            await self._events.emit(ref, event)
        failed = {"type": "Failed", "status": "True", "reason": access.REASON, "message": message}
        with contextlib.suppress(NotPermittedError):  # said by the Events
            await self._write_conditions(request, (failed,))

    async def _live_request(self, key: str) -> Obj | None:
        namespace, _, name = key.partition("/")
        return await self._kube.get_if_exists(PROVISIONING_REQUEST, name, namespace)

    def _templates(self, key: str) -> dict[str, Obj]:
        namespace = key.partition("/")[0]
        return {
            t["metadata"]["name"]: t
            for t in self._caches.templates.store
            if t["metadata"].get("namespace") == namespace
        }

    async def _unserved(self, requests: Mapping[str, Obj], kinds: str) -> None:
        """Each request of the class fails, once: the API server does not serve Karpenter's
        ``kinds`` (NodeClaims, or NodePools while NodeClaims are: one CRD of the two)."""
        failed = {
            "type": "Failed",
            "status": "True",
            "reason": "KarpenterNotServed",
            "message": (
                f"gangcheck cannot list karpenter.sh/v1 {kinds}: the API server does not "
                "serve them (install Karpenter and its CRDs)"
            ),
        }
        for request in requests.values():
            if not _failed_for(request, failed["message"]):
                await self._write_conditions(request, (failed,))

    async def _apply(
        self,
        request: Obj | None,
        served: Served,
        claims: Sequence[Obj],
        nodes: Mapping[str, Obj],
        created: list[Obj],
        *,
        key: str,
    ) -> None:
        """Applies ``served``; each claim created is added to ``created`` as it is (as the
        server answered, or as sent when a retry found it made already)."""
        for body in served.create:
            try:
                created.append(await self._create(body))
            except ClaimRefusedError as e:
                # Refused for what it is (an admission webhook, a policy, the schema): this
                # gang's request fails quoting it, which withdraws what was made; nothing
                # else of the pass waits on it.
                if request is not None:
                    await self._write_conditions(request, (e.condition,))
                return
        for claim in served.delete:
            # told to the caches as answered (a 404 too), as the reclaims' deletes are: a
            # decision before the watch's DELETED does not take the claim's node for capacity
            with contextlib.suppress(ConflictError):
                await self._permitted(
                    "delete karpenter.sh NodeClaims",
                    delete_told(
                        self._kube,
                        self._caches,
                        NODE_CLAIM,
                        claim,
                        uid=claim["metadata"].get("uid"),
                        # as read: a claim registered since (its node named) is judged again
                        resource_version=claim["metadata"].get("resourceVersion"),
                    ),
                )
        for claim in served.reclaim:
            await self._reclaim(claim, nodes, request)
        for name in served.lift:
            await lift_hold(self._kube, self._caches, name, key, permitted=self._permitted)
        if request is not None and served.conditions:
            await self._write_conditions(request, served.conditions)
        by_name = {c["metadata"]["name"]: c for c in claims}
        for kind, name in served.release:
            obj = nodes.get(name) if kind == "node" else by_name.get(name)
            if obj is not None:
                await self._release(NODE if kind == "node" else NODE_CLAIM, obj)
        if served.create or served.delete or served.release or served.reclaim or served.lift:
            log.info(
                "karpenter: %d claims created, %d deleted, %d reclaimed safely, %d kept "
                "unheld, %d unprotected",
                len(served.create),
                len(served.delete),
                len(served.reclaim),
                len(served.lift),
                len(served.release),
                extra={"object": request_key(request) if request else ""},
            )

    async def _reclaim(self, claim: Obj, nodes: Mapping[str, Obj], request: Obj | None) -> None:
        """Withdraw a claim whose node exists through the reclaim's safe path: the node is
        recorded as arrived for the request, with the reclaim's mark, in one write at the
        resourceVersion it was judged at (its hold, the claim's taint, already on it: the
        admission policy lets gangcheck record, fence and reclaim only such a node), then
        reclaimed as the mark owes (``reclaim_safely``: fenced, its pods read live, the claim
        deleted only if none but DaemonSet pods are there); should this process stop between,
        the draining-node reconciler owes it the same. A node kept is said (an Event on the
        Node, a log line) and its hold lifted, as a rollback's kept node's is. One draining
        (the gang's pods there) whose gang started is the gang's (``gang_started``): handed
        over (``handover.hand_over``), not left to the draining-node reconciler, which would look at
        it every ``DRAIN_POLL_SECONDS`` for as long as the gang runs. One draining before the
        start, or failed, keeps its mark (and its hold) for the draining-node reconciler,
        and once that keeps it, a later pass lifts its hold (``Served.lift``)."""
        key = _requested_for(claim)
        name = str((claim.get("status") or {}).get("nodeName") or "")
        node = nodes.get(name)
        if node is None:
            return
        meta = node["metadata"]
        target = Target(
            name,
            key,
            _made_before(claim),
            DeleteNodeClaim.name,
            was_cordoned=bool((node.get("spec") or {}).get("unschedulable")),
        )
        notes = {ARRIVED_FOR: key, RECLAIM_WHEN_IDLE: target.mark()}
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"], "annotations": notes}}
        try:
            marked = await self._kube.merge_patch(NODE, name, patch)
        except (ConflictError, NotFoundError):
            return  # changed since it was judged (the ledger may have recorded it): next pass
        except ForbiddenError as e:
            log.warning(
                "karpenter: node %s of claim %s could not be recorded for its reclaim, the "
                "claim stays: %s",
                name,
                claim["metadata"]["name"],
                e.message,
                extra={"object": key},
            )
            return
        self._caches.nodes.store.put_if_newer(marked)
        result = await reclaim_safely(
            self._kube, target, self._clock(), owed=True, told=self._caches
        )
        log.info(
            "karpenter: claim %s withdrawn through the reclaim of node %s: %s %s",
            claim["metadata"]["name"],
            name,
            result.verdict,
            result.reason,
            extra={"object": key},
        )
        await tell(self._events, None, name, result, request=key)
        if result.verdict == "drain" and gang_started(request):
            await hand_over(
                self._kube, self._caches, name, key, target.mark(), permitted=self._permitted
            )
        elif result.verdict == "keep":
            await lift_hold(self._kube, self._caches, name, key, permitted=self._permitted)

    async def _create(self, body: Obj) -> Obj:
        try:
            made: Obj = await self._kube.create(NODE_CLAIM, body)
        except AlreadyExistsError:  # an answer lost on an earlier try: it is there
            return body
        except ApiError as e:
            if refused_as_written(e):
                raise ClaimRefusedError(body["metadata"]["name"], e) from e
            if isinstance(e, ForbiddenError):
                raise NotPermittedError("create karpenter.sh NodeClaims") from e
            raise
        return made

    async def _write_conditions(self, request: Obj, wanted: tuple[Obj, ...]) -> None:
        meta = request["metadata"]
        now = format_time(self._clock())
        current = list((request.get("status") or {}).get("conditions") or [])
        for condition in wanted:
            old = next((c for c in current if c.get("type") == condition["type"]), None)
            since = (
                old["lastTransitionTime"]
                if old and old.get("status") == condition["status"]
                else now
            )
            new = {**condition, "lastTransitionTime": since}
            current = [c for c in current if c.get("type") != condition["type"]] + [new]
        patch = {
            "metadata": {"resourceVersion": meta["resourceVersion"]},
            "status": {"conditions": current},
        }
        # A conflict: judged on a stale request; the next pass judges again.
        with contextlib.suppress(ConflictError, NotFoundError):
            written = await self._permitted(
                "patch provisioningrequests/status",
                self._kube.merge_patch(
                    PROVISIONING_REQUEST,
                    meta["name"],
                    patch,
                    meta["namespace"],
                    subresource="status",
                ),
            )
            # The next pass judges on what was written, not on a cache the watch has not
            # brought it to yet: a request read without the Accepted just written would have
            # a claim Karpenter deleted since made again (a creation cut short) instead of
            # said lost.
            self._caches.requests.store.put_if_newer(written)

    async def _release(self, res: Resource, obj: Obj) -> None:
        ops = release_protection_patch(obj)
        if not ops:
            return
        # Gone, or the value changed since it was read (the test op fails: ChangedError).
        with contextlib.suppress(NotFoundError, ConflictError):
            await self._permitted(
                f"patch {res.plural}", self._kube.json_patch(res, obj["metadata"]["name"], ops)
            )


def _seen(claims: Sequence[Obj], key: str, nodes: Mapping[str, Obj]) -> tuple[tuple[str, str], ...]:
    """What serving ``key``'s attempt reads of its claims and their nodes, by resourceVersion."""
    seen: list[tuple[str, str]] = []
    for claim in claims:
        if _requested_for(claim) != key:
            continue
        meta = claim.get("metadata") or {}
        seen.append((str(meta.get("name", "")), str(meta.get("resourceVersion", ""))))
        node = nodes.get(str((claim.get("status") or {}).get("nodeName") or ""))
        if node is not None:
            seen.append(
                (
                    f"node/{node['metadata']['name']}",
                    str(node["metadata"].get("resourceVersion", "")),
                )
            )
    return tuple(sorted(seen))


def _made_before(claim: Obj) -> str:
    """What a node reclaimed as ``claim``'s must be younger than (the age rule,
    ``proven_younger``: a later second): the second before the claim's, since Karpenter makes
    the node for the claim, never before it. Said so even when the request is gone."""
    made = parse_time(str((claim.get("metadata") or {}).get("creationTimestamp") or ""))
    return format_time(made - timedelta(seconds=1)) if made is not None else ""


def _requested_for(claim: Obj) -> str:
    return str(
        ((claim.get("metadata") or {}).get("annotations") or {}).get(names.REQUESTED_FOR, "")
    )


def _owners(request: Obj) -> list[ObjectRef]:
    """The gang objects the request was made for (its owners, in its namespace)."""
    meta = request.get("metadata") or {}
    return [
        ObjectRef(
            kind=str(o.get("kind", "")),
            namespace=str(meta.get("namespace") or ""),
            name=str(o.get("name", "")),
            uid=str(o.get("uid", "")),
            api_version=str(o.get("apiVersion", "")),
        )
        for o in meta.get("ownerReferences") or []
    ]


def _unanswered(request: Obj) -> bool:
    """A request of the class no pass has answered yet (no condition) and still open: it is
    asked for a second after it was made, which no event marks (one rolling back or kept is
    never asked: ``waiting.is_open``)."""
    return not (request.get("status") or {}).get("conditions") and is_open(request)


def _failed_for(request: Obj, message: str) -> bool:
    """The request says already that it failed for ``message`` (told before a restart)."""
    conditions = (request.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "Failed" and c.get("status") == "True" and c.get("message") == message
        for c in conditions
    )
