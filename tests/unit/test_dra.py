"""DRA devices in the gang fit: claims of members, devices of nodes, allocation member by member."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gangcheck.logic.attempt.explain import World, place
from gangcheck.logic.placement.dra import (
    ClaimNeeds,
    DeviceRoom,
    DraContext,
    Inventory,
    NodeScope,
    Shortfall,
    Usage,
    allocate,
    build_inventory,
    claim_needs,
    compile_selector,
)
from gangcheck.logic.placement.fit import (
    NodeView,
    fit_gang,
    host_rejection,
    member_from_pod_spec,
    member_from_template,
    node_devices,
    node_view,
    reason_lines,
    scope_reaches,
    summarize,
)
from gangcheck.logic.placement.usage import NodeUsage

Obj = dict[str, Any]
DRIVER = "gpu.example.com"
NIC = "nic.example.com"


# --- builders --------------------------------------------------------------------------------


def device(name: str, *, model: str = "a100", numa: int = 0, **extra: Any) -> Obj:
    """A device entry of a slice; `extra` adds its other fields (capacity, taints, ...)."""
    attributes: Obj = {"model": {"string": model}, f"{DRIVER}/numa": {"int": numa}}
    attributes.update(extra.pop("attributes", {}))
    return {"name": name, "attributes": attributes, **extra}


def gpus(count: int, **kw: Any) -> list[Obj]:
    return [device(f"gpu-{i}", **kw) for i in range(count)]


def rslice(
    name: str,
    devices: Sequence[Obj] = (),
    *,
    node: str | None = "n1",
    pool: str = "",
    driver: str = DRIVER,
    generation: int = 1,
    count: int = 1,
    **spec: Any,
) -> Obj:
    """A ResourceSlice; by default of node `node`, alone in a pool named after the node."""
    body: Obj = {
        "driver": driver,
        "pool": {
            "name": pool or node or name,
            "generation": generation,
            "resourceSliceCount": count,
        },
        **spec,
    }
    if devices:
        body["devices"] = list(devices)
    if node and not {"nodeSelector", "allNodes", "perDeviceNodeSelection"} & set(spec):
        body["nodeName"] = node
    return {"metadata": {"name": name}, "spec": body}


def device_class(name: str = "gpu", *expressions: str, driver: str = DRIVER) -> Obj:
    selectors = [f'device.driver == "{driver}"', *expressions] if driver else list(expressions)
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in selectors]},
    }


def cel(*expressions: str) -> list[Obj]:
    return [{"cel": {"expression": e}} for e in expressions]


def exactly(name: str = "g", count: int | None = None, cls: str = "gpu", **extra: Any) -> Obj:
    request: Obj = {"deviceClassName": cls, **extra}
    if count is not None:
        request["count"] = count
    return {"name": name, "exactly": request}


def first_available(name: str, *subrequests: Obj) -> Obj:
    return {
        "name": name,
        "firstAvailable": [{"name": s["name"], **s["exactly"]} for s in subrequests],
    }


def template(name: str, requests: Sequence[Obj], constraints: Sequence[Obj] = ()) -> Obj:
    devices: Obj = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = list(constraints)
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"spec": {"devices": devices}}}


def pod_spec(claims: Sequence[tuple[str, str]] = (("gpu", "tpl"),), cpu: str = "1") -> Obj:
    """A pod spec whose claims are (claim name, template name); `named:` for a ResourceClaim."""
    entries = [
        {"name": n, "resourceClaimName": t[len("named:") :]}
        if t.startswith("named:")
        else {"name": n, "resourceClaimTemplateName": t}
        for n, t in claims
    ]
    container = {
        "name": "main",
        "resources": {"requests": {"cpu": cpu}, "claims": [{"name": n} for n, _ in claims]},
    }
    return {"containers": [container], "resourceClaims": entries}


def allocated(name: str, *devices: str, pool: str = "n1", **result: Any) -> Obj:
    """A ResourceClaim with `devices` (of `pool`) allocated."""
    results = [
        {"request": "g", "driver": DRIVER, "pool": pool, "device": d, **result} for d in devices
    ]
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": {"requests": [exactly()]}},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def node(name: str = "n1", labels: dict[str, str] | None = None, cpu: str = "32") -> NodeView:
    return node_view(node_obj(name, labels, cpu))


def node_obj(name: str, labels: dict[str, str] | None = None, cpu: str = "32") -> Obj:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "256Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


# --- one node, member after member -----------------------------------------------------------


@dataclass
class Case:
    """Members with `requests` (one claim, "gpu") placed one after another on node n1."""

    requests: list[Obj]
    slices: list[Obj]
    placed: int
    reason: str = ""
    """In the reason the next member does not fit (str: the detail)."""
    members: int = 0
    """How many to try; default one more than `placed`."""
    classes: list[Obj] = field(default_factory=lambda: [device_class()])
    claims: list[Obj] = field(default_factory=list)
    constraints: list[Obj] = field(default_factory=list)
    node: NodeView = field(default_factory=node)


def run(case: Case) -> tuple[int, Shortfall | None]:
    inventory = build_inventory(case.slices, case.classes, case.claims)
    needs = claim_needs(pod_spec(), {"tpl": template("tpl", case.requests, case.constraints)})
    on_node = node_devices(inventory, case.node)
    usage, placed = inventory.used, 0
    for _ in range(case.members or case.placed + 1):
        outcome = allocate(needs, on_node, usage)
        if isinstance(outcome, Shortfall):
            return placed, outcome
        usage, placed = outcome, placed + 1
    return placed, None


COUNTERS = {
    "name": "gpu-0-counters",
    "counters": {"memory": {"value": "80Gi"}, "slices": {"value": "8"}},
}


def partition(name: str, memory: str, slices: str, profile: str) -> Obj:
    return device(
        name,
        attributes={"profile": {"string": profile}},
        consumesCounters=[
            {
                "counterSet": "gpu-0-counters",
                "counters": {"memory": {"value": memory}, "slices": {"value": slices}},
            }
        ],
    )


PARTITIONS = [
    rslice("counters", node="n1", pool="n1", count=2, sharedCounters=[COUNTERS]),
    rslice(
        "partitions",
        [
            partition("whole", "80Gi", "8", "whole"),
            partition("half-0", "40Gi", "4", "half"),
            partition("half-1", "40Gi", "4", "half"),
        ],
        node="n1",
        pool="n1",
        count=2,
    ),
]
BANDWIDTH = {
    "bandwidth": {
        "value": "100",
        "requestPolicy": {"default": "10", "validRange": {"min": "10", "step": "25"}},
    }
}
SHARED_NIC = rslice("nic", [device("nic-0", capacity=BANDWIDTH, allowMultipleAllocations=True)])
CASES: dict[str, Case] = {
    "count: two devices a member, four on the node": Case(
        [exactly(count=2)],
        [rslice("s", gpus(4))],
        placed=2,
        reason='claim "gpu" request "g": 2 devices of class "gpu" needed, 0 free',
    ),
    "count defaults to one": Case(
        [exactly()],
        [rslice("s", gpus(3))],
        placed=3,
        reason='claim "gpu" request "g": 1 device of class "gpu" needed, 0 free',
    ),
    "a partial shortfall says how many are free": Case(
        [exactly(count=3)],
        [rslice("s", gpus(5))],
        placed=1,
        reason='3 devices of class "gpu" needed, 2 free',
    ),
    "All takes every matching device": Case(
        [exactly(allocationMode="All")],
        [rslice("s", gpus(3))],
        placed=1,
        reason='claim "gpu" request "g": all 3 devices of class "gpu" needed, 0 free',
    ),
    "All needs at least one device": Case(
        [exactly(allocationMode="All")],
        [rslice("s", gpus(2), node="n2")],
        placed=0,
        reason='all devices of class "gpu" needed, none on the node',
    ),
    "All fails when one matching device is in use": Case(
        [exactly(allocationMode="All")],
        [rslice("s", gpus(3))],
        claims=[allocated("busy", "gpu-1")],
        placed=0,
        reason='all 3 devices of class "gpu" needed, 2 free',
    ),
    "All fails on a node a pool being updated reaches": Case(
        [exactly(allocationMode="All")],
        [rslice("s", gpus(2)), rslice("half", gpus(1), node="n1", pool="p2", count=2)],
        placed=0,
        reason=f'pool "{DRIVER}/p2" is being updated or invalid',
    ),
    "firstAvailable: the first subrequest when it fits": Case(
        [first_available("g", exactly("big", count=4), exactly("small", count=1))],
        [rslice("s", gpus(5))],
        placed=2,
        reason='claim "gpu" request "g": no subrequest can be satisfied '
        '(claim "gpu" request "g/big": 4 devices of class "gpu" needed, 0 free; '
        'claim "gpu" request "g/small": 1 device of class "gpu" needed, 0 free)',
    ),
    "class selectors apply to every request of the class": Case(
        [exactly()],
        [rslice("s", [*gpus(2), device("h-0", model="h100"), device("h-1", model="h100")])],
        classes=[device_class("gpu", f'device.attributes["{DRIVER}"].model == "h100"')],
        placed=2,
    ),
    "attribute selector, dotted": Case(
        [exactly(selectors=cel(f'device.attributes["{DRIVER}"].model == "h100"'))],
        [rslice("s", [*gpus(3), device("h-0", model="h100")])],
        placed=1,
    ),
    "attribute selector, indexed, against a qualified attribute": Case(
        [exactly(selectors=cel(f'device.attributes["{DRIVER}"]["numa"] != 0'))],
        [rslice("s", [device("a", numa=0), device("b", numa=1), device("c", numa=2)])],
        placed=2,
    ),
    "integer comparisons": Case(
        [
            exactly(
                selectors=cel(
                    f'device.attributes["{DRIVER}"].numa >= 1 && '
                    f'device.attributes["{DRIVER}"].numa < 3'
                )
            )
        ],
        [rslice("s", [device(f"d{i}", numa=i) for i in range(5)])],
        placed=2,
    ),
    "a bool attribute alone, and ||": Case(
        [
            exactly(
                selectors=cel(
                    f'device.attributes["{DRIVER}"].fast || !has(device.attributes'
                    f'["{DRIVER}"].fast)'
                )
            )
        ],
        [
            rslice(
                "s",
                [
                    device("fast", attributes={"fast": {"bool": True}}),
                    device("slow", attributes={"fast": {"bool": False}}),
                    device("plain"),
                ],
            )
        ],
        placed=2,
    ),
    "capacity selector with compareTo": Case(
        [
            exactly(
                selectors=cel(
                    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'
                )
            )
        ],
        [
            rslice(
                "s",
                [
                    device("big", capacity={"memory": {"value": "80Gi"}}),
                    device("small", capacity={"memory": {"value": "20Gi"}}),
                    device("exact", capacity={f"{DRIVER}/memory": {"value": "40Gi"}}),
                ],
            )
        ],
        placed=2,
    ),
    "capacity selector with isGreaterThan": Case(
        [
            exactly(
                selectors=cel(f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("40Gi"))')
            )
        ],
        [
            rslice(
                "s",
                [
                    device("big", capacity={"memory": {"value": "80Gi"}}),
                    device("exact", capacity={"memory": {"value": "40Gi"}}),
                ],
            )
        ],
        placed=1,
    ),
    "a selector gangcheck cannot evaluate: no fit, and said": Case(
        [exactly(selectors=cel(f'device.attributes["{DRIVER}"].model.startsWith("a")'))],
        [rslice("s", gpus(4))],
        placed=0,
        reason=f'claim "gpu": CEL selector gangcheck cannot evaluate: '
        f'device.attributes["{DRIVER}"].model.startsWith("a")',
    ),
    "a class selector gangcheck cannot evaluate": Case(
        [exactly()],
        [rslice("s", gpus(4))],
        classes=[device_class("gpu", "device.attributes.exists(d, true)")],
        placed=0,
        reason='claim "gpu": DeviceClass "gpu": CEL selector gangcheck cannot evaluate: '
        "device.attributes.exists(d, true)",
    ),
    "a missing attribute is a CEL error, which stops allocation": Case(
        [exactly(selectors=cel(f'device.attributes["{DRIVER}"].memoryGB > 10'))],
        [rslice("s", gpus(2))],
        placed=0,
        reason=f'CEL selector fails on device "{DRIVER}/n1/gpu-0": no such key: memoryGB',
    ),
    "false && error is false, as in CEL": Case(
        [
            exactly(
                selectors=cel(f'device.attributes["{NIC}"].speed > 10 && device.driver == "{NIC}"')
            )
        ],
        [rslice("s", gpus(2))],
        placed=0,
        reason='1 device of class "gpu" needed, 0 free',
    ),
    "values of different types are unequal": Case(
        [exactly(selectors=cel(f'device.attributes["{DRIVER}"].numa == "0"'))],
        [rslice("s", gpus(2))],
        placed=0,
        reason="0 free",
    ),
    "ordering values of different types is a CEL error": Case(
        [exactly(selectors=cel(f'device.attributes["{DRIVER}"].model > 3'))],
        [rslice("s", gpus(2))],
        placed=0,
        reason="no matching overload for '_>_' applied to (string, int)",
    ),
    "partitionable: halves until the shared counters run out": Case(
        [exactly(selectors=cel(f'device.attributes["{DRIVER}"].profile == "half"'))],
        PARTITIONS,
        placed=2,
        reason='1 device of class "gpu" needed, 0 free',
    ),
    "partitionable: the whole device exhausts the counters its halves need": Case(
        [exactly()],
        PARTITIONS,
        placed=1,
        reason='1 device of class "gpu" needed, 0 free',
    ),
    "partitionable: an allocated half leaves no room for the whole device": Case(
        [exactly(selectors=cel(f'device.attributes["{DRIVER}"].profile == "whole"'))],
        PARTITIONS,
        claims=[allocated("busy", "half-1")],
        placed=0,
    ),
    "consumable capacity: one device shared by two members": Case(
        [exactly(capacity={"requests": {"bandwidth": "35"}})],
        [SHARED_NIC],
        placed=2,  # 35 is a step of the policy (10, 35, 60, ...): 70 of 100, a third 105
        reason='1 device of class "gpu" needed, 0 free',
    ),
    "consumable capacity: a request above the policy's steps is refused": Case(
        [exactly(capacity={"requests": {"bandwidth": "90"}})],
        [SHARED_NIC],
        placed=0,  # 90 rounds up to 110, more than the device has
    ),
    "consumable capacity: the request policy rounds up, the sum stays within": Case(
        [exactly(capacity={"requests": {"bandwidth": "30"}})],
        [SHARED_NIC],
        placed=2,  # 30 rounds up to 35 each; a third makes 105 > 100
        reason='1 device of class "gpu" needed, 0 free',
    ),
    "consumable capacity: the default when nothing is asked": Case(
        [exactly()],
        [SHARED_NIC],
        placed=10,
    ),
    "consumable capacity already consumed by an allocated claim": Case(
        [exactly(capacity={"requests": {"bandwidth": "35"}})],
        [SHARED_NIC],
        claims=[allocated("busy", "nic-0", shareID="u1", consumedCapacity={"bandwidth": "60"})],
        placed=1,
    ),
    "a capacity the device does not have": Case(
        [exactly(capacity={"requests": {"memory": "1Gi"}})],
        [rslice("s", gpus(2))],
        placed=0,
    ),
    "allocated claims take their devices": Case(
        [exactly(count=2)],
        [rslice("s", gpus(4))],
        claims=[allocated("busy", "gpu-0", "gpu-3")],
        placed=1,
        reason='2 devices of class "gpu" needed, 0 free',
    ),
    "admin access takes nothing": Case(
        [exactly(count=2, adminAccess=True)],
        [rslice("s", gpus(2))],
        claims=[allocated("busy", "gpu-0")],
        placed=3,
        members=3,
    ),
    "a tainted device is skipped unless tolerated": Case(
        [exactly(count=2)],
        [rslice("s", [*gpus(2), device("t", taints=[{"key": "broken", "effect": "NoSchedule"}])])],
        placed=1,
        reason='2 devices of class "gpu" needed, 0 free',
    ),
    "a tolerated taint, and a None taint, do not block": Case(
        [exactly(count=2, tolerations=[{"key": "broken", "operator": "Exists"}])],
        [
            rslice(
                "s",
                [
                    device("t", taints=[{"key": "broken", "effect": "NoExecute"}]),
                    device("u", taints=[{"key": "fyi", "effect": "None"}]),
                ],
            )
        ],
        placed=1,
    ),
    "a slice by node selector": Case(
        [exactly(count=2)],
        [
            rslice(
                "s",
                gpus(2),
                node=None,
                pool="rack-1",
                nodeSelector={
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["1"]}]}
                    ]
                },
            )
        ],
        node=node("n1", {"rack": "1"}),
        placed=1,
    ),
    "a slice by node selector the node does not match": Case(
        [exactly()],
        [
            rslice(
                "s",
                gpus(2),
                node=None,
                pool="rack-1",
                nodeSelector={
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["1"]}]}
                    ]
                },
            )
        ],
        node=node("n1", {"rack": "2"}),
        placed=0,
    ),
    "a slice of all nodes": Case(
        [exactly()],
        [rslice("s", gpus(2), node=None, pool="fabric", allNodes=True)],
        node=node("anywhere"),
        placed=2,
    ),
    "a slice of another node": Case([exactly()], [rslice("s", gpus(2), node="n2")], placed=0),
    "per-device node selection": Case(
        [exactly()],
        [
            rslice(
                "s",
                [
                    device("mine", nodeName="n1"),
                    device("theirs", nodeName="n2"),
                    device("everyone", allNodes=True),
                ],
                node=None,
                pool="p",
                perDeviceNodeSelection=True,
            )
        ],
        placed=2,
    ),
    "only a pool's newest generation counts": Case(
        [exactly()],
        [rslice("old", gpus(4), generation=1), rslice("new", gpus(1), generation=2)],
        placed=1,
    ),
    "a pool being updated offers nothing": Case(
        [exactly()],
        [rslice("s", gpus(4), count=2)],
        placed=0,
    ),
    "a pool with a device name twice offers nothing": Case(
        [exactly()],
        [rslice("a", gpus(1), pool="p", count=2), rslice("b", gpus(1), pool="p", count=2)],
        placed=0,
    ),
    "matchAttribute: no value has devices enough; the first value's reason": Case(
        [exactly("g"), exactly("h", count=2)],
        [rslice("s", [device("a", numa=0), device("b", numa=1), device("c", numa=1)])],
        constraints=[{"requests": ["g", "h"], "matchAttribute": f"{DRIVER}/numa"}],
        placed=0,
        reason='claim "gpu" request "h": 2 devices of class "gpu" needed, 0 free',
    ),
    "matchAttribute: a fit on the second value": Case(
        [exactly("g"), exactly("h")],
        [rslice("s", [device("a", numa=0), device("b", numa=1), device("c", numa=1)])],
        constraints=[{"matchAttribute": f"{DRIVER}/numa"}],
        placed=1,
        reason='claim "gpu" request "h": 1 device of class "gpu" needed, 0 free',
    ),
    "matchAttribute on an attribute no device has": Case(
        [exactly()],
        [rslice("s", gpus(2))],
        constraints=[{"requests": ["g"], "matchAttribute": f"{DRIVER}/pcieRoot"}],
        placed=0,
        reason=f'no device of the node has attribute "{DRIVER}/pcieRoot"',
    ),
    "distinctAttribute": Case(
        [exactly(count=2)],
        [rslice("s", [device("a", numa=0), device("b", numa=0), device("c", numa=1)])],
        constraints=[{"distinctAttribute": f"{DRIVER}/numa"}],
        placed=1,
    ),
    "a class that does not exist": Case(
        [exactly(cls="tpu")],
        [rslice("s", gpus(2))],
        placed=0,
        reason='claim "gpu" request "g": DeviceClass "tpu" not found',
    ),
    "one claim never takes a shared device twice": Case(
        [exactly(count=2)],
        [SHARED_NIC],
        placed=0,
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_members_one_after_another(case: Case) -> None:
    placed, shortfall = run(case)
    assert placed == case.placed
    if case.reason:
        assert shortfall is not None
        assert case.reason in str(shortfall)


# --- claims of a pod spec --------------------------------------------------------------------


def test_a_missing_template_is_a_reason_not_a_crash() -> None:
    needs = claim_needs(pod_spec((("gpu", "gone"),)), {})
    assert needs.problem is not None
    assert str(needs.problem) == 'claim "gpu": ResourceClaimTemplate "gone" not found'
    assert needs.problem.fatal


def test_no_claims_no_needs() -> None:
    needs = claim_needs({"containers": [{"name": "main"}]}, {})
    assert needs == ClaimNeeds()
    assert not needs


def test_the_api_defaults_are_assumed_when_absent() -> None:
    needs = claim_needs(pod_spec(), {"tpl": template("tpl", [exactly()])})
    (request,) = needs.claims[0].requests[0]
    assert (request.mode, request.count, request.device_class) == ("ExactCount", 1, "gpu")


def test_an_unknown_allocation_mode_is_refused() -> None:
    needs = claim_needs(pod_spec(), {"tpl": template("tpl", [exactly(allocationMode="Some")])})
    assert str(needs.problem) == 'claim "gpu" request "g": allocation mode "Some" is unknown'


def test_a_named_claim_counts_once_allocated_and_only_where_it_may_be_used() -> None:
    shared = allocated("fabric", "gpu-0")
    shared["status"]["allocation"]["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]
    }
    needs = claim_needs(pod_spec((("fabric", "named:fabric"),)), {}, {"fabric": shared})
    inventory = build_inventory([rslice("s", gpus(1))], [device_class()], [shared])
    assert isinstance(allocate(needs, node_devices(inventory, node("n1")), inventory.used), Usage)
    refused = allocate(needs, node_devices(inventory, node("n2")), inventory.used)
    assert (
        str(refused)
        == 'claim "fabric": allocated ResourceClaim "fabric" is not usable on this node'
    )


def test_a_named_claim_not_allocated_yet_is_not_counted() -> None:
    claim = allocated("fabric")
    del claim["status"]
    needs = claim_needs(pod_spec((("fabric", "named:fabric"),)), {}, {"fabric": claim})
    assert needs.problem is not None
    assert 'ResourceClaim "fabric" is not allocated yet' in str(needs.problem)


def test_members_built_with_a_context_carry_their_claims() -> None:
    context = DraContext.of([template("tpl", [exactly(count=2)])])
    member = member_from_template({"spec": pod_spec()}, context)
    assert member.devices.device_count == 2
    assert not member_from_pod_spec(pod_spec()).devices  # without a context: not modelled


# --- the inventory ---------------------------------------------------------------------------


def test_a_driver_no_class_names_is_a_problem() -> None:
    inventory = build_inventory(
        [rslice("s1", gpus(1)), rslice("nics", [device("nic")], driver=NIC, pool="n1-nic")],
        [device_class()],
    )
    assert [str(p) for p in inventory.problems] == [
        f'ResourceSlice "nics": driver "{NIC}" is not selected by any DeviceClass'
    ]


def test_a_class_naming_no_driver_may_select_any() -> None:
    inventory = build_inventory(
        [rslice("nics", [device("nic")], driver=NIC)],
        [device_class(), device_class("any", driver="")],
    )
    assert inventory.problems == ()


def test_pools_and_classes_that_offer_nothing_are_problems() -> None:
    inventory = build_inventory(
        [
            rslice("half", gpus(1), count=2),
            rslice("bad", [device("x", capacity={"memory": {"value": "lots"}})], node="n2"),
            rslice("orphan", [partition("p", "1", "1", "half")], node="n3"),
        ],
        [device_class(), device_class("odd", "size(device.attributes) > 0")],
    )
    assert [str(p) for p in inventory.problems] == [
        'DeviceClass "odd": CEL selector gangcheck cannot evaluate: size(device.attributes) > 0',
        f'ResourcePool "{DRIVER}/n1": being updated: 1 of 2 ResourceSlices seen',
        'ResourceSlice "bad": device "x": malformed quantity \'lots\': no digits',
        f'ResourcePool "{DRIVER}/n3": invalid: device "p" consumes unknown counter set '
        '"gpu-0-counters"',
    ]


def test_scopes_reach_nodes_by_name_selector_or_all() -> None:
    rack = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "Exists"}]}]}
    racked, bare = node("a", {"rack": "7"}), node("b")
    assert scope_reaches(NodeScope(node_name="a"), racked)
    assert not scope_reaches(NodeScope(node_name="a"), bare)
    assert scope_reaches(NodeScope(all_nodes=True), bare)
    assert scope_reaches(NodeScope(node_selector=rack), racked)
    assert not scope_reaches(NodeScope(node_selector=rack), bare)
    assert not scope_reaches(NodeScope(), racked)


def test_devices_of_all_nodes_are_shared_between_nodes() -> None:
    inventory = build_inventory(
        [rslice("fabric", gpus(1), node=None, pool="fabric", allNodes=True)], [device_class()]
    )
    needs = claim_needs(pod_spec(), {"tpl": template("tpl", [exactly()])})
    usage = allocate(needs, node_devices(inventory, node("a")), inventory.used)
    assert isinstance(usage, Usage)
    assert isinstance(allocate(needs, node_devices(inventory, node("b")), usage), Shortfall)


# --- CEL subset ------------------------------------------------------------------------------

EVALUABLE = [
    'device.driver == "gpu.example.com"',
    'device.attributes["gpu.example.com"].model == "a100"',
    "device.attributes['gpu.example.com']['model'] != 'a100'",
    'device.attributes["gpu.example.com"].numa <= -1 || !(device.allowMultipleAllocations)',
    'has(device.capacity["gpu.example.com"].memory)',
    'device.capacity["gpu.example.com"].memory.isLessThan(quantity("1Gi"))',
    'device.capacity["gpu.example.com"].memory.compareTo(quantity("1Gi")) == 0',
]
NOT_EVALUABLE = [
    'device.capacity["gpu.example.com"].memory >= quantity("40Gi")',  # the API refuses it too
    'device.attributes["gpu.example.com"].model.startsWith("a")',
    'device.attributes["gpu.example.com"]',
    'cel.bind(d, device.attributes["gpu.example.com"], d.model == "a")',
    'device.attributes["gpu.example.com"].version == semver("1.0.0")',
    "1 < 2 < 3",
    "1.5 > 1",
    'device.driver in ["a", "b"]',
    "device.name == 'x'",
    'has(device.attributes["gpu.example.com"]["model"])',
    'device.driver == r"raw"',
    '"\\u0041" == "A"',
    "",
]


@pytest.mark.parametrize("expression", EVALUABLE)
def test_the_subset_compiles(expression: str) -> None:
    assert compile_selector(expression).evaluable


@pytest.mark.parametrize("expression", NOT_EVALUABLE)
def test_anything_else_is_not_evaluable(expression: str) -> None:
    assert not compile_selector(expression).evaluable


def test_a_selector_names_its_driver_only_at_the_top_level() -> None:
    assert compile_selector('"a.io" == device.driver && true').driver == "a.io"
    assert compile_selector('device.driver == "a.io" || true').driver is None


# --- the gang --------------------------------------------------------------------------------

CLUSTER = [rslice("s1", gpus(4), node="n1"), rslice("s2", gpus(4), node="n2")]
TWO_GPUS = DraContext.of([template("tpl", [exactly(count=2)])])


def gang_fit(
    slices: Sequence[Obj], members: int = 4, nodes: Sequence[str] = ("n1", "n2"), bound: Any = ()
) -> Any:
    member = member_from_template({"spec": pod_spec()}, TWO_GPUS)
    inventory = build_inventory(slices, [device_class()])
    return fit_gang([("workers", members, member)], [node(n) for n in nodes], bound, inventory)


def test_a_gang_of_four_needing_two_gpus_each_fits_on_two_nodes_of_four() -> None:
    result = gang_fit(CLUSTER)
    assert result.fits
    assert result.placements == {"n1": ("workers",) * 2, "n2": ("workers",) * 2}


def test_with_three_devices_on_one_node_the_gang_does_not_fit_and_the_claim_is_named() -> None:
    result = gang_fit([CLUSTER[0], rslice("s2", gpus(3), node="n2")])
    assert not result.fits
    assert result.placeable == 3
    assert summarize(result) == (
        "3 of 4 members placeable on 2 nodes; the nodes in use have no room for the rest: "
        '2 × claim "gpu" request "g": too few free devices of class "gpu"'  # noqa: RUF001
    )
    assert str(result.in_use_reasons["n2"]) == (
        'claim "gpu" request "g": 2 devices of class "gpu" needed, 1 free'
    )


def test_empty_nodes_short_of_devices_are_named() -> None:
    result = gang_fit([CLUSTER[0], rslice("s2", gpus(1), node="n2")], members=3)
    assert not result.fits
    assert reason_lines(result) == [
        'node "n2": claim "gpu" request "g": 2 devices of class "gpu" needed, 1 free'
    ]


@pytest.mark.parametrize(
    ("slices", "blocked"),
    [
        pytest.param([rslice("s2", gpus(1), node="n2")], "1 node can take none", id="no pool"),
        pytest.param(
            [rslice("s2", gpus(1), node="n2"), rslice("s3", gpus(2), node="n3", count=2)],
            "2 nodes can take none",
            id="n3's pool offers nothing yet (one slice of two)",
        ),
    ],
)
def test_nodes_reaching_no_device_are_not_counted_against_a_gang_that_needs_one(
    slices: list[Obj], blocked: str
) -> None:
    """n1 and n3 reach no device (a CPU pool): the gang's message counts the nodes that fail
    it (n2, one GPU short), not them, as it does not count nodes without an extended resource
    asked for. A node whose pool offers nothing yet is one that could serve: it counts."""
    for bound in ((), node_capacity(["n1", "n2", "n3"]).usage()):
        result = gang_fit(slices, members=3, nodes=("n1", "n2", "n3"), bound=bound)
        assert not result.fits
        assert set(result.node_reasons) == {"n1", "n2", "n3"}
        assert f"; {blocked}: " in summarize(result)


def node_capacity(names: Sequence[str]) -> NodeUsage:
    capacity = NodeUsage()
    for name in names:
        capacity.on_node(None, node_obj(name))
    return capacity


def test_a_member_that_cannot_be_served_anywhere_says_why_on_every_node() -> None:
    context = DraContext.of([template("tpl", [exactly(selectors=cel("device.name == 'x'"))])])
    member = member_from_template({"spec": pod_spec()}, context)
    result = fit_gang([("w", 1, member)], [node("n1"), node("n2")], (), build_inventory(CLUSTER))
    assert summarize(result) == (
        "0 of 1 members placeable; 2 nodes can take none: "
        "2 × claim \"gpu\": CEL selector gangcheck cannot evaluate: device.name == 'x'"  # noqa: RUF001
    )


def test_resources_and_devices_both_limit() -> None:
    member = member_from_template({"spec": pod_spec(cpu="20")}, TWO_GPUS)
    inventory = build_inventory(CLUSTER, [device_class()])
    result = fit_gang([("w", 4, member)], [node("n1"), node("n2")], (), inventory)
    assert result.placeable == 2  # cpu: one member a node


def test_without_an_inventory_a_member_with_claims_fits_nowhere() -> None:
    member = member_from_template({"spec": pod_spec()}, TWO_GPUS)
    result = fit_gang([("w", 1, member)], [node("n1")])
    assert not result.fits
    assert reason_lines(result) == [
        'node "n1": claim "gpu" request "g": DeviceClass "gpu" not found'
    ]


def test_host_rejection_checks_devices_only_when_given() -> None:
    member = member_from_template({"spec": pod_spec()}, TWO_GPUS)
    assert host_rejection(member, node("n1")) is None
    room = node_devices(Inventory(), node("n1"))
    reason = host_rejection(member, node("n1"), None, DeviceRoom(room, Usage()))
    assert str(reason) == 'claim "gpu" request "g": DeviceClass "gpu" not found'


def test_devices_shared_by_all_nodes_are_not_counted_twice() -> None:
    fabric = rslice("fabric", gpus(4), node=None, pool="fabric", allNodes=True)
    result = gang_fit([fabric], members=3)
    assert result.placeable == 2


@settings(database=None, deadline=None, max_examples=100)
@given(
    devices_per_node=st.lists(st.integers(0, 8), max_size=6),
    per_member=st.integers(1, 4),
    members=st.integers(1, 12),
)
def test_one_pod_set_on_node_local_devices_places_the_exact_maximum(
    devices_per_node: list[int], per_member: int, members: int
) -> None:
    names = [f"n{i}" for i in range(len(devices_per_node))]
    slices = [
        rslice(f"s-{n}", gpus(k), node=n) for n, k in zip(names, devices_per_node, strict=True) if k
    ]
    context = DraContext.of([template("tpl", [exactly(count=per_member)])])
    member = member_from_template({"spec": pod_spec()}, context)
    inventory = build_inventory(slices, [device_class()])
    result = fit_gang([("w", members, member)], [node(n) for n in names], (), inventory)
    most = sum(k // per_member for k in devices_per_node)
    assert result.placeable == min(members, most)
    for name, placed in result.placements.items():
        assert len(placed) * per_member <= devices_per_node[names.index(name)]


def test_reserved_nodes_count_their_devices_for_members_with_claims() -> None:
    """Reservations and DRA together: the reserved node's two devices take two of three
    members; the third is the remainder to request."""
    from gangcheck.logic.attempt.fulfillment import ClusterView, GangSpec, reserved_split
    from gangcheck.logic.placement.reservations import Reservation
    from tests.builders import node as node_obj

    capacity = ClusterView(
        nodes=(node_obj("n1", gpu=0, labels={"res": "r"}),),
        device_classes=(device_class(),),
        resource_slices=(rslice("n1-gpus", gpus(2)),),
        claim_templates=(template("tpl", [exactly()]),),
    )
    gang = GangSpec((("ps-0", 3, {"spec": pod_spec()}),), namespace="ns")
    split = reserved_split(capacity, gang, [Reservation("r", {"res": "r"}, 1)])
    assert split.on_reserved == {"ps-0": 2}
    assert split.remainder == {"ps-0": 1}


def test_the_diagnosis_counts_devices_as_the_controller_does() -> None:
    from tests.builders import node as node_obj

    world = World(
        nodes=(node_obj("n1", gpu=0),),
        device_classes=(device_class(),),
        resource_slices=(rslice("n1-gpus", gpus(2)),),
        claim_templates=(template("tpl", [exactly()]),),
    )
    gang = [("ps-0", 3, {"spec": pod_spec()})]
    counted = place(gang, world.nodes, world.pods, dra=world.dra("ns"))
    assert counted is not None
    assert (counted.placeable, counted.fits) == (2, False)
    assert 'claim "gpu"' in counted.summary
    blind = place(gang, world.nodes, world.pods)  # claims ignored: what diagnose said before
    assert blind is not None and blind.placeable == 3


# --- nodes alike: trial allocations shared by node shape --------------------------------------


def counters(name: str = "c", units: str = "1") -> Obj:
    return {"name": name, "counters": {"units": {"value": units}}}


def counted(name: str, counter_set: str = "c") -> Obj:
    """A GPU taking one unit of `counter_set` of its pool."""
    return device(
        name, consumesCounters=[{"counterSet": counter_set, "counters": {"units": {"value": "1"}}}]
    )


def one_pool_two_counted(node_name: str) -> list[Obj]:
    """Two GPUs sharing one counter of one unit: one usable at a time."""
    pool = dict(node=node_name, pool=node_name, count=2)
    return [
        rslice(f"{node_name}-counters", **pool, sharedCounters=[counters()]),
        rslice(f"{node_name}-gpus", [counted("gpu-0"), counted("gpu-1")], **pool),
    ]


def two_pools_one_counted_each(node_name: str) -> list[Obj]:
    """The same two GPUs, each in its own pool with its own unit: both usable."""
    out = []
    for i in range(2):
        pool = dict(node=node_name, pool=f"{node_name}-{i}", count=2)
        out += [
            rslice(f"{node_name}-{i}-counters", **pool, sharedCounters=[counters()]),
            rslice(f"{node_name}-{i}-gpus", [counted(f"gpu-{i}")], **pool),
        ]
    return out


def shared_on(node_name: str) -> Obj:
    claim = allocated("fabric", "gpu-0", pool="fabric")
    claim["status"]["allocation"]["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
        ]
    }
    return claim


@pytest.mark.parametrize(
    ("slices", "claims", "pod", "per_member", "placements"),
    [
        pytest.param(
            [*one_pool_two_counted("n1"), *two_pools_one_counted_each("n2")],
            [],
            pod_spec(),
            2,
            {"n2": ("w",)},
            id="alike devices, counters shared on n1 only",
        ),
        pytest.param(
            [rslice("s1", gpus(4), node="n1"), rslice("s2", gpus(4), node="n2")],
            [allocated("busy", "gpu-0", pool="n1")],
            pod_spec(),
            4,
            {"n2": ("w",)},
            id="alike devices, one in use on n1",
        ),
        pytest.param(
            [rslice("s1", gpus(1), node="n1"), rslice("s2", gpus(1), node="n2")],
            [shared_on("n2")],
            pod_spec((("gpu", "tpl"), ("fabric", "named:fabric"))),
            1,
            {"n2": ("w",)},
            id="alike devices, the member's allocated claim usable on n2 only",
        ),
    ],
)
def test_nodes_of_one_shape_share_a_trial_not_nodes_that_only_look_alike(
    slices: list[Obj], claims: list[Obj], pod: Obj, per_member: int, placements: Obj
) -> None:
    """Trial allocations are worked out once per node shape: nodes whose devices differ only
    in name share one; these pairs look alike device by device and must not."""
    named = {c["metadata"]["name"]: c for c in claims}
    tpl = {"tpl": template("tpl", [exactly(count=per_member)])}
    member = member_from_pod_spec(pod, DraContext(tpl, named))
    inventory = build_inventory(slices, [device_class()], claims)
    result = fit_gang([("w", 2, member)], [node("n1"), node("n2")], (), inventory)
    assert result.placements == placements
    assert result.placeable == 1


def test_a_shared_device_with_capacity_consumed_is_not_alike_a_fresh_one() -> None:
    """Two nodes with alike NICs that members share; on n1 a claim consumes 60 of 100: n1
    has room for one member of 35, n2 for two. Only what is consumed tells the nodes apart
    (no device is taken whole), and the trial of one node is not the other's."""
    nic = [device("nic-0", capacity=BANDWIDTH, allowMultipleAllocations=True)]
    slices = [rslice(f"nic-{n}", nic, node=n) for n in ("n1", "n2")]
    busy = allocated("busy", "nic-0", pool="n1", shareID="u1", consumedCapacity={"bandwidth": "60"})
    tpl = {"tpl": template("tpl", [exactly(capacity={"requests": {"bandwidth": "35"}})])}
    member = member_from_pod_spec(pod_spec(), DraContext(tpl))
    inventory = build_inventory(slices, [device_class()], [busy])
    result = fit_gang([("w", 4, member)], [node("n1"), node("n2")], (), inventory)
    assert result.placements == {"n1": ("w",), "n2": ("w", "w")}
    assert result.placeable == 3


def test_a_counter_consumed_elsewhere_in_the_pool_tells_alike_nodes_apart() -> None:
    """n1 and n2 each have one GPU taking the only unit of their pool's counter; on n1 that
    unit is held by a device of the same pool that n1 does not reach (a slice of another
    node). No device n1 reaches is in use, yet its GPU cannot be allocated: n2's trial is
    not n1's."""
    slices = []
    for n in ("n1", "n2"):
        pool = dict(pool=n, count=3 if n == "n1" else 2)
        slices += [
            rslice(f"{n}-counters", node=n, **pool, sharedCounters=[counters()]),
            rslice(f"{n}-gpus", [counted("gpu-0")], node=n, **pool),
        ]
    slices.append(rslice("n1-far", [counted("far-0")], node="n3", pool="n1", count=3))
    busy = allocated("busy", "far-0", pool="n1")
    tpl = {"tpl": template("tpl", [exactly()])}
    member = member_from_pod_spec(pod_spec(), DraContext(tpl))
    inventory = build_inventory(slices, [device_class()], [busy])
    result = fit_gang([("w", 2, member)], [node("n1"), node("n2")], (), inventory)
    assert result.placements == {"n2": ("w",)}
    assert result.placeable == 1


class OneByOne:
    """The devices of a fit attempt worked out the plain way: each member allocated on its
    node, one after the other, nothing shared between nodes."""

    def __init__(self, nodes: Any, usage: Usage) -> None:
        self.nodes, self.usage = nodes, usage

    def room(self, node: str, needs: Any, most: int) -> int:
        return self._allocated(node, needs, most)[0]

    def place(self, node: str, needs: Any, most: int) -> int:
        placed, self.usage = self._allocated(node, needs, most)
        return placed

    def _allocated(self, node: str, needs: Any, most: int) -> tuple[int, Usage]:
        usage, placed = self.usage, 0
        while placed < most:
            outcome = allocate(needs, self.nodes[node], usage)
            if isinstance(outcome, Shortfall):
                break
            usage, placed = outcome, placed + 1
        return placed, usage


@settings(database=None, deadline=None, max_examples=150)
@given(
    nodes=st.lists(
        st.tuples(
            st.lists(st.tuples(st.sampled_from(["a100", "h100"]), st.booleans()), max_size=4),
            st.sampled_from(["4", "8"]),
            st.sampled_from([None, "1", "2", "3"]),
            st.booleans(),
        ),
        min_size=1,
        max_size=5,
    ),
    pod_sets=st.lists(
        st.tuples(
            st.integers(1, 4),
            st.integers(1, 3),
            st.sampled_from(["any", "h100", "nic"]),
            st.sampled_from(["1", "3"]),
        ),
        min_size=1,
        max_size=2,
    ),
    shared=st.lists(st.booleans(), max_size=2),
)
def test_the_fit_is_the_same_with_every_node_worked_out_on_its_own(
    nodes: list[tuple[list[tuple[str, bool]], str, str | None, bool]],
    pod_sets: list[tuple[int, int, str, str]],
    shared: list[bool],
) -> None:
    """What is shared between alike nodes (trial allocations and what they took, reasons)
    changes no answer: the fit equals the one that works out every node apart. Nodes have
    GPUs of their own, some in use, some drawing on a counter of their pool with fewer
    units than GPUs, maybe a NIC that members share by bandwidth, and may all reach `shared`
    GPUs (in use or not) of one more pool."""
    from unittest import mock

    from gangcheck.logic.placement import fit

    slices, busy, views = [], [], []
    if shared:
        fabric = [device(f"f-{k}", model="h100") for k in range(len(shared))]
        slices.append(rslice("fabric", fabric, node=None, pool="fabric", allNodes=True))
        busy += [
            allocated(f"f-busy-{k}", f"f-{k}", pool="fabric") for k, b in enumerate(shared) if b
        ]
    for i, (gpu_list, cpu, units, nic) in enumerate(nodes):
        name = f"n{i}"
        views.append(node(name, cpu=cpu))
        consumes = {} if units is None else {
            "consumesCounters": [{"counterSet": "c", "counters": {"units": {"value": "1"}}}]
        }  # fmt: skip
        found = [device(f"gpu-{k}", model=m, **consumes) for k, (m, _) in enumerate(gpu_list)]
        if nic:
            found.append(
                device("nic-0", model="nic", capacity=BANDWIDTH, allowMultipleAllocations=True)
            )
        if found:
            if units is None:
                slices.append(rslice(f"s{i}", found, node=name))
            else:
                pool = dict(node=name, pool=name, count=2)
                slices.append(rslice(f"c{i}", **pool, sharedCounters=[counters(units=units)]))
                slices.append(rslice(f"s{i}", found, **pool))
        busy += [
            allocated(f"busy-{i}-{k}", f"gpu-{k}", pool=name)
            for k, (_, b) in enumerate(gpu_list)
            if b
        ]
    templates = {}
    gang = []
    for j, (count, per_member, model, cpu) in enumerate(pod_sets):
        extra: Obj = {"count": per_member}
        if model != "any":
            extra["selectors"] = cel(f'device.attributes["{DRIVER}"].model == "{model}"')
        if model == "nic":
            extra.update(count=1, capacity={"requests": {"bandwidth": "35"}})
        templates[f"t{j}"] = template(f"t{j}", [exactly(**extra)])
        spec = pod_spec((("gpu", f"t{j}"),), cpu=cpu)
        gang.append((f"ps{j}", count, member_from_pod_spec(spec, DraContext(templates))))
    inventory = build_inventory(slices, [device_class()], busy)
    shared = fit_gang(gang, views, (), inventory)
    apart = build_inventory(slices, [device_class()], busy)
    with (
        mock.patch.object(fit, "_device_shape", lambda *_: (object(),)),
        mock.patch.object(fit, "_Devices", OneByOne),
        mock.patch.object(
            fit._Reasons,
            "_resources",
            lambda self, free: fit._resource_rejection(self.member.requests, free),
        ),
    ):
        alone = fit_gang(gang, views, (), apart)
    assert shared == alone
