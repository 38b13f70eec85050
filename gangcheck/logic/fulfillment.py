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
    fit_gang,
    member_from_template,
    node_could_host,
    node_view,
    summarize,
)
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.objects import ProvisioningRequest

Obj = dict[str, Any]

ARRIVED_FOR = "gangcheck.io/arrived-for"
OPT_OUT_LABEL = "gangcheck.io/do-not-reclaim"


@dataclass(frozen=True)
class Capacity:
    """The nodes and pods the caches hold, and which requests are in flight (`ns/name`)."""

    nodes: tuple[Obj, ...] = ()
    pods: tuple[Obj, ...] = ()
    in_flight: frozenset[str] = frozenset()


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
    capacity: Capacity | None, req: ProvisioningRequest, pod_sets: Sequence[tuple[str, int, Obj]]
) -> Fulfillment:
    """Whether the gang fits on the nodes this request may count, and which nodes to claim."""
    capacity = capacity or Capacity()
    gang = gang_of(pod_sets)
    mine, claims = _countable_nodes(capacity, req, [g.member for g in gang])
    result = fit_gang(gang, [node_view(n) for n in mine], capacity.pods)
    arrived = tuple(sorted(n["metadata"]["name"] for n in mine if claim_of(n) == request_key(req)))
    return Fulfillment(
        fits=result.fits,
        summary=summarize(result),
        placeable=result.placeable,
        total=result.total,
        claims=claims,
        arrived=tuple(sorted({*arrived, *(name for name, _ in claims)})),
    )


def _countable_nodes(
    capacity: Capacity, req: ProvisioningRequest, members: list[Member]
) -> tuple[list[Obj], tuple[tuple[str, str], ...]]:
    key, created = request_key(req), parse_time(req.creation_timestamp)
    countable, claims = [], []
    for node in capacity.nodes:
        owner = claim_of(node)
        if owner and owner != key and owner in capacity.in_flight:
            continue  # another gang's arrival
        countable.append(node)
        if owner != key and is_new_arrival(node, created, members):
            meta = node["metadata"]
            claims.append((meta["name"], meta.get("resourceVersion", "")))
    return countable, tuple(sorted(claims))


def is_new_arrival(node: Obj, request_created: datetime | None, members: list[Member]) -> bool:
    """Created no earlier than the request, and able to host one of its members."""
    born = parse_time(node.get("metadata", {}).get("creationTimestamp", ""))
    if born is None or request_created is None or born < request_created:
        return False
    view: NodeView = node_view(node)
    return any(node_could_host(m, view) for m in members)
