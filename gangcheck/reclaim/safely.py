"""Reclaim one arrived node safely: judge, fence, judge again with fresh pods, then act.

Fencing (cordon plus the `gangcheck.io/reclaiming` taint, written with the node's
resourceVersion as precondition) stops new pods from landing; the pods on the node are then
listed afresh, so a pod bound in the meantime wins and the node is unfenced and kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime

from gangcheck.kube.client import Kube, Obj
from gangcheck.kube.errors import ApiError, ConflictError, NotFoundError
from gangcheck.kube.resources import NODE, POD
from gangcheck.logic.reclaim import RECLAIM_TAINT, RECLAIM_WHEN_IDLE, Judgement, held_seconds, judge
from gangcheck.logic.timefmt import parse_time
from gangcheck.reclaim.reclaimers import RECLAIMERS, ReclaimRefused

log = logging.getLogger(__name__)
ATTEMPTS = 5


@dataclass(frozen=True)
class Target:
    """A node and the request it arrived for."""

    node: str
    request: str
    request_created: str
    reclaimer: str

    def mark(self) -> str:
        return json.dumps(
            {
                "request": self.request,
                "requestCreated": self.request_created,
                "reclaimer": self.reclaimer,
            },
            sort_keys=True,
        )

    @classmethod
    def from_mark(cls, node: str, raw: str) -> Target | None:
        try:
            data = json.loads(raw)
            return cls(
                node, str(data["request"]), str(data["requestCreated"]), str(data["reclaimer"])
            )
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class Result:
    verdict: str  # reclaimed | drain | keep | gone
    reason: str = ""
    held_seconds: int = 0


async def reclaim_safely(kube: Kube, target: Target, now: datetime) -> Result:
    if target.reclaimer not in RECLAIMERS:
        return Result("keep", f"reclaimer {target.reclaimer}: nodes are left alone")
    try:
        node = await kube.get(NODE, target.node)
    except NotFoundError:
        return Result("gone", "node no longer exists")
    first = await _judge(kube, node, target)
    if first.verdict == "keep":
        return Result("keep", first.reason)
    if first.verdict == "drain":
        await _mark_drain(kube, node, target)
        return Result("drain", first.reason)
    result = await _fence_and_reclaim(kube, node, target, now)
    current = await _get(kube, target.node) if result.verdict == "drain" else None
    if current is not None:
        await _mark_drain(kube, current, target)
    return result


async def _judge(kube: Kube, node: Obj, target: Target) -> Judgement:
    pods = await kube.list_objects(POD, field_selector=f"spec.nodeName={node['metadata']['name']}")
    created = parse_time(target.request_created)
    return judge(node, pods.get("items") or [], request=target.request, request_created=created)


async def _fence_and_reclaim(kube: Kube, node: Obj, target: Target, now: datetime) -> Result:
    """Fence, judge again with fresh pods, act; a node that changed (a status heartbeat) is
    read and judged again, a few times, never acted on with a stale view."""
    was_cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    fenced = await _fence_fresh(kube, node, target)
    if isinstance(fenced, Result):
        return fenced
    for _ in range(ATTEMPTS):
        judged = await _judge(kube, fenced, target)
        if judged.verdict != "reclaim":
            await _unfence(kube, fenced, was_cordoned=was_cordoned)
            return Result("keep" if judged.verdict == "keep" else "drain", judged.reason)
        try:
            done = await RECLAIMERS[target.reclaimer].reclaim(kube, fenced)
        except ConflictError:
            current = await _get(kube, target.node)
            if current is None:
                return Result("gone", "node no longer exists")
            if not _is_fenced(current):
                return Result("keep", "unfenced by someone else while being reclaimed")
            fenced = current
            continue
        except ReclaimRefused as e:
            await _unfence(kube, fenced, was_cordoned=was_cordoned)
            return Result("keep", str(e))
        except ApiError as e:  # e.g. 403: the reclaimer's RBAC component is not installed
            await _unfence(kube, fenced, was_cordoned=was_cordoned)
            return Result("keep", f"{target.reclaimer} refused: {e.status} {e.reason}")
        log.info("reclaimed node %s: %s", target.node, done, extra={"request": target.request})
        return Result("reclaimed", done, held_seconds(node, now))
    await _unfence(kube, fenced, was_cordoned=was_cordoned)
    return Result("keep", "node kept changing while being reclaimed; judged again next time")


async def _fence_fresh(kube: Kube, node: Obj, target: Target) -> Obj | Result:
    """Fence with the resourceVersion read; on a conflict read the node and judge again."""
    for _ in range(ATTEMPTS):
        try:
            return await _fence(kube, node)
        except ConflictError:
            current = await _get(kube, target.node)
            if current is None:
                return Result("gone", "node no longer exists")
            judged = await _judge(kube, current, target)
            if judged.verdict != "reclaim":
                return Result("keep" if judged.verdict == "keep" else "drain", judged.reason)
            node = current
    return Result("keep", "node kept changing while being fenced; judged again next time")


async def _get(kube: Kube, name: str) -> Obj | None:
    try:
        return await kube.get(NODE, name)
    except NotFoundError:
        return None


def _is_fenced(node: Obj) -> bool:
    spec = node.get("spec") or {}
    return bool(spec.get("unschedulable")) and any(
        t.get("key") == RECLAIM_TAINT for t in spec.get("taints") or []
    )


async def _fence(kube: Kube, node: Obj) -> Obj:
    meta, spec = node["metadata"], node.get("spec") or {}
    taints = [t for t in spec.get("taints") or [] if t.get("key") != RECLAIM_TAINT]
    taints.append({"key": RECLAIM_TAINT, "value": "true", "effect": "NoSchedule"})
    patch = {
        "metadata": {"resourceVersion": meta["resourceVersion"]},
        "spec": {"unschedulable": True, "taints": taints},
    }
    return await kube.merge_patch(NODE, meta["name"], patch)


async def _unfence(kube: Kube, node: Obj, *, was_cordoned: bool) -> None:
    spec = node.get("spec") or {}
    taints = [t for t in spec.get("taints") or [] if t.get("key") != RECLAIM_TAINT]
    patch = {
        "metadata": {"annotations": {RECLAIM_WHEN_IDLE: None}},
        "spec": {"unschedulable": True if was_cordoned else None, "taints": taints or None},
    }
    with contextlib.suppress(NotFoundError):
        await kube.merge_patch(NODE, node["metadata"]["name"], patch)


async def _mark_drain(kube: Kube, node: Obj, target: Target) -> None:
    if (node["metadata"].get("annotations") or {}).get(RECLAIM_WHEN_IDLE) == target.mark():
        return
    patch = {"metadata": {"annotations": {RECLAIM_WHEN_IDLE: target.mark()}}}
    await kube.merge_patch(NODE, node["metadata"]["name"], patch)


async def forget_drain(kube: Kube, node: str) -> None:
    """Drop the reclaim-when-idle mark (the node is kept)."""
    with contextlib.suppress(NotFoundError):
        await kube.merge_patch(NODE, node, {"metadata": {"annotations": {RECLAIM_WHEN_IDLE: None}}})
