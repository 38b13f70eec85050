"""A node on its way out is never counted as capacity: a Node with a deletionTimestamp, and a
Node whose Karpenter NodeClaim has one (Karpenter deletes the Node, and its termination
taints it, only after the claim's deletion began: until then the Node itself looks usable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from gangcheck.app import Controller
from gangcheck.logic.attempt.explain import World, classify
from gangcheck.logic.attempt.fulfillment import ClusterView, arrival_view
from gangcheck.logic.placement.fit import (
    CLAIM_DELETING,
    DELETING,
    Member,
    Rejection,
    fit_gang,
    node_view,
    summarize,
)
from gangcheck.logic.placement.usage import (
    NodeUsage,
    deleting_claim_of,
    node_claim_change_matters,
)
from gangcheck.logic.sources.world import capacity_of
from gangcheck.reconcile.view import cluster_view
from tests import builders
from tests.fakes.kube import FakeKube
from tests.unit.test_event_routing import WAITING_GANG, controller_with_a_waiting_gang

Obj = dict[str, Any]
GONE = "2026-01-02T00:00:00Z"
WORKER = Member(requests={"cpu": 1_000_000_000, "pods": 1_000_000_000})


def node(name: str, *, provider: str = "", deleting: bool = False, ready: bool = True) -> Obj:
    meta: Obj = {"name": name, "resourceVersion": "1"}
    if deleting:
        meta["deletionTimestamp"] = GONE
    spec: Obj = {"providerID": provider} if provider else {}
    return {
        "metadata": meta,
        "spec": spec,
        "status": {
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def claim(name: str, *, node_name: str = "", provider: str = "", deleting: bool = False) -> Obj:
    meta: Obj = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = GONE
    status = {k: v for k, v in (("nodeName", node_name), ("providerID", provider)) if v}
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": meta,
        "status": status,
    }


# ---- the node's view ------------------------------------------------------------------------


@dataclass(frozen=True)
class ViewCase:
    raw: Obj
    deleting_claim: str
    problem: Rejection | None


VIEWS = {
    "a usable node": ViewCase(node("a"), "", None),
    "a node being deleted": ViewCase(
        node("a", deleting=True), "", Rejection("being deleted", kind=DELETING)
    ),
    "a node whose claim is being deleted": ViewCase(
        node("a"),
        "default-x7k2p",
        Rejection(
            "its NodeClaim is being deleted",
            'its NodeClaim "default-x7k2p" is being deleted',
            kind=CLAIM_DELETING,
            subject="default-x7k2p",
        ),
    ),
    "both: the node's own deletion is said (the later step)": ViewCase(
        node("a", deleting=True), "default-x7k2p", Rejection("being deleted", kind=DELETING)
    ),
    "being deleted is said before not Ready": ViewCase(
        node("a", deleting=True, ready=False), "", Rejection("being deleted", kind=DELETING)
    ),
}


@pytest.mark.parametrize("case", list(VIEWS.values()), ids=list(VIEWS))
def test_the_view_of_a_node_going_is_unusable(case: ViewCase) -> None:
    view = node_view(case.raw, deleting_claim=case.deleting_claim)
    assert view.problem == case.problem
    assert view.is_usable == (case.problem is None)


def test_a_gang_does_not_fit_on_nodes_going_and_the_words_say_why() -> None:
    views = [
        node_view(node("a", deleting=True)),
        node_view(node("b"), deleting_claim="default-b"),
        node_view(node("c"), deleting_claim="default-c"),
    ]
    result = fit_gang([("worker", 3, WORKER)], views)
    assert (result.fits, result.placeable) == (False, 0)
    assert summarize(result) == (
        "0 of 3 members placeable; 3 nodes can take none: "
        "2 × its NodeClaim is being deleted, 1 × being deleted"  # noqa: RUF001
    )
    assert classify(result.node_reasons["a"]) == (DELETING, "")
    assert classify(result.node_reasons["b"]) == (CLAIM_DELETING, "default-b")
    result = fit_gang([("worker", 3, WORKER)], [*views, node_view(node("d"))])
    assert result.fits and result.placements == {"d": ("worker",) * 3}


# ---- which claim is a node's ----------------------------------------------------------------


CLAIMS_OF = {
    "none": ([], ""),
    "by providerID": ([claim("c1", provider="kwok://a", deleting=True)], "c1"),
    "by node name": ([claim("c1", node_name="a", deleting=True)], "c1"),
    "not being deleted": ([claim("c1", node_name="a", provider="kwok://a")], ""),
    "another node's": ([claim("c1", node_name="b", provider="kwok://b", deleting=True)], ""),
    "launched, not registered (no providerID, no node)": ([claim("c1", deleting=True)], ""),
    "the first by name of several": (
        [
            claim("c2", node_name="a", deleting=True),
            claim("c1", provider="kwok://a", deleting=True),
        ],
        "c1",
    ),
}


@pytest.mark.parametrize(("claims", "expected"), list(CLAIMS_OF.values()), ids=list(CLAIMS_OF))
def test_the_claim_being_deleted_of_a_node(claims: list[Obj], expected: str) -> None:
    raw = node("a", provider="kwok://a")
    assert deleting_claim_of(raw, claims) == expected
    usage = NodeUsage()
    usage.on_node(None, raw)
    for one in claims:
        usage.on_node_claim(None, one)
    assert usage.deleting_claim_of(raw) == expected
    assert usage.views()["a"] == node_view(raw, deleting_claim=expected)


CHANGES = {
    "added, not being deleted": (None, claim("c", node_name="a"), False),
    "added being deleted": (None, claim("c", node_name="a", deleting=True), True),
    "its deletion began": (
        claim("c", node_name="a"),
        claim("c", node_name="a", deleting=True),
        True,
    ),
    "a status update while being deleted": (
        claim("c", node_name="a", deleting=True),
        claim("c", node_name="a", deleting=True),
        False,
    ),
    "registered while being deleted": (
        claim("c", provider="kwok://a", deleting=True),
        claim("c", node_name="a", provider="kwok://a", deleting=True),
        True,
    ),
    "gone while being deleted": (claim("c", node_name="a", deleting=True), None, True),
    "gone, never deleting (a relist's delete)": (claim("c", node_name="a"), None, False),
}


@pytest.mark.parametrize(("old", "new", "matters"), list(CHANGES.values()), ids=list(CHANGES))
def test_which_claim_events_can_change_a_node(
    old: Obj | None, new: Obj | None, matters: bool
) -> None:
    assert node_claim_change_matters(old, new) == matters


def test_a_claim_event_remakes_the_views_of_its_nodes_and_only_theirs() -> None:
    usage = NodeUsage()
    a, b = node("a", provider="kwok://a"), node("b", provider="kwok://b")
    usage.on_node(None, a)
    usage.on_node(None, b)
    kept_b = usage.views()["b"]
    live = claim("c", node_name="a", provider="kwok://a")
    going = claim("c", node_name="a", provider="kwok://a", deleting=True)
    usage.on_node_claim(None, live)
    assert usage.views()["a"].is_usable
    assert usage.nodes_of_claim(live) == ["a"]
    usage.on_node_claim(live, going)
    assert usage.views()["a"].problem == node_view(a, deleting_claim="c").problem
    assert [v.name for v in usage.node_views() if not v.is_usable] == ["a"]
    assert usage.views()["b"] is kept_b  # another node's view is not made again
    # A copy of the node (not the kept object) is judged with the claim too.
    assert not usage.view_of({**a, "metadata": {**a["metadata"], "resourceVersion": "2"}}).is_usable
    # The node, changed, keeps its claim's problem; the claim gone, the node is usable again.
    a2 = {**a, "metadata": {**a["metadata"], "resourceVersion": "3"}}
    usage.on_node(a, a2)
    assert usage.views()["a"].problem is not None
    usage.on_node_claim(going, None)
    assert usage.views()["a"].is_usable
    assert usage.deleting_claim_of(a2) == ""


def test_a_node_that_registers_after_its_claim_began_deleting_is_going_from_the_start() -> None:
    usage = NodeUsage()
    usage.on_node_claim(None, claim("c", provider="kwok://late", deleting=True))
    late = node("late", provider="kwok://late")
    usage.on_node(None, late)
    assert usage.views()["late"].problem == node_view(late, deleting_claim="c").problem
    assert usage.nodes_of_claim(claim("c", provider="kwok://late")) == ["late"]


# ---- the gangs a claim event requeues --------------------------------------------------------


def claim_event(controller: Controller, old: Obj | None, new: Obj | None) -> None:
    """As the informer tells it: the store's indexers (the capacity), then the handlers."""
    controller.caches.capacity.on_node_claim(old, new)
    controller._on_node_claim(old, new)


REQUEUES = {
    "a claim of a node starts deleting: the waiting gang is requeued": (
        claim("c", node_name="n1"),
        claim("c", node_name="n1", deleting=True),
        [WAITING_GANG],
        True,
    ),
    "a claim being deleted goes: its node is usable again, requeued": (
        claim("c", node_name="n1", deleting=True),
        None,
        [WAITING_GANG],
        False,
    ),
    "a claim made: nothing changes for any node": (None, claim("c", node_name="n1"), [], False),
    "a claim being deleted updated alike: none requeued": (
        claim("c", node_name="n1", deleting=True),
        claim("c", node_name="n1", deleting=True),
        [],
        True,
    ),
    "a claim of no node known starts deleting: none requeued (the node's event will)": (
        claim("c", node_name="n9"),
        claim("c", node_name="n9", deleting=True),
        [],
        False,
    ),
}


@pytest.mark.parametrize(
    ("old", "new", "requeued", "n1_going"), list(REQUEUES.values()), ids=list(REQUEUES)
)
def test_claim_events_requeue_the_waiting_gangs_a_node_event_would(
    old: Obj | None, new: Obj | None, requeued: list[str], n1_going: bool
) -> None:
    controller, _ = controller_with_a_waiting_gang()  # its node n1
    if old is not None:  # the claim as the caches had it before
        controller.caches.capacity.on_node_claim(None, old)
    claim_event(controller, old, new)
    assert list(controller.queue._ready) == requeued
    assert (controller.caches.capacity.views()["n1"].problem is not None) == n1_going


def test_a_diagnosis_judges_the_nodes_with_their_claims_as_the_controller_does() -> None:
    """`gangcheck diagnose` reads the NodeClaims too (fetch_world): its world, as the capacity
    a decision reads, and a ClusterView of the objects alone, give the nodes the same views."""
    raw = node("a", provider="kwok://a")
    going = claim("c", provider="kwok://a", deleting=True)
    world = World(nodes=(raw,), node_claims=(going,))
    expected = node_view(raw, deleting_claim="c")
    assert capacity_of(world).view(raw) == expected
    assert list(capacity_of(world).views()) == [expected]
    assert list(ClusterView(nodes=(raw,), node_claims=(going,)).views()) == [expected]
    assert arrival_view(raw, capacity_of(world)) == expected


def test_a_copied_cluster_view_judges_the_nodes_with_their_claims_as_the_kept_one() -> None:
    """`cluster_view(copied=True)` (read across awaits, withdraw_orphans) leaves the kept
    capacity behind: it carries the claims the caches hold, so a node whose claim is being
    deleted is going in it too (before, the copy judged the Node alone: usable)."""
    kube = FakeKube()
    kube.add(builders.node("n1"), claim("c", node_name="n1", deleting=True))
    controller = Controller(kube)
    kube.sync(controller.caches)
    kept = cluster_view(controller.caches)
    copied = cluster_view(controller.caches, copied=True)
    assert copied.cluster is None
    (n1,) = copied.nodes
    assert copied.view(n1).problem == kept.view(n1).problem
    assert copied.view(n1).problem is not None and copied.view(n1).problem.kind == CLAIM_DELETING
