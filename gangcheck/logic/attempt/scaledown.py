"""Kept nodes are kept from cluster-autoscaler's scale-down until the attempt ends (issue 32).

cluster-autoscaler books capacity only for a ``Provisioned`` request (processors/provreq,
``bookCapacity``): a request kept for a top-up (topup.py) that ended ``Failed`` has no
booking, and a kept request past its own deadline loses it when the booking expires. Its
nodes are empty (the hold keeps every other pod off them and the gang's pods are not there
yet), so once the autoscaler's unneeded time passes (``--scale-down-unneeded-time``, 10 min
by default) they are scaled away under the gang and the top-up is doomed.

So, while a request is kept, each node that arrived for it carries the autoscaler's own
opt-out, ``cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"`` (the autoscaler
skips a node whose annotation has exactly that value: core/scaledown/eligibility,
``HasNoScaleDownAnnotation``), with gangcheck's record ``SCALE_DOWN_GUARD=<namespace>/<request>``
in the same write. It is set only on a node that carries neither (someone else's value, any
value, is left alone and never recorded as ours), written at the node's resourceVersion. It
is removed only where that record names the request, each key tested before it is removed
(someone who changed the value meanwhile keeps it; the record goes alone): when the attempt
ends, with the hold (``lifecycle.release_hold``: the gang has started, the attempt is
withdrawn), and before a safe reclaim of the node judges it (reclaim/safely.py), so no node
goes back to the pool with it. Both live on the Node: a restart resumes from them.

Karpenter's ``karpenter.sh/do-not-disrupt`` on a gang's NodeClaims is the same idea; both
are taken off with ``removal``.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gangcheck.logic.attempt import rollback
from gangcheck.logic.attempt.actions import GuardScaleDown
from gangcheck.logic.attempt.fulfillment import ClusterView, claim_of, request_key
from gangcheck.logic.attempt.records import AttemptPhase
from gangcheck.model.names import SCALE_DOWN_GUARD
from gangcheck.model.objects import Obj, ProvisioningRequest, tested_removal

#: cluster-autoscaler's annotation marking a node as not eligible for scale-down
#: (core/scaledown/eligibility, ``ScaleDownDisabledKey``); only the value "true" counts.
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def removal(obj: Mapping[str, Any], key: str, value: str = "true") -> list[Obj]:
    """JSON patch ops removing the annotation `key` from `obj` if it has `value`, tested
    first (a value changed meanwhile fails the patch, never gets dropped); empty when the
    annotation has another value or none."""
    if _annotations(obj).get(key) != value:
        return []
    return tested_removal("annotations", key, value)


def guarded_for(node: Mapping[str, Any]) -> str:
    """The request (``namespace/name``) gangcheck disabled the node's scale-down for, or ""."""
    return str(_annotations(node).get(SCALE_DOWN_GUARD, ""))


def needs_guard(node: Mapping[str, Any], request: str) -> bool:
    """Whether gangcheck sets the guard on this node for `request`: it arrived for it, and
    carries neither the autoscaler's annotation (anyone's, any value) nor a record of ours."""
    notes = _annotations(node)
    return (
        claim_of(dict(node)) == request
        and SCALE_DOWN_DISABLED not in notes
        and SCALE_DOWN_GUARD not in notes
    )


def guard_patch(node: Mapping[str, Any], request: str) -> Obj | None:
    """The merge patch setting the guard for `request`, at the node's resourceVersion (what
    `needs_guard` judged is what is written over); None when the node needs none."""
    if not needs_guard(node, request):
        return None
    meta = node.get("metadata") or {}
    return {
        "metadata": {
            "resourceVersion": meta.get("resourceVersion", ""),
            "annotations": {SCALE_DOWN_DISABLED: "true", SCALE_DOWN_GUARD: request},
        }
    }


def unguard_ops(node: Mapping[str, Any], request: str) -> list[Obj]:
    """JSON patch ops taking off the guard gangcheck set for `request` and nothing else: its
    record, and the autoscaler's annotation while it still says "true" (both tested).
    Empty when the node carries no record of ours for `request`."""
    if guarded_for(node) != request:
        return []
    return [*removal(node, SCALE_DOWN_GUARD, request), *removal(node, SCALE_DOWN_DISABLED)]


def _named(nodes: Iterable[Mapping[str, Any]], names: Iterable[str]) -> list[Mapping[str, Any]]:
    wanted = set(names)
    return [n for n in nodes if (n.get("metadata") or {}).get("name") in wanted]


def guard(
    kept: Sequence[ProvisioningRequest], capacity: ClusterView | None
) -> tuple[GuardScaleDown, ...]:
    """For each request kept for a top-up (phase Kept, not being deleted), the nodes recorded
    in its keep that still need the guard (`needs_guard`); nothing when every one has it."""
    nodes = capacity.nodes if capacity else ()
    out: list[GuardScaleDown] = []
    for req in kept:
        record = rollback.record_of(req)
        if req.deleting or record.phase is not AttemptPhase.KEPT:
            continue
        key = request_key(req)
        wanted = _named(nodes, record.rollback_nodes)
        names = tuple(sorted(str(n["metadata"]["name"]) for n in wanted if needs_guard(n, key)))
        if names:
            out.append(GuardScaleDown(key, names))
    return tuple(out)


def unguard(nodes: Iterable[Mapping[str, Any]], request: str) -> tuple[GuardScaleDown, ...]:
    """The guard lifted from each of `nodes` (those recorded as arrived for `request`: the
    guard goes on no other) that carries gangcheck's record for `request`; nothing when none
    does."""
    names = tuple(sorted(str(n["metadata"]["name"]) for n in nodes if guarded_for(n) == request))
    return (GuardScaleDown(request, names, on=False),) if names else ()
