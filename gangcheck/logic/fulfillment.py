"""Fulfillment, not promises: does the gang fit, whole, on nodes that exist right now?

Nodes are attributed to at most one in-flight request (the arrival ledger, kept on the Node as
``gangcheck.io/arrived-for: <namespace>/<request>``): a node created after a request, unclaimed,
that could host one of its members is claimed for it. A request counts the nodes claimed for
it and the nodes no other in-flight request claims, so two gangs never count one node twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gangcheck.logic.fit import (
    GangPodSet,
    Member,
    NodeView,
    could_be_made_for,
    fit_gang,
    member_from_template,
    node_view,
    summarize,
)
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.objects import ProvisioningRequest

Obj = dict[str, Any]

ARRIVED_FOR = "gangcheck.io/arrived-for"
OPT_OUT_LABEL = "gangcheck.io/do-not-reclaim"


@dataclass(frozen=True)
class Waiting:
    """An in-flight request still waiting for capacity, with its pod templates."""

    key: str
    templates: tuple[Obj, ...] = ()


@dataclass(frozen=True)
class Capacity:
    """The nodes and pods the caches hold, and which requests are in flight (`ns/name`)."""

    nodes: tuple[Obj, ...] = ()
    pods: tuple[Obj, ...] = ()
    in_flight: frozenset[str] = frozenset()
    waiting: tuple[Waiting, ...] = ()
    """In-flight requests not yet fulfilled, oldest first: the order new nodes are claimed in."""
    claim_grace_seconds: float = 15.0


@dataclass(frozen=True)
class Fulfillment:
    fits: bool
    summary: str
    placeable: int
    total: int
    claims: tuple[tuple[str, str], ...] = ()
    """(name, resourceVersion) of nodes to record as arrived for this request now."""
    arrived: tuple[str, ...] = ()
    """Nodes recorded (or being recorded) as arrived for this request."""


def request_key(req: ProvisioningRequest) -> str:
    return f"{req.ref.namespace}/{req.name}"


def claim_of(node: Obj) -> str:
    return str((node.get("metadata", {}).get("annotations") or {}).get(ARRIVED_FOR, ""))


def gang_of(pod_sets: Sequence[tuple[str, int, Obj]]) -> list[GangPodSet]:
    return [GangPodSet(name, count, member_from_template(tpl)) for name, count, tpl in pod_sets]


def assess(
    capacity: Capacity | None,
    req: ProvisioningRequest,
    pod_sets: Sequence[tuple[str, int, Obj]],
    now: datetime | None = None,
) -> Fulfillment:
    """Whether the gang fits on the nodes this request may count, and which nodes to claim.

    New arrivals are claimed one at a time, only until the gang fits, so a node the gang does
    not need stays free for the next one.
    """
    capacity = capacity or Capacity()
    gang = gang_of(pod_sets)
    base, candidates = _partition(capacity, req, [g.member for g in gang], now)
    views = [node_view(n) for n in base]
    result = fit_gang(gang, views, capacity.pods)
    claims: list[Obj] = []
    for node in candidates:
        if result.fits:
            break
        claims.append(node)
        views.append(node_view(node))
        result = fit_gang(gang, views, capacity.pods)
    key = request_key(req)
    arrived = {n["metadata"]["name"] for n in base if claim_of(n) == key}
    return Fulfillment(
        fits=result.fits,
        summary=summarize(result),
        placeable=result.placeable,
        total=result.total,
        claims=tuple(
            (n["metadata"]["name"], n["metadata"].get("resourceVersion", "")) for n in claims
        ),
        arrived=tuple(sorted(arrived | {n["metadata"]["name"] for n in claims})),
    )


def _partition(
    capacity: Capacity, req: ProvisioningRequest, members: list[Member], now: datetime | None
) -> tuple[list[Obj], list[Obj]]:
    """(nodes the request counts already, new arrivals it may claim in order)."""
    key, created = request_key(req), parse_time(req.creation_timestamp)
    base, candidates = [], []
    for node in capacity.nodes:
        owner = claim_of(node)
        if owner == key:
            base.append(node)
        elif owner and owner in capacity.in_flight:
            continue  # another gang's arrival
        elif not is_new_arrival(node, created, members):
            base.append(node)  # capacity that predates the request, shared by all
        elif _may_claim(capacity, key, node, now):
            candidates.append(node)
    return base, sorted(candidates, key=_arrival_order)


def _may_claim(capacity: Capacity, key: str, node: Obj, now: datetime | None) -> bool:
    """Older waiting requests the node could serve claim it first; after a grace, anyone may."""
    view = node_view(node)
    for older in capacity.waiting:
        if older.key == key:
            return True
        if any(could_be_made_for(member_from_template(t), view) for t in older.templates):
            born = parse_time(node.get("metadata", {}).get("creationTimestamp", ""))
            waited = (now - born).total_seconds() if born and now else 0.0
            return waited >= capacity.claim_grace_seconds
    return True


def _arrival_order(node: Obj) -> tuple[str, str]:
    meta = node.get("metadata", {})
    return (str(meta.get("creationTimestamp", "")), str(meta.get("name", "")))


def is_new_arrival(node: Obj, request_created: datetime | None, members: list[Member]) -> bool:
    """Created no earlier than the request, and made of what one of its members needs."""
    born = parse_time(node.get("metadata", {}).get("creationTimestamp", ""))
    if born is None or request_created is None or born < request_created:
        return False
    view: NodeView = node_view(node)
    return any(could_be_made_for(m, view) for m in members)
