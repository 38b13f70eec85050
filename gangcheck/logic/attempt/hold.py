"""Holding the capacity that arrived for a gang until the gang has started.

The arrival ledger says which nodes came for which request; the hold makes that true for the
scheduler too. When gangcheck records a node as arrived for a request it taints the node
``HOLD_TAINT=<value of the request>:NoSchedule`` in the same write, so that no pod of another
gang and no unrelated pending pod is scheduled onto it, while the gang's own pods carry the
matching toleration (for Kueue Workloads through the check's podSetUpdates, for PodGroup
members in the patch that releases them). The hold is lifted once every member is scheduled,
and from the nodes a rollback keeps. It lives on the Node, so it survives a restart.

The hold starts when the arrival is recorded. A node group that serves gangs can close the
moment before that as well: nodes registering with the taint ``ARRIVING_TAINT`` are open to no
pod until gangcheck either records them for a waiting request (the claim swaps that taint for
the hold) or finds that no waiting request could use them (arrivals.py), and opens them.

A pod that tolerates every taint (``operator: Exists`` with no key: DaemonSet pods and the
like) is not held off by any taint; the reclaim rules keep a node such a pod runs on.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gangcheck.model.objects import Obj

#: The taint holding a node for the gang of one request. Its key carries cluster-autoscaler's
#: status-taint prefix: cluster-autoscaler leaves such taints out when it builds a node group's
#: template from a real node (so a held node never makes the autoscaler think new nodes will be
#: tainted), and, unlike its startup taints, still counts the node as ready.
HOLD_TAINT = "status-taint.cluster-autoscaler.kubernetes.io/gangcheck-held-for"
HOLD_EFFECT = "NoSchedule"
#: The taint a node group serving gangs registers its nodes with (optional; same prefix).
ARRIVING_TAINT = "status-taint.cluster-autoscaler.kubernetes.io/gangcheck-arriving"


def hold_value(request_key: str) -> str:
    """The taint value naming a request (``namespace/name``): a valid label value of fixed
    length for any request name (names run to 253 characters, label values to 63)."""
    return "r" + hashlib.sha256(request_key.encode()).hexdigest()[:40]


def hold_taint(request_key: str) -> Obj:
    return {"key": HOLD_TAINT, "value": hold_value(request_key), "effect": HOLD_EFFECT}


def hold_toleration(request_key: str) -> Obj:
    """What the gang's own pods carry to be scheduled onto the nodes held for them."""
    return {
        "key": HOLD_TAINT,
        "operator": "Equal",
        "value": hold_value(request_key),
        "effect": HOLD_EFFECT,
    }


def _taints(node: Mapping[str, Any]) -> list[Obj]:
    return list((node.get("spec") or {}).get("taints") or [])


def is_held(node: Mapping[str, Any]) -> bool:
    return any(t.get("key") == HOLD_TAINT for t in _taints(node))


def held_for_another(node: Mapping[str, Any], request_key: str) -> bool:
    """Held for the gang of another request: it carries a hold whose value is not this
    request's (a Karpenter node registers so, before any record is written on it)."""
    mine = hold_value(request_key)
    return any(t.get("key") == HOLD_TAINT and t.get("value") != mine for t in _taints(node))


def is_arriving(node: Mapping[str, Any]) -> bool:
    """Registered closed (``ARRIVING_TAINT``) and not yet recorded or opened."""
    return any(t.get("key") == ARRIVING_TAINT for t in _taints(node))


def taints_holding(node: Mapping[str, Any], request_key: str) -> list[Obj]:
    """The node's taints with the hold for ``request_key``, in place of any other hold and of
    the arrival taint."""
    kept = [t for t in _taints(node) if t.get("key") not in (HOLD_TAINT, ARRIVING_TAINT)]
    return [*kept, hold_taint(request_key)]


def taints_opened(node: Mapping[str, Any]) -> list[Obj]:
    """The node's taints without the arrival taint: open to every pod that tolerates the rest."""
    return [t for t in _taints(node) if t.get("key") != ARRIVING_TAINT]


def as_opened(node: Mapping[str, Any]) -> Obj:
    """The node as it will be once recorded for a gang: its arrival taint gone."""
    if not is_arriving(node):
        return dict(node)
    return {**node, "spec": {**(node.get("spec") or {}), "taints": taints_opened(node)}}


def taints_released(node: Mapping[str, Any]) -> list[Obj]:
    """The node's taints without the hold: every other taint stays as it is, in order."""
    return [t for t in _taints(node) if t.get("key") != HOLD_TAINT]


def held_nodes(nodes: Iterable[Mapping[str, Any]], names: Sequence[str]) -> tuple[str, ...]:
    """Which of ``names`` still carry a hold."""
    wanted = set(names)
    return tuple(
        sorted(
            str(n["metadata"]["name"])
            for n in nodes
            if n.get("metadata", {}).get("name") in wanted and is_held(n)
        )
    )


def with_hold_toleration(tolerations: Sequence[Mapping[str, Any]], request_key: str) -> list[Obj]:
    """A pod's tolerations plus the one for its gang's hold (once)."""
    wanted = hold_toleration(request_key)
    kept = [dict(t) for t in tolerations]
    return kept if wanted in kept else [*kept, wanted]
