"""The arrival ledger records a request's name, and names come again: Kueue may admit a gang
again after an eviction under the same attempt number (attempt/naming.py), so a new request
has the name of an earlier one. A node recorded for the earlier request (kept by a safety
rule, or still being deleted behind a finalizer) is not the new request's arrival: not
counted, not recorded in its rollback, not said reclaimed (fulfillment.is_arrival_of)."""

from __future__ import annotations

import json

import pytest

from gangcheck.logic.attempt import lifecycle, rollback, topup
from gangcheck.logic.attempt.actions import (
    AnnotateRequest,
    GuardScaleDown,
    ReclaimArrivals,
    ReleaseHold,
)
from gangcheck.logic.attempt.explain import recorded_for
from gangcheck.logic.attempt.fulfillment import (
    ClusterView,
    GangSpec,
    arrived_for,
    assess,
    is_arrival_of,
)
from gangcheck.logic.attempt.hold import hold_taint
from gangcheck.model.names import CONSUME_ANNOTATION
from gangcheck.model.objects import Obj, request_of
from tests.builders import node, pod_template, provisioning_request
from tests.unit.test_admission_decide import gang
from tests.unit.test_topup import A, gpu_node
from tests.unit.test_topup import request as topup_request
from tests.unit.test_topup import run as topup_run

NS, REQ = "ns", "g-c-1"
KEY = f"{NS}/{REQ}"
CREATED = "2026-11-30T10:10:00Z"
"""The new request's creationTimestamp; the earlier request of the name was made at 10:00."""
RECORDED = {"gangcheck.io/arrived-for": KEY}


def _node(name: str, created: str, *, deleting: bool = False, **kw: object) -> Obj:
    obj = node(name, created=created, annotations=RECORDED, **kw)  # type: ignore[arg-type]
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-11-30T10:09:00Z"
        obj["metadata"]["finalizers"] = ["karpenter.sh/termination"]
    return obj


#: Arrived for the earlier request: being deleted behind a finalizer, and kept by a safety
#: rule (the opt-out label), both still recorded under the name.
OLD_DELETING = _node("old-deleting", "2026-11-30T10:01:00Z", deleting=True)
OLD_KEPT = _node("old-kept", "2026-11-30T10:02:00Z", labels={"gangcheck.io/do-not-reclaim": "true"})
#: Arrived for the new request, and one stamped in its very second (may be either's:
#: whole seconds prove nothing, it is counted as before and the reclaim's rule keeps it).
NEW = _node("new", "2026-11-30T10:11:00Z")
SAME_SECOND = _node("same-second", CREATED)


def _request(created: str = CREATED, annotations: dict[str, str] | None = None) -> Obj:
    return provisioning_request(
        REQ,
        namespace=NS,
        created=created,
        conditions={"Provisioned": ""},
        annotations=annotations,
    )


@pytest.mark.parametrize(
    ("node_created", "request_created", "arrived"),
    [
        ("2026-11-30T10:11:00Z", CREATED, True),
        (CREATED, CREATED, True),
        ("2026-11-30T10:10:00.900Z", "2026-11-30T10:10:00.100Z", True),
        ("2026-11-30T10:09:59Z", CREATED, False),
        ("2026-11-30T10:01:00Z", CREATED, False),
        ("", CREATED, True),
        ("2026-11-30T10:01:00Z", "", True),
    ],
    ids=[
        "younger: its arrival",
        "the same second: not proven older, its arrival as before",
        "the same second, sub-second stamps: whole seconds compared",
        "one second older: an earlier request's",
        "minutes older: an earlier request's",
        "node time unknown: proves nothing, as before",
        "request time unknown: proves nothing, as before",
    ],
)
def test_a_node_recorded_under_the_name_is_the_requests_arrival_unless_older(
    node_created: str, request_created: str, arrived: bool
) -> None:
    recorded = node("n", created=node_created, annotations=RECORDED)
    assert is_arrival_of(recorded, KEY, request_created) is arrived
    assert is_arrival_of(recorded, "ns/g-c-2", request_created) is False


def test_the_ledger_reads_only_the_new_requests_arrivals() -> None:
    nodes = (OLD_DELETING, OLD_KEPT, NEW, SAME_SECOND)
    names = [n["metadata"]["name"] for n in arrived_for(nodes, KEY, CREATED)]
    assert names == ["new", "same-second"]
    assert recorded_for(nodes, NS, REQ, CREATED) == 2
    assert recorded_for(nodes, NS, REQ) == 4  # no time at hand: every node under the name


def test_a_withdrawal_records_and_reclaims_only_what_arrived_for_the_new_request() -> None:
    """Before: the earlier request's nodes were recorded again in the new rollback
    (rollback-nodes) and counted in 'the N node(s) that arrived for it are reclaimed',
    then kept by the reclaim's age rule and listed as kept in its outcome."""
    req = request_of(_request())
    capacity = ClusterView(nodes=(OLD_DELETING, OLD_KEPT, NEW), in_flight=frozenset({KEY}))
    annotate, reclaim = rollback.abandon(req, capacity, "cordon", "Workload evicted")
    assert isinstance(annotate, AnnotateRequest)
    assert json.loads(annotate.annotations["gangcheck.io/rollback-nodes"]) == {
        "new": "2026-11-30T10:11:00Z"
    }
    assert isinstance(reclaim, ReclaimArrivals)
    assert reclaim.nodes == ("new",)


def test_a_withdrawal_with_only_an_earlier_requests_nodes_reclaims_nothing() -> None:
    req = request_of(_request())
    capacity = ClusterView(nodes=(OLD_DELETING, OLD_KEPT), in_flight=frozenset({KEY}))
    assert rollback.abandon(req, capacity, "cordon", "Workload evicted") == ()
    assert lifecycle.abandon(req, capacity, None, "Workload evicted") == ()


def test_a_rollback_begun_records_only_the_new_requests_arrivals() -> None:
    req = request_of(_request())
    capacity = ClusterView(nodes=(OLD_DELETING, OLD_KEPT, NEW, SAME_SECOND))
    annotate, _ = rollback.start(req, capacity, "deadline passed")
    assert set(json.loads(annotate.annotations["gangcheck.io/rollback-nodes"])) == {
        "new",
        "same-second",
    }


def test_the_fit_counts_an_earlier_requests_node_as_shared_not_as_arrived() -> None:
    """The kept node of the earlier request is capacity that predates the new one: the fit
    may place on it, but it is not among what arrived for the request."""
    req = request_of(_request(annotations={"gangcheck.io/phase": ""}))
    capacity = ClusterView(nodes=(OLD_KEPT, NEW), in_flight=frozenset({KEY}))
    gang = GangSpec((("workers", 2, pod_template(gpu=8)),), namespace=NS)
    result = assess(capacity, req, gang)
    assert result.arrived == ("new",)
    assert result.arrivals == 1


def test_a_kept_request_whose_name_holds_only_an_earlier_requests_node_holds_nothing() -> None:
    kept = request_of(_request(annotations={"gangcheck.io/phase": "Kept"}))
    capacity = ClusterView(nodes=(OLD_KEPT,), in_flight=frozenset({KEY}))
    assert topup.holds_nothing(kept, capacity)
    with_its_own = ClusterView(nodes=(OLD_KEPT, NEW), in_flight=frozenset({KEY}))
    assert not topup.holds_nothing(kept, with_its_own)


def test_the_end_of_a_request_asked_again_under_its_name_lifts_the_hold_it_was_left() -> None:
    """An ask deleted by hand is asked again under its name (flow.in_order, race's `again`),
    and the holds on the nodes recorded for it are left for the new request to lift when it
    ends (`_holds_of_gone(..., but=(name,))`: 'the one asked again counts its own'). Those
    nodes are older than the new request: its end (Started, a rollback done, withdrawn) must
    still lift their hold and the scale-down guard set for the name, or nothing ever does
    and they stay closed to every other pod (and kept from scale-down) for good."""
    held = node(
        "old-held",
        created="2026-11-30T10:02:00Z",
        annotations={**RECORDED, "gangcheck.io/scale-down-disabled-for": KEY},
        taints=[hold_taint(KEY)],
    )
    held["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/scale-down-disabled"] = "true"
    new = node(
        "new", created="2026-11-30T10:11:00Z", annotations=RECORDED, taints=[hold_taint(KEY)]
    )
    req = request_of(_request())
    actions = lifecycle.release_hold(ClusterView(nodes=(held, new)), req)
    lifted = [a for a in actions if isinstance(a, ReleaseHold)]
    assert [a.nodes for a in lifted] == [("new", "old-held")]
    unguarded = [a for a in actions if isinstance(a, GuardScaleDown) and not a.on]
    assert [a.nodes for a in unguarded] == [("old-held",)]


def test_a_started_gang_whose_request_was_asked_again_under_its_name_opens_its_old_node() -> None:
    """The decision end to end: the gang's request deleted by hand after a0 arrived for it
    and asked again under its name (10:03, a0 10:00:01); the gang, Ready on it and admitted,
    has started: the hold on a0 is lifted with the rest, nothing else would lift it."""
    a = topup_request(0, 4, phase="Started")
    a["metadata"]["creationTimestamp"] = "2026-11-30T10:03:00Z"
    wl = (
        gang(4)
        .check(
            state="Ready",
            pod_set_updates=[{"name": "workers", "annotations": {CONSUME_ANNOTATION: A}}],
        )
        .condition("Admitted")
        .build()
    )
    d = topup_run([a], [gpu_node("a0", "a", arrived_for=A)], workload=wl)
    assert [n for act in d.actions if isinstance(act, ReleaseHold) for n in act.nodes] == ["a0"]
