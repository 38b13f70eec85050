"""Asks scoped to one topology domain: a gang that must sit inside one rack asks inside one
rack (its request's templates carry the rack), the best rack first, and the next rack inside
the same attempt when that one cannot deliver; never across two."""

from __future__ import annotations

from typing import Any

import pytest

from gangcheck.diagnose import text as diagnose_text
from gangcheck.logic.attempt import naming, places
from gangcheck.logic.attempt.actions import ClaimNode, CreateRequest, CreateTemplate, DeleteRequest
from gangcheck.logic.attempt.explain import request_facts
from gangcheck.logic.attempt.fulfillment import ClusterView, GangSpec, fits_now
from gangcheck.logic.attempt.records import Record
from gangcheck.logic.podgroups.podgroup import GroupSnapshot
from gangcheck.logic.podgroups.podgroup import decide as decide_group
from gangcheck.logic.workloads.admission import Decision, Snapshot, decide
from gangcheck.model.objects import pod_of, request_of, workload_of
from gangcheck.model.podgroups import pod_group_of
from gangcheck.model.provisioning_config import parse_spec
from tests.builders import CHECK, WorkloadBuilder, node, pod_template, provisioning_request
from tests.unit.test_admission_decide import GPU_FLAVOR, NOW
from tests.unit.test_podgroup_decide import group, members

RACK = "example.com/rack"
OUTCOME = '{"draining": [], "kept": {}, "nodeSeconds": 0, "reclaimed": []}'
TRUST = {"fulfillment": {"mode": "TrustProvisioned"}}


KUEUES = "kueue.x-k8s.io/podset-required-topology"
OURS = "gangcheck.io/podset-required-topology"


def racked(count: int = 4, annotations: dict[str, str] | None = None) -> WorkloadBuilder:
    """A gang whose one pod set must sit inside one rack (Kueue's required topology)."""
    template = pod_template(gpu=8)
    template["metadata"] = {"annotations": annotations or {KUEUES: RACK}}
    return WorkloadBuilder().pod_set("workers", count, template).reserve_quota().check()


def gpu_node(name: str, rack: str, *, gpu: int = 8, reserved: bool = False) -> Any:
    labels = {RACK: rack, "pool": "gpu", **({"reserved": "yes"} if reserved else {})}
    return node(name, gpu=gpu, labels=labels, taints=[])


def run(
    requests: list[Any],
    nodes: list[Any],
    config: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> Decision:
    snap = Snapshot(
        workload=workload_of(racked(annotations=annotations).build()),
        check=CHECK,
        config=parse_spec(config or TRUST),
        flavors=GPU_FLAVOR,
        requests=tuple(request_of(r) for r in requests),
        templates=frozenset(
            p["podTemplateRef"]["name"] for r in requests for p in r["spec"]["podSets"]
        ),
        capacity=ClusterView(nodes=tuple(nodes)),
    )
    return decide(snap, NOW)


def asked(d: Decision) -> tuple[dict[str, Any], dict[str, Any]]:
    req = next(a.body for a in d.actions if isinstance(a, CreateRequest))
    template = next(a.body for a in d.actions if isinstance(a, CreateTemplate))
    return req, template


def request(name: str, rack: str, *, tried: str = "", **annotations: str) -> Any:
    notes = {"gangcheck.io/attempt": "1", "gangcheck.io/topology-domain": f"{RACK}={rack}"}
    if tried:
        notes["gangcheck.io/domains-tried"] = tried
    templates = [(naming.template_name(name, "workers"), 4)]
    return provisioning_request(name, templates=templates, annotations={**notes, **annotations})


def failed(name: str, rack: str, *, tried: str = "") -> Any:
    return request(
        name,
        rack,
        tried=tried,
        **{
            "gangcheck.io/phase": "RollingBack",
            "gangcheck.io/rollback-reason": "Deadline: the gang did not fit",
            "gangcheck.io/outcome": OUTCOME,
        },
    )


def test_the_ask_is_scoped_to_the_rack_where_most_members_place_now() -> None:
    # r1 has no free node; r2 has two free 8-GPU nodes: two members place there now
    nodes = [gpu_node("a", "r1", gpu=0), gpu_node("b", "r2"), gpu_node("c", "r2")]
    d = run([], nodes)
    req, template = asked(d)
    assert template["template"]["spec"]["nodeSelector"][RACK] == "r2"
    annotations = req["metadata"]["annotations"]
    assert annotations["gangcheck.io/topology-domain"] == f"{RACK}=r2"
    assert d.check is not None
    assert d.check.message.endswith(f"from topology domain {RACK}=r2")


@pytest.mark.parametrize(
    ("annotations", "scoped"),
    [
        ({KUEUES: RACK}, True),
        ({OURS: RACK}, True),  # gangcheck's own form: Kueue v0.17 admits it on any flavor
        ({KUEUES: RACK, OURS: "example.com/block"}, True),  # both: Kueue's, which Kueue enforces
        ({"example.com/other": RACK}, False),
    ],
)
def test_either_annotation_scopes_the_ask_to_one_rack(
    annotations: dict[str, str], scoped: bool
) -> None:
    nodes = [gpu_node("a", "r1", gpu=0), gpu_node("b", "r2"), gpu_node("c", "r2")]
    d = run([], nodes, annotations=annotations)
    req, template = asked(d)
    selector = template["template"]["spec"]["nodeSelector"]
    domain = req["metadata"]["annotations"].get("gangcheck.io/topology-domain")
    if scoped:
        assert (selector[RACK], domain) == ("r2", f"{RACK}=r2")
    else:
        assert RACK not in selector and domain is None


@pytest.mark.parametrize("annotation", [KUEUES, OURS])
@pytest.mark.parametrize("level", ["bad key", "example.com/" + "r" * 64, "a/b/c"])
def test_a_level_no_node_can_carry_is_rejected_without_asking(annotation: str, level: str) -> None:
    """A required level that is not a label key: no node carries it, so every ask would
    deliver nodes the gang cannot be judged to sit inside, rolled back at each deadline; the
    check says why, once, and asks nothing."""
    d = run([], [gpu_node("b", "r2")], annotations={annotation: level})
    assert not any(isinstance(a, CreateRequest | CreateTemplate) for a in d.actions)
    assert d.check is not None and d.check.state == "Rejected"
    assert d.check.message.startswith(
        f"pod set workers requires one domain of topology level {level!r}, which no node can"
    )


def test_a_rack_that_could_not_deliver_is_left_for_the_next_in_the_same_attempt() -> None:
    nodes = [gpu_node("a", "r1", gpu=0), gpu_node("b", "r2")]
    d = run([failed("wl-atomic-1", "r2")], nodes)
    req, template = asked(d)
    assert req["metadata"]["name"] == "wl-atomic-1-s1"
    assert template["template"]["spec"]["nodeSelector"][RACK] == "r1"
    annotations = req["metadata"]["annotations"]
    assert annotations["gangcheck.io/topology-domain"] == f"{RACK}=r1"
    assert annotations["gangcheck.io/domains-tried"] == "r2"
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == ["wl-atomic-1"]
    assert d.check is not None and d.check.state == "Pending"
    assert d.check.message.startswith(f"topology domain {RACK}=r2 could not deliver")


def test_every_rack_tried_ends_the_attempt() -> None:
    nodes = [gpu_node("a", "r1", gpu=0), gpu_node("b", "r2")]
    d = run([failed("wl-atomic-1-s1", "r1", tried="r2")], nodes)
    assert not any(isinstance(a, CreateRequest) for a in d.actions)
    assert d.check is not None and d.check.state == "Retry"


def test_racks_are_tried_in_each_source_in_turn() -> None:
    config = {
        **TRUST,
        "capacitySources": [
            {"name": "on-demand", "nodeSelector": {"pool": "gpu"}},
            {"name": "spot", "nodeSelector": {"pool": "spot"}},
        ],
    }
    nodes = [gpu_node("a", "r1"), {**gpu_node("s", "r9")}]
    nodes[1]["metadata"]["labels"]["pool"] = "spot"
    d = run([failed("wl-atomic-1", "r1")], nodes, config)
    req, template = asked(d)
    # r1 was the on-demand pool's only rack: the spot pool next, in its own rack
    selector = template["template"]["spec"]["nodeSelector"]
    assert (selector["pool"], selector[RACK]) == ("spot", "r9")
    assert req["metadata"]["annotations"]["gangcheck.io/capacity-source"] == "1"
    assert "gangcheck.io/domains-tried" not in req["metadata"]["annotations"]


def test_a_level_no_node_shows_asks_without_a_domain() -> None:
    d = run([], [node("x", gpu=8, labels={"pool": "gpu"})])
    req, template = asked(d)
    assert RACK not in template["template"]["spec"]["nodeSelector"]
    assert "gangcheck.io/topology-domain" not in req["metadata"]["annotations"]


def test_reserved_nodes_rank_a_rack_first() -> None:
    gang = GangSpec(
        (("w", 2, pod_template(gpu=8, node_selector={"pool": "gpu"})),),
        {"w": RACK},
    )
    nodes = (
        gpu_node("a", "r1", gpu=0),
        gpu_node("b", "r2"),
        gpu_node("c", "r2"),
        {**gpu_node("d", "r3", gpu=0)},
    )
    nodes[3]["metadata"]["labels"]["reserved"] = "yes"
    ranked = places.ranked_domains(gang, ClusterView(nodes=nodes), [{"reserved": "yes"}])
    assert ranked == ["r3", "r2", "r1"]


def test_a_scoped_ask_fits_only_inside_its_domain() -> None:
    """Room in another rack does not make the gang fit for an ask scoped to r1."""
    gang = GangSpec((("w", 1, pod_template(gpu=8)),), {"w": RACK})
    room_elsewhere = ClusterView(nodes=(gpu_node("a", "r1", gpu=0), gpu_node("b", "r2")))
    assert fits_now(room_elsewhere, gang).fits
    assert not fits_now(room_elsewhere, places.pinned(gang, {}, (RACK, "r1"))).fits


def test_a_pod_group_with_a_topology_asks_inside_its_best_domain() -> None:
    pods = members(3)
    nodes = (gpu_node("a", "r1", gpu=0), gpu_node("b", "r2", gpu=2))
    snap = GroupSnapshot(
        group=pod_group_of(group(3, topology=RACK)),
        members=tuple(map(pod_of, pods)),
        config=parse_spec({}),
        capacity=ClusterView(nodes=nodes, pods=tuple(pods)),
    )
    d = decide_group(snap, NOW)
    req = next(a.body for a in d.actions if isinstance(a, CreateRequest))
    template = next(a.body for a in d.actions if isinstance(a, CreateTemplate))
    assert template["template"]["spec"]["nodeSelector"][RACK] == "r2"
    assert req["metadata"]["annotations"]["gangcheck.io/topology-domain"] == f"{RACK}=r2"


ARRIVED = "2026-11-30T10:00:01Z"
"""A second after the request (builders' T0): proven younger, so it arrived for it."""
UNDELIVERED = (
    "no node the gang may use carries the required topology level example.com/rack (pod set "
    "workers): the gang cannot fit in one domain; ignoring the level, 4 of 4 members placeable "
    "on 4 nodes"
)


@pytest.mark.parametrize(
    ("created", "arrivals", "said"),
    [
        pytest.param(
            ARRIVED,
            4,
            "4 nodes arrived for this attempt; none carries the required topology level "
            "example.com/rack (pod set workers): the gang cannot fit in one domain; ignoring the "
            "level, 4 of 4 members placeable on 4 nodes; waiting until the deadline in case they "
            "are labelled",
            id="the nodes that arrived for it",
        ),
        pytest.param(
            "2026-11-30T09:00:00Z", 0, UNDELIVERED, id="nodes of an earlier attempt, none new"
        ),
    ],
)
def test_a_delivery_without_the_level_is_said_so_and_waits_its_deadline(
    created: str, arrivals: int, said: str
) -> None:
    """The level no node showed when asked (so asked without a domain): the autoscaler
    Provisioned, and the nodes there lack the label. The check says so, counting the
    arrivals, and the attempt waits its deadline (a node labeller may add it)."""
    name = naming.request_name("wl", CHECK, 1)
    provisioned = provisioning_request(
        name,
        templates=[(naming.template_name(name, "workers"), 4)],
        conditions={"Accepted": "", "Provisioned": ""},
        annotations={
            "gangcheck.io/attempt": "1",
            "gangcheck.io/fulfillment-deadline": "2026-11-30T10:10:00Z",
        },
    )
    nodes = [node(f"n{i}", gpu=8, labels={"pool": "gpu"}, created=created) for i in range(4)]
    d = run([provisioned], nodes, config={"fulfillment": {"deadlineSeconds": 600}})
    assert d.check is not None
    assert (d.check.state, d.check.message) == (
        "Pending",
        f"capacity requested, not yet usable: {said}",
    )
    claimed = [a for a in d.actions if isinstance(a, ClaimNode)]
    assert len(claimed) == arrivals  # recorded as arrived for it, as any arrival
    assert not any(isinstance(a, DeleteRequest) for a in d.actions)


@pytest.mark.parametrize("tried", [(), ("",), ("", "r1"), ("r1", ""), ("r1", "r2")])
def test_the_domains_tried_read_back_as_recorded(tried: tuple[str, ...]) -> None:
    """An empty label value is a domain like any (a node may carry ``rack: ""``): the
    record of the domains tried keeps it, so it is not asked again in the attempt."""
    place = places.Place(0, (RACK, "r9"), tried)
    assert places.place_of(Record.of({}), place.record()).tried == tried


def test_a_rack_named_by_the_empty_value_is_asked_once_in_an_attempt() -> None:
    """Racks "", r1, r2 (the empty value ranked first: a member places there now): each rack
    is asked once, then the attempt ends; before, a "" tried was lost from the record and ""
    was asked again after each other rack."""
    nodes = [gpu_node("a", ""), gpu_node("b", "r1", gpu=0), gpu_node("c", "r2", gpu=0)]
    asked_in: list[str] = []
    requests: list[Any] = []
    for _ in range(6):
        d = run(requests, nodes)
        made = [a.body for a in d.actions if isinstance(a, CreateRequest)]
        if not made:
            break
        meta = made[0]["metadata"]
        notes = {k: v for k, v in meta["annotations"].items() if k.startswith("gangcheck.io/")}
        asked_in.append(notes["gangcheck.io/topology-domain"].partition("=")[2])
        gone = {
            "gangcheck.io/phase": "RollingBack",
            "gangcheck.io/rollback-reason": "Deadline: the gang did not fit",
            "gangcheck.io/outcome": OUTCOME,
        }
        templates = [(naming.template_name(meta["name"], "workers"), 4)]
        requests = [
            provisioning_request(meta["name"], templates=templates, annotations={**notes, **gone})
        ]
    assert asked_in == ["", "r1", "r2"]
    assert d.check is not None and d.check.state == "Retry"


def test_diagnose_names_the_empty_rack_among_those_left() -> None:
    name = naming.request_name("wl", CHECK, 1, 2)
    req = request_of(request(name, "r2", tried="r1,"))
    facts = request_facts(req, name, 1)
    assert facts.domains_tried == ("r1", "")
    lines = diagnose_text._lines_of_request("default", facts, NOW)
    assert f'  asks topology domain {RACK}=r2; domains left before: r1, ""' in lines


def cordoned(obj: Any) -> Any:
    obj.setdefault("spec", {})["unschedulable"] = True
    return obj


@pytest.mark.parametrize(
    ("nodes", "ranked"),
    [
        pytest.param(
            [
                cordoned(gpu_node("a", "r1")),
                cordoned(gpu_node("b", "r1")),
                gpu_node("c", "r2", gpu=0),
            ],
            ["r2", "r1"],
            id="a rack all cordoned after a full one",
        ),
        pytest.param(
            [
                cordoned(gpu_node("a", "r1", gpu=0)),
                gpu_node("b", "r1", gpu=0),
                gpu_node("c", "r0", gpu=0),
            ],
            ["r0", "r1"],
            id="one node open is enough: by name",
        ),
        pytest.param(
            [cordoned(gpu_node("a", "r1", reserved=True)), gpu_node("b", "r2", gpu=0)],
            ["r2", "r1"],
            id="a cordoned reserved node ranks nothing first",
        ),
        pytest.param(
            [
                cordoned(gpu_node("a", "r1", reserved=True)),
                gpu_node("b", "r1", gpu=0, reserved=True),
                gpu_node("c", "r0"),
            ],
            ["r1", "r0"],
            id="an open reserved node still does",
        ),
    ],
)
def test_a_rack_whose_nodes_are_all_cordoned_is_asked_last(
    nodes: list[Any], ranked: list[str]
) -> None:
    """A rack cordoned whole (drained for maintenance) is asked only once the racks with a
    node open are; a cordoned reserved node does not rank its rack first."""
    gang = GangSpec((("w", 2, pod_template(gpu=8, node_selector={"pool": "gpu"})),), {"w": RACK})
    view = ClusterView(nodes=tuple(nodes))
    assert places.ranked_domains(gang, view, [{"reserved": "yes"}]) == ranked


@pytest.mark.parametrize(
    ("domain", "pinned"),
    [
        pytest.param(f"{RACK}=r1", {RACK: "r1"}, id="the rack asked"),
        pytest.param("", {}, id="asked without a domain: nothing to pin"),
    ],
)
def test_trusted_provisioned_pins_the_gang_to_the_rack_it_asked(
    domain: str, pinned: dict[str, str]
) -> None:
    """TrustProvisioned: Ready on Provisioned, no fit; the ask was scoped to r1, so the gang
    is pinned there too (before, its podSetUpdates named no rack: with gangcheck's own
    annotation, which Kueue does not read, nothing kept its members in one rack)."""
    name = naming.request_name("wl", CHECK, 1)
    notes = {"gangcheck.io/attempt": "1"}
    if domain:
        notes["gangcheck.io/topology-domain"] = domain
    provisioned = provisioning_request(
        name,
        templates=[(naming.template_name(name, "workers"), 4)],
        conditions={"Accepted": "", "Provisioned": ""},
        annotations=notes,
    )
    d = run([provisioned], [gpu_node("a", "r1", gpu=0), gpu_node("b", "r2")], TRUST, {OURS: RACK})
    assert d.check is not None and d.check.state == "Ready"
    selector = d.check.pod_set_updates[0].get("nodeSelector") or {}
    assert {k: v for k, v in selector.items() if k == RACK} == pinned
