"""The capacity every attempt is decided against, read from the caches (both gang sources)."""

from __future__ import annotations

import functools
from dataclasses import replace

from gangcheck.kube.informer import Store
from gangcheck.logic.attempt.fulfillment import ClusterView, Waiting, marked_started, started_keys
from gangcheck.reconcile.caches import Caches


def cluster_view(caches: Caches, *, copied: bool = False) -> ClusterView:
    """The nodes and pods the caches hold, the requests in flight, oldest waiting first, and
    the capacity kept from events. Not copied unless `copied` (to read it after an await):
    a decision reads it before the caches change again."""
    capacity = ClusterView(
        nodes=caches.nodes.store.values(),
        pods=caches.pods.store.values(),
        in_flight=caches.requests.store.keys(),
        started=functools.partial(request_started, caches.requests.store),
        waiting=caches.in_flight.waiting(),
        cluster=caches.capacity,
        devices=caches,
        nodes_current=caches.nodes.current,
    )
    if not copied:
        return capacity
    nodes, pods, keys = tuple(capacity.nodes), tuple(capacity.pods), capacity.in_flight
    claims = tuple(caches.node_claims.store.values())  # what `cluster` knew of them, copied
    started = started_keys(caches.requests.store.values())
    return replace(
        capacity,
        nodes=nodes,
        pods=pods,
        in_flight=frozenset(keys),
        started=started.__contains__,
        cluster=None,
        node_claims=claims,
    )


def request_started(requests: Store, key: str) -> bool:
    """Whether the request `ns/name` the store holds is marked Started (`ClusterView.started`)."""
    namespace, _, name = key.partition("/")
    return marked_started(requests.get(name, namespace))


def open_requests(caches: Caches) -> tuple[Waiting, ...]:
    """Requests capacity may still arrive for, Provisioned or not yet (a node can register
    before the request's Provisioned condition reaches this controller), oldest first."""
    return caches.in_flight.open()
