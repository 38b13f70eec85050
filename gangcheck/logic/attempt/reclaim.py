"""Safe reclaim, as invariants: which arrived node may be taken back, and what a rollback did.

A node is reclaimed only if it was recorded as arrived for this very request, is proven
younger than the request (``proven_younger``: created in a later second), carries no opt-out
label, and runs no pod other than DaemonSet pods, nor has one nominated to it. Pods of the
gang itself (those consuming the request) make the node wait ("drain") rather than stay: they
leave when Kueue evicts the gang. The edge asks again right before acting.

Undoing a fence touches only gangcheck's own keys: its taint (each removal guarded by a JSON
patch ``test`` of that very entry), the cordon it set, and its own annotation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from gangcheck.logic.attempt.fulfillment import claim_of, proven_younger
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.names import (
    FENCE_LABEL,
    OPT_OUT_LABEL,
    RECLAIM_TAINT,
    RECLAIM_WHEN_IDLE,
)
from gangcheck.model.objects import Obj, Pod, tested_removal

RECLAIM_TAINT_ENTRY = {"key": RECLAIM_TAINT, "value": "true", "effect": "NoSchedule"}

NodeFate = Literal["reclaim", "drain", "keep"]


@dataclass(frozen=True)
class Judgement:
    verdict: NodeFate
    reason: str = ""


def judge(
    node: Obj, pods_on_node: Iterable[Pod], *, request: str, request_created: datetime | None
) -> Judgement:
    """May this node, arrived for `request` (`ns/name`), be reclaimed now?"""
    meta = node.get("metadata", {})
    if (meta.get("labels") or {}).get(OPT_OUT_LABEL) is not None:
        return Judgement("keep", f"carries the opt-out label {OPT_OUT_LABEL}")
    if claim_of(node) != request:
        owner = claim_of(node) or "no request"
        return Judgement("keep", f"recorded for {owner}, not {request}")
    if not proven_younger(node, request_created):
        return Judgement(
            "keep", "not proven younger than the request (created the same second or before)"
        )
    return _judge_pods(pods_on_node, request.split("/", 1)[-1])


def _judge_pods(pods: Iterable[Pod], request_name: str) -> Judgement:
    gang_pods = []
    for pod in pods:
        if pod.finished or pod.daemonset:
            continue
        if pod.consumes != request_name:
            if not pod.node_name:
                return Judgement("keep", f"pod {pod.ref.key} is nominated to it")
            return Judgement("keep", f"runs pod {pod.ref.key}")
        gang_pods.append(pod)
    if gang_pods:
        return Judgement("drain", f"{len(gang_pods)} gang pods still on it")
    return Judgement("reclaim")


def pods_that_keep(pods: Iterable[Pod], request: str) -> tuple[str, ...]:
    """The pods (ns/name) that would keep a node: neither finished, nor DaemonSet pods, nor
    pods of the gang of `request` (`ns/name`)."""
    request_name = request.split("/", 1)[-1]
    return tuple(
        p.ref.key for p in pods if not p.finished and not p.daemonset and p.consumes != request_name
    )


def held_seconds(node: Obj, now: datetime) -> int:
    born = parse_time(node.get("metadata", {}).get("creationTimestamp", ""))
    return max(0, int((now - born).total_seconds())) if born else 0


def our_taint_indices(node: Obj) -> list[int]:
    taints = (node.get("spec") or {}).get("taints") or []
    return [i for i, t in enumerate(taints) if t.get("key") == RECLAIM_TAINT]


def is_fenced(node: Obj) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable")) and bool(our_taint_indices(node))


def unfence_ops(node: Obj, *, was_cordoned: bool, forget: bool) -> list[Obj]:
    """JSON patch ops that undo gangcheck's fence and nothing else: each taint of ours is
    tested before it is removed (another writer's taint added or removed meanwhile fails the
    test, never gets dropped), the cordon goes only if gangcheck set it, the fence label
    (binds allowed again), and the mark only when `forget`. Empty when there is nothing of
    ours to undo."""
    spec = node.get("spec") or {}
    taints = spec.get("taints") or []
    ops: list[Obj] = []
    ours = our_taint_indices(node)
    for i in reversed(ours):
        ops += [{"op": "test", "path": f"/spec/taints/{i}", "value": taints[i]},
                {"op": "remove", "path": f"/spec/taints/{i}"}]  # fmt: skip
    if ours and not was_cordoned and spec.get("unschedulable"):
        ops += [{"op": "test", "path": "/spec/unschedulable", "value": True},
                {"op": "remove", "path": "/spec/unschedulable"}]  # fmt: skip
    meta = node.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if FENCE_LABEL in labels:
        ops += tested_removal("labels", FENCE_LABEL, labels[FENCE_LABEL])
    if forget and RECLAIM_WHEN_IDLE in annotations:
        ops += tested_removal("annotations", RECLAIM_WHEN_IDLE, annotations[RECLAIM_WHEN_IDLE])
    return ops
