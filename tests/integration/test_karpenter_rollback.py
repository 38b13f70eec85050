"""Claims of an attempt that rolls back, on a kube-apiserver serving Karpenter's own NodePool
and NodeClaim CRDs (from the module the test bed pins): its request stays as the record (a
PodGroup's backoff), and its claims not arrived are withdrawn at once, not once the request is
deleted; the one that arrived is the rollback's to reclaim and stays; nothing is written on
the request. (Before: every claim stayed, launching, until the request was deleted.)

A claim whose node exists (registered, held for the request, recorded by no one) is withdrawn
only through the reclaim's safe path: the pods bound to its node read live, the node fenced,
the claim deleted only if none but DaemonSet pods are there. (Before: deleted on the cached
node alone, with a pod bound there.) A node that reclaim did not settle (the gang's pod still
there: draining), kept later by the draining-node reconciler, has its hold lifted by a later
pass once the rollback is recorded. (Before: held for ever.) That pass follows the node's
change, the mark coming off, not the next periodic pass. (Before: up to 30 s later with no
request of the class left, 10 s with some.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import MERGE_PATCH, Kube
from gangcheck.kube.errors import ForbiddenError, NotFoundError
from gangcheck.kube.resources import (
    EVENT,
    NODE,
    NODE_CLAIM,
    POD,
    PROVISIONING_REQUEST,
    SERVICE_ACCOUNT,
)
from gangcheck.logic.attempt.hold import HOLD_TAINT
from gangcheck.model.names import (
    ARRIVED_FOR,
    CONSUME_ANNOTATION,
    OUTCOME_ANNOTATION,
    PHASE_ANNOTATION,
    RECLAIM_TAINT,
    RECLAIM_WHEN_IDLE,
    ROLLING_BACK,
)
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.karpenter import KarpenterProvisioner
from gangcheck.reconcile.nodes import DrainingNodeReconciler
from gangcheck.runtime.queue import Result
from tests.integration.harness import eventually
from tests.integration.karpenter_bed import Bed, karpenter_bed, running
from tests.integration.test_manifests import (
    apply,
    base_installed,
    build,
    overlay,
    service_account_kubeconfig,
)
from tests.waiting import cancelled

pytestmark = pytest.mark.integration
Obj = dict[str, Any]
NOW = "2026-12-01T10:00:00Z"


def _conditions(*kinds: str) -> list[Obj]:
    return [{"type": t, "status": "True", "lastTransitionTime": NOW, "reason": t} for t in kinds]


async def _roll_back(bed: Bed, caches: Caches, gang: str) -> Obj:
    """The core's part: the attempt rolls back, its request staying as the record; returns the
    request as written, once the provisioner's cache has it."""
    name = f"{gang}-check-1"
    await bed.admin.merge_patch(
        PROVISIONING_REQUEST,
        name,
        {"metadata": {"annotations": {PHASE_ANNOTATION: ROLLING_BACK}}},
        bed.namespace,
    )
    rolling = await bed.admin.get(PROVISIONING_REQUEST, name, bed.namespace)

    async def seen() -> bool:
        got = caches.requests.store.get(name, bed.namespace) or {}
        notes = got.get("metadata", {}).get("annotations") or {}
        return notes.get(PHASE_ANNOTATION) == ROLLING_BACK

    await eventually(seen, what=f"{name} rolling back, in the cache")
    return rolling


@pytest.mark.timeout(120)
async def test_claims_not_arrived_are_withdrawn_once_the_attempt_rolls_back(
    control_plane: ControlPlane, node_pool_crd: None, claim_crd: None
) -> None:
    async with (
        karpenter_bed(control_plane, "karp-rollback", "a") as bed,
        running(bed.admin) as caches,
    ):
        karpenter = KarpenterProvisioner(bed.admin, caches)
        await karpenter.pass_once()
        made = await bed.claims("a")
        # Karpenter's part: the first claim arrived (Initialized, its node named)
        arrived = made[0]["metadata"]["name"]
        await bed.admin.merge_patch(
            NODE_CLAIM,
            arrived,
            {
                "status": {
                    "nodeName": f"node-{bed.namespace}",
                    "conditions": _conditions("Launched", "Registered", "Initialized"),
                }
            },
            subresource="status",
        )
        rolling = await _roll_back(bed, caches, "a")
        await karpenter.pass_once()
        left = await bed.claims("a")
        await karpenter.pass_once()  # again: nothing more
        left_after = await bed.claims("a")
        after = await bed.admin.get(PROVISIONING_REQUEST, "a-check-1", bed.namespace)
    assert len(made) == 2
    assert [c["metadata"]["name"] for c in left] == [arrived]
    assert [c["metadata"]["name"] for c in left_after] == [arrived]
    assert after["metadata"]["resourceVersion"] == rolling["metadata"]["resourceVersion"]
    assert "Failed" not in {c["type"] for c in (after.get("status") or {}).get("conditions") or []}


async def _registered(bed: Bed, claim: Obj, node: str) -> None:
    """Karpenter's part for one claim: its node registered (the claim's taints synced onto it,
    the hold among them; owned by the claim), the claim Registered, not Initialized."""
    meta = claim["metadata"]
    await bed.admin.create(
        NODE,
        {
            "metadata": {
                "name": node,
                "ownerReferences": [
                    {
                        "apiVersion": claim["apiVersion"],
                        "kind": "NodeClaim",
                        "name": meta["name"],
                        "uid": meta["uid"],
                    }
                ],
            },
            "spec": {"providerID": f"kwok://{node}", "taints": claim["spec"]["taints"]},
        },
    )
    status = {
        "nodeName": node,
        "providerID": f"kwok://{node}",
        "conditions": _conditions("Launched", "Registered"),
    }
    await bed.admin.merge_patch(NODE_CLAIM, meta["name"], {"status": status}, subresource="status")


async def _made_and_registered(
    bed: Bed, karpenter: KarpenterProvisioner, nodes: list[str]
) -> list[Obj]:
    """The provisioner's pass makes gang a's claims; Karpenter registers the first of them on
    `nodes` (held for the request, recorded by no one; `_registered`); the namespace's
    default ServiceAccount made, for the pods a test binds there (no controller makes it
    here). Returns every claim made."""
    await karpenter.pass_once()
    made = await bed.claims("a")
    for claim, node in zip(made[: len(nodes)], nodes, strict=True):
        await _registered(bed, claim, node)
    account = {"metadata": {"name": "default", "namespace": bed.namespace}}
    await bed.admin.create(SERVICE_ACCOUNT, account)
    return made


@contextlib.asynccontextmanager
async def acting_as(
    control_plane: ControlPlane, identity: str, folder: Path, admin: Kube
) -> AsyncIterator[Kube]:
    """The provisioner's client: the test's (admin), or gangcheck's own ServiceAccount with
    the base and the Karpenter component installed, their admission and fence policies
    enforced on what it writes."""
    if identity == "admin":
        yield admin
        return
    with base_installed(control_plane):
        apply(control_plane, build(control_plane, overlay(folder, "karpenter")))
        kubeconfig = service_account_kubeconfig(control_plane, folder)
        async with await Kube.connect(str(kubeconfig)) as account:
            yield account


@pytest.mark.timeout(180)
@pytest.mark.parametrize("identity", ["admin", "gangcheck"])
async def test_a_claims_node_is_withdrawn_only_once_the_reclaim_finds_no_pod_there(
    control_plane: ControlPlane,
    node_pool_crd: None,
    claim_crd: None,
    tmp_path: Path,
    identity: str,
) -> None:
    """Both claims registered, not Initialized, their nodes held for the request and recorded
    by no one (the ledger takes no node for an attempt rolling back); a pod (no DaemonSet's,
    not the gang's: one bound by name) runs on the first claim's node. The rollback withdraws
    the second claim through the reclaim's safe path (its node recorded for the request with
    the reclaim's mark, fenced, the claim deleted), and keeps the first: its node is said kept
    (an Event naming the pod) and its hold lifted, the pod's node given back to the pool.
    Alike as gangcheck's own account, where the admission policy lets it record, fence and
    reclaim only a node recorded as arrived. Before, both claims were deleted, the pod's node
    with its claim."""
    async with karpenter_bed(control_plane, "karp-withdraw", "a") as bed:
        nodes = [f"node-{bed.namespace}-{i}" for i in range(2)]
        try:
            async with (
                acting_as(control_plane, identity, tmp_path, bed.admin) as kube,
                running(kube) as caches,
            ):
                karpenter = KarpenterProvisioner(kube, caches)
                made = await _made_and_registered(bed, karpenter, nodes)
                pod = {
                    "metadata": {"name": "bound-by-name", "namespace": bed.namespace},
                    "spec": {"nodeName": nodes[0], "containers": [{"name": "c", "image": "x"}]},
                }
                await bed.admin.create(POD, pod, bed.namespace)
                await eventually(lambda: _cached(caches, nodes), what="the nodes in the cache")
                if identity == "gangcheck":  # its policies loaded (from informers) by now
                    await eventually(
                        lambda: _refused_now(kube, nodes[1]), what="the policies enforced"
                    )
                await _roll_back(bed, caches, "a")
                await karpenter.pass_once()
                left = await bed.claims("a")
                await karpenter.pass_once()  # again: nothing more
                left_after = await bed.claims("a")
                kept, reclaimed = [await bed.admin.get(NODE, n) for n in nodes]
                said = await bed.admin.list_objects(
                    EVENT, field_selector=f"involvedObject.name={nodes[0]}"
                )
        finally:
            for node in nodes:
                with contextlib.suppress(NotFoundError):
                    await bed.admin.delete(NODE, node)
    assert len(made) == 2
    assert [c["metadata"]["name"] for c in left] == [made[0]["metadata"]["name"]]
    assert [c["metadata"]["name"] for c in left_after] == [made[0]["metadata"]["name"]]
    assert HOLD_TAINT not in {t["key"] for t in kept["spec"].get("taints") or []}
    assert not kept["spec"].get("unschedulable")
    assert RECLAIM_WHEN_IDLE not in kept["metadata"]["annotations"]
    assert reclaimed["spec"].get("unschedulable") is True
    assert RECLAIM_TAINT in {t["key"] for t in reclaimed["spec"].get("taints") or []}
    assert reclaimed["metadata"]["annotations"][ARRIVED_FOR] == bed.key("a")
    (event,) = [e for e in said["items"] if e["reason"] == "NodeKept"]
    assert f"runs pod {bed.namespace}/bound-by-name" in event["message"], event["message"]


async def _refused_now(kube: Kube, node: str) -> bool:
    """Whether the admission policy refuses (dry run) gangcheck a reclaim's mark on a node it
    has not recorded as arrived."""
    patch = {"metadata": {"annotations": {RECLAIM_WHEN_IDLE: "{}"}}}
    try:
        await kube.request(
            "PATCH",
            NODE.object_path(node, None),
            query={"dryRun": "All"},
            body=patch,
            content_type=MERGE_PATCH,
        )
    except ForbiddenError as e:
        return "reclaim-when-idle" in e.message
    return False


async def _cached(caches: Caches, nodes: list[str]) -> bool:
    return all(caches.nodes.store.get(n) is not None for n in nodes)


@pytest.mark.timeout(120)
async def test_a_claims_node_kept_after_its_reclaim_drained_has_its_hold_lifted(
    control_plane: ControlPlane, node_pool_crd: None, claim_crd: None
) -> None:
    """The first claim registered, its node held and recorded by no one, a pod of the gang
    there (bound by name, consuming the request). The rollback withdraws the claim through
    the reclaim's safe path, which finds the gang's pod: draining, the node recorded for the
    request with the reclaim's mark, its hold on. The pod ends, another (no gang's) is bound
    there: the draining-node reconciler keeps the node (NodeKept, the mark gone). While the
    rollback is under way its hold stays (the rollback lifts the holds of what is recorded
    for it once done); once its outcome is recorded, the next pass lifts it, the claim kept,
    every other taint kept. Before, only the withdrawal's own reclaim lifted a hold: this
    node stayed closed to every pod but a dead gang's."""
    async with karpenter_bed(control_plane, "karp-drained", "a") as bed:
        node = f"node-{bed.namespace}-0"
        try:
            async with running(bed.admin) as caches:
                karpenter = KarpenterProvisioner(bed.admin, caches)
                first = (await _made_and_registered(bed, karpenter, [node]))[0]
                await bed.admin.create(
                    POD, _pod(bed, "gang-member", node, gang=True), bed.namespace
                )
                await eventually(lambda: _cached(caches, [node]), what="the node in the cache")
                rolling = await _roll_back(bed, caches, "a")
                await karpenter.pass_once()
                draining = await bed.admin.get(NODE, node)
                kept = await _kept(bed, caches, node)
                await eventually(
                    lambda: _unmarked(caches, node), what="the node unmarked, in the cache"
                )
                await karpenter.pass_once()
                during = await bed.admin.get(NODE, node)
                outcome = {OUTCOME_ANNOTATION: '{"reclaimed": []}'}
                await bed.admin.merge_patch(
                    PROVISIONING_REQUEST,
                    "a-check-1",
                    {"metadata": {"annotations": outcome}},
                    bed.namespace,
                )
                await eventually(
                    lambda: _recorded_outcome(caches, bed), what="the outcome, in the cache"
                )
                await karpenter.pass_once()
                after = await bed.admin.get(NODE, node)
                left = await bed.claims("a")
                said = await bed.admin.list_objects(
                    EVENT, field_selector=f"involvedObject.name={node}"
                )
        finally:
            with contextlib.suppress(NotFoundError):
                await bed.admin.delete(NODE, node)
    assert rolling["metadata"]["annotations"][PHASE_ANNOTATION] == ROLLING_BACK
    notes = draining["metadata"]["annotations"]
    assert notes[ARRIVED_FOR] == bed.key("a") and RECLAIM_WHEN_IDLE in notes
    assert HOLD_TAINT in _taint_keys(draining)
    assert kept.requeue_after is None
    assert RECLAIM_WHEN_IDLE not in during["metadata"]["annotations"]
    assert HOLD_TAINT in _taint_keys(during)  # the rollback still under way
    assert HOLD_TAINT not in _taint_keys(after)
    assert _taint_keys(after) == _taint_keys(during) - {HOLD_TAINT}
    assert after["metadata"]["annotations"][ARRIVED_FOR] == bed.key("a")
    assert not after["spec"].get("unschedulable")
    assert [c["metadata"]["name"] for c in left] == [first["metadata"]["name"]]
    (event,) = [e for e in said["items"] if e["reason"] == "NodeKept"]
    assert f"runs pod {bed.namespace}/bound-by-name" in event["message"], event["message"]


def _pod(bed: Bed, name: str, node: str, *, gang: bool = False) -> Obj:
    """A pod bound to ``node`` by name; of the gang (consuming its request) or of no one."""
    notes = {CONSUME_ANNOTATION: "a-check-1"} if gang else {}
    return {
        "metadata": {"name": name, "namespace": bed.namespace, "annotations": notes},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
    }


async def _kept(bed: Bed, caches: Caches, node: str) -> Result:
    """The gang's pod on the draining `node` ends and another, no gang's, is bound there by
    name: the draining-node reconciler's pass on the node (it keeps it: NodeKept, the mark
    taken off)."""
    await bed.admin.merge_patch(
        POD, "gang-member", {"status": {"phase": "Succeeded"}}, bed.namespace, subresource="status"
    )
    await bed.admin.create(POD, _pod(bed, "bound-by-name", node), bed.namespace)
    return await DrainingNodeReconciler(bed.admin, caches).reconcile(node)


def _taint_keys(node: Obj) -> set[str]:
    return {t["key"] for t in node["spec"].get("taints") or []}


async def _unmarked(caches: Caches, node: str) -> bool:
    got = caches.nodes.store.get(node) or {}
    return RECLAIM_WHEN_IDLE not in (got.get("metadata", {}).get("annotations") or {})


async def _recorded_outcome(caches: Caches, bed: Bed) -> bool:
    got = caches.requests.store.get("a-check-1", bed.namespace) or {}
    return OUTCOME_ANNOTATION in (got.get("metadata", {}).get("annotations") or {})


@pytest.mark.timeout(120)
async def test_a_kept_nodes_hold_is_lifted_on_the_change_that_keeps_it_not_at_the_resync(
    control_plane: ControlPlane, node_pool_crd: None, claim_crd: None
) -> None:
    """The first claim's node drained by the rollback's withdrawal (the gang's pod there:
    recorded for the request, marked, held); the request then deleted (its holds released),
    no request of the class left, the provisioner running (``run``), its passes 30 s apart
    when nothing wakes them. The draining-node reconciler keeps the node (the pod ended,
    another bound there): the node informer's change wakes a pass, which lifts the hold
    within seconds. Before, no node change woke a pass, and a woken pass with no request of
    the class did nothing until 30 s had passed since the last."""
    async with karpenter_bed(control_plane, "karp-kept-woken", "a") as bed:
        node = f"node-{bed.namespace}-0"
        try:
            async with running(bed.admin) as caches:
                karpenter = KarpenterProvisioner(bed.admin, caches)
                caches.nodes.add_handler(karpenter.on_node)  # as the controller wires it
                await _made_and_registered(bed, karpenter, [node])
                await bed.admin.create(
                    POD, _pod(bed, "gang-member", node, gang=True), bed.namespace
                )
                await eventually(lambda: _cached(caches, [node]), what="the node in the cache")
                await _roll_back(bed, caches, "a")
                await karpenter.pass_once()
                draining = await bed.admin.get(NODE, node)
                await bed.admin.delete(PROVISIONING_REQUEST, "a-check-1", bed.namespace)
                await eventually(
                    lambda: _request_gone(caches, bed), what="the request gone from the cache"
                )
                passes = asyncio.create_task(karpenter.run())
                try:
                    await eventually(lambda: _ran(karpenter), what="a pass run")
                    kept = await _kept(bed, caches, node)
                    lifted = await eventually(
                        lambda: _unheld(bed, node), timeout=5.0, what="the hold lifted"
                    )
                finally:
                    await cancelled(passes)
        finally:
            with contextlib.suppress(NotFoundError):
                await bed.admin.delete(NODE, node)
    notes = draining["metadata"]["annotations"]
    assert notes[ARRIVED_FOR] == bed.key("a") and RECLAIM_WHEN_IDLE in notes
    assert HOLD_TAINT in _taint_keys(draining)
    assert kept.requeue_after is None
    assert RECLAIM_WHEN_IDLE not in lifted["metadata"]["annotations"]
    assert _taint_keys(draining) - {HOLD_TAINT} <= _taint_keys(lifted)  # every other kept


async def _request_gone(caches: Caches, bed: Bed) -> bool:
    return caches.requests.store.get("a-check-1", bed.namespace) is None


async def _ran(karpenter: KarpenterProvisioner) -> bool:
    return karpenter.passes > 0


async def _unheld(bed: Bed, node: str) -> Obj | None:
    got = await bed.admin.get(NODE, node)
    return got if HOLD_TAINT not in _taint_keys(got) else None
