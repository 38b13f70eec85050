"""Table tests of the PodGroup provisioner's decision, one narrative case each."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.actions import (
    AnnotateRequest,
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
    ReclaimArrivals,
    ReleaseMembers,
)
from gangcheck.logic.attempt.fulfillment import ClusterView, Waiting
from gangcheck.logic.podgroups.podgroup import GroupDecision, GroupSnapshot, decide
from gangcheck.model.names import CONSUME_ANNOTATION, GATE, GATED_AT
from gangcheck.model.objects import pod_of, request_of
from gangcheck.model.podgroups import pod_group_of
from gangcheck.model.provisioning_config import parse_spec
from tests.builders import container, node, pod_template, provisioning_request

NOW = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
NOW_TEXT = "2026-11-30T10:05:00Z"
LATER = "2026-11-30T10:20:00Z"
RACK = "rack"
Obj = dict[str, Any]


def group(
    min_count: int = 3,
    *,
    annotations: dict[str, str] | None = None,
    topology: str = "",
    plugins: bool = False,
    basic: bool = False,
) -> Obj:
    meta = {"name": "g", "namespace": "default", "uid": "uid-g", "annotations": annotations or {}}
    if plugins:
        return {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": meta,
            "spec": {"minMember": min_count},
        }
    policy: Obj = {"basic": {}} if basic else {"gang": {"minCount": min_count}}
    spec: Obj = {"schedulingPolicy": policy}
    if topology:
        spec["schedulingConstraints"] = {"topology": [{"key": topology}]}
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": meta,
        "spec": spec,
    }


def member(
    i: int,
    *,
    gated: bool = True,
    gpu: int = 1,
    node_name: str = "",
    created: str = "",
    consumes: str = "",
) -> Obj:
    spec: Obj = {"containers": [container(gpu=gpu)], "schedulingGroup": {"podGroupName": "g"}}
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    if node_name:
        spec["nodeName"] = node_name
    meta: Obj = {"name": f"m{i}", "namespace": "default"}
    if created:
        meta["creationTimestamp"] = created
    if consumes:
        meta["annotations"] = {CONSUME_ANNOTATION: consumes}
    return {"metadata": meta, "spec": spec}


def members(count: int, **kw: Any) -> list[Obj]:
    return [member(i, **kw) for i in range(count)]


REQ1 = "g-pg-1"
TPL1 = naming.template_name(REQ1, "ps-0")


def req(name: str = REQ1, *, conditions: dict[str, str] | None = None, **kw: Any) -> Any:
    annotations = {
        "gangcheck.io/pod-group": "pg/g",
        "gangcheck.io/pod-group-uid": "uid-g",
        "gangcheck.io/fulfillment-deadline": kw.pop("deadline", LATER),
        **kw.pop("annotations", {}),
    }
    return provisioning_request(
        name,
        conditions=conditions,
        templates=[(TPL1, kw.pop("count", 3))],
        annotations=annotations,
        **kw,
    )


@dataclass
class Case:
    id: str
    group: Obj
    members: list[Obj]
    config: dict[str, Any] | None = field(default_factory=dict)
    config_problem: str = ""
    requests: list[Any] = field(default_factory=list)
    nodes: list[Obj] = field(default_factory=list)
    max_members: int = 5000
    opted_in: bool = True
    # expectations
    state: str | None = None  # None: no state written
    message: str = ""
    released: tuple[str, ...] | None = None
    late_released: tuple[str, ...] | None = None
    """Released with the gang: no part of its request (nothing consumed, no toleration)."""
    consume: str | None = None
    pins: dict[str, str] = field(default_factory=dict)
    request_counts: list[int] | None = None
    deletes: tuple[str, ...] = ()
    reclaims: bool = False
    events: tuple[str, ...] = ()
    status: dict[str, str] = field(default_factory=dict)


CASES = [
    Case(
        "fewer members than minCount: waits, says how many",
        group(3),
        members(2),
        state="WaitingForMembers",
        message="waiting for members: 2 of 3 exist",
    ),
    Case(
        "the gang fits on free nodes: released together, no request",
        group(3),
        members(3),
        nodes=[node("n1", gpu=2), node("n2", gpu=1)],
        state="Released",
        message="the whole gang fits on nodes that exist",
        released=("m0", "m1", "m2"),
        events=("Released", "GangReleased"),
    ),
    Case(
        "no room: one request, identical members in one pod set",
        group(3),
        members(3),
        state="Provisioning",
        message="provisioning request g-pg-1 created for 3 pods",
        request_counts=[3],
    ),
    Case(
        "two kinds of members: two pod sets",
        group(3),
        [member(0, gpu=2), member(1), member(2, gpu=2)],
        state="Provisioning",
        request_counts=[2, 1],
    ),
    Case(
        "scheduler-plugins group: minMember is the gang size",
        group(2, plugins=True),
        [
            {
                **member(i),
                "metadata": {
                    "name": f"m{i}",
                    "namespace": "default",
                    "labels": {"scheduling.x-k8s.io/pod-group": "g"},
                },
            }
            for i in range(2)
        ],
        state="Provisioning",
        message="provisioning request g-coscheduling-1 created for 2 pods",
    ),
    Case(
        "provisioned and the nodes exist: released, consuming the request",
        group(3, annotations={"gangcheck.io/state": "Provisioning"}),
        members(3),
        requests=[req(conditions={"Provisioned": "ok"})],
        nodes=[node("n1", gpu=3)],
        state="Released",
        released=("m0", "m1", "m2"),
        consume=REQ1,
    ),
    Case(
        "provisioned, nodes not there yet: keeps waiting, says so",
        group(3, annotations={"gangcheck.io/state": "Provisioning"}),
        members(3),
        requests=[req(conditions={"Provisioned": "ok"})],
        nodes=[node("n1", gpu=1)],
        state="Provisioning",
        message="capacity requested, not yet usable: 1 of 3 members placeable",
    ),
    Case(
        "deadline passed without the gang fitting: rollback starts",
        group(3, annotations={"gangcheck.io/state": "Provisioning"}),
        members(3),
        requests=[
            req(
                conditions={"Provisioned": "ok"},
                deadline="2026-11-30T10:00:00Z",
                created="2026-11-30T09:53:00Z",  # 420 s before: the config's deadlineSeconds
            )
        ],
        events=("RollbackStarted",),
    ),
    Case(
        "rolling back, nothing reclaimed yet: reclaim",
        group(3),
        members(3),
        requests=[req(annotations={"gangcheck.io/phase": "RollingBack"})],
        reclaims=True,
    ),
    Case(
        "rolled back: delete the request, attempt 2 after the backoff",
        group(3),
        members(3),
        requests=[
            req(
                annotations={
                    "gangcheck.io/phase": "RollingBack",
                    "gangcheck.io/rollback-reason": "Deadline: x",
                    "gangcheck.io/outcome": '{"reclaimed": ["n9"], "heldSeconds": 60}',
                }
            )
        ],
        state="BackingOff",
        message="attempt 2 at 2026-11-30T10:06:00Z: rolled back g-pg-1 (Deadline: x)",
        status={
            "gangcheck.io/attempt": "2",
            "gangcheck.io/next-attempt-at": "2026-11-30T10:06:00Z",
        },
        events=("RolledBack",),
    ),
    Case(
        "the last attempt rolled back: gives up, members stay gated with the reason",
        group(3, annotations={"gangcheck.io/attempt": "4"}),
        members(3),
        requests=[
            req(
                "g-pg-4",
                annotations={
                    "gangcheck.io/phase": "RollingBack",
                    "gangcheck.io/rollback-reason": "Deadline: x",
                    "gangcheck.io/outcome": "{}",
                },
            )
        ],
        state="GaveUp",
        message="gave up after attempt 4",
    ),
    Case(
        "attempt 2 is on the group: the rolled-back request goes as superseded",
        group(3, annotations={"gangcheck.io/attempt": "2", "gangcheck.io/next-attempt-at": LATER}),
        members(3),
        requests=[req(annotations={"gangcheck.io/phase": "RollingBack"})],
        deletes=(REQ1,),
    ),
    Case(
        "gave up: what is left of the last request goes, the members stay gated",
        group(3, annotations={"gangcheck.io/attempt": "4", "gangcheck.io/state": "GaveUp"}),
        members(3),
        requests=[req("g-pg-4")],
        deletes=("g-pg-4",),
    ),
    Case(
        "released into a rack, a late member with room there: released alone, pinned to it",
        group(
            2,
            annotations={
                "gangcheck.io/state": "Released",
                "gangcheck.io/request": REQ1,
                "gangcheck.io/topology-domain": "rack=b",
            },
        ),
        [member(0, gated=False, node_name="b1"), member(1, gated=False, node_name="b1"), member(2)],
        requests=[req(conditions={"Provisioned": "ok"}, count=2)],
        nodes=[node("a1", gpu=4, labels={"rack": "a"}), node("b1", gpu=3, labels={"rack": "b"})],
        released=("m2",),
        pins={"rack": "b"},
        events=("LateMembersReleased",),
    ),
    Case(
        "released into a rack, a late member with room only in another rack: stays gated",
        group(
            2,
            annotations={
                "gangcheck.io/state": "Released",
                "gangcheck.io/request": REQ1,
                "gangcheck.io/topology-domain": "rack=b",
            },
        ),
        [member(0, gated=False, node_name="b1"), member(1, gated=False, node_name="b1"), member(2)],
        requests=[req(conditions={"Provisioned": "ok"}, count=2)],
        nodes=[node("a1", gpu=4, labels={"rack": "a"}), node("b1", gpu=2, labels={"rack": "b"})],
        state="Released",
        message="1 member(s) created after the gang was read wait for room on nodes that exist",
        events=("LateMembersWaiting",),
    ),
    Case(
        "minCount 4, a request made for the 4 members then existing, 6 now: the fit and the "
        "release are for the 4 oldest; the 2 late ones are released with them, consuming nothing",
        group(4, annotations={"gangcheck.io/state": "Provisioning"}),
        [member(i, created=f"2026-11-30T10:00:0{i // 4}Z") for i in range(6)],
        requests=[
            req(
                conditions={"Provisioned": "ok"},
                count=4,
                annotations={"gangcheck.io/gang-members": "4"},
            )
        ],
        nodes=[node("n1", gpu=4)],
        state="Released",
        released=("m0", "m1", "m2", "m3"),
        late_released=("m4", "m5"),
        consume=REQ1,
        status={"gangcheck.io/gang-members": "4", "gangcheck.io/released-at": NOW_TEXT},
    ),
    Case(
        "members still being created: no request until the newest is 2 s old",
        group(4),
        [member(i, created="2026-11-30T10:04:59Z") for i in range(6)],
        state=None,
    ),
    Case(
        "minCount 4 and 6 settled members: one request for all 6, recording them",
        group(4),
        [member(i, created="2026-11-30T10:04:58Z") for i in range(6)],
        state="Provisioning",
        request_counts=[6],
        message="created for 6 pods",
    ),
    Case(
        "backing off: no request before the time",
        group(3, annotations={"gangcheck.io/attempt": "2", "gangcheck.io/next-attempt-at": LATER}),
        members(3),
    ),
    Case(
        "a required rack: spread capacity does not count",
        group(3, topology=RACK),
        members(3),
        nodes=[
            node("a1", gpu=2, labels={RACK: "a"}),
            node("b1", gpu=2, labels={RACK: "b"}),
        ],
        state="Provisioning",
        request_counts=[3],
    ),
    Case(
        "a required rack with room: released, pinned to it",
        group(3, topology=RACK),
        members(3),
        nodes=[
            node("a1", gpu=2, labels={RACK: "a"}),
            node("b1", gpu=3, labels={RACK: "b"}),
        ],
        state="Released",
        released=("m0", "m1", "m2"),
        pins={RACK: "b"},
    ),
    Case(
        "reservations first: the request asks for the rest",
        group(3),
        members(3),
        config={"reservations": [{"name": "r", "nodeLabels": {"res": "r"}, "nodes": 1}]},
        nodes=[node("r1", gpu=2, labels={"res": "r"})],
        state="Provisioning",
        message="created for 1 pods (2 more placed on reserved capacity)",
        request_counts=[1],
    ),
    Case(
        "basic policy: no gang, released at once",
        group(basic=True),
        members(1),
        state="NotAGang",
        released=("m0",),
    ),
    Case(
        "a gang bigger than one request may carry: failed, named",
        group(10),
        members(1),
        max_members=4,
        state="Failed",
        message="minCount 10 exceeds the 4 members",
        events=("GangTooLarge",),
    ),
    Case(
        "no usable config: blocked with its problem",
        group(1),
        members(1),
        config=None,
        config_problem="AtomicProvisioningConfig 'x' not found",
        state="Blocked",
        message="'x' not found",
        events=("ConfigProblem",),
    ),
    Case(
        "a member without the gate: reported once, by name",
        group(2),
        [member(0), member(1, gated=False)],
        status={"gangcheck.io/ungated-members": "m1"},
        events=("MemberNotGated", "MemberNotGated", "Provisioning", "ProvisioningRequestCreated"),
        state="Provisioning",
    ),
    Case(
        "ungated members of a group gangcheck never held, outside opted-in namespaces: silent",
        group(2),
        members(2, gated=False),
        opted_in=False,
    ),
    Case(
        "released and every member running: the request is marked started",
        group(2, annotations={"gangcheck.io/state": "Released", "gangcheck.io/request": REQ1}),
        members(2, gated=False, node_name="n1"),
        requests=[req(conditions={"Provisioned": "ok"}, count=2)],
    ),
    Case(
        "released, a late member and no room for it: stays gated, not onto the full request",
        group(2, annotations={"gangcheck.io/state": "Released", "gangcheck.io/request": REQ1}),
        [member(0, gated=False, node_name="n1"), member(1, gated=False, node_name="n1"), member(2)],
        requests=[req(conditions={"Provisioned": "ok"}, count=2)],
        nodes=[node("n1", gpu=2)],
        state="Released",
        message="1 member(s) created after the gang was read wait for room on nodes that exist",
        events=("LateMembersWaiting",),
    ),
    Case(
        "released, a late member and room for it on a node that exists: released, consuming "
        "nothing",
        group(2, annotations={"gangcheck.io/state": "Released", "gangcheck.io/request": REQ1}),
        [member(0, gated=False, node_name="n1"), member(1, gated=False, node_name="n1"), member(2)],
        requests=[req(conditions={"Provisioned": "ok"}, count=2)],
        nodes=[node("n1", gpu=2), node("n2", gpu=1)],
        released=("m2",),
        consume=None,
        events=("LateMembersReleased",),
    ),
    Case(
        "released, the gang not bound yet: a member gated since is released at once, since "
        "kube-scheduler holds a PodGroup back while any member is gated",
        group(2, annotations={"gangcheck.io/state": "Released", "gangcheck.io/request": REQ1}),
        [member(0, gated=False, consumes=REQ1), member(1, gated=False, consumes=REQ1), member(2)],
        requests=[req(conditions={"Provisioned": "ok"}, count=2)],
        nodes=[node("n1", gpu=0)],  # no room for it: released all the same
        released=("m2",),
        events=("LateMembersReleased",),
    ),
    Case(
        "the group is deleted: its requests are deleted",
        {**group(2), "metadata": {**group(2)["metadata"], "deletionTimestamp": LATER}},
        members(2),
        requests=[req()],
        deletes=(REQ1,),
    ),
]


def _decide(case: Case) -> GroupDecision:
    snap = GroupSnapshot(
        group=pod_group_of(case.group),
        members=tuple(map(pod_of, case.members)),
        config=None if case.config is None else parse_spec(case.config),
        config_problem=case.config_problem,
        requests=tuple(request_of(r) for r in case.requests),
        capacity=ClusterView(nodes=tuple(case.nodes), pods=tuple(case.members)),
        max_members=case.max_members,
        opted_in=case.opted_in,
    )
    return decide(snap, NOW)


ARRIVED_FOR_COSCHEDULING = node(
    "n1",
    gpu=1,
    created="2026-11-30T10:04:00Z",
    annotations={"gangcheck.io/arrived-for": "default/g-coscheduling-1"},
)
CASES += [
    Case(
        "coscheduling group's minMember removed mid-attempt (no longer a gang): members "
        "released as they come, the attempt withdrawn, what arrived reclaimed safely",
        group(
            0,
            plugins=True,
            annotations={
                "gangcheck.io/state": "Provisioning",
                "gangcheck.io/request": "g-coscheduling-1",
            },
        ),
        members(3),
        requests=[
            req("g-coscheduling-1", annotations={"gangcheck.io/pod-group": "coscheduling/g"})
        ],
        nodes=[ARRIVED_FOR_COSCHEDULING],
        state="NotAGang",
        released=("m0", "m1", "m2"),
        deletes=("g-coscheduling-1",),
        reclaims=True,
    ),
]


# ---- late members of a group with a required topology level: pinned to the gang's domain --

RACKS = [node("a1", gpu=4, labels={RACK: "a"}), node("b1", gpu=3, labels={RACK: "b"})]
"""Room for a late member in both racks."""
RECORDED = {"gangcheck.io/state": "Released", "gangcheck.io/request": REQ1}
HELD = "1 member(s) created after the gang was read stay gated, not released outside the gang's"
GONE = "the group's record of its domain (gangcheck.io/topology-domain) is gone and "


def pinned_to(pod: Obj, rack: str) -> Obj:
    """A member as released pinned to a rack (its nodeSelector)."""
    pod["spec"]["nodeSelector"] = {RACK: rack}
    return pod


def late_in_racks(where: tuple[str, str], *, record: bool, **expect: Any) -> Case:
    annotations = {**RECORDED, "gangcheck.io/topology-domain": "rack=b"} if record else RECORDED
    bound = [member(i, gated=False, node_name=n) for i, n in enumerate(where)]
    return Case(
        expect.pop("id"),
        group(2, topology=RACK, annotations=dict(annotations)),
        [*bound, member(2)],
        requests=[req(conditions={"Provisioned": "ok"}, count=2)],
        nodes=RACKS,
        **expect,
    )


CASES += [
    late_in_racks(
        ("b1", "b1"),
        record=True,
        id="racks required, the domain recorded: a late member is released pinned to it",
        released=("m2",),
        pins={RACK: "b"},
        events=("LateMembersReleased",),
    ),
    late_in_racks(
        ("b1", "b1"),
        record=False,
        id="racks required, the domain record removed by hand: a late member is released pinned "
        "to the rack its running members' nodes share, not into another with room",
        released=("m2",),
        pins={RACK: "b"},
        events=("LateMembersReleased",),
    ),
    late_in_racks(
        ("a1", "b1"),
        record=False,
        id="racks required, the record removed and the running members in two racks: the late "
        "member stays gated, why said",
        state="Released",
        message=f"{HELD} topology domain: {GONE}its running members are in 2 'rack' domains: a, b",
        events=("LateMembersWaiting",),
    ),
    late_in_racks(
        ("b1", "gone"),
        record=False,
        id="racks required, the record removed and a running member's node not known: the late "
        "member stays gated, why said",
        state="Released",
        message=f"{GONE}the 'rack' label of node 'gone', where a member runs, is not known",
        events=("LateMembersWaiting",),
    ),
    Case(
        "racks required, the record removed while the gang binds: a member gated since is "
        "released at once, pinned to the rack the gang was released into (its nodeSelector)",
        group(2, topology=RACK, annotations=dict(RECORDED)),
        [
            pinned_to(member(0, gated=False, consumes=REQ1), "b"),
            pinned_to(member(1, gated=False, consumes=REQ1), "b"),
            member(2),
        ],
        requests=[req(conditions={"Provisioned": "ok"}, count=2)],
        nodes=RACKS,
        released=("m2",),
        pins={RACK: "b"},
        events=("LateMembersReleased",),
    ),
    Case(
        "racks required, the record removed while the gang binds, its members pinned to no "
        "rack: the member gated since stays gated, why said",
        group(2, topology=RACK, annotations=dict(RECORDED)),
        [member(0, gated=False, consumes=REQ1), member(1, gated=False, consumes=REQ1), member(2)],
        requests=[req(conditions={"Provisioned": "ok"}, count=2)],
        nodes=RACKS,
        state="Released",
        message=f"{GONE}the members released together are not pinned to a 'rack'",
        events=("LateMembersWaiting",),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide(case: Case) -> None:
    decision = _decide(case)
    written = dict(decision.status or {})
    status = {**(case.group["metadata"].get("annotations") or {}), **written}
    if case.state is None:
        assert "gangcheck.io/state" not in written
    else:
        assert status.get("gangcheck.io/state") == case.state
    assert case.message in status.get("gangcheck.io/message", "")
    for key, value in case.status.items():
        assert status.get(key) == value
    releases = [a for a in decision.actions if isinstance(a, ReleaseMembers)]
    if case.released is None:
        assert releases == []
    else:
        late = [case.late_released] if case.late_released else []
        assert [r.pods for r in releases] == [case.released, *late]
        if late:
            assert releases[1].annotations == {"gangcheck.io/released-by": "LateMembersReleased"}
            assert releases[1].tolerations == ()
        assert releases[0].gate == GATE
        assert releases[0].annotations.get(CONSUME_ANNOTATION) == case.consume
        assert releases[0].annotations["gangcheck.io/released-by"] in (
            "GangReleased",
            "LateMembersReleased",
        )
        assert releases[0].node_selector == case.pins
    created = [a for a in decision.actions if isinstance(a, CreateRequest)]
    if case.request_counts is None:
        assert created == [] or case.state == "Provisioning"
    else:
        counts = [p["count"] for p in created[0].body["spec"]["podSets"]]
        assert counts == case.request_counts
        templates = [a for a in decision.actions if isinstance(a, CreateTemplate)]
        assert len(templates) == len(counts)
        for t in templates:
            spec = t.body["template"]["spec"]
            assert "schedulingGates" not in spec
            assert "schedulingGroup" not in spec
    deletes = tuple(a.name for a in decision.actions if isinstance(a, DeleteRequest))
    assert deletes == case.deletes
    assert any(isinstance(a, ReclaimArrivals) for a in decision.actions) == case.reclaims
    assert tuple(e.reason for e in decision.events) == case.events or not case.events


def test_started_request_is_annotated_once_every_member_is_bound() -> None:
    case = next(c for c in CASES if c.id.startswith("released and every member running"))
    decision = _decide(case)
    assert decision.actions == (AnnotateRequest(REQ1, {"gangcheck.io/phase": "Started"}),)


def test_a_bound_gang_with_late_members_waiting_still_marks_its_request_started() -> None:
    case = next(c for c in CASES if c.id.startswith("released, a late member and no room"))
    decision = _decide(case)
    assert AnnotateRequest(REQ1, {"gangcheck.io/phase": "Started"}) in decision.actions


def test_the_same_state_is_not_written_twice() -> None:
    case = CASES[0]
    first = _decide(case)
    assert first.status is not None
    again = Case(case.id, group(3, annotations=dict(first.status)), case.members)
    assert _decide(again) == GroupDecision(actions=())


def test_a_members_gate_removed_by_someone_else_is_said_as_removed_not_as_never_added() -> None:
    """A member the webhook gated (its gated-at annotation) whose gate someone else removed
    before the gang was released: the Events say so, not that the webhook was down."""
    stripped = member(1, gated=False)
    stripped["metadata"]["annotations"] = {GATED_AT: "2026-11-30T10:00:00Z"}
    case = Case(
        "gate removed",
        group(3, annotations={"gangcheck.io/state": "Provisioning", "gangcheck.io/request": REQ1}),
        [member(0), stripped, member(2, gated=False)],
        requests=[req()],
    )
    decision = _decide(case)
    said = {
        e.about.name if e.about else "g": e.message
        for e in decision.events
        if e.reason == "MemberNotGated"
    }
    assert said["m1"] == (
        "gated by the webhook at 2026-11-30T10:00:00Z, its gangcheck.io/provisioning "
        "scheduling gate since removed while its gang is not released: PodGroup g cannot hold "
        "it back until its gang's capacity exists"
    )
    assert said["m2"].startswith("created without the gangcheck.io/provisioning scheduling gate")
    assert said["g"] == (
        "2 member(s) carry no gangcheck.io/provisioning scheduling gate before their gang is "
        "released: m1 gated by the webhook at 2026-11-30T10:00:00Z, its "
        "gangcheck.io/provisioning scheduling gate since removed while its gang is not "
        "released; m2 created without the gangcheck.io/provisioning scheduling gate (was the "
        "webhook down, or the namespace not opted in?); they may be scheduled one by one, "
        "before the gang's capacity exists"
    )
    assert (decision.status or {})["gangcheck.io/ungated-members"] == "m1,m2"


def test_the_names_said_ungated_keep_only_pods_that_are_still_members() -> None:
    """The names of members said ungated (gangcheck.io/ungated-members) are rewritten with the
    next one said: those of pods gone since are dropped (before, the annotation only grew,
    with pods coming and going, towards the object's size limit); one still there is kept,
    so it is not said again."""
    said_before = {"gangcheck.io/ungated-members": "gone-a,gone-b,m1"}
    stripped = member(1, gated=False)
    stripped["metadata"]["annotations"] = {GATED_AT: "2026-11-30T10:00:00Z"}
    case = Case(
        "said before, some gone",
        group(
            3,
            annotations={
                "gangcheck.io/state": "Provisioning",
                "gangcheck.io/request": REQ1,
                **said_before,
            },
        ),
        [member(0), stripped, member(2, gated=False)],
        requests=[req()],
    )
    decision = _decide(case)
    said = [
        e.about.name if e.about else "g" for e in decision.events if e.reason == "MemberNotGated"
    ]
    assert said == ["g", "m2"]
    assert (decision.status or {})["gangcheck.io/ungated-members"] == "m1,m2"


def test_a_member_never_gated_and_bound_before_its_gang_is_released_is_said() -> None:
    """A member created without the gate (the webhook down) that kube-scheduler bound before
    gangcheck first looked: the gang starts split, one member running before its capacity
    exists. Said as an unbound one is (before: nothing, the member no longer unbound)."""
    case = Case(
        "bound ungated",
        group(3),
        [member(0), member(1), member(2, gated=False, node_name="n1")],
        nodes=[node("n1", gpu=1)],
    )
    decision = _decide(case)
    said = [e for e in decision.events if e.reason == "MemberNotGated"]
    assert [e.about.name if e.about else "g" for e in said] == ["g", "m2"]
    assert said[0].message.startswith(
        "1 member(s) carry no gangcheck.io/provisioning scheduling gate before their gang is "
        "released: m2 bound to node n1 without ever having the gangcheck.io/provisioning "
        "scheduling gate (created bound, or while the webhook was down, or before the "
        "namespace was opted in)"
    )
    assert (decision.status or {})["gangcheck.io/ungated-members"] == "m2"


def test_a_member_the_webhook_gated_and_bound_since_is_not_said_as_never_gated() -> None:
    """Bound and stamped by the webhook: its gate was lifted, by gangcheck's release (a
    group that gave up after its start watchdog) or another: nothing is said of it."""
    bound = member(2, gated=False, node_name="n1")
    bound["metadata"]["annotations"] = {GATED_AT: "2026-11-30T10:00:00Z"}
    case = Case("bound gated", group(3, annotations={"gangcheck.io/state": "GaveUp"}), [bound])
    assert [e for e in _decide(case).events if e.reason == "MemberNotGated"] == []


def test_a_bound_member_of_a_group_once_released_is_not_said_as_never_gated() -> None:
    """A group released once (gangcheck.io/released-at) that gave up after its start
    watchdog: its members' gates were lifted by the release, bound or not, stamped by the
    webhook or gated by their own template: nothing is said of them (before, one not bound
    was said created without the gate)."""
    once = {"gangcheck.io/state": "GaveUp", "gangcheck.io/released-at": "2026-11-30T10:00:00Z"}
    stamped = member(2, gated=False)  # released, not bound
    stamped["metadata"]["annotations"] = {GATED_AT: "2026-11-30T09:00:00Z"}
    case = Case(
        "released once",
        group(3, annotations=once),
        [*members(2, gated=False, node_name="n1"), stamped],
    )
    assert [e for e in _decide(case).events if e.reason == "MemberNotGated"] == []


def test_a_member_of_the_gang_ungated_by_hand_is_given_the_request_and_its_hold_at_release() -> (
    None
):
    """A member counted in the gang, its gate removed by someone else while it waits (or
    created without it) and still unbound: at release it is annotated to consume the request
    and given the hold's toleration with the gated ones. Before, only the gated ones were: the
    gang was fitted onto the held node with it, which it could not take (the hold), so it
    stayed pending, the start watchdog rolled the gang back and the group gave up."""
    stripped = member(1, gated=False)
    stripped["metadata"]["annotations"] = {GATED_AT: "2026-11-30T10:00:00Z"}
    held = {"gangcheck.io/state": "Provisioning", "gangcheck.io/request": REQ1}
    case = Case(
        "ungated by hand",
        group(3, annotations={**held, "gangcheck.io/ungated-members": "m1"}),
        [member(0), stripped, member(2)],
        requests=[req(conditions={"Provisioned": "ok"})],
        nodes=[node("n1", gpu=3)],
    )
    decision = _decide(case)
    (release,) = [a for a in decision.actions if isinstance(a, ReleaseMembers)]
    assert release.pods == ("m0", "m1", "m2")
    assert release.annotations[CONSUME_ANNOTATION] == REQ1
    assert release.tolerations  # the hold of n1, for all three
    said = [e.message for e in decision.events if e.reason == "GangReleased"]
    assert said == [
        "Released 2 members together, and gave 1 member(s) whose gate was lifted before (m1) "
        "the request and its hold's toleration: the whole gang fits on nodes that exist: 3 of "
        "3 members placeable on 1 node"
    ]


def test_a_member_released_onto_the_request_already_is_not_named_as_ungated_by_hand() -> None:
    """The gang's release applied in part (its members patched one by one, the next decision
    made before the group's record of it): a member consuming the request already had its
    gate lifted by that release, with the request and the hold; it is no loose member
    (podgroup.loose_members), not released again nor named as one whose gate was lifted
    before. Before, every ungated unbound member was."""
    held = {"gangcheck.io/state": "Provisioning", "gangcheck.io/request": REQ1}
    case = Case(
        "released in part",
        group(3, annotations=held),
        [member(0), member(1, gated=False, consumes=REQ1), member(2)],
        requests=[req(conditions={"Provisioned": "ok"})],
        nodes=[node("n1", gpu=3)],
    )
    decision = _decide(case)
    (release,) = [a for a in decision.actions if isinstance(a, ReleaseMembers)]
    assert release.pods == ("m0", "m2")
    said = [e.message for e in decision.events if e.reason == "GangReleased"]
    assert len(said) == 1
    assert "gate was lifted before" not in said[0], said


def test_pods_a_request_is_made_from_keep_their_claims_and_drop_their_binding() -> None:
    pod = member(0)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    pod["spec"]["nodeName"] = ""
    decision = _decide(Case("dra", group(1), [pod]))
    template = next(a for a in decision.actions if isinstance(a, CreateTemplate))
    spec = template.body["template"]["spec"]
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    assert "nodeName" not in spec


def test_an_autoscaler_that_cannot_size_dra_claims_is_named_not_waited_on() -> None:
    pod = member(0)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    request = req(conditions={"Accepted": "ok"}, count=1)
    request["status"]["conditions"].append(
        {
            "type": "Provisioned",
            "status": "False",
            "reason": "CapacityIsNotFound",
            "message": "no node group fits",
            "lastTransitionTime": "2026-11-30T10:00:00Z",
        }
    )
    case = Case("dra hint", group(1, annotations={"gangcheck.io/state": "Provisioning"}), [pod])
    case.requests = [request]
    message = (_decide(case).status or {})["gangcheck.io/message"]
    assert message.startswith("no node group fits; the gang uses DRA resource claims")
    assert "kubernetes/autoscaler#10065" in message

    plain = Case("no dra", case.group, [member(0)], requests=[request])
    assert "#10065" not in (_decide(plain).status or {})["gangcheck.io/message"]


@pytest.mark.parametrize("current", [False, True], ids=["node cache behind", "node cache current"])
def test_a_deleted_groups_waiting_attempt_is_withdrawn_once_the_node_cache_is_current(
    current: bool,
) -> None:
    """As for Workloads: withdrawing an attempt still waiting in fit mode records the arrivals
    it passed over first, so it waits for a node cache that may miss some."""
    deleted = {**group(2), "metadata": {**group(2)["metadata"], "deletionTimestamp": LATER}}
    request = req(conditions={"Provisioned": "ok"})
    waiting = Waiting(f"default/{REQ1}", (pod_template(gpu=1),))
    snap = GroupSnapshot(
        group=pod_group_of(deleted),
        members=tuple(map(pod_of, members(2))),
        config=parse_spec({}),
        config_problem="",
        requests=(request_of(request),),
        capacity=ClusterView(
            waiting=(waiting,), in_flight=frozenset({waiting.key}), nodes_current=current
        ),
    )
    decision = decide(snap, NOW)
    withdrawn = [a.name for a in decision.actions if isinstance(a, DeleteRequest)]
    if current:
        assert withdrawn == [REQ1]
    else:
        assert decision.actions == () and decision.status is None
        assert decision.requeue_after == 1.0


# ---- the start watchdog of a released gang ----------------------------------------------

RELEASED_AT = "2026-11-30T09:54:00Z"  # 660 s before NOW: past the default 600 s start deadline
RELEASED = {
    "gangcheck.io/state": "Released",
    "gangcheck.io/request": REQ1,
    "gangcheck.io/released-at": RELEASED_AT,
}


def consuming(i: int, *, node_name: str = "") -> Obj:
    return member(i, gated=False, node_name=node_name, consumes=REQ1)


def _watchdog(
    annotations: dict[str, str],
    pods: list[Obj],
    request_annotations: dict[str, str],
    *,
    config: dict[str, Any] | None = None,
) -> GroupDecision:
    snap = GroupSnapshot(
        group=pod_group_of(group(2, annotations=annotations)),
        members=tuple(map(pod_of, pods)),
        config=None if config is None else parse_spec(config),
        config_problem="AtomicProvisioningConfig 'gone' not found",
        requests=(
            request_of(
                req(
                    conditions={"Provisioned": "ok"},
                    count=2,
                    annotations={"gangcheck.io/phase": "Fulfilled", **request_annotations},
                )
            ),
        ),
        capacity=ClusterView(nodes=(node("n1", gpu=8),), pods=tuple(pods)),
    )
    return decide(snap, NOW)


def test_a_released_gang_not_bound_within_the_start_deadline_is_rolled_back() -> None:
    decision = _watchdog(RELEASED, [consuming(0, node_name="n1"), consuming(1)], {}, config={})
    marks = [a.annotations for a in decision.actions if isinstance(a, AnnotateRequest)]
    assert [m["gangcheck.io/phase"] for m in marks] == ["RollingBack"]
    assert marks[0]["gangcheck.io/rollback-reason"].startswith(
        "StartDeadline: 1 of 2 members released together bound within 600s of their release"
    )


def test_a_released_gang_within_its_start_deadline_waits_and_looks_again_by_it() -> None:
    annotations = {**RELEASED, "gangcheck.io/released-at": "2026-11-30T10:04:00Z"}
    decision = _watchdog(annotations, [consuming(0), consuming(1)], {}, config={})
    assert not any(isinstance(a, AnnotateRequest) for a in decision.actions)
    assert decision.requeue_after is not None and decision.requeue_after <= 15.0


def test_the_start_deadline_is_the_one_the_attempt_recorded_when_the_config_is_gone() -> None:
    recorded = {"gangcheck.io/attempt-config": '{"fulfillment":{"startDeadlineSeconds":900}}'}
    decision = _watchdog(RELEASED, [consuming(0), consuming(1)], recorded, config=None)
    assert not any(isinstance(a, AnnotateRequest) for a in decision.actions)  # 660 s < 900 s


def test_a_start_rollback_done_gives_up_saying_the_members_are_no_longer_held() -> None:
    done = {
        "gangcheck.io/phase": "RollingBack",
        "gangcheck.io/rollback-reason": "StartDeadline: 1 of 2",
        "gangcheck.io/outcome": '{"draining": [], "kept": {}, "nodeSeconds": 60, "reclaimed": []}',
    }
    decision = _watchdog(RELEASED, [consuming(0, node_name="n1"), consuming(1)], done, config={})
    assert (decision.status or {})["gangcheck.io/state"] == "GaveUp"
    assert "gates are lifted" in (decision.status or {})["gangcheck.io/message"]


def test_a_config_gone_mid_attempt_leaves_the_attempt_in_flight_under_its_recorded_config() -> None:
    snap = GroupSnapshot(
        group=pod_group_of(group(2, annotations={"gangcheck.io/state": "Provisioning"})),
        members=tuple(map(pod_of, members(2))),
        config=None,
        config_problem="AtomicProvisioningConfig 'gone' not found",
        requests=(
            request_of(
                req(
                    conditions={"Provisioned": "ok"},
                    count=2,
                    deadline="2026-11-30T10:00:00Z",
                    created="2026-11-30T09:53:00Z",
                    annotations={
                        "gangcheck.io/attempt-config": '{"fulfillment":{"reclaimer":"DeleteNode"}}'
                    },
                )
            ),
        ),
        capacity=ClusterView(nodes=()),
    )
    decision = decide(snap, NOW)
    marks = [a.annotations for a in decision.actions if isinstance(a, AnnotateRequest)]
    assert [m["gangcheck.io/phase"] for m in marks] == ["RollingBack"]  # past its deadline
    assert "gangcheck.io/state" not in (decision.status or {})  # not Blocked


# ---- late members waiting for room: one message counting them all, one Event per change --

WAITING_GROUP = {"gangcheck.io/state": "Released", "gangcheck.io/request": REQ1}


def _late_waiting(annotations: dict[str, str]) -> GroupDecision:
    pods = [member(0, gated=False, node_name="n1"), member(1, gated=False, node_name="n1")]
    pods += [member(2, gpu=8), member(3, gpu=8)]  # room for neither
    snap = GroupSnapshot(
        group=pod_group_of(group(2, annotations=annotations)),
        members=tuple(map(pod_of, pods)),
        config=parse_spec({}),
        requests=(request_of(req(conditions={"Provisioned": "ok"}, count=2)),),
        capacity=ClusterView(nodes=(node("n1", gpu=4),), pods=tuple(pods)),
    )
    return decide(snap, NOW)


def test_late_members_waiting_are_all_counted_in_the_message() -> None:
    decision = _late_waiting(WAITING_GROUP)
    message = (decision.status or {})["gangcheck.io/message"]
    assert message.startswith("released; 2 member(s) created after the gang was read wait")
    assert "0 of 2 members placeable" in message
    assert [e.reason for e in decision.events] == ["LateMembersWaiting"]


def test_late_members_waiting_are_said_once_while_the_same_members_wait() -> None:
    said = (
        "released; 2 member(s) created after the gang was read wait for room on nodes that "
        "exist (no request is made for them): worded otherwise before"
    )
    decision = _late_waiting({**WAITING_GROUP, "gangcheck.io/message": said})
    assert decision.status  # the new wording is written
    assert decision.events == ()  # but no second Event for the same members waiting


def test_a_config_change_rollback_is_followed_by_the_next_attempt_at_once() -> None:
    """As a Workload's check: an attempt ended by a config change is no failure; the next
    attempt, under the new config, is made at once, whatever backoffLimitCount allows."""
    done = {
        "gangcheck.io/phase": "RollingBack",
        "gangcheck.io/rollback-reason": "ConfigChanged: the request parameters changed",
        "gangcheck.io/outcome": '{"draining": [], "kept": {}, "nodeSeconds": 0, "reclaimed": []}',
    }
    snap = GroupSnapshot(
        group=pod_group_of(group(2, annotations={"gangcheck.io/state": "Provisioning"})),
        members=tuple(map(pod_of, members(2))),
        config=parse_spec({"retryStrategy": {"backoffLimitCount": 0}}),
        requests=(request_of(req(count=2, annotations=done)),),
    )
    status = decide(snap, NOW).status or {}
    assert status["gangcheck.io/state"] == "BackingOff"
    assert status["gangcheck.io/attempt"] == "2"
    assert status["gangcheck.io/next-attempt-at"] == NOW_TEXT


def test_a_min_count_raised_above_the_attempts_members_replaces_the_attempt() -> None:
    """The attempt asked for 3; minCount is now 5 and 5 members exist: kube-scheduler would
    hold the group until 5 run, so the attempt is rolled back before it is provisioned and
    the next one asks for all 5."""
    decision = _decide(
        Case(
            "",
            group(5),
            members(5),
            requests=[req(annotations={"gangcheck.io/gang-members": "3"})],
        )
    )
    rolling = next(a for a in decision.actions if isinstance(a, AnnotateRequest))
    reason = rolling.annotations["gangcheck.io/rollback-reason"]
    assert reason.startswith("ConfigChanged: minCount raised to 5 above the 3 members")


def test_a_min_count_lowered_keeps_the_attempt() -> None:
    decision = _decide(
        Case(
            "",
            group(2),
            members(3),
            requests=[req(annotations={"gangcheck.io/gang-members": "3"})],
        )
    )
    rollbacks = [
        a
        for a in decision.actions
        if isinstance(a, AnnotateRequest) and "gangcheck.io/rollback-reason" in a.annotations
    ]
    assert rollbacks == []
    assert decision.status is not None
    assert decision.status["gangcheck.io/state"] == "Provisioning"


@pytest.mark.parametrize("raw", ["²", "1" * 5000, "0", "x"])
def test_an_attempt_written_by_hand_on_the_group_is_read_as_the_first(raw: str) -> None:
    """A PodGroup's owner may write any `gangcheck.io/*` annotation on it. An attempt no
    int() reads ('²' is a digit to str.isdigit; 5000 digits are past int()'s limit) is read
    as attempt 1, as 'x' and '0' are (records.count_of), instead of failing every reconcile
    of the group with no word on it."""
    notes = {"gangcheck.io/state": "Provisioning", "gangcheck.io/attempt": raw}
    decision = _decide(Case("hand-written", group(3, annotations=notes), members(3)))
    created = [a for a in decision.actions if isinstance(a, CreateRequest)]
    assert [c.body["metadata"]["name"] for c in created] == [REQ1]


def test_a_recorded_config_past_int32_is_no_record_not_an_error() -> None:
    """The attempt's recorded config (gangcheck.io/attempt-config) as a hand could write it,
    with a deadline of 10**14 s: it does not validate, so the attempt is followed under the
    config now, as one without a record (before: OverflowError on every decision)."""
    sources = {
        "capacitySources": [{"nodeSelector": {"pool": "a"}}, {"nodeSelector": {"pool": "b"}}]
    }
    forged = {
        "gangcheck.io/attempt-config": '{"fulfillment": {"deadlineSeconds": 100000000000000}}'
    }
    case = Case(
        "forged record",
        group(3, annotations={"gangcheck.io/state": "Provisioning"}),
        members(3),
        config=sources,
        requests=[req(conditions={"Provisioned": "ok"}, annotations=forged)],
    )
    decision = _decide(case)
    assert "0 of 3 members placeable" in (decision.status or {}).get("gangcheck.io/message", "")


def _in_deletion(raw: Any, since: str, *finalizers: str) -> Any:
    raw["metadata"]["deletionTimestamp"] = since
    raw["metadata"]["finalizers"] = list(finalizers)
    return raw


STUCK_LINE = (
    f"waiting for ProvisioningRequest {REQ1} to be deleted: finalizers [example.com/keep] "
    "remain since 2026-11-30T10:00:00Z"
)


@pytest.mark.parametrize(
    ("since", "said", "message", "events", "poll"),
    [
        # 10 s in deletion: within the grace, nothing said, looked at every second
        ("2026-11-30T10:04:50Z", "", None, (), 1.0),
        # 5 min: said on the group (its state kept), a Warning once; looked at every 30 s
        ("2026-11-30T10:00:00Z", "", STUCK_LINE, ("RequestStuckDeleting",), 30.0),
        # said already: nothing written, no Event again
        ("2026-11-30T10:00:00Z", STUCK_LINE, None, (), 30.0),
    ],
)
def test_a_request_held_in_deletion_by_a_finalizer_is_said_on_the_group(
    since: str, said: str, message: str | None, events: tuple[str, ...], poll: float
) -> None:
    """The group's next ask is made under the name of a request held in deletion by a
    finalizer no one removes: the group waits, and past the grace its message says why
    (before, it was looked at every second for ever with nothing said)."""
    notes = {"gangcheck.io/state": "Provisioning", "gangcheck.io/request": REQ1}
    if said:
        notes["gangcheck.io/message"] = said
    case = Case(
        "stuck",
        group(3, annotations=notes),
        members(3),
        requests=[_in_deletion(req(), since, "example.com/keep")],
    )
    decision = _decide(case)
    written = dict(decision.status or {})
    assert written == ({} if message is None else {"gangcheck.io/message": message})
    assert [(e.reason, e.warning) for e in decision.events] == [(r, True) for r in events]
    assert decision.actions == ()  # nothing asked or deleted; the finalizer is not ours
    assert decision.requeue_after == poll
