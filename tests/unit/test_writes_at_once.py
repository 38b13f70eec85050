"""Writes of one decision whose order does not matter go side by side: the nodes a gang
claims (each at its own resourceVersion), the members a PodGroup releases. Against the fake
API server, made to hold every such write until the others are in flight: written one after
another they would never all be."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gangcheck.app import SOURCES
from gangcheck.kube.errors import ApiError
from gangcheck.kube.resources import NODE, POD, Resource
from gangcheck.logic.attempt.actions import (
    Action,
    AnnotateRequest,
    ClaimNode,
    ReclaimArrivals,
    ReleaseHold,
    ReleaseMembers,
)
from gangcheck.logic.attempt.fulfillment import ARRIVED_FOR
from gangcheck.logic.podgroups.gating import GATE
from gangcheck.model.objects import ObjectRef
from gangcheck.reclaim import safely
from gangcheck.reconcile.apply import Applier, side_by_side
from gangcheck.reconcile.events import EventRecorder
from gangcheck.reconcile.reconciler import GangReconciler
from gangcheck.runtime.together import at_once
from tests.builders import T0, node
from tests.fakes.kube import FakeKube, api_error
from tests.unit.test_applier import gated_pod, request

Obj = dict[str, Any]
NS = "default"
KEY = f"{NS}/wl-atomic-1"
#: Long enough for a loaded machine, short against a write that never comes.
PATIENCE = 10.0


class HeldKube(FakeKube):
    """The fake API server, holding each patch of `kind` until `together` of them are in
    flight at once (then answering them all)."""

    def __init__(self, kind: str, together: int) -> None:
        super().__init__()
        self.kind = kind
        self.barrier = asyncio.Barrier(together)

    async def merge_patch(self, res: Resource, name: str, patch: Obj, *a: Any, **kw: Any) -> Obj:
        if res.kind == self.kind:
            await asyncio.wait_for(self.barrier.wait(), PATIENCE)
        return await super().merge_patch(res, name, patch, *a, **kw)


def claim(kube: FakeKube, name: str) -> ClaimNode:
    stored = kube.stored(NODE, name)
    assert stored is not None
    return ClaimNode(name, stored["metadata"]["resourceVersion"], KEY)


def claimed(kube: FakeKube, *names: str) -> set[str]:
    """The nodes of `names` recorded as arrived for the request."""
    found = {n: kube.stored(NODE, n) or {} for n in names}
    return {
        n
        for n, o in found.items()
        if (o["metadata"].get("annotations") or {}).get(ARRIVED_FOR) == KEY
    }


def reconciler(kube: FakeKube) -> GangReconciler:
    caches = kube.caches()
    return GangReconciler(kube, caches, EventRecorder(kube), Applier(kube, caches, SOURCES))


def wl() -> ObjectRef:
    return ObjectRef("kueue.x-k8s.io/v1beta2", "Workload", "wl", NS)


A, B, C = (ClaimNode(n, "1", KEY) for n in ("a", "b", "c"))
NOTE = AnnotateRequest("wl-atomic-1", {"k": "v"})
LIFT = ReleaseHold(("a",))


@pytest.mark.parametrize(
    ("actions", "runs"),
    [
        ((), []),
        ((A,), [(A,)]),
        ((A, B, C), [(A, B, C)]),
        ((A, B, NOTE), [(A, B), (NOTE,)]),
        ((NOTE, A, B), [(NOTE,), (A, B)]),
        ((A, NOTE, B, C), [(A,), (NOTE,), (B, C)]),
        ((A, A, B), [(A,), (A, B)]),  # one node twice: one after the other
        ((NOTE, LIFT), [(NOTE,), (LIFT,)]),
    ],
)
def test_runs_of_claims_of_distinct_nodes_go_side_by_side_the_rest_alone(
    actions: tuple[Action, ...], runs: list[tuple[Action, ...]]
) -> None:
    assert list(side_by_side(actions)) == runs


async def test_at_once_keeps_to_its_limit_and_runs_every_write_to_its_end() -> None:
    flying, most, done = 0, 0, []

    async def write(i: int) -> None:
        nonlocal flying, most
        flying += 1
        most = max(most, flying)
        for _ in range(3):
            await asyncio.sleep(0)
        flying -= 1
        if i == 1:
            raise api_error(500, name="n1", kind="Node")
        done.append(i)

    answers = await at_once((lambda i=i: write(i) for i in range(6)), limit=2)
    assert most == 2
    assert sorted(done) == [0, 2, 3, 4, 5]
    assert [a is None for a in answers] == [True, False, True, True, True, True]
    assert isinstance(answers[1], ApiError)


async def test_a_decisions_claims_are_written_side_by_side_then_the_rest() -> None:
    kube = HeldKube("Node", together=3)
    kube.add(node("n1"), node("n2"), node("n3"))
    gang = reconciler(kube)
    claims = [claim(kube, n) for n in ("n1", "n2", "n3")]
    assert await asyncio.wait_for(gang._applied(wl(), claims), PATIENCE)
    assert claimed(kube, "n1", "n2", "n3") == {"n1", "n2", "n3"}


async def test_a_claim_on_a_node_changed_meanwhile_drops_the_decision_after_the_others() -> None:
    """One node changed since the decision: the claims beside it are written (each stands on
    its own node's resourceVersion), the decision is dropped, and nothing after the run (the
    request's record) is written: it is made again on what changed."""
    kube = HeldKube("Node", together=2)
    kube.add(node("n1"), node("n2"), node("n3"))
    gang = reconciler(kube)
    stale = ClaimNode("n2", "1", KEY)
    actions = [claim(kube, "n1"), stale, claim(kube, "n3"), NOTE]
    assert not await asyncio.wait_for(gang._applied(wl(), actions), PATIENCE)
    assert claimed(kube, "n1", "n2", "n3") == {"n1", "n3"}
    assert kube.writes_of("ProvisioningRequest") == []


async def test_a_claim_the_server_fails_is_raised_once_the_others_are_written() -> None:
    kube = HeldKube("Node", together=3)
    kube.add(node("n1"), node("n2"), node("n3"))
    kube.fail("patch", "Node", "n1", 500)
    gang = reconciler(kube)
    actions = [claim(kube, "n1"), claim(kube, "n2"), claim(kube, "n3")]
    with pytest.raises(ApiError):
        await asyncio.wait_for(gang._applied(wl(), actions), PATIENCE)
    assert claimed(kube, "n1", "n2", "n3") == {"n2", "n3"}


async def test_a_podgroups_members_are_released_side_by_side() -> None:
    kube = HeldKube("Pod", together=4)
    kube.add(*(gated_pod(f"m{i}") for i in range(4)))
    applier = Applier(kube, kube.caches(), SOURCES)
    action = ReleaseMembers(
        pods=tuple(f"m{i}" for i in range(4)),
        annotations={},
        node_selector={},
        gate=GATE,
    )
    await asyncio.wait_for(applier.apply(NS, action), PATIENCE)
    for i in range(4):
        pod = kube.stored(POD, f"m{i}", NS)
        assert pod is not None
        assert "schedulingGates" not in pod["spec"]


async def test_a_member_the_server_fails_is_raised_once_the_others_are_released() -> None:
    kube = HeldKube("Pod", together=3)
    kube.add(*(gated_pod(f"m{i}") for i in range(3)))
    kube.fail("patch", "Pod", "m0", 500)
    applier = Applier(kube, kube.caches(), SOURCES)
    action = ReleaseMembers(pods=("m0", "m1", "m2"), annotations={}, node_selector={}, gate=GATE)
    with pytest.raises(ApiError):
        await asyncio.wait_for(applier.apply(NS, action), PATIENCE)
    released = [
        "schedulingGates" not in (kube.stored(POD, f"m{i}", NS) or {}).get("spec", {})
        for i in range(3)
    ]
    assert released == [False, True, True]


async def test_a_node_whose_reclaim_fails_cuts_no_other_off_mid_reclaim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """n1's read fails while n2 settles between its cordon and its delete: n2 is still
    deleted (before, the failure cancelled it there, cordoned and never deleted), then the
    failure is raised."""
    monkeypatch.setattr(
        safely.reclaim_safely, "__kwdefaults__", {"settle_seconds": 0.3, "owed": False}
    )
    arrived = [
        node(n, created="2026-11-30T10:05:00Z", annotations={ARRIVED_FOR: KEY})
        for n in ("n1", "n2")
    ]
    kube = FakeKube()
    kube.add(request(), *arrived)
    kube.fail("get", "Node", "n1", 500)
    applier = Applier(kube, kube.caches(), SOURCES)
    action = ReclaimArrivals("wl-atomic-1", KEY, T0, ("n1", "n2"), "DeleteNode")
    with pytest.raises(ApiError):
        await asyncio.wait_for(applier.apply(NS, action), PATIENCE)
    assert kube.stored(NODE, "n2") is None
    assert kube.stored(NODE, "n1") is not None
