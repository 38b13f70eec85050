"""Table tests of the required-topology fit: one domain per constrained pod set, or the gang."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gangcheck.logic.placement.fit import GangPodSet, Member, NodeView, node_view
from gangcheck.logic.placement.topology import MissingLevel, by_domain, fit_in_domains
from tests.builders import node

RACK, ZONE = "rack", "zone"
GPU = "nvidia.com/gpu"


def gpus(n: int) -> Member:
    return Member(requests={GPU: n * 10**9, "pods": 10**9})


def rack_node(name: str, rack: str, gpu: int, zone: str = "z1") -> NodeView:
    return node_view(node(name, gpu=gpu, labels={RACK: rack, ZONE: zone}))


@dataclass
class Case:
    id: str
    gang: list[GangPodSet]
    nodes: list[NodeView]
    required: dict[str, str] = field(default_factory=dict)
    together: str = ""
    fits: bool = True
    domains: dict[str, tuple[str, str]] = field(default_factory=dict)
    problem: str = ""
    missing: MissingLevel | None = None
    placeable: int | None = None
    """Of a gang that does not fit, the members the fit places (its words say so)."""


TWO_RACKS = [rack_node("a1", "a", 2), rack_node("b1", "b", 2)]
CASES = [
    Case("no topology: spread is fine", [GangPodSet("w", 3, gpus(1))], TWO_RACKS),
    Case(
        "one rack required, none has room for all three",
        [GangPodSet("w", 3, gpus(1))],
        TWO_RACKS,
        required={"w": RACK},
        fits=False,
        problem="pod set w needs all 3 members in one rack domain; best rack=a places 2",
    ),
    Case(
        "one rack required, the second rack has room: pinned there",
        [GangPodSet("w", 3, gpus(1))],
        [rack_node("a1", "a", 2), rack_node("b1", "b", 2), rack_node("b2", "b", 1)],
        required={"w": RACK},
        domains={"w": (RACK, "b")},
    ),
    Case(
        "two constrained pod sets may sit in different racks",
        [GangPodSet("ps", 2, gpus(1)), GangPodSet("w", 2, gpus(1))],
        TWO_RACKS,
        required={"ps": RACK, "w": RACK},
        domains={"ps": (RACK, "a"), "w": (RACK, "b")},
    ),
    Case(
        "the whole gang together: one rack for every pod set",
        [GangPodSet("ps", 2, gpus(1)), GangPodSet("w", 2, gpus(1))],
        TWO_RACKS,
        together=RACK,
        fits=False,
        problem="all 4 members need one rack domain; best rack=a places 2",
    ),
    Case(
        "the whole gang together, a rack with room",
        [GangPodSet("ps", 1, gpus(1)), GangPodSet("w", 2, gpus(1))],
        [*TWO_RACKS, rack_node("b2", "b", 1)],
        together=RACK,
        domains={"ps": (RACK, "b"), "w": (RACK, "b")},
    ),
    Case(
        "a level no node carries: said as such, the fit without it placing the members",
        [GangPodSet("w", 3, gpus(1))],
        TWO_RACKS,
        required={"w": "block"},
        fits=False,
        problem="no node the gang may use carries the required topology level block (pod set "
        "w): the gang cannot fit in one domain",
        missing=MissingLevel("block", "w"),
        placeable=3,
    ),
    Case(
        "the whole gang, a level no node carries",
        [GangPodSet("ps", 1, gpus(1)), GangPodSet("w", 2, gpus(1))],
        TWO_RACKS,
        together="block",
        fits=False,
        problem="no node the gang may use carries the required topology level block: the gang "
        "cannot fit in one domain",
        missing=MissingLevel("block"),
        placeable=3,
    ),
    Case(
        "a level only nodes not usable carry is not missing: none usable has it",
        [GangPodSet("w", 1, gpus(1))],
        [
            rack_node("a1", "a", 2),
            node_view(node("blk", gpu=2, labels={"block": "x"}, ready=False)),
        ],
        required={"w": "block"},
        fits=False,
        problem="pod set w needs all 1 members in one block domain: no usable node has it",
        placeable=1,
    ),
    Case(
        "the whole gang, a level only nodes not usable carry",
        [GangPodSet("w", 2, gpus(1))],
        [
            rack_node("a1", "a", 2),
            node_view(node("blk", gpu=2, labels={"block": "x"}, ready=False)),
        ],
        together="block",
        fits=False,
        problem="all 2 members need one block domain: no usable node has it",
        placeable=0,
    ),
    Case(
        "a wider level holds what a narrow one cannot",
        [GangPodSet("w", 3, gpus(1))],
        TWO_RACKS,
        required={"w": ZONE},
        domains={"w": (ZONE, "z1")},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fit_in_domains(case: Case) -> None:
    result = fit_in_domains(case.gang, case.nodes, (), case.required, together=case.together)
    assert result.fits == case.fits
    assert result.problem == case.problem
    if case.fits:
        assert dict(result.domains) == case.domains
        placed = {
            name: case.nodes[[n.name for n in case.nodes].index(name)]
            for name in result.result.placements
        }
        for node_name, pod_sets in result.result.placements.items():
            for ps in pod_sets:
                if ps in result.domains:
                    key, value = result.domains[ps]
                    assert placed[node_name].labels[key] == value
    else:
        assert result.problem in result.summary()
    assert result.missing == case.missing
    if case.placeable is not None:
        assert result.result.placeable == case.placeable


def test_a_missing_level_counts_the_nodes_that_arrived_for_the_attempt() -> None:
    gang = [GangPodSet("w", 3, gpus(1))]
    result = fit_in_domains(gang, TWO_RACKS, (), {"w": "block"})
    assert [result.summary(arrived) for arrived in (0, 1, 2)] == [
        "no node the gang may use carries the required topology level block (pod set w): the "
        "gang cannot fit in one domain; ignoring the level, 3 of 3 members placeable on 2 nodes",
        "1 node arrived for this attempt; none carries the required topology level block (pod "
        "set w): the gang cannot fit in one domain; ignoring the level, 3 of 3 members "
        "placeable on 2 nodes",
        "2 nodes arrived for this attempt; none carries the required topology level block (pod "
        "set w): the gang cannot fit in one domain; ignoring the level, 3 of 3 members "
        "placeable on 2 nodes",
    ]


def not_ready(name: str, rack: str) -> NodeView:
    return node_view(node(name, gpu=2, labels={RACK: rack}, ready=False))


@pytest.mark.parametrize(
    ("nodes", "key", "grouped"),
    [
        ([], RACK, {}),
        (TWO_RACKS, RACK, {"a": ["a1"], "b": ["b1"]}),
        (TWO_RACKS, ZONE, {"z1": ["a1", "b1"]}),
        (TWO_RACKS, "block", {}),
        (
            [rack_node("a2", "a", 1), rack_node("b1", "b", 2), rack_node("a1", "a", 2)],
            RACK,
            {"a": ["a1", "a2"], "b": ["b1"]},
        ),
        (
            [rack_node("a1", "a", 2), not_ready("a2", "a"), not_ready("b1", "b")],
            RACK,
            {"a": ["a1"]},
        ),
    ],
    ids=[
        "no nodes",
        "one node a rack",
        "two racks in one zone",
        "a level no node carries",
        "each domain's nodes by name, whatever the order given",
        "nodes not usable left out, and a domain only they show",
    ],
)
def test_by_domain(nodes: list[NodeView], key: str, grouped: dict[str, list[str]]) -> None:
    got = by_domain(nodes, key)
    assert {value: [n.name for n in views] for value, views in got.items()} == grouped
