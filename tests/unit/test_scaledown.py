"""Kept nodes are kept from cluster-autoscaler's scale-down until the attempt ends (issue 32,
logic/attempt/scaledown.py): which nodes get ``scale-down-disabled`` with gangcheck's record,
which patch sets it and which takes it off (only what gangcheck set), and the decisions of a
Workload's check and a PodGroup that ask for it while a request is kept and lift it once the
gang has started."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gangcheck.logic.attempt.actions import GuardScaleDown, ReclaimArrivals, ReleaseHold
from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.attempt.lifecycle import release_holds_of_gone
from gangcheck.logic.attempt.scaledown import (
    SCALE_DOWN_DISABLED,
    guard_patch,
    needs_guard,
    removal,
    unguard_ops,
)
from gangcheck.logic.sources.karpenter.claims import release_protection_patch
from gangcheck.model.names import SCALE_DOWN_GUARD
from tests.builders import node
from tests.unit.test_topup import (
    KINDS,
    NEXT_FAILED,
    A,
    B,
    ask,
    decide_provisioning,
    gpu_node,
    kept,
    request,
    run,
    started_top_up,
    topping_up,
)

Obj = dict[str, Any]
MINE = "default/a"
SDD, GUARD = SCALE_DOWN_DISABLED, SCALE_DOWN_GUARD
SDD_PATH = "/metadata/annotations/cluster-autoscaler.kubernetes.io~1scale-down-disabled"
GUARD_PATH = "/metadata/annotations/gangcheck.io~1scale-down-disabled-for"


def arrived(notes: dict[str, str], owner: str = MINE) -> Obj:
    n = node("n0", annotations={"gangcheck.io/arrived-for": owner, **notes})
    n["metadata"]["resourceVersion"] = "7"
    return n


@pytest.mark.parametrize(
    ("owner", "notes", "wanted"),
    [
        (MINE, {}, True),
        (MINE, {SDD: "true"}, False),  # someone else's: left alone, never recorded as ours
        (MINE, {SDD: "false"}, False),  # someone else's value, any value
        (MINE, {SDD: "true", GUARD: MINE}, False),  # ours already
        (MINE, {GUARD: MINE}, False),  # ours, the autoscaler's taken off by someone: not again
        ("default/other", {}, False),  # arrived for another request
        ("", {}, False),  # recorded for none
    ],
)
def test_which_node_is_guarded(owner: str, notes: dict[str, str], wanted: bool) -> None:
    n = arrived(notes, owner)
    assert needs_guard(n, MINE) is wanted
    patch = guard_patch(n, MINE)
    if not wanted:
        assert patch is None
        return
    assert patch == {
        "metadata": {"resourceVersion": "7", "annotations": {SDD: "true", GUARD: MINE}}
    }


@pytest.mark.parametrize(
    ("notes", "ops"),
    [
        (  # ours: both tested, both removed
            {SDD: "true", GUARD: MINE},
            [
                {"op": "test", "path": GUARD_PATH, "value": MINE},
                {"op": "remove", "path": GUARD_PATH},
                {"op": "test", "path": SDD_PATH, "value": "true"},
                {"op": "remove", "path": SDD_PATH},
            ],
        ),
        (  # someone changed the value since: theirs now, the record goes alone
            {SDD: "false", GUARD: MINE},
            [
                {"op": "test", "path": GUARD_PATH, "value": MINE},
                {"op": "remove", "path": GUARD_PATH},
            ],
        ),
        (  # someone took it off already: the record goes
            {GUARD: MINE},
            [
                {"op": "test", "path": GUARD_PATH, "value": MINE},
                {"op": "remove", "path": GUARD_PATH},
            ],
        ),
        ({SDD: "true"}, []),  # someone else's: never removed
        ({SDD: "true", GUARD: "default/other"}, []),  # another request's record
        ({}, []),
    ],
)
def test_only_what_gangcheck_set_is_taken_off(notes: dict[str, str], ops: list[Obj]) -> None:
    assert unguard_ops(arrived(notes), MINE) == ops


def test_karpenter_protection_is_taken_off_the_same_way() -> None:
    claim = {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}
    assert release_protection_patch(claim) == removal(claim, "karpenter.sh/do-not-disrupt")
    path = "/metadata/annotations/karpenter.sh~1do-not-disrupt"
    assert release_protection_patch(claim) == [
        {"op": "test", "path": path, "value": "true"},
        {"op": "remove", "path": path},
    ]
    claim["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] = "false"
    assert release_protection_patch(claim) == []


# ---- through the decisions ---------------------------------------------------------------


def annotated(n: Obj, **notes: str) -> Obj:
    n = copy.deepcopy(n)
    n["metadata"]["annotations"] = {**n["metadata"].get("annotations", {}), **notes}
    return n


def guards(actions: tuple[Any, ...]) -> list[GuardScaleDown]:
    return [a for a in actions if isinstance(a, GuardScaleDown)]


def decide_both(kind: str, requests: list[Obj], nodes: list[Obj]) -> tuple[Any, ...]:
    """The decision's actions, through a Workload's check or a PodGroup (test_topup.py)."""
    if kind == "Workload":
        return run(requests, nodes).actions
    return decide_provisioning(requests, nodes).actions


@pytest.mark.parametrize("kind", KINDS)
def test_a_kept_requests_nodes_are_guarded_while_the_next_source_delivers(kind: str) -> None:
    actions = decide_both(kind, *topping_up(kind))
    assert guards(actions) == [GuardScaleDown(f"default/{ask(0, kind)}", ("a0", "a1"))]


@pytest.mark.parametrize("kind", KINDS)
def test_a_node_guarded_already_or_by_someone_else_is_not_asked_again(kind: str) -> None:
    key = f"default/{ask(0, kind)}"
    requests, (a0, a1) = topping_up(kind)
    ours = annotated(a0, **{SDD: "true", GUARD: key})
    theirs = annotated(a1, **{SDD: "true"})
    assert guards(decide_both(kind, requests, [ours, theirs])) == []
    assert guards(decide_both(kind, requests, [ours, a1])) == [GuardScaleDown(key, ("a1",))]


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_not_kept_is_not_guarded(kind: str) -> None:
    """Nodes of the request in flight are booked by the autoscaler (Provisioned): no guard."""
    nodes = [gpu_node(n, "a", arrived_for=A, kind=kind) for n in ("a0",)]
    assert guards(decide_both(kind, [request(0, 4, kind=kind)], nodes)) == []


def test_once_started_the_guard_gangcheck_set_is_lifted_and_no_other() -> None:
    requests, wl = started_top_up()
    key = f"default/{A}"
    nodes = [
        annotated(gpu_node("a0", "a", arrived_for=A), **{SDD: "true", GUARD: key}),
        annotated(gpu_node("a1", "a", arrived_for=A, held=False), **{SDD: "true"}),
        gpu_node("b0", "b", arrived_for=B, held=False),
    ]
    lifted = guards(run(requests, nodes, workload=wl).actions)
    assert lifted == [GuardScaleDown(key, ("a0",), on=False)]


def test_the_rollback_of_a_kept_request_reclaims_its_nodes_guard_and_all() -> None:
    """The guard goes in the safe reclaim itself (reclaim/safely.py, before it judges the
    node): the decision asks for the reclaim of the kept nodes, guarded or not."""
    key = f"default/{A}"
    nodes = [
        annotated(gpu_node(n, "a", arrived_for=A), **{SDD: "true", GUARD: key})
        for n in ("a0", "a1")
    ]
    actions = run([request(0, 4, **kept()), request(1, 2, **NEXT_FAILED)], nodes).actions
    reclaims = [a for a in actions if isinstance(a, ReclaimArrivals)]
    assert [(r.request, r.nodes) for r in reclaims] == [(A, ("a0", "a1"))]


def test_a_request_gone_has_its_nodes_guard_lifted_after_the_hold() -> None:
    """A kept request deleted outside gangcheck leaves nodes held and guarded from the
    autoscaler's scale-down, by a record no longer there: both are lifted, the guard after the
    hold's confirmation that the request is gone (ReleaseHold.gone, which stops the rest when
    it is not); a node only guarded (its hold lifted already) has its guard lifted too, after
    the same confirmation, with no Event (no hold was lifted)."""
    key = f"default/{A}"
    both = annotated(gpu_node("a0", "a", arrived_for=A), **{SDD: "true", GUARD: key})
    guard_only = annotated(
        gpu_node("a1", "a", arrived_for=A, held=False), **{SDD: "true", GUARD: key}
    )
    other = gpu_node("b0", "b", arrived_for=B)
    capacity = ClusterView(nodes=(both, guard_only, other))
    actions, events = release_holds_of_gone(capacity, "default", [A])
    assert actions == (
        ReleaseHold(("a0",), gone=A),
        GuardScaleDown(key, ("a0", "a1"), on=False),
    )
    assert [e.reason for e in events] == ["HoldLifted"]
    quiet = ClusterView(nodes=(guard_only,))
    actions, events = release_holds_of_gone(quiet, "default", [A])
    assert actions == (ReleaseHold((), gone=A), GuardScaleDown(key, ("a1",), on=False))
    assert events == ()
