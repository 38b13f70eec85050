"""What a tenant can make gangcheck do with the objects it may write, at unit level.

A tenant chooses its gang's required topology level: a PodGroup's
``schedulingConstraints.topology[0].key``, a Job pod template's
``kueue.x-k8s.io/podset-required-topology`` or ``gangcheck.io/podset-required-topology``.
``kubernetes.io/hostname`` is a level like any other, with one domain per node. The fit tried
the domains one by one, and the ranking of the domains an attempt asks in fitted the gang in
each; every one of those fits read every node, so a gang fitting no single node (two members
each wanting a whole node) cost nodes² node reads per look, the controller's one event loop
blocked the while (2000 nodes: over 20 s a fit) and every other tenant's gang waited. A try
of a domain now reads only the nodes of the domains its pod sets are pinned to when every
pod set with members is pinned (no other node could take a member), so a look reads each
node a few times. A Workload whose pod sets are not all kept in the level still costs
nodes² (the tables say so).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pytest

from gangcheck.logic.attempt import places
from gangcheck.logic.attempt.fulfillment import ClusterView, GangSpec, fits_now
from gangcheck.logic.placement import fit, topology
from gangcheck.logic.placement.fit import FitResult, GangPodSet, Member, NodeView, node_view
from gangcheck.logic.placement.topology import fit_in_domains
from gangcheck.model.objects import Obj
from tests.builders import node, pod_template
from tests.unit.test_topology import Case

HOST = "kubernetes.io/hostname"
GPU = "nvidia.com/gpu"
NODES = 300


def whole_node(cpu: int = 1) -> Member:
    """A member wanting all 8 GPUs of a node (and `cpu` cores: another shape, another set)."""
    return Member(requests={GPU: 8 * 10**9, "cpu": cpu * 10**9, "pods": 10**9})


def hosts(n: int, *, room_on_last: int = 8) -> list[NodeView]:
    """`n` nodes of 8 GPUs, but the last with only `room_on_last`, by name."""
    return [node_view(node(f"n{i:04d}", gpu=8 if i < n - 1 else room_on_last)) for i in range(n)]


CASES = [
    Case(
        "a PodGroup's gang of two whole-node members on one host: fits nowhere",
        [GangPodSet("ps-0", 2, whole_node())],
        hosts(NODES),
        together=HOST,
        fits=False,
        problem=f"all 2 members need one {HOST} domain; best {HOST}=n0000 places 1",
    ),
    Case(
        "two member shapes, each fitting a node alone, not both: fits nowhere",
        [GangPodSet("ps-0", 1, whole_node(1)), GangPodSet("ps-1", 1, whole_node(2))],
        hosts(NODES),
        together=HOST,
        fits=False,
        problem=f"all 2 members need one {HOST} domain; best {HOST}=n0000 places 1",
    ),
    Case(
        "a Job's pod set required on one host: fits nowhere",
        [GangPodSet("main", 2, whole_node())],
        hosts(NODES),
        required={"main": HOST},
        fits=False,
        problem=f"pod set main needs all 2 members in one {HOST} domain; best {HOST}=n0000 "
        "places 1",
    ),
    Case(
        "two required pod sets, the second fitting on no host beside the first",
        [GangPodSet("a", 1, whole_node(1)), GangPodSet("b", 2, whole_node(2))],
        hosts(NODES),
        required={"a": HOST, "b": HOST},
        fits=False,
        domains={"a": (HOST, "n0000")},
        problem=f"pod set b needs all 2 members in one {HOST} domain; best {HOST}=n0000 places 1",
    ),
    Case(
        "a gang that fits one host, the last one only: pinned there",
        [GangPodSet("ps-0", 1, Member(requests={GPU: 9 * 10**9, "pods": 10**9}))],
        hosts(NODES, room_on_last=16),
        together=HOST,
        fits=True,
        domains={"ps-0": (HOST, f"n{NODES - 1:04d}")},
    ),
    Case(
        "a required pod set that fits the last host only: pinned there",
        [GangPodSet("main", 1, Member(requests={GPU: 9 * 10**9, "pods": 10**9}))],
        hosts(NODES, room_on_last=16),
        required={"main": HOST},
        fits=True,
        domains={"main": (HOST, f"n{NODES - 1:04d}")},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_gang_on_one_host_reads_each_node_a_few_times_not_once_per_host(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = 0
    fit = topology.fit_gang

    def counting(
        pod_sets: Sequence[GangPodSet], nodes: Iterable[NodeView], *args: object
    ) -> FitResult:
        nonlocal read
        views = list(nodes)
        read += len(views)
        return fit(pod_sets, views, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(topology, "fit_gang", counting)
    got = fit_in_domains(case.gang, case.nodes, (), case.required, together=case.together)
    assert (got.fits, dict(got.domains), got.problem) == (case.fits, case.domains, case.problem)
    assert read <= 4 * len(case.nodes), f"{read} node reads for {len(case.nodes)} nodes"
    if not case.fits:  # what is said names every node, as before: the fit over all of them
        said = set(got.result.node_reasons) | set(got.result.placements)
        assert said == {n.name for n in case.nodes}


@dataclass
class Ranking:
    id: str
    gang: GangSpec
    nodes: list[Obj]
    bounded: bool = True
    """Whether the ranking reads each node a few times (False: a pod set free of the level,
    whose fit in each domain reads every node, as before)."""


def _hosts(n: int, *, not_ready_every: int = 0) -> list[Obj]:
    """`n` hosts of 8 GPUs, every third of 4; with `not_ready_every`, every such host not Ready
    (not usable: its domain's fit places nothing there)."""
    return [
        node(
            f"n{i:04d}",
            gpu=8 if i % 3 else 4,
            labels={"pool": "gpu"},
            ready=not (not_ready_every and i % not_ready_every == 0),
        )
        for i in range(n)
    ]


WHOLE = pod_template(gpu=8, node_selector={"pool": "gpu"})
SMALL = pod_template(gpu=1, node_selector={"pool": "gpu"})
RANKINGS = [
    Ranking(
        "a PodGroup kept on one host", GangSpec((("ps-0", 2, WHOLE),), together=HOST), _hosts(NODES)
    ),
    Ranking(
        "a Job's two pod sets required on one host",
        GangSpec((("a", 1, WHOLE), ("b", 2, SMALL)), {"a": HOST, "b": HOST}),
        _hosts(NODES),
    ),
    Ranking(
        "a PodGroup kept on one host, some hosts not Ready",
        GangSpec((("ps-0", 1, WHOLE),), together=HOST),
        _hosts(NODES, not_ready_every=4),
    ),
    Ranking(
        "a Job's pod set free of the level beside one required on a host",
        GangSpec((("a", 1, WHOLE), ("b", 2, SMALL)), {"a": HOST}),
        _hosts(60),
        bounded=False,
    ),
]


@pytest.mark.parametrize("case", RANKINGS, ids=lambda c: c.id)
def test_the_domains_an_attempt_asks_in_are_ranked_reading_each_node_a_few_times(
    case: Ranking, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where an attempt asks first ranks every domain by the members placeable there now:
    each domain's fit reads that domain's nodes alone, and places as many as the fit of the
    gang pinned there over every node (`fits_now`) does."""
    view = ClusterView(nodes=case.nodes)
    level = places.level_of(case.gang)
    assert level == HOST
    expected = {
        value: fits_now(view, places.pinned(case.gang, {}, (level, value))).placeable
        for value in sorted({n["metadata"]["labels"][HOST] for n in case.nodes})
    }
    read = 0
    by_name = fit._by_name

    def counting(nodes: Iterable[NodeView]) -> list[NodeView]:
        nonlocal read
        views = list(nodes)
        read += len(views)
        return by_name(views)

    monkeypatch.setattr(fit, "_by_name", counting)
    ranked = places.ranked_domains(case.gang, view, [])
    best_first = sorted(expected, key=lambda value: (-expected[value], value))
    assert ranked == best_first
    assert (read <= 4 * len(case.nodes)) is case.bounded, f"{read} node reads"
