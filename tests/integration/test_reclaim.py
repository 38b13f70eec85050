"""Each reclaimer, and the safety rules, against a real kube-apiserver.

NodeClaim and Cluster API CRDs are test CRDs of ours (tests/crds/), shaped like the fields
the reclaimers touch; no pinned module provides them. Where a fault the real server cannot
produce on demand is needed (an answer lost after the write was applied, a 403, a crash
right after fencing, another writer or a bind at an exact moment), the test wraps the
client's calls around the real server and says so; everything else is the server's own
behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from gangcheck_dev.testbed import crds

from gangcheck.kube.client import MERGE_PATCH, Kube
from gangcheck.kube.errors import (
    ApiError,
    FencedError,
    ForbiddenError,
    NotFoundError,
    TransientError,
)
from gangcheck.kube.informer import Store
from gangcheck.kube.resources import (
    EVENT,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    NAMESPACE,
    NODE,
    NODE_CLAIM,
    POD,
    SERVICE_ACCOUNT,
)
from gangcheck.logic.attempt.actions import ReclaimArrivals
from gangcheck.logic.attempt.not_removed import NOT_REMOVED_REPEAT_SECONDS
from gangcheck.logic.attempt.reclaim import LEFT_FOR_SCALE_DOWN_SECONDS
from gangcheck.logic.placement.fit import CLAIM_DELETING, DELETING
from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.model.names import FENCE_LABEL, RECLAIMED_AT
from gangcheck.reclaim import safely
from gangcheck.reclaim.arrivals import reclaim_arrivals, tell
from gangcheck.reclaim.reclaimers import REVISION_ANNOTATION as REVISION
from gangcheck.reclaim.safely import Result, Target
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.events import EventRecorder
from gangcheck.reconcile.nodes import DrainingNodeReconciler
from gangcheck.runtime.queue import Result as QueueResult
from gangcheck.telemetry import Metrics
from tests.builders import container
from tests.integration.harness import ARRIVED, TEST_CRDS, apply, deny_policy, eventually

pytestmark = pytest.mark.integration
_ids = itertools.count(1)
Obj = dict[str, Any]
MARK = "gangcheck.io/reclaim-when-idle"
KARPENTER_FINALIZER = "karpenter.sh/termination"
DRAIN_FINALIZER = "example.com/drain"
OUR_TAINT = "gangcheck.io/reclaiming"
SETTLE = 0.2


async def reclaim_safely(kube: Kube, target: Target, now: datetime) -> Result:
    """The reclaim under test, with a short settle so the suite stays quick."""
    return await safely.reclaim_safely(kube, target, now, settle_seconds=SETTLE)


def fence_of(node: Obj) -> tuple[bool, list[str], str | None]:
    """(cordoned, taint keys but the server's own, reclaim mark) of a node as read."""
    spec = node.get("spec") or {}
    server_own = "node.kubernetes.io/"  # not-ready, added by the TaintNodesByCondition plugin
    keys = [t["key"] for t in spec.get("taints") or [] if not t["key"].startswith(server_own)]
    return (
        bool(spec.get("unschedulable")),
        keys,
        (node["metadata"].get("annotations") or {}).get(MARK),
    )


@pytest.fixture(scope="module")
def reclaim_crds(control_plane: Any) -> None:
    crds.install_crds(control_plane.client(), crds.load_crds(TEST_CRDS))


@pytest.fixture
async def kube(control_plane: Any, reclaim_crds: None) -> AsyncIterator[Kube]:
    async with await Kube.connect(str(control_plane.kubeconfig)) as k:
        yield k


class Bed:
    """A namespace, a request time, and nodes recorded as arrived for that request."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.request = f"{ns}/gang-atomic-1"
        self.request_created = format_time(datetime.now(UTC) - timedelta(seconds=30))
        self.nodes: list[str] = []

    async def node(
        self,
        *,
        claim: str | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        **meta: Any,
    ) -> str:
        name = f"{self.ns}-n{next(_ids)}"
        body = {"metadata": {
            "name": name,
            "labels": labels or {},
            "annotations": {ARRIVED: claim or self.request, **(annotations or {})},
            **meta,
        }}  # fmt: skip
        await self.kube.create(NODE, body)
        self.nodes.append(name)
        return name

    async def pod(self, name: str, node: str, **meta: Any) -> None:
        body = {"metadata": {"name": name, "namespace": self.ns, **meta},
                "spec": {"nodeName": node, "containers": [container()]}}  # fmt: skip
        await self.kube.create(POD, body)

    async def bind(self, name: str, node: str) -> None:
        """A pod tolerating every taint, bound the way a scheduler binds (pods/binding)."""
        spec = {"tolerations": [{"operator": "Exists"}], "containers": [container()]}
        body = {"metadata": {"name": name, "namespace": self.ns}, "spec": spec}
        await self.kube.create(POD, body)
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
        await self.kube.request("POST", POD.object_path(name, self.ns) + "/binding", body=binding)

    async def events(self, node: str) -> list[tuple[str, str]]:
        """(reason, message) of the Events gangcheck recorded on the node."""
        listed = await self.kube.list_objects(
            EVENT, "default", field_selector=f"involvedObject.name={node}"
        )
        return [(e["reason"], e["message"]) for e in listed.get("items") or []]

    def target(self, node: str, reclaimer: str = "DeleteNode") -> Target:
        return Target(node, self.request, self.request_created, reclaimer)

    async def exists(self, node: str) -> bool:
        try:
            await self.kube.get(NODE, node)
        except NotFoundError:
            return False
        return True


@contextlib.asynccontextmanager
async def new_bed(kube: Kube) -> AsyncIterator[Bed]:
    """A bed in a namespace of its own; its nodes are deleted after."""
    ns = f"rc{next(_ids)}-{datetime.now(UTC).strftime('%H%M%S%f')}"
    await kube.create(NAMESPACE, {"metadata": {"name": ns}})
    await kube.create(SERVICE_ACCOUNT, {"metadata": {"name": "default", "namespace": ns}})
    b = Bed(kube, ns)
    try:
        yield b
    finally:
        for node in b.nodes:
            with contextlib.suppress(NotFoundError):
                await kube.delete(NODE, node)


@pytest.fixture
async def bed(kube: Kube) -> AsyncIterator[Bed]:
    async with new_bed(kube) as b:
        yield b


NOW = datetime.now


async def test_delete_node_reclaims_an_idle_arrival(bed: Bed) -> None:
    node = await bed.node()
    result = await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
    assert result.verdict == "reclaimed"
    assert not await bed.exists(node)


async def test_daemonset_pods_do_not_keep_a_node(bed: Bed) -> None:
    node = await bed.node()
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u1",
             "controller": True}  # fmt: skip
    await bed.pod("agent-x", node, ownerReferences=[owner])
    assert (await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))).verdict == "reclaimed"


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("opt-out", "opt-out label"),
        ("other-request", "recorded for"),
        ("foreign-pod", "runs pod"),
    ],
    ids=[
        "the opt-out label keeps a node",
        "a node recorded for another request is kept",
        "a node running another pod is kept",
    ],
)
async def test_safety_keeps_the_node(bed: Bed, setup: str, reason: str) -> None:
    if setup == "opt-out":
        node = await bed.node(labels={"gangcheck.io/do-not-reclaim": "true"})
    elif setup == "other-request":
        node = await bed.node(claim=f"{bed.ns}/other-atomic-1")
    else:
        node = await bed.node()
        await bed.pod("someone-else", node)
    result = await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
    assert result.verdict == "keep"
    assert reason in result.reason
    fresh = await bed.kube.get(NODE, node)
    assert not fresh["spec"].get("unschedulable")
    assert not [
        t for t in fresh["spec"].get("taints") or [] if t["key"] == "gangcheck.io/reclaiming"
    ]


async def test_a_node_older_than_the_request_is_kept(bed: Bed) -> None:
    node = await bed.node()
    target = Target(node, bed.request, format_time(NOW(UTC) + timedelta(hours=1)), "DeleteNode")
    result = await reclaim_safely(bed.kube, target, NOW(UTC))
    assert result.verdict == "keep"
    assert "not proven younger than the request" in result.reason
    assert await bed.exists(node)


async def test_a_node_created_the_same_second_as_the_request_is_never_reclaimed(
    bed: Bed,
) -> None:
    """Defect 2: creationTimestamp has 1 s resolution; a node stamped in the request's own
    second may predate it, so it is not proven younger and is kept, unfenced."""
    node = await bed.node()
    born = (await bed.kube.get(NODE, node))["metadata"]["creationTimestamp"]
    target = Target(node, bed.request, born, "DeleteNode")
    result = await reclaim_safely(bed.kube, target, NOW(UTC))
    assert result.verdict == "keep"
    assert "not proven younger" in result.reason
    assert fence_of(await bed.kube.get(NODE, node)) == (False, [], None)


async def test_gang_pods_make_the_node_wait_and_it_is_marked(bed: Bed) -> None:
    node = await bed.node()
    consume = {"autoscaling.x-k8s.io/consume-provisioning-request": "gang-atomic-1"}
    await bed.pod("member-0", node, annotations=consume)
    result = await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
    assert result.verdict == "drain"
    mark = (await bed.kube.get(NODE, node))["metadata"]["annotations"]
    assert "gangcheck.io/reclaim-when-idle" in mark


async def test_a_pod_bound_after_fencing_wins(bed: Bed) -> None:
    """The race: a pod lands between the first look and the act. The node is kept, unfenced."""
    node = await bed.node()
    kube = bed.kube
    original = kube.merge_patch

    async def fence_then_bind(res: Any, name: str, patch: Any, *a: Any, **kw: Any) -> Any:
        result = await original(res, name, patch, *a, **kw)
        if res is NODE and (patch.get("spec") or {}).get("unschedulable") is True:
            await bed.pod("late-arrival", node)  # bound by someone just as we fenced
        return result

    kube.merge_patch = fence_then_bind  # type: ignore[method-assign]
    try:
        result = await reclaim_safely(kube, bed.target(node), NOW(UTC))
    finally:
        kube.merge_patch = original  # type: ignore[method-assign]
    assert result.verdict == "keep"
    assert "late-arrival" in result.reason
    fresh = await kube.get(NODE, node)
    assert not fresh["spec"].get("unschedulable")
    assert not [
        t for t in fresh["spec"].get("taints") or [] if t["key"] == "gangcheck.io/reclaiming"
    ]


async def test_cordon_and_taint_leaves_the_node_to_the_autoscaler(bed: Bed) -> None:
    """Cordoned and tainted for cluster-autoscaler's scale-down, for good; the fence label,
    needed only while gangcheck was about to act, comes off (DaemonSet pods may bind
    again: test_fence_policy.py), the owed mark too, and the node records when it was left
    (gangcheck.io/reclaimed-at), what the draining-node reconciler says it by if it stays."""
    node = await bed.node(labels={"example.com/pool": "gpu"})
    before = NOW(UTC).replace(microsecond=0)
    result = await reclaim_safely(bed.kube, bed.target(node, "CordonAndTaint"), NOW(UTC))
    assert result.verdict == "reclaimed"
    fresh = await bed.kube.get(NODE, node)
    assert fence_of(fresh) == (True, [OUR_TAINT], None)
    assert fresh["metadata"]["labels"] == {"example.com/pool": "gpu"}
    left = parse_time(fresh["metadata"]["annotations"][RECLAIMED_AT])
    assert left is not None and before <= left <= NOW(UTC)
    assert fresh["metadata"]["annotations"][ARRIVED] == bed.request  # kept: the ledger's


async def test_a_cordon_and_taint_reclaim_run_again_finds_the_node_left_and_is_done(
    bed: Bed,
) -> None:
    """The rollback's outcome write lost, its reclaim runs again on the node CordonAndTaint
    left: done as it was (reclaimed, the same record of when), not fenced and judged again;
    a pod tolerating the taint that bound there since (the label off allows it) is neither
    taken for a reason to keep the node (uncordoned, untainted: the outcome said kept) nor
    reported as bound too late."""
    node = await bed.node()
    first = await reclaim_safely(bed.kube, bed.target(node, "CordonAndTaint"), NOW(UTC))
    assert first.verdict == "reclaimed" and first.bound_too_late == ()
    left = await bed.kube.get(NODE, node)
    await bed.bind("tolerates-all", node)
    again = await reclaim_safely(bed.kube, bed.target(node, "CordonAndTaint"), NOW(UTC))
    assert again.verdict == "reclaimed", again
    assert again.bound_too_late == ()
    fresh = await bed.kube.get(NODE, node)
    assert fence_of(fresh) == (True, [OUR_TAINT], None)
    assert (
        fresh["metadata"]["annotations"][RECLAIMED_AT]
        == (left["metadata"]["annotations"][RECLAIMED_AT])
    )
    assert FENCE_LABEL not in (fresh["metadata"].get("labels") or {})


async def test_a_node_left_for_scale_down_and_still_there_is_said(bed: Bed) -> None:
    """A node CordonAndTaint reclaimed that cluster-autoscaler has not removed after
    LEFT_FOR_SCALE_DOWN_SECONDS (its node group at min size, scale-down disabled) is said: a
    Warning Event ReclaimedNodeNotRemoved on the Node naming the likely causes and what to
    do, said again only after the repeat; before the bound nothing is said and the
    reconciler comes back at the bound. Nothing of the node is changed: it stays cordoned and
    tainted (gangcheck does not return it to service itself: docs/reclaimers.md)."""
    node = await bed.node()
    result = await reclaim_safely(bed.kube, bed.target(node, "CordonAndTaint"), NOW(UTC))
    assert result.verdict == "reclaimed"
    caches = _Caches(bed.kube)
    await caches.refresh(node)
    clock = {"now": NOW(UTC)}
    reconciler = DrainingNodeReconciler(
        bed.kube,
        caches,  # type: ignore[arg-type]
        clock=lambda: clock["now"],
    )
    reconciler.metrics = Metrics()
    early = await reconciler.reconcile(node)
    assert early.requeue_after is not None
    assert LEFT_FOR_SCALE_DOWN_SECONDS - 60 < early.requeue_after <= LEFT_FOR_SCALE_DOWN_SECONDS
    assert await bed.events(node) == []
    clock["now"] += timedelta(seconds=LEFT_FOR_SCALE_DOWN_SECONDS + 1)
    late = await reconciler.reconcile(node)
    # back at the next slot's start (counted from reclaimed-at, a second or two before)
    assert late.requeue_after is not None
    assert NOT_REMOVED_REPEAT_SECONDS - 5 < late.requeue_after < NOT_REMOVED_REPEAT_SECONDS
    said = [m for r, m in await bed.events(node) if r == "ReclaimedNodeNotRemoved"]
    assert len(said) == 1
    for words in ("min size", "scale-down", "kubectl uncordon", "gangcheck.io/reclaiming-"):
        assert words in said[0]
    assert "gangcheck_reclaimed_nodes_not_removed_total 1" in reconciler.metrics.render()
    assert await reconciler.reconcile(node) == late  # woken by a node update: not said again
    assert len([r for r, _ in await bed.events(node) if r == "ReclaimedNodeNotRemoved"]) == 1
    fresh = await bed.kube.get(NODE, node)
    assert fence_of(fresh) == (True, [OUR_TAINT], None)
    assert RECLAIMED_AT in fresh["metadata"]["annotations"]


async def test_a_node_still_there_is_said_once_per_slot_across_restarts(bed: Bed) -> None:
    """The reconciler restarted (a new instance: nothing in memory, as after a rollout or a
    new leader) within the slot the node was said in says nothing: the slot's Event is
    named for it and the real server answers its create 409 AlreadyExists. The next slot
    (reclaimed-at + bound + one repeat) says it once, by the instance then running."""
    node = await bed.node()
    result = await reclaim_safely(bed.kube, bed.target(node, "CordonAndTaint"), NOW(UTC))
    assert result.verdict == "reclaimed"
    caches = _Caches(bed.kube)
    await caches.refresh(node)
    left = parse_time((await bed.kube.get(NODE, node))["metadata"]["annotations"][RECLAIMED_AT])
    assert left is not None
    bound = left + timedelta(seconds=LEFT_FOR_SCALE_DOWN_SECONDS)
    clock = {"now": bound + timedelta(seconds=5)}

    def started() -> DrainingNodeReconciler:
        r = DrainingNodeReconciler(bed.kube, caches, clock=lambda: clock["now"])  # type: ignore[arg-type]
        r.metrics = Metrics()
        return r

    def not_removed(events: list[tuple[str, str]]) -> int:
        return len([r for r, _ in events if r == "ReclaimedNodeNotRemoved"])

    first = started()
    assert (await first.reconcile(node)).requeue_after == NOT_REMOVED_REPEAT_SECONDS - 5
    assert not_removed(await bed.events(node)) == 1
    clock["now"] = bound + timedelta(seconds=NOT_REMOVED_REPEAT_SECONDS / 2)
    restarted = started()
    again = await restarted.reconcile(node)
    assert again.requeue_after == NOT_REMOVED_REPEAT_SECONDS / 2  # the next slot's start
    assert not_removed(await bed.events(node)) == 1
    assert "gangcheck_reclaimed_nodes_not_removed_total 0" in restarted.metrics.render()
    clock["now"] = bound + timedelta(seconds=NOT_REMOVED_REPEAT_SECONDS)
    assert (await restarted.reconcile(node)).requeue_after == NOT_REMOVED_REPEAT_SECONDS
    await restarted.reconcile(node)  # woken by a node update in that slot
    await started().reconcile(node)  # and restarted once more in it
    assert not_removed(await bed.events(node)) == 2
    assert "gangcheck_reclaimed_nodes_not_removed_total 1" in restarted.metrics.render()
    fresh = await bed.kube.get(NODE, node)
    assert fence_of(fresh) == (True, [OUR_TAINT], None)


async def test_a_node_returned_to_service_by_a_person_is_not_said(bed: Bed) -> None:
    """Following the Event's advice (uncordon, take the taint off) ends it: the node no longer
    carries gangcheck's taint, so its reclaimed-at record is taken off and nothing is said."""
    node = await bed.node()
    result = await reclaim_safely(bed.kube, bed.target(node, "CordonAndTaint"), NOW(UTC))
    assert result.verdict == "reclaimed"
    returned = {"spec": {"unschedulable": None, "taints": None}}
    await bed.kube.merge_patch(NODE, node, returned)
    caches = _Caches(bed.kube)
    await caches.refresh(node)
    later = NOW(UTC) + timedelta(seconds=LEFT_FOR_SCALE_DOWN_SECONDS + 1)
    reconciler = DrainingNodeReconciler(bed.kube, caches, clock=lambda: later)  # type: ignore[arg-type]
    assert await reconciler.reconcile(node) == QueueResult()
    assert await bed.events(node) == []
    fresh = await bed.kube.get(NODE, node)
    assert RECLAIMED_AT not in (fresh["metadata"].get("annotations") or {})


async def test_cordon_and_taint_keeps_an_administrators_scale_down_disabled(bed: Bed) -> None:
    """Defect 7: `scale-down-disabled: "true"` set by an administrator is never overwritten;
    the node is kept with that reason and unfenced."""
    disabled = {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}
    node = await bed.node(annotations=disabled)
    result = await reclaim_safely(bed.kube, bed.target(node, "CordonAndTaint"), NOW(UTC))
    assert result.verdict == "keep"
    assert "scale-down-disabled=true" in result.reason
    fresh = await bed.kube.get(NODE, node)
    assert (
        fresh["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/scale-down-disabled"]
        == "true"
    )
    assert fence_of(fresh) == (False, [], None)


async def test_delete_node_claim_removes_the_claim_that_owns_the_node(bed: Bed) -> None:
    body = {"metadata": {"name": f"{bed.ns}-claim"}, "spec": {}}
    claim = await bed.kube.create(NODE_CLAIM, body)
    meta = claim["metadata"]
    owner = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": meta["name"],
             "uid": meta["uid"]}  # fmt: skip
    node = await bed.node(ownerReferences=[owner])
    await bed.kube.merge_patch(
        NODE_CLAIM, meta["name"], {"status": {"nodeName": node}}, subresource="status"
    )
    result = await reclaim_safely(bed.kube, bed.target(node, "DeleteNodeClaim"), NOW(UTC))
    assert result.verdict == "reclaimed"
    with pytest.raises(NotFoundError):
        await bed.kube.get(NODE_CLAIM, claim["metadata"]["name"])


@pytest.mark.parametrize("reclaimer", ["DeleteNodeClaim", "DeleteMachine"])
async def test_a_node_opted_out_after_the_last_look_keeps_its_claim_or_machine(
    bed: Bed, reclaimer: str
) -> None:
    """A person opts the node out (gangcheck.io/do-not-reclaim) right after the last look at
    its pods: the reclaimers that act on another object (its NodeClaim, its Machine) act only
    on the node as judged, as DeleteNode's resourceVersion precondition does: the node is
    judged again and kept, its claim (its Machine, its MachineDeployment) untouched."""
    kube = bed.kube
    if reclaimer == "DeleteMachine":
        node = await machine_bed(bed)
    else:
        claim = await kube.create(NODE_CLAIM, {"metadata": {"name": f"{bed.ns}-oc"}, "spec": {}})
        meta = claim["metadata"]
        owner = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": meta["name"],
                 "uid": meta["uid"]}  # fmt: skip
        node = await bed.node(ownerReferences=[owner])
        await kube.merge_patch(
            NODE_CLAIM, meta["name"], {"status": {"nodeName": node}}, subresource="status"
        )
    opt_out = {"metadata": {"labels": {"gangcheck.io/do-not-reclaim": "true"}}}
    # the fence's look (bound, nominated), then the re-check's: after its 4th pod list
    restore = after_first_recheck(
        kube, node, lambda: kube.merge_patch(NODE, node, opt_out), lists=4
    )
    try:
        result = await reclaim_safely(kube, bed.target(node, reclaimer), NOW(UTC))
    finally:
        restore()
    assert (result.verdict, result.reason) == (
        "keep",
        "carries the opt-out label gangcheck.io/do-not-reclaim",
    )
    assert fence_of(await kube.get(NODE, node)) == (False, [], None)
    if reclaimer == "DeleteMachine":
        machine = await kube.get(MACHINE, "m1", bed.ns)
        assert "cluster.x-k8s.io/delete-machine" not in (
            machine["metadata"].get("annotations") or {}
        )
        assert (await kube.get(MACHINE_DEPLOYMENT, "md", bed.ns))["spec"]["replicas"] == 3
    else:
        assert not (await kube.get(NODE_CLAIM, f"{bed.ns}-oc"))["metadata"].get("deletionTimestamp")


async def test_a_reclaims_delete_is_in_the_caches_as_the_server_answered_it(bed: Bed) -> None:
    """What the caches show right after a reclaim's delete, before any watch event, is what
    kube-apiserver answered: a Node gone (its Status) is no longer cached; one a finalizer
    keeps is cached with its deletionTimestamp, no capacity; a NodeClaim Karpenter's
    finalizer keeps is cached being deleted, and its node is no capacity either."""
    caches = Caches.create(bed.kube)  # filled by hand below: no watch runs
    claim = await bed.kube.create(
        NODE_CLAIM,
        {"metadata": {"name": f"{bed.ns}-c3", "finalizers": [KARPENTER_FINALIZER]}, "spec": {}},
    )
    meta = claim["metadata"]
    owner = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": meta["name"],
             "uid": meta["uid"]}  # fmt: skip
    gone, kept = await bed.node(), await bed.node(finalizers=[DRAIN_FINALIZER])
    by_claim = await bed.node(ownerReferences=[owner])
    await bed.kube.merge_patch(
        NODE_CLAIM, meta["name"], {"status": {"nodeName": by_claim}}, subresource="status"
    )
    for name in (gone, kept, by_claim):
        caches.nodes.store.put_if_newer(await bed.kube.get(NODE, name))
    caches.node_claims.store.put_if_newer(await bed.kube.get(NODE_CLAIM, meta["name"]))
    try:
        for node, reclaimer in ((gone, "DeleteNode"), (kept, "DeleteNode"),
                                (by_claim, "DeleteNodeClaim")):  # fmt: skip
            target = bed.target(node, reclaimer)
            result = await safely.reclaim_safely(
                bed.kube, target, NOW(UTC), settle_seconds=SETTLE, told=caches
            )
            assert result.verdict == "reclaimed", result
        assert caches.nodes.store.get(gone) is None and not await bed.exists(gone)
        views = caches.capacity.views()
        assert gone not in views
        problems = {n: (v.problem.kind if v.problem else "") for n, v in views.items()}
        assert problems == {kept: DELETING, by_claim: CLAIM_DELETING}, problems
        cached_claim = caches.node_claims.store.get(meta["name"])
        assert cached_claim is not None and cached_claim["metadata"].get("deletionTimestamp")
    finally:
        unfinalized = {"metadata": {"finalizers": None}}
        with contextlib.suppress(NotFoundError):
            await bed.kube.merge_patch(NODE, kept, unfinalized)
        with contextlib.suppress(NotFoundError):
            await bed.kube.merge_patch(NODE_CLAIM, meta["name"], unfinalized)


async def test_delete_node_claim_checks_the_claims_own_back_reference(bed: Bed) -> None:
    """Defect 10: the node's owner reference is not enough; the NodeClaim's status.nodeName
    must name the node, else the claim is not deleted and the node is kept."""
    claim = await bed.kube.create(NODE_CLAIM, {"metadata": {"name": f"{bed.ns}-c2"}, "spec": {}})
    meta = claim["metadata"]
    await bed.kube.merge_patch(
        NODE_CLAIM, meta["name"], {"status": {"nodeName": "another-node"}}, subresource="status"
    )
    owner = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": meta["name"],
             "uid": meta["uid"]}  # fmt: skip
    node = await bed.node(ownerReferences=[owner])
    result = await reclaim_safely(bed.kube, bed.target(node, "DeleteNodeClaim"), NOW(UTC))
    assert result.verdict == "keep"
    assert "names node another-node in status.nodeName" in result.reason
    assert (await bed.kube.get(NODE_CLAIM, meta["name"]))["metadata"].get(
        "deletionTimestamp"
    ) is None
    await bed.kube.delete(NODE_CLAIM, meta["name"])


async def test_delete_node_claim_without_a_claim_keeps_and_unfences(bed: Bed) -> None:
    node = await bed.node()
    result = await reclaim_safely(bed.kube, bed.target(node, "DeleteNodeClaim"), NOW(UTC))
    assert (result.verdict, result.reason) == ("keep", "no NodeClaim owns it")
    assert not (await bed.kube.get(NODE, node))["spec"].get("unschedulable")


async def machine_bed(bed: Bed, *, node_ref: str | None = None) -> str:
    """A MachineDeployment md (3 replicas) > MachineSet ms > Machine m1 > a node naming m1;
    m1's status.nodeRef names `node_ref`, or the node. md and ms at revision 1, md's status
    as Cluster API's controller writes it once settled (`capi_settles`). Returns the node."""
    ns, kube = bed.ns, bed.kube
    revision = {REVISION: "1"}
    deployment = await kube.create(
        MACHINE_DEPLOYMENT,
        {"metadata": {"name": "md", "namespace": ns, "annotations": revision},
         "spec": {"replicas": 3}},
    )  # fmt: skip
    md_ref = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineDeployment", "name": "md",
              "uid": deployment["metadata"]["uid"], "controller": True}  # fmt: skip
    machine_set = await kube.create(
        MACHINE_SET,
        {"metadata": {"name": "ms", "namespace": ns, "ownerReferences": [md_ref],
                      "annotations": revision},
         "spec": {"replicas": 3}},
    )  # fmt: skip
    ms_ref = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineSet", "name": "ms",
              "uid": machine_set["metadata"]["uid"], "controller": True}  # fmt: skip
    await kube.create(
        MACHINE,
        {"metadata": {"name": "m1", "namespace": ns, "ownerReferences": [ms_ref]}, "spec": {}},
    )
    node = await bed.node(
        annotations={"cluster.x-k8s.io/machine": "m1", "cluster.x-k8s.io/cluster-namespace": ns}
    )
    status = {"status": {"nodeRef": {"name": node_ref or node}}}
    await kube.merge_patch(MACHINE, "m1", status, ns, subresource="status")
    await capi_settles(bed)
    return node


async def capi_settles(bed: Bed, machine_set: str = "ms", *, old: int = 0) -> None:
    """What Cluster API's MachineDeployment controller writes (no such controller runs here):
    `machine_set` given md's replicas, md's status with its generation observed and, with
    `old`, that many Machines still of an older MachineSet (a rollout under way)."""
    ns, kube = bed.ns, bed.kube
    md = await kube.get(MACHINE_DEPLOYMENT, "md", ns)
    replicas = md["spec"]["replicas"]
    await kube.merge_patch(MACHINE_SET, machine_set, {"spec": {"replicas": replicas}}, ns)
    status = {"observedGeneration": md["metadata"]["generation"], "replicas": replicas + old,
              "updatedReplicas": replicas}  # fmt: skip
    await kube.merge_patch(MACHINE_DEPLOYMENT, "md", {"status": status}, ns, subresource="status")


async def test_delete_machine_marks_it_and_scales_the_deployment_down(bed: Bed) -> None:
    ns, kube = bed.ns, bed.kube
    node = await machine_bed(bed)
    result = await reclaim_safely(kube, bed.target(node, "DeleteMachine"), NOW(UTC))
    assert result.verdict == "reclaimed"
    machine = await kube.get(MACHINE, "m1", ns)
    assert machine["metadata"]["annotations"]["cluster.x-k8s.io/delete-machine"] == "true"
    assert (await kube.get(MACHINE_DEPLOYMENT, "md", ns))["spec"]["replicas"] == 2


async def test_reclaimer_none_leaves_the_node_alone(bed: Bed) -> None:
    node = await bed.node()
    result = await reclaim_safely(bed.kube, bed.target(node, "None"), NOW(UTC))
    assert (result.verdict, result.reason) == ("keep", "reclaimer None: nodes are left alone")
    fresh = await bed.kube.get(NODE, node)
    assert not fresh["spec"].get("unschedulable")


async def test_a_reclaimer_the_server_refuses_is_a_failure_not_a_keep(bed: Bed) -> None:
    node = await bed.node()
    kube = bed.kube
    original = kube.delete

    async def forbidden(res: Any, *a: Any, **kw: Any) -> Any:
        if res is NODE:
            raise ForbiddenError(403, "Forbidden", "nodes is forbidden", target="nodes")
        return await original(res, *a, **kw)

    kube.delete = forbidden  # type: ignore[method-assign]
    try:
        result = await reclaim_safely(kube, bed.target(node), NOW(UTC))
    finally:
        kube.delete = original  # type: ignore[method-assign]
    assert (result.verdict, result.reason) == ("failed", "DeleteNode failed: 403 Forbidden")
    cordoned, taints, mark = fence_of(await kube.get(NODE, node))
    assert (cordoned, taints) == (False, [])  # usable meanwhile
    assert mark is not None  # and still owed a reclaim: retried


async def test_a_node_that_changes_meanwhile_is_judged_again_and_reclaimed(bed: Bed) -> None:
    """A status heartbeat moves the node's resourceVersion between fencing and deleting."""
    node = await bed.node()
    kube = bed.kube
    original = kube.merge_patch
    beats = 0

    async def fence_then_heartbeat(res: Any, name: str, patch: Any, *a: Any, **kw: Any) -> Any:
        nonlocal beats
        result = await original(res, name, patch, *a, **kw)
        if res is NODE and (patch.get("spec") or {}).get("unschedulable") is True and beats < 2:
            beats += 1
            await original(NODE, node, {"metadata": {"annotations": {"heartbeat": str(beats)}}})
        return result

    kube.merge_patch = fence_then_heartbeat  # type: ignore[method-assign]
    try:
        result = await reclaim_safely(kube, bed.target(node), NOW(UTC))
    finally:
        kube.merge_patch = original  # type: ignore[method-assign]
    assert result.verdict == "reclaimed"
    assert beats == 1
    assert not await bed.exists(node)


def after_first_recheck(
    kube: Kube, node: str, act: Callable[[], Awaitable[None]], *, lists: int = 1
) -> Any:
    """Wrap kube.list_objects so `act` runs right after the `lists`-th pod list that follows
    the fence (the first: the re-check has just seen the node empty), i.e. between that look
    and the act. A timing wrapper around the real server: nothing about the server's answers
    is faked."""
    original = kube.list_objects
    state = {"fenced": False, "done": False, "seen": 0}
    original_patch = kube.merge_patch

    async def patch(res: Any, name: str, body: Any, *a: Any, **kw: Any) -> Any:
        if res is NODE and (body.get("spec") or {}).get("unschedulable") is True:
            state["fenced"] = True
        return await original_patch(res, name, body, *a, **kw)

    async def listing(res: Any, *a: Any, **kw: Any) -> Any:
        listed = await original(res, *a, **kw)
        if res is POD and state["fenced"] and not state["done"]:
            state["seen"] += 1
        if res is POD and state["seen"] == lists and not state["done"]:
            state["done"] = True
            await act()
        return listed

    kube.list_objects = listing  # type: ignore[method-assign]
    kube.merge_patch = patch  # type: ignore[method-assign]

    def restore() -> None:
        kube.list_objects = original  # type: ignore[method-assign]
        kube.merge_patch = original_patch  # type: ignore[method-assign]

    return restore


async def test_a_pod_bound_between_the_recheck_and_the_delete_keeps_the_node(bed: Bed) -> None:
    """Defect 3: a pod tolerating every taint is bound (pods/binding, as kube-scheduler
    binds) right after the re-check that follows the fence. The settle and the last look
    before acting find it: the node is kept, unfenced, and the pod still runs."""
    node = await bed.node()
    restore = after_first_recheck(bed.kube, node, lambda: bed.bind("tolerates-all", node))
    try:
        result = await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
    finally:
        restore()
    assert result.verdict == "keep"
    assert "tolerates-all" in result.reason
    assert fence_of(await bed.kube.get(NODE, node)) == (False, [], None)
    pod = await bed.kube.get(POD, "tolerates-all", bed.ns)
    assert pod["spec"]["nodeName"] == node


def lose_first_answer(kube: Kube, method: str, plural: str) -> Callable[[], None]:
    """Fault wrapper: the first `method` on `plural` is applied by the real server, then its
    answer is lost (a connection reset), so the client retries it. The real server cannot
    drop an answer on demand; everything else is its own behaviour."""
    original = kube._request_once
    lost = {"done": False}

    async def once(m: str, path: str, *a: Any) -> Any:
        answer = await original(m, path, *a)
        if m == method and f"/{plural}/" in path and not lost["done"]:
            lost["done"] = True
            raise TransientError(0, "ConnectionReset", "answer lost", target=path)
        return answer

    kube._request_once = once  # type: ignore[method-assign]

    def restore() -> None:
        kube._request_once = original  # type: ignore[method-assign]

    return restore


async def test_a_delete_whose_answer_was_lost_is_done_not_kept(bed: Bed) -> None:
    """Defect 5: the retried DELETE is answered 404: the node is gone, which is done."""
    node = await bed.node()
    restore = lose_first_answer(bed.kube, "DELETE", "nodes")
    try:
        result = await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
    finally:
        restore()
    assert result.verdict in ("reclaimed", "gone")
    assert not await bed.exists(node)


async def test_a_lost_answer_does_not_scale_a_machine_deployment_down_twice(bed: Bed) -> None:
    """Defect 5: the decrement's answer is lost and retried: 3 -> 2, never 3 -> 1."""
    node = await machine_bed(bed)
    restore = lose_first_answer(bed.kube, "PATCH", "machinedeployments")
    try:
        result = await reclaim_safely(bed.kube, bed.target(node, "DeleteMachine"), NOW(UTC))
    finally:
        restore()
    assert result.verdict == "reclaimed"
    assert (await bed.kube.get(MACHINE_DEPLOYMENT, "md", bed.ns))["spec"]["replicas"] == 2
    again = await reclaim_safely(bed.kube, bed.target(node, "DeleteMachine"), NOW(UTC))
    assert again.verdict == "reclaimed"  # a second reclaim of the same node: still once
    assert (await bed.kube.get(MACHINE_DEPLOYMENT, "md", bed.ns))["spec"]["replicas"] == 2


async def test_a_reclaim_failed_after_the_decrement_does_not_decrement_again(bed: Bed) -> None:
    """m1's reclaim scales md down (3 -> 2), then fails before m1 records it (its lease lost:
    FencedError, raised before the write is sent); m2, of the same MachineSet, is reclaimed
    next (2 -> 1). m1's reclaim retried finds its own decrement recorded on md and does not
    decrement again: the Machine set would delete a third Machine, one nobody gave back. The
    record it no longer needs goes from md once m1 says its owner was scaled down."""
    ns, kube = bed.ns, bed.kube
    first = await machine_bed(bed)
    ms_ref = (await kube.get(MACHINE, "m1", ns))["metadata"]["ownerReferences"]
    await kube.create(MACHINE, {"metadata": {"name": "m2", "namespace": ns,
                                             "ownerReferences": ms_ref}, "spec": {}})  # fmt: skip
    second = await bed.node(
        annotations={"cluster.x-k8s.io/machine": "m2", "cluster.x-k8s.io/cluster-namespace": ns}
    )
    await kube.merge_patch(MACHINE, "m2", {"status": {"nodeRef": {"name": second}}}, ns,
                           subresource="status")  # fmt: skip
    original = kube._request_once

    async def lease_lost(m: str, path: str, query: Any, body: Any, *a: Any) -> Any:
        said = json.dumps(body or {})
        if m == "PATCH" and path.endswith("/machines/m1") and "owner-scaled-down" in said:
            raise FencedError("not the leader (test: the lease lost after the decrement)")
        return await original(m, path, query, body, *a)

    kube._request_once = lease_lost  # type: ignore[method-assign]
    try:
        failed = await reclaim_safely(kube, bed.target(first, "DeleteMachine"), NOW(UTC))
    finally:
        kube._request_once = original  # type: ignore[method-assign]
    assert failed.verdict == "failed"
    assert (await kube.get(MACHINE_DEPLOYMENT, "md", ns))["spec"]["replicas"] == 2
    await capi_settles(bed)  # md's controller applies m1's decrement
    other = await reclaim_safely(kube, bed.target(second, "DeleteMachine"), NOW(UTC))
    assert other.verdict == "reclaimed"
    assert (await kube.get(MACHINE_DEPLOYMENT, "md", ns))["spec"]["replicas"] == 1
    again = await reclaim_safely(kube, bed.target(first, "DeleteMachine"), NOW(UTC))
    assert again.verdict == "reclaimed"
    md = await kube.get(MACHINE_DEPLOYMENT, "md", ns)
    assert md["spec"]["replicas"] == 1
    for machine in ("m1", "m2"):
        annotations = (await kube.get(MACHINE, machine, ns))["metadata"]["annotations"]
        assert annotations["gangcheck.io/owner-scaled-down"] == "MachineDeployment/md"
    assert not [k for k in md["metadata"].get("annotations") or {} if "scaled-down" in k]


async def test_delete_machine_checks_the_machines_own_back_reference(bed: Bed) -> None:
    """Defect 10: a Machine whose status.nodeRef names another node is not touched."""
    node = await machine_bed(bed, node_ref="another-node")
    result = await reclaim_safely(bed.kube, bed.target(node, "DeleteMachine"), NOW(UTC))
    assert result.verdict == "keep"
    assert "names another-node in status.nodeRef" in result.reason
    machine = await bed.kube.get(MACHINE, "m1", bed.ns)
    assert "cluster.x-k8s.io/delete-machine" not in (machine["metadata"].get("annotations") or {})
    assert (await bed.kube.get(MACHINE_DEPLOYMENT, "md", bed.ns))["spec"]["replicas"] == 3


async def test_delete_machine_waits_while_its_machine_deployment_rolls_out(bed: Bed) -> None:
    """md rolls out (RollingUpdate, surge 1): m1 is of the new MachineSet ms (revision 2),
    the old one, ms-1, still has a Machine. A decrement now would be Cluster API's to take
    from ms-1 (another Machine, perhaps running someone's pods, removed; m1 kept): the reclaim
    fails for now before any write to md or m1, its node unfenced and still marked, a
    ReclaimFailed Event and the failure counted, the retry requeued with backoff. Once the
    rollout is over, the retry reclaims it: m1 marked, md scaled down by one."""
    ns, kube = bed.ns, bed.kube
    node = await machine_bed(bed)
    md = await kube.get(MACHINE_DEPLOYMENT, "md", ns)
    md_ref = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineDeployment", "name": "md",
              "uid": md["metadata"]["uid"], "controller": True}  # fmt: skip
    await kube.create(
        MACHINE_SET,
        {"metadata": {"name": "ms-1", "namespace": ns, "ownerReferences": [md_ref],
                      "annotations": {REVISION: "1"}},
         "spec": {"replicas": 1}},
    )  # fmt: skip
    for res, name in ((MACHINE_DEPLOYMENT, "md"), (MACHINE_SET, "ms")):
        await kube.merge_patch(res, name, {"metadata": {"annotations": {REVISION: "2"}}}, ns)
    await capi_settles(bed, old=1)
    caches = _Caches(kube)
    reconciler = DrainingNodeReconciler(kube, caches)  # type: ignore[arg-type]
    reconciler.metrics = Metrics()
    failed = await reclaim_safely(kube, bed.target(node, "DeleteMachine"), NOW(UTC))
    assert (failed.verdict, failed.reason, failed.cause) == (
        "failed", "DeleteMachine failed: 409 MachineDeploymentRollingOut",
        "MachineDeploymentRollingOut",
    )  # fmt: skip
    await caches.refresh(node)
    retry = await reconciler.reconcile(node)
    assert retry.requeue_after is not None and retry.requeue_after > 0
    said = [m for r, m in await bed.events(node) if r == "ReclaimFailed"]
    assert said and all("409 MachineDeploymentRollingOut" in m for m in said)
    render = reconciler.metrics.render()
    assert 'gangcheck_reclaim_failures_total{error="MachineDeploymentRollingOut"} 1' in render
    assert (await kube.get(MACHINE_DEPLOYMENT, "md", ns))["spec"]["replicas"] == 3
    assert (await kube.get(MACHINE_SET, "ms-1", ns))["spec"]["replicas"] == 1
    m1 = await kube.get(MACHINE, "m1", ns)
    assert "cluster.x-k8s.io/delete-machine" not in (m1["metadata"].get("annotations") or {})
    cordoned, taints, mark = fence_of(await kube.get(NODE, node))
    assert (cordoned, taints) == (False, []) and mark is not None  # in use meanwhile, owed
    # the rollout over: ms-1 scaled to 0 and its Machine gone, md's status says so
    await kube.merge_patch(MACHINE_SET, "ms-1", {"spec": {"replicas": 0}}, ns)
    await capi_settles(bed)
    await caches.refresh(node)
    assert await reconciler.reconcile(node) == QueueResult()
    assert (await kube.get(MACHINE_DEPLOYMENT, "md", ns))["spec"]["replicas"] == 2
    annotations = (await kube.get(MACHINE, "m1", ns))["metadata"]["annotations"]
    assert annotations["cluster.x-k8s.io/delete-machine"] == "true"
    assert annotations["gangcheck.io/owner-scaled-down"] == "MachineDeployment/md"


async def test_delete_machine_decrements_only_the_machine_deployment_it_judged(bed: Bed) -> None:
    """md's template changes in the round trip between the Machine's mark and the decrement
    (a wrapper times it; md's controller then creates a MachineSet at revision 2 and says so
    in md's status): the decrement tests md's resourceVersion, fails, md is read again and
    judged rolling out. No decrement; the mark the reclaim wrote is taken off."""
    ns, kube = bed.ns, bed.kube
    node = await machine_bed(bed)
    original = kube.merge_patch

    async def template_changed_after_mark(
        res: Any, name: str, body: Any, *a: Any, **kw: Any
    ) -> Any:
        answer = await original(res, name, body, *a, **kw)
        if res is MACHINE and "cluster.x-k8s.io/delete-machine" in json.dumps(body):
            kube.merge_patch = original  # type: ignore[method-assign]
            template = {"metadata": {"annotations": {REVISION: "2"}},
                        "spec": {"template": {"spec": {"version": "v1.36.1"}}}}  # fmt: skip
            await kube.merge_patch(MACHINE_DEPLOYMENT, "md", template, ns)
            await capi_settles(bed, old=3)
        return answer

    kube.merge_patch = template_changed_after_mark  # type: ignore[method-assign]
    try:
        result = await reclaim_safely(kube, bed.target(node, "DeleteMachine"), NOW(UTC))
    finally:
        kube.merge_patch = original  # type: ignore[method-assign]
    assert (result.verdict, result.cause) == ("failed", "MachineDeploymentRollingOut")
    assert (await kube.get(MACHINE_DEPLOYMENT, "md", ns))["spec"]["replicas"] == 3
    m1 = await kube.get(MACHINE, "m1", ns)
    assert "cluster.x-k8s.io/delete-machine" not in (m1["metadata"].get("annotations") or {})


async def add_machine(bed: Bed, name: str) -> str:
    """One more Machine `name` of `machine_bed`'s MachineSet ms, with a node naming it (its
    status.nodeRef naming the node). Returns the node."""
    ns, kube = bed.ns, bed.kube
    machine_set = await kube.get(MACHINE_SET, "ms", ns)
    ms_ref = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineSet", "name": "ms",
              "uid": machine_set["metadata"]["uid"], "controller": True}  # fmt: skip
    await kube.create(
        MACHINE,
        {"metadata": {"name": name, "namespace": ns, "ownerReferences": [ms_ref]}, "spec": {}},
    )
    node = await bed.node(
        annotations={"cluster.x-k8s.io/machine": name, "cluster.x-k8s.io/cluster-namespace": ns}
    )
    await kube.merge_patch(MACHINE, name, {"status": {"nodeRef": {"name": node}}}, ns,
                           subresource="status")  # fmt: skip
    return node


@contextlib.asynccontextmanager
async def capi_controller(bed: Bed) -> AsyncIterator[None]:
    """A stand-in for Cluster API's MachineDeployment controller (none runs here): md's
    MachineSet and status follow each change of md's replicas (`capi_settles`)."""

    async def follow() -> None:
        while True:
            md = await bed.kube.get(MACHINE_DEPLOYMENT, "md", bed.ns)
            status = md.get("status") or {}
            if status.get("observedGeneration") != md["metadata"]["generation"]:
                await capi_settles(bed)
            await asyncio.sleep(0.1)

    task = asyncio.create_task(follow())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_machines_of_one_owner_settle_together_and_are_scaled_down_in_turn(
    bed: Bed,
) -> None:
    """Two Machines of md (3 replicas) reclaimed in one rollback: the first Machine's mark
    waits (a wrapper holds it) until both nodes are fenced, which only a safe path that does
    not wait for the other node's whole path lets happen (before, the second node's began
    after the first's ended: the held mark timed out); md goes 3 -> 1, never lower: each
    Machine marked and its decrement recorded on it, made in turn, the second once md
    settled from the first."""
    ns, kube = bed.ns, bed.kube
    first = await machine_bed(bed)
    second = await add_machine(bed, "m2")
    order: list[tuple[str, str]] = []
    both_fenced = asyncio.Event()
    original = kube.merge_patch

    async def recorded(res: Any, name: str, body: Any, *a: Any, **kw: Any) -> Any:
        if res is NODE and (body.get("spec") or {}).get("unschedulable") is True:
            order.append(("fence", name))
            if sum(step == "fence" for step, _ in order) == 2:
                both_fenced.set()
        if res is MACHINE and "cluster.x-k8s.io/delete-machine" in json.dumps(body):
            await asyncio.wait_for(both_fenced.wait(), 30)
            order.append(("mark", name))
        return await original(res, name, body, *a, **kw)

    nodes = (first, second)
    action = ReclaimArrivals("gang-atomic-1", bed.request, bed.request_created, nodes,
                             "DeleteMachine")  # fmt: skip
    kube.merge_patch = recorded  # type: ignore[method-assign]
    try:
        async with capi_controller(bed):
            outcome = await reclaim_arrivals(
                kube, action, NOW(UTC), events=EventRecorder(kube), metrics=None
            )
    finally:
        kube.merge_patch = original  # type: ignore[method-assign]
    assert sorted(outcome.reclaimed) == sorted(nodes), outcome.summary()
    assert [step for step, _ in order] == ["fence", "fence", "mark", "mark"]
    assert {name for step, name in order if step == "fence"} == set(nodes)
    assert (await kube.get(MACHINE_DEPLOYMENT, "md", ns))["spec"]["replicas"] == 1
    for machine in ("m1", "m2"):
        annotations = (await kube.get(MACHINE, machine, ns))["metadata"]["annotations"]
        assert annotations["cluster.x-k8s.io/delete-machine"] == "true"
        assert annotations["gangcheck.io/owner-scaled-down"] == "MachineDeployment/md"


async def test_unfencing_keeps_a_taint_another_writer_added_meanwhile(bed: Bed) -> None:
    """Defect 7: right after the fence, cluster-autoscaler taints the node (another writer,
    timed by a wrapper) and a pod lands, so the node is kept. Unfencing removes gangcheck's
    taint only; the autoscaler's stays."""
    node = await bed.node()
    theirs = {"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}

    async def autoscaler_then_pod() -> None:
        fresh = await bed.kube.get(NODE, node)
        taints = [*fresh["spec"].get("taints", []), theirs]
        await bed.kube.merge_patch(NODE, node, {"spec": {"taints": taints}})
        await bed.pod("late", node)

    original = bed.kube.merge_patch

    async def fence_then_others(res: Any, name: str, patch: Any, *a: Any, **kw: Any) -> Any:
        answer = await original(res, name, patch, *a, **kw)
        if res is NODE and (patch.get("spec") or {}).get("unschedulable") is True:
            bed.kube.merge_patch = original  # type: ignore[method-assign]
            await autoscaler_then_pod()
        return answer

    bed.kube.merge_patch = fence_then_others  # type: ignore[method-assign]
    try:
        result = await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
    finally:
        bed.kube.merge_patch = original  # type: ignore[method-assign]
    assert result.verdict == "keep"
    fresh = await bed.kube.get(NODE, node)
    assert fence_of(fresh) == (False, ["ToBeDeletedByClusterAutoscaler"], None)


class _Caches:
    """The one cache the draining-node reconciler reads, filled by the test from the server
    (no watch), and told of the reclaim's deletes as the controller's caches are."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.nodes = type("Nodes", (), {})()
        self.nodes.store = Store()

    async def refresh(self, node: str) -> None:
        self.nodes.store.put_if_newer(await self.kube.get(NODE, node))

    def deleted(
        self, res: Any, name: str, namespace: str | None, answer: Obj | None, *, uid: str
    ) -> None:
        if res is NODE:
            self.nodes.store.deleted(name, namespace, answer, uid=uid)


async def test_a_fence_left_by_an_interrupted_reclaim_is_undone_after_a_restart(bed: Bed) -> None:
    """Defect 8: the reclaim dies right after fencing (simulated crash); a pod then lands.
    After the restart the draining-node reconciler finds the recorded fence, judges "keep",
    and undoes it: no cordon, no taint, no mark, and an Event on the Node says why."""
    node = await bed.node()
    original = bed.kube.merge_patch

    async def crash_after_fence(res: Any, name: str, body: Any, *a: Any, **kw: Any) -> Any:
        answer = await original(res, name, body, *a, **kw)
        if res is NODE and (body.get("spec") or {}).get("unschedulable") is True:
            raise asyncio.CancelledError  # the process stops here
        return answer

    bed.kube.merge_patch = crash_after_fence  # type: ignore[method-assign]
    try:
        with pytest.raises(asyncio.CancelledError):
            await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
    finally:
        bed.kube.merge_patch = original  # type: ignore[method-assign]
    cordoned, taints, mark = fence_of(await bed.kube.get(NODE, node))
    assert (cordoned, taints) == (True, [OUR_TAINT]) and mark is not None  # recorded
    await bed.pod("arrived-meanwhile", node)
    caches = _Caches(bed.kube)
    await caches.refresh(node)
    reconciler = DrainingNodeReconciler(bed.kube, caches)  # type: ignore[arg-type]
    assert await reconciler.reconcile(node) == QueueResult()
    assert fence_of(await bed.kube.get(NODE, node)) == (False, [], None)
    assert any(r == "NodeKept" and "arrived-meanwhile" in m for r, m in await bed.events(node))


async def test_a_failed_reclaim_is_retried_with_an_event_and_a_metric_until_it_succeeds(
    bed: Bed,
) -> None:
    """Defect 6: a 403 (injected by a wrapper; RBAC is not what is tested) is a failure:
    the node stays owed a reclaim, the retry is requeued with backoff, an Event and a
    metric report it; once the server allows it, the retry reclaims the node."""
    node = await bed.node()
    original = bed.kube.delete

    async def forbidden(res: Any, *a: Any, **kw: Any) -> Any:
        if res is NODE:
            raise ForbiddenError(403, "Forbidden", "nodes is forbidden", target="nodes")
        return await original(res, *a, **kw)

    caches = _Caches(bed.kube)
    reconciler = DrainingNodeReconciler(bed.kube, caches)  # type: ignore[arg-type]
    reconciler.metrics = Metrics()
    first = await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
    assert first.verdict == "reclaimed"  # control: without the fault it works
    node = await bed.node()
    bed.kube.delete = forbidden  # type: ignore[method-assign]
    try:
        failed = await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
        assert failed.verdict == "failed"
        await caches.refresh(node)
        retry = await reconciler.reconcile(node)
    finally:
        bed.kube.delete = original  # type: ignore[method-assign]
    assert retry.requeue_after is not None and retry.requeue_after > 0
    assert any(r == "ReclaimFailed" and "403" in m for r, m in await bed.events(node))
    assert 'gangcheck_reclaim_failures_total{error="Forbidden"} 1' in reconciler.metrics.render()
    await caches.refresh(node)
    assert await reconciler.reconcile(node) == QueueResult()
    assert not await bed.exists(node)
    assert caches.nodes.store.get(node) is None  # the delete told, no watch needed


async def test_a_person_opting_a_failed_node_out_ends_the_retries(bed: Bed) -> None:
    """Defect 6: the opt-out label turns a failing reclaim into a final keep."""
    node = await bed.node()
    mark = bed.target(node).mark()
    opt_out = {"gangcheck.io/do-not-reclaim": "true"}
    patch = {"metadata": {"annotations": {MARK: mark}, "labels": opt_out}}
    await bed.kube.merge_patch(NODE, node, patch)
    caches = _Caches(bed.kube)
    await caches.refresh(node)
    reconciler = DrainingNodeReconciler(bed.kube, caches)  # type: ignore[arg-type]
    assert await reconciler.reconcile(node) == QueueResult()
    assert fence_of(await bed.kube.get(NODE, node)) == (False, [], None)
    assert await bed.exists(node)


class _ReadSignals:
    """The reconciler's client: the real one, telling the test when a live read of a node
    has been answered."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self.read = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)

    async def get(self, res: Any, name: str, *a: Any, **kw: Any) -> Any:
        answer = await self._kube.get(res, name, *a, **kw)
        if res is NODE:
            self.read.set()
        return answer


async def test_a_mark_read_while_its_reclaim_was_under_way_is_not_reclaimed_again(
    bed: Bed,
) -> None:
    """The fence's mark wakes the draining-node reconciler while the reclaim that wrote it
    waits for binds to settle; its live read still shows the mark, and it then waits for that
    reclaim's turn on the node. Once the reclaim is done (the mark forgotten), nothing is owed:
    the node is not fenced and reclaimed a second time, nor counted twice (seen on the local
    stack: a withdrawn gang's one node made gangcheck_nodes_reclaimed_total 2 and doubled
    gangcheck_stranded_node_seconds_total)."""
    node = await bed.node()
    caches = _Caches(bed.kube)
    reads = _ReadSignals(bed.kube)
    reconciler = DrainingNodeReconciler(reads, caches)  # type: ignore[arg-type]
    reconciler.metrics = Metrics()
    original = bed.kube.merge_patch
    fences: list[str] = []
    woken: list[asyncio.Task[QueueResult]] = []

    async def wake_on_fence(res: Any, name: str, body: Any, *a: Any, **kw: Any) -> Any:
        answer = await original(res, name, body, *a, **kw)
        if res is NODE and (body.get("spec") or {}).get("unschedulable") is True:
            fences.append(name)
            if not woken:  # the node watch delivers the mark: the reconciler reads it live
                caches.nodes.store.put_if_newer(answer)
                woken.append(asyncio.create_task(reconciler.reconcile(name)))
                await reads.read.wait()
        return answer

    bed.kube.merge_patch = wake_on_fence  # type: ignore[method-assign]
    try:
        first = await reclaim_safely(bed.kube, bed.target(node, "CordonAndTaint"), NOW(UTC))
        again = await woken[0]
    finally:
        bed.kube.merge_patch = original  # type: ignore[method-assign]
    assert first.verdict == "reclaimed"
    assert again == QueueResult()
    assert fences == [node]  # fenced once, by the reclaim that marked it
    assert fence_of(await bed.kube.get(NODE, node)) == (True, [OUR_TAINT], None)
    assert "gangcheck_nodes_reclaimed_total 0" in reconciler.metrics.render().splitlines()


async def test_every_kept_node_is_explained_in_the_outcome_an_event_and_a_log(
    bed: Bed, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 12: two nodes kept for different reasons and one reclaimed: both reasons are
    in the outcome and its summary, on an Event on each Node, and in a log line each."""
    opted = await bed.node(labels={"gangcheck.io/do-not-reclaim": "true"})
    busy = await bed.node()
    await bed.pod("someone-else", busy)
    idle = await bed.node()
    nodes = tuple(sorted((opted, busy, idle)))
    action = ReclaimArrivals("gang-atomic-1", bed.request, bed.request_created, nodes, "DeleteNode")
    events = EventRecorder(bed.kube)
    with caplog.at_level(logging.INFO, logger="gangcheck.reclaim.arrivals"):
        outcome = await reclaim_arrivals(bed.kube, action, NOW(UTC), events=events, metrics=None)
    assert outcome.reclaimed == (idle,)
    assert "opt-out label" in outcome.kept[opted]
    assert "runs pod" in outcome.kept[busy]
    summary = outcome.summary()
    assert opted in summary and busy in summary and "more" not in summary
    for node, why in ((opted, "opt-out label"), (busy, "someone-else")):
        assert any(r == "NodeKept" and why in m for r, m in await bed.events(node))
        assert any(node in r.getMessage() and why in r.getMessage() for r in caplog.records)


async def test_a_node_claim_delete_whose_answer_was_lost_is_done(bed: Bed) -> None:
    """Defect 5: the NodeClaim's DELETE is applied, its answer lost and retried (404): done."""
    claim = await bed.kube.create(NODE_CLAIM, {"metadata": {"name": f"{bed.ns}-c3"}, "spec": {}})
    meta = claim["metadata"]
    owner = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": meta["name"],
             "uid": meta["uid"]}  # fmt: skip
    node = await bed.node(ownerReferences=[owner])
    await bed.kube.merge_patch(
        NODE_CLAIM, meta["name"], {"status": {"nodeName": node}}, subresource="status"
    )
    restore = lose_first_answer(bed.kube, "DELETE", "nodeclaims")
    try:
        result = await reclaim_safely(bed.kube, bed.target(node, "DeleteNodeClaim"), NOW(UTC))
    finally:
        restore()
    assert result.verdict == "reclaimed"
    with pytest.raises(NotFoundError):
        await bed.kube.get(NODE_CLAIM, meta["name"])


async def test_a_pod_bound_in_the_last_round_trip_is_reported_not_silently_lost(
    bed: Bed,
) -> None:
    """Defect 3, its limit: binding does not change the Node, so a bind in the one round trip
    between the last look (the 4th pod list after the fence) and the delete cannot stop it.
    It is named in the result and an Event on the pod, never lost silently."""
    node = await bed.node()
    bind = lambda: bed.bind("last-moment", node)  # noqa: E731
    restore = after_first_recheck(bed.kube, node, bind, lists=4)
    try:
        result = await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
    finally:
        restore()
    assert result.verdict == "reclaimed"
    assert result.bound_too_late == (f"{bed.ns}/last-moment",)
    await tell(EventRecorder(bed.kube), None, node, result, request=bed.request)
    listed = await bed.kube.list_objects(
        EVENT, bed.ns, field_selector="involvedObject.name=last-moment"
    )
    assert [e["reason"] for e in listed["items"]] == ["BoundToReclaimedNode"]


# ---- a fence a policy refuses ---------------------------------------------------------------

FROZEN = "example.com/frozen"
NO_CORDON = "frozen nodes may not be cordoned"


def _no_cordon_policy(name: str, reason: str) -> str:
    """A ValidatingAdmissionPolicy refusing to cordon a node labelled FROZEN=`name`, to
    everyone (gangcheck's fence cordons), with `reason` (Invalid: 422 naming a cause;
    Forbidden: 403). One per test: a policy deleted is still enforced for a moment."""
    refuse = (
        "!object.spec.?unschedulable.orValue(false)"
        f' || object.metadata.?labels["{FROZEN}"].orValue("") != "{name}"'
    )
    return deny_policy(
        name,
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["nodes"],
        },
        {"expression": refuse, "message": NO_CORDON, "reason": reason},
    )


@contextlib.asynccontextmanager
async def no_cordon(control_plane: Any, kube: Kube, node: str, reason: str) -> AsyncIterator[None]:
    """The policy applied as a person would (kubectl) to `node`, labelled for it, once the
    API server enforces it (a dry-run cordon refused); removed after."""
    name = f"no-cordon-{reason.lower()}-{next(_ids)}"
    await kube.merge_patch(NODE, node, {"metadata": {"labels": {FROZEN: name}}})
    text = _no_cordon_policy(name, reason)
    apply(control_plane, text)

    async def enforced() -> bool:
        path = NODE.object_path(node)
        body = {"spec": {"unschedulable": True}}
        try:
            await kube.request(
                "PATCH", path, query={"dryRun": "All"}, body=body, content_type=MERGE_PATCH
            )
        except ApiError as e:
            return NO_CORDON in e.message
        return False

    try:
        await eventually(enforced, timeout=30, what=f"a cordon of {node} to be refused")
        yield
    finally:
        control_plane.run_kubectl(
            "delete", "--ignore-not-found", "-f", "-", stdin=text, check=False
        )


@pytest.mark.parametrize(("reason", "status"), [("Invalid", 422), ("Forbidden", 403)])
async def test_a_node_whose_fence_a_policy_refuses_is_kept_and_the_others_reclaimed(
    bed: Bed, control_plane: Any, reason: str, status: int
) -> None:
    """Before: the refused fence raised out of the reclaim's task group, so no outcome was
    recorded and the whole rollback was retried on backoff for ever, the other nodes (reclaimed
    meanwhile) counted again. Now that node is kept, unfenced and never deleted, the policy's
    message in the outcome and on a NodeKept Event; the others are reclaimed."""
    frozen = await bed.node()
    idle = [await bed.node(), await bed.node()]
    nodes = tuple(sorted((frozen, *idle)))
    action = ReclaimArrivals("gang-atomic-1", bed.request, bed.request_created, nodes, "DeleteNode")
    async with no_cordon(control_plane, bed.kube, frozen, reason):
        outcome = await reclaim_arrivals(
            bed.kube, action, NOW(UTC), events=EventRecorder(bed.kube), metrics=None
        )
    assert sorted(outcome.reclaimed) == sorted(idle)
    assert not [n for n in idle if await bed.exists(n)]
    assert list(outcome.kept) == [frozen] and not outcome.failed
    why = outcome.kept[frozen]
    assert why.startswith(f"its fence was refused ({status} {reason}): ") and NO_CORDON in why
    assert f"kept {frozen} (its fence was refused" in outcome.summary()
    assert fence_of(await bed.kube.get(NODE, frozen)) == (False, [], None)
    assert any(r == "NodeKept" and NO_CORDON in m for r, m in await bed.events(frozen))
