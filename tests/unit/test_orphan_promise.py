"""A gang gone while its source's promise is open (lifecycle.promise): its request is kept, what
arrived reclaimed, and what arrives later recorded and reclaimed, until the promise closes
(lifecycle.reclaim_promised, rollback.reclaim_late). Pure logic, by table."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from gangcheck.logic.attempt import lifecycle
from gangcheck.logic.attempt.actions import AnnotateRequest, ClaimNode, ReclaimArrivals
from gangcheck.logic.attempt.fulfillment import ClusterView, Waiting
from gangcheck.logic.sources.provreq import status_of
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.objects import request_of
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
        waiting.insert(0, Waiting("default/other-atomic-1", (template,), T0))
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


def test_without_its_templates_nothing_more_is_recorded() -> None:
    """Garbage-collected with the Workload: what it recorded is still reclaimed."""
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
