"""Table tests of a released PodGroup whose minCount is raised (and lowered): the members
added are provisioned all or nothing, the running ones never touched."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.app import SOURCES
from gangcheck.kube.resources import NODE, PROVISIONING_REQUEST, UPSTREAM_POD_GROUP_V1BETA1
from gangcheck.logic.attempt import naming, reclaim
from gangcheck.logic.attempt.actions import (
    AnnotateRequest,
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
    ReclaimArrivals,
    ReleaseHold,
    ReleaseMembers,
)
from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.attempt.hold import hold_taint
from gangcheck.logic.podgroups import growth
from gangcheck.logic.podgroups.gating import OPT_IN_VALUE
from gangcheck.logic.podgroups.podgroup import GroupDecision, GroupSnapshot
from gangcheck.model.names import (
    ATTEMPT_CONFIG_ANNOTATION,
    CONSUME_ANNOTATION,
    GATE,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    OPT_IN_LABEL,
)
from gangcheck.model.objects import pod_of, request_of
from gangcheck.model.podgroups import pod_group_of
from gangcheck.model.provisioning_config import CHECK_CAPACITY, parse_spec, spec_record
from gangcheck.reconcile.apply import Applier, StaleDecisionError
from gangcheck.reconcile.events import EventRecorder
from gangcheck.reconcile.podgroup import PodGroupReconciler
from tests.builders import container, node, provisioning_request
from tests.fakes.kube import FakeKube

NOW = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
Obj = dict[str, Any]
FIRST = "g-pg-1"
GROW1, GROW2 = "g-pg-grow-1", "g-pg-grow-2"
RELEASED = {
    "gangcheck.io/state": "Released",
    "gangcheck.io/message": "released",
    "gangcheck.io/request": FIRST,
    "gangcheck.io/gang-members": "4",
    "gangcheck.io/released-at": "2026-11-30T10:01:00Z",
    # released by a version that marks the members it releases (gangcheck.io/released-by)
    "gangcheck.io/releases-marked-since": "2026-11-30T10:01:00Z",
}
ROLLED = {
    "gangcheck.io/phase": "RollingBack",
    "gangcheck.io/rollback-reason": "Deadline: 1 of 2 members placeable",
    "gangcheck.io/fulfillment-deadline": "2026-11-30T10:02:00Z",
    "gangcheck.io/outcome": '{"draining": [], "kept": {}, "nodeSeconds": 60, "reclaimed": []}',
}


def group(min_count: int) -> Obj:
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": "g",
            "namespace": "default",
            "uid": "uid-g",
            "annotations": dict(RELEASED),
        },
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
    }


def pod(name: str, *, gated: bool, node_name: str = "", consumes: str = "") -> Obj:
    spec: Obj = {"containers": [container(gpu=1)], "schedulingGroup": {"podGroupName": "g"}}
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    if node_name:
        spec["nodeName"] = node_name
    created = "2026-11-30T10:00:30Z" if not gated else "2026-11-30T10:03:00Z"
    meta: Obj = {"name": name, "namespace": "default", "creationTimestamp": created}
    if consumes:
        meta["annotations"] = {CONSUME_ANNOTATION: consumes}
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running" if node_name else ""}}


def running(n: int = 4) -> list[Obj]:
    return [pod(f"run{i}", gated=False, node_name="old", consumes=FIRST) for i in range(n)]


def added(n: int = 2, **kw: Any) -> list[Obj]:
    return [pod(f"new{i}", gated=True, **kw) for i in range(n)]


def grow_req(name: str = GROW1, count: int = 2, **kw: Any) -> Any:
    annotations = {
        "gangcheck.io/pod-group": "pg/g",
        "gangcheck.io/pod-group-uid": "uid-g",
        "gangcheck.io/fulfillment-deadline": "2026-11-30T10:20:00Z",
        "gangcheck.io/gang-members": str(count),
        growth.GROWS_ANNOTATION: "4",
        **kw.pop("annotations", {}),
    }
    return provisioning_request(
        name,
        templates=[(naming.template_name(name, "ps-0"), count)],
        annotations=annotations,
        **kw,
    )


def arrived_for_grow1(*, gpu: int = 2, held: bool = True, **kw: Any) -> Obj:
    """Node n2, recorded as arrived for growth g-pg-grow-1, held for it unless `held` is off."""
    taints = [hold_taint(f"default/{GROW1}")] if held else None
    annotations = {"gangcheck.io/arrived-for": f"default/{GROW1}"}
    return node("n2", gpu=gpu, annotations=annotations, taints=taints, **kw)


OLD_NODE = node("old", gpu=4)  # the 4 running members fill it


@dataclass
class Case:
    id: str
    min_count: int
    members: list[Obj]
    requests: list[Any] = field(default_factory=list)
    nodes: list[Obj] = field(default_factory=lambda: [OLD_NODE])
    now: datetime = NOW
    # expectations
    message: str = ""
    asked: tuple[str, int] | None = None
    released: tuple[str, ...] = ()
    consume: str = ""
    deletes: tuple[str, ...] = ()
    started: bool = False
    events: tuple[str, ...] = ()
    grows: str = "4"  # how many ran when the growth asked was made
    step: str = ""  # in the attempt's step (what a rollback records as its reason)
    # why the group has no config now (deleted, invalid, not serving its namespace): its
    # requests then carry the config they were made under
    unserved: str = ""


CASES = [
    Case(
        "minCount raised 4 -> 6 on a running group, no room: one request for the 2 added",
        6,
        [*running(), *added()],
        message="minCount raised to 6: 2 member(s) added to 4 running",
        asked=(GROW1, 2),
    ),
    Case(
        "raised, and the 2 added fit on nodes that exist: released together, nothing asked",
        6,
        [*running(), *added()],
        nodes=[OLD_NODE, node("free", gpu=2)],
        message="they fit on nodes that exist, released together",
        released=("new0", "new1"),
        events=("GangGrown",),
    ),
    Case(
        "the growth provisioned, a node for 1 of the 2 arrived: no member released alone",
        6,
        [*running(), *added()],
        requests=[grow_req(conditions={"Provisioned": ""})],
        nodes=[OLD_NODE, node("n2", gpu=1, created="2026-11-30T10:04:00Z")],
        message="1 of 2 members placeable",
    ),
    Case(
        "the growth fits whole: its members released together, consuming its request",
        6,
        [*running(), *added()],
        requests=[grow_req(conditions={"Provisioned": ""})],
        nodes=[OLD_NODE, node("n2", gpu=2, created="2026-11-30T10:04:00Z")],
        message="they fit whole, released together",
        released=("new0", "new1"),
        consume=GROW1,
        events=("GangGrown",),
    ),
    Case(
        "the growth rolled back, in its backoff: the running members untouched, said",
        6,
        [*running(), *added()],
        requests=[grow_req(conditions={"Provisioned": ""}, annotations=ROLLED)],
        now=datetime(2026, 11, 30, 10, 2, 30, tzinfo=UTC),
        message="growth attempt 1 was rolled back",
        events=("GrowthRolledBack",),
    ),
    Case(
        "the growth rolled back, its backoff over: the next asks for the 2 again",
        6,
        [*running(), *added()],
        requests=[grow_req(conditions={"Provisioned": ""}, annotations=ROLLED)],
        asked=(GROW2, 2),
        deletes=(GROW1,),
    ),
    Case(
        # seen end to end: one of the 2 members released was not back in the cache yet
        "minCount at the gang released, a member missing from the cache: no growth, no warning",
        4,
        running(3),
        message="released",
    ),
    Case(
        "minCount above the members that exist: said, nothing asked",
        8,
        [*running(), *added()],
        message="minCount 8 is above the members that exist",
        events=("MinCountAboveMembers",),
    ),
    Case(
        "minCount lowered back while the growth is asked for: withdrawn, nothing running moved",
        4,
        [*running(), *added()],
        requests=[grow_req()],
        deletes=(GROW1,),
        message="minCount lowered to 4",
        events=("GrowthWithdrawn",),
    ),
    Case(
        "minCount lowered below the running members: nothing withdrawn, nothing asked",
        2,
        running(),
    ),
    Case(
        "the growth's members all bound: its request started, its hold lifted",
        6,
        [
            *running(),
            *(pod(f"new{i}", gated=False, node_name="n2", consumes=GROW1) for i in (0, 1)),
        ],
        requests=[grow_req(annotations={"gangcheck.io/phase": "Fulfilled"})],
        nodes=[
            OLD_NODE,
            arrived_for_grow1(created="2026-11-30T10:04:00Z"),
        ],
        started=True,
    ),
]


def grown(n: int = 2) -> list[Obj]:
    """The members a first growth delivered, bound and running."""
    return [pod(f"new{i}", gated=False, node_name="n2", consumes=GROW1) for i in range(n)]


def later(n: int = 2) -> list[Obj]:
    return [pod(f"later{i}", gated=True) for i in range(n)]


REPLACED = {
    **ROLLED,
    "gangcheck.io/rollback-reason": (
        "ConfigChanged: minCount 8 needs 4 members added to the 4 running, more than the 2 "
        "the growth asks for"
    ),
}

CASES += [
    Case(
        "raised again (6 -> 8) while the growth of 2 is asked for: replaced before Provisioned",
        8,
        [*running(), *added(4)],
        requests=[grow_req()],
        events=("RollbackStarted", "ProvisioningRequestReplaced"),
    ),
    Case(
        "the growth replaced by the raise rolled back: the next asks for all 4 at once",
        8,
        [*running(), *added(4)],
        requests=[grow_req(annotations=REPLACED)],
        message="the next asks now",
        asked=(GROW2, 4),
        deletes=(GROW1,),
    ),
    Case(
        "raised again once the growth of 2 is Provisioned: kept, its 2 released together "
        "when they fit, the 2 beyond it not released alone (room for them or not)",
        8,
        [*running(), *added(4)],
        requests=[grow_req(conditions={"Provisioned": ""})],
        nodes=[OLD_NODE, node("n2", gpu=2, created="2026-11-30T10:04:00Z"), node("free", gpu=2)],
        message="the other 2 once it has started",
        released=("new0", "new1"),
        consume=GROW1,
        events=("GangGrown",),
    ),
    Case(
        "raised again once the growth Provisioned, not yet fitting: the 2 beyond it wait, "
        "not released alone onto free room",
        8,
        [*running(), *added(4)],
        requests=[grow_req(conditions={"Provisioned": ""})],
        nodes=[OLD_NODE, node("free", gpu=1)],
        message="the other 2 once it has started",
    ),
    Case(
        "raised again (6 -> 8) after the first growth started: the next growth asks for the 2",
        8,
        [*running(), *grown(), *later()],
        requests=[grow_req(annotations={"gangcheck.io/phase": "Started"})],
        nodes=[OLD_NODE, node("n2", gpu=2, created="2026-11-30T10:04:00Z")],
        message="2 member(s) added to 6 running",
        asked=(GROW2, 2),
        grows="6",
    ),
    Case(
        "raised again while the first growth's members still bind: nothing asked yet",
        8,
        [
            *running(),
            *(pod(f"new{i}", gated=False, consumes=GROW1) for i in (0, 1)),
            *later(),
        ],
        requests=[grow_req(annotations={"gangcheck.io/phase": "Fulfilled"})],
        nodes=[OLD_NODE, node("n2", gpu=2, created="2026-11-30T10:04:00Z")],
        message="needs 2 more member(s): asked for once the members of growth g-pg-grow-1",
    ),
    Case(
        "a second growth rolled back, its backoff over: the third asks, the delivered first kept",
        8,
        [*running(), *grown(), *later()],
        requests=[
            grow_req(annotations={"gangcheck.io/phase": "Started"}),
            grow_req(GROW2, annotations=ROLLED),
        ],
        nodes=[OLD_NODE, node("n2", gpu=2, created="2026-11-30T10:04:00Z")],
        asked=("g-pg-grow-3", 2),
        deletes=(GROW2,),
        grows="6",
    ),
    Case(
        "a member of the growth in flight deleted: said, the growth not replaced, none released",
        6,
        [*running(), *added(1)],
        requests=[grow_req(conditions={"Provisioned": ""})],
        nodes=[OLD_NODE, node("n2", gpu=2, created="2026-11-30T10:04:00Z")],
        message="minCount 6 is above the members that exist",
        events=("MinCountAboveMembers",),
    ),
    Case(
        "a running member gone while the growth of 2 is asked for (3 now needed, 3 gated): "
        "replaced, said without claiming minCount was raised",
        6,
        [*running(3), *added(3)],
        requests=[grow_req()],
        events=("RollbackStarted", "ProvisioningRequestReplaced"),
        step="minCount 6 needs 3 members added to the 3 running, more than the 2 the growth",
    ),
    Case(
        "minCount raised to int32's max: said (GangTooLarge), nothing asked, nothing moved",
        2**31 - 1,
        [*running(), *added()],
        message="more than the 5000 one ProvisioningRequest may carry",
        events=("GangTooLarge",),
    ),
    Case(
        "no longer a gang (minCount 0) while a growth is asked for: withdrawn",
        0,
        [*running(), *added()],
        requests=[grow_req()],
        deletes=(GROW1,),
        events=("GrowthWithdrawn",),
    ),
]


def stripped(name: str) -> Obj:
    """A member added with the group's growth, gated by the webhook, its gate removed by
    hand since (or never added), waiting unbound."""
    obj = pod(name, gated=True)
    del obj["spec"]["schedulingGates"]
    obj["metadata"]["annotations"] = {"gangcheck.io/gated-at": "2026-11-30T10:03:00Z"}
    return obj


def released_binding(name: str, by: str = "GangGrown") -> Obj:
    """A member added with the group's growth whose gate gangcheck lifted onto room that
    exists (the release's mark on it), consuming no request, still binding."""
    obj = stripped(name)
    obj["metadata"]["annotations"]["gangcheck.io/released-by"] = by
    return obj


CASES += [
    Case(
        "raised 4 -> 6 after a growth of 1 was released onto room that exists and still binds: "
        "the next growth asks for the 1 gated member only",
        6,
        [*running(), released_binding("new0"), *later(1)],
        message="minCount raised to 6: 1 member(s) added to 5 running",
        asked=(GROW1, 1),
        grows="5",
    ),
    Case(
        "raised 4 -> 6 while a late member released onto room that exists still binds: the "
        "growth asks for the 1 gated member only",
        6,
        [*running(), released_binding("late0", by="LateMembersReleased"), *later(1)],
        message="minCount raised to 6: 1 member(s) added to 5 running",
        asked=(GROW1, 1),
        grows="5",
    ),
    Case(
        "raised 4 -> 6 after a growth of 1 was released onto room that exists and still binds, "
        "the 1 gated fits: released alone, the one binding left as it is",
        6,
        [*running(), released_binding("new0"), *later(1)],
        nodes=[OLD_NODE, node("free", gpu=2)],
        message="1 member(s) added to 5 running: they fit on nodes that exist",
        released=("later0",),
        events=("GangGrown",),
    ),
    Case(
        "raised 4 -> 6, one of the 2 added ungated by hand: counted in the growth, one request "
        "for both",
        6,
        [*running(), *added(1), stripped("new1")],
        message="minCount raised to 6: 2 member(s) added to 4 running",
        asked=(GROW1, 2),
    ),
    Case(
        "one of the 2 added ungated by hand, the growth fits whole: both released onto it, "
        "the one ungated given the request too",
        6,
        [*running(), *added(1), stripped("new1")],
        requests=[grow_req(conditions={"Provisioned": ""})],
        nodes=[OLD_NODE, node("n2", gpu=2, created="2026-11-30T10:04:00Z")],
        message="they fit whole, released together",
        released=("new0", "new1"),
        consume=GROW1,
        events=("GangGrown",),
    ),
    Case(
        "one of the 2 added ungated by hand, both fit on nodes that exist: the gated one "
        "released, the other needs nothing given (no request, no hold)",
        6,
        [*running(), *added(1), stripped("new1")],
        nodes=[OLD_NODE, node("free", gpu=2)],
        message="2 member(s) added to 4 running: they fit on nodes that exist",
        released=("new0",),
        events=("GangGrown",),
    ),
    Case(
        "a member ungated by hand and no gated one added: no growth, it schedules as it may",
        5,
        [*running(), stripped("new1")],
    ),
]


def annotations_of(obj: Obj) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


NOT_SERVED = (
    "AtomicProvisioningConfig 'team-a' does not serve namespace 'default' "
    "(spec.podGroups.namespaceSelector)"
)

CASES += [
    Case(
        "config no longer serving the namespace, raised after a growth started: no growth "
        "asked under the one recorded, said (ConfigProblem), the 2 kept gated",
        8,
        [*running(), *grown(), *later()],
        requests=[grow_req(annotations={"gangcheck.io/phase": "Started"})],
        nodes=[OLD_NODE, node("n2", gpu=2, created="2026-11-30T10:04:00Z")],
        message=f"no growth is asked: {NOT_SERVED}",
        events=("ConfigProblem",),
        unserved=NOT_SERVED,
    ),
    Case(
        "config no longer serving, the growth replaced by a raise rolled back: the next not "
        "asked under the one recorded",
        8,
        [*running(), *added(4)],
        requests=[grow_req(annotations=REPLACED)],
        message=f"no growth is asked: {NOT_SERVED}",
        events=("ConfigProblem",),
        unserved=NOT_SERVED,
    ),
    Case(
        "config no longer serving, a growth rolled back, its backoff over: none asked again",
        6,
        [*running(), *added()],
        requests=[grow_req(annotations=ROLLED)],
        now=datetime(2026, 11, 30, 11, 0, tzinfo=UTC),
        message=f"no growth is asked: {NOT_SERVED}",
        events=("ConfigProblem",),
        unserved=NOT_SERVED,
    ),
    Case(
        "config no longer serving, raised again while the growth is asked for: the growth in "
        "flight is still replaced under the config it recorded (what arrived reclaimed)",
        8,
        [*running(), *added(4)],
        requests=[grow_req()],
        events=("RollbackStarted", "ProvisioningRequestReplaced"),
        unserved=NOT_SERVED,
    ),
    Case(
        "config no longer serving, the growth Provisioned and fitting: released onto it",
        6,
        [*running(), *added()],
        requests=[grow_req(conditions={"Provisioned": ""})],
        nodes=[OLD_NODE, node("n2", gpu=2, created="2026-11-30T10:04:00Z")],
        released=("new0", "new1"),
        consume=GROW1,
        events=("GangGrown",),
        unserved=NOT_SERVED,
    ),
    Case(
        "config no longer serving, lowered back: the growth withdrawn under its recorded config",
        4,
        [*running(), *added()],
        requests=[grow_req()],
        deletes=(GROW1,),
        events=("GrowthWithdrawn",),
        unserved=NOT_SERVED,
    ),
]


def run(case: Case) -> GroupDecision:
    obj = group(case.min_count)
    config = parse_spec({"fulfillment": {"reclaimer": "DeleteNode"}})
    requests = case.requests
    if case.unserved:
        record = {ATTEMPT_CONFIG_ANNOTATION: spec_record(config)}
        requests = [
            {**r, "metadata": {**r["metadata"], "annotations": {**record, **annotations_of(r)}}}
            for r in requests
        ]
    snap = GroupSnapshot(
        group=pod_group_of(obj),
        members=tuple(map(pod_of, case.members)),
        config=None if case.unserved else config,
        config_problem=case.unserved,
        requests=tuple(request_of(r) for r in requests),
        templates=frozenset(
            p["podTemplateRef"]["name"] for r in requests for p in r["spec"]["podSets"]
        ),
        capacity=ClusterView(nodes=tuple(case.nodes), pods=tuple(case.members)),
        opted_in=True,
    )
    return growth.decide(snap, case.now)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_growth(case: Case) -> None:
    d = run(case)
    status = {**RELEASED, **(d.status or {})}
    assert status["gangcheck.io/state"] == "Released"
    assert case.message in status["gangcheck.io/message"], status["gangcheck.io/message"]
    created = [a.body for a in d.actions if isinstance(a, CreateRequest)]
    if case.asked is None:
        assert not created
    else:
        (body,) = created
        assert body["metadata"]["name"] == case.asked[0]
        assert sum(p["count"] for p in body["spec"]["podSets"]) == case.asked[1]
        assert body["metadata"]["annotations"][growth.GROWS_ANNOTATION] == case.grows
    releases = [a for a in d.actions if isinstance(a, ReleaseMembers)]
    assert tuple(n for a in releases for n in a.pods) == case.released
    for release in releases:
        assert release.annotations.get(CONSUME_ANNOTATION, "") == case.consume
        # marked released by gangcheck: not taken for ungated by hand while it binds
        assert release.annotations["gangcheck.io/released-by"] == "GangGrown"
    # the running members are never in any action
    assert not [n for a in releases for n in a.pods if n.startswith("run")]
    assert tuple(a.name for a in d.actions if isinstance(a, DeleteRequest)) == case.deletes
    starts = [
        a
        for a in d.actions
        if isinstance(a, AnnotateRequest) and a.annotations.get("gangcheck.io/phase") == "Started"
    ]
    assert bool(starts) == case.started
    if case.started:
        assert [n for a in d.actions if isinstance(a, ReleaseHold) for n in a.nodes] == ["n2"]
    assert {e.reason for e in d.events} >= set(case.events), d.events
    if case.step:
        assert d.step is not None and case.step in d.step.message, d.step
    if "MinCountAboveMembers" not in case.events:
        assert "MinCountAboveMembers" not in {e.reason for e in d.events}, d.events


def test_a_diagnosis_replays_a_running_groups_growth() -> None:
    from gangcheck.logic.podgroups.group_diagnosis import replay_group

    case = CASES[0]
    obj = group(case.min_count)
    snap = GroupSnapshot(
        group=pod_group_of(obj),
        members=tuple(map(pod_of, case.members)),
        config=parse_spec({"fulfillment": {"reclaimer": "DeleteNode"}}),
        capacity=ClusterView(nodes=tuple(case.nodes), pods=tuple(case.members)),
    )
    assert "minCount raised to 6: 2 member(s) added to 4 running" in replay_group(snap, NOW).message


#: Two capacity sources: a, then b (its own provisioning class).
TWO_SOURCES: Obj = {
    "capacitySources": [
        {"name": "a", "nodeSelector": {"pool": "a"}},
        {
            "name": "b",
            "nodeSelector": {"pool": "b"},
            "provisioningClassName": "queued-provisioning.gke.io",
        },
    ],
    "fulfillment": {"reclaimer": "DeleteNode"},
}


def grown_by_two(
    obj: Obj, spec: Obj, requests: tuple[Obj, ...] = (), nodes: tuple[Obj, ...] = ()
) -> GroupDecision:
    """The growth decision of the group ``obj`` (released, minCount raised to 6): its four
    running members on ``OLD_NODE`` (and ``nodes``) and the two added ones."""
    pods = [*running(), *added()]
    snap = GroupSnapshot(
        group=pod_group_of(obj),
        members=tuple(map(pod_of, pods)),
        requests=tuple(map(request_of, requests)),
        config=parse_spec(spec),
        capacity=ClusterView(nodes=(OLD_NODE, *nodes), pods=tuple(pods)),
        opted_in=True,
    )
    return growth.decide(snap, NOW)


def test_a_group_released_onto_a_later_source_grows_from_that_source() -> None:
    """A group released onto its second capacity source (InOrder fell back, or it won a
    Race) asks for its growth there, pinned to that source's nodes, not the first source's."""
    obj = group(6)
    obj["metadata"]["annotations"]["gangcheck.io/topology-domain"] = "pool=b"
    d = grown_by_two(obj, {**TWO_SOURCES, "capacitySourcePolicy": "Race"})
    (body,) = [a.body for a in d.actions if isinstance(a, CreateRequest)]
    assert body["metadata"]["name"] == GROW1
    assert body["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
    templates = [a.body for a in d.actions if isinstance(a, CreateTemplate)]
    assert {t["template"]["spec"]["nodeSelector"]["pool"] for t in templates} == {"b"}


def _topped_up_request(
    name: str, source: int, phase: str, record: dict[str, str] | None = None
) -> Any:
    """A request of the attempt the group was released on: `source` asked, in `phase`
    (`record`: more of its record, the config it was made under)."""
    annotations = {
        **(record or {}),
        "gangcheck.io/pod-group": "pg/g",
        "gangcheck.io/pod-group-uid": "uid-g",
        "gangcheck.io/gang-members": "4",
        "gangcheck.io/phase": phase,
        **({"gangcheck.io/capacity-source": str(source)} if source else {}),
    }
    return provisioning_request(
        name,
        templates=[(naming.template_name(name, "ps-0"), 2)],
        annotations=annotations,
        conditions={"Provisioned": "True"},
    )


@pytest.mark.parametrize(
    ("latest_source", "asked_pool"), [(1, "b"), (0, "a")], ids=["topped-up-from-b", "from-a"]
)
def test_a_group_topped_up_grows_from_the_source_that_delivered_last(
    latest_source: int, asked_pool: str
) -> None:
    """An InOrder top-up releases the group across the kept source (a, stopped short) and
    the next (b): its pins name neither. Its growth asks the source of the group's latest
    request (b), not the first one (a); before, it asked a, the source that had stopped short.
    With the latest request of a, a is asked."""
    latest = "g-pg-1-b" if latest_source else FIRST
    obj = group(6)
    obj["metadata"]["annotations"]["gangcheck.io/request"] = latest
    requests = [_topped_up_request(FIRST, 0, "Kept" if latest_source else "Started")]
    if latest_source:
        requests.append(_topped_up_request(latest, 1, "Started"))
    d = grown_by_two(obj, TWO_SOURCES, tuple(requests))
    (body,) = [a.body for a in d.actions if isinstance(a, CreateRequest)]
    assert body["metadata"]["name"] == GROW1
    classes = {
        "a": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
        "b": "queued-provisioning.gke.io",
    }
    assert body["spec"]["provisioningClassName"] == classes[asked_pool]
    templates = [a.body for a in d.actions if isinstance(a, CreateTemplate)]
    assert {t["template"]["spec"]["nodeSelector"]["pool"] for t in templates} == {asked_pool}


def test_a_group_topped_up_grows_from_the_source_it_asked_after_another_left() -> None:
    """Topped up from a (kept) by b under [a, b, c]; then a is removed ([b, c]): the growth
    asks b, the source the group's latest request asked (now at index 0), pinned to pool b.
    Before, it asked the source now at that request's recorded index 1: c, pool c."""
    made = [*TWO_SOURCES["capacitySources"], {"name": "c", "nodeSelector": {"pool": "c"}}]
    record = {
        "gangcheck.io/attempt-config": spec_record(
            parse_spec({**TWO_SOURCES, "capacitySources": made})
        )
    }
    obj = group(6)
    obj["metadata"]["annotations"]["gangcheck.io/request"] = "g-pg-1-b"
    requests = [
        _topped_up_request(FIRST, 0, "Kept", record),
        _topped_up_request("g-pg-1-b", 1, "Started", record),
    ]
    d = grown_by_two(obj, {**TWO_SOURCES, "capacitySources": made[1:]}, tuple(requests))
    (body,) = [a.body for a in d.actions if isinstance(a, CreateRequest)]
    assert body["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
    templates = [a.body for a in d.actions if isinstance(a, CreateTemplate)]
    assert {t["template"]["spec"]["nodeSelector"]["pool"] for t in templates} == {"b"}


#: Three capacity sources: a, b (its own class), c; and [a, c]: b removed.
ABC = [*TWO_SOURCES["capacitySources"], {"name": "c", "nodeSelector": {"pool": "c"}}]
A_C = [ABC[0], ABC[2]]
CLASS_A = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"


@dataclass
class Left:
    id: str
    now: list[Obj]  # the config's sources now
    pins: str = ""  # the group's gangcheck.io/topology-domain
    recorded: bool = True  # the latest request records the config it was made under ([a, b, c])
    policy: str = "InOrder"
    nodes: tuple[Obj, ...] = ()
    # expectations: the growth asks (class, pool), or releases at once with these pins
    asked: tuple[str, str] | None = None
    released_pins: dict[str, str] | None = None


LEFT = [
    Left("topped-up-from-b-b-removed-asks-a", A_C, asked=(CLASS_A, "a")),
    Left("released-onto-b-b-removed-asks-a", A_C, pins="pool=b", asked=(CLASS_A, "a")),
    Left(
        "raced-onto-b-b-removed-asks-a",
        A_C,
        pins="pool=b",
        policy="Race",
        asked=(CLASS_A, "a"),
    ),
    Left(
        "b-removed-its-pin-dropped-released-where-they-fit",
        A_C,
        pins="pool=b,zone=z1",
        nodes=(node("a1", gpu=2, labels={"pool": "a", "zone": "z1"}),),
        released_pins={"zone": "z1"},
    ),
    Left("b-still-there-asks-b", ABC, asked=("queued-provisioning.gke.io", "b")),
    Left("no-recorded-config-by-index-as-before", A_C, recorded=False, asked=(CLASS_A, "c")),
]


@pytest.mark.parametrize("case", LEFT, ids=[c.id for c in LEFT])
def test_a_group_whose_source_left_grows_as_a_new_attempt_asks(case: Left) -> None:
    """Released from b (its latest request asked b, index 1 of [a, b, c]); then b is removed
    ([a, c]). The growth is a new ask for members the group has no capacity for: it asks
    where a new attempt of the config now asks first, a, and b's node labels are no longer
    pinned. Before, it asked the source now at b's recorded index: c, by accident of
    position (and pinned to pool b, so nodes of a never fit). A record without a config is
    read by its index, as before; a source still there is asked."""
    made = parse_spec({**TWO_SOURCES, "capacitySources": ABC})
    record = {"gangcheck.io/attempt-config": spec_record(made)} if case.recorded else {}
    obj = group(6)
    annotations = obj["metadata"]["annotations"]
    annotations["gangcheck.io/request"] = "g-pg-1-b"
    if case.pins:
        annotations["gangcheck.io/topology-domain"] = case.pins
    requests = [
        _topped_up_request(FIRST, 0, "Kept", record),
        _topped_up_request("g-pg-1-b", 1, "Started", record),
    ]
    spec = {**TWO_SOURCES, "capacitySources": case.now, "capacitySourcePolicy": case.policy}
    d = grown_by_two(obj, spec, tuple(requests), case.nodes)
    created = [a.body for a in d.actions if isinstance(a, CreateRequest)]
    releases = [a for a in d.actions if isinstance(a, ReleaseMembers)]
    if case.asked is None:
        assert not created
        (release,) = releases
        assert release.pods == ("new0", "new1")
        assert dict(release.node_selector) == case.released_pins
        return
    assert not releases
    (body,) = created
    assert body["metadata"]["name"] == GROW1
    assert body["spec"]["provisioningClassName"] == case.asked[0]
    templates = [a.body for a in d.actions if isinstance(a, CreateTemplate)]
    assert {t["template"]["spec"]["nodeSelector"]["pool"] for t in templates} == {case.asked[1]}


def test_a_growth_in_flight_after_its_groups_source_left_fits_where_it_asked() -> None:
    """Released onto b (pinned to pool b) of [a, b, c]; b removed, the growth asked a: its
    nodes (pool a) arrived with room for both added members, released together consuming it,
    pool b no longer pinned. Before, the fit stayed pinned to pool b: the nodes of a never
    counted, and the growth was rolled back at its deadline."""
    made = parse_spec({**TWO_SOURCES, "capacitySources": ABC})
    record = {"gangcheck.io/attempt-config": spec_record(made)}
    obj = group(6)
    obj["metadata"]["annotations"]["gangcheck.io/request"] = "g-pg-1-b"
    obj["metadata"]["annotations"]["gangcheck.io/topology-domain"] = "pool=b"
    requests = (
        _topped_up_request("g-pg-1-b", 1, "Started", record),
        grow_req(conditions={"Provisioned": "True"}),
    )
    arrived = node("n2", gpu=2, created="2026-11-30T10:04:00Z", labels={"pool": "a"})
    d = grown_by_two(obj, {**TWO_SOURCES, "capacitySources": A_C}, requests, (arrived,))
    (release,) = [a for a in d.actions if isinstance(a, ReleaseMembers)]
    assert release.pods == ("new0", "new1")
    assert release.annotations[CONSUME_ANNOTATION] == GROW1
    assert "pool" not in release.node_selector


#: TWO_SOURCES with a deadline of b's own.
B_DEADLINE: Obj = {
    **TWO_SOURCES,
    "capacitySources": [
        TWO_SOURCES["capacitySources"][0],
        {**TWO_SOURCES["capacitySources"][1], "deadlineSeconds": 1200},
    ],
}


def test_a_growth_records_the_source_it_asks_and_is_followed_by_its_deadline() -> None:
    """Released onto b (its own deadlineSeconds 1200): the growth request records b
    (capacity-source 1) and b's deadline, as an attempt of b does. Before, it recorded no
    source (read as a: its deadline, and a change of a read as a change under the growth)."""
    obj = group(6)
    obj["metadata"]["annotations"]["gangcheck.io/topology-domain"] = "pool=b"
    d = grown_by_two(obj, B_DEADLINE)
    (body,) = [a.body for a in d.actions if isinstance(a, CreateRequest)]
    annotations = body["metadata"]["annotations"]
    assert annotations["gangcheck.io/capacity-source"] == "1"
    assert annotations["gangcheck.io/fulfillment-deadline"] == "2026-11-30T10:25:00Z"


def test_a_growth_in_flight_keeps_the_deadline_of_the_source_it_asked() -> None:
    """A growth asked of b (deadlineSeconds 1200), made at 10:00, deadline 10:20: followed,
    its deadline stays. Before, the config's default 420 s was applied to it, the deadline
    moved to 10:07."""
    obj = group(6)
    obj["metadata"]["annotations"]["gangcheck.io/topology-domain"] = "pool=b"
    record = {"gangcheck.io/attempt-config": spec_record(parse_spec(B_DEADLINE))}
    req = grow_req(annotations={**record, "gangcheck.io/capacity-source": "1"})
    d = grown_by_two(obj, B_DEADLINE, (req,))
    moved = [
        a
        for a in d.actions
        if isinstance(a, AnnotateRequest) and "gangcheck.io/fulfillment-deadline" in a.annotations
    ]
    assert not moved, moved
    assert not [a for a in d.actions if isinstance(a, DeleteRequest)]


def test_a_growth_of_an_older_version_asking_another_source_is_not_taken_for_the_first() -> None:
    """A growth made by an older gangcheck recorded no source (read as the first, a) though it
    asked b (its class, the group released onto b): followed as before, not rolled back for
    asking another class than a's. A growth of a (its class a's) is compared with a now."""
    obj = group(6)
    obj["metadata"]["annotations"]["gangcheck.io/topology-domain"] = "pool=b"
    record = {"gangcheck.io/attempt-config": spec_record(parse_spec(TWO_SOURCES))}
    deadline = {"gangcheck.io/fulfillment-deadline": "2026-11-30T10:07:00Z"}
    older = grow_req(
        annotations={**record, **deadline},
        class_name="queued-provisioning.gke.io",
        conditions={"Accepted": ""},
    )
    d = grown_by_two(obj, TWO_SOURCES, (older,))
    assert not [a for a in d.actions if isinstance(a, AnnotateRequest)], d.actions
    assert "accepted" in (d.status or {}).get("gangcheck.io/message", "")
    # a's class edited: a growth that asked a (its class a's) is rolled back
    edited = {
        **TWO_SOURCES,
        "capacitySources": [
            {
                **TWO_SOURCES["capacitySources"][0],
                "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
            },
            TWO_SOURCES["capacitySources"][1],
        ],
    }
    of_a = grow_req(annotations={**record, **deadline}, conditions={"Accepted": ""})
    obj["metadata"]["annotations"]["gangcheck.io/topology-domain"] = "pool=a"
    d = grown_by_two(obj, edited, (of_a,))
    reasons = [
        a.annotations.get("gangcheck.io/rollback-reason")
        for a in d.actions
        if isinstance(a, AnnotateRequest)
    ]
    assert reasons == [
        f"ConfigChanged: spec.capacitySources[0] (a): class {CLASS_A!r} -> {CHECK_CAPACITY!r}"
    ], d.actions


@pytest.mark.parametrize("recorded", [True, False], ids=["domain recorded", "record removed"])
def test_a_group_with_a_required_topology_level_grows_in_its_running_members_domain(
    recorded: bool,
) -> None:
    """Racks required: the 4 run in r1, r2 has room for the 2 added. The growth is asked in
    r1, not released into r2, whether the group's domain record is there or was removed by
    hand (then read from the running members' nodes)."""
    obj = group(6)
    obj["spec"]["schedulingConstraints"] = {"topology": [{"key": "rack"}]}
    if recorded:
        obj["metadata"]["annotations"]["gangcheck.io/topology-domain"] = "rack=r1"
    members = [*running(), *added()]
    nodes = [node("old", gpu=4, labels={"rack": "r1"}), node("free", gpu=2, labels={"rack": "r2"})]
    snap = GroupSnapshot(
        group=pod_group_of(obj),
        members=tuple(map(pod_of, members)),
        config=parse_spec({"fulfillment": {"reclaimer": "DeleteNode"}}),
        capacity=ClusterView(nodes=tuple(nodes), pods=tuple(members)),
        opted_in=True,
    )
    d = growth.decide(snap, NOW)
    assert not [a for a in d.actions if isinstance(a, ReleaseMembers)]
    (template,) = [a.body for a in d.actions if isinstance(a, CreateTemplate)]
    assert template["template"]["spec"]["nodeSelector"] == {"rack": "r1"}


@pytest.mark.parametrize("bound", [False, True], ids=["binding", "bound"])
def test_a_delivered_growths_request_deleted_by_hand_has_the_hold_it_left_lifted(
    bound: bool,
) -> None:
    """A growth delivered (its members released onto it, binding or bound) whose request is
    deleted outside gangcheck: the node that arrived for it is recorded for it and held;
    with the request gone nothing (Started, a rollback, the group's end) would lift that
    hold, so the node stayed closed to every pod but the growth's for ever, nothing said.
    Lifted as the group's own request's is (once the API server confirms it gone), with a
    HoldLifted Warning Event; nothing asked again, nothing reclaimed, the members untouched."""
    held = arrived_for_grow1()
    members = [
        pod(f"new{i}", gated=False, node_name="n2" if bound else "", consumes=GROW1)
        for i in range(2)
    ]
    case = Case("gone", 6, [*running(), *members], nodes=[OLD_NODE, held])
    d = run(case)
    assert [a for a in d.actions if isinstance(a, ReleaseHold)] == [
        ReleaseHold(("n2",), gone=GROW1)
    ]
    assert not [a for a in d.actions if not isinstance(a, ReleaseHold)], d.actions
    (event,) = [e for e in d.events if e.reason == "HoldLifted"]
    assert event.warning and GROW1 in event.message and "n2" in event.message


@pytest.mark.parametrize(
    ("min_count", "replacements"),
    [(4, 0), (6, 2)],
    ids=["lowered back, the Job deleting them", "deleted, the Job making them again"],
)
def test_a_delivered_growth_whose_members_all_left_before_binding_is_withdrawn(
    min_count: int, replacements: int
) -> None:
    """A growth delivered (its 2 members released onto it), both members deleted before
    they were bound: nothing consumes its request any more. Before, it was neither started
    (no member to be bound) nor withdrawn (the group still has members): the node that
    arrived for it stayed held for it for ever, and a minCount still above what runs waited
    for ever ('asked for once the members of growth g-pg-grow-1 are all bound'), the
    members made again staying gated. Now its hold is lifted and its request withdrawn,
    nothing reclaimed (as the group's own request whose members all left), said by a
    GrowthWithdrawn Event; with the request gone the next decision asks again for the
    members made again."""
    held = arrived_for_grow1()
    fulfilled = grow_req(
        annotations={"gangcheck.io/phase": "Fulfilled"}, conditions={"Provisioned": ""}
    )
    members = [*running(), *(pod(f"again{i}", gated=True) for i in range(replacements))]
    d = run(Case("left", min_count, members, requests=[fulfilled], nodes=[OLD_NODE, held]))
    assert [a for a in d.actions if isinstance(a, ReleaseHold)] == [
        ReleaseHold((), unconsumed=GROW1),  # first: confirmed on the API server's pods
        ReleaseHold(("n2",)),
    ]
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == [GROW1]
    assert not [a for a in d.actions if isinstance(a, (ReleaseMembers, CreateRequest))]
    assert "GrowthWithdrawn" in {e.reason for e in d.events}, d.events
    if replacements:  # the request gone: the members made again are asked for
        then = run(Case("again", min_count, members))  # n2 left to the autoscaler
        created = [a.body for a in then.actions if isinstance(a, CreateRequest)]
        assert [b["metadata"]["name"] for b in created] == [GROW1]


@pytest.mark.parametrize("past", [False, True], ids=["before its deadline", "past it"])
def test_a_growth_in_flight_whose_members_fell_short_is_withdrawn_past_its_deadline(
    past: bool,
) -> None:
    """A growth asks for 2; one of them is relabelled to another group (or deleted) while
    its request waits, a node having arrived for it. Before, the group said 'nothing is
    asked until 1 more exist' while the growth stayed asked and its node held, its deadline
    never judged (the growth was not followed while members were short): held for ever.
    Now it waits for them until its deadline, said, then is withdrawn, what arrived for it
    reclaimed safely (as a growth no longer needed), Event GrowthWithdrawn; nothing of it is
    released alone."""
    n2 = arrived_for_grow1(gpu=1, created="2026-11-30T10:04:00Z")
    waiting = grow_req(conditions={"Provisioned": ""})
    now = NOW.replace(minute=30) if past else NOW
    d = run(Case("short", 6, [*running(), *added(1)], [waiting], [OLD_NODE, n2], now=now))
    message = (d.status or {}).get("gangcheck.io/message", "")
    assert "minCount 6 is above the members that exist" in message
    assert not [a for a in d.actions if isinstance(a, (ReleaseMembers, CreateRequest))]
    deleted = [a.name for a in d.actions if isinstance(a, DeleteRequest)]
    if not past:
        assert GROW1 in message and "deadline" in message, message
        assert deleted == [] and d.requeue_after is not None
        return
    assert deleted == [GROW1]
    assert [a.nodes for a in d.actions if isinstance(a, ReclaimArrivals)] == [("n2",)]
    assert "GrowthWithdrawn" in {e.reason for e in d.events}, d.events


def test_a_delivered_growths_withdrawal_waits_for_the_api_server_to_confirm_none_consumes_it() -> (
    None
):
    """The pure decision cannot tell a growth whose members all left before binding from one
    judged on a pod cache older than its request (a new leader's, its pods listed before the
    members' release, its requests after the record of it: the members shown still gated,
    consuming nothing). Its withdrawal is therefore preceded by the precondition the edge
    checks on a live list of the namespace's pods (`ReleaseHold.unconsumed`)."""
    held = arrived_for_grow1()
    fulfilled = grow_req(
        annotations={"gangcheck.io/phase": "Fulfilled"}, conditions={"Provisioned": ""}
    )
    stale = [*running(), *added(2)]  # new0, new1 as listed before their release
    d = run(Case("stale", 6, stale, requests=[fulfilled], nodes=[OLD_NODE, held]))
    kinds = [type(a).__name__ for a in d.actions]
    assert d.actions[0] == ReleaseHold((), unconsumed=GROW1), kinds
    assert kinds.index("DeleteRequest") > 0


async def test_a_new_leaders_pod_cache_older_than_its_requests_withdraws_no_growth_delivered() -> (
    None
):
    """On the edge (a fake API server): the growth g-pg-grow-1 delivered, its 2 members
    released onto it and binding, the node that came for it held; the leader's pod cache
    still shows the 2 members gated (listed before their release), its request cache the
    request Fulfilled. Before, the reconcile withdrew the growth (its request deleted, the
    hold lifted from n2: the members released onto it lost the node kept for them) and said
    GrowthWithdrawn. Now the live pods confirm they consume it: nothing is written, the pod
    cache catches up, and the next decision keeps the growth."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "default", "labels": {OPT_IN_LABEL: OPT_IN_VALUE}},
    }
    held = arrived_for_grow1()
    fulfilled = grow_req(
        annotations={"gangcheck.io/phase": "Fulfilled"}, conditions={"Provisioned": ""}
    )
    fulfilled["metadata"]["labels"] = {MANAGED_BY_LABEL: MANAGED_BY}
    released = [pod(f"new{i}", gated=False, consumes=GROW1) for i in range(2)]
    members = [{"apiVersion": "v1", "kind": "Pod", **p} for p in [*running(), *released]]
    obj = {**group(6), "apiVersion": UPSTREAM_POD_GROUP_V1BETA1.api_version}
    kube = FakeKube(clock=lambda: NOW)
    kube.add(namespace, obj, *members, fulfilled, OLD_NODE, held)
    caches = kube.caches(UPSTREAM_POD_GROUP_V1BETA1)
    for stale in added(2):  # the pod cache as listed before the release
        caches.pods.store._pop(stale)
        caches.pods.store._put({"apiVersion": "v1", "kind": "Pod", **stale})
    applier = Applier(kube, caches, SOURCES, clock=lambda: NOW)
    reconciler = PodGroupReconciler(
        kube, caches, EventRecorder(kube, clock=lambda: NOW), applier, clock=lambda: NOW
    )
    await reconciler.reconcile("pg/default/g")
    assert kube.stored(PROVISIONING_REQUEST, GROW1, "default") is not None
    assert kube.writes_of("Node") == []
    stored = kube.stored(NODE, "n2")
    assert stored is not None and stored["spec"]["taints"] == [hold_taint(f"default/{GROW1}")]
    assert not [w for w in kube.writes_of("Event") if "GrowthWithdrawn" in str(w.body)]
    cached = caches.pods.store.get("new0", "default")
    assert cached is not None and cached["metadata"]["annotations"][CONSUME_ANNOTATION] == GROW1
    await reconciler.reconcile("pg/default/g")  # on the pods as they are: kept
    assert kube.stored(PROVISIONING_REQUEST, GROW1, "default") is not None


@pytest.mark.parametrize(
    ("member", "confirmed"),
    [
        ({}, False),
        ({"metadata": {"deletionTimestamp": "2026-11-30T10:04:00Z"}}, True),
        ({"status": {"phase": "Failed"}}, True),
    ],
    ids=["a live member consumes it", "the one consuming it is being deleted", "it failed"],
)
async def test_the_unconsumed_precondition_is_judged_on_the_api_servers_pods(
    member: Obj, confirmed: bool
) -> None:
    """`ReleaseHold.unconsumed` on the edge: a pod that still counts consuming the request,
    as the API server has it, drops the decision (StaleDecisionError) with the pod read into
    the cache and nothing written; one being deleted or finished does not count."""
    consuming = pod("new0", gated=False, consumes=GROW1)
    for part, fields in member.items():
        consuming[part] = {**consuming[part], **fields}
    held = arrived_for_grow1(gpu=8)
    kube = FakeKube(clock=lambda: NOW)
    kube.add({"apiVersion": "v1", "kind": "Pod", **consuming}, held)
    caches = kube.caches()
    caches.pods.store._pop(consuming)  # the cache does not have it
    applier = Applier(kube, caches, SOURCES, clock=lambda: NOW)
    action = ReleaseHold(("n2",), unconsumed=GROW1)
    if confirmed:
        await applier.apply("default", action)
        assert [w.name for w in kube.writes] == ["n2"]
        return
    with pytest.raises(StaleDecisionError, match="new0 consume request g-pg-grow-1"):
        await applier.apply("default", action)
    assert kube.writes == []
    assert caches.pods.store.get("new0", "default") is not None


async def test_a_pod_the_cache_has_as_it_is_does_not_send_the_withdrawal_back() -> None:
    """A live pod consuming the growth's request that is no member (its group label removed,
    a copied manifest), in the pod cache as the API server has it: the decision saw it, and
    the withdrawal goes on (sent back on it, the same decision came again every 0.5 s)."""
    stranger = pod("copied", gated=False, consumes=GROW1)
    stranger["metadata"]["labels"] = {}  # not the group's
    held = arrived_for_grow1(gpu=8)
    kube = FakeKube(clock=lambda: NOW)
    kube.add({"apiVersion": "v1", "kind": "Pod", **stranger}, held)
    caches = kube.caches()
    assert caches.pods.store.get("copied", "default") is not None
    applier = Applier(kube, caches, SOURCES, clock=lambda: NOW)
    await applier.apply("default", ReleaseHold(("n2",), unconsumed=GROW1))
    assert [w.name for w in kube.writes] == ["n2"]


def test_a_growth_asked_again_under_a_name_whose_record_was_deleted_harms_nothing() -> None:
    """Growth g-pg-grow-1 delivered (its 2 members run on n2, consuming it), its request
    then deleted by hand; minCount raised again: the numbering, read from the requests
    there, starts again and the new growth is g-pg-grow-1 too. What that name reuse could
    harm is guarded: the new request counts n2 as recorded for it (its hold is left to it,
    lifted when it ends) but n2 is full, so more is asked; and should the new one be rolled
    back, n2 is not reclaimed (not proven younger than the new request, and it runs the old
    growth's members)."""
    n2 = arrived_for_grow1(created="2026-11-30T10:02:00Z")
    grown = [pod(f"g{i}", gated=False, node_name="n2", consumes=GROW1) for i in range(2)]
    d = run(Case("again", 8, [*running(), *grown, *added(2)], nodes=[OLD_NODE, n2]))
    created = [a.body for a in d.actions if isinstance(a, CreateRequest)]
    assert [b["metadata"]["name"] for b in created] == [GROW1]
    assert not [a for a in d.actions if isinstance(a, ReleaseHold)], d.actions
    assert not [a for a in d.actions if isinstance(a, (ReleaseMembers, ReclaimArrivals))]
    judged = reclaim.judge(n2, map(pod_of, grown), request=f"default/{GROW1}", request_created=NOW)
    assert judged.verdict == "keep" and "not proven younger" in judged.reason


@pytest.mark.parametrize("provisioned", [False, True], ids=["just made", "provisioned"])
def test_a_growth_name_used_again_is_not_taken_as_delivered_by_the_earlier_ones_members(
    provisioned: bool,
) -> None:
    """g-pg-grow-1 delivered, its 2 members running on n2 (consuming it), its request then
    deleted by hand; minCount raised again, so a new g-pg-grow-1 is made for 2 new members.
    The earlier members consume its name, but they run on a node older than the new request:
    it is not taken as delivered (before, it was marked Fulfilled, then Started, its hold
    lifted, while the new members waited and a g-pg-grow-2 was asked for them)."""
    n2 = arrived_for_grow1(created="2026-11-30T10:01:00Z", held=False)
    earlier = [pod(f"g{i}", gated=False, node_name="n2", consumes=GROW1) for i in range(2)]
    again = grow_req(
        created="2026-11-30T10:04:00Z",
        conditions={"Provisioned": ""} if provisioned else {},
    )
    d = run(Case("again", 8, [*running(), *earlier, *added(2)], [again], [OLD_NODE, n2]))
    phases = [
        a.annotations.get("gangcheck.io/phase")
        for a in d.actions
        if isinstance(a, AnnotateRequest) and a.name == GROW1
    ]
    assert "Fulfilled" not in phases and "Started" not in phases, d.actions
    assert not [a for a in d.actions if isinstance(a, CreateRequest)], d.actions
    assert not [a for a in d.actions if isinstance(a, ReleaseHold) and a.nodes], d.actions


@pytest.mark.parametrize("bound", [False, True], ids=["binding", "bound"])
def test_a_growth_released_onto_whose_record_was_not_written_is_taken_as_delivered(
    bound: bool,
) -> None:
    """The growth fitted whole: its 2 members were released onto it (consuming it), but the
    record of it (its phase Fulfilled, written right after) was lost (a 500, a lost answer,
    the leader lost between the two writes). Before, the next decision counted them running,
    found minCount no longer above what runs and withdrew the growth as 'minCount lowered',
    reclaiming the node that came for it, where its members are binding (a drain fences it:
    a member not yet bound could not be). Now a growth its members consume is delivered
    whatever its record says: the record is written again, nothing withdrawn or reclaimed,
    and it is started once its members are all bound."""
    n2 = arrived_for_grow1(created="2026-11-30T10:04:00Z")
    where = "n2" if bound else ""
    released = [pod(f"new{i}", gated=False, node_name=where, consumes=GROW1) for i in range(2)]
    waiting = grow_req(conditions={"Provisioned": ""})
    d = run(Case("unrecorded", 6, [*running(), *released], [waiting], [OLD_NODE, n2]))
    assert not [a for a in d.actions if isinstance(a, (DeleteRequest, ReclaimArrivals))]
    assert "GrowthWithdrawn" not in {e.reason for e in d.events}, d.events
    phases = [
        a.annotations.get("gangcheck.io/phase")
        for a in d.actions
        if isinstance(a, AnnotateRequest) and a.name == GROW1
    ]
    assert phases[0] == "Fulfilled", d.actions
    lifted = [a.nodes for a in d.actions if isinstance(a, ReleaseHold)]
    assert lifted == ([("n2",)] if bound else []), d.actions
    assert ("Started" in phases) is bound


def test_a_growth_rolled_back_and_asked_again_is_said_in_a_normal_event() -> None:
    """As a gang's RolledBack (rollback.rolled_back): retried on backoff is the designed path,
    nothing a person must act on."""
    (case,) = [c for c in CASES if c.id.startswith("the growth rolled back, in its backoff")]
    (event,) = [e for e in run(case).events if e.reason == "GrowthRolledBack"]
    assert not event.warning


def test_a_growth_member_ungated_by_hand_is_given_the_request_and_its_hold_and_named() -> None:
    """A member added with the growth whose gate was removed by hand while it waits unbound
    is one of the growth (counted in its need and its fit), and once the growth fits whole it
    is given the request and its hold's toleration with the gated ones, named in GangGrown as
    GangReleased names such members (podgroup.release_together). Before, it was counted
    running: the growth asked for the gated one alone, and the member ungated waited for room
    the hold keeps it off, never consuming what was asked."""
    (case,) = [c for c in CASES if c.id.startswith("one of the 2 added ungated by hand, the")]
    d = run(case)
    (release,) = [a for a in d.actions if isinstance(a, ReleaseMembers)]
    assert release.pods == ("new0", "new1")
    assert release.annotations[CONSUME_ANNOTATION] == GROW1
    assert [t["value"] for t in release.tolerations] == [hold_taint(f"default/{GROW1}")["value"]]
    (said,) = [e.message for e in d.events if e.reason == "GangGrown"]
    assert said.startswith(
        "Released 1 members together, and gave 1 member(s) whose gate was lifted before (new1) "
        "the request and its hold's toleration: released; minCount raised to 6"
    ), said


def never_gated(name: str, node_name: str = "") -> Obj:
    """A member added with the group's growth that the webhook never gated (down, or not
    asked): no gate, no stamp."""
    obj = pod(name, gated=True, node_name=node_name)
    del obj["spec"]["schedulingGates"]
    return obj


def said_not_gated(d: GroupDecision) -> dict[str, str]:
    return {
        e.about.name if e.about else "g": e.message
        for e in d.events
        if e.reason == "MemberNotGated" and e.warning
    }


def test_a_growth_member_created_without_the_gate_is_said_as_a_gangs_is() -> None:
    """A member added with the growth that carries no gate (the webhook down) may be scheduled
    one by one, before the growth's capacity exists: MemberNotGated on the group and on the
    pod, its name kept in gangcheck.io/ungated-members, as a gang's member before its release.
    Before, a released group said nothing of it. The growth still counts it (one request for
    both)."""
    case = Case("never gated", 6, [*running(), *added(1), never_gated("new1")])
    d = run(case)
    said = said_not_gated(d)
    assert said["new1"] == (
        "created without the gangcheck.io/provisioning scheduling gate (was the webhook down, "
        "or the namespace not opted in?): PodGroup g cannot hold it back until its growth's "
        "capacity exists"
    )
    assert said["g"].startswith(
        "1 member(s) carry no gangcheck.io/provisioning scheduling gate before their growth is "
        "released: new1 created without"
    ), said["g"]
    assert (d.status or {})["gangcheck.io/ungated-members"] == "new1"
    (body,) = [a.body for a in d.actions if isinstance(a, CreateRequest)]
    assert sum(p["count"] for p in body["spec"]["podSets"]) == 2


def test_a_growth_member_never_gated_and_bound_already_is_said() -> None:
    """Bound before gangcheck looked (no gate, no stamp, consuming nothing): it runs, counted
    running, and is said (before: nothing)."""
    case = Case("never gated, bound", 5, [*running(), never_gated("new0", node_name="old")])
    said = said_not_gated(run(case))
    assert said["new0"].startswith("bound to node old without ever having the"), said


def test_a_growth_member_is_said_once() -> None:
    obj = group(6)
    obj["metadata"]["annotations"]["gangcheck.io/ungated-members"] = "new1"
    members = [*running(), *added(1), never_gated("new1")]
    snap = GroupSnapshot(
        group=pod_group_of(obj),
        members=tuple(map(pod_of, members)),
        config=parse_spec({"fulfillment": {"reclaimer": "DeleteNode"}}),
        capacity=ClusterView(nodes=(OLD_NODE,), pods=tuple(members)),
        opted_in=True,
    )
    assert said_not_gated(growth.decide(snap, NOW)) == {}


@pytest.mark.parametrize(
    "members",
    [
        # released by gangcheck onto room that exists, binding (its mark)
        [*running(), released_binding("new0"), *later(1)],
        # released onto the growth's request, binding
        [*running(), pod("new0", gated=False, consumes=GROW1), *later(1)],
        # the webhook stamped it, bound since: its gate was lifted, by a release or another
        [*running(), {**stripped("new0"), "spec": {**stripped("new0")["spec"], "nodeName": "n2"}}],
        # all gated
        [*running(), *added()],
    ],
    ids=["released-onto-room", "consuming-the-growth", "stamped-and-bound", "gated"],
)
def test_a_growth_member_gangcheck_released_or_gated_is_not_said(members: list[Obj]) -> None:
    case = Case("not said", 6, members)
    d = run(case)
    assert said_not_gated(d) == {}
    assert "gangcheck.io/ungated-members" not in (d.status or {})


def test_a_running_member_of_the_gang_without_a_stamp_is_not_said_as_a_growth_member() -> None:
    """Members of the gang released (created before the group's release) were said, if at all,
    before it: a running one the webhook never stamped is no growth member."""
    bare = pod("run9", gated=False, node_name="old")  # created 10:00:30, before the release
    case = Case("gang member", 6, [*running(), bare, *added(1)])
    assert said_not_gated(run(case)) == {}


#: A growth delivered: its 2 members released onto it at 10:04 (its record of when).
DELIVERED = {"gangcheck.io/phase": "Fulfilled", "gangcheck.io/released-at": "2026-11-30T10:04:00Z"}
START_ROLLED = {
    "gangcheck.io/phase": "RollingBack",
    "gangcheck.io/rollback-reason": (
        "StartDeadline: 0 of 2 members released together bound within 600s of their release "
        "(unbound: new0, new1)"
    ),
    "gangcheck.io/rollback-nodes": '{"n2": "2026-11-30T10:03:30Z"}',
}


def binding(*bound: str) -> list[Obj]:
    """The 2 members released onto growth g-pg-grow-1, `bound` of them on n2."""
    return [
        pod(f"new{i}", gated=False, consumes=GROW1, node_name="n2" if f"new{i}" in bound else "")
        for i in (0, 1)
    ]


def watched(
    *,
    annotations: dict[str, str],
    now: datetime,
    members: list[Obj] | None = None,
    min_count: int = 6,
    config: dict[str, Any] | None = None,
) -> GroupDecision:
    members = [*running(), *binding()] if members is None else members
    snap = GroupSnapshot(
        group=pod_group_of(group(min_count)),
        members=tuple(map(pod_of, members)),
        config=parse_spec(
            config if config is not None else {"fulfillment": {"reclaimer": "DeleteNode"}}
        ),
        requests=(request_of(grow_req(conditions={"Provisioned": ""}, annotations=annotations)),),
        capacity=ClusterView(
            nodes=(OLD_NODE, arrived_for_grow1(created="2026-11-30T10:03:30Z")),
            pods=tuple(members),
        ),
        opted_in=True,
    )
    return growth.decide(snap, now)


def annotated(d: GroupDecision, key: str) -> list[str]:
    return [
        a.annotations[key]
        for a in d.actions
        if isinstance(a, AnnotateRequest) and a.name == GROW1 and key in a.annotations
    ]


def untouched(d: GroupDecision) -> None:
    """No member released or moved, no request withdrawn or made."""
    assert not [a for a in d.actions if isinstance(a, ReleaseMembers | DeleteRequest)]
    assert not [a for a in d.actions if isinstance(a, CreateRequest)]


def test_a_growth_released_onto_its_request_records_when() -> None:
    """The start watchdog of a growth counts from its members' release onto it, recorded on
    its request with its phase."""
    (case,) = [c for c in CASES if c.id.startswith("the growth fits whole")]
    d = run(case)
    assert annotated(d, "gangcheck.io/released-at") == ["2026-11-30T10:05:00Z"]
    assert annotated(d, "gangcheck.io/phase") == ["Fulfilled"]


def test_a_growth_whose_members_bind_within_the_start_deadline_is_waited_for() -> None:
    d = watched(annotations=DELIVERED, now=datetime(2026, 11, 30, 10, 10, tzinfo=UTC))
    assert "gangcheck.io/phase" not in {k for a in d.actions for k in getattr(a, "annotations", {})}
    assert not [e for e in d.events if e.reason == "RollbackStarted"]
    assert d.requeue_after is not None and d.requeue_after <= 15
    untouched(d)


def test_a_growth_whose_members_do_not_bind_within_the_start_deadline_is_rolled_back() -> None:
    """startDeadlineSeconds (600 s by default) after its members' release onto it, one of the
    two still unbound: the growth is rolled back as a gang's release is (StartDeadline, the
    nodes that arrived for it recorded), said on the group with the reason; the running
    members and the growth's own are not touched, nothing withdrawn or asked. Before, its
    capacity was held for ever."""
    members = [*running(), *binding("new0")]
    d = watched(
        annotations=DELIVERED, now=datetime(2026, 11, 30, 10, 14, 1, tzinfo=UTC), members=members
    )
    (reason,) = annotated(d, "gangcheck.io/rollback-reason")
    assert reason == (
        "StartDeadline: 1 of 2 members released together bound within 600s of their release "
        "(unbound: new1)"
    )
    assert annotated(d, "gangcheck.io/phase") == ["RollingBack"]
    assert annotated(d, "gangcheck.io/rollback-nodes") == ['{"n2": "2026-11-30T10:03:30Z"}']
    # when, with the record: the next growth's backoff counts from it (next_due)
    assert annotated(d, "gangcheck.io/start-rolled-back-at") == ["2026-11-30T10:14:01Z"]
    untouched(d)
    # the group says it once the rollback is recorded (as a gang's is written when done)
    assert {e.reason for e in d.events} >= {"RollbackStarted"}


def test_a_growth_delivered_by_an_older_version_is_watched_from_now() -> None:
    """Fulfilled with no record of when its members were released (an older version): the
    watchdog counts from now, recorded; nothing rolled back at once."""
    d = watched(
        annotations={"gangcheck.io/phase": "Fulfilled"},
        now=datetime(2026, 11, 30, 11, 0, tzinfo=UTC),
    )
    assert annotated(d, "gangcheck.io/released-at") == ["2026-11-30T11:00:00Z"]
    assert not annotated(d, "gangcheck.io/rollback-reason")
    untouched(d)


def test_a_growth_its_start_watchdog_rolls_back_reclaims_what_arrived_safely() -> None:
    """Rolling back: what arrived for it reclaimed by the safe path (ReclaimArrivals: a node a
    member runs on drains, reclaimed once idle), neither withdrawn as no longer needed (its
    members counted running, minCount is met) nor followed as a growth in flight."""
    d = watched(annotations=START_ROLLED, now=datetime(2026, 11, 30, 10, 14, 5, tzinfo=UTC))
    (reclaim,) = [a for a in d.actions if isinstance(a, ReclaimArrivals)]
    assert (reclaim.request, reclaim.nodes) == (GROW1, ("n2",))
    untouched(d)
    assert not [e for e in d.events if e.reason in ("GrowthWithdrawn", "RollbackStarted")]
    message = (d.status or {})["gangcheck.io/message"]
    assert message.startswith(f"released; rolling back {GROW1} (StartDeadline: 0 of 2"), message
    assert not [e for e in d.events if e.reason == "GrowthRolledBack"]  # said once, when done


OUTCOME = '{"draining": ["n2"], "kept": {}, "nodeSeconds": 60, "reclaimed": []}'


def test_a_growth_its_start_watchdog_rolled_back_has_the_hold_lifted_from_what_stays() -> None:
    """Rolled back (its outcome recorded): the hold lifted from what stays (n2, a member of it
    bound there, drains), said with the outcome; the request kept as the record, nothing
    asked: its members are released and counted, as a gang's release rolled back gives up."""
    rolled = {**START_ROLLED, "gangcheck.io/outcome": OUTCOME}
    d = watched(
        annotations=rolled,
        now=datetime(2026, 11, 30, 10, 15, tzinfo=UTC),
        members=[*running(), *binding("new0")],
    )
    assert [n for a in d.actions if isinstance(a, ReleaseHold) for n in a.nodes] == ["n2"]
    untouched(d)
    assert not [a for a in d.actions if isinstance(a, ReclaimArrivals)]
    message = (d.status or {})["gangcheck.io/message"]
    assert message.startswith(f"released; rolled back {GROW1} (StartDeadline: 0 of 2"), message
    assert "gangcheck cannot hold them back for another growth" in message
    assert {e.reason for e in d.events} >= {"GrowthRolledBack", "RolledBack"}
    assert [e.warning for e in d.events if e.reason == "GrowthRolledBack"] == [True]


def test_the_next_growth_after_a_start_rollback_waits_its_backoff_from_the_start_deadline() -> None:
    """A growth rolled back by its start watchdog (released 10:04, start deadline 600 s: 10:14)
    and minCount raised again: the next growth follows after a rollback's backoff counted from
    that start deadline, not from the growth's fulfillment deadline, long past by then (before,
    it was asked at once)."""
    rolled = {
        **START_ROLLED,
        "gangcheck.io/outcome": OUTCOME,
        "gangcheck.io/fulfillment-deadline": "2026-11-30T10:07:00Z",  # delivered before it
        "gangcheck.io/released-at": DELIVERED["gangcheck.io/released-at"],
    }
    d = watched(
        annotations=rolled,
        now=datetime(2026, 11, 30, 10, 14, 30, tzinfo=UTC),
        members=[*running(), *binding(), *later()],
        min_count=8,
    )
    assert not [a for a in d.actions if isinstance(a, CreateRequest)]
    message = (d.status or {})["gangcheck.io/message"]
    assert "the next at 2026-11-30T10:1" in message, message
    assert d.requeue_after is not None and d.requeue_after > 0


def test_a_growth_rolled_back_by_its_start_watchdog_is_followed_by_the_next_for_more() -> None:
    """minCount raised again above it with 2 more members: the next growth asks for those (its
    members released are counted, not asked for again), after the backoff of a rollback."""
    rolled = {**START_ROLLED, "gangcheck.io/outcome": OUTCOME}
    d = watched(
        annotations=rolled,
        now=datetime(2026, 11, 30, 11, 0, tzinfo=UTC),
        members=[*running(), *binding(), *later()],
        min_count=8,
    )
    (body,) = [a.body for a in d.actions if isinstance(a, CreateRequest)]
    assert body["metadata"]["name"] == GROW2
    assert sum(p["count"] for p in body["spec"]["podSets"]) == 2
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == [GROW1]
