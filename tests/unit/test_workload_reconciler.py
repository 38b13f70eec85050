"""The Workload reconciler against a fake API server, driven only through `reconcile(key)`:
a handful of narrative cases, the test playing Kueue and the autoscaler."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gangcheck.kube.errors import ApiError
from gangcheck.kube.resources import ATOMIC_CONFIG, EVENT, NODE, PROVISIONING_REQUEST, WORKLOAD
from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.actions import AnnotateRequest, ClaimNode, DeleteRequest, Event
from gangcheck.logic.attempt.fulfillment import ARRIVED_FOR
from gangcheck.logic.attempt.published import Outcome
from gangcheck.logic.workloads.admission import Decision
from gangcheck.model.names import OUTCOME_ANNOTATION, RECLAIM_TAINT
from gangcheck.model.objects import request_of, workload_of
from gangcheck.reclaim import safely
from gangcheck.reconcile import workload as workload_module
from gangcheck.reconcile.workload import ORPHAN_RECHECK_SECONDS, WorkloadReconciler
from gangcheck.runtime.queue import Result
from tests import worlds
from tests.builders import CHECK, CONTROLLER, WorkloadBuilder, node
from tests.fakes.metrics import RecordedMetrics
from tests.worlds import Obj, stamp

KEY = "default/wl"
REQUEST = naming.request_name("wl", CHECK, 1)


def admission_check() -> Obj:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": CHECK},
        "spec": {"controllerName": CONTROLLER},
    }


def gpu_flavor() -> Obj:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "gpu"},
        "spec": {"nodeLabels": {"pool": "gpu"}},
    }


def gang() -> Obj:
    """Four one-GPU workers, quota reserved, our check Pending."""
    return WorkloadBuilder().pod_set("workers", 4).reserve_quota().check().build()


class World(worlds.World[WorkloadReconciler]):
    """The fake server, the caches the controller reads, and the Workload reconciler."""

    key = KEY

    def __init__(self, *objs: Obj) -> None:
        super().__init__((admission_check(), gpu_flavor(), *objs), node_labels={"pool": "gpu"})
        self.metrics = RecordedMetrics()
        self.reconciler = WorkloadReconciler(
            self.kube,
            self.caches,
            self.events,
            self.applier,
            clock=self.clock,
            metrics=self.metrics,
        )

    def request(self) -> Obj:
        req = self.kube.stored(PROVISIONING_REQUEST, REQUEST, "default")
        assert req is not None
        return req

    def check(self) -> Obj:
        wl = self.kube.stored(WORKLOAD, "wl", "default")
        assert wl is not None
        entries: list[Obj] = wl["status"]["admissionChecks"]
        return next(e for e in entries if e["name"] == CHECK)


async def test_a_workload_with_quota_gets_a_request_and_its_pod_template() -> None:
    world = World(gang())
    await world.reconcile()
    assert [w.kind for w in world.kube.writes_of("ProvisioningRequest", "create")] == [
        "ProvisioningRequest"
    ]
    assert len(world.kube.writes_of("PodTemplate", "create")) == 1
    (req,) = world.requests()
    assert req["metadata"]["name"] == REQUEST
    assert req["spec"]["podSets"][0]["count"] == 4
    assert world.check()["state"] == "Pending"


async def test_provisioned_and_fitting_on_the_arrived_nodes_makes_the_check_ready() -> None:
    world = World(gang())
    await world.settle()
    world.provision("n1", "n2")
    await world.settle()
    assert world.check()["state"] == "Ready"
    for name in ("n1", "n2"):
        arrived = world.kube.stored(NODE, name)
        assert arrived is not None
        assert arrived["metadata"]["annotations"][ARRIVED_FOR] == f"default/{REQUEST}"


async def test_a_check_made_ready_is_counted_with_its_times_and_the_capacity_used() -> None:
    world = World(gang())
    await world.settle()
    world.provision("n1", "n2")
    await world.settle()
    recorded = dict(world.metrics.calls)
    assert recorded["attempt"] == ("ready",)
    assert recorded["capacity_used"] == ({"new": 4},)
    assert recorded["provisioned_to_fit"] == (0.0,)
    assert recorded["quota_to_ready"][0] > 0


async def test_provisioned_but_not_yet_fitting_keeps_the_check_pending() -> None:
    world = World(gang())
    await world.settle()
    world.provision("n1")  # room for two of the four workers
    result = await world.reconcile()
    assert world.check()["state"] == "Pending"
    assert result.requeue_after is not None


async def test_an_api_error_on_the_request_create_is_retried_and_nothing_is_lost() -> None:
    world = World(gang())
    world.kube.fail("create", "ProvisioningRequest", error=500)
    with pytest.raises(ApiError):
        await world.reconcile()
    assert world.requests() == []
    await world.settle()
    assert [r["metadata"]["name"] for r in world.requests()] == [REQUEST]
    assert len(world.kube.all_of(world.caches.templates.resource)) == 1
    world.provision("n1", "n2")
    await world.settle()
    assert world.check()["state"] == "Ready"


async def test_a_create_whose_answer_was_lost_is_not_made_twice() -> None:
    world = World(gang())
    world.kube.fail("create", "ProvisioningRequest", error=503, applied=True)
    with pytest.raises(ApiError):
        await world.reconcile()
    await world.settle()
    assert [r["metadata"]["name"] for r in world.requests()] == [REQUEST]


async def test_a_conflict_on_the_check_write_is_read_again_and_written() -> None:
    world = World(gang())
    await world.settle()
    world.provision("n1", "n2")
    world.kube.fail("patch", "Workload", "wl", 409)
    result = await world.reconcile()
    assert world.check()["state"] == "Pending"
    assert result.requeue_after is not None
    await world.settle()
    assert world.check()["state"] == "Ready"


async def test_a_workload_changed_since_the_cache_saw_it_is_not_overwritten() -> None:
    """The check write tests the resourceVersion it decided on: a stale one writes nothing."""
    world = World(gang())
    await world.settle()
    world.provision("n1", "n2")
    world.kube.sync(world.caches)
    await world.kube.merge_patch(WORKLOAD, "wl", {"metadata": {"labels": {"x": "y"}}}, "default")
    result = await world.reconciler.reconcile(KEY)  # the cache has not seen the change
    assert world.check()["state"] == "Pending"
    assert result.requeue_after is not None
    await world.settle()
    assert world.check()["state"] == "Ready"


async def test_a_workload_deleted_has_its_request_and_template_deleted() -> None:
    world = World(gang())
    await world.settle()
    world.kube.remove(world.caches.workloads.resource, "wl", "default")
    await world.settle()
    assert world.requests() == []
    assert world.kube.all_of(world.caches.templates.resource) == []


async def test_a_deleted_workload_waiting_for_nodes_is_withdrawn_once_nodes_are_current() -> None:
    """The Workload is gone while its attempt waits (Provisioned, not fitting yet) and the
    node watch has failed: the orphan sweep would record the arrivals the attempt passed
    over, so it waits for the node cache, writing nothing, then withdraws."""
    world = World(gang())
    await world.settle()
    world.provision("n1")  # room for two of the four workers: waiting
    await world.settle()
    world.kube.remove(world.caches.workloads.resource, "wl", "default")
    world.kube.sync(world.caches)
    world.caches.nodes._stale()  # a node watch failed: nodes may be missing
    writes = len(world.kube.writes)
    result = await world.reconciler.reconcile(KEY)
    assert result.requeue_after == 1.0
    assert len(world.kube.writes) == writes
    assert [r["metadata"]["name"] for r in world.requests()] == [REQUEST]
    await world.settle()  # listed again: current
    assert world.requests() == []


async def test_a_workload_the_cache_misses_but_the_server_has_is_left_alone() -> None:
    world = World(gang())
    await world.settle()
    world.caches.workloads.store = type(world.caches.workloads.store)()
    await world.reconciler.reconcile(KEY)
    assert [r["metadata"]["name"] for r in world.requests()] == [REQUEST]
    assert world.kube.writes_of("ProvisioningRequest", "delete") == []


async def test_nodes_claimed_then_the_gang_ready_in_one_reconcile_on_what_was_written() -> None:
    """The decisions after a write are made at once on the caches that hold it (the watch's
    echo of gangcheck's own writes requeues nothing): the arrived nodes are claimed, then
    on those claims the request is marked Fulfilled and the check written Ready, in this
    order, in one reconcile; the next reconcile writes nothing."""
    world = World(gang())
    await world.settle()
    world.provision("n1", "n2")
    before = len(world.kube.writes)
    result = await world.reconcile()
    assert world.check()["state"] == "Ready"
    written = [(w.verb, w.kind) for w in world.kube.writes[before:] if w.kind != "Event"]
    assert written == [
        ("patch", "Node"),
        ("patch", "Node"),
        ("patch", "ProvisioningRequest"),  # the Fulfilled mark, before the check
        ("patch", "Workload"),
    ], written
    assert result.requeue_after != 0.0
    after = len(world.kube.writes)
    await world.reconcile()
    assert len(world.kube.writes) == after


async def test_a_reconcile_that_deletes_asks_to_be_reconciled_again_at_once() -> None:
    """A delete is not in the caches until its watch event: no decision is made on it in
    the same reconcile, the Workload is queued again at once instead."""
    world = World(gang())
    await world.settle()
    wl = world.kube.stored(WORKLOAD, "wl", "default")
    assert wl is not None
    wl["status"]["conditions"].append(
        {"type": "Finished", "status": "True", "reason": "Succeeded", "message": "",
         "lastTransitionTime": stamp(world.now)}
    )  # fmt: skip
    world.kube.add(wl)
    result = await world.reconcile()
    assert world.kube.writes_of("ProvisioningRequest", "delete")
    assert result.requeue_after == 0.0


async def test_a_decision_repeated_on_its_own_writes_is_applied_once_and_not_requeued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write that changes nothing the decision reads (the same annotation again) makes the
    same decision: it is not applied again, and the Workload is not queued again at once."""
    world = World(gang())
    await world.settle()
    same = Decision(actions=(AnnotateRequest(REQUEST, {"example.com/note": "x"}),))
    monkeypatch.setattr(workload_module, "decide", lambda _snap, _now: same)
    before = len(world.kube.writes_of("ProvisioningRequest", "patch"))
    result = await world.reconcile()
    assert len(world.kube.writes_of("ProvisioningRequest", "patch")) == before + 1
    assert result.requeue_after is None


async def test_the_check_is_written_though_what_comes_after_it_meets_a_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a decision does after the gang's own state (a lost racer's withdrawal) does not
    hold that state back: the check is written, and the Workload looked at again soon for
    the rest."""
    world = World(gang())
    await world.settle()
    world.kube.add(node("n1", gpu=2, labels={"pool": "gpu"}))
    world.kube.sync(world.caches)
    stored = world.kube.stored(WORKLOAD, "wl", "default")
    assert stored is not None
    state = workload_of(stored).checks[CHECK]
    ready = replace(state, state="Ready", message="the whole gang fits")
    late = ClaimNode("n1", resource_version="not-its-version", request=REQUEST)
    monkeypatch.setattr(
        workload_module, "decide", lambda _snap, _now: Decision(check=ready, after=(late,))
    )
    result = await world.reconcile()
    assert world.check()["state"] == "Ready"
    assert result.requeue_after == workload_module.STALE_RETRY_SECONDS
    n1 = world.kube.stored(NODE, "n1")
    assert n1 is not None and ARRIVED_FOR not in (n1["metadata"].get("annotations") or {})


async def test_the_events_of_a_check_written_are_sent_though_what_comes_after_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check is written, then a lost racer's withdrawal fails (the API server answers
    500): the Events of the decision that wrote it (the race won) are sent all the same. The
    next pass finds the check Ready and only withdraws what is left behind: it could not say
    them again."""
    world = World(gang())
    await world.settle()
    stored = world.kube.stored(WORKLOAD, "wl", "default")
    assert stored is not None
    ready = replace(workload_of(stored).checks[CHECK], state="Ready", message="won")
    (req,) = world.requests()
    gone = DeleteRequest(REQUEST, req["metadata"]["uid"], (), "lost the race")
    won = Event("CapacityRaceWon", "source b delivered the whole gang first")
    monkeypatch.setattr(
        workload_module,
        "decide",
        lambda _snap, _now: Decision(check=ready, after=(gone,), events=(won,)),
    )
    world.kube.fail("delete", "ProvisioningRequest", error=500)
    with pytest.raises(ApiError):
        await world.reconcile()
    assert world.check()["state"] == "Ready"
    assert "CapacityRaceWon" in [e["reason"] for e in world.kube.all_of(EVENT)]


async def test_a_workload_made_again_under_its_name_withdraws_the_old_attempt_first() -> None:
    """The Workload is deleted and made again under the same name (a new uid) before a
    reconcile saw it gone (the watch's two events read as one key; gangcheck restarted
    meanwhile): the old Workload's request, waiting with one node arrived, is not the new
    one's. It is withdrawn, what arrived for it reclaimed, and the new Workload is asked
    for under its own uid; before, the old request stayed for ever, its node held, and the
    new Workload's ask collided with its name ('already exists and was not made by
    gangcheck for this attempt')."""
    world = World(gang())
    await world.settle()
    world.provision("n1")  # room for two of the four workers: waiting, n1 claimed
    await world.settle()
    n1 = world.kube.stored(NODE, "n1")
    assert n1 is not None and n1["metadata"]["annotations"][ARRIVED_FOR] == f"default/{REQUEST}"
    world.kube.remove(world.caches.workloads.resource, "wl", "default")
    again = gang()
    again["metadata"]["uid"] = "uid-wl-again"
    world.kube.add(again)
    await world.settle()
    (req,) = world.requests()
    assert req["metadata"]["annotations"]["gangcheck.io/workload-uid"] == "uid-wl-again"
    assert world.kube.writes_of("ProvisioningRequest", "delete") != []
    assert world.check()["state"] == "Pending"
    assert "already exists" not in world.check()["message"]
    events = [e["reason"] for e in world.kube.all_of(EVENT)]
    assert "FailedCreate" not in events
    fenced = world.kube.stored(NODE, "n1")  # reclaimed for the old attempt, not the new one's
    assert fenced is not None and fenced["spec"]["unschedulable"] is True
    assert [t["key"] for t in fenced["spec"]["taints"]] == [RECLAIM_TAINT]


async def test_an_old_request_held_by_a_finalizer_is_not_swept_again_every_half_second() -> None:
    """The old Workload's request is being deleted but another writer's finalizer keeps it:
    the sweep has done what it can; it looks again in ORPHAN_RECHECK_SECONDS (its deletion
    routes the key sooner), not in 0.5 s for ever, a DELETE each time."""
    world = World(gang())
    await world.settle()
    (old,) = world.requests()
    old["metadata"]["finalizers"] = ["example.com/keep"]
    world.kube.add(old)
    world.kube.remove(world.caches.workloads.resource, "wl", "default")
    again = gang()
    again["metadata"]["uid"] = "uid-wl-again"
    world.kube.add(again)
    await world.reconcile()
    (stuck,) = world.requests()
    assert stuck["metadata"].get("deletionTimestamp")  # deleted, held by its finalizer
    result = await world.reconcile()
    assert result.requeue_after == ORPHAN_RECHECK_SECONDS


def assert_hold_lifted_for_the_gone_request(world: World) -> None:
    """n1 and n2, recorded for the deleted request, no longer held (their record kept), a
    HoldLifted Warning naming them, nothing asked again, the check still Ready."""
    for name in ("n1", "n2"):
        stored = world.kube.stored(NODE, name)
        assert stored is not None
        assert not stored["spec"].get("taints"), stored["spec"]
        assert stored["metadata"]["annotations"][ARRIVED_FOR] == f"default/{REQUEST}"
    (event,) = [e for e in world.kube.all_of(EVENT) if e["reason"] == "HoldLifted"]
    assert event["type"] == "Warning"
    assert REQUEST in event["message"] and "n1, n2" in event["message"]
    assert world.requests() == []
    assert world.check()["state"] == "Ready"


async def test_a_ready_gangs_request_deleted_by_hand_has_the_hold_it_left_lifted() -> None:
    """The request whose capacity a Ready gang was given is deleted outside gangcheck: the
    hold on its nodes names it, no request is left whose record would ever lift it (Started,
    a rollback, the Workload's end), so the nodes stayed closed to every pod but this gang's
    for ever, nothing said. Once the API server confirms the request gone, the hold is
    lifted and a HoldLifted Warning Event names the nodes; nothing is asked again and the
    check stays Ready."""
    world = World(gang())
    await world.settle()
    world.provision("n1", "n2")
    await world.settle()
    assert world.check()["state"] == "Ready"
    world.kube.remove(PROVISIONING_REQUEST, REQUEST, "default")
    await world.settle()
    assert_hold_lifted_for_the_gone_request(world)


async def test_a_hold_is_not_lifted_for_a_request_only_the_cache_misses() -> None:
    """A request the caches miss (a lagging list) but the API server has is not taken as
    gone: its hold stays, and it is read into the cache for the next decision."""
    world = World(gang())
    await world.settle()
    world.provision("n1", "n2")
    await world.settle()
    world.kube.sync(world.caches)
    cached = world.caches.requests.store.get(REQUEST, "default")
    assert cached is not None
    world.caches.requests.store._pop(cached)  # a lagging list left it out
    await world.reconciler.reconcile(KEY)
    for name in ("n1", "n2"):
        stored = world.kube.stored(NODE, name)
        assert stored is not None and stored["spec"]["taints"], stored["spec"]
    assert not [e for e in world.kube.all_of(EVENT) if e["reason"] == "HoldLifted"]
    assert world.caches.requests.store.get(REQUEST, "default") is not None


async def test_a_ready_gang_without_quota_has_the_hold_of_its_request_deleted_by_hand_lifted() -> (
    None
):
    """Kueue takes a Ready gang's quota back without evicting it (its LocalQueue stopped or
    deleted), and its request is deleted outside gangcheck meanwhile: the hold naming the
    request is lifted then, not only once quota comes back (which may be never: the nodes
    stayed closed to every pod but the gang's meanwhile, nothing said). Nothing is asked
    again, nothing reclaimed, the check left as it is."""
    world = World(gang())
    await world.settle()
    world.provision("n1", "n2")
    await world.settle()
    assert world.check()["state"] == "Ready"
    wl = world.kube.stored(WORKLOAD, "wl", "default")
    assert wl is not None
    for c in wl["status"]["conditions"]:
        if c["type"] in ("QuotaReserved", "Admitted"):
            c.update(status="False", reason="Inadmissible", message="LocalQueue lq is stopped")
    world.kube.add(wl)
    world.kube.remove(PROVISIONING_REQUEST, REQUEST, "default")
    await world.settle()
    assert_hold_lifted_for_the_gone_request(world)


async def test_a_request_deleted_is_not_taken_for_the_next_attempt_of_its_name() -> None:
    """Kueue evicts the waiting gang (one node arrived) and admits it again, its check reset
    Pending (the same attempt number, so the same request name), before the request watch
    brought the DELETED of the request gangcheck withdrew: the request asked again is a new
    one, not the old one as the cache last had it (Provisioned, its rollback recorded, its
    node reclaimed)."""
    world = World(gang())
    await world.settle()
    world.provision("n1")  # room for two of the four workers: waiting, n1 claimed
    await world.settle()
    evicted = WorkloadBuilder().pod_set("workers", 4).condition("Evicted").check().build()
    world.kube.add(evicted)
    world.kube.sync(world.caches)
    await world.reconciler.reconcile(KEY)
    assert world.requests() == []  # withdrawn on the server; the watch has not said so
    world.kube.add(gang())  # admitted again, the check Pending
    for informer in world.caches.all():  # every watch caught up but the requests'
        if informer is not world.caches.requests:
            for obj in world.kube.all_of(informer.resource):
                informer.store.put_if_newer(obj)
    await world.reconciler.reconcile(KEY)
    (req,) = world.requests()  # before: none, the check Retry on the old rollback record
    assert req["metadata"]["name"] == REQUEST and not req.get("status")
    assert "gangcheck.io/outcome" not in req["metadata"]["annotations"]
    assert world.check()["state"] == "Pending", world.check()
    assert len(world.kube.writes_of("ProvisioningRequest", "delete")) == 1  # not again


def reclaiming_by_delete_node(world: World) -> None:
    """The check's config reclaims by deleting the Node, and the node watch brings every
    change of a node up to its DELETE (gangcheck's fence), never the DELETED itself."""
    check = admission_check()
    check["spec"]["parameters"] = {
        "apiGroup": "gangcheck.io",
        "kind": "AtomicProvisioningConfig",
        "name": "by-delete-node",
    }
    config = {
        "apiVersion": ATOMIC_CONFIG.api_version,
        "kind": "AtomicProvisioningConfig",
        "metadata": {"name": "by-delete-node"},
        "spec": {"fulfillment": {"reclaimer": "DeleteNode"}},
    }
    world.kube.add(check, config)
    world.kube.sync(world.caches)
    delete, nodes = world.kube.delete, world.caches.nodes.store

    async def watched_until_deleted(res: Any, name: str, *args: Any, **kwargs: Any) -> Obj:
        if res is NODE and (last := world.kube.stored(NODE, name)) is not None:
            nodes.put_if_newer(last)
        return await delete(res, name, *args, **kwargs)

    world.kube.delete = watched_until_deleted  # type: ignore[method-assign]

    async def reconcile() -> Result:  # every watch caught up, but the nodes' DELETEDs
        for informer in world.caches.all():
            if informer is not world.caches.nodes:
                for obj in list(informer.store):
                    informer.store._pop(obj)
            for obj in world.kube.all_of(informer.resource):
                informer.store.put_if_newer(obj)
        return await world.reconciler.reconcile(KEY)

    world.reconcile = reconcile  # type: ignore[method-assign]


async def test_a_node_reclaimed_is_not_taken_for_the_next_attempt_of_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The evicted gang's arrival n1 is reclaimed by deleting it; the gang is admitted again
    (the same attempt, so the same request name) and evicted again before the node watch
    brought n1's DELETED: nothing arrived for the new request. Before, the cache still showed
    n1 recorded for that request name, and the second withdrawal recorded it as its own,
    reclaimed it again (found gone: counted reclaimed, with its node-minutes) and said so on
    the check."""
    monkeypatch.setattr(
        safely.reclaim_safely, "__kwdefaults__", {"settle_seconds": 0.0, "owed": False}
    )
    world = World(gang())
    reclaiming_by_delete_node(world)
    await world.settle()
    world.provision("n1")  # room for two of the four workers: waiting, n1 claimed
    await world.settle()
    evicted = WorkloadBuilder().pod_set("workers", 4).condition("Evicted").check().build()
    world.kube.add(evicted)
    await world.reconcile()
    assert world.kube.stored(NODE, "n1") is None  # reclaimed: deleted
    assert "the 1 node(s) that arrived for it are reclaimed" in world.check()["message"]
    world.kube.add(gang())  # admitted again, the check Pending
    await world.reconcile()
    assert [r["metadata"]["name"] for r in world.requests()] == [REQUEST]
    world.kube.add(evicted)  # and evicted again
    await world.reconcile()
    assert world.requests() == []
    assert "node(s) that arrived" not in world.check()["message"], world.check()
    outcomes = [
        w.body["metadata"]["annotations"][OUTCOME_ANNOTATION]
        for w in world.kube.writes_of("ProvisioningRequest", "patch")
        if OUTCOME_ANNOTATION in w.body.get("metadata", {}).get("annotations", {})
    ]
    assert len(outcomes) == 1, outcomes  # the first attempt's only
    assert len(world.kube.writes_of("Node", "delete")) == 1


def refuse(world: World) -> None:
    """Play cluster-autoscaler: it cannot find the capacity now and will try again."""
    req = world.request()
    req["status"] = {
        "conditions": [
            {"type": "Provisioned", "status": "False", "reason": "CapacityIsNotFound",
             "message": "Capacity is not found, CA will try to find it later.",
             "lastTransitionTime": stamp(world.now)}
        ]
    }  # fmt: skip
    world.kube.add(req)


@pytest.mark.parametrize("before", ["seen", "unseen", "restarted"])
async def test_a_refusal_is_noted_though_the_workload_goes_before_a_reconcile_sees_it(
    before: str,
) -> None:
    """The source says `CapacityIsNotFound` while the attempt waits on it, and the Workload is
    deleted (a MultiKueue worker's copy, removed as the dispatcher moves on at that answer):
    the refusal is noted for the check to publish, with the flavors of the gang, whether a
    reconcile saw it before the Workload went or the orphan sweep finds it after, in this
    process or in one started since (the flavors are read from the request)."""
    world = World(gang())
    await world.settle()
    flavors = workload_of(gang()).flavors
    assert flavors and request_of(world.request()).flavors == flavors
    refuse(world)
    if before == "seen":
        await world.settle()
    elif before == "restarted":  # nothing of the last process's memory
        world.reconciler = WorkloadReconciler(
            world.kube, world.caches, world.events, world.applier, clock=world.clock
        )
    world.kube.remove(world.caches.workloads.resource, "wl", "default")
    await world.settle()
    assert world.requests() == []  # withdrawn
    (said,) = world.reconciler.outcomes.pending(CHECK)
    assert (said.flavors, said.source, said.outcome) == (flavors, "default", Outcome.STOCKOUT)
