"""The edge of every decision: each action applied once, the caches updated with the result."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import (
    AlreadyExistsError,
    ApiError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
)
from gangcheck.kube.resources import NODE, POD, Resource
from gangcheck.logic.attempt.actions import (
    Action,
    ClaimNode,
    GuardScaleDown,
    ReclaimArrivals,
    ReleaseHold,
    ReleaseMembers,
)
from gangcheck.logic.attempt.backend import CapacityBackend
from gangcheck.logic.attempt.hold import is_held, taints_holding, taints_released
from gangcheck.logic.attempt.records import Outcome
from gangcheck.model.names import (
    ARRIVED_FOR,
    CHECK_ANNOTATION,
    GROUP_ANNOTATION,
    GROUP_UID_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    OUTCOME_ANNOTATION,
    WORKLOAD_ANNOTATION,
    WORKLOAD_UID_ANNOTATION,
)
from gangcheck.model.objects import Obj, pod_of
from gangcheck.reclaim.arrivals import reclaim_arrivals
from gangcheck.reclaim.guard import guard, unguard
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.events import EventRecorder
from gangcheck.runtime.together import at_once
from gangcheck.telemetry import NO_METRICS, AttemptMetrics

log = logging.getLogger(__name__)
HOLD_ATTEMPTS = 3
"""Writes of a node's lifted hold, each after reading it again on a conflict."""


IDENTITY_ANNOTATIONS = (
    WORKLOAD_ANNOTATION,
    WORKLOAD_UID_ANNOTATION,
    CHECK_ANNOTATION,
    GROUP_ANNOTATION,
    GROUP_UID_ANNOTATION,
)


class NameCollisionError(ApiError):
    """The name gangcheck needs is taken by an object that is not ours."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(
            409,
            "AlreadyExists",
            f"{kind} {name!r} already exists and was not made by gangcheck for this "
            f"{'gang' if kind == 'PodTemplate' else 'attempt'}; delete or rename it",
            target=f"{kind}/{name}",
        )


def made_for(existing: Obj, body: Obj) -> bool:
    """Whether an existing object is the one `body` describes: labelled as gangcheck's and
    carrying the same Workload (or PodGroup) and check annotations."""
    meta, wanted = existing.get("metadata") or {}, body["metadata"]
    if (meta.get("labels") or {}).get(MANAGED_BY_LABEL) != MANAGED_BY:
        return False
    have, want = meta.get("annotations") or {}, wanted.get("annotations") or {}
    return all(have.get(k) == want[k] for k in IDENTITY_ANNOTATIONS if k in want)


def side_by_side(actions: Sequence[Action]) -> Iterator[tuple[Action, ...]]:
    """`actions` in order, in runs applied at once: consecutive claims of distinct nodes
    (`ClaimNode`: each at its own node's resourceVersion, none depending on another), every
    other action alone."""
    run: list[ClaimNode] = []
    for action in actions:
        if isinstance(action, ClaimNode) and all(c.name != action.name for c in run):
            run.append(action)
            continue
        if run:
            yield tuple(run)
            run = []
        if isinstance(action, ClaimNode):
            run.append(action)
        else:
            yield (action,)
    if run:
        yield tuple(run)


async def write_taints(kube: Kube, node: Obj, taints: list[Obj]) -> Obj:
    """Replace the node's taints at the resourceVersion they were read at (ConflictError if
    someone wrote meanwhile), so no other writer's taint is lost."""
    patch = {
        "metadata": {"resourceVersion": node["metadata"].get("resourceVersion", "")},
        "spec": {"taints": taints or None},
    }
    return await kube.merge_patch(NODE, node["metadata"]["name"], patch)


@dataclass(frozen=True)
class SourceEdge:
    """What a capacity source brings to the edge: the backend its decisions use
    (logic/attempt/backend.py), a handler for each action type it adds, and how it writes a
    record on the object its attempts are anchored on (the outcome of a reclaim)."""

    backend: CapacityBackend
    handlers: Mapping[type, Handler]
    record: Callable[[str, Mapping[str, str]], Action]


class Sources:
    """The registry of capacity sources the edge serves: each action type is applied by the
    core or by exactly one source."""

    def __init__(self, *edges: SourceEdge) -> None:
        if not edges:
            raise ValueError("at least one capacity source")
        self._edges = edges
        self._handlers: dict[type, Handler] = {}
        for edge in edges:
            for kind, handler in edge.handlers.items():
                if kind in _APPLY or kind in self._handlers:
                    raise ValueError(f"{kind.__name__} is already applied by another handler")
                self._handlers[kind] = handler

    @property
    def default(self) -> CapacityBackend:
        """The backend of a gang whose config names no other (the first registered)."""
        return self._edges[0].backend

    def backend(self, kind: str) -> CapacityBackend | None:
        return next((e.backend for e in self._edges if e.backend.kind == kind), None)

    def handler(self, kind: type) -> Handler | None:
        return self._handlers.get(kind)

    def record(self, attempt: str, annotations: Mapping[str, str]) -> Action:
        """The action writing `annotations` on `attempt`'s record, by the default source."""
        return self._edges[0].record(attempt, annotations)


class StaleDecisionError(Exception):
    """The caches were behind the server: drop the rest of the decision and decide again."""


class Applier:
    """Applies the actions decisions ask for (for Workloads and PodGroups alike)."""

    def __init__(
        self,
        kube: Kube,
        caches: Caches,
        sources: Sources,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        metrics: AttemptMetrics = NO_METRICS,
    ) -> None:
        self._kube = kube
        self._caches = caches
        self.sources = sources
        self._clock = clock
        self.metrics = metrics

    async def apply(self, namespace: str, action: Action) -> None:
        """Apply one action, by the handler of its type: the core's own, or the one the
        capacity source that made it registered (`Sources`)."""
        handler = _APPLY.get(type(action)) or self.sources.handler(type(action))
        if handler is None:
            raise TypeError(f"no handler for {type(action).__name__}: register its source")
        await handler(self, namespace, action)

    @property
    def kube(self) -> Kube:
        return self._kube

    def now(self) -> datetime:
        return self._clock()

    @property
    def caches(self) -> Caches:
        return self._caches

    async def create_owned(self, res: Resource, body: Obj, informer: Any) -> None:
        """Create; an object of that name that is ours (made by an earlier, interrupted
        reconcile) counts as created, anyone else's is a collision, reported."""
        try:
            created = await self._kube.create(res, body)
        except AlreadyExistsError:
            meta = body["metadata"]
            created = await self._kube.get(res, meta["name"], meta.get("namespace"))
            if not made_for(created, body):
                raise NameCollisionError(res.kind, meta["name"]) from None
        informer.store.put_if_newer(created)

    async def delete_owned(
        self, res: Resource, name: str, namespace: str, informer: Any, *, uid: str | None = None
    ) -> None:
        """Delete (only the object of `uid`, if given), the cache told at once: one gone (or
        gone already: 404) is no longer in it, nor brought back by what the watch still
        brings of it; one a finalizer keeps is there as answered (`Store.deleted`). A
        ConflictError (another object of that name now) is raised, the cache untouched."""
        try:
            answer: Obj | None = await self._kube.delete(res, name, namespace, uid=uid)
        except NotFoundError:
            answer = None
        informer.store.deleted(name, namespace, answer, uid=uid)

    async def _claim_node(self, namespace: str, action: Action) -> None:
        """Record the node as arrived for the request and hold it for the request's gang, in
        one write at the resourceVersion decided on; lose quietly to a concurrent change."""
        assert isinstance(action, ClaimNode)
        node = self._caches.nodes.store.get(action.name)
        if node is None or node["metadata"].get("resourceVersion") != action.resource_version:
            raise StaleDecisionError(f"node {action.name} changed before it could be claimed")
        patch = {
            "metadata": {
                "resourceVersion": action.resource_version,
                "annotations": {ARRIVED_FOR: action.request},
            },
            "spec": {"taints": taints_holding(node, action.hold or action.request)},
        }
        try:
            updated = await self._kube.merge_patch(NODE, action.name, patch)
        except ConflictError as e:
            raise StaleDecisionError(
                f"node {action.name} changed before it could be claimed"
            ) from e
        except ForbiddenError as e:
            # The admission policy records an arrival only on a new node (or one that came
            # closed or held, manifests/base/admission-policy.yaml): one refused stays
            # unrecorded, so it is never reclaimed, and the rest of the decision goes on.
            log.warning(
                "node %s could not be recorded as arrived for %s: %s",
                action.name,
                action.request,
                e.message,
            )
            return
        self._caches.nodes.store.put_if_newer(updated)
        log.info("node %s arrived for %s and is held for its gang", action.name, action.request)

    async def _release_hold(self, namespace: str, action: Action) -> None:
        """Lift the hold from each node, keeping every other taint: written at the node's
        resourceVersion, read again on a conflict; a node gone or not held is done. Its
        preconditions (`gone`, `unconsumed`) are confirmed on the API server first. A node
        that changed at every try keeps its hold for now: once the others are lifted a
        ConflictError naming it is raised, and the queue retries the decision (backed off),
        never leaving it closed to every other gang unsaid."""
        assert isinstance(action, ReleaseHold)
        if action.gone:
            requests = self._caches.requests
            live = await self._kube.get_if_exists(requests.resource, action.gone, namespace)
            if live is not None:  # only the cache missed it: decide again on it
                requests.store.put_if_newer(live)
                raise StaleDecisionError(f"request {action.gone} is there: its hold stays")
        if action.unconsumed:
            await self._confirm_unconsumed(namespace, action.unconsumed)
        changing = []
        for name in action.nodes:
            node = self._caches.nodes.store.get(name)
            for _ in range(HOLD_ATTEMPTS):
                if node is None or not is_held(node):
                    break
                try:
                    node = await write_taints(self._kube, node, taints_released(node))
                except ConflictError:
                    node = await self._fresh(name)
                    continue
                except NotFoundError:
                    break
                self._caches.nodes.store.put_if_newer(node)
                log.info("hold lifted from node %s", name)
                break
            else:  # every try conflicted: unless the last read found it gone or not held
                if node is not None and is_held(node):
                    changing.append(name)
        if changing:
            raise ConflictError(
                409,
                "Conflict",
                f"nodes {', '.join(changing)} kept changing: their hold is not lifted yet",
                target=f"nodes/{changing[0]}",
            )

    async def _confirm_unconsumed(self, namespace: str, request: str) -> None:
        """No pod of the namespace that still counts consumes `request` and that the pod
        cache has older or not at all, as the API server has them now; one that does is read
        into the cache (it was behind: a member released onto the request showed still gated
        there) and the decision made again. A pod the cache has as it is was seen by the
        decision (not a member of the group: its label removed, a copied manifest): sending
        the decision back on it would only bring the same decision again, for ever."""
        listed = await self._kube.list_objects(POD, namespace)
        pods = self._caches.pods.store
        using = []
        for item in listed.get("items") or []:
            pod = {"apiVersion": "v1", "kind": "Pod", **item}  # a list's items carry neither
            view = pod_of(pod)
            if view.consumes == request and view.live and pods.is_behind(pod):
                pods.put_if_newer(pod)
                using.append(view.name)
        if using:
            names = ", ".join(sorted(using))
            raise StaleDecisionError(f"pods {names} consume request {request}: it stays")

    async def _guard_scale_down(self, namespace: str, action: Action) -> None:
        """Set (or take off) the scale-down guard on each node as scaledown.py decides on the
        node as read: a conflict or a failed test reads it again (reclaim/guard.py); a node
        gone is done; a write refused (403) is logged and the next node goes on."""
        assert isinstance(action, GuardScaleDown)
        step = guard if action.on else unguard
        for name in action.nodes:
            node = self._caches.nodes.store.get(name) or await self._fresh(name)
            try:
                updated = await step(self._kube, node, action.request) if node else None
            except ForbiddenError as e:
                # An admission policy older than this version refuses the guard: the rest of
                # the decision goes on (the nodes are then as exposed as before it).
                log.warning("scale-down guard of node %s refused: %s", name, e.message)
                continue
            if updated is not None and updated is not node:
                self._caches.nodes.store.put_if_newer(updated)
                log.info(
                    "scale-down of node %s %s for %s",
                    name,
                    "disabled" if action.on else "enabled again",
                    action.request,
                )

    async def _fresh(self, node: str) -> Obj | None:
        try:
            return await self._kube.get(NODE, node)
        except NotFoundError:
            return None

    async def _reclaim_arrivals(self, namespace: str, action: Action) -> None:
        """Reclaim each arrived node safely, then record the outcome on the request (once)."""
        assert isinstance(action, ReclaimArrivals)
        events = EventRecorder(self._kube, clock=self._clock)
        outcome = await reclaim_arrivals(
            self._kube,
            action,
            self._clock(),
            events=events,
            metrics=self.metrics,
            told=self._caches,
        )
        if action.earlier:
            outcome = outcome.after(Outcome.from_annotation(action.earlier))
        record = self.sources.record(action.request, {OUTCOME_ANNOTATION: outcome.to_annotation()})
        await self.apply(namespace, record)

    async def _release_members(self, namespace: str, action: Action) -> None:
        """Annotate and pin each gated member, lifting the gate in the same write (a gated
        pod accepts new annotations and node selector entries). A member gone is skipped;
        a member changed meanwhile is re-read once."""
        assert isinstance(action, ReleaseMembers)

        async def release(name: str) -> None:
            for _ in range(2):
                pod = self._caches.pods.store.get(name, namespace)
                if pod is None:
                    return
                try:
                    await self._release_one(namespace, pod, action)
                    return
                except ConflictError:
                    fresh = await self._kube.get(POD, name, namespace)
                    self._caches.pods.store.put_if_newer(fresh)
                except NotFoundError:
                    return

        # side by side (`at_once`); a failure is raised once every other member is released
        failed = [e for e in await at_once(partial(release, n) for n in action.pods) if e]
        if failed:
            raise failed[0]
        log.info("released %d members in %s", len(action.pods), namespace)

    async def _release_one(self, namespace: str, pod: Obj, action: ReleaseMembers) -> None:
        spec = pod.get("spec") or {}
        gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != action.gate]
        selector = {**action.node_selector, **(spec.get("nodeSelector") or {})}
        patch: Obj = {
            "metadata": {"resourceVersion": pod["metadata"].get("resourceVersion", "")},
            "spec": {"schedulingGates": gates or None},
        }
        if action.annotations:
            patch["metadata"]["annotations"] = action.annotations
        if action.node_selector:
            patch["spec"]["nodeSelector"] = selector
        if action.tolerations:
            own = [dict(t) for t in spec.get("tolerations") or []]
            patch["spec"]["tolerations"] = own + [
                dict(t) for t in action.tolerations if dict(t) not in own
            ]
        try:
            updated = await self._kube.merge_patch(POD, pod["metadata"]["name"], patch, namespace)
        except InvalidError:
            if not action.node_selector:
                raise
            # The pod already names another value for a pinned key: lift the gate alone.
            del patch["spec"]["nodeSelector"]
            updated = await self._kube.merge_patch(POD, pod["metadata"]["name"], patch, namespace)
        self._caches.pods.store.put_if_newer(updated)


Handler = Callable[[Applier, str, Any], Awaitable[None]]
"""How an action is applied: by the applier (its client, caches, clock, metrics), in a
namespace (the gang's)."""

_APPLY: Mapping[type, Handler] = {
    ClaimNode: Applier._claim_node,
    ReclaimArrivals: Applier._reclaim_arrivals,
    ReleaseMembers: Applier._release_members,
    ReleaseHold: Applier._release_hold,
    GuardScaleDown: Applier._guard_scale_down,
}
