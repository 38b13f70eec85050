"""Capacity kept current from events equals capacity recomputed from the objects.

Any sequence of Node, Pod and Karpenter NodeClaim adds, updates and deletes (as the
informer reports them, including a delete of an object never seen and a relist's replays)
leaves `NodeUsage` holding what `node_view` (with `deleting_claim_of` the claims) and
`used_resources` give from scratch, and a fit given it decides as
a fit given the pods; the same for the DRA inventory under slice, class and claim events.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gangcheck.logic.placement.dra import DraContext, build_inventory
from gangcheck.logic.placement.fit import (
    STANDARD_RESOURCES,
    BoundUsage,
    GangPodSet,
    Member,
    NodeView,
    fit_gang,
    member_from_pod_spec,
    node_room,
    node_view,
    reason_lines,
    summarize,
    used_resources,
)
from gangcheck.logic.placement.quantity import QuantityError
from gangcheck.logic.placement.usage import (
    DeviceInventory,
    NodeUsage,
    deleting_claim_of,
    tally,
)

Obj = dict[str, Any]
NODES = ["n0", "n1", "n2", "n3"]
CONSUMES = "example.com/consumes"
PODS = [("a", "p0"), ("a", "p1"), ("b", "p0"), ("b", "p2"), ("a", "p3")]
ALLOCATABLE = [
    {"cpu": "8", "memory": "32Gi", "pods": "110"},
    {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "4"},
    {"cpu": "4", "memory": "8Gi", "pods": "2", "example.com/fpga": "1", "nvidia.com/gpu": "1"},
    {"cpu": "lots"},
    {},
]
REQUESTS = [
    {"cpu": "1"},
    {"cpu": "500m", "memory": "1Gi"},
    {"cpu": "2", "nvidia.com/gpu": "1"},
    {"nvidia.com/gpu": "2", "example.com/fpga": "1"},
    {"memory": "0"},
]


def node(name: str, variant: int, version: int, ready: bool, tainted: bool) -> Obj:
    spec: Obj = {"taints": [{"key": "k", "effect": "NoSchedule"}]} if tainted else {}
    if variant % 2:  # some nodes have a providerID (a NodeClaim may name them by it)
        spec["providerID"] = f"kwok://{name}"
    status = {
        "allocatable": ALLOCATABLE[variant],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    return {
        "metadata": {"name": name, "resourceVersion": str(version), "labels": {"v": str(variant)}},
        "spec": spec,
        "status": status,
    }


def pod(
    key: tuple[str, str], node_name: str | None, variant: int, phase: str, consumes: str = ""
) -> Obj:
    spec: Obj = {"containers": [{"name": "c", "resources": {"requests": REQUESTS[variant]}}]}
    if node_name:
        spec["nodeName"] = node_name
    annotations = {CONSUMES: consumes} if consumes else {}
    return {
        "metadata": {"namespace": key[0], "name": key[1], "annotations": annotations},
        "spec": spec,
        "status": {"phase": phase},
    }


node_events = st.tuples(
    st.just("node"),
    st.sampled_from(NODES),
    st.one_of(
        st.none(),
        st.tuples(
            st.integers(0, len(ALLOCATABLE) - 1), st.booleans(), st.booleans(), st.booleans()
        ),
    ),
)
CLAIMS = ["c0", "c1", "c2"]


def node_claim(name: str, node_name: str, provider: str, deleting: bool) -> Obj:
    meta: Obj = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-02T00:00:00Z"
    return {"metadata": meta, "status": {"nodeName": node_name, "providerID": provider}}


claim_events = st.tuples(
    st.just("claim"),
    st.sampled_from(CLAIMS),
    st.one_of(
        st.none(),
        st.tuples(
            st.sampled_from(["", *NODES, "gone"]),
            st.sampled_from(["", *(f"kwok://{n}" for n in NODES), "kwok://gone"]),
            st.booleans(),
        ),
    ),
)
pod_events = st.tuples(
    st.just("pod"),
    st.sampled_from(PODS),
    st.one_of(
        st.none(),
        st.tuples(
            st.sampled_from([None, *NODES, "gone"]),
            st.integers(0, len(REQUESTS) - 2),
            st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
            st.sampled_from(["", "r1", "r2"]),
        ),
    ),
)


class World:
    """The objects as the informers hold them, reporting each change as (old, new)."""

    def __init__(self) -> None:
        self.nodes: dict[str, Obj] = {}
        self.pods: dict[tuple[str, str], Obj] = {}
        self.claims: dict[str, Obj] = {}
        self.capacity = NodeUsage(tally=CONSUMES)
        self.version = 0

    def apply(self, event: tuple[Any, ...]) -> None:
        kind, key, change = event
        self.version += 1
        store: dict[Any, Obj] = {"node": self.nodes, "pod": self.pods, "claim": self.claims}[kind]
        handler = {
            "node": self.capacity.on_node,
            "pod": self.capacity.on_pod,
            "claim": self.capacity.on_node_claim,
        }[kind]
        old = store.get(key)
        if change is None:  # a delete, of an object seen or not (the informer reports both)
            store.pop(key, None)
            unseen = {
                "node": (0, True, False, False),
                "pod": ("n0", 0, "Running"),
                "claim": ("n0", "kwok://n1", True),
            }[kind]
            handler(old or self._build(kind, key, unseen), None)
            return
        store[key] = self._build(kind, key, change)
        handler(old, store[key])

    def relist(self) -> None:
        """A relist's replay: every object again as (old, new), unchanged."""
        for obj in self.nodes.values():
            self.capacity.on_node(obj, obj)
        for obj in self.pods.values():
            self.capacity.on_pod(obj, obj)
        for obj in self.claims.values():
            self.capacity.on_node_claim(obj, obj)

    def _build(self, kind: str, key: Any, change: tuple[Any, ...]) -> Obj:
        if kind == "node":
            variant, ready, tainted, bump = change
            return node(key, variant, self.version if bump else 1, ready, tainted)
        if kind == "claim":
            return node_claim(key, *change)
        return pod(key, *change)

    def view(self, raw: Obj) -> NodeView:
        """The node's view from scratch: its claims being deleted read from all of them."""
        return node_view(raw, deleting_claim=deleting_claim_of(raw, self.claims.values()))


def from_scratch_used(pods: list[Obj]) -> dict[str, dict[str, int]]:
    used = used_resources(pods)
    return {n: {r: v for r, v in u.items() if v} for n, u in used.items() if any(u.values())}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(node_events, pod_events, claim_events), max_size=40), st.booleans())
def test_events_leave_the_capacity_recomputing_gives(events: list[Any], relist: bool) -> None:
    world = World()
    for event in events:
        world.apply(event)
    if relist:
        world.relist()
    pods = list(world.pods.values())
    assert world.capacity.used() == from_scratch_used(pods)
    views = {n["metadata"]["name"]: world.view(n) for n in world.nodes.values()}
    assert world.capacity.views() == views
    for raw in world.nodes.values():  # a view asked of a copy (not the kept object) as well
        assert world.capacity.view_of(dict(raw, metadata={**raw["metadata"]})) == world.view(raw)
    offering: dict[str, set[str]] = {}
    for name, view in views.items():
        for resource, amount in view.allocatable.items():
            if amount > 0 and resource not in STANDARD_RESOURCES:
                offering.setdefault(resource, set()).add(name)
    assert world.capacity.offering() == offering
    for namespace, request in itertools.product(("a", "b"), ("r1", "r2")):
        scheduled = [
            p
            for p in pods
            if p["metadata"]["namespace"] == namespace
            and p["metadata"]["annotations"].get(CONSUMES) == request
            and p["spec"].get("nodeName")
            and p["status"]["phase"] not in ("Succeeded", "Failed")
        ]
        assert world.capacity.tallied(namespace, request) == len(scheduled)
        assert tally(pods, CONSUMES, namespace, request) == len(scheduled)


GANGS = [
    [("gpu", 2, {"nvidia.com/gpu": "1", "cpu": "1"})],
    [("gpu", 1, {"nvidia.com/gpu": "2"}), ("fpga", 1, {"example.com/fpga": "1"})],
    [("cpu", 3, {"cpu": "2"})],
    [("gpu", 5, {"nvidia.com/gpu": "1"})],
]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(node_events, pod_events, claim_events), st.booleans()), max_size=30
    ),
    st.sampled_from(range(len(GANGS))),
)
def test_a_fit_given_the_kept_capacity_decides_as_one_given_the_pods(
    events: list[Any], which: int
) -> None:
    """After any events, and with fits in between (what they keep, such as each node's room,
    is then used again), a fit given the kept capacity decides and tells as one that parses
    the pods."""
    world = World()
    gang = [
        GangPodSet(name, count, member_from_pod_spec({"containers": [container(requests)]}))
        for name, count, requests in GANGS[which]
    ]
    for event, look in [*events, (None, True)]:
        if event is not None:
            world.apply(event)
        if not look:
            continue
        views = world.capacity.node_views()
        used = used_resources(list(world.pods.values()))
        for view in views:
            room = world.capacity.room_of(view)
            assert nonzero(room) == nonzero(node_room(view, used))
        kept = fit_gang(gang, views, world.capacity.usage())
        scratch = fit_gang(gang, views, list(world.pods.values()))
        assert kept == scratch
        assert (summarize(kept), reason_lines(kept)) == (summarize(scratch), reason_lines(scratch))


def nonzero(amounts: Mapping[str, int]) -> dict[str, int]:
    return {name: amount for name, amount in amounts.items() if amount}


def container(requests: dict[str, str]) -> Obj:
    return {"name": "c", "resources": {"requests": requests}}


def test_a_malformed_bound_pod_fails_the_fit_as_parsing_it_would() -> None:
    capacity = NodeUsage()
    bad = pod(("a", "p0"), "n0", 0, "Running")
    bad["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "lots"}
    capacity.on_pod(None, bad)
    with pytest.raises(QuantityError):
        capacity.usage()
    with pytest.raises(QuantityError):
        used_resources([bad])
    capacity.on_pod(bad, None)
    assert capacity.usage() == BoundUsage({}, {}, frozenset())


def test_a_node_left_out_that_could_take_a_member_after_all_says_it_changed() -> None:
    """The views handed to a fit are newer than the index: n1 now offers GPUs, the index
    counted it without. The fit does not place on it (the next node event brings it in), and
    says why, rather than a reason that is not true of the node it was given."""
    capacity = NodeUsage()
    capacity.on_node(None, node("n0", 2, 1, True, False))  # one GPU
    capacity.on_node(None, node("n1", 0, 1, True, False))  # none
    newer = node_view(node("n1", 1, 2, True, False))  # four GPUs now
    gang = [GangPodSet("gpu", 2, member_from_pod_spec({"containers": [container(
        {"nvidia.com/gpu": "1"})]}))]  # fmt: skip
    result = fit_gang(gang, [capacity.view_of(node("n0", 2, 1, True, False)), newer],
                      capacity.usage())  # fmt: skip
    assert (result.placeable, dict(result.placements)) == (1, {"n0": ("gpu",)})
    assert str(result.node_reasons["n1"]) == "changed since its capacity was counted"


def test_a_status_update_parses_nothing_again() -> None:
    capacity = NodeUsage()
    running = pod(("a", "p0"), "n0", 1, "Running")
    capacity.on_pod(None, running)
    kept = capacity.usage().by_node["n0"]
    capacity.on_pod(running, {**running, "status": {"phase": "Running", "podIP": "10.0.0.1"}})
    assert capacity.usage().by_node["n0"] is kept
    assert capacity.used() == {"n0": {"cpu": 500_000_000, "memory": 2**30 * 10**9, "pods": 10**9}}


# --- DRA -------------------------------------------------------------------------------------

DRIVER = "gpu.example.com"
SLICE_NODES = ["n0", "n1", "n2"]
CLASSES = [
    f'device.driver == "{DRIVER}"',
    'device.attributes["gpu.example.com"].model == "a"',
    "device.capacity[",  # not evaluable: a problem
]


def slice_obj(node_name: str, generation: int, devices: int, driver: str) -> Obj:
    return {
        "metadata": {"name": f"{node_name}-{driver}"},
        "spec": {
            "driver": driver,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "nodeName": node_name,
            "devices": [
                {"name": f"d{i}", "attributes": {"model": {"string": "ab"[i % 2]}}}
                for i in range(devices)
            ],
        },
    }


def class_obj(name: str, expression: int) -> Obj:
    cel = {"cel": {"expression": CLASSES[expression]}}
    return {"metadata": {"name": name}, "spec": {"selectors": [cel]}}


def claim_obj(name: str, node_name: str, devices: tuple[int, ...]) -> Obj:
    results = [
        {"request": "r", "driver": DRIVER, "pool": node_name, "device": f"d{i}"} for i in devices
    ]
    return {
        "metadata": {"namespace": "a", "name": name},
        "status": {"allocation": {"devices": {"results": results}}} if results else {},
    }


dra_events = st.one_of(
    st.tuples(
        st.just("slice"),
        st.sampled_from(SLICE_NODES),
        st.one_of(
            st.none(),
            st.tuples(st.integers(1, 3), st.integers(0, 4), st.sampled_from([DRIVER, "x.io"])),
        ),
    ),
    st.tuples(
        st.just("class"),
        st.sampled_from(["gpu", "model-a"]),
        st.one_of(st.none(), st.tuples(st.integers(0, len(CLASSES) - 1))),
    ),
    st.tuples(
        st.just("claim"),
        st.sampled_from(["c0", "c1", "c2"]),
        st.one_of(
            st.none(),
            st.tuples(
                st.sampled_from(SLICE_NODES), st.lists(st.integers(0, 3), max_size=3).map(tuple)
            ),
        ),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(dra_events, st.booleans()), max_size=30), st.integers(1, 6))
def test_dra_events_leave_the_inventory_building_gives(events: list[Any], members: int) -> None:
    objects: dict[str, dict[str, Obj]] = {"slice": {}, "class": {}, "claim": {}}
    kept = DeviceInventory()
    for (kind, key, change), look in events:
        store = objects[kind]
        old = store.get(key)
        if change is None:
            store.pop(key, None)
            new = None
        else:
            store[key] = {"slice": slice_obj, "class": class_obj, "claim": claim_obj}[kind](
                key, *change
            )
            new = store[key]
        if old is None and new is None:
            continue
        (kept.on_claim if kind == "claim" else kept.on_published)(old, new)
        if look:  # a fit in between: what is kept is then used again
            kept.inventory(*(list(objects[k].values()) for k in ("slice", "class", "claim")))
    args = [list(objects[k].values()) for k in ("slice", "class", "claim")]
    inventory, scratch = kept.inventory(*args), build_inventory(*args)
    assert (inventory.pools, inventory.used, inventory.problems) == (
        scratch.pools,
        scratch.used,
        scratch.problems,
    )
    assert {n: [s.expression for s in c.selectors] for n, c in inventory.classes.items()} == {
        n: [s.expression for s in c.selectors] for n, c in scratch.classes.items()
    }
    needs = DraContext.of(
        [
            {
                "metadata": {"name": "t", "namespace": "a"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "r", "exactly": {"deviceClassName": "gpu", "count": 1}}
                ]}}},
            }
        ]
    ).needs({"resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}]})  # fmt: skip
    views = [node_view(node(n, 0, 1, True, False)) for n in SLICE_NODES]
    gang = [GangPodSet("g", members, Member(requests={"pods": 10**9}, devices=needs))]
    kept_fit = fit_gang(gang, views, (), inventory)
    assert kept_fit == fit_gang(gang, views, (), scratch)
    with patch("gangcheck.logic.placement.fit.most_members", lambda *_: None):
        assert fit_gang(gang, views, (), scratch) == kept_fit  # the bound changes nothing
    # With the capacity kept, a fit leaves out the nodes reaching no device (here n3, and the
    # nodes whose slices are gone): it decides and tells as one that reads every node.
    capacity = NodeUsage()
    for name in [*SLICE_NODES, "n3"]:
        capacity.on_node(None, node(name, 0, 1, True, False))
    everyone = capacity.node_views()
    indexed = fit_gang(gang, everyone, capacity.usage(), inventory)
    read_all = fit_gang(gang, everyone, (), scratch)
    assert indexed == read_all
    assert (summarize(indexed), reason_lines(indexed)) == (
        summarize(read_all),
        reason_lines(read_all),
    )
