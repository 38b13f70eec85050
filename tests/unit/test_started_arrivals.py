"""What arrived for a gang that has started is free capacity (fulfillment._partition): a
node recorded for a request whose gang has started (the request marked Started, its hold
lifted) counts for another gang's fit as capacity that predates a request does, never
claimed again; one of a gang not started yet counts for that gang alone. And the controller
reads "started" from its request cache (reconcile/view.py), the diagnosis from the requests
it lists (logic/sources/world.py)."""

from __future__ import annotations

import pytest

from gangcheck.kube.informer import Store
from gangcheck.logic.attempt.fulfillment import (
    ClusterView,
    GangSpec,
    assess,
    fits_now,
    marked_started,
    started_keys,
)
from gangcheck.logic.attempt.hold import hold_taint
from gangcheck.model.objects import Obj, request_of
from gangcheck.reconcile.view import request_started
from tests.builders import node, pod_template, provisioning_request

NS = "ns"
OTHER = f"{NS}/other-1"
"""The request of the gang whose arrival the node is."""
GANG = GangSpec((("workers", 2, pod_template(gpu=8)),), namespace=NS)


def _arrival(name: str, *, held: bool = False) -> Obj:
    taints = [hold_taint(OTHER)] if held else None
    return node(
        name,
        created="2026-11-30T10:05:00Z",
        annotations={"gangcheck.io/arrived-for": OTHER},
        taints=taints,
    )


def _capacity(*nodes: Obj, started: bool) -> ClusterView:
    keys = frozenset({OTHER})
    return ClusterView(
        nodes=nodes,
        in_flight=keys | {f"{NS}/mine-1"},
        started=(keys if started else frozenset()).__contains__,
    )


@pytest.mark.parametrize(
    ("started", "held", "fits"),
    [
        (False, False, False),  # its gang not started: its alone
        (True, True, False),  # started, its hold not lifted yet: not yet
        (True, False, True),  # started and open: free
    ],
)
def test_another_gangs_arrival_counts_once_that_gang_started(
    started: bool, held: bool, fits: bool
) -> None:
    nodes = (_arrival("a1", held=held), _arrival("a2", held=held))
    capacity = _capacity(*nodes, started=started)
    mine = request_of(provisioning_request("mine-1", namespace=NS))
    result = assess(capacity, mine, GANG)
    assert result.fits is fits
    assert result.claims == ()  # never claimed again: the ledger keeps its first record
    assert result.arrived == ()
    assert fits_now(capacity, GANG).fits is fits


def test_started_is_read_from_the_phase_the_request_carries() -> None:
    started = provisioning_request(
        "other-1", namespace=NS, annotations={"gangcheck.io/phase": "Started"}
    )
    fulfilled = provisioning_request(
        "f-1", namespace=NS, annotations={"gangcheck.io/phase": "Fulfilled"}
    )
    assert marked_started(started)
    assert not marked_started(fulfilled)
    assert not marked_started(None)
    assert started_keys([started, fulfilled]) == frozenset({OTHER})

    store = Store()
    store.put_if_newer(started)
    store.put_if_newer(fulfilled)
    assert request_started(store, OTHER)
    assert not request_started(store, f"{NS}/f-1")
    assert not request_started(store, f"{NS}/gone-1")
