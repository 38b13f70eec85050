"""The small reconcilers against a fake API server: admission checks' Active condition, nodes
that registered closed, nodes owed a reclaim, and Events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gangcheck.kube.resources import ADMISSION_CHECK, EVENT, NODE
from gangcheck.logic.attempt.actions import Event
from gangcheck.logic.attempt.fulfillment import ARRIVED_FOR
from gangcheck.logic.attempt.hold import ARRIVING_TAINT
from gangcheck.logic.attempt.reclaim import RECLAIM_WHEN_IDLE
from gangcheck.model.names import MANAGED_BY, MANAGED_BY_LABEL
from gangcheck.model.objects import ObjectRef
from gangcheck.reclaim import safely
from gangcheck.reclaim.safely import Target
from gangcheck.reconcile.admissioncheck import AdmissionCheckReconciler
from gangcheck.reconcile.arrivals import ArrivalGateReconciler
from gangcheck.reconcile.events import MAX_EVENT_MESSAGE, EventRecorder
from gangcheck.reconcile.nodes import DrainingNodeReconciler
from gangcheck.runtime.queue import Result
from tests.builders import CONTROLLER, T0, container, node, provisioning_request
from tests.fakes.kube import FakeKube
from tests.fakes.metrics import RecordedMetrics

Obj = dict[str, Any]
NOW = datetime(2026, 11, 30, 10, 0, 30, tzinfo=UTC)
ARRIVING = {"key": ARRIVING_TAINT, "value": "true", "effect": "NoSchedule"}


def fake(*objs: Obj, now: datetime = NOW) -> FakeKube:
    kube = FakeKube(clock=lambda: now)
    kube.add(*objs)
    return kube


def admission_check(name: str = "atomic", *, parameters: Obj | None = None, **status: Any) -> Obj:
    spec: Obj = {"controllerName": CONTROLLER}
    if parameters is not None:
        spec["parameters"] = parameters
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": name, "generation": 3},
        "spec": spec,
        "status": status,
    }


def active_of(kube: FakeKube, name: str = "atomic") -> Obj:
    stored = kube.stored(ADMISSION_CHECK, name)
    assert stored is not None
    conditions = stored["status"]["conditions"]
    return next(c for c in conditions if c["type"] == "Active")


# ---- AdmissionCheck: the Active condition --------------------------------------------------


async def test_a_check_of_ours_without_parameters_is_made_active() -> None:
    kube = fake(admission_check())
    reconciler = AdmissionCheckReconciler(kube, kube.caches(), clock=lambda: NOW)
    assert await reconciler.reconcile("atomic") == Result()
    active = active_of(kube)
    assert (active["status"], active["reason"], active["observedGeneration"]) == (
        "True",
        "Active",
        3,
    )
    assert [(w.verb, w.subresource) for w in kube.writes] == [("patch", "status")]


async def test_a_check_naming_a_missing_config_is_made_inactive_with_the_reason() -> None:
    ref = {"apiGroup": "gangcheck.io", "kind": "AtomicProvisioningConfig", "name": "nope"}
    kube = fake(admission_check(parameters=ref))
    await AdmissionCheckReconciler(kube, kube.caches(), clock=lambda: NOW).reconcile("atomic")
    active = active_of(kube)
    assert (active["status"], active["reason"]) == ("False", "BadParametersRef")
    assert "'nope' not found" in active["message"]


async def test_a_check_already_active_is_not_written_again() -> None:
    kube = fake(admission_check())
    caches = kube.caches()
    await AdmissionCheckReconciler(kube, caches, clock=lambda: NOW).reconcile("atomic")
    later = AdmissionCheckReconciler(kube, caches, clock=lambda: NOW + timedelta(hours=1))
    await later.reconcile("atomic")
    assert len(kube.writes) == 1


async def test_a_check_of_another_controller_is_left_alone() -> None:
    theirs = admission_check()
    theirs["spec"]["controllerName"] = "kueue.x-k8s.io/provisioning-request"
    kube = fake(theirs)
    await AdmissionCheckReconciler(kube, kube.caches()).reconcile("atomic")
    assert kube.writes == []


async def test_a_check_changed_while_being_written_is_left_to_its_watch_event() -> None:
    kube = fake(admission_check(conditions=[{"type": "Other", "status": "True"}]))
    kube.fail("patch", "AdmissionCheck", "atomic", 409)
    result = await AdmissionCheckReconciler(kube, kube.caches()).reconcile("atomic")
    assert result == Result()
    stored = kube.stored(ADMISSION_CHECK, "atomic")
    assert stored is not None
    assert stored["status"]["conditions"] == [{"type": "Other", "status": "True"}]


async def test_the_active_condition_keeps_the_other_conditions() -> None:
    kube = fake(admission_check(conditions=[{"type": "Other", "status": "True"}]))
    await AdmissionCheckReconciler(kube, kube.caches(), clock=lambda: NOW).reconcile("atomic")
    stored = kube.stored(ADMISSION_CHECK, "atomic")
    assert stored is not None
    assert [c["type"] for c in stored["status"]["conditions"]] == ["Other", "Active"]


# ---- nodes that registered closed ----------------------------------------------------------


def waiting_request() -> list[Obj]:
    """A Provisioned request of gangcheck's for one 8-GPU pod, and its PodTemplate."""
    req = provisioning_request(
        "wl-atomic-1", templates=[("wl-main", 1)], conditions={"Provisioned": ""}
    )
    req["metadata"]["labels"] = {MANAGED_BY_LABEL: MANAGED_BY}
    tpl = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {
            "name": "wl-main",
            "namespace": "default",
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        },
        "template": {"spec": {"containers": [container(gpu=8)]}},
    }
    return [req, tpl]


def closed(name: str = "n1", *, created: str = "2026-11-30T10:00:10Z", **kwargs: Any) -> Obj:
    return node(name, created=created, taints=[ARRIVING], **kwargs)


def taints_of(kube: FakeKube, name: str) -> list[Obj]:
    stored = kube.stored(NODE, name)
    assert stored is not None
    return list(stored["spec"].get("taints") or [])


async def test_a_closed_node_no_waiting_gang_could_use_is_opened_at_once() -> None:
    kube = fake(closed())
    result = await ArrivalGateReconciler(kube, kube.caches(), clock=lambda: NOW).reconcile("n1")
    assert result == Result()
    assert taints_of(kube, "n1") == []


async def test_a_closed_node_a_waiting_gang_could_use_is_kept_closed_and_looked_at_again() -> None:
    kube = fake(closed(), *waiting_request())
    result = await ArrivalGateReconciler(kube, kube.caches(), clock=lambda: NOW).reconcile("n1")
    assert result.requeue_after is not None and 0 < result.requeue_after <= 5
    assert taints_of(kube, "n1") == [ARRIVING]
    assert kube.writes == []


async def test_a_closed_node_kept_too_long_is_opened_regardless() -> None:
    kube = fake(closed(), *waiting_request())
    late = NOW + timedelta(minutes=5)
    await ArrivalGateReconciler(kube, kube.caches(), clock=lambda: late).reconcile("n1")
    assert taints_of(kube, "n1") == []


async def test_a_closed_node_recorded_for_a_gang_is_opened() -> None:
    kube = fake(closed(annotations={ARRIVED_FOR: "default/wl-atomic-1"}), *waiting_request())
    await ArrivalGateReconciler(kube, kube.caches(), clock=lambda: NOW).reconcile("n1")
    assert taints_of(kube, "n1") == []


async def test_a_closed_node_changed_since_it_was_judged_is_judged_again_soon() -> None:
    kube = fake(closed())
    kube.fail("patch", "Node", "n1", 409)
    result = await ArrivalGateReconciler(kube, kube.caches(), clock=lambda: NOW).reconcile("n1")
    assert result == Result(requeue_after=0.2)
    assert taints_of(kube, "n1") == [ARRIVING]


async def test_an_open_node_is_not_written() -> None:
    kube = fake(node("n1"))
    await ArrivalGateReconciler(kube, kube.caches(), clock=lambda: NOW).reconcile("n1")
    await ArrivalGateReconciler(kube, kube.caches(), clock=lambda: NOW).reconcile("gone")
    assert kube.writes == []


# ---- nodes owed a reclaim ------------------------------------------------------------------


REQUEST_KEY = "default/wl-atomic-1"


def marked(name: str = "n1", *, reclaimer: str = "DeleteNode") -> Obj:
    mark = Target(name, REQUEST_KEY, T0, reclaimer).mark()
    return node(
        name,
        created="2026-11-30T10:05:00Z",
        annotations={ARRIVED_FOR: REQUEST_KEY, RECLAIM_WHEN_IDLE: mark},
    )


def pod_on(node_name: str, name: str = "p", *, consumes: str = "") -> Obj:
    annotations = (
        {"autoscaling.x-k8s.io/consume-provisioning-request": consumes} if consumes else {}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"nodeName": node_name, "containers": []},
        "status": {"phase": "Running"},
    }


@pytest.fixture
def no_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        safely.reclaim_safely, "__kwdefaults__", {"settle_seconds": 0.0, "owed": False}
    )


def draining(kube: FakeKube) -> tuple[DrainingNodeReconciler, RecordedMetrics]:
    metrics = RecordedMetrics()
    reconciler = DrainingNodeReconciler(kube, kube.caches(), clock=lambda: NOW, metrics=metrics)
    return reconciler, metrics


@pytest.mark.usefixtures("no_settle")
async def test_an_idle_node_owed_a_reclaim_is_reclaimed_and_counted() -> None:
    kube = fake(marked())
    reconciler, metrics = draining(kube)
    assert await reconciler.reconcile("n1") == Result()
    assert kube.stored(NODE, "n1") is None
    assert [name for name, _ in metrics.calls] == ["reclaimed"]


@pytest.mark.usefixtures("no_settle")
async def test_a_node_reclaimed_is_gone_from_the_node_cache_before_its_watch_event() -> None:
    """A reclaim's delete is in the node cache as it is answered (`Caches.deleted`): the
    node is neither capacity nor owed a reclaim any more, though no watch said so yet."""
    kube = fake(marked())
    caches = kube.caches()
    reconciler = DrainingNodeReconciler(kube, caches, clock=lambda: NOW)
    assert await reconciler.reconcile("n1") == Result()
    assert kube.stored(NODE, "n1") is None
    assert caches.nodes.store.get("n1") is None
    assert "n1" not in caches.capacity.views()
    reads = len(kube.calls)
    assert await reconciler.reconcile("n1") == Result()  # its node event, late: nothing read
    assert len(kube.calls) == reads


@pytest.mark.usefixtures("no_settle")
async def test_a_node_with_the_gangs_own_pods_is_looked_at_again_while_they_drain() -> None:
    kube = fake(marked(), pod_on("n1", consumes="wl-atomic-1"))
    reconciler, _ = draining(kube)
    result = await reconciler.reconcile("n1")
    assert result.requeue_after == 2.0
    stored = kube.stored(NODE, "n1")
    assert stored is not None
    assert RECLAIM_WHEN_IDLE in stored["metadata"]["annotations"]


@pytest.mark.usefixtures("no_settle")
async def test_a_node_running_someone_elses_pod_is_kept_its_mark_gone_and_told() -> None:
    kube = fake(marked(), pod_on("n1"))
    reconciler, _ = draining(kube)
    assert await reconciler.reconcile("n1") == Result()
    stored = kube.stored(NODE, "n1")
    assert stored is not None
    assert RECLAIM_WHEN_IDLE not in stored["metadata"]["annotations"]
    assert [w.body["reason"] for w in kube.writes_of("Event")] == ["NodeKept"]


@pytest.mark.usefixtures("no_settle")
async def test_a_failed_reclaim_is_retried_with_growing_backoff_and_counted() -> None:
    kube = fake(marked())
    kube.fail("delete", "Node", "n1", 403, times=2)
    reconciler, metrics = draining(kube)
    first, second = await reconciler.reconcile("n1"), await reconciler.reconcile("n1")
    assert (first.requeue_after, second.requeue_after) == (4.0, 8.0)
    assert [name for name, _ in metrics.calls] == ["reclaim_failed", "reclaim_failed"]
    # one Event, the second retry's the same one counted (created again with its count only
    # after events.REPEAT_SECONDS): not one Event per retry
    assert [w.body["reason"] for w in kube.writes_of("Event")] == ["ReclaimFailed"]
    assert await reconciler.reconcile("n1") == Result()
    assert kube.stored(NODE, "n1") is None


async def test_a_mark_the_cache_still_shows_but_the_node_lost_is_not_acted_on() -> None:
    kube = fake(marked())
    caches = kube.caches()
    await kube.merge_patch(NODE, "n1", {"metadata": {"annotations": {RECLAIM_WHEN_IDLE: None}}})
    reconciler = DrainingNodeReconciler(kube, caches, clock=lambda: NOW)
    assert await reconciler.reconcile("n1") == Result()
    assert [w.verb for w in kube.writes] == ["patch"]  # the test's own


async def test_a_node_not_marked_is_not_even_read() -> None:
    kube = fake(node("n1"))
    await DrainingNodeReconciler(kube, kube.caches()).reconcile("n1")
    assert kube.calls == []


# ---- Events --------------------------------------------------------------------------------


REF = ObjectRef("Workload", "default", "wl", "uid-wl", "kueue.x-k8s.io/v1beta2")


async def test_an_event_is_recorded_on_the_object_with_its_reason_and_type() -> None:
    kube = fake()
    await EventRecorder(kube, clock=lambda: NOW).emit(REF, Event("Provisioned", "ok"))
    (write,) = kube.writes_of("Event", "create")
    body = write.body
    assert body["involvedObject"]["name"] == "wl"
    assert (body["reason"], body["type"], body["message"]) == ("Provisioned", "Normal", "ok")
    assert body["metadata"]["namespace"] == "default"


async def test_an_events_message_is_cut_to_the_apis_limit() -> None:
    kube = fake()
    await EventRecorder(kube).emit(REF, Event("Failed", "x" * 5000, warning=True))
    body = kube.writes_of("Event")[0].body
    assert (len(body["message"]), body["type"]) == (MAX_EVENT_MESSAGE, "Warning")


async def test_an_event_the_server_refuses_is_logged_not_raised() -> None:
    kube = fake()
    kube.fail("create", "Event", error=403)
    await EventRecorder(kube).emit(REF, Event("Provisioned", "ok"))
    assert kube.all_of(EVENT) == []
