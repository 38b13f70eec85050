"""A gang gone while its source's promise is open (lifecycle.promise): its request is kept, what
arrived reclaimed, and what arrives later recorded and reclaimed, until the promise closes
(lifecycle.reclaim_promised, rollback.reclaim_late). Pure logic, by table."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from gangcheck.logic.attempt import lifecycle
from gangcheck.logic.attempt.actions import AnnotateRequest, ClaimNode, ReclaimArrivals
from gangcheck.logic.attempt.fulfillment import ClusterView, Waiting, assess
from gangcheck.logic.attempt.records import Outcome
from gangcheck.logic.sources.provreq import status_of
from gangcheck.logic.sources.waiting import waiting_of
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.objects import ProvisioningRequest, request_of
from gangcheck.model.provisioning_config import parse_spec
from tests.builders import T0, node, pod_template, provisioning_request

REQ = "wl-atomic-1"
KEY = f"default/{REQ}"
START = parse_time(T0)
assert START is not None
DEADLINE = "2026-11-30T10:10:00Z"  # T0 + 600 s
BEFORE = START + timedelta(seconds=300)
AFTER = START + timedelta(seconds=601)
DL = "gangcheck.io/fulfillment-deadline"
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"


@dataclass(frozen=True)
class Case:
    id: str
    open: bool
    conditions: dict[str, str] = field(default_factory=lambda: {"Provisioned": ""})
    annotations: dict[str, str] = field(default_factory=lambda: {DL: DEADLINE})
    class_name: str = ATOMIC
    at: datetime = BEFORE
    deleting: bool = False


CASES = [
    Case("Provisioned, open, before its deadline: the promise is open", open=True),
    Case("GKE's queued provisioning, Provisioned: open too", open=True,
         class_name="queued-provisioning.gke.io"),
    Case("at its deadline: closed", open=False, at=START + timedelta(seconds=600)),
    Case("past its deadline: closed", open=False, at=AFTER),
    Case("not Provisioned: deleting it stops the scale-up", open=False, conditions={}),
    Case("only Accepted: as not Provisioned", open=False, conditions={"Accepted": ""}),
    Case("Failed: nothing more comes", open=False,
         conditions={"Provisioned": "", "Failed": "out of stock"}),
    Case("CapacityRevoked: nothing more comes", open=False,
         conditions={"Provisioned": "", "CapacityRevoked": ""}),
    Case("fulfilled: the gang had all it asked", open=False,
         annotations={DL: DEADLINE, "gangcheck.io/phase": "Fulfilled"}),
    Case("started: its nodes were the gang's", open=False,
         annotations={DL: DEADLINE, "gangcheck.io/phase": "Started"}),
    Case("rolling back (a rollback-retry): as now", open=False,
         annotations={DL: DEADLINE, "gangcheck.io/phase": "RollingBack"}),
    Case("kept (its source stopped short): claims no new node", open=False,
         annotations={DL: DEADLINE, "gangcheck.io/phase": "Kept"}),
    Case("no deadline recorded (removed by hand): closed, never kept for ever", open=False,
         annotations={}),
    Case("an unreadable deadline: closed", open=False,
         annotations={"gangcheck.io/fulfillment-deadline": "soon"}),
    Case("Karpenter's class: deleting its NodeClaims takes the nodes back", open=False,
         class_name="karpenter.gangcheck.io"),
    Case("check-capacity: it scales nothing up", open=False,
         class_name="check-capacity.autoscaling.x-k8s.io"),
    Case("being deleted already: closed", open=False, deleting=True),
    Case("a kept withdrawal that reclaimed some already: still open", open=True,
         annotations={DL: DEADLINE,
                      "gangcheck.io/outcome": '{"reclaimed": ["n0"]}'}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_promise(case: Case) -> None:
    obj = provisioning_request(
        REQ, conditions=case.conditions, annotations=case.annotations, class_name=case.class_name
    )
    if case.deleting:
        obj["metadata"]["deletionTimestamp"] = T0
    req = request_of(obj)
    promise = lifecycle.promise(req, status_of(req), req.class_name, case.at)
    assert promise.open is case.open, promise.why
    assert promise.why
    if case.open:
        assert promise.until == parse_time(DEADLINE)
        assert lifecycle.until_closed(promise, BEFORE) == pytest.approx(300.0, abs=1.0)
        assert lifecycle.until_closed(promise, AFTER) == lifecycle.ROLLBACK_REQUEUE_SECONDS
    else:
        assert promise.until is None


# ---- what a pass does while the promise is open ------------------------------------------

ARRIVED = {"gangcheck.io/arrived-for": KEY}
POOL = {"pool": "gpu"}
LATER = "2026-11-30T10:01:00Z"  # younger than the request (T0)
OUTCOME = "gangcheck.io/outcome"


def _pass(
    *,
    recorded: tuple[str, ...] = (),
    unrecorded: tuple[str, ...] = (),
    outcome: str | None = None,
    another_waits: bool = False,
    another_gone: bool = False,
    with_templates: bool = True,
) -> tuple[object, ...]:
    annotations = {DL: DEADLINE}
    if outcome is not None:
        annotations[OUTCOME] = outcome
    req = request_of(
        provisioning_request(REQ, conditions={"Provisioned": ""}, annotations=annotations)
    )
    nodes = (
        *(node(n, gpu=8, labels=POOL, created=LATER, annotations=ARRIVED) for n in recorded),
        *(node(n, gpu=8, labels=POOL, created=LATER) for n in unrecorded),
        node("n-elsewhere", gpu=8, labels={"pool": "cpu"}, created=LATER),
    )
    template = {"spec": pod_template(gpu=8, node_selector=POOL)["spec"]}
    waiting = [Waiting(KEY, (template,) if with_templates else (), T0)]
    if another_waits:
        waiting.insert(0, Waiting("default/other-atomic-1", (template,), T0, gone=another_gone))
    capacity = ClusterView(
        nodes=nodes, in_flight=frozenset(w.key for w in waiting), waiting=tuple(waiting)
    )
    config = parse_spec({"fulfillment": {"mode": "NodesFit"}})
    return lifecycle.reclaim_promised(req, capacity, config, now=BEFORE)


def test_what_arrived_so_far_is_reclaimed_and_no_rollback_is_recorded() -> None:
    """The request stays open (no phase written): the ledger records what comes later for it."""
    (reclaim,) = _pass(recorded=("n0",))
    assert isinstance(reclaim, ReclaimArrivals)
    assert (reclaim.request, reclaim.request_key, reclaim.nodes) == (REQ, KEY, ("n0",))


def test_a_late_arrival_is_recorded_then_reclaimed() -> None:
    claim, reclaim = _pass(unrecorded=("n1",), outcome='{"reclaimed": ["n0"]}')
    assert claim == ClaimNode("n1", "7", KEY)
    assert isinstance(reclaim, ReclaimArrivals)
    assert reclaim.nodes == ("n1",)


@pytest.mark.parametrize(
    "outcome",
    ['{"reclaimed": ["n0"]}', '{"draining": ["n0"]}', '{"kept": {"n0": "runs pod a/b"}}'],
    ids=["reclaimed", "draining", "kept by a safety rule"],
)
def test_a_node_its_last_reclaim_settled_is_not_reclaimed_again(outcome: str) -> None:
    assert _pass(recorded=("n0",), outcome=outcome) == ()


def test_a_node_whose_reclaim_failed_is_tried_again() -> None:
    (reclaim,) = _pass(recorded=("n0",), outcome='{"failed": {"n0": "timeout"}}')
    assert isinstance(reclaim, ReclaimArrivals)
    assert reclaim.nodes == ("n0",)


def test_a_late_arrival_another_waiting_gang_could_use_is_left_to_it() -> None:
    """The gone gang claims last: a node a live gang waits for is that gang's to record (and
    use), never recorded for the gone one and deleted."""
    assert _pass(unrecorded=("n1",), another_waits=True) == ()


def test_a_late_arrival_another_gone_gang_could_use_is_recorded_all_the_same() -> None:
    """Two gangs gone, both kept open: neither leaves the node to the other (it would stay
    unrecorded for both, and stranded); one of them records it and reclaims it."""
    claim, reclaim = _pass(unrecorded=("n1",), another_waits=True, another_gone=True)
    assert claim == ClaimNode("n1", "7", KEY)
    assert isinstance(reclaim, ReclaimArrivals)
    assert reclaim.nodes == ("n1",)


def test_a_live_gang_does_not_wait_for_an_older_request_kept_for_a_gone_gang() -> None:
    """The gone gang claims last: a younger live gang claims a new node at once, where it
    would wait the claim grace behind an older live one."""
    template = {"spec": pod_template(gpu=8, node_selector=POOL)["spec"]}
    live = request_of(provisioning_request("live-atomic-1", conditions={"Provisioned": ""}))
    arrival = node("n1", gpu=8, labels=POOL, created=LATER)
    for gone, claimed in ((True, ("n1",)), (False, ())):
        waiting = (
            Waiting(KEY, (template,), T0, gone=gone),
            Waiting("default/live-atomic-1", (template,), T0),
        )
        capacity = ClusterView(
            nodes=(arrival,), in_flight=frozenset(w.key for w in waiting), waiting=waiting
        )
        gang = [("workers", 1, template)]
        now = parse_time(LATER)
        assert now is not None
        result = assess(capacity, live, gang, now + timedelta(seconds=1))
        assert tuple(n for n, _ in result.claims) == claimed, gone


def test_keeping_a_promise_records_once_that_the_gang_is_gone() -> None:
    req = request_of(provisioning_request(REQ, annotations={DL: DEADLINE}))
    (mark,) = lifecycle.mark_gone(req, BEFORE)
    assert isinstance(mark, AnnotateRequest)
    assert mark.name == REQ
    assert set(mark.annotations) == {"gangcheck.io/gang-gone"}
    marked = request_of(provisioning_request(REQ, annotations={DL: DEADLINE, **mark.annotations}))
    assert lifecycle.mark_gone(marked, AFTER) == ()
    (entry,) = waiting_of(
        [provisioning_request(REQ, conditions={"Provisioned": ""}, annotations=mark.annotations)],
        lambda n, ns: None,
    )
    assert entry.gone


def test_without_its_templates_nothing_more_is_recorded() -> None:
    """Its templates deleted by hand, or owned by its Workload (made before gangcheck's
    templates were owned by nothing) and garbage-collected with it: what it recorded is
    still reclaimed."""
    (reclaim,) = _pass(recorded=("n0",), unrecorded=("n1",), with_templates=False)
    assert isinstance(reclaim, ReclaimArrivals)
    assert reclaim.nodes == ("n0",)


def test_nothing_arrived_nothing_is_done() -> None:
    assert _pass() == ()


def test_closing_a_kept_withdrawal_reclaims_what_came_since_its_last_reclaim() -> None:
    """abandon (the promise closed): a request whose kept withdrawal reclaimed some (an
    outcome, no rollback) reclaims what was recorded since, without a rollback record."""
    req = request_of(
        provisioning_request(
            REQ,
            annotations={
                DL: DEADLINE,
                OUTCOME: '{"reclaimed": ["n0"]}',
            },
        )
    )
    nodes = (node("n1", gpu=8, labels=POOL, created=LATER, annotations=ARRIVED),)
    actions = lifecycle.abandon(req, ClusterView(nodes=nodes), None, "Workload deleted", gone=True)
    assert not [a for a in actions if isinstance(a, AnnotateRequest)]
    (reclaim,) = actions
    assert isinstance(reclaim, ReclaimArrivals)
    assert reclaim.nodes == ("n1",)


# ---- closing early: everything asked for came -------------------------------------------


def _two_members(outcome: str | None = None) -> ProvisioningRequest:
    annotations = {DL: DEADLINE, **({OUTCOME: outcome} if outcome is not None else {})}
    return request_of(
        provisioning_request(
            REQ,
            conditions={"Provisioned": ""},
            annotations=annotations,
            templates=[("ppt-a", 1), ("ppt-b", 1)],
        )
    )


@pytest.mark.parametrize(
    ("recorded", "outcome", "came", "open_"),
    [
        ((), None, 0, True),
        (("n1",), None, 1, True),
        (("n1", "n2"), None, 2, False),
        ((), '{"reclaimed": ["n1", "n2"]}', 2, False),
        (("n2",), '{"reclaimed": ["n1"]}', 2, False),
        (("n1",), '{"draining": ["n1"]}', 1, True),  # the same node counted once
        ((), '{"kept": {"n1": "runs a pod"}, "reclaimed": ["n2"]}', 2, False),
    ],
    ids=[
        "nothing came: open",
        "one node of two members: open",
        "two nodes recorded for two members: closed",
        "two reclaimed by the last reclaim: closed",
        "one reclaimed, one recorded since: closed",
        "a node draining and still recorded counts once: open",
        "one kept, one reclaimed: closed",
    ],
)
def test_a_promise_closes_once_as_many_nodes_came_as_members_asked(
    recorded: tuple[str, ...], outcome: str | None, came: int, open_: bool
) -> None:
    req = _two_members(outcome)
    nodes = (
        *(node(n, gpu=8, labels=POOL, created=LATER, annotations=ARRIVED) for n in recorded),
        node("n-other", gpu=8, labels=POOL, created=LATER),  # not recorded for it
    )
    assert lifecycle.came_for(req, ClusterView(nodes=nodes)) == came
    promise = lifecycle.promise(req, status_of(req), req.class_name, BEFORE, came=came)
    assert promise.open is open_, promise.why
    if not open_:
        assert "everything asked for came" in promise.why


def test_a_late_reclaim_carries_the_earlier_outcome_so_every_node_that_came_is_counted() -> None:
    """The first pass reclaimed n0; n1 came later: the outcome the second records names both
    (`Outcome.after`), so the promise of a two-member gang closes once it is written."""
    earlier = '{"reclaimed": ["n0"], "nodeSeconds": 30}'
    claim, reclaim = _pass(unrecorded=("n1",), outcome=earlier)
    assert isinstance(claim, ClaimNode)
    assert isinstance(reclaim, ReclaimArrivals)
    assert reclaim.earlier == earlier
    this = Outcome(reclaimed=("n1",), node_seconds=12)
    written = this.after(Outcome.from_annotation(reclaim.earlier))
    assert written == Outcome(reclaimed=("n0", "n1"), node_seconds=42)
    req = _two_members(written.to_annotation())
    assert lifecycle.came_for(req, ClusterView()) == 2


@pytest.mark.parametrize(
    ("earlier", "now", "merged"),
    [
        (Outcome(), Outcome(reclaimed=("a",)), Outcome(reclaimed=("a",))),
        (
            Outcome(draining=("a",), node_seconds=5),
            Outcome(reclaimed=("a",), node_seconds=7),
            Outcome(reclaimed=("a",), node_seconds=12),
        ),
        (
            Outcome(kept={"a": "runs pod x/y"}),
            Outcome(reclaimed=("b",), failed={"c": "timeout"}),
            Outcome(reclaimed=("b",), kept={"a": "runs pod x/y"}, failed={"c": "timeout"}),
        ),
        (
            Outcome(failed={"a": "timeout"}),
            Outcome(draining=("a",)),
            Outcome(draining=("a",)),
        ),
    ],
    ids=[
        "nothing before",
        "drained then reclaimed: reclaimed once, both times held",
        "kept before, another reclaimed, one failing now",
        "a failure before, draining now: the latest says",
    ],
)
def test_outcomes_after_one_another(earlier: Outcome, now: Outcome, merged: Outcome) -> None:
    assert now.after(earlier) == merged
