"""Which gangs a Node or Pod event requeues (the controller's event routing, on the fake Kube):
only events that can change a decision reach the gangs waiting for capacity."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gangcheck.app import Controller
from gangcheck.kube.informer import Informer
from gangcheck.kube.resources import UPSTREAM_POD_GROUP_V1BETA1
from gangcheck.logic.attempt.lifecycle import Progress, Step
from gangcheck.logic.placement.usage import frees_capacity, node_change_matters
from gangcheck.logic.sources.waiting import frees_others
from gangcheck.model.names import (
    CONSUME_ANNOTATION,
    FULFILLED,
    GROUP_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PHASE_ANNOTATION,
    ROLLING_BACK,
    STARTED,
    WORKLOAD_ANNOTATION,
)
from gangcheck.reconcile.reconciler import Stalled
from gangcheck.runtime.queue import WorkQueue
from tests.builders import CHECK, CONTROLLER, WorkloadBuilder, node, provisioning_request
from tests.fakes.kube import FakeKube

Obj = dict[str, Any]
WAITING_GANG = "wl:default/wl"


def controller_with_a_waiting_gang() -> tuple[Controller, Obj]:
    kube = FakeKube()
    n1 = node("n1")
    kube.add(n1)
    request = provisioning_request("wl-atomic-1", conditions={"Provisioned": ""})
    request["metadata"]["labels"] = {MANAGED_BY_LABEL: MANAGED_BY}  # what gangcheck lists
    kube.add(request)
    controller = Controller(kube)
    kube.sync(controller.caches)
    assert controller.caches.in_flight.open_requests()  # the gang waits for capacity
    return controller, n1


def heartbeat(n: Obj) -> Obj:
    beat = copy.deepcopy(n)
    beat["metadata"]["resourceVersion"] = "8"
    beat["status"]["conditions"] = [
        {**c, "lastHeartbeatTime": "2026-11-30T10:09:00Z"} for c in n["status"]["conditions"]
    ]
    return beat


def tainted(n: Obj) -> Obj:
    changed = copy.deepcopy(n)
    changed["spec"]["taints"] = [{"key": "gpu-broken", "effect": "NoSchedule"}]
    return changed


def pod(node_name: str | None, phase: str = "Running") -> Obj:
    spec: Obj = {"containers": [{"name": "c"}]}
    if node_name:
        spec["nodeName"] = node_name
    meta = {"name": "p", "namespace": "other", "uid": "uid-p"}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_a_node_heartbeat_requeues_no_gang() -> None:
    controller, n1 = controller_with_a_waiting_gang()
    controller._on_node(n1, heartbeat(n1))
    assert len(controller.queue) == 0


def test_a_node_change_a_fit_reads_requeues_the_waiting_gang() -> None:
    controller, n1 = controller_with_a_waiting_gang()
    controller._on_node(n1, tainted(n1))
    assert list(controller.queue._ready) == [WAITING_GANG]


@pytest.mark.parametrize(
    ("old", "new", "requeued"),
    [
        (pod(None), pod("n1"), []),
        (pod("n1", "Pending"), pod("n1", "Running"), []),
        (pod("n1"), pod("n1", "Succeeded"), [WAITING_GANG]),
        (pod("n1"), None, [WAITING_GANG]),
        (pod("n1", "Failed"), None, []),
    ],
    ids=[
        "a pod bound elsewhere only takes room: no waiting gang requeued",
        "a pod starting takes no more room: none requeued",
        "a pod finishing gives room back: the waiting gang is requeued",
        "a bound pod deleted gives room back: the waiting gang is requeued",
        "a finished pod deleted gave its room back already: none requeued",
    ],
)
def test_pod_events_requeue_waiting_gangs_only_when_room_is_given_back(
    old: Obj | None, new: Obj | None, requeued: list[str]
) -> None:
    controller, _ = controller_with_a_waiting_gang()
    controller._on_pod(old, new)
    assert list(controller.queue._ready) == requeued


@pytest.mark.parametrize(
    ("old", "new", "matters"),
    [
        (None, node("n1"), True),
        (node("n1"), None, True),
        (node("n1"), heartbeat(node("n1")), False),
        (node("n1"), tainted(node("n1")), True),
        (node("n1"), node("n1", gpu=4), True),
        (node("n1"), node("n1", ready=False), True),
        (node("n1"), node("n1", labels={"pool": "b"}), True),
        (node("n1"), node("n1", annotations={"gangcheck.io/arrived-for": "ns/r"}), True),
    ],
    ids=["added", "deleted", "heartbeat only", "taint", "allocatable", "Ready", "label",
         "arrival record"],
)  # fmt: skip
def test_which_node_changes_matter(old: Obj | None, new: Obj | None, matters: bool) -> None:
    assert node_change_matters(old, new) is matters


def test_a_pod_never_bound_frees_nothing() -> None:
    assert not frees_capacity(pod(None), None)
    assert not frees_capacity(None, pod("n1"))


def consumer(node_name: str | None, phase: str = "Running") -> Obj:
    """A member of the waiting gang: a pod consuming its request."""
    member = pod(node_name, phase)
    member["metadata"]["namespace"] = "default"
    member["metadata"]["annotations"] = {CONSUME_ANNOTATION: "wl-atomic-1"}
    return member


@pytest.mark.parametrize(
    ("old", "new", "requeued"),
    [
        (None, consumer(None, "Pending"), []),
        (consumer(None, "Pending"), consumer("n1", "Pending"), [WAITING_GANG]),
        (consumer("n1", "Pending"), consumer("n1", "Running"), []),
        (consumer("n1"), consumer("n1", "Succeeded"), [WAITING_GANG]),
        (consumer(None, "Pending"), None, []),
    ],
    ids=[
        "a member created unbound: its gang not requeued",
        "a member bound: its gang's start moved, requeued",
        "a bound member starting: nothing its gang counts moved",
        "a member finishing: requeued",
        "an unbound member deleted: nothing moved",
    ],
)
def test_a_member_requeues_its_gang_only_when_its_start_moves(
    old: Obj | None, new: Obj | None, requeued: list[str]
) -> None:
    controller, _ = controller_with_a_waiting_gang()
    controller._on_pod(old, new)
    assert list(controller.queue._ready) == requeued


def with_version(obj: Obj, version: str) -> Obj:
    changed = copy.deepcopy(obj)
    changed["metadata"]["resourceVersion"] = version
    return changed


def test_the_echo_of_a_workload_write_requeues_nothing_a_change_does() -> None:
    """The watch bringing back the version gangcheck wrote (and put in its cache) is not
    routed: the reconcile that wrote it decided again on it."""
    controller, _ = controller_with_a_waiting_gang()
    wl = with_version(WorkloadBuilder().build(), "5")
    controller._on_workload(wl, copy.deepcopy(wl))
    assert len(controller.queue) == 0
    controller._on_workload(wl, with_version(wl, "6"))
    assert list(controller.queue._ready) == [WAITING_GANG]


def test_the_echo_of_a_request_write_requeues_its_gang_only_once_the_gang_is_gone() -> None:
    kube = FakeKube()
    request = provisioning_request("wl-atomic-1")
    request["metadata"]["labels"] = {MANAGED_BY_LABEL: MANAGED_BY}
    kube.add(WorkloadBuilder().build(), request)
    controller = Controller(kube)
    kube.sync(controller.caches)
    stored = controller.caches.requests.store.get("wl-atomic-1", "default")
    assert stored is not None
    controller._on_request(stored, copy.deepcopy(stored))
    assert len(controller.queue) == 0  # its Workload is cached: the writer decided on it
    controller._on_request(stored, with_version(stored, "99"))
    assert list(controller.queue._ready) == [WAITING_GANG]  # a change by someone else
    controller.queue = WorkQueue()
    controller.caches.workloads.store._pop(WorkloadBuilder().build())
    controller._on_request(stored, copy.deepcopy(stored))
    assert list(controller.queue._ready) == [WAITING_GANG]  # an orphan's withdrawal follows it


def test_a_template_of_a_workload_gone_requeues_its_orphan_sweep() -> None:
    """A PodTemplate made as its Workload went (the create's answer lost, then retried) can
    reach the cache after the Workload's orphan sweep looked and found nothing: its arrival
    routes the Workload's key again, so the sweep deletes it; one of a cached Workload (the
    reconcile that made it decided on it) requeues nothing."""
    kube = FakeKube()
    kube.add(WorkloadBuilder().build())
    controller = Controller(kube)
    kube.sync(controller.caches)
    template = {
        "metadata": {
            "name": "ppt-wl-atomic-1-workers",
            "namespace": "default",
            "annotations": {WORKLOAD_ANNOTATION: "wl"},
        }
    }
    controller._on_template(None, template)
    assert len(controller.queue) == 0
    controller.caches.workloads.store._pop(WorkloadBuilder().build())
    controller._on_template(None, template)
    assert list(controller.queue._ready) == [WAITING_GANG]


def test_a_leader_starting_sweeps_the_templates_of_workloads_gone() -> None:
    """A leader that lost its Lease between a request's deletion and its template's (a 500 on
    the template, the retry never run there): the next leader, starting, queues the gone
    Workload's sweep for the template left, as it does for a request left."""
    kube = FakeKube()
    template = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {
            "name": "ppt-wl-atomic-1-workers",
            "namespace": "default",
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {WORKLOAD_ANNOTATION: "wl"},
        },
    }
    kube.add(template)
    controller = Controller(kube)
    kube.sync(controller.caches)
    assert controller.caches.templates.store.get("ppt-wl-atomic-1-workers", "default")
    controller.queue = WorkQueue()
    controller.enqueue_everything()
    assert WAITING_GANG in list(controller.queue._ready)


def test_a_template_of_a_pod_group_gone_requeues_its_orphan_sweep() -> None:
    """As a Workload's: a PodGroup's template seen with its group not cached (a leader
    starting after its request was deleted, the template's delete failed) queues the
    group's key, whose sweep deletes it; one of a cached group queues nothing."""
    kube = FakeKube()
    group = {
        "apiVersion": UPSTREAM_POD_GROUP_V1BETA1.api_version,
        "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "default", "uid": "uid-g"},
    }
    kube.add(group)
    controller = Controller(kube)
    informer = Informer(kube, UPSTREAM_POD_GROUP_V1BETA1)
    controller.caches.pod_groups[UPSTREAM_POD_GROUP_V1BETA1.group] = informer
    kube.sync(controller.caches)
    template = {
        "metadata": {
            "name": "ppt-g-pg-1-ps-0",
            "namespace": "default",
            "annotations": {GROUP_ANNOTATION: "pg/g"},
        }
    }
    controller._on_template(None, template)
    assert len(controller.queue) == 0
    informer.store._pop(group)
    controller._on_template(None, template)
    assert list(controller.queue._ready) == ["pg:pg/default/g"]


def test_only_workloads_of_gangchecks_checks_are_queued() -> None:
    """A Workload that lists none of gangcheck's checks and has nothing of gangcheck's is not
    reconciled on its changes (its reconcile decides nothing); one that lists, or listed,
    gangcheck's check is."""
    kube = FakeKube()
    ours = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": CHECK},
        "spec": {"controllerName": CONTROLLER},
    }
    kube.add(ours)
    controller = Controller(kube)
    kube.sync(controller.caches)
    theirs = with_version(WorkloadBuilder("other").check("kueue-provreq").build(), "5")
    controller._on_workload(theirs, with_version(theirs, "6"))
    controller._on_workload(None, theirs)
    assert len(controller.queue) == 0
    listed = with_version(WorkloadBuilder("mine").check(CHECK).build(), "5")
    controller._on_workload(listed, with_version(listed, "6"))
    assert list(controller.queue._ready) == ["wl:default/mine"]
    controller.queue = WorkQueue()
    controller._on_workload(listed, None)  # deleted: what it listed still counts
    assert list(controller.queue._ready) == ["wl:default/mine"]


def phase_set(obj: Obj, phase: str | None, version: str) -> Obj:
    changed = with_version(obj, version)
    notes = changed["metadata"]["annotations"]
    if phase is None:
        notes.pop(PHASE_ANNOTATION, None)
    else:
        notes[PHASE_ANNOTATION] = phase
    return changed


def ended(obj: Obj, version: str) -> Obj:
    changed = with_version(obj, version)
    changed["status"]["conditions"].append(
        {"type": "Failed", "status": "True", "reason": "Failed", "message": "quota"}
    )
    return changed


WAITING_REQ = provisioning_request("older-1", conditions={"Provisioned": ""})
ASKED_REQ = provisioning_request("older-1")


@pytest.mark.parametrize(
    ("old", "new", "frees"),
    [
        pytest.param(WAITING_REQ, phase_set(WAITING_REQ, FULFILLED, "6"), True, id="fulfilled"),
        pytest.param(WAITING_REQ, phase_set(WAITING_REQ, ROLLING_BACK, "6"), True, id="rolls"),
        pytest.param(WAITING_REQ, ended(WAITING_REQ, "6"), True, id="failed"),
        pytest.param(WAITING_REQ, None, True, id="deleted"),
        pytest.param(
            phase_set(WAITING_REQ, FULFILLED, "6"),
            phase_set(WAITING_REQ, STARTED, "7"),
            True,
            id="started",
        ),
        pytest.param(
            phase_set(WAITING_REQ, STARTED, "7"),
            phase_set(WAITING_REQ, STARTED, "8"),
            False,
            id="started-again",
        ),
        pytest.param(WAITING_REQ, with_version(WAITING_REQ, "6"), False, id="still-waiting"),
        pytest.param(
            ASKED_REQ, phase_set(ASKED_REQ, ROLLING_BACK, "6"), False, id="never-provisioned"
        ),
        pytest.param(None, WAITING_REQ, False, id="first-seen"),
        pytest.param(None, phase_set(WAITING_REQ, STARTED, "7"), False, id="first-seen-started"),
    ],
)
def test_which_request_changes_free_what_other_gangs_wait_on(
    old: Obj | None, new: Obj | None, frees: bool
) -> None:
    """Left the claim order (a waiting request, Provisioned, no longer waiting), or marked
    Started: the gangs waiting on nodes others leave them decide again."""
    assert frees_others(old, new) is frees


def test_a_request_leaving_the_claim_order_wakes_the_gangs_waiting_on_nodes_only() -> None:
    """A gang whose last decision waited on what other requests leave it (`Step.on_nodes`) is
    requeued when one leaves the claim order, once; one that waits on its source is not."""
    kube = FakeKube()
    older = provisioning_request(
        "older-1", conditions={"Provisioned": ""}, annotations={WORKLOAD_ANNOTATION: "older"}
    )
    older["metadata"]["labels"] = {MANAGED_BY_LABEL: MANAGED_BY}
    kube.add(older)
    controller = Controller(kube)
    kube.sync(controller.caches)
    stalled = controller.workload_reconciler.stalled
    stalled.note("default/younger", CHECK, Step(Progress.WAITING, on_nodes=True))
    stalled.note("default/asked", CHECK, Step(Progress.WAITING))
    controller._on_request(older, with_version(older, "6"))
    assert "wl:default/younger" not in controller.queue._ready  # nothing left the order
    controller._on_request(older, phase_set(older, FULFILLED, "7"))
    assert "wl:default/younger" in controller.queue._ready
    assert "wl:default/asked" not in controller.queue._ready
    controller.queue = WorkQueue()
    controller._on_request(phase_set(older, FULFILLED, "7"), phase_set(older, STARTED, "8"))
    assert "wl:default/younger" not in controller.queue._ready  # woken once: noted again later


def test_a_gang_notes_itself_waiting_on_nodes_per_part_until_it_no_longer_does() -> None:
    stalled = Stalled()
    waits, fits = Step(Progress.WAITING, on_nodes=True), Step(Progress.FITS)
    stalled.note("default/wl", "a", waits)
    stalled.note("default/wl", "b", waits)
    stalled.note("default/wl", "a", fits)
    stalled.note("default/gone", "", waits)
    stalled.forget("default/gone")
    assert stalled.take() == ["default/wl"]  # its check b still waits
    assert stalled.take() == []
    stalled.note("default/wl", "b", None)  # no attempt followed
    assert stalled.take() == []
