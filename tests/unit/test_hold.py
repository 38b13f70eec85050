"""The hold on a gang's arrived nodes: its taint and toleration, and when decisions take it
and lift it (admission check and PodGroups alike)."""

from __future__ import annotations

from typing import Any

import pytest

from gangcheck.logic.attempt.actions import (
    AnnotateRequest,
    ClaimNode,
    DeleteRequest,
    ReleaseHold,
    ReleaseMembers,
)
from gangcheck.logic.attempt.arrivals import arrival_verdict
from gangcheck.logic.attempt.fulfillment import ClusterView, Waiting, assess, unrecorded_arrivals
from gangcheck.logic.attempt.hold import (
    ARRIVING_TAINT,
    HOLD_TAINT,
    held_nodes,
    hold_taint,
    hold_toleration,
    hold_value,
    taints_holding,
    taints_released,
    with_hold_toleration,
)
from gangcheck.logic.placement.taints import taint_of, toleration_of
from gangcheck.model.objects import request_of
from tests.builders import node, pod_template
from tests.unit import test_podgroup_decide as pg
from tests.unit.test_admission_decide import (
    FULFILLED,
    MINE,
    NOW,
    OUTCOME,
    REQ1,
    ROLLING,
    Case,
    WorkloadBuilder,
    admitted,
    gang,
    member,
    req,
    run,
)

KEY = f"default/{REQ1}"
OTHER = {"key": "example.com/dedicated", "value": "gpu", "effect": "NoSchedule"}
HELD_BY_ME = hold_taint(KEY)
HELD_BY_OTHER = hold_taint("default/other-1")
STARTED = {"gangcheck.io/phase": "Started"}


@pytest.mark.parametrize(
    "name",
    ["a", "x" * 253, "ns/" + "w." * 120, "default/" + "-" * 60],
    ids=["short", "longest name", "dots", "dashes"],
)
def test_the_hold_value_is_a_valid_label_value_of_fixed_length(name: str) -> None:
    value = hold_value(name)
    assert len(value) <= 63 and value[0].isalnum() and value[-1].isalnum()
    assert value.replace("-", "").replace("_", "").replace(".", "").isalnum()
    assert value != hold_value(name + "x")


def test_the_gangs_toleration_tolerates_its_hold_and_no_other() -> None:
    toleration = toleration_of(hold_toleration(KEY))
    assert toleration.tolerates(taint_of(HELD_BY_ME))
    assert not toleration.tolerates(taint_of(HELD_BY_OTHER))


@pytest.mark.parametrize(
    ("taints", "holding", "released"),
    [
        ([], [HELD_BY_ME], []),
        ([OTHER], [OTHER, HELD_BY_ME], [OTHER]),
        ([HELD_BY_OTHER, OTHER], [OTHER, HELD_BY_ME], [OTHER]),
        ([OTHER, HELD_BY_ME], [OTHER, HELD_BY_ME], [OTHER]),
    ],
    ids=[
        "an untainted node gets the hold",
        "another controller's taint is kept, in place",
        "one hold at a time: the node's record names one request",
        "holding twice changes nothing",
    ],
)
def test_taking_and_lifting_the_hold_touches_only_the_hold(
    taints: list[Any], holding: list[Any], released: list[Any]
) -> None:
    n = node("n1", taints=taints)
    assert taints_holding(n, KEY) == holding
    assert taints_released(n) == released


def test_held_nodes_names_only_the_asked_nodes_that_are_held() -> None:
    nodes = [node("n1", taints=[HELD_BY_ME]), node("n2"), node("n3", taints=[HELD_BY_OTHER])]
    assert held_nodes(nodes, ["n1", "n2"]) == ("n1",)


def test_a_pod_gets_the_toleration_once() -> None:
    once = with_hold_toleration([OTHER], KEY)
    assert with_hold_toleration(once, KEY) == once == [OTHER, hold_toleration(KEY)]


def test_a_node_held_for_another_request_does_not_serve_this_gang() -> None:
    gpu = {"pool": "gpu"}
    mine = request_of(req(conditions={"Provisioned": ""}))
    gang_sets = [("workers", 1, pod_template(gpu=8, node_selector=gpu))]
    theirs = node("n1", labels=gpu, taints=[HELD_BY_OTHER], created="2026-11-30T10:01:00Z")
    assert not assess(ClusterView(nodes=(theirs,)), mine, gang_sets).fits
    recorded = node(
        "n1", labels=gpu, taints=[HELD_BY_ME], annotations=MINE, created="2026-11-30T10:01:00Z"
    )
    assert assess(ClusterView(nodes=(recorded,)), mine, gang_sets).fits


# ---- decisions -----------------------------------------------------------------------


CASES = [
    Case(
        "a gang fitting on its held nodes is Ready; each pod set tolerates the hold",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[
            node(
                f"n{i}",
                gpu=2,
                labels={"pool": "gpu"},
                taints=[HELD_BY_ME],
                annotations=MINE,
                created="2026-11-30T10:01:00Z",
            )
            for i in (1, 2)
        ],
        state="Ready",
        consume_pod_sets=("workers",),
        annotates=(FULFILLED,),
    ),
    Case(
        "every member scheduled: the hold is lifted, then the attempt is marked started",
        admitted(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[node("n1", taints=[HELD_BY_ME], annotations=MINE)],
        pods=[member(f"p{i}", bound=True) for i in range(4)],
        annotates=({"gangcheck.io/phase": "Started"},),
    ),
    Case(
        "started, with a hold left by a restart in between: lifted",
        admitted(),
        config={},
        requests=[
            req(conditions={"Provisioned": ""}, annotations={"gangcheck.io/phase": "Started"})
        ],
        nodes=[node("n1", taints=[HELD_BY_ME], annotations=MINE)],
        pods=[member(f"p{i}", bound=True) for i in range(4)],
    ),
    Case(
        "ready but not yet admitted: the hold stays",
        WorkloadBuilder().pod_set("workers", 4).reserve_quota().check(state="Ready"),
        config={},
        requests=[req(conditions={"Provisioned": ""}, annotations=FULFILLED)],
        nodes=[node("n1", taints=[HELD_BY_ME], annotations=MINE)],
    ),
    Case(
        "rolled back: the hold is lifted from what was kept before the request goes",
        WorkloadBuilder().pod_set("workers", 4).reserve_quota().check(state="Retry"),
        config={},
        requests=[
            req(
                conditions={"Failed": "x"}, annotations={**ROLLING, "gangcheck.io/outcome": OUTCOME}
            )
        ],
        nodes=[node("n1", taints=[HELD_BY_ME], annotations=MINE)],
        deletes=(REQ1,),
    ),
]

RELEASES = {
    CASES[0].id: (),
    CASES[1].id: ("n1",),
    CASES[2].id: ("n1",),
    CASES[3].id: (),
    CASES[4].id: ("n1",),
}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide_takes_and_lifts_the_hold(case: Case) -> None:
    d = run(case)
    released = [a for a in d.actions if isinstance(a, ReleaseHold)]
    assert [n for a in released for n in a.nodes] == list(RELEASES[case.id])
    if released:
        # Lifted before the attempt is marked started or its request deleted.
        later = [
            i for i, a in enumerate(d.actions) if isinstance(a, AnnotateRequest | DeleteRequest)
        ]
        assert all(d.actions.index(released[0]) < i for i in later)
    if case.state == "Ready":
        assert d.check is not None
        for update in d.check.pod_set_updates:
            assert update["tolerations"] == [hold_toleration(KEY)]
    assert not [a for a in d.actions if isinstance(a, ClaimNode)]


def test_trusting_provisioned_adds_no_toleration() -> None:
    d = run(
        Case(
            "",
            gang(),
            config={"fulfillment": {"mode": "TrustProvisioned"}},
            requests=[req(conditions={"Provisioned": ""})],
        )
    )
    assert d.check is not None
    assert all("tolerations" not in u for u in d.check.pod_set_updates)
    assert HOLD_TAINT not in str(d.actions)


# ---- PodGroups -------------------------------------------------------------------------


PG_KEY = f"default/{pg.REQ1}"
PG_MINE = {"gangcheck.io/arrived-for": PG_KEY}


def test_podgroup_members_released_onto_a_request_tolerate_its_hold() -> None:
    held = node("n1", gpu=3, taints=[hold_taint(PG_KEY)], annotations=PG_MINE)
    case = pg.Case(
        "",
        pg.group(3, annotations={"gangcheck.io/state": "Provisioning"}),
        pg.members(3),
        requests=[pg.req(conditions={"Provisioned": "ok"})],
        nodes=[held],
    )
    (release,) = [a for a in pg._decide(case).actions if isinstance(a, ReleaseMembers)]
    assert release.pods == ("m0", "m1", "m2")
    assert release.tolerations == (hold_toleration(PG_KEY),)


def test_a_podgroup_gang_fitting_on_free_nodes_gets_no_toleration() -> None:
    case = pg.Case("", pg.group(3), pg.members(3), nodes=[node("n1", gpu=3)])
    (release,) = [a for a in pg._decide(case).actions if isinstance(a, ReleaseMembers)]
    assert release.tolerations == ()


def test_a_started_podgroup_gang_lifts_the_hold_before_marking_the_request() -> None:
    released = {"gangcheck.io/state": "Released", "gangcheck.io/request": pg.REQ1}
    case = pg.Case(
        "",
        pg.group(2, annotations=released),
        pg.members(2, gated=False, node_name="n1"),
        requests=[pg.req(conditions={"Provisioned": "ok"}, count=2)],
        nodes=[node("n1", taints=[hold_taint(PG_KEY)], annotations=PG_MINE)],
    )
    actions = pg._decide(case).actions
    assert [type(a) for a in actions] == [ReleaseHold, AnnotateRequest]
    assert actions[0] == ReleaseHold(("n1",))


# ---- nodes that register closed ----------------------------------------------------------

ARRIVING = {"key": ARRIVING_TAINT, "value": "true", "effect": "NoSchedule"}
GPU_POOL = {"pool": "gpu"}
NEW = "2026-11-30T10:04:50Z"
NOW_TEXT = "2026-11-30T10:05:00Z"  # younger than the request (10:00), 10 s before NOW


def test_a_closed_node_that_arrived_for_the_request_is_recorded_and_opened_for_it() -> None:
    mine = request_of(req(conditions={"Provisioned": ""}))
    tolerates = [{"key": OTHER["key"], "operator": "Exists", "effect": "NoSchedule"}]
    template = pod_template(gpu=8, node_selector=GPU_POOL, tolerations=tolerates)
    closed = node("n1", labels=GPU_POOL, taints=[ARRIVING, OTHER], created=NEW)
    verdict = assess(ClusterView(nodes=(closed,)), mine, [("workers", 1, template)])
    assert verdict.fits and verdict.claims == (("n1", "7"),)  # counted as it is recorded
    assert taints_holding(closed, KEY) == [OTHER, HELD_BY_ME]
    # a taint the gang does not tolerate: the node can take no member, so it is not recorded
    untolerated = assess(ClusterView(nodes=(closed,)), mine, [("workers", 1, pod_template(gpu=8))])
    assert untolerated.claims == () and not untolerated.fits
    assert f"taint {OTHER['key']}" in untolerated.summary  # the one line says why


def test_an_arrival_not_ready_yet_is_recorded_once_ready_and_the_next_left_for_others() -> None:
    """A gang of one member whose own arrival is not Ready yet takes the next arrival (perhaps
    another gang's) only if that one is usable: never both."""
    mine = request_of(req(conditions={"Provisioned": ""}))
    gang_sets = [("workers", 1, pod_template(gpu=8, node_selector=GPU_POOL))]
    booting = node("n1", labels=GPU_POOL, taints=[ARRIVING], created=NEW, ready=False)
    ready = node("n2", labels=GPU_POOL, taints=[ARRIVING], created=NOW_TEXT)
    verdict = assess(ClusterView(nodes=(booting, ready)), mine, gang_sets)
    assert verdict.claims == (("n2", "7"),)
    waiting = assess(ClusterView(nodes=(booting,)), mine, gang_sets)
    assert not waiting.fits and waiting.claims == ()
    assert unrecorded_arrivals(ClusterView(nodes=(booting,)), mine, gang_sets) == (("n1", "7"),)
    # Ready, but its not-ready taint not lifted yet (the node lifecycle controller lifts it a
    # moment later): it can take no member yet, so it is not recorded yet either
    not_ready = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    tainted = node("n1", labels=GPU_POOL, taints=[ARRIVING, not_ready], created=NEW)
    verdict = assess(ClusterView(nodes=(tainted, ready)), mine, gang_sets)
    assert verdict.claims == (("n2", "7"),)


@pytest.mark.parametrize("gpus_taken", [8, 4], ids=["full", "half"])
def test_an_arrival_already_taken_by_another_pod_is_not_recorded_the_next_is(
    gpus_taken: int,
) -> None:
    """An arrival opened (by the backstop, say) and taken by someone else's pod can take no
    member of an 8-GPU gang: recording it would take it from nobody and claim the next
    arrival, perhaps another gang's, besides. Only the arrival that takes a member is recorded."""
    mine = request_of(req(conditions={"Provisioned": ""}))
    gang_sets = [("workers", 1, pod_template(gpu=8, node_selector=GPU_POOL))]
    taken = node("n1", labels=GPU_POOL, created=NEW)
    free = node("n2", labels=GPU_POOL, taints=[ARRIVING], created=NOW_TEXT)
    others = {
        "metadata": {"namespace": "other", "name": "p"},
        "spec": {"nodeName": "n1", **pod_template(gpu=gpus_taken)["spec"]},
        "status": {"phase": "Running"},
    }
    verdict = assess(ClusterView(nodes=(taken, free), pods=(others,)), mine, gang_sets)
    assert verdict.claims == (("n2", "7"),)
    alone = assess(ClusterView(nodes=(taken,), pods=(others,)), mine, gang_sets)
    assert not alone.fits and alone.claims == ()
    assert "nvidia.com/gpu" in alone.summary, alone.summary


def test_an_arrival_held_for_another_request_is_never_this_ones_to_record() -> None:
    """A node that registered held for another gang (a Karpenter node of its NodeClaim) but
    carries no record yet: neither a waiting gang nor a rollback or an abandoned attempt of
    another request may record it (recorded for them, it would be reclaimed from its gang)."""
    mine = request_of(req(conditions={"Provisioned": ""}))
    held = {**HELD_BY_OTHER}
    tolerates = [{"key": HOLD_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    gang_sets = [("workers", 1, pod_template(gpu=8, node_selector=GPU_POOL, tolerations=tolerates))]
    theirs = node("n1", labels=GPU_POOL, taints=[held], created=NEW)
    assert assess(ClusterView(nodes=(theirs,)), mine, gang_sets).claims == ()
    assert unrecorded_arrivals(ClusterView(nodes=(theirs,)), mine, gang_sets) == ()
    ours = node("n1", labels=GPU_POOL, taints=[HELD_BY_ME], created=NEW)
    assert unrecorded_arrivals(ClusterView(nodes=(ours,)), mine, gang_sets) == (("n1", "7"),)


def test_a_closed_node_older_than_the_request_is_not_counted() -> None:
    mine = request_of(req(conditions={"Provisioned": ""}))
    gang_sets = [("workers", 1, pod_template(gpu=8, node_selector=GPU_POOL))]
    closed = node("n1", labels=GPU_POOL, taints=[ARRIVING], created="2026-11-30T09:00:00Z")
    verdict = assess(ClusterView(nodes=(closed,)), mine, gang_sets)
    assert not verdict.fits and verdict.claims == ()


BEFORE = "2026-11-30T10:00:00Z"
WANTS_GPU = Waiting(
    "default/wants-gpu-1", (pod_template(gpu=8, node_selector=GPU_POOL),), created=BEFORE
)
WANTS_CPU = Waiting(
    "default/wants-cpu-1", (pod_template(cpu="2", node_selector={"pool": "cpu"}),), created=BEFORE
)
WANTS_GPU_LATER = Waiting(
    "default/later-1", (pod_template(gpu=8, node_selector=GPU_POOL),), created=NOW_TEXT
)


def closed_node(*, taints: Any = (ARRIVING,), annotations: Any = None, created: str = NEW) -> Any:
    return node(
        "n1", labels=GPU_POOL, taints=list(taints), annotations=annotations, created=created
    )


@pytest.mark.parametrize(
    ("n", "waiting", "opens", "why"),
    [
        (closed_node(taints=()), (), False, "not closed"),
        (closed_node(), (WANTS_GPU,), False, "kept for default/wants-gpu-1"),
        (closed_node(), (WANTS_CPU,), True, "no gang waiting for capacity could use it"),
        (closed_node(), (), True, "no gang waiting for capacity could use it"),
        (closed_node(), (WANTS_GPU_LATER,), True, "no gang waiting for capacity could use it"),
        (closed_node(created="2026-11-30T10:00:00Z"), (WANTS_GPU,), True, "within 120s"),
        (closed_node(annotations=MINE), (WANTS_GPU,), True, f"recorded for {KEY}"),
    ],
    ids=[
        "an open node is left alone",
        "a node a waiting gang could use stays closed for it",
        "a node no waiting gang could use is opened",
        "with nobody waiting, a node is opened",
        "a node older than the waiting request did not come for it: opened",
        "a node closed past the backstop is opened, wanted or not",
        "a recorded node still closed is opened",
    ],
)
def test_when_a_closed_node_is_opened(
    n: Any, waiting: tuple[Waiting, ...], opens: bool, why: str
) -> None:
    verdict = arrival_verdict(n, waiting, now=NOW, open_after_seconds=120)
    assert verdict.open is opens
    assert why in verdict.reason
    if why.startswith("kept"):
        assert verdict.recheck_after == 110.0


@pytest.mark.parametrize("going", ["its own deletion", "its NodeClaim's"])
def test_a_node_being_deleted_is_never_an_arrival_to_record(going: str) -> None:
    """A node going (being deleted, or its Karpenter NodeClaim: gangcheck's own reclaim of
    it for an earlier request, whose hold it no longer carries; a scale-down) came for no
    request still waiting: neither recorded nor counted as an arrival, and a rollback or an
    abandoned attempt does not record it as its own to reclaim again. The fit says why it
    takes no member."""
    mine = request_of(req(conditions={"Provisioned": ""}))
    gang_sets = [("workers", 1, pod_template(gpu=8, node_selector=GPU_POOL))]
    going_node = node("n1", labels=GPU_POOL, created=NEW)
    claims: tuple[dict[str, Any], ...] = ()
    if going == "its own deletion":
        going_node["metadata"]["deletionTimestamp"] = NOW_TEXT
    else:
        claims = (
            {
                "apiVersion": "karpenter.sh/v1",
                "kind": "NodeClaim",
                "metadata": {"name": "c1", "deletionTimestamp": NOW_TEXT},
                "status": {"nodeName": "n1"},
            },
        )
    capacity = ClusterView(nodes=(going_node,), node_claims=claims)
    verdict = assess(capacity, mine, gang_sets)
    assert not verdict.fits and verdict.claims == () and verdict.arrivals == 0
    assert "being deleted" in verdict.summary, verdict.summary
    assert unrecorded_arrivals(capacity, mine, gang_sets) == ()
