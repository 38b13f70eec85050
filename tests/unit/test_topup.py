"""InOrder tops up instead of throwing away (issue 32, logic/attempt/topup.py), through a Kueue
Workload's check (admission.decide) and a PodGroup (podgroup.decide), the shared cases run
through both adapters as tests/unit/test_race_adapters.py runs the race: a source that stops
short after part of the gang arrived from it is kept for the attempt (its request marked Kept
with its nodes, never withdrawn while the attempt goes on) and the next source is asked only
for the members its nodes cannot hold; the gang is Ready (released) on kept + new nodes; a
rollback of the attempt reclaims the kept arrivals by their own record; with a required
topology the source's arrivals go back as before."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from gangcheck.logic.attempt import naming, topup
from gangcheck.logic.attempt.actions import (
    Action,
    AnnotateRequest,
    ClaimNode,
    CreateRequest,
    DeleteRequest,
    Event,
    GuardScaleDown,
    ReclaimArrivals,
    ReleaseHold,
    ReleaseMembers,
)
from gangcheck.logic.attempt.explain import World
from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.attempt.hold import hold_taint, hold_toleration
from gangcheck.logic.podgroups.group_diagnosis import gather_group
from gangcheck.logic.podgroups.podgroup import GroupDecision, GroupSnapshot
from gangcheck.logic.podgroups.podgroup import decide as decide_group
from gangcheck.logic.workloads.admission import Decision, Snapshot, decide
from gangcheck.logic.workloads.diagnosis import gather
from gangcheck.model.names import CONSUME_ANNOTATION
from gangcheck.model.objects import Flavor, pod_of, request_of, workload_of
from gangcheck.model.podgroups import pod_group_of
from gangcheck.model.provisioning_config import parse_spec, spec_record
from tests.builders import CHECK, capacity_not_found, node, pod_template, provisioning_request
from tests.unit.test_admission_decide import NOW, gang
from tests.unit.test_diagnosis import admission_check
from tests.unit.test_podgroup_decide import group, members

Obj = dict[str, Any]
#: The flavor leaves the pool open: both pools' nodes carry its label.
FLAVOR = {"gpu": Flavor("gpu", {"node-group": "gpu"}, ())}
SPEC: Obj = {
    "capacitySources": [
        {"name": "a", "nodeSelector": {"pool": "a"}, "deadlineSeconds": 20},
        {"name": "b", "nodeSelector": {"pool": "b"}},
    ],
    "fulfillment": {"reclaimer": "DeleteNode"},
    "retryStrategy": {"backoffLimitCount": 3},
}
PAST = "2026-11-30T10:04:00Z"  # a deadline NOW (10:05) is past
LATER = "2026-11-30T10:12:00Z"
ARRIVED = "2026-11-30T10:00:01Z"  # a second after A: proven younger
B_MADE = "2026-11-30T10:00:05Z"  # B is asked once A's nodes are there
B_ARRIVED = "2026-11-30T10:00:06Z"
OUTCOME = '{"draining": [], "kept": {}, "nodeSeconds": 40, "reclaimed": ["b0"]}'
KINDS = ["Workload", "PodGroup"]


def ask(k: int, kind: str = "Workload") -> str:
    if kind == "PodGroup":
        return naming.request_name("g", "pg", 1, k)
    return naming.request_name("wl", CHECK, 1, k)


A, B = ask(0), ask(1)


def request(
    k: int,
    count: int,
    *,
    kind: str = "Workload",
    provisioned: bool = True,
    failed: bool = False,
    **notes: str,
) -> Obj:
    name = ask(k, kind)
    annotations = {
        "gangcheck.io/attempt": "1",
        "gangcheck.io/fulfillment-deadline": LATER,
        **{
            f"gangcheck.io/{key.replace('_', '-')}": value.replace(A, ask(0, kind))
            for key, value in notes.items()
        },
    }
    if kind == "PodGroup":
        annotations |= {
            "gangcheck.io/pod-group": "pg/g",
            "gangcheck.io/pod-group-uid": "uid-g",
            "gangcheck.io/gang-members": "4",
        }
    if k:
        annotations["gangcheck.io/capacity-source"] = str(k)
    conditions = {"Provisioned": ""} if provisioned else {"Accepted": ""}
    if failed:
        conditions["Failed"] = "the cloud gave up"
    pod_set = "ps-0" if kind == "PodGroup" else "workers"
    return provisioning_request(
        name,
        templates=[(naming.template_name(name, pod_set), count)],
        annotations=annotations,
        conditions=conditions,
        created=B_MADE if k else "2026-11-30T10:00:00Z",
    )


def gpu_node(
    name: str, pool: str, *, arrived_for: str = "", held: bool = True, kind: str = "Workload"
) -> Obj:
    owner = {A: ask(0, kind), B: ask(1, kind)}.get(arrived_for, arrived_for)
    notes = {"gangcheck.io/arrived-for": f"default/{owner}"} if owner else {}
    taints = [hold_taint(f"default/{owner}")] if owner and held else []
    return node(
        name,
        gpu=1,
        created=B_ARRIVED if pool == "b" else ARRIVED,
        labels={"pool": pool, "node-group": "gpu"},
        annotations=notes,
        taints=taints,
    )


def kept(**extra: str) -> dict[str, str]:
    """A's record once kept (deadline passed with a0, a1 arrived)."""
    return {
        "phase": "Kept",
        "rollback_reason": "Deadline: the gang did not fit within 20s",
        "rollback_nodes": json.dumps({"a0": ARRIVED, "a1": ARRIVED}),
        **extra,
    }


def run(
    requests: list[Obj],
    nodes: list[Obj],
    *,
    workload: Obj | None = None,
    pods: tuple[Obj, ...] = (),
    spec: Obj | None = None,
) -> Decision:
    wl = workload or gang(4).build()
    snap = Snapshot(
        workload=workload_of(wl),
        check=CHECK,
        config=parse_spec(spec or SPEC),
        flavors=FLAVOR,
        requests=tuple(request_of(r) for r in requests),
        templates=frozenset(
            p["podTemplateRef"]["name"] for r in requests for p in r["spec"]["podSets"]
        ),
        capacity=ClusterView(
            nodes=tuple(nodes),
            pods=pods,
            in_flight=frozenset(f"default/{r['metadata']['name']}" for r in requests),
        ),
    )
    return decide(snap, NOW)


@dataclass(frozen=True)
class Seen:
    annotated: dict[str, dict[str, str]]
    claimed: list[str]
    created: dict[str, tuple[int, dict[str, str]]]
    """name -> (members asked, gangcheck's annotations)"""
    deleted: list[str]
    reclaimed: dict[str, tuple[str, ...]]
    events: set[str] = field(default_factory=set)
    state: str = ""
    """pending, ready, retry (a group: its next attempt), or "" (nothing written)"""
    message: str = ""
    consumed: str = ""
    pinned: dict[str, str] = field(default_factory=dict)
    tolerations: list[Obj] = field(default_factory=list)


WORDS = {
    "Pending": "pending",
    "Provisioning": "pending",
    "Ready": "ready",
    "Released": "ready",
    "Retry": "retry",
    "BackingOff": "retry",
}


def _seen(actions: tuple[Action, ...], events: tuple[Event, ...], **more: Any) -> Seen:
    created = {}
    for a in actions:
        if isinstance(a, CreateRequest):
            meta = a.body["metadata"]
            count = sum(p["count"] for p in a.body["spec"]["podSets"])
            notes = {k: v for k, v in meta["annotations"].items() if k.startswith("gangcheck.io/")}
            created[meta["name"]] = (count, notes)
    annotated: dict[str, dict[str, str]] = {}
    for a in actions:
        if isinstance(a, AnnotateRequest):
            annotated.setdefault(a.name, {}).update(a.annotations)
    return Seen(
        annotated=annotated,
        claimed=[a.name for a in actions if isinstance(a, ClaimNode)],
        created=created,
        deleted=sorted(a.name for a in actions if isinstance(a, DeleteRequest)),
        reclaimed={a.request: a.nodes for a in actions if isinstance(a, ReclaimArrivals)},
        events={e.reason for e in events},
        **more,
    )


def seen(d: Decision) -> Seen:
    more: dict[str, Any] = {}
    if d.check is not None:
        more = {"state": WORDS.get(d.check.state, d.check.state), "message": d.check.message}
        if d.check.state == "Ready":
            update = d.check.pod_set_updates[0]
            more |= {
                "consumed": update["annotations"][CONSUME_ANNOTATION],
                "pinned": dict(update.get("nodeSelector") or {}),
                "tolerations": list(update.get("tolerations") or []),
            }
    return _seen(d.actions, d.events, **more)


def in_flight(
    obj: Obj, pods: list[Obj], spec: Obj, requests: list[Obj], nodes: list[Obj]
) -> GroupSnapshot:
    """The snapshot of the PodGroup ``obj`` with its members ``pods`` while ``requests`` are
    in flight (their templates made), ``nodes`` in the cluster (test_scaledown.py and
    test_race_adapters.py decide on theirs too)."""
    return GroupSnapshot(
        group=pod_group_of(obj),
        members=tuple(map(pod_of, pods)),
        config=parse_spec(spec),
        requests=tuple(request_of(r) for r in requests),
        templates=frozenset(
            p["podTemplateRef"]["name"] for r in requests for p in r["spec"]["podSets"]
        ),
        capacity=ClusterView(
            nodes=tuple(nodes),
            pods=tuple(pods),
            in_flight=frozenset(f"default/{r['metadata']['name']}" for r in requests),
        ),
    )


#: A PodGroup's annotations while its first attempt provisions.
PROVISIONING = {"gangcheck.io/state": "Provisioning", "gangcheck.io/attempt": "1"}


def decide_provisioning(
    requests: list[Obj], nodes: list[Obj], *, topology: str = "", spec: Obj | None = None
) -> GroupDecision:
    """The decision of a PodGroup of four members (``spec``, else ``SPEC``) provisioning its
    first attempt with ``requests`` in flight."""
    obj = group(4, annotations=dict(PROVISIONING), topology=topology)
    return decide_group(in_flight(obj, members(4), spec or SPEC, requests, nodes), NOW)


def through(
    kind: str,
    requests: list[Obj],
    nodes: list[Obj],
    *,
    topology: str = "",
    spec: Obj | None = None,
) -> Seen:
    """The same case through a Workload's check or a PodGroup (under ``spec``, else
    ``SPEC``)."""
    if kind == "Workload":
        wl = gang(4).build()
        if topology:
            template = pod_template(gpu=1)
            template["metadata"] = {
                "annotations": {"kueue.x-k8s.io/podset-required-topology": topology}
            }
            wl["spec"]["podSets"][0]["template"] = template
        return seen(run(requests, nodes, workload=wl, spec=spec))
    d = decide_provisioning(requests, nodes, topology=topology, spec=spec)
    status = d.status or {}  # only what changed is written
    state = status.get("gangcheck.io/state", PROVISIONING["gangcheck.io/state"] if status else "")
    more: dict[str, Any] = {
        "state": WORDS.get(state, state),
        "message": status.get("gangcheck.io/message", ""),
    }
    released = [a for a in d.actions if isinstance(a, ReleaseMembers)]
    if released:
        more |= {
            "consumed": released[0].annotations.get(CONSUME_ANNOTATION, ""),
            "pinned": dict(released[0].node_selector),
            "tolerations": list(released[0].tolerations),
        }
    return _seen(d.actions, d.events, **more)


@pytest.mark.parametrize("kind", KINDS)
def test_a_source_past_its_deadline_is_kept_and_the_next_asked_for_the_rest(kind: str) -> None:
    a, b = ask(0, kind), ask(1, kind)
    nodes = [gpu_node(n, "a", arrived_for=A, kind=kind) for n in ("a0", "a1")]
    s = through(kind, [request(0, 4, kind=kind, fulfillment_deadline=PAST)], nodes)
    assert s.annotated[a]["gangcheck.io/phase"] == "Kept"
    assert json.loads(s.annotated[a]["gangcheck.io/rollback-nodes"]) == {
        "a0": ARRIVED,
        "a1": ARRIVED,
    }
    assert s.annotated[a]["gangcheck.io/rollback-reason"].startswith("Deadline: ")
    count, notes = s.created[b]
    assert count == 2  # 4 members, 2 held by the kept nodes
    assert notes["gangcheck.io/kept-from"] == a
    assert notes["gangcheck.io/kept-members"] == "2"
    assert notes["gangcheck.io/capacity-source"] == "1"
    assert s.deleted == [] and s.reclaimed == {}  # nothing withdrawn, nothing reclaimed
    assert "CapacityToppedUp" in s.events
    assert s.state == "pending"
    assert "2 of 4 members are kept on the 2 node(s) that arrived" in s.message


@pytest.mark.parametrize("kind", KINDS)
def test_a_source_that_fails_after_a_partial_delivery_is_kept_too(kind: str) -> None:
    a = ask(0, kind)
    requests = [request(0, 4, kind=kind, failed=True)]
    s = through(kind, requests, [gpu_node("a0", "a", arrived_for=A, kind=kind)])
    assert s.annotated[a]["gangcheck.io/phase"] == "Kept"
    assert s.annotated[a]["gangcheck.io/rollback-reason"].startswith("Failed")
    assert s.created[ask(1, kind)][0] == 3
    assert s.deleted == [] and s.reclaimed == {}


@pytest.mark.parametrize("kind", KINDS)
def test_an_arrival_not_recorded_yet_is_recorded_with_the_keep_and_counted(kind: str) -> None:
    nodes = [gpu_node("a0", "a", arrived_for=A, kind=kind), gpu_node("a1", "a")]  # a1: not yet
    s = through(kind, [request(0, 4, kind=kind, fulfillment_deadline=PAST)], nodes)
    assert s.claimed == ["a1"]
    assert set(json.loads(s.annotated[ask(0, kind)]["gangcheck.io/rollback-nodes"])) == {
        "a0",
        "a1",
    }
    assert s.created[ask(1, kind)][0] == 2


@pytest.mark.parametrize("kind", KINDS)
def test_a_source_that_delivered_nothing_is_rolled_back_as_before(kind: str) -> None:
    s = through(kind, [request(0, 4, kind=kind, fulfillment_deadline=PAST)], [])
    assert s.annotated[ask(0, kind)]["gangcheck.io/phase"] == "RollingBack"
    assert s.created == {}


@pytest.mark.parametrize("kind", KINDS)
def test_a_source_never_provisioned_is_not_kept(kind: str) -> None:
    """Nothing is recorded as arrived before Provisioned; the autoscaler would go on
    retrying a request kept Provisioned=False, so it is left as before."""
    requests = [request(0, 4, kind=kind, provisioned=False, fulfillment_deadline=PAST)]
    s = through(kind, requests, [gpu_node("a0", "a")])
    assert s.annotated[ask(0, kind)]["gangcheck.io/phase"] == "RollingBack"
    assert s.created == {}


@pytest.mark.parametrize("kind", KINDS)
def test_with_a_required_topology_nothing_is_kept(kind: str) -> None:
    nodes = [gpu_node(n, "a", arrived_for=A, kind=kind) for n in ("a0", "a1")]
    requests = [request(0, 4, kind=kind, fulfillment_deadline=PAST)]
    s = through(kind, requests, nodes, topology="rack")
    assert s.annotated[ask(0, kind)]["gangcheck.io/phase"] == "RollingBack"
    assert s.created == {}


def topping_up(kind: str) -> tuple[list[Obj], list[Obj]]:
    """The requests and nodes while the next source delivers: A kept with its two nodes
    (a0, a1), B asking the next source for the two other members, not provisioned yet
    (test_scaledown.py guards A's nodes on it)."""
    a = request(0, 4, kind=kind, **kept())
    b = request(1, 2, kind=kind, provisioned=False, kept_from=A, kept_members="2")
    return [a, b], [gpu_node(n, "a", arrived_for=A, kind=kind) for n in ("a0", "a1")]


@pytest.mark.parametrize("kind", KINDS)
def test_while_the_next_source_delivers_the_kept_request_stays(kind: str) -> None:
    s = through(kind, *topping_up(kind))
    assert s.deleted == [] and s.reclaimed == {} and s.created == {}


@pytest.mark.parametrize("kind", KINDS)
def test_the_gang_is_ready_on_kept_and_new_nodes(kind: str) -> None:
    a = request(0, 4, kind=kind, **kept())
    b = request(1, 2, kind=kind, kept_from=A, kept_members="2")
    nodes = [
        *(gpu_node(n, "a", arrived_for=A, kind=kind) for n in ("a0", "a1")),
        *(gpu_node(n, "b", arrived_for=B, kind=kind) for n in ("b0", "b1")),
    ]
    s = through(kind, [a, b], nodes)
    assert s.state == "ready", s.message
    for k in (0, 1):
        assert s.annotated[ask(k, kind)]["gangcheck.io/phase"] == "Fulfilled"
    assert s.consumed == ask(1, kind)
    assert "pool" not in s.pinned  # on both pools' nodes
    for k in (0, 1):
        assert hold_toleration(f"default/{ask(k, kind)}") in s.tolerations


@pytest.mark.parametrize("kind", KINDS)
def test_the_gang_does_not_fit_on_kept_nodes_alone(kind: str) -> None:
    a = request(0, 4, kind=kind, **kept())
    b = request(1, 2, kind=kind, kept_from=A, kept_members="2")
    nodes = [
        *(gpu_node(n, "a", arrived_for=A, kind=kind) for n in ("a0", "a1")),
        gpu_node("b0", "b", arrived_for=B, kind=kind),
    ]
    s = through(kind, [a, b], nodes)
    assert s.state in ("pending", "")
    assert s.consumed == ""
    if s.message:
        assert "3 of 4 members placeable" in s.message


#: B's record once the next source (the last) failed and its arrivals went back.
NEXT_FAILED: dict[str, Any] = {
    "kept_from": A,
    "kept_members": "2",
    "phase": "RollingBack",
    "rollback_reason": "Failed: b stocked out",
    "outcome": OUTCOME,
}


@pytest.mark.parametrize("kind", KINDS)
def test_the_attempt_ending_rolls_the_kept_request_back_before_the_next(kind: str) -> None:
    b = request(1, 2, kind=kind, **NEXT_FAILED)
    nodes = [gpu_node(n, "a", arrived_for=A, kind=kind) for n in ("a0", "a1")]
    s = through(kind, [request(0, 4, kind=kind, **kept()), b], nodes)
    # the last source failed: what was kept goes back first, by A's own record
    assert s.state == ""
    assert s.annotated[ask(0, kind)]["gangcheck.io/phase"] == "RollingBack"
    assert s.reclaimed == {ask(0, kind): ("a0", "a1")}
    # once A's outcome is recorded: the next attempt (Retry; a group's after its backoff)
    a_done = request(0, 4, kind=kind, **kept(phase="RollingBack", outcome=OUTCOME))
    s = through(kind, [a_done, b], [])
    assert s.state == "retry"
    assert s.reclaimed == {}


@pytest.mark.parametrize("kind", KINDS)
def test_a_keep_whose_next_ask_was_lost_asks_it_from_the_record(kind: str) -> None:
    nodes = [gpu_node(n, "a", arrived_for=A, kind=kind) for n in ("a0", "a1")]
    s = through(kind, [request(0, 4, kind=kind, **kept())], nodes)
    assert s.created[ask(1, kind)][0] == 2
    assert s.created[ask(1, kind)][1]["gangcheck.io/kept-from"] == ask(0, kind)
    assert s.deleted == [] and s.reclaimed == {}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("gone", ["a0", "a0,a1"])
def test_kept_nodes_gone_before_the_next_ask_are_not_counted(kind: str, gone: str) -> None:
    left = [n for n in ("a0", "a1") if n not in gone.split(",")]
    nodes = [gpu_node(n, "a", arrived_for=A, kind=kind) for n in left]
    s = through(kind, [request(0, 4, kind=kind, **kept())], nodes)
    if left:
        assert s.created[ask(1, kind)][0] == 3
    else:  # nothing left to top up: A goes back, then the attempt ends as a rollback's
        assert s.created == {}
        assert s.annotated[ask(0, kind)]["gangcheck.io/phase"] == "RollingBack"


# ---- a Workload's check only -------------------------------------------------------------


def started_top_up() -> tuple[list[Obj], Obj]:
    """A top-up whose gang started: A kept (Fulfilled), B Started, and the Workload admitted,
    its check Ready on B (test_scaledown.py lifts its guard on it too)."""
    a = request(0, 4, **kept(phase="Fulfilled"))
    b = request(1, 2, kept_from=A, kept_members="2", phase="Started")
    wl = (
        gang(4)
        .check(
            state="Ready",
            pod_set_updates=[{"name": "workers", "annotations": {CONSUME_ANNOTATION: B}}],
        )
        .condition("Admitted")
        .build()
    )
    return [a, b], wl


def test_once_started_the_kept_nodes_hold_is_lifted() -> None:
    requests, wl = started_top_up()
    nodes = [gpu_node("a0", "a", arrived_for=A), gpu_node("b0", "b", arrived_for=B, held=False)]
    d = run(requests, nodes, workload=wl)
    released = [n for act in d.actions if isinstance(act, ReleaseHold) for n in act.nodes]
    assert released == ["a0"]


def test_a_kept_request_deleted_by_hand_has_its_nodes_hold_and_guard_lifted() -> None:
    """A, kept and topped up by B, deleted outside gangcheck: its nodes, held and guarded from
    scale-down by a record no longer there, have both lifted once the gang started (the hold
    first, applied only once the API server confirms A gone), said by a HoldLifted Event."""
    requests, wl = started_top_up()
    key = f"default/{A}"
    guarded = {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}
    a0 = gpu_node("a0", "a", arrived_for=A)
    a0["metadata"]["annotations"].update({**guarded, "gangcheck.io/scale-down-disabled-for": key})
    nodes = [a0, gpu_node("b0", "b", arrived_for=B, held=False)]
    d = run(requests[1:], nodes, workload=wl)  # A gone
    lifted = [a for a in d.actions if isinstance(a, ReleaseHold | GuardScaleDown)]
    assert lifted == [ReleaseHold(("a0",), gone=A), GuardScaleDown(key, ("a0",), on=False)]
    assert [e.reason for e in d.events] == ["HoldLifted"]


def test_after_retry_both_requests_of_the_attempt_are_withdrawn() -> None:
    a = request(0, 4, **kept(phase="RollingBack", outcome=OUTCOME))
    b = request(1, 2, kept_from=A, phase="RollingBack", outcome=OUTCOME)
    wl = gang(4).check(state="Retry").build()
    s = seen(run([a, b], [], workload=wl))
    assert s.deleted == sorted([A, B])


def test_a_ready_gang_keeps_the_request_it_was_topped_up_from() -> None:
    """Only a race's losers are withdrawn once the gang is Ready: the kept request is the
    record of nodes the gang runs on (and of their hold, lifted once it has started)."""
    a = request(0, 4, **kept(phase="Fulfilled"))
    b = request(1, 2, kept_from=A, kept_members="2", phase="Fulfilled")
    wl = gang(4).check(
        state="Ready",
        pod_set_updates=[{"name": "workers", "annotations": {CONSUME_ANNOTATION: B}}],
    )
    s = seen(run([a, b], [gpu_node("a0", "a", arrived_for=A)], workload=wl.build()))
    assert s.deleted == [] and s.reclaimed == {}


@pytest.mark.parametrize("kind", KINDS)
def test_a_kept_request_rolling_back_is_not_withdrawn_before_its_outcome(kind: str) -> None:
    """The attempt ends and the kept request's rollback is under way (no outcome yet): it is
    reclaimed again, never withdrawn as superseded meanwhile (its record would go with it)."""
    b_done = {
        "kept_from": A,
        "kept_members": "2",
        "phase": "RollingBack",
        "rollback_reason": "Failed: b stocked out",
        "outcome": OUTCOME,
    }
    rolling = kept(phase="RollingBack")
    requests = [request(0, 4, kind=kind, **rolling), request(1, 2, kind=kind, **b_done)]
    nodes = [gpu_node(n, "a", arrived_for=A, kind=kind) for n in ("a0", "a1")]
    s = through(kind, requests, nodes)
    assert s.deleted == []
    assert s.reclaimed == {ask(0, kind): ("a0", "a1")}


def test_diagnose_fits_a_topped_up_request_on_the_kept_nodes_and_its_own() -> None:
    """gangcheck diagnose replays the fit as the controller makes it: the kept request's
    nodes count for the request topping them up (before, only its own source's did)."""
    a = request(0, 4, **kept())
    b = request(1, 2, kept_from=A, kept_members="2")
    nodes = [
        *(gpu_node(n, "a", arrived_for=A) for n in ("a0", "a1")),
        gpu_node("b0", "b", arrived_for=B),
    ]
    world = World(
        nodes=tuple(nodes),
        admission_checks={CHECK: admission_check()},
        configs={"cfg": {"spec": SPEC}},
        flavors=FLAVOR,
        requests=(a, b),
    )
    facts = gather(gang(4).build(), world, now=NOW)
    assert facts.request is not None and facts.request.name == B
    assert facts.placement is not None
    assert (facts.placement.placeable, facts.placement.total) == (3, 4)


def test_diagnose_fits_a_topped_up_pod_group_on_the_kept_nodes_and_its_own() -> None:
    a = request(0, 4, kind="PodGroup", **kept())
    b = request(1, 2, kind="PodGroup", kept_from=A, kept_members="2")
    nodes = [
        *(gpu_node(n, "a", arrived_for=A, kind="PodGroup") for n in ("a0", "a1")),
        gpu_node("b0", "b", arrived_for=B, kind="PodGroup"),
    ]
    pods = members(4)
    notes = {
        "gangcheck.io/state": "Provisioning",
        "gangcheck.io/attempt": "1",
        "gangcheck.io/request": ask(1, "PodGroup"),
    }
    world = World(nodes=tuple(nodes), pods=tuple(pods), requests=(a, b))
    facts = gather_group(
        group(4, annotations=notes),
        [pod_of(p) for p in pods],
        world,
        namespace="default",
        name="g",
        now=NOW,
    )
    assert facts.request is not None and facts.request.name == ask(1, "PodGroup")
    assert facts.placement is not None
    assert (facts.placement.placeable, facts.placement.total) == (3, 4)


# ---- a top-up whose sources moved in the config once Provisioned: pinned as they asked ----

#: a and b share a zone, c is in another: a gang on a's and b's nodes is pinned to zone z1.
ZONED: Obj = {
    **SPEC,
    "capacitySources": [
        {"name": "a", "nodeSelector": {"pool": "a", "zone": "z1"}, "deadlineSeconds": 20},
        {"name": "b", "nodeSelector": {"pool": "b", "zone": "z1"}},
        {"name": "c", "nodeSelector": {"pool": "c", "zone": "z2"}},
    ],
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_top_up_is_pinned_to_the_sources_it_asked_after_one_left(kind: str) -> None:
    """A (source a) kept, B (source b) topping it up and Provisioned, both made under
    [a, b, c]; then a is removed ([b, c]): the gang on a's and b's nodes is pinned to the
    zone a and b share (z1), as it asked. Before, the sources were read by their index in
    the config now (b for A, c for B): no shared label, the gang pinned to no zone."""
    made = {"attempt_config": spec_record(parse_spec(ZONED))}
    a = request(0, 4, kind=kind, **kept(), **made)
    b = request(1, 2, kind=kind, kept_from=A, kept_members="2", **made)
    nodes = [
        *(gpu_node(n, "a", arrived_for=A, kind=kind) for n in ("a0", "a1")),
        *(gpu_node(n, "b", arrived_for=B, kind=kind) for n in ("b0", "b1")),
    ]
    for n in nodes:
        n["metadata"]["labels"]["zone"] = "z1"
    now = {**ZONED, "capacitySources": ZONED["capacitySources"][1:]}
    s = through(kind, [a, b], nodes, spec=now)
    assert s.state == "ready", s.message
    assert s.consumed == ask(1, kind)
    assert s.pinned.get("zone") == "z1" and "pool" not in s.pinned


def test_diagnose_fits_a_request_on_the_nodes_of_the_source_it_asked_after_it_left() -> None:
    """B asked b of [a, b, c] and is Provisioned, its nodes in pool b; then b is removed
    ([a, c]): gangcheck diagnose fits the gang where the controller does, on b's nodes
    (lifecycle.asked_source). Before, it pinned the gang to c's, now at b's index: 0 of 4."""
    made = {"attempt_config": spec_record(parse_spec(ZONED))}
    b = request(1, 4, **made)
    nodes = [gpu_node(f"b{i}", "b", arrived_for=B) for i in range(4)]
    for n in nodes:
        n["metadata"]["labels"]["zone"] = "z1"
    now = {**ZONED, "capacitySources": [ZONED["capacitySources"][i] for i in (0, 2)]}
    world = World(
        nodes=tuple(nodes),
        admission_checks={CHECK: admission_check()},
        configs={"cfg": {"spec": now}},
        flavors=FLAVOR,
        requests=(b,),
    )
    facts = gather(gang(4).build(), world, now=NOW)
    assert facts.request is not None and facts.request.name == B
    assert facts.placement is not None
    assert (facts.placement.placeable, facts.placement.total) == (4, 4)


@pytest.mark.parametrize(("raw", "members"), [("5", 5), ("²", 0), ("1" * 5000, 0), ("", 0)])
def test_a_kept_members_record_written_by_hand_is_unreadable_not_an_error(
    raw: str, members: int
) -> None:
    """`gangcheck.io/kept-members` as a hand could write it: '²' is a digit to str.isdigit,
    not to int, and 5000 digits are past int()'s limit; both read as none kept (as 'x' is),
    by the one rule of records.count_of, instead of raising in every decide that reads it."""
    req = provisioning_request("wl-1-s1", annotations={"gangcheck.io/kept-members": raw})
    assert topup.kept_members(request_of(req)) == members


#: Three sources: a top-up that stops short may itself be topped up from the third.
SPEC3: Obj = {
    **SPEC,
    "capacitySources": [
        *SPEC["capacitySources"][:1],
        {**SPEC["capacitySources"][1], "deadlineSeconds": 20},
        {"name": "c", "nodeSelector": {"pool": "c"}},
    ],
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["stocked out", "provisioned, nothing arrived by its deadline"])
def test_a_top_up_that_delivered_nothing_is_withdrawn_not_kept(kind: str, how: str) -> None:
    """B, topping A's kept nodes up, delivers nothing (its source stocked out too, or said
    Provisioned and nothing came by its deadline): B is rolled back as a source that
    delivered nothing (the autoscaler stops retrying it), A stays kept, and the next source
    is asked once B's outcome is recorded. Before, A's nodes were counted as B's: B was
    marked Kept with no node of its own and left in flight, its request retried by the
    autoscaler while the third source was asked for the same members."""
    nodes = [gpu_node(n, "a", arrived_for=A, kind=kind) for n in ("a0", "a1")]
    if how == "stocked out":
        b = capacity_not_found(
            request(1, 2, kind=kind, provisioned=False, kept_from=A, kept_members="2")
        )
    else:
        b = request(1, 2, kind=kind, kept_from=A, kept_members="2")
    s = through(kind, [request(0, 4, kind=kind, **kept()), b], nodes, spec=SPEC3)
    assert s.annotated[ask(1, kind)]["gangcheck.io/phase"] == "RollingBack"
    assert ask(0, kind) not in s.annotated  # A stays kept
    assert s.created == {} and "CapacityToppedUp" not in s.events
    assert s.reclaimed.get(ask(0, kind)) is None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("b_arrived", [False, True], ids=["nothing-arrived", "a-node-arrived"])
def test_a_top_up_kept_with_no_node_by_the_previous_release_is_withdrawn(
    kind: str, b_arrived: bool
) -> None:
    """Upgrading in flight: the release before 046b32e marked B (topping A up, stocked out
    itself) Kept with no node of its own (rollback-nodes {}) and asked C for the same
    members, B left in flight for the autoscaler to go on retrying beside C. B is withdrawn
    (nothing of its own to reclaim), A stays kept, C followed as it is, nothing asked again.
    A node that arrived for B since is B's own: B is then left as kept."""
    nodes = [gpu_node(n, "a", arrived_for=A, kind=kind) for n in ("a0", "a1")]
    if b_arrived:
        nodes.append(gpu_node("b0", "b", arrived_for=B, kind=kind))
    b = capacity_not_found(
        request(
            1,
            2,
            kind=kind,
            provisioned=False,
            kept_from=A,
            kept_members="2",
            phase="Kept",
            rollback_reason="Deadline: the gang did not fit within 20s; CapacityIsNotFound",
            rollback_nodes="{}",
        )
    )
    c = request(
        2,
        2,
        kind=kind,
        provisioned=False,
        kept_from=f"{ask(0, kind)},{ask(1, kind)}",
        kept_members="2",
    )
    s = through(kind, [request(0, 4, kind=kind, **kept()), b, c], nodes, spec=SPEC3)
    assert s.deleted == ([] if b_arrived else [ask(1, kind)])
    assert s.created == {} and s.reclaimed == {}
    assert ask(0, kind) not in s.annotated and ask(1, kind) not in s.annotated
