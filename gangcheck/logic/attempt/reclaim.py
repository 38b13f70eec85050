"""Safe reclaim, as invariants: which arrived node may be taken back, and what a rollback did.

A node is reclaimed only if it was recorded as arrived for this very request, is proven
younger than the request (``proven_younger``: created in a later second), carries no opt-out
label, and runs no pod other than DaemonSet pods, nor has one nominated to it. Pods of the
gang itself (those consuming the request) make the node wait ("drain") rather than stay: they
leave when Kueue evicts the gang. The edge asks again right before acting.

Undoing a fence touches only gangcheck's own keys: its taint (each removal guarded by a JSON
patch ``test`` of that very entry), the cordon it set, and its own annotation.

A node CordonAndTaint reclaimed stays, cordoned and tainted, for cluster-autoscaler's
scale-down; the fence label comes off (nothing of gangcheck's is left to act on it) and the
node records when it was left (``left_ops``). One still there ``LEFT_FOR_SCALE_DOWN_SECONDS``
later is said (``scale_down_watch``, ``not_removed_message``), never returned to service by
gangcheck (docs/reclaimers.md says why).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from gangcheck.logic.attempt.fulfillment import claim_of, proven_younger
from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.model.names import (
    FENCE_LABEL,
    OPT_OUT_LABEL,
    RECLAIM_TAINT,
    RECLAIM_WHEN_IDLE,
    RECLAIMED_AT,
)
from gangcheck.model.objects import Obj, Pod, json_pointer, tested_removal

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
    (binds allowed again), the mark only when `forget`, and ``RECLAIMED_AT`` (a node left
    before and fenced again, now unfenced, is left no more: a later ``left_ops`` records its
    own time, not the earlier one, so it is not said overdue at once). Empty when there is
    nothing of ours to undo."""
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
    if RECLAIMED_AT in annotations:
        ops += tested_removal("annotations", RECLAIMED_AT, annotations[RECLAIMED_AT])
    return ops


LEFT_FOR_SCALE_DOWN_SECONDS = 1800
"""How long a node CordonAndTaint left for cluster-autoscaler may stay before it is said:
three times the autoscaler's default ``--scale-down-unneeded-time`` (10 min), and past its
default ``--scale-down-unready-time`` (20 min), so a scale-down merely slow is not said."""


def left_ops(node: Obj, now: datetime) -> list[Obj]:
    """JSON patch ops completing CordonAndTaint's reclaim of the node as judged (its
    resourceVersion tested: a node changed since is read and judged again): the fence label
    off (binds, a DaemonSet's too, allowed again; the cordon and taint stay), the owed mark
    off, and when it was left (``RECLAIMED_AT``) on, unless it records an earlier time
    already (a reclaim run again on a node left before)."""
    meta = node.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    ops: list[Obj] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")}
    ]
    if FENCE_LABEL in labels:
        ops += tested_removal("labels", FENCE_LABEL, labels[FENCE_LABEL])
    if RECLAIM_WHEN_IDLE in annotations:
        ops += tested_removal("annotations", RECLAIM_WHEN_IDLE, annotations[RECLAIM_WHEN_IDLE])
    if RECLAIMED_AT in annotations:
        return ops
    at = format_time(now)
    if "annotations" in meta:
        path = json_pointer("metadata", "annotations", RECLAIMED_AT)
        return [*ops, {"op": "add", "path": path, "value": at}]
    return [*ops, {"op": "add", "path": "/metadata/annotations", "value": {RECLAIMED_AT: at}}]


LeftFate = Literal["none", "returned", "wait", "overdue"]


@dataclass(frozen=True)
class LeftWatch:
    """What becomes of a node as to its being left for scale-down: ``none`` (not left by
    CordonAndTaint), ``returned`` (its record stays but not gangcheck's taint: a person
    returned it to service; the record goes), ``wait`` (`seconds` until it is overdue),
    ``overdue`` (still there past the bound: said)."""

    fate: LeftFate
    seconds: float = 0.0
    since: datetime | None = None


def left_for(node: Obj, request: str) -> bool:
    """Whether CordonAndTaint already left the node for cluster-autoscaler for `request`'s
    reclaim (``RECLAIMED_AT`` on, gangcheck's taint on, no mark owed, recorded as arrived for
    `request`): a reclaim of it run again (its outcome's write lost) is done, not begun
    again (fencing it again would judge binds its leaving allowed since)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return (
        RECLAIMED_AT in annotations
        and RECLAIM_WHEN_IDLE not in annotations
        and bool(our_taint_indices(node))
        and claim_of(node) == request
    )


def scale_down_watch(node: Obj, now: datetime) -> LeftWatch:
    """The watch over a node CordonAndTaint left for cluster-autoscaler's scale-down, from
    its ``RECLAIMED_AT`` (an unreadable time counts as overdue: it says it was left)."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(RECLAIMED_AT)
    if raw is None:
        return LeftWatch("none")
    if not our_taint_indices(node):
        return LeftWatch("returned")
    since = parse_time(str(raw))
    if since is None:
        return LeftWatch("overdue")
    left = LEFT_FOR_SCALE_DOWN_SECONDS - (now - since).total_seconds()
    return LeftWatch("wait", left, since) if left > 0 else LeftWatch("overdue", 0.0, since)


def not_removed_message(node: Obj, since: datetime | None) -> str:
    """What a node left for scale-down and still there says: the likely causes (what keeps
    cluster-autoscaler from removing a node) and what a person can do."""
    name = (node.get("metadata") or {}).get("name", "")
    request = claim_of(node) or "an earlier attempt"
    when = f"at {format_time(since)}" if since else "earlier"
    return (
        f"node {name}, arrived for {request}, was reclaimed by CordonAndTaint {when}: left "
        f"cordoned and tainted {RECLAIM_TAINT}=true:NoSchedule for cluster-autoscaler's "
        f"scale-down, it is still here after {LEFT_FOR_SCALE_DOWN_SECONDS // 60} min, paid for "
        "and taking no new pods. Likely its node group is at its min size, or scale-down is "
        "disabled (--scale-down-enabled=false, the node's "
        "cluster-autoscaler.kubernetes.io/scale-down-disabled) or held up (a pod that blocks "
        "it, --scale-down-unneeded-time). To use it: kubectl uncordon "
        f"{name} && kubectl taint nodes {name} {RECLAIM_TAINT}-; to be rid of it: lower the "
        "node group's min size, or remove the node and its machine"
    )
