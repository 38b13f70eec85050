"""Reservation-backed capacity: which nodes are reserved, and how a gang splits over them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gangcheck.logic.placement.fit import GangPodSet, NodeView, member_from_template, node_view
from gangcheck.logic.placement.reservations import (
    Reservation,
    ReservedSplit,
    describe,
    reserved_nodes,
    split_gang,
)
from tests.builders import node, pod_template

Obj = dict[str, Any]

RES_A = Reservation("res-a", {"pool": "res-a"}, nodes=8)
RES_B = Reservation("res-b", {"pool": "res-b"}, nodes=8)
WORKER = member_from_template(pod_template(gpu=8))  # one member fills a node's 8 GPUs
LAUNCHER = member_from_template(pod_template(cpu="2"))


def nodes(prefix: str, count: int, **labels: str) -> list[NodeView]:
    return [node_view(node(f"{prefix}-{i}", labels=labels)) for i in range(count)]


def workers(count: int) -> list[GangPodSet]:
    return [GangPodSet("workers", count, WORKER)]


def foreign_pod(node_name: str, gpu: int = 8, phase: str = "Running") -> Obj:
    return {
        "metadata": {"name": f"other-on-{node_name}", "namespace": "else"},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpu)}}}],
        },
        "status": {"phase": phase},
    }


@dataclass(frozen=True)
class Case:
    id: str
    reservations: list[Reservation]
    nodes: list[NodeView]
    gang: list[GangPodSet]
    on_reserved: dict[str, int]
    remainder: dict[str, int]
    by_reservation: dict[str, int]
    bound: list[Obj] = field(default_factory=list)
    used_nodes: set[str] | None = None  # the reserved nodes the placement uses, when checked


CASES = [
    Case(
        "no reservations: the whole gang is the remainder",
        [],
        nodes("a", 4, pool="res-a"),
        workers(4),
        on_reserved={},
        remainder={"workers": 4},
        by_reservation={},
    ),
    Case(
        "a reservation fits the whole gang",
        [RES_A],
        nodes("a", 4, pool="res-a") + nodes("spot", 2),
        workers(4),
        on_reserved={"workers": 4},
        remainder={},
        by_reservation={"res-a": 4},
    ),
    Case(
        "partial: unreserved nodes with room are not reserved capacity",
        [RES_A],
        nodes("a", 3, pool="res-a") + nodes("spot", 4),
        workers(4),
        on_reserved={"workers": 3},
        remainder={"workers": 1},
        by_reservation={"res-a": 3},
    ),
    Case(
        "the nodes cap: only the first N matching nodes by name count",
        [Reservation("res-a", {"pool": "res-a"}, nodes=2)],
        nodes("a", 4, pool="res-a"),
        workers(4),
        on_reserved={"workers": 2},
        remainder={"workers": 2},
        by_reservation={"res-a": 2},
        used_nodes={"a-0", "a-1"},
    ),
    Case(
        "a reserved node full of other pods takes nobody",
        [RES_A],
        nodes("a", 2, pool="res-a"),
        workers(2),
        bound=[foreign_pod("a-0")],
        on_reserved={"workers": 1},
        remainder={"workers": 1},
        by_reservation={"res-a": 1},
        used_nodes={"a-1"},
    ),
    Case(
        "finished pods take no room on reserved nodes",
        [RES_A],
        nodes("a", 2, pool="res-a"),
        workers(2),
        bound=[foreign_pod("a-0", phase="Succeeded")],
        on_reserved={"workers": 2},
        remainder={},
        by_reservation={"res-a": 2},
    ),
    Case(
        "two reservations",
        [RES_A, RES_B],
        nodes("a", 2, pool="res-a") + nodes("b", 1, pool="res-b"),
        workers(4),
        on_reserved={"workers": 3},
        remainder={"workers": 1},
        by_reservation={"res-a": 2, "res-b": 1},
    ),
    Case(
        "node labels partially matching do not count",
        [Reservation("res-a", {"pool": "res-a", "zone": "z1"}, nodes=8)],
        nodes("a", 2, pool="res-a", zone="z1")
        + nodes("z2", 2, pool="res-a", zone="z2")
        + nodes("nozone", 2, pool="res-a"),
        workers(4),
        on_reserved={"workers": 2},
        remainder={"workers": 2},
        by_reservation={"res-a": 2},
        used_nodes={"a-0", "a-1"},
    ),
    Case(
        "two pod sets: what fits on reserved nodes, per pod set",
        [RES_A],
        nodes("a", 2, pool="res-a"),
        [GangPodSet("launcher", 1, LAUNCHER), *workers(3)],
        on_reserved={"launcher": 1, "workers": 2},
        remainder={"workers": 1},
        by_reservation={"res-a": 3},
    ),
    Case(
        "members whose selector excludes the reserved nodes go to the remainder",
        [RES_A],
        nodes("a", 2, pool="res-a"),
        [
            GangPodSet(
                "workers", 2, member_from_template(pod_template(gpu=8, node_selector={"g": "b"}))
            )
        ],
        on_reserved={},
        remainder={"workers": 2},
        by_reservation={},
    ),
    Case(
        "a not-Ready reserved node takes nobody but still counts towards the cap",
        [Reservation("res-a", {"pool": "res-a"}, nodes=2)],
        [
            node_view(node("a-0", labels={"pool": "res-a"}, ready=False)),
            *nodes("a-x", 2, pool="res-a"),
        ],
        workers(2),
        on_reserved={"workers": 1},
        remainder={"workers": 1},
        by_reservation={"res-a": 1},
        used_nodes={"a-x-0"},
    ),
    Case(
        "empty pod sets are left out",
        [RES_A],
        nodes("a", 1, pool="res-a"),
        [GangPodSet("launcher", 0, LAUNCHER), *workers(1)],
        on_reserved={"workers": 1},
        remainder={},
        by_reservation={"res-a": 1},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_split_gang(case: Case) -> None:
    split = split_gang(case.gang, case.nodes, case.bound, case.reservations)
    assert split.on_reserved == case.on_reserved
    assert split.remainder == case.remainder
    assert split.by_reservation == case.by_reservation
    assert split.total == sum(ps.count for ps in case.gang)
    if case.used_nodes is not None:
        assert set(split.placements) == case.used_nodes
    owner = reserved_nodes(case.reservations, case.nodes)
    assert set(split.placements) <= set(owner)


def test_reserved_nodes_takes_the_first_n_matching_by_name() -> None:
    found = [*nodes("n", 3, pool="res-a"), *nodes("m", 2, pool="res-a"), *nodes("x", 2)]
    capped = Reservation("res-a", {"pool": "res-a"}, nodes=3)
    assert reserved_nodes([capped], reversed(found)) == {
        "m-0": "res-a",
        "m-1": "res-a",
        "n-0": "res-a",
    }


def test_a_node_belongs_to_the_first_reservation_matching_it() -> None:
    found = nodes("gpu", 3, pool="shared", zone="z1")
    first = Reservation("first", {"pool": "shared"}, nodes=2)
    second = Reservation("second", {"zone": "z1"}, nodes=2)
    assert reserved_nodes([first, second], found) == {
        "gpu-0": "first",
        "gpu-1": "first",
        "gpu-2": "second",
    }
    assert reserved_nodes([second, first], found) == {
        "gpu-0": "second",
        "gpu-1": "second",
        "gpu-2": "first",
    }


def test_reservations_holding_nothing_match_nothing() -> None:
    found = nodes("gpu", 2, pool="res-a")
    assert reserved_nodes([Reservation("no-labels", {}, nodes=5)], found) == {}
    assert reserved_nodes([Reservation("no-nodes", {"pool": "res-a"}, nodes=0)], found) == {}
    assert reserved_nodes([Reservation("negative", {"pool": "res-a"}, nodes=-1)], found) == {}


@pytest.mark.parametrize(
    ("split", "line"),
    [
        (
            ReservedSplit({"w": 3}, {"w": 1}, {"res-a": 3}),
            "3 of 4 members on reserved capacity (res-a 3); requesting 1 new",
        ),
        (
            ReservedSplit({"w": 4}, {}, {"res-a": 3, "res-b": 1}),
            "4 of 4 members on reserved capacity (res-a 3, res-b 1); nothing new to request",
        ),
        (ReservedSplit({}, {"w": 4}, {}), "0 of 4 members on reserved capacity; requesting 4 new"),
    ],
)
def test_describe(split: ReservedSplit, line: str) -> None:
    assert describe(split) == line


def test_describe_a_real_split() -> None:
    split = split_gang(workers(4), nodes("a", 3, pool="res-a"), [], [RES_A])
    assert describe(split) == "3 of 4 members on reserved capacity (res-a 3); requesting 1 new"
