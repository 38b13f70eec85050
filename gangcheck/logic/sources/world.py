"""The world a diagnosis reads live, as a decision reads it: the requests in flight and those
waiting for capacity in the order the ProvisioningRequest source gives them (waiting.py), and
the node views kept as the controller keeps them. The controller's own view of the same is
built from its caches (reconcile/view.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from gangcheck.logic.attempt.explain import Placement, World, place
from gangcheck.logic.attempt.fulfillment import GangSpec, started_keys
from gangcheck.logic.placement.usage import NodeUsage
from gangcheck.logic.sources.waiting import waiting_of
from gangcheck.model.names import CONSUME_ANNOTATION
from gangcheck.model.objects import ProvisioningRequest


def capacity_of(world: World) -> World:
    """The world as the capacity a decision reads: the requests in flight (nodes arrived for
    them are theirs) and those waiting, oldest first, as the controller's caches give them.
    (The diagnosis reads no PodTemplates: a waiting request's templates are not known, so no
    older request is taken to claim a new node first.) The node views and what bound pods
    use are kept as the controller keeps them (`NodeUsage`, with the NodeClaims being deleted),
    parsed once for every gang."""
    if world.cluster is not None:
        return world
    usage = NodeUsage(tally=CONSUME_ANNOTATION)
    for claim in world.node_claims:
        usage.on_node_claim(None, claim)
    for node in world.nodes:
        usage.on_node(None, node)
    for pod in world.pods:
        usage.on_pod(None, pod)
    return replace(
        world,
        in_flight=in_flight_keys(world),
        started=started_keys(world.requests).__contains__,
        waiting=waiting_of(world.requests, lambda _name, _namespace: None),
        cluster=usage,
    )


def in_flight_keys(world: World) -> frozenset[str]:
    """`namespace/name` of every request gangcheck manages: nodes arrived for them are theirs."""
    keys = set()
    for req in world.requests:
        meta = req.get("metadata") or {}
        keys.add(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    return frozenset(keys)


def place_in(
    world: World,
    gang: GangSpec,
    namespace: str,
    request: ProvisioningRequest | None,
    now: datetime | None = None,
) -> Placement | None:
    """`place` on what the world holds: its nodes, pods, in-flight requests (and those
    waiting, which claim new nodes first) and devices."""
    capacity = capacity_of(world)
    return place(
        gang,
        world.nodes,
        world.pods,
        request=request,
        in_flight=frozenset(capacity.in_flight),
        dra=world.dra(namespace),
        capacity=capacity,
        now=now,
    )
