"""Reclaim one arrived node safely: judge, fence, let binds in flight land, judge again with
fresh pods, then act; and say which of four things happened.

Fencing (cordon, the `gangcheck.io/reclaiming` taint and label, written with the node's
resourceVersion as precondition) keeps the scheduler from placing pods that do not tolerate
it. Cordon and taint cannot stop a pod tolerating every taint, nor a pod whose spec.nodeName
is set directly, and binding a pod does not change the Node: so after fencing gangcheck waits
``SETTLE_SECONDS`` for binds already under way (and for kube-apiserver to see the label),
lists again the pods bound or nominated to the node, and acts only if none but DaemonSet pods
are there, with the resourceVersion of the node it judged. A pod found there wins: the fence
is undone and the node kept. What remains is one round trip, between that last list and the
act, that no precondition covers (a bind does not touch the Node). The fence policy
(manifests/base/fence-policy.yaml) closes it where it is installed: kube-apiserver refuses
every bind to a node with the label. Without it, or should it let one through, a pod bound
then is named in the result (``bound_too_late``) and reported, never lost silently.

The fence is recorded in the same patch (the `reclaim-when-idle` mark, with whether the node
was cordoned before), so a reclaim interrupted after fencing is completed or undone by the
draining-node reconciler after a restart. Before anything is judged, the scale-down guard
gangcheck set on the node for this request while it was kept for a top-up
(logic/attempt/scaledown.py) is taken off: a node reclaimed, or kept and so given back to the
pool, does not keep it. Results:
- ``reclaimed`` / ``gone``: done (a node already gone is done, not kept; so is the reclaim
  a mark owed, once the mark is gone: another reclaim of the node completed or undid it). A
  reclaimer that deletes forgets the mark after (the fence stays until the node goes); one
  that leaves the node (CordonAndTaint) completes in one write on the node as judged: the
  fence label and mark off, ``gangcheck.io/reclaimed-at`` on, cordon and taint kept for
  cluster-autoscaler (``_leave``; docs/reclaimers.md says why the label may go);
- ``keep``: a safety rule keeps the node, final, with the reason; the fence and mark go. A
  fence the API server refuses for what it is (a policy, a webhook:
  kube.errors.refused_as_written; not the authorizer's 403, a right of gangcheck's missing,
  which raises and is retried) keeps it too, with the server's message: a node that could
  not be fenced is never reclaimed, and the other nodes of the rollback go on;
- ``drain``: the gang's own pods are still there; the mark stays, the fence goes;
- ``failed``: an error (403, retries exhausted, a node that kept changing); the fence goes,
  the mark stays, and the draining-node reconciler retries with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import (
    ApiError,
    ConflictError,
    FencedError,
    NotFoundError,
    refused_as_written,
)
from gangcheck.kube.resources import NODE, POD
from gangcheck.logic.attempt.reclaim import (
    RECLAIM_TAINT_ENTRY,
    Judgement,
    held_seconds,
    is_fenced,
    judge,
    left_for,
    left_ops,
    pods_that_keep,
    unfence_ops,
)
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.names import FENCE_LABEL, RECLAIM_TAINT, RECLAIM_WHEN_IDLE
from gangcheck.model.objects import Obj, pod_of
from gangcheck.reclaim.guard import unguard
from gangcheck.reclaim.reclaimers import NOT_CACHED, RECLAIMERS, ReclaimRefused, Told
from gangcheck.reclaim.turns import Turns

log = logging.getLogger(__name__)
ATTEMPTS = 5
SETTLE_SECONDS = 1.0
"""After fencing, how long binds already decided (before the fence was seen) get to land."""

ReclaimResult = Literal["reclaimed", "gone", "drain", "keep", "failed"]
_locks: Turns[str] = Turns()
"""Per node: one reclaim of it at a time (the applier, the draining-node reconciler)."""


@dataclass(frozen=True)
class Target:
    """A node and the request it arrived for."""

    node: str
    request: str
    request_created: str
    reclaimer: str
    was_cordoned: bool = False
    """Whether the node was cordoned before gangcheck fenced it (kept so after an unfence)."""

    def mark(self) -> str:
        return json.dumps(
            {
                "request": self.request,
                "requestCreated": self.request_created,
                "reclaimer": self.reclaimer,
                "wasCordoned": self.was_cordoned,
            },
            sort_keys=True,
        )

    @classmethod
    def from_mark(cls, node: str, raw: str) -> Target | None:
        try:
            data = json.loads(raw)
            return cls(
                node,
                str(data["request"]),
                str(data["requestCreated"]),
                str(data["reclaimer"]),
                bool(data.get("wasCordoned", False)),
            )
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class Result:
    verdict: ReclaimResult
    reason: str = ""
    held_seconds: int = 0
    node_uid: str = ""
    bound_too_late: tuple[str, ...] = ()
    """Pods (ns/name) bound to a reclaimed node between the last look and the act."""
    cause: str = ""
    """A failure's cause in one word, from a few: the API's reason (`Forbidden`,
    `ConnectionError`, ...; `failure_cause`) or `NodeChanging`; for a node kept, the API's
    reason when the server forced it (its fence refused), else empty."""


NODE_CHANGING = "NodeChanging"
"""The cause of a reclaim that failed because the node kept changing under it."""


def failure_cause(error: ApiError) -> str:
    """The API's reason for a failed call when it is one CamelCase word (a StatusReason:
    `Forbidden`, `InternalError`, gangcheck's `ConnectionError`), else its status class
    (``5xx``): never free text, so counting by it stays bounded."""
    if re.fullmatch(r"[A-Z][A-Za-z]{0,39}", error.reason):
        return error.reason
    return f"{error.status // 100}xx" if error.status else "Unknown"


async def reclaim_safely(
    kube: Kube,
    target: Target,
    now: datetime,
    *,
    settle_seconds: float = SETTLE_SECONDS,
    owed: bool = False,
    told: Told = NOT_CACHED,
) -> Result:
    """Reclaim the node if every safety rule allows it; one reclaim per node at a time.
    `owed`: the reclaim a node's mark owes (the draining-node reconciler), done only while
    the node, read once this reclaim's turn has come, still carries the mark: a reclaim that
    held the node meanwhile may have completed or undone it. `told`: the caches, told of the
    reclaimer's delete (of the Node, of its NodeClaim) as soon as it is answered."""
    async with _locks.of(target.node):
        return await _reclaim(kube, target, now, settle_seconds, owed=owed, told=told)


async def _reclaim(
    kube: Kube, target: Target, now: datetime, settle_seconds: float, *, owed: bool, told: Told
) -> Result:
    node = await _get(kube, target.node)
    if node is None:
        return Result("gone", "node no longer exists")
    if owed and _marked_for(node) != target.request:
        return Result("gone", "no longer owed a reclaim: done or kept meanwhile", 0, _uid(node))
    if left_for(node, target.request):  # run again, its outcome's write lost: done already
        done = "cordoned and tainted for scale-down (left before)"
        return Result("reclaimed", done, held_seconds(node, now), _uid(node))
    try:  # what goes back to the pool, or is kept, is no longer kept for a top-up
        unguarded = await unguard(kube, node, target.request)
    except ApiError as e:
        await _hold(kube, node, target)
        return Result(
            "failed",
            f"scale-down guard: {e.status} {e.reason}",
            node_uid=_uid(node),
            cause=failure_cause(e),
        )
    if unguarded is None:
        return Result("gone", "node no longer exists")
    node = unguarded
    if target.reclaimer not in RECLAIMERS:
        return Result("keep", f"reclaimer {target.reclaimer}: nodes are left alone")
    target = _with_cordon(target, node)
    judged = await _judge(kube, node, target)
    if judged.verdict != "reclaim":
        return await _stand_down(kube, node, target, judged)
    fenced = await _fence_fresh(kube, node, target)
    if isinstance(fenced, Result):
        return fenced
    judged = await _judge(kube, fenced, target)
    if judged.verdict != "reclaim":
        return await _stand_down(kube, fenced, target, judged)
    await asyncio.sleep(settle_seconds)
    fresh = await _get(kube, target.node)
    if fresh is None:
        return Result("gone", "node no longer exists")
    return await _recheck_and_act(kube, fresh, target, now, told)


def _with_cordon(target: Target, node: Obj) -> Target:
    """Whether the node was cordoned before gangcheck: from its mark when gangcheck fenced it
    already (a reclaim resumed), else from the node as it is now."""
    raw = (node["metadata"].get("annotations") or {}).get(RECLAIM_WHEN_IDLE)
    marked = Target.from_mark(target.node, raw) if raw else None
    if marked is not None and marked.request == target.request:
        cordoned = marked.was_cordoned
    elif any(t.get("key") == RECLAIM_TAINT for t in (node.get("spec") or {}).get("taints") or []):
        cordoned = False
    else:
        cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    return Target(target.node, target.request, target.request_created, target.reclaimer, cordoned)


async def _judge(kube: Kube, node: Obj, target: Target) -> Judgement:
    """Judge with the pods bound to the node and those nominated to it, listed now."""
    name = node["metadata"]["name"]
    bound = await kube.list_objects(POD, field_selector=f"spec.nodeName={name}")
    nominated = await kube.list_objects(POD, field_selector=f"status.nominatedNodeName={name}")
    pods = [pod_of(p) for p in (*(bound.get("items") or []), *(nominated.get("items") or []))]
    created = parse_time(target.request_created)
    return judge(node, pods, request=target.request, request_created=created)


async def _recheck_and_act(
    kube: Kube, fenced: Obj, target: Target, now: datetime, told: Told
) -> Result:
    """Judge the fenced node again with fresh pods, act on exactly the node judged; a node
    that changed (a status heartbeat) is read and judged again, a few times."""
    for _ in range(ATTEMPTS):
        judged = await _judge(kube, fenced, target)
        if judged.verdict != "reclaim":
            return await _stand_down(kube, fenced, target, judged)
        acted = await _act(kube, fenced, target, now, told)
        if isinstance(acted, Result):
            return acted
        fenced = acted
    await _hold(kube, fenced, target)
    return Result(
        "failed",
        "node kept changing while being reclaimed",
        node_uid=_uid(fenced),
        cause=NODE_CHANGING,
    )


async def _act(kube: Kube, fenced: Obj, target: Target, now: datetime, told: Told) -> Result | Obj:
    """Run the reclaimer and classify what happened; the node as it is now when it changed
    since it was judged (still fenced: judge it again)."""
    uid, failed = _uid(fenced), f"{target.reclaimer} failed"
    reclaimer = RECLAIMERS[target.reclaimer]
    try:
        done = await reclaimer.reclaim(kube, fenced, told)
        if reclaimer.leaves_node:
            await _leave(kube, fenced, now)
    except ConflictError:
        current = await _get(kube, target.node)
        if current is None:
            return Result("gone", "node no longer exists", node_uid=uid)
        if not is_fenced(current):
            await _kept(kube, current, target)
            await _undo(kube, current, target, forget=True)
            return Result("keep", "unfenced by someone else while being reclaimed", 0, uid)
        return current
    except ReclaimRefused as e:
        await _undo(kube, fenced, target, forget=True)
        return Result("keep", str(e), node_uid=uid)
    except ApiError as e:  # 403 (the reclaimer's RBAC component missing), retries exhausted
        if isinstance(e, NotFoundError) and await _get(kube, target.node) is None:
            return Result("gone", "node no longer exists", node_uid=uid)
        await _hold(kube, fenced, target)
        return Result(
            "failed", f"{failed}: {e.status} {e.reason}", node_uid=uid, cause=failure_cause(e)
        )
    if not reclaimer.leaves_node:
        await _forget(kube, target.node)
    log.info("reclaimed node %s: %s", target.node, done, extra={"request": target.request})
    # A node left (its fence label off in the same write) admits binds again: those are not
    # late, and are not reported as such.
    late = () if reclaimer.leaves_node else await _bound_too_late(kube, target)
    return Result("reclaimed", done, held_seconds(fenced, now), uid, late)


async def _bound_too_late(kube: Kube, target: Target) -> tuple[str, ...]:
    """Pods bound to the node in the one round trip between the last look and the act (no
    precondition covers it): named, so they are reported, never silently lost."""
    listed = await kube.list_objects(POD, field_selector=f"spec.nodeName={target.node}")
    late = pods_that_keep([pod_of(p) for p in listed.get("items") or []], target.request)
    if late:
        log.error(
            "node %s was reclaimed as pods were bound to it: %s",
            target.node,
            ", ".join(late),
            extra={"request": target.request},
        )
    return late


async def _stand_down(kube: Kube, node: Obj, target: Target, judged: Judgement) -> Result:
    """Not now: undo gangcheck's fence; a node kept forgets its mark, a draining one keeps it."""
    uid = _uid(node)
    if judged.verdict == "keep":
        if _marked_for(node) in (target.request, None):
            await _kept(kube, node, target)
            await _undo(kube, node, target, forget=True)
        return Result("keep", judged.reason, node_uid=uid)
    await _hold(kube, node, target)
    return Result("drain", judged.reason, node_uid=uid)


async def _kept(kube: Kube, node: Obj, target: Target) -> None:
    """A node kept: what an earlier try of its reclaimer left that would remove it later
    comes off (DeleteMachine: its Machine's mark, the decrement not made), before the node's
    own mark goes (a lease lost raises with the node still owed: the next leader keeps it
    again). Failing otherwise, it stays, logged: the node is kept all the same."""
    try:
        await RECLAIMERS[target.reclaimer].kept(kube, node)
    except FencedError:
        raise
    except ApiError as e:
        log.warning(
            "node %s kept, what %s left of an earlier try stays: %s",
            target.node,
            target.reclaimer,
            e.message,
            extra={"request": target.request},
        )


async def _hold(kube: Kube, node: Obj, target: Target) -> None:
    """Undo the fence, keep (or write) the mark: the node is to be reclaimed later."""
    current = await _undo(kube, node, target, forget=False)
    if current is not None:
        await _mark(kube, current, target)


def _marked_for(node: Obj) -> str | None:
    raw = (node["metadata"].get("annotations") or {}).get(RECLAIM_WHEN_IDLE)
    marked = Target.from_mark(node["metadata"]["name"], raw) if raw else None
    return marked.request if marked else None


async def _fence_fresh(kube: Kube, node: Obj, target: Target) -> Obj | Result:
    """Fence with the resourceVersion read; on a conflict read the node and judge again."""
    for _ in range(ATTEMPTS):
        try:
            return await _fence(kube, node, target)
        except ConflictError:
            current = await _get(kube, target.node)
            if current is None:
                return Result("gone", "node no longer exists")
            judged = await _judge(kube, current, target)
            if judged.verdict != "reclaim":
                return await _stand_down(kube, current, target, judged)
            node = current
        except ApiError as e:
            if not refused_as_written(e):  # a 5xx; the authorizer's 403: retried, backed off
                raise
            return await _not_fenced(kube, node, target, e)
    await _hold(kube, node, target)
    return Result(
        "failed", "node kept changing while being fenced", node_uid=_uid(node), cause=NODE_CHANGING
    )


async def _not_fenced(kube: Kube, node: Obj, target: Target, error: ApiError) -> Result:
    """The API server refused the fence for what it is (a ValidatingAdmissionPolicy, a
    webhook: `refused_as_written`): the node, never reclaimed unfenced, is kept, final, with
    the server's message; the patch wrote nothing. A mark of this request's left by an
    earlier pass (drain, failed) goes, as a kept node's does; where that is refused too it
    stays, logged. Said as any kept node is (reclaim.arrivals.tell: an Event on the Node, a
    log line)."""
    if _marked_for(node) == target.request:
        await _kept(kube, node, target)
        try:
            await _undo(kube, node, target, forget=True)
        except ApiError as e:
            log.warning("node %s: its reclaim mark stays: %s", target.node, e.message)
    reason = f"its fence was refused ({error.status} {error.reason}): {error.message}"
    return Result("keep", reason, node_uid=_uid(node), cause=failure_cause(error))


def _uid(node: Obj) -> str:
    return str(node["metadata"].get("uid", ""))


async def _fence(kube: Kube, node: Obj, target: Target) -> Obj:
    """Cordon, taint, label (binds refused by the fence policy) and record the fence in one
    write, on the node as read (resourceVersion): the whole taint list is written, so the
    precondition is what keeps others' taints."""
    meta, spec = node["metadata"], node.get("spec") or {}
    taints = [t for t in spec.get("taints") or [] if t.get("key") != RECLAIM_TAINT]
    patch = {
        "metadata": {
            "resourceVersion": meta["resourceVersion"],
            "labels": {FENCE_LABEL: "true"},
            "annotations": {RECLAIM_WHEN_IDLE: target.mark()},
        },
        "spec": {"unschedulable": True, "taints": [*taints, RECLAIM_TAINT_ENTRY]},
    }
    return await kube.merge_patch(NODE, meta["name"], patch)


async def _undo(kube: Kube, node: Obj, target: Target, *, forget: bool) -> Obj | None:
    """Remove gangcheck's fence (and, with `forget`, its mark) and nothing else; a test that
    fails because another writer changed the node is read again. The node after, or None."""
    for _ in range(ATTEMPTS):
        ops = unfence_ops(node, was_cordoned=target.was_cordoned, forget=forget)
        if not ops:
            return node
        try:
            return await kube.json_patch(NODE, target.node, ops)
        except NotFoundError:
            return None
        except ConflictError:
            fresh = await _get(kube, target.node)
            if fresh is None:
                return None
            node = fresh
    raise ConflictError(409, "Conflict", f"node {target.node} kept changing while unfenced")


async def _get(kube: Kube, name: str) -> Obj | None:
    try:
        return await kube.get(NODE, name)
    except NotFoundError:
        return None


async def _mark(kube: Kube, node: Obj, target: Target) -> None:
    if (node["metadata"].get("annotations") or {}).get(RECLAIM_WHEN_IDLE) == target.mark():
        return
    patch = {"metadata": {"annotations": {RECLAIM_WHEN_IDLE: target.mark()}}}
    with contextlib.suppress(NotFoundError):
        await kube.merge_patch(NODE, node["metadata"]["name"], patch)


async def _leave(kube: Kube, fenced: Obj, now: datetime) -> Obj:
    """Complete a reclaim whose node stays (CordonAndTaint): on the node as judged, its fence
    label and mark off, when it was left on (`left_ops`), in one write. The cordon and taint
    stay for the scale-down; the label is needed no longer: gangcheck acts on nothing more,
    and what cluster-autoscaler drains is by its own rules. A node changed since it was
    judged (a failed test) raises ConflictError: read and judged again (`_act`)."""
    return await kube.json_patch(NODE, fenced["metadata"]["name"], left_ops(fenced, now))


async def _forget(kube: Kube, node: str) -> None:
    """Drop the mark once the reclaimer deleted the node or what backs it (its fence stays
    until the node goes: completed)."""
    with contextlib.suppress(NotFoundError):
        await kube.merge_patch(NODE, node, {"metadata": {"annotations": {RECLAIM_WHEN_IDLE: None}}})
