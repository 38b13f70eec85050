"""Table tests of the decision for a Kueue Workload slice (an elastic Job scaled up): only the
difference is asked for, the running members are counted as placed, and a rollback keeps the
slice Pending (Retry would have Kueue stop the whole Job)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.actions import (
    AnnotateRequest,
    ClaimNode,
    CreateRequest,
    DeleteRequest,
    ReclaimArrivals,
    ReleaseHold,
)
from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.attempt.hold import hold_taint, hold_toleration
from gangcheck.logic.workloads import slices
from gangcheck.logic.workloads.admission import Decision, Snapshot, decide
from gangcheck.logic.workloads.diagnosis import replay
from gangcheck.model.objects import Flavor, request_of, workload_of
from gangcheck.model.provisioning_config import parse_spec
from tests.builders import (
    CHECK,
    WorkloadBuilder,
    admission_check,
    node,
    pod_template,
    provisioning_request,
)

NOW = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
GPU_FLAVOR = {"gpu": Flavor("gpu", {"pool": "gpu"}, ({"key": "gpu", "operator": "Exists"},))}
OLD = "default/wl-old"
REQ1, REQ2 = "wl-atomic-1", "wl-atomic-2"
BASE4 = json.dumps({"replaces": OLD, "running": {"workers": 4}}, sort_keys=True)
OUTCOME = '{"draining": [], "kept": {}, "nodeSeconds": 600, "reclaimed": ["n2"]}'
ROLLED = {
    "gangcheck.io/phase": "RollingBack",
    "gangcheck.io/rollback-reason": "Deadline: 3 of 4 members placeable",
    "gangcheck.io/fulfillment-deadline": "2026-11-30T10:02:00Z",
    "gangcheck.io/outcome": OUTCOME,
    slices.SLICE_ANNOTATION: BASE4,
}


def new_slice(count: int = 8, *, state: str = "Pending", **kw: Any) -> WorkloadBuilder:
    return (
        WorkloadBuilder("wl")
        .pod_set("workers", count)
        .annotation(slices.REPLACEMENT_FOR, OLD)
        .reserve_quota()
        .check(state=state, **kw)
    )


def old_slice(count: int = 4, *, admitted: bool = True, replaced_by: str = "uid-wl") -> Any:
    b = WorkloadBuilder("wl-old").pod_set("workers", count).reserve_quota().check(state="Ready")
    if admitted:
        b.condition("Admitted")
    if replaced_by:
        b.condition("Finished", reason=slices.REPLACED_REASON)
        for c in b.obj["status"]["conditions"]:
            if c["type"] == "Finished":
                c["message"] = (
                    f"Replaced to accommodate a workload (UID: {replaced_by}, JobUID: j) due to "
                    "workload slice aggregation"
                )
    return b.build()


def running(n: int, node_name: str = "n1") -> list[dict[str, Any]]:
    """The old slice's members, bound and running, each using one GPU."""
    return [
        {
            "metadata": {
                "name": f"job-{i}",
                "namespace": "default",
                "annotations": {"autoscaling.x-k8s.io/consume-provisioning-request": "first-1"},
            },
            "spec": {
                "nodeName": node_name,
                "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
            },
            "status": {"phase": "Running"},
        }
        for i in range(n)
    ]


def req(name: str = REQ1, count: int = 4, **kw: Any) -> Any:
    return provisioning_request(
        name, templates=[(naming.template_name(name, "workers"), count)], **kw
    )


@dataclass
class Case:
    id: str
    workload: WorkloadBuilder
    predecessor: Any = field(default_factory=old_slice)  # None: gone
    requests: list[Any] = field(default_factory=list)
    nodes: list[Any] = field(default_factory=list)
    pods: list[Any] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    now: datetime = NOW
    # expectations
    state: str | None = None  # None: no check write
    message: tuple[str, ...] = ()
    asked: int | None = None  # the count of the request created, if one is
    asked_name: str = REQ1
    deletes: tuple[str, ...] = ()
    claims: tuple[str, ...] = ()
    started: bool = False
    released: tuple[str, ...] = ()
    events: tuple[str, ...] = ()
    retry_count: int = 0
    reclaims: bool | None = None  # None: not looked at


def run(case: Case) -> Decision:
    snap = Snapshot(
        workload=workload_of(case.workload.build()),
        check=CHECK,
        config=parse_spec(case.config),
        flavors=GPU_FLAVOR,
        requests=tuple(request_of(r) for r in case.requests),
        templates=frozenset(
            p["podTemplateRef"]["name"] for r in case.requests for p in r["spec"]["podSets"]
        ),
        capacity=ClusterView(nodes=tuple(case.nodes), pods=tuple(case.pods)),
    )
    pred = slices.Predecessor(
        OLD, workload_of(case.predecessor) if case.predecessor is not None else None
    )
    return slices.decide(snap, case.now, predecessor=pred)


#: A Ready check's podSetUpdates: the workers consume REQ1.
CONSUMES_REQ1 = [
    {"name": "workers", "annotations": {"autoscaling.x-k8s.io/consume-provisioning-request": REQ1}}
]


def started_then_scaled_in_place(count: int) -> dict[str, Any]:
    """A Case's situation: a Ready slice whose members consume REQ1, scaled in place to
    `count` workers after it started (its request Provisioned and marked Started, n2
    arrived for it and held for it)."""
    return {
        "workload": new_slice(count, state="Ready", pod_set_updates=CONSUMES_REQ1),
        "requests": [
            req(
                conditions={"Provisioned": ""},
                annotations={slices.SLICE_ANNOTATION: BASE4, "gangcheck.io/phase": "Started"},
            )
        ],
        "nodes": [
            node(
                "n2",
                labels={"pool": "gpu"},
                annotations={"gangcheck.io/arrived-for": f"default/{REQ1}"},
                taints=[hold_taint(f"default/{REQ1}")],
            )
        ],
    }


CASES = [
    Case(
        "scale up 4 -> 8: the request asks for the 4 added, the base recorded on it",
        new_slice(),
        state="Pending",
        message=("workload slice: adds 4 members to default/wl-old running 4", "for 4 pods"),
        asked=4,
    ),
    Case(
        "the replaced slice never ran: the whole slice is asked for",
        new_slice(),
        predecessor=old_slice(admitted=False),
        message=("adds 8 members to default/wl-old running 0",),
        state="Pending",
        asked=8,
    ),
    Case(
        "the difference fits on a new node, the running members' usage counted: Ready; the "
        "node claimed, its hold lifted at once (the Job's pods tolerate another), started",
        new_slice(),
        requests=[
            req(conditions={"Provisioned": ""}, annotations={slices.SLICE_ANNOTATION: BASE4})
        ],
        nodes=[
            node("n1", gpu=4, labels={"pool": "gpu"}),  # the 4 running members fill it
            node("n2", gpu=4, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z"),
        ],
        pods=running(4),
        state="Ready",
        message=("adds 4 members to default/wl-old running 4", "the whole gang fits"),
        claims=("n2",),
        started=True,
    ),
    Case(
        "the running members fill their node: 3 of the 4 added fit, the check waits",
        new_slice(),
        requests=[
            req(conditions={"Provisioned": ""}, annotations={slices.SLICE_ANNOTATION: BASE4})
        ],
        nodes=[
            node("n1", gpu=4, labels={"pool": "gpu"}),
            node("n2", gpu=3, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z"),
        ],
        pods=running(4),
        state="Pending",
        message=("adds 4 members to default/wl-old running 4", "3 of 4 members placeable"),
        claims=("n2",),
    ),
    Case(
        "rolled back past the deadline: Pending, never Retry (Kueue would stop the Job)",
        new_slice(message="workload slice: adds 4 members to default/wl-old running 4; x"),
        requests=[req(conditions={"Provisioned": ""}, annotations=ROLLED)],
        state="Pending",
        message=(
            "rolled back wl-atomic-1",
            "the next attempt at 2026-11-30T10:03:00Z",
            "4 running members untouched",
        ),
        events=("SliceRolledBack",),
    ),
    Case(
        "the replaced slice is gone and nothing asked yet: nothing asked, said in an Event",
        new_slice(),
        predecessor=None,
        state="Pending",
        message=("replacing default/wl-old, which is gone", "nothing is asked"),
        events=("WorkloadSliceUnclear",),
    ),
    Case(
        "the replaced slice is gone after the ask: the attempt goes on as recorded",
        new_slice(),
        predecessor=None,
        requests=[
            req(conditions={"Provisioned": ""}, annotations={slices.SLICE_ANNOTATION: BASE4})
        ],
        state="Pending",
        message=("adds 4 members to default/wl-old running 4", "0 of 4 members placeable"),
    ),
    Case(
        "two slices raced: the replaced one was replaced by another, nothing asked",
        new_slice(),
        predecessor=old_slice(replaced_by="uid-other"),
        state="Pending",
        message=("two slices raced for one Job",),
        events=("WorkloadSliceUnclear",),
    ),
    Case(
        "the slice adds nothing beyond what runs: Ready, no request",
        new_slice(4),
        state="Ready",
        message=("adds 0 members", "not needed"),
    ),
    Case(
        "a Ready slice scaled back to what the replaced one ran: its request withdrawn (ending "
        "the autoscaler's booking), nothing reclaimed, its hold kept lifted",
        **started_then_scaled_in_place(2),
        released=("n2",),
        deletes=(REQ1,),
        reclaims=False,
    ),
    Case(
        "a Ready slice scaled down in place but still adding members: its request kept, "
        "nothing reclaimed",
        **started_then_scaled_in_place(6),
        released=("n2",),
        deletes=(),
        reclaims=False,
    ),
]


CASES += [
    Case(
        "the Job scaled to 0 while its slice waits (counts lowered in place): adds 0, Ready, "
        "its request withdrawn and what arrived for it reclaimed safely",
        new_slice(0),
        requests=[
            req(conditions={"Provisioned": ""}, annotations={slices.SLICE_ANNOTATION: BASE4})
        ],
        nodes=[
            node("n1", gpu=4, labels={"pool": "gpu"}),
            node(
                "n2",
                gpu=4,
                labels={"pool": "gpu"},
                created="2026-11-30T10:01:00Z",
                annotations={"gangcheck.io/arrived-for": f"default/{REQ1}"},
            ),
        ],
        pods=running(4),
        state="Ready",
        message=("adds 0 members",),
        deletes=(REQ1,),
        reclaims=True,
    ),
]
CASES += [
    Case(
        "evicted once and admitted again (Kueue stopped the whole Job): the whole 8 asked",
        new_slice().condition("Evicted", "False", "QuotaReserved"),
        state="Pending",
        message=("adds 8 members to default/wl-old running 0", "for 8 pods"),
        asked=8,
    ),
    Case(
        "evicted once, its request from before recording 4 running: fitted as the whole 8",
        new_slice().condition("Evicted", "False", "QuotaReserved"),
        requests=[
            req(conditions={"Provisioned": ""}, annotations={slices.SLICE_ANNOTATION: BASE4})
        ],
        nodes=[node("n2", gpu=4, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z")],
        state="Pending",
        message=("adds 8 members to default/wl-old running 0", "4 of 8 members placeable"),
        claims=("n2",),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_slice(case: Case) -> None:
    d = run(case)
    if case.state is None:
        assert d.check is None
    else:
        assert d.check is not None and d.check.state == case.state, d.check
        for part in case.message:
            assert part in d.check.message, d.check.message
        assert d.check.retry_count == case.retry_count
    created = [a for a in d.actions if isinstance(a, CreateRequest)]
    if case.asked is None:
        assert not created
    else:
        (body,) = (a.body for a in created)
        assert body["metadata"]["name"] == case.asked_name
        assert [p["count"] for p in body["spec"]["podSets"]] == [case.asked]
        recorded = slices.Base.from_annotation(
            body["metadata"]["annotations"][slices.SLICE_ANNOTATION]
        )
        assert recorded is not None and recorded.replaces == OLD
    assert tuple(a.name for a in d.actions if isinstance(a, DeleteRequest)) == case.deletes
    assert tuple(a.name for a in d.actions if isinstance(a, ClaimNode)) == case.claims
    starts = [
        a
        for a in d.actions
        if isinstance(a, AnnotateRequest) and a.annotations.get("gangcheck.io/phase") == "Started"
    ]
    assert bool(starts) == case.started
    released = tuple(n for a in d.actions if isinstance(a, ReleaseHold) for n in a.nodes)
    assert released == case.released
    if case.reclaims is not None:
        assert any(isinstance(a, ReclaimArrivals) for a in d.actions) == case.reclaims
    reasons = {e.reason for e in d.events} - {"AdmissionCheckUpdated", "ProvisioningRequestCreated"}
    assert reasons >= set(case.events), d.events
    assert not {"Retry", "Rejected"} & {e.reason for e in d.events}


def test_a_workload_that_is_no_slice_is_decided_as_a_whole_gang() -> None:
    wl = workload_of(WorkloadBuilder("wl").pod_set("workers", 8).reserve_quota().check().build())
    assert slices.predecessor_of(wl, lambda name, ns: None) is None


def test_the_predecessor_is_looked_up_by_the_annotations_namespace_and_name() -> None:
    wl = workload_of(new_slice().build())
    seen: list[tuple[str, str]] = []

    def lookup(name: str, namespace: str) -> Any:
        seen.append((name, namespace))
        return old_slice()

    pred = slices.predecessor_of(wl, lookup)
    assert seen == [("wl-old", "default")]
    assert pred is not None and pred.workload is not None and pred.key == OLD


def test_a_slice_rolled_back_past_its_last_attempt_waits_pending_without_a_new_ask() -> None:
    case = Case(
        "",
        new_slice(message="said"),
        config={"retryStrategy": {"backoffLimitCount": 0}},
        requests=[req(conditions={"Provisioned": ""}, annotations=ROLLED)],
    )
    first = run(replace_case(case, workload=new_slice()))
    assert first.check is not None and first.check.state == "Pending"
    assert "allows no more attempts" in first.check.message
    again = run(
        replace_case(
            case,
            workload=new_slice(message=first.check.message),
            now=datetime(2027, 1, 1, tzinfo=UTC),
        )
    )
    assert again.check is None and not [a for a in again.actions if isinstance(a, CreateRequest)]


def test_the_whole_decide_is_unchanged_for_the_same_snapshot_without_a_predecessor() -> None:
    """Without the slice's predecessor the decision is the fixed-size gang's: the whole 8."""
    snap = Snapshot(
        workload=workload_of(new_slice().build()),
        check=CHECK,
        config=parse_spec({}),
        flavors=GPU_FLAVOR,
    )
    created = [a for a in decide(snap, NOW).actions if isinstance(a, CreateRequest)]
    assert [p["count"] for p in created[0].body["spec"]["podSets"]] == [8]


def replace_case(case: Case, **kw: Any) -> Case:
    from dataclasses import replace

    return replace(case, **kw)


def test_a_rolled_back_slice_says_so_once_then_asks_again_after_its_backoff() -> None:
    case = Case("", new_slice(), requests=[req(conditions={"Provisioned": ""}, annotations=ROLLED)])
    said = run(case)
    assert said.check is not None and said.check.state == "Pending"
    waiting = replace_case(
        case,
        workload=new_slice(message=said.check.message),
        now=datetime(2026, 11, 30, 10, 2, 30, tzinfo=UTC),  # before 10:03, the backoff's end
    )
    early = run(waiting)
    assert early.check is None and early.actions == () and early.requeue_after == 30.0
    later = run(replace_case(waiting, now=NOW))
    created = [a.body for a in later.actions if isinstance(a, CreateRequest)]
    assert [b["metadata"]["name"] for b in created] == [REQ2]
    assert [p["count"] for p in created[0]["spec"]["podSets"]] == [4]
    assert [a.name for a in later.actions if isinstance(a, DeleteRequest)] == [REQ1]
    assert later.check is not None and later.check.retry_count == 0
    assert f"provisioning request {REQ2} created for 4 pods" in later.check.message


def test_a_slice_whose_config_is_deleted_goes_on_under_its_attempts_recorded_config() -> None:
    """Not the whole gang (its fit would never be met, and the rollback at the deadline would
    have Kueue stop the Job): the difference the request records, under its recorded config."""
    made_under = {"gangcheck.io/attempt-config": '{"fulfillment":{"reclaimer":"DeleteNode"}}'}
    snap = Snapshot(
        workload=workload_of(new_slice().build()),
        check=CHECK,
        config=None,
        config_problem="AtomicProvisioningConfig 'gpu' not found",
        flavors=GPU_FLAVOR,
        requests=(
            request_of(
                req(
                    conditions={"Provisioned": ""},
                    annotations={slices.SLICE_ANNOTATION: BASE4, **made_under},
                )
            ),
        ),
        templates=frozenset({naming.template_name(REQ1, "workers")}),
        capacity=ClusterView(
            nodes=(node("n2", gpu=3, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z"),)
        ),
    )
    d = slices.decide(snap, NOW, predecessor=slices.Predecessor(OLD, None))
    assert d.check is not None and d.check.state == "Pending"
    assert "3 of 4 members placeable" in d.check.message, d.check.message


def test_a_diagnosis_replays_a_slice_by_the_difference_its_request_records() -> None:
    snap = Snapshot(
        workload=workload_of(new_slice().build()),
        check=CHECK,
        config=parse_spec({}),
        flavors=GPU_FLAVOR,
        requests=(
            request_of(
                req(conditions={"Provisioned": ""}, annotations={slices.SLICE_ANNOTATION: BASE4})
            ),
        ),
        templates=frozenset({naming.template_name(REQ1, "workers")}),
    )
    replayed = replay(snap, NOW)
    assert "adds 4 members to default/wl-old running 4" in replayed.message
    assert "0 of 4 members placeable" in replayed.message
    nothing_asked = replace_case(Case("", new_slice()))
    assert (
        slices.recorded_predecessor(
            Snapshot(
                workload=workload_of(nothing_asked.workload.build()),
                check=CHECK,
                config=parse_spec({}),
            )
        )
        is None
    )


def test_a_slice_past_its_last_attempt_scaled_back_to_what_runs_turns_ready_asking_nothing() -> (
    None
):
    """Kueue shrinks the pending slice in place (its spec; the admission keeps 8): the slice
    adds nothing now, so the check is Ready and the rolled-back request goes."""
    builder = new_slice()
    builder.obj["spec"]["podSets"][0]["count"] = 4
    case = Case(
        "",
        builder,
        config={"retryStrategy": {"backoffLimitCount": 0}},
        requests=[req(conditions={"Provisioned": ""}, annotations=ROLLED)],
    )
    d = run(case)
    assert d.check is not None and d.check.state == "Ready", d.check
    assert "adds 0 members" in d.check.message
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == [REQ1]


def slice_world(made: Any) -> Any:
    """What a diagnosis reads for a slice whose request `made` is in flight on one node."""
    from gangcheck.logic.attempt.explain import World

    check = admission_check(config="c")
    return World(
        admission_checks={CHECK: check},
        configs={"c": {"spec": {}}},
        flavors=GPU_FLAVOR,
        requests=(made,),
        nodes=(node("n1", gpu=3, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z"),),
    )


def test_gangcheck_status_shows_a_slices_relation_in_the_words_of_its_check_message() -> None:
    """The status row of a slice says what it adds to what runs, with the same function that
    writes the check message (slices.describe), before its fit; a Workload that is no slice
    says nothing of the kind."""
    from gangcheck.diagnose.reports import StatusReport
    from gangcheck.diagnose.text import render_text
    from gangcheck.logic.workloads.diagnosis import gang_row, gather

    made = req(
        conditions={"Provisioned": "ok"},
        annotations={
            slices.SLICE_ANNOTATION: json.dumps(
                {"replaces": OLD, "running": {"workers": 8}}, sort_keys=True
            ),
            "gangcheck.io/fulfillment-deadline": "2026-11-30T10:12:00Z",
        },
    )
    row = gang_row(gather(new_slice(12).build(), slice_world(made), now=NOW), NOW)
    said = slices.describe(workload_of(new_slice(12).build()), slices.Base(OLD, {"workers": 8}))
    assert said == "workload slice: adds 4 members to default/wl-old running 8"
    assert row.verdict.startswith(f"{said}; ")
    assert "3 of 4 members placeable" in row.verdict  # the fit as asked, not of 12
    assert said in render_text(StatusReport(None, (row,), NOW))

    whole = WorkloadBuilder("wl").pod_set("workers", 4).reserve_quota().check().build()
    plain = gang_row(gather(whole, slice_world(req()), now=NOW), NOW)
    assert "workload slice" not in plain.verdict


def test_a_diagnosis_fits_a_slice_by_its_ask_and_prints_the_relation_the_check_says() -> None:
    from gangcheck.logic.attempt.explain import World
    from gangcheck.logic.workloads.diagnosis import gather, verdict

    said = "workload slice: adds 4 members to default/wl-old running 4; waiting"
    workload = new_slice(message=said).build()
    made = req(
        conditions={"Provisioned": "ok"},
        annotations={
            slices.SLICE_ANNOTATION: BASE4,
            "gangcheck.io/fulfillment-deadline": "2026-11-30T10:12:00Z",
        },
    )
    check = admission_check(config="c")
    world = World(
        admission_checks={CHECK: check},
        configs={"c": {"spec": {}}},
        flavors=GPU_FLAVOR,
        requests=(made,),
        nodes=(node("n1", gpu=3, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z"),),
    )
    facts = gather(workload, world, now=NOW)
    assert "3 of 4 members placeable" in verdict(facts, NOW).line  # not "3 of 8"
    (ours,) = [c for c in facts.checks if c.name == CHECK]
    assert "adds 4 members to default/wl-old running 4" in ours.message


# ---- the added nodes held for the Job's pods after Ready --------------------------------

FIRST = "default/first-1"
HELD = {slices.SLICE_ANNOTATION: BASE4, "gangcheck.io/hold-as": FIRST}


def job_template() -> dict[str, Any]:
    """The Job's pod template after its first slice started, as Kueue copies it into every
    later slice: the first slice's consume annotation and hold toleration merged in."""
    template = pod_template(gpu=1, tolerations=[hold_toleration(FIRST)])
    template["metadata"] = {
        "annotations": {"autoscaling.x-k8s.io/consume-provisioning-request": "first-1"}
    }
    return template


def held_slice(count: int = 8, *, state: str = "Pending", **kw: Any) -> WorkloadBuilder:
    return (
        WorkloadBuilder("wl")
        .pod_set("workers", count, job_template())
        .annotation(slices.REPLACEMENT_FOR, OLD)
        .reserve_quota()
        .check(state=state, **kw)
    )


def added(n: int, node_name: str = "n2") -> list[dict[str, Any]]:
    """Added members, bound: they consume the first slice's request, as the Job's pods do."""
    pods = running(n, node_name)
    for i, p in enumerate(pods):
        p["metadata"]["name"] = f"job-added-{i}"
    return pods


def held_node() -> Any:
    return node(
        "n2",
        gpu=4,
        labels={"pool": "gpu"},
        created="2026-11-30T10:01:00Z",
        annotations={"gangcheck.io/arrived-for": f"default/{REQ1}"},
        taints=[hold_taint(FIRST)],
    )


def test_a_slice_of_a_job_whose_pods_tolerate_a_hold_records_it_on_its_request() -> None:
    d = run(Case("ask", held_slice()))
    (body,) = (a.body for a in d.actions if isinstance(a, CreateRequest))
    assert body["metadata"]["annotations"]["gangcheck.io/hold-as"] == FIRST
    assert slices.held_as(workload_of(held_slice().build())) == FIRST
    assert slices.held_as(workload_of(new_slice().build())) == ""  # no toleration: none


def test_a_template_whose_toleration_names_another_request_holds_as_none() -> None:
    template = job_template()
    template["spec"]["tolerations"] = [hold_toleration("default/other")]
    wl = WorkloadBuilder("wl").pod_set("workers", 8, template).build()
    assert slices.held_as(workload_of(wl)) == ""


def test_turning_ready_claims_the_added_node_held_as_the_jobs_pods_and_keeps_it_held() -> None:
    case = Case(
        "ready",
        held_slice(),
        requests=[req(conditions={"Provisioned": ""}, annotations=HELD)],
        nodes=[
            node("n1", gpu=4, labels={"pool": "gpu"}),
            node("n2", gpu=4, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z"),
        ],
        pods=running(4),
    )
    d = run(case)
    assert d.check is not None and d.check.state == "Ready"
    (claim,) = [a for a in d.actions if isinstance(a, ClaimNode)]
    assert (claim.name, claim.request, claim.hold) == ("n2", f"default/{REQ1}", FIRST)
    assert not [a for a in d.actions if isinstance(a, ReleaseHold)]
    marks = [
        a.annotations.get("gangcheck.io/phase") for a in d.actions if isinstance(a, AnnotateRequest)
    ]
    assert "Started" not in marks
    assert d.requeue_after is not None and d.requeue_after <= slices.MEMBERS_POLL_SECONDS
    # the podSetUpdates name the same hold (Kueue does not apply them to the running Job)
    assert d.check.pod_set_updates[0]["tolerations"] == [hold_toleration(FIRST)]


@pytest.mark.parametrize(
    ("scheduled", "now", "opened"),
    [
        (3, NOW, False),  # 7 of 8 scheduled, within the start deadline: held
        (4, NOW, True),  # every member scheduled: opened, started
        (3, NOW + timedelta(seconds=600), True),  # the start deadline passed since Ready
    ],
)
def test_after_ready_the_hold_is_kept_until_every_member_is_scheduled(
    scheduled: int, now: datetime, opened: bool
) -> None:
    case = Case(
        "after",
        held_slice(state="Ready", pod_set_updates=CONSUMES_REQ1),
        requests=[req(conditions={"Provisioned": ""}, annotations=HELD)],
        nodes=[node("n1", gpu=4, labels={"pool": "gpu"}), held_node()],
        pods=[*running(4), *added(scheduled)],
        now=now,
    )
    d = run(case)
    assert d.check is None
    released = [n for a in d.actions if isinstance(a, ReleaseHold) for n in a.nodes]
    starts = [a for a in d.actions if isinstance(a, AnnotateRequest)]
    assert (released == ["n2"], len(starts) == 1) == (opened, opened)
    if not opened:
        assert d.requeue_after is not None


def finished_as_replaced(b: WorkloadBuilder, by: str) -> WorkloadBuilder:
    b.condition("Finished", reason=slices.REPLACED_REASON)
    for c in b.obj["status"]["conditions"]:
        if c["type"] == "Finished":
            c["message"] = f"Replaced to accommodate a workload (UID: {by}, JobUID: j)"
    return b


def first_ran(count: int = 4) -> Any:
    """The Job's first slice, admitted, its members running; replaced by the pending one."""
    b = WorkloadBuilder("wl-first").pod_set("workers", count).reserve_quota().check(state="Ready")
    return finished_as_replaced(b.condition("Admitted"), "uid-wl-old").build()


def pending_slice(count: int = 8, *, of: str = "default/wl-first") -> Any:
    """A slice never admitted (its check was pending when the Job was scaled again),
    replaced by the new slice."""
    b = WorkloadBuilder("wl-old").pod_set("workers", count).reserve_quota().check()
    if of:
        b.annotation(slices.REPLACEMENT_FOR, of)
    return finished_as_replaced(b, "uid-wl").build()


def evicted(wl: Any) -> Any:
    """The Workload with Kueue's Evicted condition (reset to False at its next reservation)."""
    conds = wl["status"].setdefault("conditions", [])
    conds.append({"type": "Evicted", "status": "False", "reason": "QuotaReserved", "message": ""})
    return wl


@pytest.mark.parametrize(
    ("held", "running"),
    [
        ([first_ran(), pending_slice()], 4),
        ([pending_slice(of="")], 0),
        ([pending_slice()], "which is gone"),
        ([first_ran(), evicted(pending_slice())], 0),
    ],
    ids=[
        "4 -> 8 -> 12 with the 8 never admitted: adds 8 to the 4 the first slice runs",
        "the pending slice is no slice (the Job never ran): the whole 12 is asked",
        "the first slice gone: which members run cannot be told, nothing asked",
        "the pending slice was evicted while it waited (Kueue stopped the Job): the whole 12",
    ],
)
def test_a_slice_replacing_a_pending_slice_adds_to_what_the_first_runs(
    held: list[Any], running: int | str
) -> None:
    """The Job scaled again while its slice waited on the check: Kueue makes a new slice
    replacing the pending one (v0.17 EnsureWorkloadSlices: a scale-up of a slice with quota
    reserved makes a new slice). The members that run are the first slice's, not none."""
    store = {(w["metadata"]["name"], w["metadata"]["namespace"]): w for w in held}
    wl = workload_of(new_slice(12).build())
    pred = slices.predecessor_of(wl, lambda name, ns: store.get((name, ns)))
    assert pred is not None
    base = slices.base_of(wl, pred)
    if isinstance(running, str):
        assert isinstance(base, str) and running in base
        return
    assert isinstance(base, slices.Base) and base.replaces == OLD
    assert base.total == running
    snap = Snapshot(workload=wl, check=CHECK, config=parse_spec({}), flavors=GPU_FLAVOR)
    created = [a for a in slices.decide(snap, NOW, predecessor=pred).actions]
    (body,) = (a.body for a in created if isinstance(a, CreateRequest))
    assert [p["count"] for p in body["spec"]["podSets"]] == [12 - running]


def test_a_chain_of_pending_slices_is_followed_only_so_far() -> None:
    """Slices that name each other in a loop (by hand) end the walk, not the controller."""
    loop = pending_slice(of="default/wl-old")
    wl = workload_of(new_slice(12).build())
    pred = slices.predecessor_of(wl, lambda name, ns: loop)
    assert pred is not None
    base = slices.base_of(wl, pred)
    assert isinstance(base, str) and "cannot be told" in base


def stopped_slice(**kw: Any) -> WorkloadBuilder:
    """The slice evicted once and admitted again (Kueue stopped the Job meanwhile)."""
    return held_slice(**kw).condition("Evicted", "False", "QuotaReserved")


def test_a_slice_ready_after_an_eviction_gives_updates_kueue_can_start_the_job_with() -> None:
    """Kueue v0.17 starts the stopped Job with the check's podSetUpdates merged into the
    template and refuses a key the two give different values (the Workload then finishes,
    FailedToStart): the Ready slice's updates keep the template's consume annotation (not
    its own request's), with the hold toleration the template has; the request is still
    followed (held until the members are scheduled)."""
    base = json.dumps({"replaces": OLD, "running": {}}, sort_keys=True)
    annotations = {slices.SLICE_ANNOTATION: base, "gangcheck.io/hold-as": FIRST}
    case = Case(
        "",
        stopped_slice(),
        requests=[req(count=8, conditions={"Provisioned": ""}, annotations=annotations)],
        nodes=[
            node("n2", gpu=8, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z"),
        ],
    )
    d = run(case)
    assert d.check is not None and d.check.state == "Ready", d.check
    template = job_template()
    for update in d.check.pod_set_updates:
        for key, value in (update.get("annotations") or {}).items():
            assert template["metadata"]["annotations"].get(key, value) == value, update
    assert [a.name for a in d.actions if isinstance(a, ClaimNode)] == ["n2"]

    # the next look, with the updates as written: the request found, its hold kept while
    # the members are not scheduled
    later = run(
        replace_case(
            case,
            workload=stopped_slice(state="Ready", pod_set_updates=list(d.check.pod_set_updates)),
        )
    )
    assert later.check is None and later.requeue_after is not None


def test_a_running_slices_updates_are_left_as_the_check_writes_them() -> None:
    """Without an eviction Kueue never applies a slice's updates to the running Job: they
    name the slice's own request (what the check consumes), as before."""
    case = Case(
        "",
        new_slice(),
        requests=[
            req(conditions={"Provisioned": ""}, annotations={slices.SLICE_ANNOTATION: BASE4})
        ],
        nodes=[
            node("n1", gpu=4, labels={"pool": "gpu"}),
            node("n2", gpu=4, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z"),
        ],
        pods=running(4),
    )
    d = run(case)
    assert d.check is not None and d.check.state == "Ready"
    names = {
        (u.get("annotations") or {}).get("autoscaling.x-k8s.io/consume-provisioning-request")
        for u in d.check.pod_set_updates
    }
    assert names == {REQ1}


def test_a_ready_slice_withdraws_a_racer_left_behind() -> None:
    """A slice's race won: Ready is written before the losers are withdrawn (flow.won), so
    a loser whose withdrawal met a change, or a restart between the two, is left behind;
    the Ready slice withdraws it after, as a whole gang's check does, the winner kept."""
    race = {
        "capacitySources": [
            {"name": "a", "nodeSelector": {"pool": "gpu"}},
            {"name": "b", "nodeSelector": {"pool": "b"}},
        ],
        "capacitySourcePolicy": "Race",
    }
    loser = naming.request_name("wl", CHECK, 1, 1)
    lost = req(loser, annotations={**HELD, "gangcheck.io/capacity-source": "1"})
    case = Case(
        "left behind",
        held_slice(state="Ready", pod_set_updates=CONSUMES_REQ1),
        requests=[req(conditions={"Provisioned": ""}, annotations=HELD), lost],
        nodes=[node("n1", gpu=4, labels={"pool": "gpu"}), held_node()],
        pods=[*running(4), *added(3)],
        config=race,
    )
    d = run(case)
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == [loser]


def test_a_ready_slices_request_deleted_by_hand_has_the_hold_it_left_lifted() -> None:
    """A Ready slice's request deleted outside gangcheck before its members were all
    scheduled: the node that arrived for it is recorded for it and held as the Job's pods
    (`HOLD_AS`); with the request gone nothing (Started, a rollback, the slice's end) would
    lift that hold, so the node stayed closed to every pod but the Job's for ever, nothing
    said. Lifted as a whole gang's is (once the API server confirms the request gone), said
    by a HoldLifted Warning Event; nothing asked again, nothing reclaimed, the check kept."""
    case = Case(
        "gone after ready",
        held_slice(state="Ready", pod_set_updates=CONSUMES_REQ1),
        nodes=[node("n1", gpu=4, labels={"pool": "gpu"}), held_node()],
        pods=[*running(4), *added(3)],
    )
    _lifts_the_hold_of_req1_on_n2(run(case))


def test_a_slice_ready_after_an_eviction_whose_request_is_deleted_by_hand_lifts_its_hold() -> None:
    """A slice evicted and admitted again is Ready with podSetUpdates that keep the Job's
    own consume annotation (`compatible`): they name no request of the slice. Its request
    deleted outside gangcheck after Ready left no record naming it either, so the node that
    arrived for it stayed held as the Job's pods for ever, nothing said. The nodes recorded
    as arrived for a request of this slice (its names) that is gone are the record: the hold
    lifted (once the API server confirms the request gone), HoldLifted Warning Event;
    nothing asked again, nothing reclaimed, the check kept."""
    compatible = [{"name": "workers"}]  # the consume annotation kept from the Job's template
    other = node(
        "n3",
        gpu=4,
        labels={"pool": "gpu"},
        annotations={"gangcheck.io/arrived-for": "default/other-atomic-1"},
        taints=[hold_taint("default/other-atomic-1")],
    )
    case = Case(
        "gone after ready, evicted once",
        stopped_slice(state="Ready", pod_set_updates=compatible),
        nodes=[node("n1", gpu=4, labels={"pool": "gpu"}), held_node(), other],
        pods=added(3),
    )
    _lifts_the_hold_of_req1_on_n2(run(case))


def test_a_slice_rolled_back_and_asked_again_is_said_in_a_normal_event() -> None:
    """As a gang's RolledBack (rollback.rolled_back): retried on backoff is the designed path."""
    (case,) = [c for c in CASES if c.id.startswith("rolled back past the deadline: Pending")]
    (event,) = [e for e in run(case).events if e.reason == "SliceRolledBack"]
    assert not event.warning


def _lifts_the_hold_of_req1_on_n2(d: Decision) -> None:
    """The check kept, the hold on n2 lifted once REQ1 is confirmed gone, said in a
    HoldLifted Warning; nothing asked again, nothing reclaimed."""
    assert d.check is None
    assert [a for a in d.actions if isinstance(a, ReleaseHold)] == [ReleaseHold(("n2",), gone=REQ1)]
    assert not [a for a in d.actions if isinstance(a, (CreateRequest, ReclaimArrivals))]
    (event,) = d.events
    assert (event.reason, event.warning) == ("HoldLifted", True)
    assert REQ1 in event.message and "n2" in event.message


def scaled_down_in_place(b: WorkloadBuilder, now: int) -> WorkloadBuilder:
    """The Workload as Kueue v0.17 leaves an admitted one when its Job is scaled down
    (EnsureWorkloadSlices: ApplyPodSetCounts, a plain Update): the spec's count lowered, the
    admission's podSetAssignments count left as admitted."""
    b.obj["spec"]["podSets"][0]["count"] = now
    return b


def test_a_slice_replacing_one_scaled_down_after_its_admission_adds_to_what_runs_now() -> None:
    """4 -> 8 (admitted) -> 6 (in place) -> 10: the members that run are the 6 the Job keeps
    (Kueue's quota counts the lower of the two too: workload.totalRequestsFromAdmission), so
    the new slice asks for 4, not for the 2 beyond the 8 its predecessor was admitted with."""
    old = WorkloadBuilder("wl-old").pod_set("workers", 8).reserve_quota().check(state="Ready")
    old = finished_as_replaced(scaled_down_in_place(old.condition("Admitted"), 6), "uid-wl")
    case = Case(
        "",
        new_slice(10),
        predecessor=old.build(),
        state="Pending",
        message=("adds 4 members to default/wl-old running 6", "for 4 pods"),
        asked=4,
    )
    test_slice(case)


@pytest.mark.parametrize(("now", "added_bound"), [(6, 2), (4, 0)])
def test_a_ready_slice_scaled_down_in_place_opens_its_nodes_once_the_members_left_run(
    now: int, added_bound: int
) -> None:
    """A Ready slice (8, its added nodes held for the Job's pods) scaled down in place to 6
    or back to 4 before its members all ran: its members are the Job's count now, not the 8
    its admission still says; once those run, the hold is lifted and the attempt started
    (not kept closed until the start deadline)."""
    case = Case(
        "after",
        scaled_down_in_place(held_slice(state="Ready", pod_set_updates=CONSUMES_REQ1), now),
        requests=[req(conditions={"Provisioned": ""}, annotations=HELD)],
        nodes=[node("n1", gpu=4, labels={"pool": "gpu"}), held_node()],
        pods=[*running(4), *added(added_bound)],
    )
    d = run(case)
    assert d.check is None
    assert [n for a in d.actions if isinstance(a, ReleaseHold) for n in a.nodes] == ["n2"]
    marks = [a.annotations for a in d.actions if isinstance(a, AnnotateRequest)]
    assert marks == [{"gangcheck.io/phase": "Started"}]


def test_a_slice_in_its_backoff_replaced_by_a_newer_one_is_withdrawn_without_a_second_reclaim() -> (
    None
):
    """4 -> 8, the 8's attempt rolled back (its node reclaimed, the request kept as the
    record while the slice waits out its backoff, Pending), then the Job scaled to 12: the 8,
    finished as replaced, has that request deleted and nothing reclaimed again; the 12 asks
    at once (its own attempt 1, not after the 8's backoff) for the 8 beyond the 4 that run."""
    waiting = finished_as_replaced(
        new_slice(message="workload slice: adds 4 members to default/wl-old running 4; x"),
        "uid-newer",
    )
    gone_node = node(
        "n2",
        gpu=4,
        labels={"pool": "gpu"},
        created="2026-11-30T10:01:00Z",
        annotations={"gangcheck.io/arrived-for": f"default/{REQ1}"},
    )
    d = run(
        Case(
            "",
            waiting,
            requests=[req(conditions={"Provisioned": ""}, annotations=ROLLED)],
            nodes=[node("n1", gpu=4, labels={"pool": "gpu"}), gone_node],
            pods=running(4),
        )
    )
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == [REQ1]
    assert not [a for a in d.actions if isinstance(a, (ReclaimArrivals, CreateRequest))]
    assert not [a for a in d.actions if isinstance(a, AnnotateRequest)]

    store = {
        ("wl-old", "default"): finished_as_replaced(
            WorkloadBuilder("wl-old")
            .pod_set("workers", 8)
            .annotation(slices.REPLACEMENT_FOR, "default/wl-first")
            .reserve_quota()
            .check(),
            "uid-wl",
        ).build(),
        ("wl-first", "default"): first_ran(),
    }
    newer = workload_of(new_slice(12).build())
    pred = slices.predecessor_of(newer, lambda name, ns: store.get((name, ns)))
    assert pred is not None
    snap = Snapshot(workload=newer, check=CHECK, config=parse_spec({}), flavors=GPU_FLAVOR)
    (body,) = (
        a.body
        for a in slices.decide(snap, NOW, predecessor=pred).actions
        if isinstance(a, CreateRequest)
    )
    assert body["metadata"]["name"] == REQ1  # the newer slice's own first attempt
    assert [p["count"] for p in body["spec"]["podSets"]] == [8]
