"""Gang fit: does the whole gang fit on the nodes that exist, as kube-scheduler sees them?"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gangcheck.logic.placement.fit import (
    FitResult,
    GangPodSet,
    Member,
    Rejection,
    fit_gang,
    member_from_pod_spec,
    member_from_template,
    node_could_host,
    node_view,
    pod_requests,
    reason_lines,
    summarize,
    used_resources,
)
from gangcheck.logic.placement.quantity import NANO, parse_quantity

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
PROPERTY = settings(database=None, deadline=None, max_examples=300)


# --- builders --------------------------------------------------------------------------------


def node(
    name: str,
    *,
    gpu: int | str = 0,
    cpu: str = "32",
    memory: str = "128Gi",
    pods: str = "110",
    labels: dict[str, str] | None = None,
    taints: Sequence[Obj] = (),
    ready: bool = True,
    unschedulable: bool = False,
    allocatable: Obj | None = None,
) -> Obj:
    """A Node dict; `allocatable` replaces the one built from the other arguments."""
    built: Obj = {"cpu": cpu, "memory": memory, "pods": pods}
    if gpu:
        built[GPU] = str(gpu)
    status: Obj = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    status["allocatable"] = built if allocatable is None else allocatable
    return {
        "metadata": {
            "name": name,
            "labels": labels or {},
            "annotations": {"example.com/note": "x"},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"taints": list(taints), "unschedulable": unschedulable},
        "status": status,
    }


def deleting(raw: Obj) -> Obj:
    """The node with a deletionTimestamp (finalizers keep it while it drains)."""
    return {**raw, "metadata": {**raw["metadata"], "deletionTimestamp": "2026-01-02T00:00:00Z"}}


def taint(key: str = GPU, value: str = "present", effect: str = "NoSchedule") -> Obj:
    return {"key": key, "value": value, "effect": effect}


def toleration(key: str = GPU, operator: str = "Exists", value: str = "", effect: str = "") -> Obj:
    return {"key": key, "operator": operator, "value": value, "effect": effect}


def expr(key: str, operator: str, *values: str) -> Obj:
    return {"key": key, "operator": operator, "values": list(values)}


def affinity(*terms: Obj) -> Obj:
    required = {"nodeSelectorTerms": list(terms)}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def resources(*, gpu: int = 0, cpu: str | None = None, memory: str | None = None) -> Obj:
    requests: Obj = {}
    if gpu:
        requests[GPU] = str(gpu)
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
    return {"requests": requests}


def spec(
    *,
    gpu: int = 0,
    cpu: str | None = None,
    memory: str | None = None,
    selector: dict[str, str] | None = None,
    affinity: Obj | None = None,
    tolerations: Sequence[Obj] = (),
    init: Sequence[Obj] = (),
) -> Obj:
    """A pod spec with one container asking for `gpu`, `cpu` and `memory`."""
    out: Obj = {
        "containers": [{"name": "main", "resources": resources(gpu=gpu, cpu=cpu, memory=memory)}]
    }
    if selector:
        out["nodeSelector"] = selector
    if affinity:
        out["affinity"] = affinity
    if tolerations:
        out["tolerations"] = list(tolerations)
    if init:
        out["initContainers"] = list(init)
    return out


def member(**kwargs: Any) -> Member:
    return member_from_template({"metadata": {"labels": {"app": "x"}}, "spec": spec(**kwargs)})


def bound(node_name: str, *, phase: str = "Running", **kwargs: Any) -> Obj:
    return {"spec": {**spec(**kwargs), "nodeName": node_name}, "status": {"phase": phase}}


def fit(
    pod_sets: Sequence[tuple[str, int, Member]], nodes: Sequence[Obj], pods: Sequence[Obj] = ()
) -> FitResult:
    return fit_gang(pod_sets, [node_view(n) for n in nodes], pods)


# --- the gang, case by case ------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    pod_sets: list[tuple[str, int, Member]]
    nodes: list[Obj]
    fits: bool
    placeable: int
    pods: list[Obj] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)


CASES: dict[str, Case] = {
    "gang of 4 one-GPU members fits on two 2-GPU nodes": Case(
        [("worker", 4, member(gpu=1))],
        [node("gpu-1", gpu=2), node("gpu-2", gpu=2)],
        fits=True,
        placeable=4,
    ),
    "gang one member too big for the nodes places the rest and says so": Case(
        [("worker", 3, member(gpu=4))],
        [node("gpu-1", gpu=8), node("gpu-2", gpu=2)],
        fits=False,
        placeable=2,
        reasons={"gpu-2": "insufficient nvidia.com/gpu (requested 4, free 2)"},
    ),
    "taint without toleration leaves the node unusable and is named": Case(
        [("worker", 2, member(gpu=1))],
        [node("gpu-3", gpu=8, taints=[taint()])],
        fits=False,
        placeable=0,
        reasons={"gpu-3": "taint nvidia.com/gpu=present:NoSchedule not tolerated"},
    ),
    "toleration with the taint's key and value lets the gang on": Case(
        [("worker", 2, member(gpu=1, tolerations=[toleration(operator="Equal", value="present")]))],
        [node("gpu-3", gpu=8, taints=[taint()])],
        fits=True,
        placeable=2,
    ),
    "toleration with another value does not tolerate": Case(
        [("worker", 1, member(gpu=1, tolerations=[toleration(operator="Equal", value="other")]))],
        [node("gpu-3", gpu=8, taints=[taint()])],
        fits=False,
        placeable=0,
        reasons={"gpu-3": "taint nvidia.com/gpu=present:NoSchedule not tolerated"},
    ),
    "Exists toleration with empty key tolerates all": Case(
        [("worker", 1, member(gpu=1, tolerations=[toleration(key="")]))],
        [node("gpu-3", gpu=8, taints=[taint(), taint("dedicated", "ml", "NoExecute")])],
        fits=True,
        placeable=1,
    ),
    "toleration for another effect does not tolerate": Case(
        [("worker", 1, member(gpu=1, tolerations=[toleration(effect="NoExecute")]))],
        [node("gpu-3", gpu=8, taints=[taint()])],
        fits=False,
        placeable=0,
        reasons={"gpu-3": "taint nvidia.com/gpu=present:NoSchedule not tolerated"},
    ),
    "NoExecute taint blocks like NoSchedule": Case(
        [("worker", 1, member(gpu=1))],
        [node("gpu-3", gpu=8, taints=[taint("dedicated", "", "NoExecute")])],
        fits=False,
        placeable=0,
        reasons={"gpu-3": "taint dedicated:NoExecute not tolerated"},
    ),
    "PreferNoSchedule taint does not block": Case(
        [("worker", 1, member(gpu=1))],
        [node("gpu-3", gpu=8, taints=[taint(effect="PreferNoSchedule")])],
        fits=True,
        placeable=1,
    ),
    "unknown taint effect makes the node unusable": Case(
        [("worker", 1, member(gpu=1, tolerations=[toleration(key="")]))],
        [node("gpu-3", gpu=8, taints=[taint(effect="NoScheduleSometimes")])],
        fits=False,
        placeable=0,
        reasons={"gpu-3": 'unknown effect "NoScheduleSometimes"'},
    ),
    "already bound pods consume capacity": Case(
        [("worker", 1, member(gpu=4))],
        [node("gpu-1", gpu=8)],
        pods=[bound("gpu-1", gpu=6)],
        fits=False,
        placeable=0,
        reasons={"gpu-1": "insufficient nvidia.com/gpu (requested 4, free 2)"},
    ),
    "finished pods consume nothing": Case(
        [("worker", 1, member(gpu=4))],
        [node("gpu-1", gpu=8)],
        pods=[bound("gpu-1", gpu=6, phase="Succeeded"), bound("gpu-1", gpu=6, phase="Failed")],
        fits=True,
        placeable=1,
    ),
    "pods bound elsewhere do not count here": Case(
        [("worker", 1, member(gpu=8))],
        [node("gpu-1", gpu=8)],
        pods=[bound("gpu-9", gpu=8)],
        fits=True,
        placeable=1,
    ),
    "the pods allocatable caps members per node": Case(
        [("worker", 3, member(cpu="1"))],
        [node("cpu-1", pods="2")],
        fits=False,
        placeable=2,
    ),
    "bound pods count against the pods allocatable": Case(
        [("worker", 1, member(cpu="1"))],
        [node("cpu-1", pods="1")],
        pods=[bound("cpu-1")],
        fits=False,
        placeable=0,
        reasons={"cpu-1": "insufficient pods (requested 1, free 0)"},
    ),
    "malformed quantity makes the node unusable, never usable": Case(
        [("worker", 1, member(cpu="1"))],
        [node("x", allocatable={"cpu": "32", "pods": "110", GPU: "abc"})],
        fits=False,
        placeable=0,
        reasons={"x": 'malformed allocatable "nvidia.com/gpu": "abc"'},
    ),
    "missing allocatable makes the node unusable": Case(
        [("worker", 1, member())],
        [node("x", allocatable={})],
        fits=False,
        placeable=0,
        reasons={"x": "no allocatable resources reported"},
    ),
    "not Ready node takes nothing": Case(
        [("worker", 1, member(gpu=1))],
        [node("y", gpu=8, ready=False)],
        fits=False,
        placeable=0,
        reasons={"y": "not Ready"},
    ),
    "cordoned node takes nothing": Case(
        [("worker", 1, member(gpu=1))],
        [node("z", gpu=8, unschedulable=True)],
        fits=False,
        placeable=0,
        reasons={"z": "unschedulable (cordoned)"},
    ),
    "node being deleted takes nothing, however roomy and Ready": Case(
        [("worker", 1, member(gpu=1))],
        [deleting(node("d", gpu=8))],
        fits=False,
        placeable=0,
        reasons={"d": "being deleted"},
    ),
    "node being deleted is said so before it is said cordoned or not Ready": Case(
        [("worker", 1, member(gpu=1))],
        [deleting(node("d", gpu=8, ready=False, unschedulable=True))],
        fits=False,
        placeable=0,
        reasons={"d": "being deleted"},
    ),
    "node being deleted leaves the gang to the nodes that stay": Case(
        [("worker", 2, member(gpu=4))],
        [deleting(node("a", gpu=8)), node("b", gpu=8)],
        fits=True,
        placeable=2,
        reasons={"a": "being deleted"},
    ),
    "node selector mismatch is named with the label it needs": Case(
        [("worker", 1, member(gpu=1, selector={"pool": "gpu"}))],
        [node("x", gpu=8, labels={"pool": "cpu"}), node("gpu-1", gpu=8, labels={"pool": "gpu"})],
        fits=True,
        placeable=1,
    ),
    "node selector mismatch leaves the gang unplaced": Case(
        [("worker", 1, member(gpu=1, selector={"pool": "gpu"}))],
        [node("x", gpu=8, labels={"pool": "cpu"})],
        fits=False,
        placeable=0,
        reasons={"x": "node selector mismatch (needs pool=gpu)"},
    ),
    "In affinity admits only matching nodes": Case(
        [
            (
                "worker",
                2,
                member(
                    gpu=8, affinity=affinity({"matchExpressions": [expr("zone", "In", "a", "b")]})
                ),
            )
        ],
        [node("n1", gpu=8, labels={"zone": "a"}), node("n2", gpu=8, labels={"zone": "c"})],
        fits=False,
        placeable=1,
        reasons={"n2": "required node affinity not satisfied (zone In [a, b])"},
    ),
    "NotIn affinity excludes node": Case(
        [
            (
                "worker",
                1,
                member(
                    gpu=1, affinity=affinity({"matchExpressions": [expr("zone", "NotIn", "a")]})
                ),
            )
        ],
        [node("n1", gpu=8, labels={"zone": "a"})],
        fits=False,
        placeable=0,
        reasons={"n1": "required node affinity not satisfied (zone NotIn [a])"},
    ),
    "NotIn affinity admits a node without the label": Case(
        [
            (
                "worker",
                1,
                member(
                    gpu=1, affinity=affinity({"matchExpressions": [expr("zone", "NotIn", "a")]})
                ),
            )
        ],
        [node("n1", gpu=8)],
        fits=True,
        placeable=1,
    ),
    "Exists and DoesNotExist affinity test presence": Case(
        [
            (
                "a",
                1,
                member(gpu=8, affinity=affinity({"matchExpressions": [expr("spot", "Exists")]})),
            ),
            (
                "b",
                1,
                member(
                    gpu=4, affinity=affinity({"matchExpressions": [expr("spot", "DoesNotExist")]})
                ),
            ),
        ],
        [node("n1", gpu=8, labels={"spot": ""}), node("n2", gpu=4)],
        fits=True,
        placeable=2,
    ),
    "Gt and Lt affinity compare labels as integers": Case(
        [
            (
                "worker",
                2,
                member(
                    gpu=1,
                    affinity=affinity(
                        {
                            "matchExpressions": [
                                expr("mem-gb", "Gt", "40"),
                                expr("mem-gb", "Lt", "100"),
                            ]
                        }
                    ),
                ),
            )
        ],
        [
            node("n1", gpu=1, labels={"mem-gb": "80"}),
            node("n2", gpu=1, labels={"mem-gb": "9"}),
            node("n3", gpu=1, labels={"mem-gb": "a lot"}),
            node("n4", gpu=1, labels={"mem-gb": "100"}),
        ],
        fits=False,
        placeable=1,
        reasons={"n2": "mem-gb Gt [40]", "n3": "mem-gb Gt [40]", "n4": "mem-gb Lt [100]"},
    ),
    "affinity terms are ORed": Case(
        [
            (
                "worker",
                2,
                member(
                    gpu=1,
                    affinity=affinity(
                        {"matchExpressions": [expr("zone", "In", "a")]},
                        {"matchExpressions": [expr("zone", "In", "b")]},
                    ),
                ),
            )
        ],
        [node("n1", gpu=1, labels={"zone": "a"}), node("n2", gpu=1, labels={"zone": "b"})],
        fits=True,
        placeable=2,
    ),
    "an empty affinity term matches no node": Case(
        [("worker", 1, member(gpu=1, affinity=affinity({})))],
        [node("n1", gpu=1)],
        fits=False,
        placeable=0,
        reasons={"n1": "required node affinity not satisfied"},
    ),
    "matchFields on metadata.name pins the node": Case(
        [
            (
                "worker",
                1,
                member(
                    gpu=8, affinity=affinity({"matchFields": [expr("metadata.name", "In", "n2")]})
                ),
            )
        ],
        [node("n1", gpu=8), node("n2", gpu=8)],
        fits=True,
        placeable=1,
    ),
    "an extended resource the node lacks leaves it unused": Case(
        [("worker", 1, member(gpu=1))],
        [node("cpu-1")],
        fits=False,
        placeable=0,
        reasons={"cpu-1": "insufficient nvidia.com/gpu (requested 1, free 0)"},
    ),
    "memory shortfalls are shown in binary units": Case(
        [("worker", 1, member(memory="64Gi"))],
        [node("cpu-1", memory="32Gi")],
        fits=False,
        placeable=0,
        reasons={"cpu-1": "insufficient memory (requested 64Gi, free 32Gi)"},
    ),
    "two pod sets compete for one node": Case(
        [("launcher", 1, member(gpu=4)), ("worker", 1, member(gpu=6))],
        [node("gpu-1", gpu=8)],
        fits=False,
        placeable=1,
    ),
    "launcher and workers share the nodes": Case(
        [("launcher", 1, member(cpu="2")), ("worker", 4, member(gpu=4, cpu="8"))],
        [node("gpu-1", gpu=8, cpu="18"), node("gpu-2", gpu=8, cpu="16")],
        fits=True,
        placeable=5,
    ),
    "best fit keeps the big node for the big member": Case(
        [("small", 2, member(gpu=1)), ("big", 1, member(gpu=8))],
        [node("a-big", gpu=8), node("b-small", gpu=2)],
        fits=True,
        placeable=3,
    ),
    "another pod-set order is tried when biggest first strands a member": Case(
        [("gpu", 1, member(gpu=1, cpu="500m")), ("cpu", 1, member(cpu="2"))],
        [node("n0", gpu=8, cpu="1"), node("n1", gpu=1, cpu="2")],
        fits=True,
        placeable=2,
    ),
    "no nodes means nothing placeable": Case(
        [("worker", 3, member(gpu=1))],
        [],
        fits=False,
        placeable=0,
    ),
    "an empty gang fits": Case([], [node("n1")], fits=True, placeable=0),
    "a pod set of count zero is left out": Case(
        [("worker", 0, member(gpu=64)), ("launcher", 1, member())],
        [node("n1")],
        fits=True,
        placeable=1,
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_fit_gang(case: Case) -> None:
    result = fit(case.pod_sets, case.nodes, case.pods)
    assert (result.fits, result.placeable) == (case.fits, case.placeable)
    assert result.total == sum(count for _, count, _ in case.pod_sets)
    for name, text in case.reasons.items():
        assert text in str(result.node_reasons[name])


def test_placements_name_the_pod_set_of_every_member() -> None:
    result = fit(
        [("launcher", 1, member(cpu="1")), ("worker", 2, member(gpu=4))],
        [node("gpu-1", gpu=8), node("gpu-2", cpu="4")],
    )
    assert result.placements == {"gpu-1": ("worker", "worker"), "gpu-2": ("launcher",)}
    assert result.unplaced == {}


def test_fit_gang_accepts_gang_pod_sets_and_dedupes_nodes_by_name() -> None:
    view = node_view(node("gpu-1", gpu=2))
    result = fit_gang([GangPodSet("worker", 2, member(gpu=2))], [view, view])
    assert (result.fits, result.placeable) == (False, 1)


def test_unusable_nodes_are_reported_even_when_the_gang_fits() -> None:
    result = fit([("worker", 1, member())], [node("a"), node("b", ready=False)])
    assert result.fits
    assert reason_lines(result) == ['node "b": not Ready']


def test_reasons_speak_of_the_first_pod_set_left_over() -> None:
    result = fit(
        [("launcher", 1, member(cpu="1")), ("worker", 2, member(gpu=1))],
        [node("cpu-1")],
    )
    assert result.blocking_pod_set == "worker"
    assert result.unplaced == {"worker": 2}
    assert result.node_reasons == {}  # cpu-1 took the launcher, so it took something


# --- members: requests as kube-scheduler counts them -----------------------------------------


def container(*, restart: str | None = None, **requests: str) -> Obj:
    out: Obj = {"name": "c", "resources": {"requests": dict(requests)}}
    if restart:
        out["restartPolicy"] = restart
    return out


REQUESTS: dict[str, tuple[Obj, dict[str, str]]] = {
    "containers' requests add up": (
        {"containers": [container(cpu="1"), container(cpu="500m", memory="1Gi")]},
        {"cpu": "1500m", "memory": "1Gi"},
    ),
    "an init container bigger than the containers sets the peak": (
        {
            "containers": [container(cpu="1")],
            "initContainers": [container(cpu="4"), container(cpu="2")],
        },
        {"cpu": "4"},
    ),
    "init containers smaller than the containers change nothing": (
        {
            "containers": [container(cpu="2", memory="1Gi")],
            "initContainers": [container(cpu="1", memory="2Gi")],
        },
        {"cpu": "2", "memory": "2Gi"},
    ),
    "a sidecar init container adds to the containers and to later init containers": (
        {
            "containers": [container(cpu="1")],
            "initContainers": [container(restart="Always", cpu="1"), container(cpu="3")],
        },
        {"cpu": "4"},
    ),
    "limits fill in missing requests": (
        {
            "containers": [
                {
                    "name": "c",
                    "resources": {"limits": {GPU: "2", "cpu": "4"}, "requests": {"cpu": "1"}},
                }
            ]
        },
        {GPU: "2", "cpu": "1"},
    ),
    "pod overhead is added": (
        {"containers": [container(cpu="1")], "overhead": {"cpu": "250m"}},
        {"cpu": "1250m"},
    ),
    "pod-level resources override the containers' sum": (
        {
            "containers": [container(cpu="1"), container(cpu="1")],
            "resources": {"requests": {"cpu": "3"}},
        },
        {"cpu": "3"},
    ),
    "a pod without containers asks only for a pod slot": ({}, {}),
}


@pytest.mark.parametrize(("pod_spec", "expected"), list(REQUESTS.values()), ids=list(REQUESTS))
def test_pod_requests(pod_spec: Obj, expected: dict[str, str]) -> None:
    wanted = {name: parse_quantity(value) for name, value in expected.items()}
    assert pod_requests(pod_spec) == {**wanted, "pods": NANO}


def test_member_reads_selector_tolerations_and_affinity() -> None:
    m = member_from_pod_spec(
        spec(
            gpu=1,
            selector={"pool": "gpu"},
            tolerations=[toleration()],
            affinity=affinity({"matchExpressions": [expr("zone", "In", "a")]}),
        )
    )
    assert m.node_selector == {"pool": "gpu"}
    assert m.tolerations[0].key == GPU
    assert m.affinity is not None and str(m.affinity[0].expressions[0]) == "zone In [a]"
    assert member().affinity is None


def test_used_resources_sum_live_bound_pods_per_node() -> None:
    used = used_resources(
        [
            bound("n1", gpu=2),
            bound("n1", gpu=1, phase="Pending"),
            bound("n1", gpu=4, phase="Succeeded"),
            {"spec": spec(gpu=8), "status": {"phase": "Pending"}},
        ]
    )
    assert used == {"n1": {GPU: 3 * NANO, "pods": 2 * NANO}}


# --- nodes -----------------------------------------------------------------------------------


def test_node_view_reads_the_node() -> None:
    view = node_view(node("gpu-1", gpu=8, labels={"pool": "gpu"}, taints=[taint()]))
    assert view.name == "gpu-1"
    assert view.labels == {"pool": "gpu"}
    assert view.annotations == {"example.com/note": "x"}
    assert view.created == "2026-01-01T00:00:00Z"
    assert view.allocatable[GPU] == 8 * NANO
    assert str(view.taints[0]) == "nvidia.com/gpu=present:NoSchedule"
    assert (view.ready, view.unschedulable, view.is_usable) == (True, False, True)


def test_node_without_a_ready_condition_is_not_ready() -> None:
    raw = node("n1")
    raw["status"]["conditions"] = []
    assert node_view(raw).problem == Rejection("not Ready", kind="not-ready")


def test_node_could_host_ignores_usage_but_not_constraints() -> None:
    gpu_member = member(gpu=8, selector={"pool": "gpu"})
    assert node_could_host(gpu_member, node_view(node("n1", gpu=8, labels={"pool": "gpu"})))
    assert not node_could_host(gpu_member, node_view(node("n2", gpu=8)))
    assert not node_could_host(gpu_member, node_view(node("n3", gpu=4, labels={"pool": "gpu"})))
    assert not node_could_host(
        gpu_member, node_view(node("n4", gpu=8, labels={"pool": "gpu"}, ready=False))
    )


# --- words -----------------------------------------------------------------------------------


SUMMARIES: dict[str, tuple[FitResult, str]] = {
    "a fit says how many members on how many nodes": (
        fit([("worker", 4, member(gpu=1))], [node("gpu-1", gpu=2), node("gpu-2", gpu=2)]),
        "4 of 4 members placeable on 2 nodes",
    ),
    "identical reasons are grouped": (
        fit(
            [("worker", 8, member(gpu=1))],
            [node("gpu-1", gpu=5)] + [node(f"gpu-{i}", gpu=8, taints=[taint()]) for i in (2, 3, 4)],
        ),
        "5 of 8 members placeable on 1 node; 3 nodes can take none: "
        "3 × taint nvidia.com/gpu:NoSchedule not tolerated",  # noqa: RUF001
    ),
    "groups are ordered by size": (
        fit(
            [("worker", 1, member(gpu=1))],
            [
                node("a", gpu=1, ready=False),
                node("b", gpu=1, taints=[taint()]),
                node("c", gpu=1, taints=[taint()]),
            ],
        ),
        "0 of 1 members placeable; 3 nodes can take none: "
        "2 × taint nvidia.com/gpu:NoSchedule not tolerated, 1 × not Ready",  # noqa: RUF001
    ),
    "nodes too small for a member even empty are not counted": (
        fit(
            [("worker", 1, member(gpu=1))],
            [node("a", gpu=1, ready=False), node("cpu-1"), node("cpu-2")],
        ),
        "0 of 1 members placeable; 1 node can take none: 1 × not Ready",  # noqa: RUF001
    ),
    "nodes the gang's selector rules out are not counted among those that cannot take it": (
        fit(
            [("worker", 1, member(gpu=1, selector={"pool": "gpu"}))],
            [node(f"gpu-{i}", gpu=8, taints=[taint()], labels={"pool": "gpu"}) for i in (1, 2)]
            + [node(f"cpu-{i}", labels={"pool": "cpu"}) for i in (1, 2)],
        ),
        "0 of 1 members placeable; 2 nodes can take none: "
        "2 × taint nvidia.com/gpu:NoSchedule not tolerated",  # noqa: RUF001
    ),
    "no node the gang selects: said once, the other nodes not counted": (
        fit(
            [("worker", 1, member(gpu=1, selector={"pool": "gpu"}))],
            [node(f"cpu-{i}", labels={"pool": "cpu"}) for i in (1, 2)],
        ),
        "0 of 1 members placeable; no node could take a member even empty: "
        "node selector mismatch (needs pool=gpu)",
    ),
    "no nodes at all is said plainly": (
        fit([("worker", 2, member(gpu=1))], []),
        "0 of 2 members placeable; no nodes",
    ),
    "full nodes in use are said plainly": (
        fit([("worker", 3, member(gpu=1))], [node("gpu-1", gpu=2)]),
        "2 of 3 members placeable on 1 node; the nodes in use have no room for the rest",
    ),
    "several pod sets name what is left over": (
        fit([("launcher", 1, member(cpu="1")), ("worker", 2, member(gpu=1))], [node("c", gpu=1)]),
        "2 of 3 members placeable on 1 node (left over: worker 1); "
        "the nodes in use have no room for the rest",
    ),
}


@pytest.mark.parametrize(("result", "text"), list(SUMMARIES.values()), ids=list(SUMMARIES))
def test_summarize(result: FitResult, text: str) -> None:
    assert summarize(result) == text


def test_summary_stays_short_with_many_distinct_reasons() -> None:
    nodes = [node(f"n{i}", labels={"pool": f"p{i}"}) for i in range(60)]
    result = fit(
        [("worker", 1, member(selector={"pool": "gpu", f"very-long-label-{'x' * 40}": "y"}))], nodes
    )
    text = summarize(result)
    assert len(text) <= 300
    assert text.startswith("0 of 1 members placeable; no node could take a member even empty: ")
    nodes = [node(f"n{i}", gpu=1, ready=False) for i in range(3)] + [
        node(f"m{i}", gpu=1, taints=[taint(key=f"k{i}-{'y' * 50}")]) for i in range(20)
    ]
    text = summarize(fit([("worker", 1, member(gpu=1))], nodes))
    assert len(text) <= 300
    assert "3 × not Ready" in text  # noqa: RUF001
    assert text.endswith(" more")


def test_reason_lines_quote_node_names() -> None:
    result = fit([("worker", 1, member(gpu=8))], [node("gpu-1", gpu=4)])
    assert reason_lines(result) == [
        'node "gpu-1": insufficient nvidia.com/gpu (requested 8, free 4)'
    ]


# --- properties ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodePlan:
    """A node in plain numbers, so that a placement can be rechecked without fit.py."""

    name: str
    gpu: int
    cpu_m: int
    pods: int
    pool: str | None
    tainted: bool
    ready: bool

    def build(self) -> Obj:
        labels = {"pool": self.pool} if self.pool else {}
        taints = [taint()] if self.tainted else []
        return node(
            self.name,
            gpu=self.gpu,
            cpu=f"{self.cpu_m}m",
            pods=str(self.pods),
            labels=labels,
            taints=taints,
            ready=self.ready,
        )


@dataclass(frozen=True)
class SetPlan:
    name: str
    count: int
    gpu: int
    cpu_m: int
    pool: str | None
    by_affinity: bool
    tolerates: bool

    def build(self) -> tuple[str, int, Member]:
        selector = {"pool": self.pool} if self.pool and not self.by_affinity else None
        term = {"matchExpressions": [expr("pool", "In", self.pool)]} if self.pool else {}
        return (
            self.name,
            self.count,
            member(
                gpu=self.gpu,
                cpu=f"{self.cpu_m}m" if self.cpu_m else None,
                selector=selector,
                affinity=affinity(term) if self.pool and self.by_affinity else None,
                tolerations=[toleration()] if self.tolerates else [],
            ),
        )


@dataclass(frozen=True)
class PodPlan:
    node: str
    gpu: int
    cpu_m: int

    def build(self) -> Obj:
        return bound(self.node, gpu=self.gpu, cpu=f"{self.cpu_m}m" if self.cpu_m else None)


@dataclass(frozen=True)
class Scenario:
    nodes: list[NodePlan]
    sets: list[SetPlan]
    pods: list[PodPlan]

    def run(self) -> FitResult:
        return fit(
            [s.build() for s in self.sets],
            [n.build() for n in self.nodes],
            [p.build() for p in self.pods],
        )


NODE_NAMES = [f"n{i}" for i in range(10)]
POOLS = st.sampled_from([None, "gpu", "cpu"])


NODE_SHAPES = st.tuples(
    st.sampled_from([0, 1, 2, 4, 8]),  # gpu
    st.integers(min_value=0, max_value=16).map(lambda n: n * 500),  # cpu in millis
    st.integers(min_value=0, max_value=6),  # pods
    POOLS,
    st.booleans(),  # tainted
    st.sampled_from([True, True, True, False]),  # ready
)
SET_SHAPES = st.tuples(
    st.integers(min_value=0, max_value=6),  # count
    st.sampled_from([0, 1, 2, 4]),  # gpu
    st.integers(min_value=0, max_value=8).map(lambda n: n * 250),  # cpu in millis
    POOLS,
    st.booleans(),  # by affinity rather than node selector
    st.booleans(),  # tolerates the GPU taint
)
POD_PLANS = st.builds(
    PodPlan,
    node=st.sampled_from(NODE_NAMES),
    gpu=st.sampled_from([0, 1, 2]),
    cpu_m=st.integers(min_value=0, max_value=4).map(lambda n: n * 500),
)


@st.composite
def scenarios(draw: st.DrawFn, *, max_sets: int = 3) -> Scenario:
    names = draw(st.permutations(NODE_NAMES))
    node_shapes = draw(st.lists(NODE_SHAPES, max_size=6))
    set_shapes = draw(st.lists(SET_SHAPES, max_size=max_sets))
    return Scenario(
        nodes=[NodePlan(name, *shape) for name, shape in zip(names, node_shapes, strict=False)],
        sets=[SetPlan(name, *shape) for name, shape in zip("abcd", set_shapes, strict=False)],
        pods=draw(st.lists(POD_PLANS, max_size=4)),
    )


def assert_feasible(scenario: Scenario, result: FitResult) -> None:
    """Recheck every reported placement from the plain numbers alone."""
    nodes = {n.name: n for n in scenario.nodes}
    sets = {s.name: s for s in scenario.sets}
    placed = Counter(name for members in result.placements.values() for name in members)
    for s in scenario.sets:
        assert placed[s.name] + result.unplaced.get(s.name, 0) == s.count
    for node_name, members in result.placements.items():
        n, here = nodes[node_name], [sets[m] for m in members]
        assert n.ready
        assert all(s.pool in (None, n.pool) and (s.tolerates or not n.tainted) for s in here)
        pods = [p for p in scenario.pods if p.node == node_name]
        # Like kube-scheduler, a resource limits only members that ask for it: bound pods
        # may overcommit what no member here requests.
        if any(s.gpu for s in here):
            assert sum(s.gpu for s in here) + sum(p.gpu for p in pods) <= n.gpu
        if any(s.cpu_m for s in here):
            assert sum(s.cpu_m for s in here) + sum(p.cpu_m for p in pods) <= n.cpu_m
        assert len(here) + len(pods) <= n.pods
    assert result.placeable == sum(placed.values())
    assert result.fits == (result.placeable == result.total)
    assert not set(result.node_reasons) & set(result.placements)


@PROPERTY
@given(scenarios(max_sets=4))
def test_any_reported_placement_is_feasible(scenario: Scenario) -> None:
    assert_feasible(scenario, scenario.run())


@PROPERTY
@given(scenarios(max_sets=1))
def test_identical_members_are_placed_exactly(scenario: Scenario) -> None:
    result = scenario.run()
    if not scenario.sets:
        return
    s = scenario.sets[0]
    room = 0
    for n in scenario.nodes:
        if not n.ready or s.pool not in (None, n.pool) or (n.tainted and not s.tolerates):
            continue
        pods = [p for p in scenario.pods if p.node == n.name]
        limits = [n.pods - len(pods)]
        if s.gpu:
            limits.append((n.gpu - sum(p.gpu for p in pods)) // s.gpu)
        if s.cpu_m:
            limits.append((n.cpu_m - sum(p.cpu_m for p in pods)) // s.cpu_m)
        room += max(0, min(limits))
    assert result.placeable == min(s.count, room)


@PROPERTY
@given(scenarios(max_sets=2), st.sampled_from(NODE_NAMES), st.data())  # proven up to two
def test_adding_a_node_never_reduces_placeable(
    scenario: Scenario, name: str, data: st.DataObject
) -> None:
    if name in {n.name for n in scenario.nodes}:
        return
    extra = NodePlan(name, *data.draw(NODE_SHAPES))
    bigger = replace(scenario, nodes=[*scenario.nodes, extra])
    assert bigger.run().placeable >= scenario.run().placeable


@PROPERTY
@given(scenarios(max_sets=1))
def test_removing_all_taints_and_selectors_never_reduces_placeable(scenario: Scenario) -> None:
    """Exact for one pod set; with more, a freed member can take another pod set's room."""
    freed = Scenario(
        nodes=[replace(n, tainted=False) for n in scenario.nodes],
        sets=[replace(s, pool=None) for s in scenario.sets],
        pods=scenario.pods,
    )
    assert freed.run().placeable >= scenario.run().placeable


@PROPERTY
@given(scenarios(max_sets=3))
def test_summary_is_one_short_line(scenario: Scenario) -> None:
    text = summarize(scenario.run())
    assert "\n" not in text
    assert len(text) <= 300
