"""Claims of a gang that started, on a kube-apiserver serving Karpenter's own NodePool and
NodeClaim CRDs (from the module the test bed pins), as the test's admin and as gangcheck's
own ServiceAccount (its admission and fence policies enforced on what it writes).

Once the gang started, a claim of its attempt it does not run on is surplus: made and never
recorded (the request has no ``Accepted``: a create's answer lost, a restart between create
and record), its node held for the request and recorded by no one, it is withdrawn the safe
way (its node's pods read live, fenced, the claim deleted only if none but DaemonSet pods are
there). (Before: left as it was, held and protected from Karpenter's disruption for as long
as the request lived.) A node found running the gang's pods, of its own claims or of an
earlier request's of its name, is handed over to the gang: no reclaim's mark left on it, its
hold lifted, the claim kept. (Before: the mark stayed, and the draining-node reconciler read
the node and its pods every 2 s for as long as the gang ran.)"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import NODE, POD, PROVISIONING_REQUEST
from gangcheck.logic.attempt.hold import HOLD_TAINT
from gangcheck.model.names import (
    ARRIVED_FOR,
    PHASE_ANNOTATION,
    RECLAIM_TAINT,
    RECLAIM_WHEN_IDLE,
    STARTED,
)
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.karpenter import KarpenterProvisioner
from gangcheck.reconcile.nodes import DrainingNodeReconciler
from tests.integration.harness import eventually
from tests.integration.karpenter_bed import Bed, karpenter_bed, request, running
from tests.integration.test_karpenter_rollback import (
    _cached,
    _made_and_registered,
    _pod,
    _refused_now,
    _taint_keys,
    acting_as,
)

pytestmark = pytest.mark.integration
Obj = dict[str, Any]


async def _started(bed: Bed, caches: Caches, *, recorded: bool) -> None:
    """The core's part: every member scheduled, the request's attempt Started; with
    ``recorded`` False its ``Accepted`` taken off again, as when the write recording the
    creation was lost (a restart between the creates and the record)."""
    name = "a-check-1"
    if not recorded:
        await bed.admin.merge_patch(
            PROVISIONING_REQUEST,
            name,
            {"status": {"conditions": None}},
            bed.namespace,
            subresource="status",
        )
    await bed.admin.merge_patch(
        PROVISIONING_REQUEST,
        name,
        {"metadata": {"annotations": {PHASE_ANNOTATION: STARTED}}},
        bed.namespace,
    )

    async def seen() -> bool:
        got = caches.requests.store.get(name, bed.namespace) or {}
        notes = got.get("metadata", {}).get("annotations") or {}
        conditions = (got.get("status") or {}).get("conditions") or []
        return notes.get(PHASE_ANNOTATION) == STARTED and (recorded or not conditions)

    await eventually(seen, what=f"{name} started, in the cache")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("identity", ["admin", "gangcheck"])
async def test_a_started_gangs_unrecorded_claims_are_withdrawn_unless_it_runs_there(
    control_plane: ControlPlane,
    node_pool_crd: None,
    claim_crd: None,
    tmp_path: Path,
    identity: str,
) -> None:
    """Gang a's two claims made, never recorded; both registered, their nodes held for the
    request and recorded by no one. A member of the gang runs on the first node (bound by
    name, consuming the request), the second is empty. The gang starts: the second claim is
    withdrawn (its node recorded for the request, fenced, the claim deleted), the first node
    is the gang's (recorded, no mark, its hold lifted, the claim kept), and the draining-node
    reconciler has nothing left to do there."""
    async with karpenter_bed(control_plane, "karp-started", "a") as bed:
        nodes = [f"node-{bed.namespace}-{i}" for i in range(2)]
        try:
            async with (
                acting_as(control_plane, identity, tmp_path, bed.admin) as kube,
                running(kube) as caches,
            ):
                karpenter = KarpenterProvisioner(kube, caches)
                made = await _made_and_registered(bed, karpenter, nodes)
                await bed.admin.create(
                    POD, _pod(bed, "member-0", nodes[0], gang=True), bed.namespace
                )
                await eventually(lambda: _cached(caches, nodes), what="the nodes in the cache")
                if identity == "gangcheck":  # its policies loaded (from informers) by now
                    await eventually(
                        lambda: _refused_now(kube, nodes[1]), what="the policies enforced"
                    )
                await _started(bed, caches, recorded=False)
                await karpenter.pass_once()
                left = await bed.claims("a")
                await karpenter.pass_once()  # again: nothing more
                left_after = await bed.claims("a")
                gangs, withdrawn = [await bed.admin.get(NODE, n) for n in nodes]
                looked = await DrainingNodeReconciler(kube, caches).reconcile(nodes[0])
        finally:
            for node in nodes:
                with contextlib.suppress(NotFoundError):
                    await bed.admin.delete(NODE, node)
    assert len(made) == 2
    assert [c["metadata"]["name"] for c in left] == [made[0]["metadata"]["name"]]
    assert [c["metadata"]["name"] for c in left_after] == [made[0]["metadata"]["name"]]
    assert gangs["metadata"]["annotations"][ARRIVED_FOR] == bed.key("a")
    assert RECLAIM_WHEN_IDLE not in gangs["metadata"]["annotations"]
    assert HOLD_TAINT not in _taint_keys(gangs)
    assert not gangs["spec"].get("unschedulable")
    assert looked.requeue_after is None
    assert withdrawn["metadata"]["annotations"][ARRIVED_FOR] == bed.key("a")
    assert withdrawn["spec"].get("unschedulable") is True
    assert RECLAIM_TAINT in _taint_keys(withdrawn)


@pytest.mark.timeout(180)
async def test_a_gang_started_on_an_earlier_requests_claim_is_handed_the_node(
    control_plane: ControlPlane, node_pool_crd: None, claim_crd: None
) -> None:
    """Gang a's request made again under its name (another uid) after the first made its two
    claims; the first claim registered, its node held under the name (which the new gang
    tolerates) and recorded by no one, kept while the new gang might use it. The new gang
    starts there (its member on the node): the node is handed over (recorded for the request,
    no reclaim's mark, hold lifted), the claim kept; the earlier request's other claim, with
    no node, is withdrawn. The draining-node reconciler has nothing to look at there."""
    async with karpenter_bed(control_plane, "karp-handed", "a") as bed:
        node = f"node-{bed.namespace}-0"
        try:
            async with running(bed.admin) as caches:
                karpenter = KarpenterProvisioner(bed.admin, caches)
                earlier = await _made_and_registered(bed, karpenter, [node])
                await bed.admin.delete(PROVISIONING_REQUEST, "a-check-1", bed.namespace)
                again = request(bed.namespace, "a")
                again["metadata"]["annotations"] = {PHASE_ANNOTATION: STARTED}
                await bed.admin.create(PROVISIONING_REQUEST, again, bed.namespace)
                await bed.admin.create(POD, _pod(bed, "member-0", node, gang=True), bed.namespace)
                await eventually(lambda: _cached(caches, [node]), what="the node in the cache")

                async def started_again() -> bool:
                    got = caches.requests.store.get("a-check-1", bed.namespace) or {}
                    notes = got.get("metadata", {}).get("annotations") or {}
                    return notes.get(PHASE_ANNOTATION) == STARTED

                await eventually(started_again, what="a-check-1 started, in the cache")
                await karpenter.pass_once()
                left = await bed.claims("a")
                handed = await bed.admin.get(NODE, node)
                looked = await DrainingNodeReconciler(bed.admin, caches).reconcile(node)
                await karpenter.pass_once()  # again: nothing more
                left_after = await bed.claims("a")
                after = await bed.admin.get(NODE, node)
        finally:
            with contextlib.suppress(NotFoundError):
                await bed.admin.delete(NODE, node)
    assert len(earlier) == 2
    assert [c["metadata"]["name"] for c in left] == [earlier[0]["metadata"]["name"]]
    assert [c["metadata"]["name"] for c in left_after] == [earlier[0]["metadata"]["name"]]
    assert handed["metadata"]["annotations"][ARRIVED_FOR] == bed.key("a")
    assert RECLAIM_WHEN_IDLE not in handed["metadata"]["annotations"]
    assert HOLD_TAINT not in _taint_keys(handed)
    assert not handed["spec"].get("unschedulable")
    assert looked.requeue_after is None
    assert after["metadata"]["resourceVersion"] == handed["metadata"]["resourceVersion"]
