"""DeleteMachine and a MachineDeployment rolling out.

The reclaimer marks its Machine `cluster.x-k8s.io/delete-machine` and decrements the
MachineDeployment above it. While that rolls out, Cluster API applies the decrement to the
MachineSet its rollout chooses (the new one only while it holds more than the
MachineDeployment's replicas, else the old ones, oldest first), so another Machine, perhaps
running someone's pods, would go and the marked one stay. `rolling_out` judges it from the
MachineDeployment's status and the Machine's MachineSet (the table); the reclaim then fails
for now, before any write (retried with backoff by the draining-node reconciler), and acts
once the rollout is over. A MachineSet with no MachineDeployment is not judged.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.kube.errors import ApiError, FencedError
from gangcheck.kube.resources import MACHINE, MACHINE_DEPLOYMENT, MACHINE_SET, NODE
from gangcheck.model.names import ARRIVED_FOR, OWNER_SCALED_DOWN, RECLAIM_TAINT, RECLAIM_WHEN_IDLE
from gangcheck.reclaim import reclaimers
from gangcheck.reclaim.reclaimers import (
    DELETE_MACHINE_ANNOTATION,
    MARKED_HERE,
    NOT_CACHED,
    REVISION_ANNOTATION,
    ROLLING_OUT,
    UNSETTLED,
    DeleteMachine,
    Rollout,
    rolling_out,
    scaled_down_key,
)
from gangcheck.reclaim.safely import Target, reclaim_safely
from tests.fakes.kube import FakeKube

Obj = dict[str, Any]
NS = "capi"
API = "cluster.x-k8s.io/v1beta1"


def deployment(
    replicas: int = 3,
    *,
    generation: int = 1,
    observed: int | None = 1,
    status_replicas: int = 3,
    updated: int = 3,
    revision: str | None = "2",
    rolling: str | None = None,
) -> Obj:
    """A MachineDeployment as Cluster API's controller leaves it (observed: None, never)."""
    annotations = {REVISION_ANNOTATION: revision} if revision is not None else {}
    status: Obj = {"replicas": status_replicas, "updatedReplicas": updated}
    if observed is not None:
        status["observedGeneration"] = observed
    if rolling is not None:
        status["v1beta2"] = {"conditions": [{"type": "RollingOut", "status": rolling}]}
    meta = {"name": "md", "namespace": NS, "generation": generation, "annotations": annotations}
    return {"metadata": meta, "spec": {"replicas": replicas}, "status": status}


def machine_set(name: str = "ms-2", replicas: int = 3, revision: str | None = "2") -> Obj:
    annotations = {REVISION_ANNOTATION: revision} if revision is not None else {}
    meta = {"name": name, "namespace": NS, "annotations": annotations}
    return {"metadata": meta, "spec": {"replicas": replicas}}


@pytest.mark.parametrize(
    ("md", "ms", "expected"),
    [
        (deployment(), machine_set(), None),
        # neither carries a revision (made by hand, or by a controller before revisions)
        (deployment(revision=None), machine_set(revision=None), None),
        (deployment(rolling="False"), machine_set(), None),
        (deployment(rolling="True"), machine_set(), Rollout("its RollingOut condition is True")),
        # an old MachineSet still has Machines (RollingUpdate surging, or OnDelete waiting)
        (
            deployment(status_replicas=4, updated=2),
            machine_set(),
            Rollout("2 of its 4 Machines are of an older MachineSet"),
        ),
        # the Machine is of an old MachineSet (its Machines all going, this one with them)
        (
            deployment(status_replicas=3, updated=3),
            machine_set("ms-1", revision="1"),
            Rollout("the Machine's MachineSet ms-1 is at revision 1, the MachineDeployment at 2"),
        ),
        (
            deployment(),
            machine_set(revision=None),
            Rollout(
                "the Machine's MachineSet ms-2 is at revision none, the MachineDeployment at 2"
            ),
        ),
        # not yet seen by its controller: a decrement just made, or a template changed
        (
            deployment(generation=2),
            machine_set(),
            Rollout("its controller has observed generation 1 of 2", settling=True),
        ),
        (
            deployment(observed=None),
            machine_set(),
            Rollout("its controller has observed generation 0 of 1", settling=True),
        ),
        # a status not yet moved on may hide a rollout: one it shows counts at once
        (
            deployment(generation=2, status_replicas=4, updated=1),
            machine_set(),
            Rollout("3 of its 4 Machines are of an older MachineSet"),
        ),
        # the MachineSet has not yet been given the MachineDeployment's replicas
        (
            deployment(replicas=2),
            machine_set(replicas=3),
            Rollout("the Machine's MachineSet ms-2 has 3 of its 2 replicas", settling=True),
        ),
        (
            deployment(replicas=3),
            machine_set(replicas=2),
            Rollout("the Machine's MachineSet ms-2 has 2 of its 3 replicas", settling=True),
        ),
    ],
    ids=[
        "settled",
        "no-revisions",
        "rolling-out-false",
        "rolling-out-true",
        "old-machines-left",
        "machine-of-an-old-set",
        "set-without-revision",
        "generation-not-observed",
        "never-reconciled",
        "stale-status-shows-rollout",
        "scale-down-not-applied",
        "set-short-of-replicas",
    ],
)
def test_rolling_out(md: Obj, ms: Obj, expected: Rollout | None) -> None:
    assert rolling_out(md, ms) == expected


# -- the reclaim, on objects shaped as Cluster API leaves them ------------------------------


def capi(md: Obj, *sets: Obj, machine_set_of_m1: str = "ms-2") -> FakeKube:
    """The MachineDeployment `md` over `sets`, Machine m1 of `machine_set_of_m1`, and its
    Node node-m1 linked both ways."""
    kube = FakeKube()
    kube.add({"apiVersion": API, "kind": "MachineDeployment", **md, "metadata": {
        **md["metadata"], "uid": "md-uid"}})  # fmt: skip
    md_ref = {"apiVersion": API, "kind": "MachineDeployment", "name": "md", "uid": "md-uid",
              "controller": True}  # fmt: skip
    for ms in sets:
        meta = {
            **ms["metadata"],
            "uid": f"{ms['metadata']['name']}-uid",
            "ownerReferences": [md_ref],
        }
        kube.add({"apiVersion": API, "kind": "MachineSet", **ms, "metadata": meta})
    ms_ref = {"apiVersion": API, "kind": "MachineSet", "name": machine_set_of_m1,
              "uid": f"{machine_set_of_m1}-uid", "controller": True}  # fmt: skip
    kube.add(
        {"apiVersion": API, "kind": "Machine",
         "metadata": {"name": "m1", "namespace": NS, "uid": "m1-uid", "ownerReferences": [ms_ref]},
         "status": {"nodeRef": {"name": "node-m1"}}},
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": "node-m1", "annotations": {
             "cluster.x-k8s.io/machine": "m1", "cluster.x-k8s.io/cluster-namespace": NS}}},
    )  # fmt: skip
    return kube


async def reclaim(kube: FakeKube) -> str:
    node = await kube.get(NODE, "node-m1")
    return await DeleteMachine().reclaim(kube, node, NOT_CACHED)


def stored(kube: FakeKube, res: Any, name: str) -> Obj:
    found = kube.stored(res, name, NS)
    assert found is not None
    return found


def annotations(kube: FakeKube, res: Any, name: str) -> dict[str, str]:
    return dict(stored(kube, res, name)["metadata"].get("annotations") or {})


def settle(kube: FakeKube, set_name: str = "ms-2") -> None:
    """What Cluster API's MachineDeployment controller does once a rollout is over, or a
    decrement made: the one MachineSet given the MachineDeployment's replicas, its status
    and observedGeneration written."""
    md = stored(kube, MACHINE_DEPLOYMENT, "md")
    replicas = md["spec"]["replicas"]
    for ms in kube.all_of(MACHINE_SET):
        ms["spec"]["replicas"] = replicas if ms["metadata"]["name"] == set_name else 0
        kube.add(ms)
    md["status"] = {
        "observedGeneration": md["metadata"]["generation"],
        "replicas": replicas,
        "updatedReplicas": replicas,
    }
    kube.add(md)


async def test_a_settled_machine_deployment_is_scaled_down_for_the_marked_machine() -> None:
    kube = capi(deployment(), machine_set())
    done = await reclaim(kube)
    assert done == "Machine m1 marked for deletion, MachineDeployment scaled to 2"
    assert stored(kube, MACHINE_DEPLOYMENT, "md")["spec"]["replicas"] == 2
    assert annotations(kube, MACHINE, "m1") == {
        DELETE_MACHINE_ANNOTATION: "true",
        MARKED_HERE: "node-m1",
        OWNER_SCALED_DOWN: "MachineDeployment/md",
    }
    # the decrement was made on the MachineDeployment as judged: its resourceVersion tested
    (decrement, *_) = [w for w in kube.writes_of("MachineDeployment") if "replace" in str(w)]
    assert decrement.body[0]["path"] == "/metadata/resourceVersion"


async def test_a_rollout_in_progress_fails_the_reclaim_before_any_write_until_it_is_over() -> None:
    """m1 is of the new MachineSet; the old one still has a Machine (RollingUpdate, surge 1).
    A decrement now would be taken by the old MachineSet (Cluster API scales the new one down
    only while it holds more than the MachineDeployment's replicas): its Machine would go,
    m1 would stay. Nothing is written; the error says which MachineDeployment and why."""
    kube = capi(
        deployment(status_replicas=4, updated=3),
        machine_set("ms-1", replicas=1, revision="1"),
        machine_set("ms-2", replicas=3, revision="2"),
    )
    with pytest.raises(ApiError) as failed:
        await reclaim(kube)
    assert (failed.value.status, failed.value.reason) == (409, ROLLING_OUT)
    assert failed.value.message.startswith(
        "MachineDeployment capi/md is rolling out (1 of its 4 Machines are of an older MachineSet)"
    )
    assert kube.writes == []
    assert stored(kube, MACHINE_DEPLOYMENT, "md")["spec"]["replicas"] == 3
    # the rollout over (the old MachineSet at 0, its Machine gone): the retry reclaims
    settle(kube)
    assert await reclaim(kube) == "Machine m1 marked for deletion, MachineDeployment scaled to 2"
    assert stored(kube, MACHINE_DEPLOYMENT, "md")["spec"]["replicas"] == 2
    assert annotations(kube, MACHINE, "m1")[DELETE_MACHINE_ANNOTATION] == "true"


async def test_a_machine_of_an_old_machine_set_is_not_scaled_down_for() -> None:
    """OnDelete: m1 is of the old MachineSet, the MachineDeployment already at revision 2
    with nothing yet replaced. A decrement would be taken from the old MachineSets, and is
    not made: m1 is not marked."""
    kube = capi(
        deployment(revision="2"),
        machine_set("ms-1", replicas=3, revision="1"),
        machine_set("ms-2", replicas=0, revision="2"),
        machine_set_of_m1="ms-1",
    )
    with pytest.raises(ApiError) as failed:
        await reclaim(kube)
    assert failed.value.reason == ROLLING_OUT
    assert "MachineSet ms-1 is at revision 1" in failed.value.message
    assert kube.writes == []


async def test_a_machine_set_without_a_deployment_is_not_judged() -> None:
    """No MachineDeployment: the MachineSet's decrement takes the marked Machine first."""
    kube = capi(deployment(), machine_set("ms-2", replicas=3, revision="1"))
    ms = stored(kube, MACHINE_SET, "ms-2")
    ms["metadata"]["ownerReferences"] = []
    kube.add(ms)
    assert await reclaim(kube) == "Machine m1 marked for deletion, MachineSet scaled to 2"
    assert stored(kube, MACHINE_SET, "ms-2")["spec"]["replicas"] == 2


async def test_a_deployment_settling_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another Machine's decrement a moment before (generation 2, observed 1): read again
    until the controller has applied it, then scaled down once more."""
    monkeypatch.setattr(reclaimers, "SETTLE_POLL_SECONDS", 0.01)
    kube = capi(deployment(replicas=2, generation=2), machine_set(replicas=3))

    async def controller() -> None:
        await asyncio.sleep(0.05)
        settle(kube)

    acting = asyncio.create_task(controller())
    done = await reclaim(kube)
    await acting
    assert done == "Machine m1 marked for deletion, MachineDeployment scaled to 1"
    assert stored(kube, MACHINE_DEPLOYMENT, "md")["spec"]["replicas"] == 1


async def test_a_deployment_that_does_not_settle_fails_the_reclaim_for_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reclaimers, "SETTLE_SECONDS", 0.05)
    monkeypatch.setattr(reclaimers, "SETTLE_POLL_SECONDS", 0.01)
    kube = capi(deployment(generation=2), machine_set())
    with pytest.raises(ApiError) as failed:
        await reclaim(kube)
    assert (failed.value.status, failed.value.reason) == (409, UNSETTLED)
    assert failed.value.message.startswith(
        "MachineDeployment capi/md has not settled (its controller has observed generation 1 of 2)"
    )
    assert kube.writes == []


async def test_a_rollout_begun_between_the_look_and_the_decrement_takes_the_mark_off() -> None:
    """The template changes right after the Machine is marked (a wrapper times it); the
    controller has seen it and begun (status: an old MachineSet's Machines). The decrement's
    resourceVersion test fails, the MachineDeployment read again is rolling out: no
    decrement, and the mark this reclaim wrote is taken off."""
    kube = capi(deployment(), machine_set())
    original = kube.merge_patch

    async def rollout_after_the_mark(res: Any, name: str, patch: Obj, *a: Any, **kw: Any) -> Obj:
        answer = await original(res, name, patch, *a, **kw)
        if res is MACHINE and DELETE_MACHINE_ANNOTATION in str(patch):
            md = stored(kube, MACHINE_DEPLOYMENT, "md")
            md["metadata"]["generation"] = 2
            md["metadata"]["annotations"][REVISION_ANNOTATION] = "3"
            md["status"] = {"observedGeneration": 2, "replicas": 4, "updatedReplicas": 1}
            kube.add(md)
        return answer

    kube.merge_patch = rollout_after_the_mark  # type: ignore[method-assign]
    with pytest.raises(ApiError) as failed:
        await reclaim(kube)
    assert failed.value.reason == ROLLING_OUT
    assert stored(kube, MACHINE_DEPLOYMENT, "md")["spec"]["replicas"] == 3
    assert DELETE_MACHINE_ANNOTATION not in annotations(kube, MACHINE, "m1")


async def test_a_mark_there_before_stays_when_a_rollout_refuses_the_decrement() -> None:
    """A mark gangcheck did not write (a person's, cluster-autoscaler's) is not taken off."""
    kube = capi(deployment(), machine_set())
    m1 = stored(kube, MACHINE, "m1")
    m1["metadata"]["annotations"] = {DELETE_MACHINE_ANNOTATION: "true"}
    kube.add(m1)
    original = kube.merge_patch

    async def rollout_after_the_mark(res: Any, name: str, patch: Obj, *a: Any, **kw: Any) -> Obj:
        answer = await original(res, name, patch, *a, **kw)
        if res is MACHINE:
            md = stored(kube, MACHINE_DEPLOYMENT, "md")
            md["status"]["v1beta2"] = {"conditions": [{"type": "RollingOut", "status": "True"}]}
            kube.add(md)
        return answer

    kube.merge_patch = rollout_after_the_mark  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        await reclaim(kube)
    assert annotations(kube, MACHINE, "m1") == {DELETE_MACHINE_ANNOTATION: "true"}
    assert stored(kube, MACHINE_DEPLOYMENT, "md")["spec"]["replicas"] == 3


async def test_a_decrement_done_before_the_rollout_is_completed_not_refused() -> None:
    """The decrement for m1 was made (recorded on the MachineDeployment) and the reclaim cut
    short before m1 said so; a rollout began since. The retry finishes without deciding
    anything again: no second decrement, m1 records its owner scaled down."""
    md = deployment(replicas=2, status_replicas=3, updated=1)
    md["metadata"]["annotations"][scaled_down_key("m1-uid")] = "m1"
    kube = capi(md, machine_set())
    m1 = stored(kube, MACHINE, "m1")
    m1["metadata"]["annotations"] = {DELETE_MACHINE_ANNOTATION: "true"}
    kube.add(m1)
    assert await reclaim(kube) == "Machine m1 marked for deletion, MachineDeployment scaled to 2"
    assert stored(kube, MACHINE_DEPLOYMENT, "md")["spec"]["replicas"] == 2
    assert annotations(kube, MACHINE, "m1")[OWNER_SCALED_DOWN] == "MachineDeployment/md"
    assert scaled_down_key("m1-uid") not in annotations(kube, MACHINE_DEPLOYMENT, "md")


async def test_a_mark_an_earlier_try_wrote_comes_off_when_a_rollout_refuses_the_retry() -> None:
    """The first try marks m1 and its decrement is not answered (a 500, not applied: the
    MachineDeployment records no decrement for m1); the node is unfenced and back in the pool
    until the retry. A rollout begins meanwhile: the retry refuses before any decrement, and
    the mark the first try wrote comes off with it. Left on, m1, its node in use again, would
    be the Machine its MachineSet removes first in the next scale-down, whoever makes it."""
    kube = capi(deployment(), machine_set())
    kube.fail("patch", "MachineDeployment", "md", 500)
    with pytest.raises(ApiError) as first:
        await reclaim(kube)
    assert first.value.status == 500
    assert annotations(kube, MACHINE, "m1")[DELETE_MACHINE_ANNOTATION] == "true"
    md = stored(kube, MACHINE_DEPLOYMENT, "md")
    md["status"]["v1beta2"] = {"conditions": [{"type": "RollingOut", "status": "True"}]}
    kube.add(md)
    with pytest.raises(ApiError) as retried:
        await reclaim(kube)
    assert retried.value.reason == ROLLING_OUT
    assert DELETE_MACHINE_ANNOTATION not in annotations(kube, MACHINE, "m1")
    assert stored(kube, MACHINE_DEPLOYMENT, "md")["spec"]["replicas"] == 3
    # the rollout over, the retry marks and scales down as ever
    settle(kube)
    assert await reclaim(kube) == "Machine m1 marked for deletion, MachineDeployment scaled to 2"
    assert annotations(kube, MACHINE, "m1")[DELETE_MACHINE_ANNOTATION] == "true"


KEY = "default/wl-atomic-1"


def arrived_for_a_request(kube: FakeKube) -> Target:
    """node-m1 recorded as arrived for KEY's request, made before it; the reclaim it owes."""
    node = kube.stored(NODE, "node-m1")
    assert node is not None
    node["metadata"]["annotations"][ARRIVED_FOR] = KEY
    kube.add(node)
    return Target("node-m1", KEY, "2026-01-01T00:00:00Z", DeleteMachine.name)


def someone_runs_a_pod_on_node_m1(kube: FakeKube) -> None:
    kube.add(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "theirs", "namespace": "team"},
            "spec": {"nodeName": "node-m1", "containers": [{"name": "c"}]},
            "status": {"phase": "Running"},
        }
    )


async def test_a_node_kept_after_a_failed_decrement_unmarks_its_machine() -> None:
    """The decrement fails (a 500, not applied): the reclaim fails, the node is unfenced and
    owes a reclaim. Someone's pod lands there before the retry, which keeps the node: the
    mark gangcheck wrote on m1 comes off with it, so the next scale-down of its MachineSet
    (cluster-autoscaler's, a person's) does not take m1 and the pod with it."""
    kube = capi(deployment(), machine_set())
    target = arrived_for_a_request(kube)
    kube.fail("patch", "MachineDeployment", "md", 500)
    failed = await reclaim_safely(kube, target, datetime.now(UTC), settle_seconds=0)
    assert failed.verdict == "failed"
    assert annotations(kube, MACHINE, "m1")[DELETE_MACHINE_ANNOTATION] == "true"
    someone_runs_a_pod_on_node_m1(kube)
    kept = await reclaim_safely(kube, target, datetime.now(UTC), settle_seconds=0, owed=True)
    assert (kept.verdict, kept.reason) == ("keep", "runs pod team/theirs")
    assert DELETE_MACHINE_ANNOTATION not in annotations(kube, MACHINE, "m1")
    assert MARKED_HERE not in annotations(kube, MACHINE, "m1")
    assert stored(kube, MACHINE_DEPLOYMENT, "md")["spec"]["replicas"] == 3


async def test_a_node_kept_after_its_decrement_was_made_keeps_the_mark() -> None:
    """The decrement was made (its answer lost) and the node kept after: Cluster API removes
    one Machine of the MachineSet, the marked one; unmarked, it would remove another."""
    kube = capi(deployment(), machine_set())
    target = arrived_for_a_request(kube)
    kube.fail("patch", "MachineDeployment", "md", 500, applied=True)
    failed = await reclaim_safely(kube, target, datetime.now(UTC), settle_seconds=0)
    assert failed.verdict == "failed"
    someone_runs_a_pod_on_node_m1(kube)
    kept = await reclaim_safely(kube, target, datetime.now(UTC), settle_seconds=0, owed=True)
    assert kept.verdict == "keep"
    assert annotations(kube, MACHINE, "m1")[DELETE_MACHINE_ANNOTATION] == "true"
    assert stored(kube, MACHINE_DEPLOYMENT, "md")["spec"]["replicas"] == 2


async def test_a_node_kept_leaves_a_mark_gangcheck_did_not_write() -> None:
    kube = capi(deployment(), machine_set())
    target = arrived_for_a_request(kube)
    m1 = stored(kube, MACHINE, "m1")
    m1["metadata"]["annotations"] = {DELETE_MACHINE_ANNOTATION: "2026-12-06 10:00:00"}
    kube.add(m1)
    someone_runs_a_pod_on_node_m1(kube)
    kept = await reclaim_safely(kube, target, datetime.now(UTC), settle_seconds=0)
    assert kept.verdict == "keep"
    assert annotations(kube, MACHINE, "m1") == {DELETE_MACHINE_ANNOTATION: "2026-12-06 10:00:00"}
    assert kube.writes_of("Machine") == []


async def test_a_lease_lost_unmarking_a_kept_node_s_machine_leaves_it_owed() -> None:
    """The unmark is refused, this replica no longer the leader: nothing of the node is
    forgotten (its reclaim-when-idle mark stays), so the next leader's retry keeps it again
    and takes the Machine's mark off then; never the node forgotten, the Machine marked."""
    kube = capi(deployment(), machine_set())
    target = arrived_for_a_request(kube)
    kube.fail("patch", "MachineDeployment", "md", 500)
    await reclaim_safely(kube, target, datetime.now(UTC), settle_seconds=0)
    someone_runs_a_pod_on_node_m1(kube)
    kube.fail("patch", "Machine", "m1", FencedError("not the leader"))
    with pytest.raises(FencedError):
        await reclaim_safely(kube, target, datetime.now(UTC), settle_seconds=0, owed=True)
    node = kube.stored(NODE, "node-m1")
    assert node is not None and RECLAIM_WHEN_IDLE in node["metadata"]["annotations"]
    kept = await reclaim_safely(kube, target, datetime.now(UTC), settle_seconds=0, owed=True)
    assert kept.verdict == "keep"
    assert DELETE_MACHINE_ANNOTATION not in annotations(kube, MACHINE, "m1")


async def test_a_decrement_made_is_the_reclaim_done_whatever_its_record_on_the_machine() -> None:
    """The decrement is made; the write that says so on m1 fails (a 500). Cluster API now
    removes m1 (marked, its MachineSet one short): the reclaim is done and the node stays
    fenced. Failed, it was unfenced while its Machine went: pods placed there meanwhile were
    evicted with it."""
    kube = capi(deployment(), machine_set())
    target = arrived_for_a_request(kube)
    original = kube.merge_patch

    async def done_write_fails(res: Any, name: str, patch: Obj, *a: Any, **kw: Any) -> Obj:
        if res is MACHINE and OWNER_SCALED_DOWN in str(patch):
            kube.fail("patch", "Machine", "m1", 500)
        return await original(res, name, patch, *a, **kw)

    kube.merge_patch = done_write_fails  # type: ignore[method-assign]
    result = await reclaim_safely(kube, target, datetime.now(UTC), settle_seconds=0)
    assert result.verdict == "reclaimed"
    assert stored(kube, MACHINE_DEPLOYMENT, "md")["spec"]["replicas"] == 2
    assert annotations(kube, MACHINE, "m1")[DELETE_MACHINE_ANNOTATION] == "true"
    node = kube.stored(NODE, "node-m1")
    assert node is not None and node["spec"].get("unschedulable") is True
    assert RECLAIM_TAINT in [t["key"] for t in node["spec"].get("taints") or []]


def _machine_of_set(name: str, machine_set: str | None) -> Obj:
    owners = (
        [{"kind": "MachineSet", "name": machine_set, "controller": True}] if machine_set else []
    )
    return {"metadata": {"name": name, "namespace": "capi", "ownerReferences": owners}}


async def test_machines_of_one_owner_take_turns_and_others_go_on_meanwhile() -> None:
    """`_turns`: m1 and m2 of ms-a one after the other; m3 of ms-b and m4 (no owner) in the
    meantime; nothing is left of the turns once all are done."""
    said: list[str] = []

    async def reclaim(machine: Obj) -> None:
        name = machine["metadata"]["name"]
        async with reclaimers._turns.of(reclaimers._owner_key(machine)):
            said.append(f"{name} in")
            await asyncio.sleep(0.05)
            said.append(f"{name} out")

    machines = [
        _machine_of_set("m1", "ms-a"),
        _machine_of_set("m2", "ms-a"),
        _machine_of_set("m3", "ms-b"),
        _machine_of_set("m4", None),
    ]
    await asyncio.gather(*(reclaim(m) for m in machines))
    assert said.index("m1 out") < said.index("m2 in")
    assert said.index("m3 in") < said.index("m1 out")
    assert said.index("m4 in") < said.index("m1 out")
    assert not reclaimers._turns
